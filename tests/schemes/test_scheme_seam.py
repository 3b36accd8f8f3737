"""The core's scheme seam fits schemes that are more than "select k, then reduce": a scheme in
one class plus its registration, docs/extending.md's worked example run from the doc (a
partitioned selection with a union all-reduce, the shape of MiCRO: worker p selects only in
partition (p + t) mod P, the indices are all-gathered and every worker's accumulated values at
their union are summed), runs through `SparseStep` unchanged, with momentum correction, warm-up
and a checkpointed state of its own, and is checked against a numpy replay of its rule:
exclusivity, conservation, identical results on every worker. With no other file touched, its
options are checked when the choice is made, and the planner and `bench schemes` price it by
its own wire cost, which is what it sends."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from helpers.mpi_launcher import run_mpi
from helpers.thread_transport import ThreadGroup

from gtopk_hvd.compression import Compression
from gtopk_hvd.core import SparseStep
from gtopk_hvd.schemes import SCHEMES, check_config


def worked_example() -> str:
    """docs/extending.md's scheme, the block after its marker, at its own line numbers (a
    traceback points into the doc): the test runs the doc's code."""
    doc = (ROOT / "docs" / "extending.md").read_text()
    before, after = doc.split(MARKER, 1)
    head, block = after.split("```python\n", 1)
    lines = before.count("\n") + head.count("\n") + 1
    return "\n" * lines + block.split("```", 1)[0]


ROOT = Path(__file__).resolve().parents[2]
MARKER = "<!-- tests/schemes/test_scheme_seam.py runs the block below -->"
if "test-partition-union" not in SCHEMES.names():  # once, whoever imports this module first
    EXAMPLE: dict = {}
    exec(compile(worked_example(), "docs/extending.md", "exec"), EXAMPLE)
    PartitionUnion = EXAMPLE["PartitionUnion"]
else:
    PartitionUnion = SCHEMES.get("test-partition-union")


def replay(gradients: np.ndarray, density: float, share: float, momentum: float | None
           ) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """The rule above in numpy, for P workers at once: per step the union, the averaged update
    and every worker's residual."""
    workers, steps, d = gradients.shape
    residuals = np.zeros((workers, d), np.float32)
    velocities = np.zeros((workers, d), np.float32)
    k = max(1, int(np.ceil(density * d)))
    bounds = np.linspace(0, d, workers + 1).astype(np.int64)
    out = []
    for step in range(steps):
        chosen = []
        for p in range(workers):
            g = gradients[p, step]
            if momentum is not None:
                velocities[p] = velocities[p] * np.float32(momentum) + g
                g = velocities[p]
            residuals[p] += g
            part = (p + step) % workers
            begin, end = bounds[part], bounds[part + 1]
            take = max(1, int(np.ceil(share * k / workers)))
            order = np.argsort(-np.abs(residuals[p, begin:end]), kind="stable")[:take]
            chosen.append(np.sort(order) + begin)
        union = np.unique(np.concatenate(chosen))
        total = residuals[:, union].sum(axis=0, dtype=np.float32)
        residuals[:, union] = 0
        if momentum is not None:
            velocities[:, union] = 0
        out.append((union, total / np.float32(workers), residuals.copy()))
    return out


@pytest.mark.parametrize("workers", [1, 2, 3, 5])
@pytest.mark.parametrize("momentum", [None, 0.9])
def test_a_partitioned_union_scheme_runs_through_the_core_unchanged(workers: int,
                                                                    momentum: float | None
                                                                    ) -> None:
    steps, d, density, share = 6, 97, 0.2, 0.5
    gradients = np.random.default_rng(workers).standard_normal(
        (workers, steps, d)).astype(np.float32)
    options = {} if momentum is None else {"momentum_correction": True, "momentum": momentum}
    config = Compression.scheme("test-partition-union", density, share=share, **options)

    def work(transport: object) -> list:
        step = SparseStep(config, [40, 57], transport)
        out = []
        for t in range(steps):
            indices, values = step.update(gradients[transport.rank, t].copy())
            out.append((indices.copy(), values.copy(), step.residual.copy()))
        assert step.scheme.exchanges == steps
        return out

    results = ThreadGroup(workers).run(work)
    for t, (union, update, residuals) in enumerate(replay(gradients, density, share, momentum)):
        for rank in range(workers):
            indices, values, residual = results[rank][t]
            np.testing.assert_array_equal(indices, union, err_msg=f"step {t} rank {rank}")
            np.testing.assert_allclose(values, update, rtol=1e-6, atol=1e-6)
            np.testing.assert_allclose(residual, residuals[rank], rtol=1e-6, atol=1e-6)
            np.testing.assert_array_equal(values, results[0][t][1])  # identical replicas
    if momentum is None:  # conservation: applied + residuals = every gradient, summed
        applied = np.zeros(d, np.float32)
        for t in range(steps):
            indices, values, _ = results[0][t]
            applied[indices] += values * workers
        residual_sum = sum(results[rank][-1][2] for rank in range(workers))
        np.testing.assert_allclose(applied + residual_sum, gradients.sum(axis=(0, 1)),
                                   rtol=1e-4, atol=1e-4)


def test_the_schemes_own_state_is_saved_and_restored_with_the_step() -> None:
    config = Compression.scheme("test-partition-union", 0.1)
    gradient = np.random.default_rng(0).standard_normal(50).astype(np.float32)

    def work(transport: object) -> tuple:
        first = SparseStep(config, [50], transport)
        for _ in range(3):
            first.update(gradient.copy())
        saved = first.state_dict()
        second = SparseStep(config, [50], transport)
        second.load_state_dict(saved)
        return saved, second, first

    saved, second, first = ThreadGroup(1).run(work)[0]
    assert int(saved["scheme"]["exchanges"]) == 3 and second.scheme.exchanges == 3
    assert second.step_count == 3
    np.testing.assert_array_equal(second.residual, first.residual)


def test_a_schemes_options_are_checked_when_the_configuration_is_made() -> None:
    with pytest.raises(ValueError, match=r"has no option shares \(got shares=0.5\); the "
                                         r"options of scheme 'test-partition-union' are: share"):
        check_config(Compression.scheme("test-partition-union", 0.1, shares=0.5))
    with pytest.raises(ValueError, match="share must be in"):
        check_config(Compression.scheme("test-partition-union", 0.1, share=2.0))
    with pytest.raises(ValueError, match="scheme must be one of 'gtopk', .*got str 'nope'"):
        check_config(Compression.scheme("nope", 0.1))
    with pytest.raises(TypeError):  # the built-in choices take no unknown keyword
        Compression.gtopk(0.1, shares=0.5)


@pytest.mark.mpi
@pytest.mark.parametrize("framework", ["torch", "tensorflow"])
def test_a_registered_scheme_runs_through_the_adapters_under_mpirun(framework: str) -> None:
    """No adapter knows the scheme: the torch optimizer and the TF tape pass the configuration
    to the core, and the update equals the replay on 3 real MPI workers."""
    output = run_mpi("mpi_scheme_adapters.py", 3, framework, timeout_s=600)
    assert f"SCHEME THROUGH {framework} OK" in output


def test_the_planner_and_bench_price_a_registered_scheme_by_its_own_wire_cost(capsys) -> None:
    """The scheme's class is the one place of its wire cost: the planner's row and `bench
    schemes`' formula read it, and it is what the scheme sends (the step's counted bytes)."""
    from gtopk_hvd import plan
    from gtopk_hvd.bench import schemes as bench_schemes
    from gtopk_hvd.transports.local import LocalGroup

    plan.main(["--params", "1M", "--workers", "8", "--compute-ms", "10", "--select-ms", "1",
               "--schemes", "test-partition-union", "topk", "--convergence", "none"])
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if line.startswith("   8 test-partition-union"))
    messages, sent = PartitionUnion.wire(Compression.scheme("test-partition-union", 0.01),
                                         8, 1_000_000, 10_000)
    assert float(row.split()[2]) == pytest.approx(sent / 1e6, abs=5e-4), row  # MB a step
    assert "test-partition-union" in bench_schemes.configurations()

    workers, d, density = 4, 4000, 0.05
    group = LocalGroup(workers)
    rng = np.random.default_rng(5)
    gradients = rng.standard_normal((workers, 4, d)).astype(np.float32)
    try:
        rows = group.run(lambda rank: bench_schemes.measure(
            "test-partition-union", density, [d], group.transports[rank], 4,
            lambda t: gradients[rank, t].copy()))
    finally:
        group.close()
    assert rows[0]["bytes"] == pytest.approx(rows[0]["formula_bytes"], rel=0.05), rows[0]
