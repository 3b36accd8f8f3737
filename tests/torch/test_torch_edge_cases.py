"""gtopk_hvd.torch.DistributedOptimizer on edge cases under mpirun with real Horovod
(tests/mpi/mpi_torch_edge_cases.py): float16 / bfloat16 / float64 parameters, parameters
without gradients, tiny tensors."""

from __future__ import annotations

import pytest
from helpers.mpi_launcher import run_mpi

pytestmark = pytest.mark.mpi  # launches mpirun / horovodrun: `pytest -m "not mpi"` skips it


@pytest.mark.parametrize("workers", [4, 3])
def test_torch_edge_cases_under_mpirun(workers: int) -> None:
    output = run_mpi("mpi_torch_edge_cases.py", workers, timeout_s=600)
    assert f"torch edge cases ok on {workers} workers" in output
