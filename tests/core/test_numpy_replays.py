"""The sparse step against a numpy replay of its definition (gtopk_hvd/core/step.py and
gtopk_hvd/compression.py docstrings), written here without any of gtopk_hvd's code:

    g := g / predivide
    [momentum correction: u = m u + g;  g := u]
    acc = r + g;  I_p = top-k of |acc| (ties: lower index);  V_p = acc[I_p];  r = acc, 0 at I_p
    (I, V) = reduce over workers: "allgather" (Top-k): union, values summed in rank order;
             "gtopk": recursive doubling with fold in / out (tests/helpers/reference.py)
    r[j] = V_p[j] for j in I_p not in I;  [momentum correction: u[I_p] = 0, unless
                                            momentum_masking=False]
    update = V * predivide / P (average) or V * predivide (sum)

with k = max(1, ceil(density_at(step) * d)) ("model") or the sum over parameters of
max(1, ceil(density_at(step) * size_i)) ("bucket", each parameter selecting its own share), and
density_at(step) = warmup_densities[step // warmup_steps] during the warm-up, else density.
Workers are threads (tests/helpers/thread_transport.py); every worker's indices, values,
residual, velocity and k are compared after every step, for P = 1 to 4 workers. Gradients are
continuous draws, so ties in magnitude (where the order would be a convention) do not occur.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import ml_dtypes
import numpy as np
import pytest
from helpers.reference import gtopk_schedule_reference
from helpers.thread_transport import ThreadGroup

from gtopk_hvd.compression import Compression
from gtopk_hvd.core import SparseStep

SIZES = [120, 7, 73]  # three parameters, d = 200
ROUNDING = {
    "float32": lambda v: v,
    "float16": lambda v: v.astype(np.float16).astype(np.float32),
    "bfloat16": lambda v: v.astype(ml_dtypes.bfloat16).astype(np.float32),
}
RTOL, ATOL = 1e-6, 1e-7  # float32 sums whose order may differ; every other value is bit-equal


@dataclass
class Options:
    reduction: str  # "allgather" (Top-k) or "gtopk"
    density: float
    warmup_densities: tuple[float, ...] = ()
    warmup_steps: int = 0
    momentum: float | None = None  # None: no momentum correction
    masking: bool = True  # the momentum correction's velocity cleared where sent
    granularity: str = "model"
    predivide: float = 1.0
    average: bool = True
    wire: str = "float32"

    def compression(self) -> object:
        factory = Compression.topk if self.reduction == "allgather" else Compression.gtopk
        extra = {} if self.momentum is None else {"momentum": self.momentum,
                                                  "momentum_masking": self.masking}
        return factory(self.density, warmup_densities=self.warmup_densities,
                       warmup_steps=self.warmup_steps,
                       momentum_correction=self.momentum is not None,
                       granularity=self.granularity, wire_dtype=self.wire, **extra)


def density_at(options: Options, step: int) -> float:
    stage = step // options.warmup_steps if options.warmup_steps else len(
        options.warmup_densities)
    return options.warmup_densities[stage] if stage < len(options.warmup_densities) else (
        options.density)


def part_ks(options: Options, step: int, sizes: list[int]) -> list[int]:
    """The k of each selection of the step: one over d ("model"), one per parameter."""
    density = density_at(options, step)
    if options.granularity == "model":
        return [max(1, math.ceil(density * sum(sizes)))]
    return [max(1, math.ceil(density * size)) for size in sizes]


def top_by_magnitude(values: np.ndarray, k: int) -> np.ndarray:
    """Index-sorted positions of the k largest |values|, ties to the lower index."""
    order = np.lexsort((np.arange(values.size), -np.abs(values.astype(np.float64))))
    return np.sort(order[:k])


def allgather_reference(sets: list[tuple[np.ndarray, np.ndarray]]
                        ) -> tuple[np.ndarray, np.ndarray]:
    """Union of every worker's set, each value the float32 sum in rank order."""
    summed: dict[int, np.float32] = {}
    for indices, values in sets:
        for index, value in zip(indices.tolist(), values):
            summed[index] = summed[index] + value if index in summed else value
    union = np.array(sorted(summed), dtype=np.int64)
    return union, np.array([summed[i] for i in union.tolist()], dtype=np.float32)


class Replay:
    """Every worker's residual and velocity, and the steps, in numpy."""

    def __init__(self, options: Options, workers: int, sizes: list[int]) -> None:
        self.options, self.workers, self.sizes = options, workers, sizes
        d = sum(sizes)
        self.residuals = [np.zeros(d, np.float32) for _ in range(workers)]
        self.velocities = [np.zeros(d, np.float32) for _ in range(workers)]
        self.step_count = 0

    def select(self, acc: np.ndarray, ks: list[int]) -> np.ndarray:
        if self.options.granularity == "model":
            return top_by_magnitude(acc, ks[0])
        chosen, begin = [], 0
        for size, k in zip(self.sizes, ks):
            chosen.append(top_by_magnitude(acc[begin:begin + size], k) + begin)
            begin += size
        return np.concatenate(chosen)

    def step(self, gradients: list[np.ndarray]) -> dict:
        options = self.options
        ks = part_ks(options, self.step_count, self.sizes)
        k = sum(ks)
        sets = []
        for p in range(self.workers):
            g = gradients[p].astype(np.float32)
            if options.predivide != 1.0:
                g = g / np.float32(options.predivide)
            if options.momentum is not None:
                self.velocities[p] = self.velocities[p] * np.float32(options.momentum) + g
                g = self.velocities[p]
            acc = self.residuals[p] + g
            chosen = self.select(acc, ks)
            sets.append((chosen, acc[chosen].copy()))
            acc[chosen] = 0.0
            self.residuals[p] = acc
        sent = received = [0] * self.workers
        if options.reduction == "allgather":
            indices, values = allgather_reference(sets)
        else:
            entry_bytes = 4 + (4 if options.wire == "float32" else 2)
            finals, sent, received = gtopk_schedule_reference(
                [(i.astype(np.int32), v) for i, v in sets], k, entry_bytes,
                ROUNDING[options.wire])
            indices, values = finals[0]
            for other_indices, other_values in finals[1:]:  # the schedule agrees on every worker
                assert np.array_equal(other_indices, indices)
                assert np.array_equal(other_values, values)
        for p, (chosen, chosen_values) in enumerate(sets):
            back = ~np.isin(chosen, indices)  # sent but not in the global set: back to r
            self.residuals[p][chosen[back]] += chosen_values[back]
            if options.momentum is not None and options.masking:
                self.velocities[p][chosen] = 0.0
        scale = options.predivide / self.workers if options.average else options.predivide
        self.step_count += 1
        return {"indices": indices, "values": values * np.float32(scale), "k": k,
                "density": density_at(options, self.step_count - 1), "sets": sets,
                "sent": sent, "received": received}


def run_library(options: Options, workers: int, gradients: np.ndarray) -> list[list[dict]]:
    """gradients[p][step] on worker p; every worker's step results, residual and velocity."""
    compression = options.compression()

    def work(transport: object) -> list[dict]:
        state = SparseStep(compression, SIZES, transport, average=options.average,
                            predivide=options.predivide)
        out = []
        for step in range(gradients.shape[1]):
            indices, values = state.update(gradients[transport.rank][step].copy())
            stats = state.last_stats
            out.append({"indices": np.array(indices), "values": np.array(values),
                        "residual": state.residual.copy(),
                        "velocity": None if state.velocity is None else state.velocity.copy(),
                        "k": stats.k, "density": stats.density, "step": stats.step,
                        "global_entries": stats.global_entries,
                        "bytes": (stats.bytes_sent, stats.bytes_received)})
        return out

    return ThreadGroup(workers).run(work)


def check_against_replay(options: Options, workers: int, steps: int, seed: int) -> list[dict]:
    """Runs the library and the replay side by side; fails on the first difference."""
    generator = np.random.default_rng(seed)
    gradients = generator.standard_normal((workers, steps, sum(SIZES))).astype(np.float32)
    results = run_library(options, workers, gradients)
    replay = Replay(options, workers, SIZES)
    history = []
    for step in range(steps):
        want = replay.step([gradients[p][step] for p in range(workers)])
        history.append(want)
        for rank in range(workers):
            got, where = results[rank][step], f"step {step}, rank {rank}"
            assert (got["step"], got["k"]) == (step, want["k"]), where
            assert got["density"] == want["density"], where
            np.testing.assert_array_equal(got["indices"], want["indices"], err_msg=where)
            assert got["global_entries"] == want["indices"].size, where
            np.testing.assert_allclose(got["values"], want["values"], rtol=RTOL, atol=ATOL,
                                       err_msg=where)
            np.testing.assert_allclose(got["residual"], replay.residuals[rank], rtol=RTOL,
                                       atol=ATOL, err_msg=f"residual, {where}")
            if options.momentum is None:
                assert got["velocity"] is None, where
            else:
                np.testing.assert_allclose(got["velocity"], replay.velocities[rank], rtol=RTOL,
                                           atol=ATOL, err_msg=f"velocity, {where}")
            if options.reduction == "gtopk":
                assert got["bytes"] == (want["sent"][rank], want["received"][rank]), where
    return history


WORKERS = [1, 2, 3, 4]


# -- (a) DGC momentum correction ----------------------------------------------------------------

@pytest.mark.parametrize("workers", WORKERS)
@pytest.mark.parametrize("reduction", ["allgather", "gtopk"])
def test_momentum_correction_matches_replay(reduction: str, workers: int) -> None:
    options = Options(reduction, density=0.05, momentum=0.9)
    history = check_against_replay(options, workers, steps=8, seed=10 + workers)
    # The replay is not vacuous: the velocity keeps mass between steps, and for P > 1 some
    # entries were sent and not kept (gTop-k) or the union is larger than one worker's set.
    if workers > 1:
        sizes = [step["indices"].size for step in history]
        if reduction == "allgather":
            assert max(sizes) > 10, sizes
        else:
            assert all(size == 10 for size in sizes), sizes


@pytest.mark.parametrize("workers", [1, 3])
@pytest.mark.parametrize("reduction", ["allgather", "gtopk"])
def test_momentum_correction_without_masking_matches_replay(reduction: str,
                                                             workers: int) -> None:
    """momentum_masking=False: the velocity is never cleared (u = m u + g on every entry)."""
    options = Options(reduction, density=0.05, momentum=0.9, masking=False)
    generator = np.random.default_rng(70 + workers)
    gradients = generator.standard_normal((workers, 5, sum(SIZES))).astype(np.float32)
    check_against_replay(options, workers, steps=5, seed=70 + workers)
    velocity = run_library(options, workers, gradients)[0][-1]["velocity"]
    unbroken = np.zeros(sum(SIZES), np.float32)
    for step in range(5):
        unbroken = unbroken * np.float32(0.9) + gradients[0][step]
    np.testing.assert_allclose(velocity, unbroken, rtol=RTOL, atol=ATOL)


def test_momentum_masking_false_without_the_correction_is_refused() -> None:
    with pytest.raises(ValueError, match="momentum_masking=False keeps the momentum"):
        Compression.topk(0.01, momentum_masking=False)


@pytest.mark.parametrize("workers", WORKERS)
@pytest.mark.parametrize("reduction", ["allgather", "gtopk"])
def test_momentum_correction_with_bucket_granularity_predivide_and_sum(reduction: str,
                                                                       workers: int) -> None:
    options = Options(reduction, density=0.04, momentum=0.75, granularity="bucket",
                      predivide=2.0, average=False)
    check_against_replay(options, workers, steps=6, seed=20 + workers)


@pytest.mark.parametrize("wire", ["float16", "bfloat16"])
def test_gtopk_momentum_correction_with_a_narrow_wire_dtype(wire: str) -> None:
    """Values rounded to the wire dtype where they are sent and after each merge; the residual
    keeps the unrounded values of entries sent but not kept."""
    check_against_replay(Options("gtopk", density=0.05, momentum=0.9, wire=wire), 3, steps=6,
                         seed=31)


def test_the_velocity_is_cleared_exactly_where_this_worker_sent() -> None:
    """A direct reading of the rule, independent of the replay's bookkeeping: after the step,
    u is 0 at I_p and m u_prev + g elsewhere."""
    options = Options("gtopk", density=0.05, momentum=0.9)
    generator = np.random.default_rng(5)
    gradients = generator.standard_normal((2, 3, sum(SIZES))).astype(np.float32)
    results = run_library(options, 2, gradients)
    replay = Replay(options, 2, SIZES)
    for step in range(3):
        before = [v.copy() for v in replay.velocities]
        want = replay.step([gradients[p][step] for p in range(2)])
        for rank in range(2):
            sent = want["sets"][rank][0]
            velocity = results[rank][step]["velocity"]
            assert np.all(velocity[sent] == 0.0)
            kept = np.setdiff1d(np.arange(sum(SIZES)), sent)
            expected = before[rank] * np.float32(0.9) + gradients[rank][step]
            np.testing.assert_allclose(velocity[kept], expected[kept], rtol=RTOL, atol=ATOL)


# -- (b) the warm-up density schedule ---------------------------------------------------------

WARMUP = {"warmup_densities": (0.5, 0.2013, 0.1), "warmup_steps": 2}


@pytest.mark.parametrize("workers", WORKERS)
@pytest.mark.parametrize("reduction", ["allgather", "gtopk"])
@pytest.mark.parametrize("granularity", ["model", "bucket"])
def test_warmup_schedule_matches_replay(granularity: str, reduction: str, workers: int) -> None:
    options = Options(reduction, density=0.0301, granularity=granularity, **WARMUP)
    history = check_against_replay(options, workers, steps=8, seed=40 + workers)
    # The k of each step, written out: three stages of two steps, then the density (some of
    # density * size fractional below one half, so that rounding would differ from ceil).
    if granularity == "model":  # max(1, ceil(density * 200))
        want = [100, 100, 41, 41, 20, 20, 7, 7]
    else:  # ceil(density * 120) + ceil(density * 7) + ceil(density * 73)
        want = [60 + 4 + 37] * 2 + [25 + 2 + 15] * 2 + [12 + 1 + 8] * 2 + [4 + 1 + 3] * 2
    assert [step["k"] for step in history] == want


def test_warmup_and_momentum_correction_together() -> None:
    options = Options("gtopk", density=0.01, momentum=0.9, granularity="bucket", **WARMUP)
    history = check_against_replay(options, 4, steps=9, seed=50)
    assert [step["k"] for step in history][-3:] == [2 + 1 + 1] * 3  # max(1, ceil(0.01 n))


def test_warmup_steps_without_stages_is_no_warmup() -> None:
    options = Options("allgather", density=0.05, warmup_densities=(), warmup_steps=3)
    history = check_against_replay(options, 2, steps=4, seed=60)
    assert [step["k"] for step in history] == [10] * 4
