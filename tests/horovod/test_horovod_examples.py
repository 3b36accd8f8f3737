"""Horovod's own examples (trimmed copies in examples/horovod/, digits instead of MNIST) run under
mpirun with only the compression line changed (plus the import), on Keras 3 and on tf-keras.

Each run must exit 0, end with bitwise identical replicas (every rank's `CHECKSUM` line of its
parameters) and, for the MNIST scripts, reach a test accuracy on digits' test split that a broken
run (no reduction, diverged replicas, no training) would not reach. The TensorFlow scripts also
report, on every rank, whether they ran Keras 3: the environment must reach every rank.

The accuracy floors are set from a measured spread (helpers/margins.py, docs/testing.md).
keras_mnist is unseeded like upstream: its spread is that of repeated runs.
"""

from __future__ import annotations

import re

import pytest
from helpers import margins
from helpers.mpi_launcher import run_mpi

pytestmark = pytest.mark.mpi  # launches mpirun: `pytest -m "not mpi"` skips it

SPARSE = ("--gtopk-density", "0.01")  # gtopk.Compression.gtopk(0.01): the one changed line
DENSE = ("--gtopk-density", "0")  # Horovod's own line, unchanged


def check_replicas(output: str, workers: int) -> None:
    """Every rank printed one checksum, and they are all the same."""
    checksums = re.findall(r"CHECKSUM rank=(\d+) ([0-9a-f]{64})", output)
    assert sorted(int(rank) for rank, _ in checksums) == list(range(workers)), output[-3000:]
    assert len({digest for _, digest in checksums}) == 1, f"replicas differ: {checksums}"


def accuracy(output: str) -> float:
    """The digits test-split accuracy rank 0 reported."""
    match = re.search(r"TEST_ACCURACY ([0-9.]+)", output)
    assert match, output[-3000:]
    return float(match.group(1))


def use_keras(monkeypatch: pytest.MonkeyPatch, keras: str) -> None:
    """Keras 3 (TensorFlow's default) or tf-keras: the ranks inherit mpirun's environment."""
    if keras == "tf-keras":
        monkeypatch.setenv("TF_USE_LEGACY_KERAS", "1")
    else:
        monkeypatch.delenv("TF_USE_LEGACY_KERAS", raising=False)


def check_keras(output: str, workers: int, keras: str) -> None:
    flags = re.findall(r"KERAS_3 rank=(\d+) (True|False)", output)
    assert len(flags) == workers, output[-3000:]
    assert {flag for _, flag in flags} == {str(keras == "keras3")}, flags


@pytest.mark.parametrize(("workers", "compression", "case"), [
    (2, DENSE, "hvd_pytorch_mnist_dense"),
    (2, SPARSE, "hvd_pytorch_mnist_gtopk"),
])
def test_pytorch_mnist(workers: int, compression: tuple[str, str], case: str) -> None:
    output = run_mpi("examples/horovod/pytorch_mnist.py", workers, *compression, timeout_s=600)
    check_replicas(output, workers)
    assert accuracy(output) >= margins.floor(case), output[-3000:]


@pytest.mark.parametrize("workers", [4])
def test_pytorch_synthetic_benchmark(workers: int) -> None:
    output = run_mpi("examples/horovod/pytorch_synthetic_benchmark.py", workers, *SPARSE,
                     timeout_s=600)
    assert re.search(rf"Total img/sec on {workers} CPU\(s\): [0-9.]+", output), output[-3000:]
    # Each rank's own fake data: the replicas then agree only if every rank applied the same
    # reduced update (a rank-local or partial reduction would leave them different).
    data = re.findall(r"DATA rank=(\d+) ([0-9a-f]{64})", output)
    assert len({digest for _, digest in data}) == workers, data
    check_replicas(output, workers)


@pytest.mark.parametrize("keras", ["keras3"])  # tf-keras: tensorflow2_keras_mnist, keras_mnist
def test_tensorflow2_mnist(monkeypatch: pytest.MonkeyPatch, keras: str) -> None:
    use_keras(monkeypatch, keras)
    output = run_mpi("examples/horovod/tensorflow2_mnist.py", 2, *SPARSE, timeout_s=600)
    check_keras(output, 2, keras)
    check_replicas(output, 2)
    assert accuracy(output) >= margins.floor("hvd_tensorflow2_mnist"), output[-3000:]


def test_tensorflow2_synthetic_benchmark(monkeypatch: pytest.MonkeyPatch) -> None:
    use_keras(monkeypatch, "keras3")
    output = run_mpi("examples/horovod/tensorflow2_synthetic_benchmark.py", 2, *SPARSE,
                     timeout_s=600)
    check_keras(output, 2, "keras3")
    assert re.search(r"Total img/sec on 2 [GC]PU\(s\): [0-9.]+", output), output[-3000:]
    check_replicas(output, 2)


@pytest.mark.parametrize("keras", ["keras3", "tf-keras"])
def test_tensorflow2_keras_mnist(monkeypatch: pytest.MonkeyPatch, keras: str) -> None:
    use_keras(monkeypatch, keras)
    output = run_mpi("examples/horovod/tensorflow2_keras_mnist.py", 2, *SPARSE, timeout_s=600)
    check_keras(output, 2, keras)
    check_replicas(output, 2)
    case = "hvd_tensorflow2_keras_mnist" + ("_tf_keras" if keras == "tf-keras" else "")
    assert accuracy(output) >= margins.floor(case), output[-3000:]


@pytest.mark.parametrize(("keras", "compression"), [
    ("keras3", DENSE),
    ("tf-keras", SPARSE),  # Keras 3 sparse: tensorflow2_keras_mnist
])
def test_keras_mnist(monkeypatch: pytest.MonkeyPatch, keras: str,
                     compression: tuple[str, str]) -> None:
    use_keras(monkeypatch, keras)
    output = run_mpi("examples/horovod/keras_mnist.py", 2, *compression, timeout_s=600)
    check_keras(output, 2, keras)
    check_replicas(output, 2)
    case = "hvd_keras_mnist_dense" if compression == DENSE else "hvd_keras_mnist_gtopk_tf_keras"
    assert accuracy(output) >= margins.floor(case), output[-3000:]
