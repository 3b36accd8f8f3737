"""Loss scaling and the rest of Horovod's surface, under real launchers (2 workers).

- torch.amp GradScaler with gtopk_hvd's optimizer under mpirun (tests/mpi/mpi_torch_amp.py):
  gTop-k, Top-k and dense, one launch for the three; with the DDP hook under torchrun
  (tests/mpi/torchrun_ddp_amp.py).
- Keras' LossScaleOptimizer on Keras 3 and tf-keras, register_local_source, and our dense tape
  against Horovod's own, argument by argument (tests/mpi/mpi_tensorflow_surface.py); the same
  parity for the torch optimizer (tests/mpi/mpi_torch_dense_parity.py).

Each program asserts on every rank (skips on every worker alike, residuals bit-equal across a
skipped step, accuracy within 1 point of the run without overflow, replicas bitwise
identical) and exits non-zero on any failure.
"""

from __future__ import annotations

import pytest
from helpers.mpi_launcher import run_mpi

pytestmark = pytest.mark.mpi


AMP_MODES = ("gtopk", "topk", "dense")


@pytest.fixture(scope="module")
def torch_amp_launch() -> dict[str, object]:
    """One mpirun launch of mpi_torch_amp.py for every mode (the ranks start torch and Horovod
    once), shared by the test of each mode: {"output": ...} or {"error": ...}."""
    try:
        return {"output": run_mpi("mpi_torch_amp.py", 2, *AMP_MODES, timeout_s=900)}
    except AssertionError as error:  # the launch failed: each mode's test says so
        return {"error": error}


@pytest.mark.parametrize("mode", AMP_MODES)
def test_torch_grad_scaler_skips_overflows_and_keeps_accuracy(
        mode: str, torch_amp_launch: dict[str, object]) -> None:
    if "error" in torch_amp_launch:
        raise torch_amp_launch["error"]
    output = torch_amp_launch["output"]
    assert f"RESULT mode={mode} run=overflow" in output, output[-3000:]
    assert f"CHECKED mode={mode}" in output, output[-3000:]


def test_ddp_hook_with_grad_scaler_under_torchrun() -> None:
    output = run_mpi("torchrun_ddp_amp.py", 2, timeout_s=600, launcher="torchrun")
    assert "RESULT ddp amp" in output, output[-3000:]


@pytest.mark.parametrize("flavour", ["keras3", "tf_keras"])
def test_keras_loss_scaling_local_sources_and_dense_parity(flavour: str) -> None:
    arguments = ("--tf-keras",) if flavour == "tf_keras" else ()
    output = run_mpi("mpi_tensorflow_surface.py", 2, *arguments, timeout_s=900)
    assert f"tensorflow surface ok (keras3={flavour == 'keras3'})" in output, output[-3000:]


def test_torch_dense_choices_equal_horovods_optimizer_argument_by_argument() -> None:
    output = run_mpi("mpi_torch_dense_parity.py", 2, timeout_s=600)
    assert "torch dense parity:" in output, output[-3000:]
