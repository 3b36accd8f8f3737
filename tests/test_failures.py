"""Failures under mpirun end the whole job promptly, with the cause printed."""

from __future__ import annotations

import time

import pytest
from mpi_launcher import run_mpi


def test_a_worker_raising_mid_training_ends_the_job_with_its_error() -> None:
    start = time.monotonic()
    with pytest.raises(AssertionError) as failure:
        run_mpi("mpi_worker_dies.py", 3, timeout_s=120)
    message = str(failure.value)
    assert "exited with" in message, message  # ended by itself, not by the 120 s limit
    assert "worker 1 failed while loading its next batch" in message, message
    assert "aborting the MPI job" in message, message
    assert time.monotonic() - start < 100
