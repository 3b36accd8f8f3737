"""The kernels the sparse step adds: the clearing selection pass, the one-pass write-back and
merges into caller-owned buffers, against plain numpy."""

from __future__ import annotations

import numpy as np
import pytest
from helpers.reference import merge_reference, topk_reference

from gtopk_hvd import ops

RNG = np.random.default_rng(20261123)


@pytest.mark.parametrize("d", [1, 1000, 70_001, 1_000_003])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_accumulate_select_clears_the_gradient_in_its_pass(d: int, dtype: type) -> None:
    gradient = RNG.standard_normal(d).astype(dtype)
    residual = RNG.standard_normal(d).astype(dtype)
    accumulated = residual + gradient
    k = max(1, d // 100)
    kept_gradient = gradient.copy()
    indices, values = ops.accumulate_select(kept_gradient, residual.copy(), k)
    np.testing.assert_array_equal(kept_gradient, gradient)  # not cleared unless asked
    cleared_residual = residual.copy()
    got_indices, got_values = ops.accumulate_select(gradient, cleared_residual, k,
                                                    clear_gradient=True)
    assert not gradient.any(), "gradient not cleared"
    expected = topk_reference(accumulated, k)
    np.testing.assert_array_equal(got_indices, expected)
    np.testing.assert_array_equal(got_indices, indices)
    assert got_values.tobytes() == accumulated[expected].tobytes()
    accumulated[expected] = 0
    assert cleared_residual.tobytes() == accumulated.tobytes()


def test_accumulate_select_refuses_to_clear_what_it_cannot() -> None:
    x = np.ones(10, np.float32)
    with pytest.raises(ValueError, match="same array"):
        ops.accumulate_select(x, x, 2, clear_gradient=True)
    frozen = np.ones(10, np.float32)
    frozen.flags.writeable = False
    with pytest.raises(ValueError, match="writeable"):
        ops.accumulate_select(frozen, np.zeros(10, np.float32), 2, clear_gradient=True)


@pytest.mark.parametrize("d", [1, 5, 100_000, 3_000_017])
@pytest.mark.parametrize("index_dtype", [np.int32, np.int64])
def test_write_sparse_is_zero_then_scatter(d: int, index_dtype: type) -> None:
    dest = RNG.standard_normal(d).astype(np.float32)  # stale values must all go
    n = min(d, 1 + d // 50)
    indices = np.sort(RNG.choice(d, size=n, replace=False)).astype(index_dtype)
    values = RNG.standard_normal(n).astype(np.float32)
    ops.write_sparse(dest, indices, values)
    expected = np.zeros(d, np.float32)
    expected[indices] = values
    assert dest.tobytes() == expected.tobytes()


def test_write_sparse_takes_torch_tensors_and_checks_its_input() -> None:
    torch = pytest.importorskip("torch")
    dest = torch.ones(100)
    ops.write_sparse(dest, np.array([3, 97], np.int32), np.array([2.0, -1.0], np.float32))
    assert dest.sum().item() == 1.0 and dest[3].item() == 2.0
    with pytest.raises(ValueError, match="strictly increasing"):
        ops.write_sparse(dest, np.array([5, 3], np.int32), np.ones(2, np.float32))
    with pytest.raises(IndexError, match="out of range"):
        ops.write_sparse(dest, np.array([3, 100], np.int32), np.ones(2, np.float32))
    with pytest.raises(TypeError, match="dtype"):
        ops.write_sparse(dest, np.array([3], np.int32), np.ones(1, np.float64))


@pytest.mark.parametrize("k", [1, 700, 1500, 5000])
def test_merge_into_out_buffers(k: int) -> None:
    def make() -> tuple[np.ndarray, np.ndarray]:
        indices = np.sort(RNG.choice(3000, size=1000, replace=False)).astype(np.int32)
        return indices, RNG.integers(-3, 4, 1000).astype(np.float32)  # ties at every level

    (ia, va), (ib, vb) = make(), make()
    out = (np.full(5000, -1, np.int32), np.full(5000, np.nan, np.float32))
    indices, values = ops.merge_topk(ia, va, ib, vb, k, out=out)
    assert np.shares_memory(indices, out[0]) and np.shares_memory(values, out[1])
    expected_indices, expected_values = merge_reference(ia, va, ib, vb, k)
    np.testing.assert_array_equal(indices, expected_indices)
    assert values.tobytes() == expected_values.tobytes()


def test_merge_out_buffers_are_checked() -> None:
    a = (np.arange(10, dtype=np.int32), np.ones(10, np.float32))
    with pytest.raises(ValueError, match="fewer than"):
        ops.merge_topk(*a, *a, 10, out=(np.empty(5, np.int32), np.empty(5, np.float32)))
    with pytest.raises(TypeError, match="dtype"):
        ops.merge_topk(*a, *a, 10, out=(np.empty(10, np.int64), np.empty(10, np.float32)))


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_merge_result_does_not_depend_on_the_thread_count(threads: int) -> None:
    n = 400_000
    ia = np.sort(RNG.choice(2 * n, size=n, replace=False)).astype(np.int32)
    ib = np.sort(RNG.choice(2 * n, size=n, replace=False)).astype(np.int32)
    va = RNG.integers(-50, 50, n).astype(np.float32)
    vb = RNG.integers(-50, 50, n).astype(np.float32)
    before = ops.get_num_threads()
    try:
        ops.set_num_threads(1)
        expected = ops.merge_topk(ia, va, ib, vb, n)
        ops.set_num_threads(threads)
        got = ops.merge_topk(ia, va, ib, vb, n)
    finally:
        ops.set_num_threads(before)
    assert got[0].tobytes() == expected[0].tobytes() and got[1].tobytes() == expected[1].tobytes()


@pytest.mark.parametrize("bad", [-1, 1.5, True, "2"])
def test_set_num_threads_names_the_problem(bad: object) -> None:
    with pytest.raises(ValueError, match="number of threads"):
        ops.set_num_threads(bad)
