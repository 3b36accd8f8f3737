"""The sparse reduce-scatter and its FSDP2 adapter under torchrun (Gloo, CPU), checked on every
rank against numpy (tests/mpi/torchrun_fsdp.py says what each mode checks)."""

from __future__ import annotations

import pytest
from helpers.mpi_launcher import MPI_PROGRAMS, run_with_time_limit, torchrun_command


def run_mode(mode: str, workers: int) -> None:
    command = torchrun_command(workers, [str(MPI_PROGRAMS / "torchrun_fsdp.py"), "--mode", mode])
    returncode, output = run_with_time_limit(command, 300, f"FSDP {mode} on {workers} workers")
    assert returncode == 0, f"exit status {returncode}. Output:\n{output[-6000:]}"
    for rank in range(workers):
        assert f"FSDP {mode} ok rank={rank}" in output, output[-3000:]


@pytest.mark.mpi
@pytest.mark.parametrize("workers", [1, 2, 3, 5, 8])
def test_sparse_reduce_scatter_matches_numpy_and_conserves(workers: int) -> None:
    run_mode("comm", workers)


@pytest.mark.mpi
@pytest.mark.parametrize("workers", [2, 4])
def test_fsdp_matches_a_replay_of_the_reference(workers: int) -> None:
    run_mode("fsdp", workers)


@pytest.mark.mpi
@pytest.mark.parametrize("workers", [2, 3])
def test_fsdp_adamw_frozen_variance_matches_a_replay_of_the_rule(workers: int) -> None:
    run_mode("adamw", workers)


@pytest.mark.mpi
@pytest.mark.parametrize("workers", [2, 3])
def test_fsdp1_sharded_strategies_match_a_replay(workers: int) -> None:
    run_mode("fsdp1", workers)


@pytest.mark.mpi
def test_fsdp_resumes_bit_for_bit_from_a_checkpoint() -> None:
    run_mode("resume", 2)


@pytest.mark.mpi
def test_fsdp_refuses_bad_registrations_on_every_rank() -> None:
    run_mode("errors", 2)
