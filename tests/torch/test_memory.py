"""No memory growth over 1000 sparse optimizer steps (under mpirun)."""

from __future__ import annotations

import pytest
from helpers.mpi_launcher import run_mpi

pytestmark = pytest.mark.mpi  # launches mpirun / horovodrun: `pytest -m "not mpi"` skips it


def test_no_memory_growth_over_1000_steps() -> None:
    output = run_mpi("mpi_memory.py", 2, timeout_s=600)
    assert output.count("memory ok") == 2, output
