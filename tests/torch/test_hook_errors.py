"""Bad choices on the DDP path, each made on every rank under torchrun (2 workers, Gloo):
gtopk_hvd's error naming the problem and the fix, on every rank, when the choice is made,
with no hang (tests/mpi/torchrun_hook_errors.py lists the cases and the words each error must
hold); and the hook registered on one rank only: that rank raises gtopk_hvd's error before
the first sparse collective instead of the backend's size mismatch, and the job ends."""

from __future__ import annotations

import re

import pytest
from helpers.mpi_launcher import MPI_PROGRAMS, run_mpi, run_with_time_limit, torchrun_command


@pytest.mark.mpi
def test_each_bad_choice_is_refused_on_every_rank() -> None:
    output = run_mpi("torchrun_hook_errors.py", 2, launcher="torchrun", timeout_s=300)
    assert "rank 0: errors ok" in output and "rank 1: errors ok" in output, output[-4000:]
    raised = re.findall(r"RAISED (\S+) rank=(\d)", output)
    cases = {case for case, _ in raised}
    assert len(cases) == 8 and len(raised) == 16, raised


@pytest.mark.mpi
def test_the_hook_on_one_rank_only_is_named() -> None:
    command = torchrun_command(2, [str(MPI_PROGRAMS / "torchrun_hook_errors.py"),
                                   "--case", "some-ranks"])
    status, output = run_with_time_limit(command, 180, "the hook on one rank")
    assert status != 0, output[-4000:]
    assert "gtopk_hook runs on 1 of the process group's 2 workers" in output, output[-4000:]
    assert "trained: the error was not raised" not in output
