"""Sketched SGD's count sketch kernels (ops.sketch_table, sketch_select, sketch_estimate) against
the independent numpy reference (helpers/sketch_reference.py), bit for bit: the table's exact
integer sums rounded once, the median of odd and even rows, NaN and Inf, thread counts, numpy
and torch CPU alike; the CUDA kernels against the CPU ones (skipped without a GPU)."""

from __future__ import annotations

import numpy as np
import pytest
from helpers.reference import topk_reference
from helpers.sketch_reference import estimate_reference, table_reference

from gtopk_hvd import ops

RNG = np.random.default_rng(38)


def sketch_keys(rows: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng([seed, 0x5EED]).integers(0, 2**32, (rows, 2),
                                                          dtype=np.uint64).astype(np.uint32)


def vector(kind: str, d: int) -> np.ndarray:
    if kind == "normal":
        x = RNG.standard_normal(d)
    elif kind == "heavy_tailed":
        x = RNG.standard_cauchy(d) * 1e3
    elif kind == "tiny":
        x = RNG.standard_normal(d) * 1e-42  # subnormal float32
    elif kind == "zeros":
        x = np.where(RNG.random(d) < 0.5, 0.0, -0.0)
    elif kind == "huge":
        x = RNG.standard_normal(d) * 1e36
    elif kind == "mixed_scales":
        x = RNG.standard_normal(d) * 10.0 ** RNG.integers(-30, 30, d)
    else:
        raise ValueError(kind)
    return x.astype(np.float32)


def table_of(acc: np.ndarray, keys: np.ndarray, columns: int) -> np.ndarray:
    """The kernel's table of acc (accumulated into a zero residual)."""
    residual = np.zeros_like(acc)
    return ops.sketch_table(acc.copy(), residual, keys, columns)


def assert_bits(got: np.ndarray, want: np.ndarray) -> None:
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))


@pytest.mark.parametrize("kind", ["normal", "heavy_tailed", "tiny", "zeros", "huge",
                                  "mixed_scales"])
@pytest.mark.parametrize("d,rows,columns", [(1, 1, 1), (7, 2, 3), (1000, 5, 37),
                                            (65_537, 4, 1000), (300_007, 3, 2999)])
def test_table_equals_the_reference_bit_for_bit(kind: str, d: int, rows: int,
                                                columns: int) -> None:
    acc = vector(kind, d)
    keys = sketch_keys(rows, d)
    assert_bits(table_of(acc, keys, columns), table_reference(acc, keys, columns))


@pytest.mark.parametrize("clear", [False, True])
def test_table_accumulates_the_gradient_in_the_same_call(clear: bool) -> None:
    d, keys = 100_003, sketch_keys(5)
    gradient, residual = vector("normal", d), vector("normal", d)
    expected = residual + gradient
    original = gradient.copy()
    table = ops.sketch_table(gradient, residual, keys, 500, clear_gradient=clear)
    assert_bits(residual, expected)
    assert_bits(gradient, np.zeros(d, np.float32) if clear else original)
    assert_bits(table, table_reference(expected, keys, 500))


@pytest.mark.parametrize("threads", [1, 2, 3, 5])
@pytest.mark.parametrize("columns", [300, 40_000], ids=["per-thread-tables", "atomic-adds"])
def test_table_does_not_depend_on_the_threads(threads: int, columns: int) -> None:
    d, keys = 200_001, sketch_keys(5, 1)
    acc = vector("mixed_scales", d)
    before = ops.get_num_threads()
    try:
        ops.set_num_threads(threads)
        got = table_of(acc, keys, columns)
    finally:
        ops.set_num_threads(before)
    assert_bits(got, table_reference(acc, keys, columns))


def test_table_of_nonfinite_entries() -> None:
    d, rows, columns = 5000, 3, 50
    keys = sketch_keys(rows, 2)
    acc = vector("normal", d)
    acc[[10, 20]] = np.inf
    acc[30] = -np.inf
    acc[40] = np.nan
    table = table_of(acc, keys, columns)
    want = table_reference(acc, keys, columns)
    assert_bits(table, want)
    assert np.isnan(want).sum() >= rows and np.isinf(want).any()
    finite = acc.copy()
    finite[[10, 20, 30, 40]] = 0  # the other buckets: as if the non-finite entries were absent
    clean = table_reference(finite, keys, columns)
    assert_bits(table[np.isfinite(want)], clean[np.isfinite(want)])


@pytest.mark.parametrize("kind", ["normal", "heavy_tailed", "huge"])
def test_table_of_the_residual_as_it_is(kind: str) -> None:
    """gradient None: the sketch of the residual already accumulated (a predivided step's),
    the bits of accumulating it into zeros; the residual is read, not changed."""
    d, keys, columns = 100_003, sketch_keys(5, 11), 900
    residual = vector(kind, d)
    residual[[3, 77]] = [np.inf, np.nan]
    kept = residual.copy()
    residual.flags.writeable = False  # read, not written
    table = ops.sketch_table(None, residual, keys, columns, clear_gradient=True)
    assert_bits(residual, kept)
    assert_bits(table, table_of(kept, keys, columns))


def random_table(rows: int, columns: int) -> np.ndarray:
    """Ties, signed zeros, infinities and a NaN among normal values."""
    table = RNG.integers(-3, 4, (rows, columns)).astype(np.float32)
    table[:, ::7] = -0.0
    table.flat[5] = np.inf
    table.flat[11] = -np.inf
    table.flat[-1] = np.nan
    return table


@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 6, 9, 64])
@pytest.mark.parametrize("d", [1, 100, 70_001])
def test_estimate_is_the_median_of_rows_bit_for_bit(rows: int, d: int) -> None:
    columns = 97
    table, keys = random_table(rows, columns), sketch_keys(rows, rows)
    estimate = np.full(d, 123.0, np.float32)
    assert ops.sketch_estimate(table, keys, estimate) is estimate
    want = estimate_reference(table, keys, d)
    assert_bits(estimate, want)
    assert not np.signbit(estimate[estimate == 0]).any()


@pytest.mark.parametrize("rows", [3, 4])
@pytest.mark.parametrize("d", [10, 65_536, 300_007])
def test_select_is_the_top_k_of_the_estimates(rows: int, d: int) -> None:
    columns = max(1, d // 50)
    keys = sketch_keys(rows, d)
    acc = vector("heavy_tailed", d)
    table = table_of(acc, keys, columns)
    want = estimate_reference(table, keys, d)
    for k in sorted({0, 1, 3, d // 100, d // 17, d // 3, d, d + 1}):
        estimate = np.empty(d, np.float32)
        indices, values = ops.sketch_select(table, keys, k, estimate)
        assert_bits(estimate, want)
        expected = topk_reference(want, k)
        assert indices.dtype == np.int32
        np.testing.assert_array_equal(indices, expected)
        assert_bits(values, want[expected])


def test_a_nan_is_estimated_nan_and_selected_first() -> None:
    d, rows, columns, k = 20_000, 5, 400, 600
    keys = sketch_keys(rows, 3)
    acc = vector("normal", d)
    acc[1234] = np.nan
    estimate = np.empty(d, np.float32)
    indices, values = ops.sketch_select(table_of(acc, keys, columns), keys, k, estimate)
    nan = np.flatnonzero(np.isnan(estimate))
    assert 1234 in nan and nan.size <= k
    assert set(nan) <= set(indices.tolist())
    assert np.isnan(values).sum() == nan.size


def test_torch_cpu_tensors_give_the_numpy_bits() -> None:
    torch = pytest.importorskip("torch")
    d, keys, columns = 50_001, sketch_keys(5, 4), 700
    gradient, residual = vector("normal", d), vector("normal", d)
    table = ops.sketch_table(gradient.copy(), residual.copy(), keys, columns)
    torch_residual = torch.from_numpy(residual.copy())
    torch_table = ops.sketch_table(torch.from_numpy(gradient.copy()), torch_residual, keys,
                                   columns)
    assert isinstance(torch_table, torch.Tensor)
    assert_bits(torch_table.numpy(), table)
    estimate, torch_estimate = np.empty(d, np.float32), torch.empty(d)
    indices, values = ops.sketch_select(table, keys, 50, estimate)
    torch_indices, torch_values = ops.sketch_select(torch_table, keys, 50, torch_estimate)
    np.testing.assert_array_equal(torch_indices.numpy(), indices)
    assert_bits(torch_values.numpy(), values)
    assert_bits(torch_estimate.numpy(), estimate)


def test_bad_arguments_are_refused() -> None:
    d = 100
    gradient, residual, estimate = (np.zeros(d, np.float32) for _ in range(3))
    keys = sketch_keys(3)
    table = np.zeros((3, 10), np.float32)
    with pytest.raises(TypeError, match="uint32"):
        ops.sketch_table(gradient, residual, keys.astype(np.int64), 10)
    with pytest.raises(TypeError, match="shape"):
        ops.sketch_table(gradient, residual, np.zeros((3, 3), np.uint32), 10)
    with pytest.raises(ValueError, match="1 to 64 rows"):
        ops.sketch_table(gradient, residual, np.zeros((0, 2), np.uint32), 10)
    with pytest.raises(ValueError, match="1 to 64 rows"):
        ops.sketch_table(gradient, residual, sketch_keys(65), 10)
    with pytest.raises(ValueError, match=r"columns >= 1 and < 2\^32"):
        ops.sketch_table(gradient, residual, keys, 0)
    with pytest.raises(ValueError, match=r"columns >= 1 and < 2\^32"):
        ops.sketch_table(gradient, residual, keys, 2**32)
    with pytest.raises(TypeError, match="float32"):
        ops.sketch_table(gradient.astype(np.float64), residual.astype(np.float64), keys, 10)
    with pytest.raises(ValueError, match="same length"):
        ops.sketch_table(gradient[:50], residual, keys, 10)
    with pytest.raises(ValueError, match="rows x columns"):
        ops.sketch_select(np.zeros((3, 9), np.float32), sketch_keys(2), 5, estimate)
    with pytest.raises(ValueError, match="shape"):
        ops.sketch_select(table.reshape(-1), keys, 5, estimate)
    with pytest.raises(TypeError, match="float32"):
        ops.sketch_select(table, keys, 5, estimate.astype(np.float64))
    with pytest.raises(ValueError, match="writeable"):
        frozen = estimate.copy()
        frozen.flags.writeable = False
        ops.sketch_select(table, keys, 5, frozen)
    with pytest.raises(ValueError, match="k must be >= 0"):
        ops.sketch_select(table, keys, -1, estimate)


# -- CUDA ---------------------------------------------------------------------------------------

def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available() and ops.cuda_built


cuda = pytest.mark.skipif(not _cuda_available(),
                          reason="needs a CUDA GPU and an extension built with nvcc")


@cuda
@pytest.mark.parametrize("clear", [False, True])
@pytest.mark.parametrize("kind", ["normal", "heavy_tailed", "tiny", "mixed_scales"])
@pytest.mark.parametrize("d,rows,columns", [(1, 1, 1), (1000, 4, 37), (1_000_003, 5, 20_011)])
def test_cuda_table_and_estimates_equal_the_cpu_bits(kind: str, d: int, rows: int,
                                                     columns: int, clear: bool) -> None:
    import torch

    keys = sketch_keys(rows, d)
    gradient, residual = vector(kind, d), vector("normal", d)
    cpu_gradient, cpu_residual = gradient.copy(), residual.copy()
    cpu_table = ops.sketch_table(cpu_gradient, cpu_residual, keys, columns, clear)
    gpu_gradient = torch.from_numpy(gradient).cuda()
    gpu_residual = torch.from_numpy(residual).cuda()
    gpu_table = ops.sketch_table(gpu_gradient, gpu_residual, keys, columns, clear)
    assert gpu_table.is_cuda
    assert_bits(gpu_table.cpu().numpy(), cpu_table)
    assert_bits(gpu_residual.cpu().numpy(), cpu_residual)
    assert_bits(gpu_gradient.cpu().numpy(), cpu_gradient)
    for k in sorted({0, 1, d // 100, d // 3, d}):
        cpu_estimate = np.empty(d, np.float32)
        indices, values = ops.sketch_select(cpu_table, keys, k, cpu_estimate)
        gpu_estimate = torch.empty(d, device="cuda")
        gpu_indices, gpu_values = ops.sketch_select(gpu_table, keys, k, gpu_estimate)
        assert_bits(gpu_estimate.cpu().numpy(), cpu_estimate)
        np.testing.assert_array_equal(gpu_indices.cpu().numpy(), indices)
        assert_bits(gpu_values.cpu().numpy(), values)


@cuda
def test_cuda_nonfinite_entries_and_even_rows() -> None:
    import torch

    d, rows, columns = 100_000, 4, 1000
    keys = sketch_keys(rows, 5)
    acc = vector("normal", d)
    acc[[3, 4]] = np.inf
    acc[5] = -np.inf
    acc[6] = np.nan
    gpu_table = ops.sketch_table(torch.zeros(d, device="cuda"), torch.from_numpy(acc).cuda(),
                                 keys, columns)
    want = table_reference(acc, keys, columns)
    assert_bits(gpu_table.cpu().numpy(), want)
    estimate = ops.sketch_estimate(gpu_table, keys, torch.empty(d, device="cuda"))
    assert_bits(estimate.cpu().numpy(), estimate_reference(want, keys, d))


@cuda
def test_cuda_bad_arguments_are_refused() -> None:
    import torch

    d = 100
    with pytest.raises(ValueError, match="1 to 64 rows"):
        ops.sketch_table(torch.zeros(d, device="cuda"), torch.zeros(d, device="cuda"),
                         sketch_keys(65), 10)
    with pytest.raises(TypeError, match="float32"):
        ops.sketch_table(torch.zeros(d, device="cuda", dtype=torch.float64),
                         torch.zeros(d, device="cuda", dtype=torch.float64), sketch_keys(3), 10)
    with pytest.raises(ValueError, match="rows x columns"):
        ops.sketch_estimate(torch.zeros((3, 9), device="cuda"), sketch_keys(2),
                            torch.empty(d, device="cuda"))


# -- the selection without an estimate buffer, and the CUDA kernels' tiles and fused selection ----

def test_select_without_a_buffer_is_the_select_with_one() -> None:
    d, rows, columns = 70_001, 5, 700
    keys = sketch_keys(rows, 6)
    table = table_of(vector("heavy_tailed", d), keys, columns)
    for k in (0, 1, 700, d):
        want = ops.sketch_select(table, keys, k, np.empty(d, np.float32))
        got = ops.sketch_select(table, keys, k, d=d)
        np.testing.assert_array_equal(got[0], want[0])
        assert_bits(got[1], want[1])
    with pytest.raises(ValueError, match="d = 5 but the estimate buffer holds"):
        ops.sketch_select(table, keys, 3, np.empty(d, np.float32), d=5)
    with pytest.raises(ValueError, match="needs d >= 0 or an estimate buffer"):
        ops.sketch_select(table, keys, 3)


def reference_select(table: np.ndarray, keys: np.ndarray, k: int, d: int) -> tuple:
    want = estimate_reference(table, keys, d)
    expected = topk_reference(want, k)
    return expected, want[expected]


@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 6, 8])
@pytest.mark.parametrize("kind", ["normal", "heavy_tailed", "mixed_scales", "zeros"])
def test_select_without_a_buffer_is_the_reference_top_k(rows: int, kind: str) -> None:
    """The buffer-free selection (a sampled threshold, a bit per row and cell, est only where
    half the rows' bits are set) keeps exactly the reference's top-k of all d estimates, for
    odd and even rows (the median of even rows is the mean of the middle two), at densities
    where the threshold is guessed (k <= d / 16) and where it is not."""
    d = 200_003
    keys = sketch_keys(rows, 40 + rows)
    table = table_of(vector(kind, d), keys, 2_000)
    for k in (1, 200, 2_000, d // 16, d // 5):
        indices, values = ops.sketch_select(table, keys, k, d=d)
        want_indices, want_values = reference_select(table, keys, k, d)
        np.testing.assert_array_equal(indices, want_indices)
        assert_bits(values, want_values)


@pytest.mark.parametrize("case", ["inf", "nan", "huge", "ties"])
def test_select_without_a_buffer_where_the_bitmaps_cannot_stand_in(case: str) -> None:
    """Tables the bitmap filter does not take (a non-finite cell: NaN estimates; cells at or
    above 2^126, where (lo + hi) * 0.5 could overflow) and a threshold guess that keeps too
    many (every estimate equal): the estimates into a temporary buffer, the same top-k."""
    d, rows, columns = 150_001, 4, 1_500
    keys = sketch_keys(rows, 9)
    table = table_of(vector("normal", d), keys, columns).reshape(rows, columns)
    if case == "inf":
        table[1, 17] = np.inf
        table[2, 40] = -np.inf
    elif case == "nan":
        table[0, 3] = np.nan
    elif case == "huge":
        table[3, 5] = 2.0**127
        table[2, 6] = 2.0**126
    else:
        table[:] = 1.0
    for k in (1, 150, 1_500):
        indices, values = ops.sketch_select(table, keys, k, d=d)
        want_indices, want_values = reference_select(table, keys, k, d)
        np.testing.assert_array_equal(indices, want_indices)
        assert_bits(values, want_values)


def test_the_scheme_keeps_nothing_of_d_entries_but_its_residual() -> None:
    """What a sketch step keeps between steps, in units of the gradient's bytes: the residual
    (1x) and the table (rows x 10 k), not the CPU's estimate buffer of the previous kernels
    (another 1x)."""
    import tracemalloc

    from gtopk_hvd.compression import Compression
    from gtopk_hvd.core import SparseStep
    from gtopk_hvd.transports.local import LocalGroup

    d = 400_000
    gradient = vector("normal", d)
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        step = SparseStep(Compression.sketch(0.001), [d], LocalGroup(1).transports[0])
        for _ in range(2):
            step.update(gradient.copy())
        kept = (tracemalloc.get_traced_memory()[0] - before) / gradient.nbytes
    finally:
        tracemalloc.stop()
    assert 1.0 <= kept < 1.2, kept


def cuda_select(table: np.ndarray, keys: np.ndarray, k: int, d: int,
                row_filter: bool = False) -> tuple:
    """The CUDA selection with no estimate buffer (estimates computed inside it), on the host;
    row_filter: with the kernel's row bitmaps (the workspace sized for them)."""
    import torch

    gpu_table = torch.from_numpy(table).cuda()
    if row_filter:
        indices, values = ops.sketch._cuda_sketch_select(gpu_table, keys, table.shape[1], k, d,
                                                         None, row_filter=True)
    else:
        indices, values = ops.sketch_select(gpu_table, keys, k, d=d)
    assert indices.is_cuda and values.is_cuda
    return indices.cpu().numpy(), values.cpu().numpy()


@cuda
@pytest.mark.parametrize("tile_columns", [1, 7, 1000, 2999, 10**6, 0])
def test_cuda_tiles_do_not_change_the_table(tile_columns: int) -> None:
    """The table built tile by tile (a tile: a range of columns of one row, its own read of d)
    equals the CPU's bits, non-finite buckets included (their flags live in the table's
    memory until the tile's values replace them)."""
    import torch

    d, rows, columns = 300_007, 3, 2999
    keys = sketch_keys(rows, 7)
    acc = vector("mixed_scales", d)
    acc[[3, 4, 77_777]] = np.inf
    acc[5] = -np.inf
    acc[[6, 250_000]] = np.nan
    want = table_of(acc, keys, columns)
    assert_bits(want, table_reference(acc, keys, columns))
    gpu = ops.sketch_table(torch.zeros(d, device="cuda"), torch.from_numpy(acc).cuda(), keys,
                           columns, tile_columns=tile_columns)
    assert_bits(gpu.cpu().numpy(), want)


@cuda
def test_cuda_select_in_a_workspace_without_the_bitmaps() -> None:
    """A workspace sized without the row bitmaps (no rows given: what ops.sketch_select sizes)
    runs the selection unfiltered: the same indices and values as with room for them."""
    import torch

    from gtopk_hvd import _C

    d, rows, columns, k = 1_000_003, 5, 5_003, 1_000
    keys = sketch_keys(rows, 13)
    table = table_of(vector("normal", d), keys, columns)
    want_indices, want_values = cuda_select(table, keys, k, d, row_filter=True)
    small = _C.cuda_sketch_select_workspace_bytes(_C.IndexType.int32, d, k)
    assert small < _C.cuda_sketch_select_workspace_bytes(_C.IndexType.int32, d, k, rows,
                                                         columns)
    gpu_table = torch.from_numpy(table).cuda()
    indices = torch.empty(k, dtype=torch.int32, device="cuda")
    values = torch.empty(k, dtype=torch.float32, device="cuda")
    workspace = torch.empty(small, dtype=torch.uint8, device="cuda")
    _C.cuda_sketch_select(gpu_table.data_ptr(), keys.ctypes.data, rows, columns, d, k,
                          _C.IndexType.int32, indices.data_ptr(), values.data_ptr(),
                          torch.cuda.current_stream().cuda_stream, workspace.data_ptr(),
                          workspace.numel())
    np.testing.assert_array_equal(indices.cpu().numpy(), want_indices)
    assert_bits(values.cpu().numpy(), want_values)


@cuda
def test_cuda_table_of_the_residual_as_it_is() -> None:
    """gradient None on the GPU: the residual read, not changed, and the CPU's table bits."""
    import torch

    d, keys, columns = 300_007, sketch_keys(5, 12), 2999
    acc = vector("mixed_scales", d)
    acc[[3, 9]] = [np.inf, np.nan]
    residual = torch.from_numpy(acc).cuda()
    gpu = ops.sketch_table(None, residual, keys, columns, clear_gradient=True)
    assert_bits(residual.cpu().numpy(), acc)
    assert_bits(gpu.cpu().numpy(), table_of(acc, keys, columns))


@cuda
@pytest.mark.parametrize("clear", [False, True])
def test_cuda_table_reads_the_skip_flag_on_the_device(clear: bool) -> None:
    """A set flag: the table of the residual as it is, the residual left so and the gradient
    cleared if asked, the CPU's bits; a clear flag: the call without one. Behind a busy stream
    the call returns without waiting for it (the kernel reads the flag)."""
    import torch

    d, keys, columns = 300_007, sketch_keys(5, 13), 2999
    gradient, residual = vector("normal", d), vector("mixed_scales", d)
    # A first call loads the kernels (CUDA's lazy module loading may wait for the device then)
    ops.sketch_table(torch.from_numpy(gradient).cuda(), torch.from_numpy(residual).cuda(), keys,
                     columns, clear, skip=torch.zeros(1, dtype=torch.int32, device="cuda"))
    for value in (1, 0):
        flag = torch.tensor([value], dtype=torch.int32, device="cuda")
        gpu_gradient = torch.from_numpy(gradient).cuda()
        gpu_residual = torch.from_numpy(residual).cuda()
        cpu_gradient, cpu_residual = gradient.copy(), residual.copy()
        if value:
            want = ops.sketch_table(None, cpu_residual, keys, columns)
            if clear:
                cpu_gradient[:] = 0
        else:
            want = ops.sketch_table(cpu_gradient, cpu_residual, keys, columns, clear)
        torch.cuda.synchronize()
        torch.cuda._sleep(2_000_000_000)  # about 1 s: the call (allocations, 11 launches) ends
        # well inside it under the tests stage's other processes
        got = ops.sketch_table(gpu_gradient, gpu_residual, keys, columns, clear, skip=flag)
        assert not torch.cuda.current_stream().query(), "the call waited for the stream"
        assert_bits(got.cpu().numpy(), want)
        assert_bits(gpu_residual.cpu().numpy(), cpu_residual)
        assert_bits(gpu_gradient.cpu().numpy(), cpu_gradient)


@cuda
@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 8, 9, 64])
@pytest.mark.parametrize("d", [100, 70_001, 1_000_003])
def test_cuda_fused_select_equals_the_cpu_selection(rows: int, d: int) -> None:
    """est computed inside the selection's passes (registers for rows <= 8, the general median
    beyond): the CPU's indices and values, bit for bit, and the reference's."""
    columns = 97
    table, keys = random_table(rows, columns), sketch_keys(rows, rows + d)
    want = estimate_reference(table, keys, d)
    for k in sorted({0, 1, 3, d // 100, d // 17, d // 3, d - 1, d, d + 1}):
        cpu_indices, cpu_values = ops.sketch_select(table, keys, k, np.empty(d, np.float32))
        indices, values = cuda_select(table, keys, k, d)
        np.testing.assert_array_equal(indices, cpu_indices)
        assert_bits(values, cpu_values)
        np.testing.assert_array_equal(indices, topk_reference(want, k))


@cuda
@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 8, 9])
@pytest.mark.parametrize("kind", ["normal", "heavy_tailed", "mixed_scales", "zeros", "huge",
                                  "nan", "ties"])
def test_cuda_select_with_row_bitmaps_equals_the_cpu_selection(rows: int, kind: str) -> None:
    """Where the engine guesses (k <= d / 16), pass 1 reads the row bitmaps and computes est
    only where half the rows' bits reach the guessed bin: the CPU's indices and values, bit
    for bit, for finite tables (the filter on), tables with cells >= 2^126 (off) and all-equal
    cells (the guess's bin holds every entry)."""
    d, columns = 1_000_003, 5_003
    keys = sketch_keys(rows, 50 + rows)
    if kind == "ties":
        table = np.ones((rows, columns), np.float32)
    else:
        source = "normal" if kind == "nan" else kind
        table = table_of(vector(source, d), keys, columns).reshape(rows, columns)
    if kind == "huge":
        table[-1, 7] = 2.0**126
    if kind == "nan":  # a NaN median with fewer than half the bits set: the filter must be off
        table[0, 3] = np.nan
    for k in (1, 100, 1_000, 10_000, d // 16, d // 15):
        cpu_indices, cpu_values = ops.sketch_select(table, keys, k, d=d)
        indices, values = cuda_select(table, keys, k, d, row_filter=True)
        np.testing.assert_array_equal(indices, cpu_indices)
        assert_bits(values, cpu_values)
        indices, values = cuda_select(table, keys, k, d)  # what ops.sketch_select runs
        np.testing.assert_array_equal(indices, cpu_indices)
        assert_bits(values, cpu_values)


@cuda
@pytest.mark.parametrize("kind", ["zeros", "two_values", "heavy_tailed"])
def test_cuda_fused_select_when_ties_need_more_passes(kind: str) -> None:
    """All-equal and two-valued estimates make the selection pass over d again (the index
    digits), computing the estimates again in each pass: still the CPU's bits."""
    d, rows = 400_003, 5
    keys = sketch_keys(rows, 9)
    if kind == "zeros":
        table = np.zeros((rows, 50), np.float32)
    elif kind == "two_values":
        table = np.ones((rows, 1), np.float32)  # est = +-1 by the signs' majority
    else:
        table = table_of(vector("heavy_tailed", d), keys, d // 50)
    for k in (1, 4_000, d // 2):
        cpu_indices, cpu_values = ops.sketch_select(table, keys, k, np.empty(d, np.float32))
        indices, values = cuda_select(table, keys, k, d)
        np.testing.assert_array_equal(indices, cpu_indices)
        assert_bits(values, cpu_values)


@cuda
def test_cuda_sketch_step_keeps_no_gradient_sized_buffer() -> None:
    """A sketch step on the GPU allocates the table, one tile's sums and the selection's O(k)
    scratch, no estimate buffer of d entries: the peak beyond the residual stays under 0.15 of
    the gradient at the first step (was 1.2: the estimate buffer) and after it."""
    import torch

    from gtopk_hvd.compression import Compression
    from gtopk_hvd.core import SparseStep
    from gtopk_hvd.transports.local import LocalGroup

    d = 1 << 24
    gradient = torch.randn(d, device="cuda", generator=torch.Generator("cuda").manual_seed(1))
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    step = SparseStep(Compression.sketch(0.001), [d], LocalGroup(1).transports[0],
                      device="cuda")
    step.update(gradient)
    torch.cuda.synchronize()
    first = (torch.cuda.max_memory_allocated() - before) / (4 * d)
    torch.cuda.reset_peak_memory_stats()
    steady_before = torch.cuda.memory_allocated()
    step.update(gradient)
    torch.cuda.synchronize()
    steady = (torch.cuda.max_memory_allocated() - steady_before) / (4 * d)
    assert first < 1.15 and steady < 0.15, (first, steady)


@pytest.mark.parametrize("tensor_transport", [True, False])
@pytest.mark.parametrize("second_round", [True, False])
@pytest.mark.parametrize("workers", [1, 3])
def test_the_sketch_step_moves_only_what_it_must_to_the_host(workers: int, second_round: bool,
                                                             tensor_transport: bool) -> None:
    """The copies between device and host that the sketch scheme itself makes in a step on a
    torch state (each copy to the host waits for the device): none at P = 1 or on a transport
    that sends tensors (`union.on_device`); on a transport of host arrays, the selected indices
    (which the union's host sum takes), the table (summed there, back into the same tensor) and
    the estimates without the second round. Was: the table both ways and the estimates at
    every P."""
    import sys
    import threading

    torch = pytest.importorskip("torch")
    from helpers.device_like import device_like, device_like_cpu
    from helpers.thread_transport import ThreadGroup

    from gtopk_hvd.backend import TorchBackend
    from gtopk_hvd.compression import Compression
    from gtopk_hvd.core import SparseStep

    d = 20_000
    counts: dict = {}
    patch = pytest.MonkeyPatch()
    for name in ("to_host", "from_host", "assign"):
        def counted(self: object, *args: object, _name: str = name,
                    _plain: object = getattr(TorchBackend, name)) -> object:
            caller = sys._getframe(1).f_globals.get("__name__")
            if caller == "gtopk_hvd.schemes.sketch":
                key = (_name, threading.current_thread().name)
                counts[key] = counts.get(key, 0) + 1
            return _plain(self, *args)
        patch.setattr(TorchBackend, name, counted)

    def work(transport: object) -> None:
        if not tensor_transport:
            transport.tensor_device = None  # sums host arrays, as MPI does
        state = SparseStep(Compression.sketch(0.01, second_round=second_round), [d], transport,
                           device="cpu")
        rng = np.random.default_rng(transport.rank)
        for _ in range(2):
            gradient = device_like(torch.from_numpy(rng.standard_normal(d).astype(np.float32)))
            state.update(gradient, device_like(torch.empty(d)), clear_gradient=True)

    try:
        with device_like_cpu():
            ThreadGroup(workers).run(work)
    finally:
        patch.undo()
    per_step: dict = {}
    for (name, _), calls in counts.items():
        per_step[name] = per_step.get(name, 0) + calls / (2 * workers)
    want = {}
    if workers > 1 and not tensor_transport:
        want = {"to_host": 2 + (not second_round), "assign": 1}
    assert per_step == want
