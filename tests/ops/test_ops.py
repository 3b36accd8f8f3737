"""gtopk_hvd.ops on the CPU against the numpy references in tests/helpers/reference.py."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from helpers.reference import magnitude_order, merge_reference, topk_reference
from hypothesis import given, settings
from hypothesis import strategies as st

from gtopk_hvd import ops

RNG = np.random.default_rng(20261122)


def make_input(kind: str, d: int, dtype: np.dtype) -> np.ndarray:
    if kind == "normal":
        x = RNG.standard_normal(d)
    elif kind == "heavy_tailed":
        x = RNG.standard_cauchy(d)
    elif kind == "all_equal":
        x = np.full(d, -0.75)
    elif kind == "all_zero":
        x = np.where(RNG.random(d) < 0.5, 0.0, -0.0)
    elif kind == "one_nonzero":
        x = np.zeros(d)
        if d:
            x[d // 3] = -2.0
    elif kind == "few_levels":  # many ties at every level, the k-th included
        x = RNG.integers(-3, 4, d).astype(np.float64)
    elif kind == "nan_inf":
        x = RNG.standard_normal(d)
        x[RNG.random(d) < 0.01] = np.nan
        x[RNG.random(d) < 0.01] = np.inf
        x[RNG.random(d) < 0.01] = -np.inf
    elif kind == "plateau":  # a huge tie just below a few large values: defeats the sample guess
        x = np.ones(d)
        x[RNG.choice(d, size=min(d, max(1, d // 10_000)), replace=False)] = 5.0
    else:
        raise AssertionError(kind)
    return x.astype(dtype)


KINDS = ["normal", "heavy_tailed", "all_equal", "all_zero", "one_nonzero", "few_levels",
         "nan_inf", "plateau"]
SIZES = [0, 1, 2, 7, 1000, 65_535, 65_536, 65_537, 300_007, 2_000_003]


def assert_selection(x: np.ndarray, k: int, indices: np.ndarray, values: np.ndarray,
                     order: np.ndarray | None = None) -> None:
    """indices/values are the top-k of x; order: magnitude_order(x) if already computed."""
    expected = topk_reference(x, k) if order is None else np.sort(order[: min(k, x.size)])
    assert indices.dtype == np.int32
    np.testing.assert_array_equal(indices, expected)
    assert values.dtype == x.dtype
    np.testing.assert_array_equal(values.view(np.uint8), x[expected].view(np.uint8))


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("d", SIZES)
def test_topk_abs_float32_matches_full_sort(kind: str, d: int) -> None:
    x = make_input(kind, d, np.float32)
    order = magnitude_order(x)
    for k in sorted({0, 1, 3, d // 1000, d // 100, d // 10, d // 2, d - 1, d, d + 5}):
        if k < 0:
            continue
        indices, values = ops.topk_abs(x, k)
        assert_selection(x, k, indices, values, order)


@pytest.mark.parametrize("dtype", [np.float64, np.float16, ml_dtypes.bfloat16])
@pytest.mark.parametrize("kind", ["normal", "few_levels", "nan_inf", "plateau"])
@pytest.mark.parametrize("d", [5, 65_537, 1_000_003])
def test_topk_abs_other_dtypes(dtype: np.dtype, kind: str, d: int) -> None:
    x = make_input(kind, d, np.dtype(dtype))
    order = magnitude_order(x)
    for k in {1, d // 1000, d // 7, d}:
        indices, values = ops.topk_abs(x, k)
        assert_selection(x, k, indices, values, order)


@pytest.mark.parametrize("hint", [None, 0.0, 1.5, 3.0, 1e30, float("nan"), -2.0])
@pytest.mark.parametrize("kind", ["normal", "plateau", "few_levels"])
def test_a_wrong_threshold_hint_changes_nothing(hint: float | None, kind: str) -> None:
    x = make_input(kind, 1_000_000, np.float32)
    order = magnitude_order(x)
    for k in (10, 1000, 20_000):
        indices, values = ops.topk_abs(x, k, threshold_hint=hint)
        assert_selection(x, k, indices, values, order)


def test_hint_from_previous_step_selects_exactly() -> None:
    x = make_input("normal", 1_000_000, np.float32)
    _, previous = ops.topk_abs(x, 1000)
    hint = 0.8 * float(np.abs(previous).min())
    y = x + 0.01 * RNG.standard_normal(x.size).astype(np.float32)
    indices, values = ops.topk_abs(y, 1000, threshold_hint=hint)
    assert_selection(y, 1000, indices, values)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("d,k", [(0, 3), (10, 0), (10, 10), (1000, 17), (400_000, 400),
                                 (1_000_000, 100_000)])
def test_accumulate_select_is_add_select_zero(dtype: np.dtype, d: int, k: int) -> None:
    gradient = RNG.standard_normal(d).astype(dtype)
    residual = RNG.standard_normal(d).astype(dtype)
    accumulated = residual + gradient
    indices, values = ops.accumulate_select(gradient, residual, k)
    expected = topk_reference(accumulated, k)
    np.testing.assert_array_equal(indices, expected)
    np.testing.assert_array_equal(values, accumulated[expected])
    remaining = accumulated.copy()
    remaining[expected] = 0
    np.testing.assert_array_equal(residual, remaining)


def random_set(n: int, d: int, dtype: np.dtype, index_dtype: np.dtype) -> tuple:
    index = np.sort(RNG.choice(d, size=n, replace=False)).astype(index_dtype)
    return index, RNG.standard_normal(n).astype(dtype)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("index_dtype", [np.int32, np.int64])
@pytest.mark.parametrize("n_a,n_b,d,k", [(0, 0, 10, 5), (5, 0, 10, 5), (0, 5, 10, 3),
                                         (100, 100, 150, 100), (100, 100, 10**6, 100),
                                         (1000, 700, 3000, 1000), (50_000, 50_000, 120_000, 50_000),
                                         (10, 10, 20, 100)])
def test_merge_topk_matches_reference(dtype: np.dtype, index_dtype: np.dtype, n_a: int, n_b: int,
                                      d: int, k: int) -> None:
    ia, va = random_set(n_a, d, dtype, index_dtype)
    ib, vb = random_set(n_b, d, dtype, index_dtype)
    indices, values = ops.merge_topk(ia, va, ib, vb, k)
    expected_index, expected_value = merge_reference(ia, va, ib, vb, k)
    np.testing.assert_array_equal(indices, expected_index)
    np.testing.assert_array_equal(values, expected_value)
    assert indices.dtype == index_dtype and values.dtype == dtype
    swapped_index, swapped_value = ops.merge_topk(ib, vb, ia, va, k)
    np.testing.assert_array_equal(swapped_index, indices)
    np.testing.assert_array_equal(swapped_value.view(np.uint8), values.view(np.uint8))


# merge_topk guesses the k-th key's band from every s-th entry of the union (s a power of two, even
# at this size; merge_topk.cpp, step 3). Here a's entries are small and b's large, interleaved by
# index, so every sampled entry is one of a's: the guessed band misses, and the exact fallback
# (a histogram of the union) must give the same result.
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("threads", [1, 2])
def test_merge_whose_sample_misses_the_kth_key_is_exact(dtype: np.dtype, threads: int) -> None:
    n = 20_000
    ia = np.arange(0, 2 * n, 2, dtype=np.int32)
    ib = ia + 1
    va = (1e-3 * RNG.standard_normal(n)).astype(dtype)
    vb = (1 + RNG.random(n)).astype(dtype)
    previous = ops.get_num_threads()
    ops.set_num_threads(threads)
    try:
        for k in (1, 100, n // 2, n, 5 * n // 4, 2 * n - 1):
            indices, values = ops.merge_topk(ia, va, ib, vb, k)
            expected_index, expected_value = merge_reference(ia, va, ib, vb, k)
            np.testing.assert_array_equal(indices, expected_index)
            np.testing.assert_array_equal(values, expected_value)
    finally:
        ops.set_num_threads(previous)


def test_merge_with_identical_indices_and_cancellation() -> None:
    index = np.arange(0, 20, 2, dtype=np.int32)
    value = np.linspace(-1, 1, 10, dtype=np.float32)
    indices, values = ops.merge_topk(index, value, index, -value, 4)
    np.testing.assert_array_equal(indices, index[:4])  # all sums are 0: smaller index wins
    np.testing.assert_array_equal(values, np.zeros(4, np.float32))


def test_merge_is_bitwise_symmetric_with_nans() -> None:
    index = np.arange(8, dtype=np.int32)
    a = np.array([np.nan, 1, 2, np.nan, 0, 0, 0, 0], np.float32)
    b = np.array([1, np.nan, 3, -np.nan, 0, 0, 0, 0], np.float32)
    b[3] = np.frombuffer(np.uint32(0xFFC00123).tobytes(), np.float32)[0]  # NaN with a payload
    for k in (3, 5):
        ab = ops.merge_topk(index, a, index, b, k)
        ba = ops.merge_topk(index, b, index, a, k)
        np.testing.assert_array_equal(ab[0], ba[0])
        np.testing.assert_array_equal(ab[1].view(np.uint32), ba[1].view(np.uint32))
    nan_first = ops.merge_topk(index, a, index, b, 3)[0]
    np.testing.assert_array_equal(nan_first, [0, 1, 3])  # the three NaN sums outrank 2 + 3


def test_restore_residual_and_survivors() -> None:
    residual = np.zeros(10, np.float32)
    local_index = np.array([1, 4, 6, 9], np.int32)
    local_value = np.array([1.0, -2.0, 3.0, 4.0], np.float32)
    survived = ops.mark_survivors(local_index, np.array([0, 4, 9], np.int32))
    np.testing.assert_array_equal(survived, [False, True, False, True])
    ops.restore_residual(residual, local_index, local_value, ~survived)
    expected = np.zeros(10, np.float32)
    expected[[1, 6]] = [1.0, 3.0]
    np.testing.assert_array_equal(residual, expected)


def test_torch_tensors_in_and_out_without_copies() -> None:
    torch = pytest.importorskip("torch")
    x = torch.randn(200_000)
    indices, values = ops.topk_abs(x, 50)
    assert isinstance(indices, torch.Tensor) and indices.dtype == torch.int32
    np.testing.assert_array_equal(indices.numpy(), topk_reference(x.numpy(), 50))
    gradient = torch.randn(3, 1000)
    residual = torch.zeros(3, 1000)
    indices, values = ops.accumulate_select(gradient, residual, 30)
    assert float(residual.abs().sum()) > 0  # updated in place, through the 2-D tensor
    assert torch.equal(residual.reshape(-1)[indices.long()], torch.zeros(30))
    bf16 = torch.randn(100_000).to(torch.bfloat16)
    indices, values = ops.topk_abs(bf16, 100)
    assert values.dtype == torch.bfloat16
    np.testing.assert_array_equal(indices.numpy(), topk_reference(bf16.float().numpy(), 100))


def test_tensorflow_tensors_in_and_out() -> None:
    tf = pytest.importorskip("tensorflow")
    x = tf.random.normal([100_000], seed=1)
    indices, values = ops.topk_abs(x, 40)
    assert isinstance(indices, tf.Tensor) and indices.dtype == tf.int32
    np.testing.assert_array_equal(indices.numpy(), topk_reference(x.numpy(), 40))
    with pytest.raises(TypeError, match="immutable"):
        ops.accumulate_select(x, x, 3)


@pytest.mark.parametrize("call,error,message", [
    (lambda: ops.topk_abs(np.arange(10.0, dtype=np.float32)[::2], 2), ValueError, "contiguous"),
    (lambda: ops.topk_abs(np.arange(10, dtype=np.int32), 2), TypeError, "int32"),
    (lambda: ops.topk_abs(np.ones(10, np.float32), -1), ValueError, "k must be >= 0"),
    (lambda: ops.topk_abs(np.ones(10, np.float32), 2.5), TypeError, "integer"),
    (lambda: ops.topk_abs([1.0, 2.0], 1), TypeError, "numpy array"),
    (lambda: ops.merge_topk(np.array([2, 1], np.int32), np.ones(2, np.float32),
                            np.array([0], np.int32), np.ones(1, np.float32), 2),
     ValueError, "strictly increasing"),
    (lambda: ops.merge_topk(np.array([1, 2], np.int32), np.ones(3, np.float32),
                            np.array([0], np.int32), np.ones(1, np.float32), 2),
     ValueError, "differ in length"),
    (lambda: ops.merge_topk(np.array([1], np.int32), np.ones(1, np.float32),
                            np.array([0], np.int64), np.ones(1, np.float32), 2),
     TypeError, "same index dtype"),
    (lambda: ops.merge_topk(np.array([1], np.int32), np.ones(1, np.float16),
                            np.array([0], np.int32), np.ones(1, np.float16), 2),
     TypeError, "float32 or float64"),
    (lambda: ops.accumulate_select(np.ones(4, np.float32), np.ones(5, np.float32), 2),
     ValueError, "same length"),
    (lambda: ops.restore_residual(np.zeros(4, np.float32), np.array([7], np.int32),
                                  np.ones(1, np.float32), np.ones(1, bool)),
     IndexError, "out of range"),
])
def test_bad_input_is_a_clear_error(call, error: type, message: str) -> None:
    with pytest.raises(error, match=message):
        call()


@pytest.mark.parametrize("index_dtype", [np.int32, np.int64])
@pytest.mark.parametrize("n,break_at,kind", [
    (2, 1, "equal"), (4097, 4096, "below"), (4098, 4097, "equal"), (100_000, 50_001, "below"),
    (300_000, 299_999, "equal"), (300_000, 4096, "below")])
def test_the_order_check_names_the_first_position_that_breaks_it(
        index_dtype: np.dtype, n: int, break_at: int, kind: str) -> None:
    """The check is one multi-threaded read in blocks of 4096: a break on a block's first or last
    position, on a thread's boundary or the array's end is found, and the one named is numpy's
    first j with index[j] <= index[j - 1] (two breaks: the earlier one)."""
    index = np.arange(0, 3 * n, 3, dtype=index_dtype)
    values = np.ones(n, np.float32)
    for at in (break_at, min(n - 1, break_at + 5000)):
        index[at] = index[at - 1] - (1 if kind == "below" else 0)
    expected = int(np.flatnonzero(np.diff(index) <= 0)[0]) + 1
    assert expected == break_at
    with pytest.raises(ValueError, match=f"set b must be strictly increasing .* position "
                                         f"{expected} breaks it"):
        ops.merge_topk(index[:1].copy(), values[:1].copy(), index, values, 10)
    index = np.unique(index)  # mended: the same check passes it
    merged, _ = ops.merge_topk(index[:1].copy(), values[:1].copy(), index,
                               np.ones(index.size, np.float32), 10)
    assert merged.size == min(10, index.size)


finite_or_special = st.one_of(
    st.floats(width=32, allow_nan=True, allow_infinity=True),
    st.sampled_from([0.0, -0.0, 1.0, -1.0]),
)


@settings(max_examples=200, deadline=None)
@given(st.lists(finite_or_special, max_size=300), st.integers(0, 320))
def test_property_topk_equals_full_sort(values: list[float], k: int) -> None:
    x = np.array(values, dtype=np.float32)
    indices, selected = ops.topk_abs(x, k)
    assert_selection(x, k, indices, selected)
    order = magnitude_order(x)
    assert set(indices.tolist()) == set(order[: min(k, x.size)].tolist())


@settings(max_examples=200, deadline=None)
@given(st.sets(st.integers(0, 200), max_size=60), st.sets(st.integers(0, 200), max_size=60),
       st.integers(0, 130), st.integers(0, 2**32 - 1))
def test_property_merge(set_a: set[int], set_b: set[int], k: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    ia, ib = np.array(sorted(set_a), np.int32), np.array(sorted(set_b), np.int32)
    va = rng.integers(-3, 4, ia.size).astype(np.float32)  # small integers: many exact ties
    vb = rng.integers(-3, 4, ib.size).astype(np.float32)
    indices, values = ops.merge_topk(ia, va, ib, vb, k)
    expected_index, expected_value = merge_reference(ia, va, ib, vb, k)
    np.testing.assert_array_equal(indices, expected_index)
    np.testing.assert_array_equal(values, expected_value)
