"""The kernels that keep a step free of gradient-sized temporaries, against numpy: the max-key
reductions (all_finite, largest_finite_magnitude), the histogram pass without accumulation,
the blockwise predivision, and the sorted union of exact gTop-k."""

from __future__ import annotations

import numpy as np
import pytest

from gtopk_hvd import ops

torch = pytest.importorskip("torch")


@pytest.mark.parametrize("bad", [None, np.nan, np.inf, -np.inf])
def test_all_finite_bfloat16_tensors(bad: object) -> None:
    x = torch.randn(70_001).bfloat16()
    if bad is not None:
        x[12_345] = bad
    assert ops.all_finite(x) == bool(torch.isfinite(x).all())


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("n,begin,end", [(0, 0, 0), (10, 2, 9), (200_003, 1_000, 150_000)])
def test_largest_finite_magnitude_of_a_sum(dtype: type, n: int, begin: int, end: int) -> None:
    rng = np.random.default_rng(3)
    x, y = rng.standard_normal(n).astype(dtype), rng.standard_normal(n).astype(dtype)
    if n > 100:
        x[[begin, begin + 7, end - 1]] = [np.nan, np.inf, -np.inf]
    total = (x + y)[begin:end]
    finite = np.abs(total[np.isfinite(total)])
    expected = float(finite.max()) if finite.size else 0.0
    assert ops.largest_finite_magnitude(x, begin, end, plus=y) == expected
    assert ops.largest_finite_magnitude(torch.from_numpy(x), begin, end,
                                        plus=torch.from_numpy(y)) == expected


def reference_histogram(x: np.ndarray, begin: int, end: int, base: int, shift: int,
                        n_bins: int) -> np.ndarray:
    keys = np.minimum(x[begin:end].view(np.uint32) & np.uint32(0x7FFFFFFF),
                      np.uint32(0x7F800001)).astype(np.int64)
    counted = keys[keys >= base] - base
    return np.bincount(ops.histogram_bin(counted, shift, n_bins), minlength=n_bins)


def test_magnitude_histogram_reads_without_accumulating() -> None:
    x = np.random.default_rng(4).standard_t(3, 300_001).astype(np.float32)
    x[[5, 77]] = [np.nan, np.inf]
    before = x.copy()
    base = ops.magnitude_key(0.01)
    histogram = ops.magnitude_histogram(x, 1_000, 290_000, base, 19, 322)
    np.testing.assert_array_equal(histogram, reference_histogram(x, 1_000, 290_000, base, 19,
                                                                 322))
    assert x.tobytes() == before.tobytes()


def test_accumulate_threshold_of_an_accumulated_residual() -> None:
    rng = np.random.default_rng(5)
    gradient, residual = rng.standard_normal((2, 100_003)).astype(np.float32)
    fused = residual.copy()
    key = ops.magnitude_key(2.5)
    expected = ops.accumulate_threshold(gradient, fused, 10, 90_000, key, key, 17, 64)
    accumulated = residual + gradient
    indices, histogram = ops.accumulate_threshold(None, accumulated, 10, 90_000, key, key, 17, 64)
    np.testing.assert_array_equal(indices, expected[0])
    np.testing.assert_array_equal(histogram, expected[1])
    assert accumulated.tobytes() == fused.tobytes()


@pytest.mark.parametrize("n", [1, 4_097, 1_000_003])
@pytest.mark.parametrize("divisor", [1.0, 2.0, 3.0, 0.3])
def test_add_divided_rounds_as_whole_array_operations(n: int, divisor: float) -> None:
    rng = np.random.default_rng(6)
    target, source = rng.standard_normal((2, n)).astype(np.float32)
    expected = target + source / np.float32(divisor)
    for make in (np.array, torch.tensor):
        result = make(target.copy())
        ops.add_divided(result, make(source), divisor)
        assert np.asarray(result).tobytes() == expected.tobytes()


@pytest.mark.parametrize("n", [3, 1_000_003])
@pytest.mark.parametrize("divisor", [1.0, 3.0])
def test_momentum_update_rounds_as_its_two_operations(n: int, divisor: float) -> None:
    """velocity = m * velocity + gradient / divisor, each operation rounded on its own (the
    reference is numpy's float32 product, quotient and sum, one whole array at a time)."""
    rng = np.random.default_rng(8)
    velocity, gradient = rng.standard_normal((2, n)).astype(np.float32)
    velocity[:3] = [1e-40, -3e38, 0.0]  # a subnormal, an overflow towards -inf, a zero
    gradient[:3] = [1e-40, -3e38, -0.0]
    m = np.float32(0.9)
    product = velocity * m
    expected = product + (gradient / np.float32(divisor) if divisor != 1.0 else gradient)
    for make in (np.array, torch.tensor):
        result = make(velocity.copy())
        ops.momentum_update(result, make(gradient), 0.9, divisor)
        assert np.asarray(result).tobytes() == expected.tobytes()


@pytest.mark.parametrize("dtype", [np.int32, np.int64])
@pytest.mark.parametrize("n_a,n_b", [(0, 0), (0, 5), (7, 0), (1_000, 3_000)])
def test_sorted_union_equals_union1d(dtype: type, n_a: int, n_b: int) -> None:
    rng = np.random.default_rng(7)
    a = np.unique(rng.integers(0, 5_000, n_a)).astype(dtype)
    b = np.unique(rng.integers(0, 5_000, n_b)).astype(dtype)
    union = ops.sorted_union(a, b)
    np.testing.assert_array_equal(union, np.union1d(a, b))
    assert union.dtype == dtype


def test_sorted_union_refuses_unsorted_input() -> None:
    with pytest.raises(ValueError):
        ops.sorted_union(np.array([3, 1], np.int32), np.array([2], np.int32))
