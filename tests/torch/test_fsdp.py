"""The sparse reduce-scatter and its FSDP2 adapter under torchrun (Gloo, CPU), checked on every
rank against numpy (tests/mpi/torchrun_fsdp.py says what each mode checks)."""

from __future__ import annotations

import re

import pytest
from helpers.mpi_launcher import MPI_PROGRAMS, run_mpi, run_with_time_limit, torchrun_command

NEAR_DENSE, BELOW_PLAIN = 1.15, 0.95
"""The example's perplexity at P = 4 after 120 steps: with the remedy at density 0.05 over
FSDP's own, and at 0.01 over AdamW on the sparse gradient, at most (measured at 79219be+, Intel
Xeon, AVX-512: 96.46 / 91.71 = 1.05, and 122.82 / 145.25 = 0.85; the same to the digit at
c675049 with torch's kernels forced to AVX2, ATEN_CPU_CAPABILITY=avx2)."""


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
def test_fsdp_gradient_accumulation_reduces_the_accumulated_gradient_once() -> None:
    run_mode("accumulate", 2)


@pytest.mark.mpi
def test_fsdp_resumes_bit_for_bit_from_a_checkpoint() -> None:
    run_mode("resume", 2)


@pytest.mark.mpi
def test_fsdp_on_one_worker_warns_and_trains_as_fsdp() -> None:
    run_mode("alone", 1)


@pytest.mark.mpi
def test_fsdp_refuses_bad_registrations_on_every_rank() -> None:
    run_mode("errors", 2)


EXAMPLE = ["--vocab-size", "2000", "--size", "32", "--layers", "2", "--heads", "4",
           "--bptt", "16", "--batch-size", "4", "--warmup-steps", "10", "--lr", "2e-3",
           "--clip", "1e6", "--quiet"]


def train_example(workers: int, *options: str) -> tuple[float, str]:
    """examples/fsdp_transformer.py under torchrun: (final validation perplexity, the gathered
    model's checksum, the same on every worker)."""
    output = run_mpi("examples/fsdp_transformer.py", workers, *EXAMPLE, *options,
                     launcher="torchrun", timeout_s=400)
    replicas = set(re.findall(r"CHECKSUM rank=\d+ (\w+)", output))
    assert len(replicas) == 1, f"replicas differ at P = {workers}: {replicas}"
    found = re.search(r"RESULT .*valid_perplexity=([\d.]+)", output)
    assert found, output[-3000:]
    return float(found.group(1)), replicas.pop()


@pytest.mark.mpi
def test_the_transformer_example_at_density_one_is_fsdps_own_run() -> None:
    """At P = 2 the sparse sums at density 1 are FSDP's (a + b = b + a): the example's sparse
    path applies exactly FSDP's updates, AdamW's included (EXAMPLE sets a clip that does not
    bind)."""
    steps = ["--max-steps", "8", "--eval-every", "8"]
    dense = train_example(2, "--compression", "none", *steps)
    full = train_example(2, "--compression", "topk", "--density", "1", "--sparsify",
                         "gradient", *steps)
    assert full == dense


@pytest.mark.mpi
def test_the_transformer_example_trains_with_adamw_under_the_sparse_reduce_scatter() -> None:
    """P = 4, 120 steps, Adam's second moment frozen after 30 dense steps: at density 0.05 the
    sparse run ends within NEAR_DENSE of FSDP's own perplexity; at 0.01 the remedy ends below
    AdamW fed the sparse gradient, by at least BELOW_PLAIN (docs/adamw.md says why)."""
    steps = ["--max-steps", "120", "--eval-every", "120"]

    def sparse(density: str, *how: str) -> float:
        return train_example(4, "--compression", "topk", "--density", density, *how, *steps)[0]

    dense, _ = train_example(4, "--compression", "none", *steps)
    frozen = {density: sparse(density, "--sparsify", "preconditioned", "--dense-steps", "30")
              for density in ("0.05", "0.01")}
    plain = sparse("0.01", "--sparsify", "gradient")
    print(f"FSDP {dense:.2f}, sparse with the remedy {frozen}, without at 0.01 {plain:.2f}")
    assert frozen["0.05"] <= NEAR_DENSE * dense
    assert frozen["0.01"] <= BELOW_PLAIN * plain
