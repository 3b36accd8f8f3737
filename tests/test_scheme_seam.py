"""The core's scheme seam fits schemes that are more than "select k, then reduce": a scheme
defined here in one class plus its registration (a partitioned selection with a union
all-reduce, the shape of MiCRO: worker p selects only in partition (p + t) mod P, the indices
are all-gathered and every worker's accumulated values at their union are summed) runs through
`SparseStep` unchanged, with momentum correction, warm-up and a checkpointed state of its own,
and is checked against a numpy replay of its rule: exclusivity, conservation, identical
results on every worker."""

from __future__ import annotations

import numpy as np
import pytest
from helpers.mpi_launcher import run_mpi
from helpers.thread_transport import ThreadGroup

from gtopk_hvd.compression import Compression
from gtopk_hvd.core import SparseStep
from gtopk_hvd.density import Budget
from gtopk_hvd.schemes import SCHEMES, Exchange, Scheme, check_config


class PartitionUnion(Scheme):
    """Worker p takes the `share` (option) largest |acc| of partition (p + step) mod P; the
    union of every worker's indices is all-gathered; the sum over workers of acc at the union
    is all-reduced, and every worker's residual is cleared there. Keeps a counter of steps in
    its own state (to check that the step object saves and restores it)."""

    option_names = ("share",)

    def __init__(self, *args: object) -> None:
        super().__init__(*args)
        self.share = dict(self.config.options).get("share", 1.0)
        self.exchanges = 0

    @classmethod
    def check(cls, config: object) -> None:
        share = dict(config.options).get("share", 1.0)
        if not 0 < share <= 1:
            raise ValueError(f"share must be in (0, 1], got {share}")

    def exchange(self, gradient: np.ndarray, residual: np.ndarray, budget: Budget, step: int,
                 clear_gradient: bool) -> Exchange:
        residual += gradient
        if clear_gradient:
            gradient[:] = 0
        size, d = self.transport.size, residual.size
        bounds = np.linspace(0, d, size + 1).astype(np.int64)
        part = (self.transport.rank + step) % size
        begin, end = bounds[part], bounds[part + 1]
        k = max(1, int(np.ceil(self.share * budget.k / size)))
        order = np.argsort(-np.abs(residual[begin:end]), kind="stable")[:k]
        mine = np.sort(order).astype(self.index_dtype) + begin
        counts = self.transport.allgather(np.array([mine.size], np.int64))[:, 0]
        union = np.unique(self.transport.allgatherv(mine, counts))
        values = residual[union].copy()
        self.transport.allreduce_sum(values)
        residual[union] = 0
        self.exchanges += 1
        return Exchange(union, values, union)

    def state_dict(self) -> dict:
        return {"exchanges": np.array(self.exchanges)}

    def load_state_dict(self, state: dict) -> None:
        self.exchanges = int(state["exchanges"])


SCHEMES.register("test-partition-union")(PartitionUnion)


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
            indices, values = step.step(gradients[transport.rank, t].copy())
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
            first.step(gradient.copy())
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
