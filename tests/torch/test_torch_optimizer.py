"""gtopk_hvd.torch.DistributedOptimizer under mpirun with real Horovod (tests/mpi/...)."""

from __future__ import annotations

import pytest
from helpers.mpi_launcher import run_mpi

pytestmark = pytest.mark.mpi  # launches mpirun / horovodrun: `pytest -m "not mpi"` skips it


@pytest.mark.parametrize(("launcher", "workers", "transport"), [
    ("mpirun", 4, "MPITransport"), ("mpirun", 3, "MPITransport"),
    ("horovodrun", 4, "HorovodTransport"),  # horovodrun --gloo: chosen without being asked
])
def test_torch_optimizer(launcher: str, workers: int, transport: str) -> None:
    output = run_mpi("mpi_torch_optimizer.py", workers, timeout_s=600, launcher=launcher)
    assert f"torch optimizer ok on {workers} workers over {transport}" in output


@pytest.mark.parametrize("workers", [2, 3])
def test_gradient_views_equal_the_copy_reference(workers: int) -> None:
    output = run_mpi("mpi_torch_views.py", workers, timeout_s=600)
    assert f"torch views ok on {workers} workers" in output
