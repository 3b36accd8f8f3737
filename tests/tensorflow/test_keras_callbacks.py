"""gtopk_hvd.tensorflow.keras' callbacks under mpirun with real Horovod, on Keras 3 and tf-keras.

tests/mpi/mpi_keras_callbacks.py checks on every rank (it says what): identical replicas after
fit from different initial weights (unbuilt Sequential, unbuilt subclassed model, functional
model; gTop-k and dense), the replica check raising on every rank, MetricAverageCallback's
means, and the rates the learning-rate callbacks set and the compiled step uses. About a minute
per launch on 2 workers.
"""

from __future__ import annotations

import pytest
from helpers.mpi_launcher import run_mpi

pytestmark = pytest.mark.mpi  # launches mpirun: `pytest -m "not mpi"` skips it

WORKERS = 2


def test_keras_callbacks_on_keras3(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TF_USE_LEGACY_KERAS", raising=False)  # the ranks inherit it
    output = run_mpi("mpi_keras_callbacks.py", WORKERS, timeout_s=300)
    assert f"keras callbacks ok on {WORKERS} workers (Keras 3)" in output


def test_keras_callbacks_on_tf_keras() -> None:
    output = run_mpi("mpi_keras_callbacks.py", WORKERS, "--tf-keras", timeout_s=300)
    assert f"keras callbacks ok on {WORKERS} workers (tf-keras)" in output
    assert "check_warmup(legacy_sgd, legacy)" in output  # the legacy optimizers ran too
