"""MiCRO, ExDyna, sketched SGD and gTop-k's exact variant against independent numpy replays of
their rules, on P = 1..8 workers (threads over an in-process transport):

  exclusivity    MiCRO / ExDyna: every index of the union comes from one worker's partition
  conservation   what is applied plus every worker's residual equals the sum of every
                 worker's gradients, to float32 rounding
  replicas       every worker's result is bitwise identical
  density        the threshold schemes select within 10% of k at every step
  resume         a step object restored from a checkpoint continues bit for bit
  empty          steps where nobody selects anything run (no hang), and apply nothing

The replays take from the library only the threshold it chose for each step (its rule, the
histogram's, is checked on its own: `test_the_histogram_threshold_passes_k`) and the
sketch's hash keys; everything else (partitions, block boundaries, hashes, medians, the
gTop-k schedule, the sums) is computed here. Ok-Topk's replay is tests/schemes/test_oktopk.py; the
shared checks here (resume, empty steps, torch tensors) run it too.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from helpers.conservation import check_replicas_and_conservation
from helpers.mpi_launcher import run_mpi
from helpers.reference import gtopk_schedule_reference, magnitude_order, topk_reference
from helpers.thread_transport import ThreadGroup

import gtopk_hvd.schemes.threshold as control
from gtopk_hvd.compression import Compression
from gtopk_hvd.core import SparseStep

WORKERS = [1, 2, 3, 4, 5, 6, 7, 8]


def heavy_tailed(shape: tuple[int, ...], seed: int) -> np.ndarray:
    """Gradient-like data: Student-t noise (3 degrees of freedom) with scales varying across
    the vector (layers of different magnitude)."""
    rng = np.random.default_rng(seed)
    scale = np.repeat(rng.uniform(0.05, 2.0, 16), -(-shape[-1] // 16))[: shape[-1]]
    return (rng.standard_t(3, shape) * scale).astype(np.float32)


def run_steps(config: object, gradients: np.ndarray, sizes: list[int] | None = None,
              record: str | None = None) -> list[list[dict]]:
    """Every worker's steps: indices, values, residual (and a scheme attribute, `record`)."""
    workers, steps, d = gradients.shape

    def work(transport: object) -> list[dict]:
        step = SparseStep(config, sizes or [d], transport)
        out = []
        for t in range(steps):
            before = None if record is None else np.copy(getattr(step.scheme, record))
            indices, values = step.update(gradients[transport.rank, t].copy())
            out.append({"indices": indices.copy(), "values": values.copy(),
                        "residual": step.residual.copy(), "k": step.last_stats.k,
                        "threshold": getattr(step.scheme, "threshold", None),
                        "record": before, "bytes": step.last_stats.bytes_sent})
        return out

    return ThreadGroup(workers).run(work)


# -- MiCRO and ExDyna ----------------------------------------------------------------------------

def exdyna_blocks(d: int, blocks: int, workers: int) -> tuple[int, int, int]:
    """(values per block, number of blocks, fewest blocks a partition keeps): ExDyna's layout."""
    block = math.ceil(d / blocks)
    block = 32 * math.ceil(block / 32) if block >= 32 else max(1, block)
    n_blocks = math.ceil(d / block)
    return block, n_blocks, (max(1, n_blocks // (4 * workers)) if n_blocks >= workers else 0)


def replay_partitioned(gradients: np.ndarray, thresholds: list[float], exdyna: dict | None
                       ) -> list[dict]:
    """MiCRO's rule (ExDyna's with `exdyna`: blocks, balance) for every worker at once."""
    workers, steps, d = gradients.shape
    residuals = np.zeros((workers, d), np.float32)
    if exdyna is not None:
        block, n_blocks, fewest = exdyna_blocks(d, exdyna["blocks"], workers)
        edges = [q * n_blocks // workers for q in range(workers + 1)]
    out = []
    for t in range(steps):
        if exdyna is None:
            bounds = [q * d // workers for q in range(workers + 1)]
        else:
            bounds = [min(e * block, d) for e in edges]
        acc = residuals + gradients[:, t]
        chosen, per_partition = [], [0] * workers
        for p in range(workers):
            part = (p + t) % workers
            begin, end = bounds[part], bounds[part + 1]
            magnitude = np.abs(acc[p, begin:end])
            mine = np.nonzero((magnitude >= thresholds[t]) | np.isnan(magnitude))[0] + begin
            chosen.append(mine)
            per_partition[part] = mine.size
        union = np.sort(np.concatenate(chosen))
        assert np.unique(union).size == union.size  # exclusivity
        values = acc[:, union].sum(axis=0, dtype=np.float64)
        acc[:, union] = 0
        residuals = acc
        out.append({"union": union, "values": values / workers, "residuals": residuals.copy(),
                    "bounds": bounds})
        if exdyna is not None:
            mean = sum(per_partition) / workers
            high, low = (1 + exdyna["balance"]) * mean, (1 - exdyna["balance"]) * mean
            for q in range(workers - 1):
                c, c_next = per_partition[q], per_partition[q + 1]
                if c > high and c_next < low and edges[q + 1] - edges[q] > fewest:
                    edges[q + 1] -= 1
                elif c_next > high and c < low and edges[q + 2] - edges[q + 1] > fewest:
                    edges[q + 1] += 1
    return out


def check_partitioned(config: object, gradients: np.ndarray, exdyna: dict | None = None
                      ) -> list[list[dict]]:
    results = run_steps(config, gradients, record="boundaries" if exdyna else None)
    workers = gradients.shape[0]
    expected = replay_partitioned(gradients, [r["threshold"] for r in results[0]], exdyna)
    for t, want in enumerate(expected):
        for rank in range(workers):
            got = results[rank][t]
            np.testing.assert_array_equal(got["indices"], want["union"], err_msg=f"step {t}")
            np.testing.assert_allclose(got["values"], want["values"], rtol=1e-5, atol=1e-6)
            np.testing.assert_allclose(got["residual"], want["residuals"][rank], rtol=1e-6,
                                       atol=1e-6)
        if exdyna is not None and t > 0:  # the boundaries the step used
            block = exdyna_blocks(gradients.shape[2], exdyna["blocks"], workers)[0]
            np.testing.assert_array_equal(
                np.minimum(results[0][t]["record"] * block, gradients.shape[2]), want["bounds"])
    check_replicas_and_conservation(results, gradients)
    return results


@pytest.mark.parametrize("workers", WORKERS)
def test_micro_matches_its_replay(workers: int) -> None:
    gradients = heavy_tailed((workers, 6, 3001), workers)
    results = check_partitioned(Compression.micro(0.02), gradients)
    for t, step in enumerate(results[0]):
        assert abs(step["indices"].size / step["k"] - 1) <= 0.1, (t, step["indices"].size)


@pytest.mark.parametrize("workers", WORKERS)
def test_exdyna_matches_its_replay_boundaries_included(workers: int) -> None:
    # Scales rising along the vector: the partitions' counts differ, boundaries move.
    gradients = heavy_tailed((workers, 8, 4000), 10 + workers) * np.linspace(
        0.2, 3.0, 4000, dtype=np.float32)
    config = Compression.exdyna(0.02, blocks=64, balance=0.05)
    results = check_partitioned(config, gradients, {"blocks": 64, "balance": 0.05})
    if workers > 1:
        moved = [not np.array_equal(r["record"], results[0][1]["record"]) for r in results[0][2:]]
        assert any(moved), "no boundary moved: the test would not see a wrong balance rule"


def test_micro_with_momentum_correction_and_warmup_keeps_its_rules() -> None:
    gradients = heavy_tailed((3, 8, 2000), 7)
    config = Compression.micro(0.01, momentum_correction=True, momentum=0.9,
                               warmup_densities=(0.1,), warmup_steps=3)
    results = run_steps(config, gradients)
    ks = [step["k"] for step in results[0]]
    assert ks == [200] * 3 + [20] * 5
    for step in results[0]:
        assert abs(step["indices"].size / step["k"] - 1) <= 0.1
    for t in range(8):
        for rank in range(1, 3):
            np.testing.assert_array_equal(results[rank][t]["values"], results[0][t]["values"])


def test_the_histogram_threshold_passes_k() -> None:
    """from_histogram on a histogram counted here in numpy: the count at tau is within 1% of k
    (or 2 entries) for power-law and Gaussian magnitudes."""
    rng = np.random.default_rng(0)
    for magnitudes in (np.abs(rng.standard_t(2, 400_000)), np.abs(rng.standard_normal(400_000))):
        magnitudes = magnitudes.astype(np.float32)
        for k in (40, 400, 4000):
            exact = np.sort(magnitudes)[-k]
            window = control.window_around(float(exact) * 1.3)  # last step's tau, 1.3x off
            keys = magnitudes.view(np.uint32).astype(np.int64)
            counted = keys[keys >= window.base_key] - window.base_key
            histogram = np.zeros(control.N_BINS, np.int64)
            for offset in counted.tolist():  # the bins as the Window's docstring cuts them
                fine = offset >> control.FINE_SHIFT
                b = fine if fine < control.N_FINE else control.N_FINE + (
                    (offset - (control.N_FINE << control.FINE_SHIFT)) >> control.COARSE_SHIFT)
                histogram[min(b, control.N_BINS - 1)] += 1
            tau = control.from_histogram(histogram, window, k)
            count = np.count_nonzero(magnitudes >= tau)
            assert abs(count - k) <= max(0.01 * k, 2), (k, count, tau, exact)


def test_the_authors_rule_is_slow_from_a_far_start_and_ours_is_not() -> None:
    gradients = heavy_tailed((2, 30, 5000), 3)
    slow = run_steps(Compression.micro(0.01, threshold=100.0, controller="multiplicative"),
                     gradients)
    fast = run_steps(Compression.micro(0.01, threshold=100.0), gradients)
    assert all(step["indices"].size < 5 for step in slow[0][:20])  # 100 is far above k's tau
    assert [r["threshold"] for r in slow[0][:4]] == pytest.approx(
        [100.0, 99.5, 99.0025, 98.5074875], rel=1e-6)  # x 0.995 a step: the authors' rule
    assert all(abs(step["indices"].size / 50 - 1) <= 0.1 for step in fast[0])


# -- sketched SGD --------------------------------------------------------------------------------

def mix32(x: int) -> int:
    x ^= x >> 16
    x = (x * 0x85EBCA6B) & 0xFFFFFFFF
    x ^= x >> 13
    x = (x * 0xC2B2AE35) & 0xFFFFFFFF
    return x ^ (x >> 16)


def replay_sketch(gradients: np.ndarray, keys: np.ndarray, columns: int, k: int,
                  second_round: bool) -> list[dict]:
    workers, steps, d = gradients.shape
    rows = keys.shape[0]
    bucket = np.array([[mix32(i ^ int(keys[j, 0])) * columns >> 32 for i in range(d)]
                       for j in range(rows)])
    sign = np.array([[-1.0 if mix32(i ^ int(keys[j, 1])) >> 31 else 1.0 for i in range(d)]
                     for j in range(rows)])
    residuals = np.zeros((workers, d), np.float32)
    out = []
    for t in range(steps):
        acc = residuals + gradients[:, t]
        table = np.zeros((rows, columns))
        for p in range(workers):
            for j in range(rows):
                np.add.at(table[j], bucket[j], sign[j] * acc[p])
        estimate = np.median([sign[j] * table[j, bucket[j]] for j in range(rows)], axis=0)
        union = topk_reference(estimate.astype(np.float32), k)
        values = acc[:, union].sum(axis=0) if second_round else estimate[union]
        acc[:, union] = 0
        residuals = acc
        out.append({"union": union, "values": values / workers, "residuals": acc.copy()})
    return out


@pytest.mark.parametrize("workers", WORKERS)
def test_sketch_matches_its_replay(workers: int) -> None:
    d, k = 600, 12
    gradients = heavy_tailed((workers, 5, d), 20 + workers)
    gradients[:, :, 100:106] += 50.0  # heavy hitters for the sketch to find
    config = Compression.sketch(k / d, rows=5, columns=120, seed=workers)
    results = run_steps(config, gradients)
    keys = np.random.default_rng([workers, 0x5EED]).integers(0, 2**32, (5, 2), dtype=np.uint64)
    expected = replay_sketch(gradients, keys, 120, k, True)
    for t, want in enumerate(expected):
        for rank in range(workers):
            got = results[rank][t]
            np.testing.assert_array_equal(got["indices"], want["union"], err_msg=f"step {t}")
            np.testing.assert_allclose(got["values"], want["values"], rtol=1e-5, atol=1e-5)
            np.testing.assert_allclose(got["residual"], want["residuals"][rank], atol=1e-5)
        assert set(range(100, 106)) <= set(want["union"].tolist()) or t > 0
    check_replicas_and_conservation(results, gradients)


def test_sketch_without_the_second_round_applies_the_estimates() -> None:
    d, k, workers = 400, 8, 3
    gradients = heavy_tailed((workers, 3, d), 5)
    results = run_steps(Compression.sketch(k / d, rows=3, columns=80, second_round=False),
                        gradients)
    keys = np.random.default_rng([0, 0x5EED]).integers(0, 2**32, (3, 2), dtype=np.uint64)
    for t, want in enumerate(replay_sketch(gradients, keys, 80, k, False)):
        np.testing.assert_array_equal(results[1][t]["indices"], want["union"])
        np.testing.assert_allclose(results[1][t]["values"], want["values"], rtol=1e-5,
                                   atol=1e-5)


# -- gTop-k, exact -------------------------------------------------------------------------------

@pytest.mark.parametrize("workers", WORKERS)
def test_exact_gtopk_sums_every_workers_values_at_the_global_set(workers: int) -> None:
    d, k, steps = 500, 10, 5
    gradients = heavy_tailed((workers, steps, d), 30 + workers)
    results = run_steps(Compression.gtopk(k / d, exact=True), gradients)
    residuals = np.zeros((workers, d), np.float32)
    for t in range(steps):
        acc = residuals + gradients[:, t]
        sets = []
        for p in range(workers):
            chosen = topk_reference(acc[p], k)
            sets.append((chosen.astype(np.int32), acc[p, chosen].copy()))
        finals, _, _ = gtopk_schedule_reference(sets, k, 8, lambda v: v)
        union = finals[0][0]
        values = acc[:, union].sum(axis=0, dtype=np.float64) / workers
        acc[:, union] = 0
        residuals = acc
        for rank in range(workers):
            got = results[rank][t]
            np.testing.assert_array_equal(got["indices"], union)
            np.testing.assert_allclose(got["values"], values, rtol=1e-5, atol=1e-6)
            np.testing.assert_allclose(got["residual"], residuals[rank], rtol=1e-6, atol=1e-6)
    check_replicas_and_conservation(results, gradients)


def test_exact_costs_one_all_reduce_of_the_global_set_more() -> None:
    d, k, workers = 4000, 40, 4
    gradients = heavy_tailed((workers, 2, d), 1)
    plain = run_steps(Compression.gtopk(k / d), gradients)
    exact = run_steps(Compression.gtopk(k / d, exact=True), gradients)
    for t in range(2):
        extra = exact[0][t]["bytes"] - plain[0][t]["bytes"]
        assert extra == 2 * (workers - 1) * 4 * exact[0][t]["indices"].size // workers


# -- every scheme: checkpoints, empty steps, bytes -----------------------------------------------

SCHEMES = {
    "micro": lambda: Compression.micro(0.02),
    "exdyna": lambda: Compression.exdyna(0.02, blocks=32),
    "sketch": lambda: Compression.sketch(0.02, columns=200),
    "gtopk-exact": lambda: Compression.gtopk(0.02, exact=True),
    "micro-multiplicative": lambda: Compression.micro(0.02, threshold=0.5,
                                                      controller="multiplicative"),
    "oktopk": lambda: Compression.oktopk(0.02, reestimate_every=3),
}


@pytest.mark.parametrize("name", sorted(SCHEMES))
def test_resume_from_a_checkpoint_is_exact(name: str) -> None:
    workers, steps, d = 3, 8, 1500
    gradients = heavy_tailed((workers, steps, d), 4) * np.linspace(0.2, 3, d, dtype=np.float32)
    config = SCHEMES[name]()

    def work(transport: object) -> tuple[list, list]:
        straight = SparseStep(config, [d], transport)
        first = SparseStep(config, [d], transport)
        through, resumed = [], []
        for t in range(steps):
            through.append(straight.update(gradients[transport.rank, t].copy())[1].copy())
            if t < 4:
                resumed.append(first.update(gradients[transport.rank, t].copy())[1].copy())
            if t == 3:
                saved = first.state_dict()
                first = SparseStep(config, [d], transport)
                first.load_state_dict(saved)
            if t >= 4:
                resumed.append(first.update(gradients[transport.rank, t].copy())[1].copy())
        return through, resumed

    for through, resumed in ThreadGroup(workers).run(work):
        for t in range(steps):
            np.testing.assert_array_equal(resumed[t], through[t], err_msg=f"step {t}")


@pytest.mark.parametrize("name", sorted(SCHEMES))
def test_steps_where_nothing_is_selected_apply_nothing_and_do_not_hang(name: str) -> None:
    workers, d = 4, 800
    gradients = np.zeros((workers, 3, d), np.float32)
    gradients[:, 2, 5] = 1.0  # one entry at the last step, in one worker's partition only

    results = run_steps(SCHEMES[name](), gradients)
    for t in range(2):
        for rank in range(workers):
            assert not np.any(results[rank][t]["values"]), (t, rank)
    last = results[0][2]
    assert 5 in last["indices"].tolist()
    np.testing.assert_allclose(last["values"][last["indices"].tolist().index(5)], 1.0)


def test_micro_bytes_follow_the_formula() -> None:
    """Bytes per worker per step of a ring: indices 4k (P-1)/P, values 8k (P-1)/P, the
    histogram 8 N_BINS (P-1)/P, counts 16 (P-1)."""
    for workers in (2, 4, 8):
        d = 16_000
        gradients = heavy_tailed((workers, 3, d), workers)
        results = run_steps(Compression.micro(0.01), gradients)
        for rank in range(workers):
            for step in results[rank][1:]:
                union = step["indices"].size
                formula = (12 * union + 4 * control.N_BINS * 2) * (workers - 1) / workers + (
                    16 * (workers - 1))
                assert abs(step["bytes"] / formula - 1) <= 0.1, (workers, step["bytes"], formula)


@pytest.mark.parametrize("option, message", [
    ({"threshold": -1.0}, r"threshold must be a finite number > 0 or None, got float -1.0"),
    ({"controller": "pid"}, "controller must be one of 'histogram', 'multiplicative', got str"),
    ({"granularity": "bucket"}, "granularity must be 'model' for scheme 'micro'"),
    ({"wire_dtype": "float16"}, "wire_dtype must be 'float32' for scheme 'micro'"),
])
def test_bad_micro_options_are_refused_when_the_configuration_is_made(option: dict,
                                                                       message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Compression.micro(0.01, **option)


def test_bad_sketch_and_exdyna_options_are_refused() -> None:
    with pytest.raises(ValueError, match="rows must be an integer >= 1, got int 0"):
        Compression.sketch(0.01, rows=0)
    with pytest.raises(ValueError, match=r"rows must be an integer in \[1, 64\], got int 65"):
        Compression.sketch(0.01, rows=65)
    with pytest.raises(ValueError, match="blocks must be an integer >= 1, got int 0"):
        Compression.exdyna(0.01, blocks=0)
    with pytest.raises(ValueError, match=r"balance must be a number in \[0, 1\), got float 1.5"):
        Compression.exdyna(0.01, balance=1.5)
    with pytest.raises(ValueError, match="exact must be True or False"):
        Compression.gtopk(0.01, exact="yes")


def test_selection_order_helper_agrees_with_the_kernels_nan_rule() -> None:
    values = np.array([1.0, np.nan, -3.0, 0.5], np.float32)
    assert magnitude_order(values)[0] == 1  # NaN first, as the threshold read keeps it


@pytest.mark.parametrize("name", sorted(SCHEMES))
def test_torch_tensors_step_as_numpy_arrays_do(name: str) -> None:
    """The step on torch tensors (the backend a GPU gets; CPU tensors here) is bit for bit the
    step on numpy arrays: residuals, indices and values, with momentum correction."""
    import torch

    workers, steps, d = 3, 4, 900
    gradients = heavy_tailed((workers, steps, d), 8)
    config = SCHEMES[name]()

    def work(transport: object) -> list:
        on_numpy, on_torch = (SparseStep(config, [d], transport),
                              SparseStep(config, [d], transport, device="cpu"))
        out = []
        for t in range(steps):
            numpy_result = on_numpy.update(gradients[transport.rank, t].copy())
            torch_result = on_torch.update(torch.from_numpy(gradients[transport.rank, t].copy()))
            out.append((numpy_result, torch_result, on_numpy.residual.copy(),
                        on_torch.residual.numpy().copy()))
        return out

    for rank_steps in ThreadGroup(workers).run(work):
        for (numpy_result, torch_result, numpy_residual, torch_residual) in rank_steps:
            np.testing.assert_array_equal(np.asarray(torch_result[0]), numpy_result[0])
            np.testing.assert_array_equal(np.asarray(torch_result[1]), numpy_result[1])
            np.testing.assert_array_equal(torch_residual, numpy_residual)


# -- the selection pass --------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("begin, end", [(0, 300_007), (1_000, 250_000), (77, 77), (299_990,
                                                                                  300_007)])
def test_the_fused_pass_and_the_threshold_read_match_numpy(dtype: type, begin: int, end: int
                                                           ) -> None:
    """ops.accumulate_threshold (C++, and the torch operations that builds without CUDA
    kernels run on CUDA tensors) against numpy:
    the accumulation over all of d, the cleared gradient, the selection (NaN and Inf in) and
    the histogram; ops.threshold_indices likewise."""
    import torch

    from gtopk_hvd import ops

    rng = np.random.default_rng(1)
    d = 300_007
    gradient = rng.standard_normal(d).astype(dtype)
    residual = rng.standard_normal(d).astype(dtype)
    gradient[[5, 100_000, 260_000]] = [np.nan, np.inf, -np.inf]
    acc = residual + gradient
    tau, low = 2.5, 0.75
    width = 64 if dtype == np.float64 else 32
    shift = 48 if dtype == np.float64 else 19
    bits = acc[begin:end].view(np.uint64 if width == 64 else np.uint32).astype(np.uint64)
    keys = np.minimum(bits & np.uint64((1 << (width - 1)) - 1),
                      np.uint64(0x7FF0000000000001 if width == 64 else 0x7F800001))
    threshold_key, base_key = ops.magnitude_key(tau, dtype), ops.magnitude_key(low, dtype)
    counted = keys[keys >= base_key].astype(np.int64) - base_key
    want_histogram = np.bincount(np.minimum(counted >> shift, 40), minlength=41)
    magnitude = np.abs(acc[begin:end])
    want = np.nonzero((magnitude >= tau) | np.isnan(magnitude))[0] + begin

    for run in ("kernel", "torch"):
        g, r = gradient.copy(), residual.copy()
        if run == "kernel":
            indices, histogram = ops.accumulate_threshold(g, r, begin, end, threshold_key,
                                                          base_key, shift, 41, True)
            read = ops.threshold_indices(r, begin, end, threshold_key)
        else:
            g, r = torch.from_numpy(g), torch.from_numpy(r)
            indices, histogram = ops.threshold._torch_accumulate_threshold(
                g, r, begin, end, threshold_key, base_key, shift, 41, True)
            read = ops.threshold._torch_threshold_indices(r, begin, end, threshold_key)
            g, r, indices, read = g.numpy(), r.numpy(), indices.numpy(), read.numpy()
        np.testing.assert_array_equal(r, acc)
        assert not np.any(g)
        np.testing.assert_array_equal(indices, want, err_msg=run)
        np.testing.assert_array_equal(read, want, err_msg=run)
        np.testing.assert_array_equal(histogram, want_histogram, err_msg=run)


def numpy_bins(offset: np.ndarray, shift: int, n_bins: int, n_fine: int, coarse_shift: int
               ) -> np.ndarray:
    """The histogram's bin rule (gtopk/histogram_bins.h), written out in numpy."""
    offset = offset.astype(object)  # Python integers: no overflow at float64's keys
    n_fine = n_bins if not 0 <= n_fine <= n_bins else n_fine
    span = n_fine << shift
    bins = [o >> shift if o < span else n_fine + ((o - span) >> coarse_shift) for o in offset]
    return np.minimum(np.array(bins, dtype=object), n_bins - 1).astype(np.int64)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("layout", [(19, 41, -1, 0), (17, 93, 64, 20), (12, 6000, 5000, 16),
                                    (17, 10, 10, 20), (17, 1, 0, 3)],
                         ids=["fine", "fine+coarse", "many", "n_fine=n_bins", "one-bin"])
def test_the_fused_pass_histogram_bins_match_numpy(dtype: type, layout: tuple) -> None:
    """The CPU kernel's histogram under each bin layout (the rule the CUDA kernel shares), and
    the torch operations' (`ops.histogram_bin`, the fallback of builds without CUDA kernels)."""
    import torch

    from gtopk_hvd import ops

    shift, n_bins, n_fine, coarse_shift = layout
    if dtype == np.float64:
        shift, coarse_shift = shift + 29, coarse_shift + 29
    rng = np.random.default_rng(2)
    d = 50_003
    residual = (rng.standard_normal(d) * np.exp(rng.uniform(-8, 8, d))).astype(dtype)
    residual[[0, 9]] = [np.nan, np.inf]
    base_key = ops.magnitude_key(0.01, dtype)
    width = 64 if dtype == np.float64 else 32
    bits = residual.view(np.uint64 if width == 64 else np.uint32).astype(np.uint64)
    keys = np.minimum(bits & np.uint64((1 << (width - 1)) - 1),
                      np.uint64(0x7FF0000000000001 if width == 64 else 0x7F800001))
    counted = keys[keys >= np.uint64(base_key)] - np.uint64(base_key)
    want = np.bincount(numpy_bins(counted, shift, n_bins, n_fine, coarse_shift),
                       minlength=n_bins)
    _, histogram = ops.accumulate_threshold(np.zeros(d, dtype), residual, 0, d, base_key,
                                            base_key, shift, n_bins, False, n_fine, coarse_shift)
    np.testing.assert_array_equal(histogram, want)
    _, histogram = ops.threshold._torch_accumulate_threshold(
        torch.zeros(d, dtype=torch.float64 if dtype == np.float64 else torch.float32),
        torch.from_numpy(residual.copy()), 0, d, base_key, base_key, shift, n_bins, False,
        n_fine, coarse_shift)
    np.testing.assert_array_equal(histogram, want)
    assert np.count_nonzero(want) >= min(n_bins, 4), "the layout's bins were not reached"
    if 0 <= n_fine < n_bins - 1:
        assert want[n_fine:-1].any() and want[-1] > 0, "no coarse bin, or not the open last one"


def test_the_fused_pass_refuses_bad_bounds() -> None:
    from gtopk_hvd import ops

    x = np.zeros(10, np.float32)
    with pytest.raises(ValueError, match="need 0 <= begin <= end <= d"):
        ops.accumulate_threshold(x, x.copy(), 4, 11, 0, 0, 19, 4)
    with pytest.raises(ValueError, match="need 0 <= begin <= end <= d"):
        ops.threshold_indices(x, 5, 4, 0)
    with pytest.raises(ValueError, match="does not fit the values' key type"):
        ops.threshold_indices(x, 0, 10, 1 << 32)  # float32 keys are 32-bit: no truncation
    with pytest.raises(ValueError, match="does not fit the values' key type"):
        ops.accumulate_threshold(x, x.copy(), 0, 10, 0, 1 << 32, 19, 4)
    with pytest.raises(ValueError, match="span 2\\^63 keys or more"):
        ops.accumulate_threshold(x, x.copy(), 0, 10, 0, 0, 52, 1 << 12)


# -- through the adapters, launched ---------------------------------------------------------------

# The launches of tests/mpi/mpi_union_schemes.py: the TF tape and Keras 3's optimizer share one
# (the same TensorFlow, Horovod and Keras in the ranks); tf-keras is chosen at import; torch.
ADAPTER_LAUNCHES = (("torch",), ("tensorflow", "keras"), ("tf-keras",))


@pytest.fixture(scope="module")
def adapter_launches() -> dict[tuple[str, ...], object]:
    """Each launch's output (or the error it failed with), made once for the module when a test
    first asks for it."""
    return {}


@pytest.mark.mpi
@pytest.mark.parametrize("framework", ["torch", "tensorflow", "keras", "tf-keras"])
def test_the_schemes_are_one_line_choices_of_every_adapter_under_mpirun(
        framework: str, adapter_launches: dict[tuple[str, ...], object]) -> None:
    """tests/mpi/mpi_union_schemes.py on 3 workers: torch over the mpi and horovod transports
    and through Horovod's own swapped wrapper, the TF tape (ours and Horovod's, swapped), Keras'
    optimizer on Keras 3 and tf-keras; each update equals the core's, replicas bitwise equal."""
    frameworks = next(launch for launch in ADAPTER_LAUNCHES if framework in launch)
    if frameworks not in adapter_launches:
        try:
            adapter_launches[frameworks] = run_mpi("mpi_union_schemes.py", 3, *frameworks,
                                                   timeout_s=900)
        except AssertionError as error:  # the launch failed: each of its tests says so
            adapter_launches[frameworks] = error
    output = adapter_launches[frameworks]
    if isinstance(output, AssertionError):
        raise output
    assert f"UNION SCHEMES THROUGH {framework} OK" in output


@pytest.mark.mpi
def test_the_schemes_run_in_the_ddp_hook_and_resume_exactly_under_torchrun() -> None:
    output = run_mpi("torchrun_union_schemes.py", 3, launcher="torchrun", timeout_s=600)
    assert "union schemes through the ddp hook ok on 3 workers" in output
