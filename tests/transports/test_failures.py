"""Failures under mpirun end the whole job promptly, with the cause printed."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
from helpers.mpi_launcher import mpirun_command, run_mpi, run_with_time_limit

pytestmark = pytest.mark.mpi  # launches mpirun / horovodrun: `pytest -m "not mpi"` skips it


@pytest.mark.parametrize("launcher", ["mpirun", "horovodrun"])
def test_a_worker_raising_mid_training_ends_the_job_with_its_error(launcher: str) -> None:
    start = time.monotonic()
    with pytest.raises(AssertionError) as failure:
        run_mpi("mpi_worker_dies.py", 3, timeout_s=120, launcher=launcher)
    message = str(failure.value)
    assert "exited with" in message, message  # ended by itself, not by the 120 s limit
    assert "worker 1 failed while loading its next batch" in message, message
    if launcher == "mpirun":
        assert "aborting the MPI job" in message, message
    assert time.monotonic() - start < 100


@pytest.mark.parametrize(("launcher", "program"), [
    ("mpirun", ["stuck_worker.py"]), ("horovodrun", ["stuck_worker.py"]),
    ("torchrun", ["stuck_reduction.py", "--transport", "torch"])])
def test_a_worker_that_never_joins_ends_the_job_within_the_wait_bound(launcher: str,
                                                                      program: list[str]
                                                                      ) -> None:
    start = time.monotonic()
    with pytest.raises(AssertionError) as failure:
        run_mpi(program[0], 3, *program[1:], timeout_s=150, launcher=launcher)
    message = str(failure.value)
    assert "exited with" in message, message  # ended by the bound, not by the 150 s limit
    assert "worker 1 is stuck" in message, message
    assert "waited more than 5 s for" in message, message
    assert "GTOPK_HVD_WAIT_TIMEOUT" in message, message
    assert time.monotonic() - start < 120


def test_a_job_past_its_time_limit_is_ended_with_every_rank() -> None:
    marker = f"gtopk-launcher-timeout-{os.getpid()}"  # no regex characters: pgrep -f reads one
    script = f"import time; time.sleep(300)  # {marker}"
    start = time.monotonic()
    with pytest.raises(AssertionError, match="did not finish in 5 s; killed"):
        run_with_time_limit(mpirun_command(2, [sys.executable, "-c", script]), 5, "sleeper")
    assert time.monotonic() - start < 60
    survivors = subprocess.run(["pgrep", "-af", marker], capture_output=True, text=True).stdout
    assert survivors == "", f"ranks outlived mpirun: {survivors}"
