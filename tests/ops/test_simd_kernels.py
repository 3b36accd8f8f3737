"""The vectorised paths of the CPU kernels (AVX-512 or AVX2: _C.simd_level()) against plain numpy:
set lengths around the vector widths (4, 8, 16 entries), ties, NaN / Inf / -0.0 / subnormals,
indices up to INT32_MAX, negative indices (the scalar path), and sets large enough to run every
vectorised loop on every thread. On a build without them the same checks cover the scalar loops.
"""

from __future__ import annotations

import numpy as np
import pytest
from helpers.reference import topk_reference

from gtopk_hvd import _C, ops

pytestmark = pytest.mark.filterwarnings("ignore:invalid value encountered in cast")  # sNaNs

INT32_MAX = int(np.iinfo(np.int32).max)
CANONICAL_NAN = 0x7FC00000  # the bits of a NaN sum (cpu_ops.h: merge_topk is symmetric)
SPECIAL_BITS = np.array([0x7FC00000, 0xFFC00000, 0x7FC00123, 0xFFFFFFFF, 0x7F800001,  # NaNs
                         0x7F800000, 0xFF800000,  # +-inf
                         0x00000000, 0x80000000, 0x00000001, 0x80000001,  # +-0, subnormals
                         0x3F800000, 0xBF800000, 0x40000000, 0x7F7FFFFF], np.uint32)


def values_of(kind: str, n: int, rng: np.random.Generator) -> np.ndarray:
    if kind == "normal":
        return rng.standard_normal(n).astype(np.float32)
    if kind == "ties":  # small integers: ties at every level, the k-th included
        return rng.integers(-3, 4, n).astype(np.float32)
    if kind == "special":  # mostly special values, among normal ones
        x = rng.standard_normal(n).astype(np.float32)
        special = rng.random(n) < 0.5
        x[special] = rng.choice(SPECIAL_BITS, int(special.sum())).view(np.float32)
        return x
    raise AssertionError(kind)


def sorted_indices(n: int, low: int, high: int, rng: np.random.Generator) -> np.ndarray:
    """n distinct sorted int32 indices from [low, high]."""
    return np.sort(rng.choice(np.arange(low, high + 1, dtype=np.int64), n, replace=False)
                   ).astype(np.int32)


def merge_expected(ia: np.ndarray, va: np.ndarray, ib: np.ndarray, vb: np.ndarray,
                   k: int) -> tuple[np.ndarray, np.ndarray]:
    """Union with float32 sums (a NaN sum canonical), top-k by the selection order."""
    union = np.union1d(ia, ib).astype(np.int32)
    summed = np.zeros(union.size, np.float32)
    summed[np.searchsorted(union, ia)] = va
    shared = np.isin(ib, ia)
    at_b = np.searchsorted(union, ib)
    summed[at_b[~shared]] = vb[~shared]
    with np.errstate(invalid="ignore", over="ignore"):
        summed[at_b[shared]] += vb[shared]
    bits = summed.view(np.uint32)
    bits[at_b[shared][np.isnan(summed[at_b[shared]])]] = CANONICAL_NAN
    keep = topk_reference(summed, k)
    return union[keep], summed[keep]


def assert_merge(ia: np.ndarray, va: np.ndarray, ib: np.ndarray, vb: np.ndarray, k: int) -> None:
    expected_index, expected_value = merge_expected(ia, va, ib, vb, k)
    for first, second in (((ia, va), (ib, vb)), ((ib, vb), (ia, va))):
        indices, values = ops.merge_topk(*first, *second, k)
        np.testing.assert_array_equal(indices, expected_index)
        assert values.view(np.uint32).tolist() == expected_value.view(np.uint32).tolist()


def test_simd_level_is_reported() -> None:
    assert _C.simd_level() in {"avx512", "avx2", "scalar"}


WIDTHS = [0, 1, 2, 3, 4, 5, 7, 8, 9, 15, 16, 17, 23, 24, 25, 31, 32, 33, 39, 40]
INDEX_RANGES = {"dense": (0, 50), "spread": (0, 10**6), "top": (INT32_MAX - 50, INT32_MAX)}


@pytest.mark.parametrize("index_range", sorted(INDEX_RANGES))
@pytest.mark.parametrize("kind", ["normal", "ties", "special"])
def test_merge_small_sets_around_the_vector_widths(kind: str, index_range: str) -> None:
    rng = np.random.default_rng(len(kind) * 1000 + len(index_range))
    low, high = INDEX_RANGES[index_range]
    for n_a in WIDTHS:
        for n_b in WIDTHS:
            ia, ib = sorted_indices(n_a, low, high, rng), sorted_indices(n_b, low, high, rng)
            va, vb = values_of(kind, n_a, rng), values_of(kind, n_b, rng)
            n_union = np.union1d(ia, ib).size
            for k in sorted({0, 1, n_union // 2, max(0, n_union - 1), n_union, n_union + 3}):
                assert_merge(ia, va, ib, vb, k)


# The vectorised merge sums and compresses its output a chunk of 1024 merged entries at a time
# (merge_topk.cpp, kChunk): sets whose merge ends just before, at and after a chunk's end, with
# shared indices on both sides of it.
@pytest.mark.parametrize("total", [1016, 1023, 1024, 1025, 1032, 1040, 2047, 2048, 2056, 3079])
@pytest.mark.parametrize("kind", ["normal", "special"])
def test_merge_sets_around_the_chunk(total: int, kind: str) -> None:
    rng = np.random.default_rng(total + len(kind))
    previous = ops.get_num_threads()
    ops.set_num_threads(1)  # one piece: the chunk boundaries are where the test puts them
    try:
        for n_a in (total // 2, 8, total - 9):
            n_b = total - n_a
            # Indices in [0, 1.2 total]: most of the smaller set shares an index with the other.
            ia = sorted_indices(n_a, 0, int(1.2 * total), rng)
            ib = sorted_indices(n_b, 0, int(1.2 * total), rng)
            va, vb = values_of(kind, n_a, rng), values_of(kind, n_b, rng)
            n_union = np.union1d(ia, ib).size
            for k in (1, n_union // 2, n_union):
                assert_merge(ia, va, ib, vb, k)
    finally:
        ops.set_num_threads(previous)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("kind", ["normal", "ties", "special"])
@pytest.mark.parametrize("n,overlap", [(70_001, 0.0), (70_001, 0.5), (300_007, 0.3)])
def test_merge_large_sets_near_the_top_index(n: int, overlap: float, kind: str,
                                             threads: int) -> None:
    rng = np.random.default_rng(n + int(10 * overlap) + len(kind))
    ia = sorted_indices(n, INT32_MAX - 4 * n, INT32_MAX, rng)
    shared = rng.choice(ia, int(overlap * n), replace=False)
    others = np.setdiff1d(sorted_indices(2 * n, INT32_MAX - 4 * n, INT32_MAX, rng), ia)
    ib = np.sort(np.concatenate([shared, others[:n - shared.size]])).astype(np.int32)
    ia[-1], ib[-1] = INT32_MAX, INT32_MAX  # the largest index, in both sets
    va, vb = values_of(kind, n, rng), values_of(kind, n, rng)
    previous = ops.get_num_threads()
    ops.set_num_threads(threads)
    try:
        for k in (1, n // 10, n, 2 * n - 5, 2 * n):
            assert_merge(ia, va, ib, vb, k)
    finally:
        ops.set_num_threads(previous)


@pytest.mark.parametrize("n", [5, 40, 100_003])
def test_merge_with_negative_indices(n: int) -> None:
    rng = np.random.default_rng(n)
    ia, ib = sorted_indices(n, -3 * n, n, rng), sorted_indices(n, -n, 3 * n, rng)
    va, vb = values_of("special", n, rng), values_of("ties", n, rng)
    for k in (1, n // 2, 2 * n):
        assert_merge(ia, va, ib, vb, k)


def assert_topk(x: np.ndarray, k: int, threshold_hint: float | None = None) -> None:
    indices, values = ops.topk_abs(x, k, threshold_hint=threshold_hint)
    expected = topk_reference(x, k)
    np.testing.assert_array_equal(indices, expected)
    assert values.view(np.uint32).tolist() == x[expected].view(np.uint32).tolist()


@pytest.mark.parametrize("kind", ["normal", "ties", "special"])
@pytest.mark.parametrize("d", [65_537, 65_551, 65_552, 65_553, 100_255, 100_257, 1_000_003])
def test_topk_float32_lengths_off_the_group_width(d: int, kind: str) -> None:
    x = values_of(kind, d, np.random.default_rng(d))
    for k in (1, 7, d // 1000, d // 100, d // 17):
        assert_topk(x, k)


@pytest.mark.parametrize("k", [100, 1000, 2500, 3000])
def test_topk_float32_threshold_hint_equal_to_present_values(k: int) -> None:
    """Entries equal to the hint pass the vectorised filter (key >= threshold): with 500 threes
    and 2000 twos among small values, a hint of 2 keeps exactly those 2500 candidates."""
    rng = np.random.default_rng(k)
    x = (0.01 * rng.standard_normal(1_000_003)).astype(np.float32)
    spots = rng.choice(x.size, 2500, replace=False)
    x[spots[:500]] = rng.choice([-3.0, 3.0], 500)
    x[spots[500:]] = rng.choice([-2.0, 2.0], 2000)
    for hint in (2.0, np.nextafter(np.float32(2.0), np.float32(0)), 3.0, None):
        assert_topk(x, k, hint)
