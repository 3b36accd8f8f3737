"""gtopk_hvd.tensorflow under mpirun with real Horovod.

tests/mpi/mpi_tensorflow.py checks the DistributedGradientTape (eager and tf.function),
checkpoints and the keras DistributedOptimizer with model.fit on Keras 3 and, in a separate
launch, on tf-keras. The examples train on scikit-learn's digits with gTop-k at density 0.01
for 10 epochs and must learn (the floors, from a measured spread: helpers/margins.py) with
bitwise identical replicas; 5 epochs and 5 resumed end bitwise where 10 in one go do.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from helpers import margins
from helpers.mpi_launcher import run_mpi

pytestmark = pytest.mark.mpi  # launches mpirun / horovodrun: `pytest -m "not mpi"` skips it

WORKERS = 4


def test_tensorflow_under_mpirun() -> None:
    output = run_mpi("mpi_tensorflow.py", WORKERS, timeout_s=600)
    assert f"tensorflow ok on {WORKERS} workers" in output


def test_tensorflow_under_horovodrun_gloo_uses_horovods_collectives() -> None:
    output = run_mpi("mpi_tensorflow.py", 2, "--transport-checks", timeout_s=600,
                     launcher="horovodrun")
    assert "tensorflow ok on 2 workers over HorovodTransport" in output


def test_tf_keras_under_mpirun() -> None:
    output = run_mpi("mpi_tensorflow.py", WORKERS, "--tf-keras", timeout_s=600)
    assert f"tf-keras ok on {WORKERS} workers" in output


def result_of(output: str) -> tuple[dict[str, str], str]:
    """The RESULT fields, and the one checksum every replica printed (fails if they differ)."""
    match = re.search(r"^RESULT (.*)$", output, re.MULTILINE)
    assert match, output[-3000:]
    fields = dict(field.split("=", 1) for field in match.group(1).split())
    checksums = re.findall(r"^CHECKSUM rank=(\d+) ([0-9a-f]{64})$", output, re.MULTILINE)
    assert sorted(int(rank) for rank, _ in checksums) == list(range(WORKERS)), output[-3000:]
    assert len({digest for _, digest in checksums}) == 1, f"replicas differ: {checksums}"
    return fields, checksums[0][1]


def test_tensorflow2_digits_learns_and_resumes_exactly(tmp_path: Path) -> None:
    script = "examples/tensorflow2_digits.py"
    checkpoint = str(tmp_path / "ckpt")  # written after epoch 5 of the straight run
    fields, straight = result_of(run_mpi(script, WORKERS, "--epochs", "10", "--checkpoint",
                                         checkpoint, "--checkpoint-at", "5", timeout_s=600))
    assert fields["compression"] == "gtopk" and fields["density"] == "0.01", fields
    assert float(fields["test_accuracy"]) >= margins.floor("tensorflow2_digits_gtopk"), fields
    assert int(fields["bytes_per_step"]) < 0.05 * 4 * int(fields["params"]), fields

    _, resumed = result_of(run_mpi(script, WORKERS, "--epochs", "10", "--resume", checkpoint,
                                   timeout_s=600))
    assert resumed == straight, "5 epochs + 5 resumed differ from 10 in one go"


def test_tensorflow2_digits_dense_works_on_keras3() -> None:
    """Dense gradients through gtopk_hvd's tape: Horovod 0.28's own tape fails on Keras 3."""
    output = run_mpi("examples/tensorflow2_digits.py", WORKERS, "--compression", "none",
                     "--epochs", "10", timeout_s=600)
    fields, _ = result_of(output)
    assert fields["compression"] == "none", fields
    assert float(fields["test_accuracy"]) >= margins.floor("tensorflow2_digits_dense"), fields


@pytest.mark.parametrize("legacy_keras", [False, True], ids=["keras3", "tf_keras"])
def test_keras_digits_learns(legacy_keras: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    if legacy_keras:
        monkeypatch.setenv("TF_USE_LEGACY_KERAS", "1")  # mpirun's ranks inherit it
    output = run_mpi("examples/keras_digits.py", WORKERS, "--epochs", "10", timeout_s=600)
    fields, _ = result_of(output)
    case = "keras_digits_tf_keras" if legacy_keras else "keras_digits_keras3"
    assert fields["compression"] == "gtopk", fields
    assert float(fields["test_accuracy"]) >= margins.floor(case), fields
