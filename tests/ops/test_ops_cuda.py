"""gtopk_hvd.ops on CUDA tensors against the numpy references. Skipped without a GPU (the CUDA
sources are still compiled by every install where nvcc is found)."""

from __future__ import annotations

import numpy as np
import pytest
from helpers.reference import magnitude_order, merge_reference, topk_reference
from test_ops import KINDS, make_input

from gtopk_hvd import _C, ops

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.skipif(not (torch.cuda.is_available() and ops.cuda_built),
                                reason="needs a CUDA GPU and an extension built with nvcc")

TORCH_DTYPES = {"float32": torch.float32, "float64": torch.float64, "float16": torch.float16,
                "bfloat16": torch.bfloat16}


def on_gpu(x: np.ndarray, dtype: str) -> torch.Tensor:
    return torch.from_numpy(x.astype(np.float64)).to(TORCH_DTYPES[dtype]).cuda()


@pytest.mark.parametrize("dtype", list(TORCH_DTYPES))
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("d", [0, 1, 7, 65_537, 1_000_003, 1 << 24])
def test_cuda_topk_abs_matches_full_sort(dtype: str, kind: str, d: int) -> None:
    x = on_gpu(make_input(kind, d, np.float64), dtype)
    host = x.float().cpu().numpy() if dtype == "bfloat16" else x.cpu().numpy()
    for k in sorted({0, 1, d // 1000, d // 100, d // 3, d, d + 1}):
        indices, values = ops.topk_abs(x, k)
        expected = topk_reference(host, k)
        np.testing.assert_array_equal(indices.cpu().numpy(), expected)
        selected = x.cpu()[torch.from_numpy(expected).long()]
        assert torch.equal(values.cpu().view(torch.uint8), selected.view(torch.uint8))


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("d,k", [(10, 3), (1_000_003, 1000), (1 << 22, 1 << 12)])
def test_cuda_accumulate_select(dtype: str, d: int, k: int) -> None:
    rng = np.random.default_rng(1)
    gradient = on_gpu(rng.standard_normal(d), dtype)
    residual = on_gpu(rng.standard_normal(d), dtype)
    accumulated = (residual + gradient).cpu().numpy()
    indices, values = ops.accumulate_select(gradient, residual, k)
    expected = topk_reference(accumulated, k)
    np.testing.assert_array_equal(indices.cpu().numpy(), expected)
    np.testing.assert_array_equal(values.cpu().numpy(), accumulated[expected])
    remaining = accumulated.copy()
    remaining[expected] = 0
    np.testing.assert_array_equal(residual.cpu().numpy(), remaining)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("d", [7, 65_537, 1_000_003])
def test_cuda_accumulate_select_every_kind(dtype: str, kind: str, d: int) -> None:
    """Ties, zeros, NaN/Inf and plateaus send the selection through its passes over d (the
    collecting refine pass, the staging from the input with the residual zeroed there) as well
    as through the candidate buffer; k = 0 and k >= d take their own kernels."""
    gradient_0 = on_gpu(make_input(kind, d, np.float64), dtype)
    residual_0 = on_gpu(make_input(kind, d, np.float64), dtype)
    accumulated = (residual_0 + gradient_0).cpu().numpy()
    order = magnitude_order(accumulated)
    for k in sorted({0, 1, d // 1000, d // 100, d // 3, d, d + 1}):
        gradient, residual = gradient_0.clone(), residual_0.clone()
        indices, values = ops.accumulate_select(gradient, residual, k)
        assert torch.equal(gradient.view(torch.uint8), gradient_0.view(torch.uint8))
        expected = np.sort(order[:k])
        np.testing.assert_array_equal(indices.cpu().numpy(), expected)
        np.testing.assert_array_equal(values.cpu().numpy(), accumulated[expected])
        remaining = accumulated.copy()
        remaining[expected] = 0
        np.testing.assert_array_equal(residual.cpu().numpy(), remaining)


def _guess_too_high(d: int, rest: str) -> np.ndarray:
    """An input whose sampled entries lie: the engine samples 2^16 keys at j * stride +
    stride / 2 (stride = d / 2^16); 5,000 of those positions hold large values and nothing
    else does, so the sample puts the k-th largest among them (a first-digit guess that should
    fit in the buffer) while fewer than k = 100,000 entries reach it: pass 1's partial
    histogram misses and the retry pass histograms every entry. rest: "normal" (small
    Gaussian values elsewhere) or "zeros" (20,000 small values elsewhere, zeros beside them,
    so the k-th largest is a zero)."""
    rng = np.random.default_rng(21)
    stride = d // (1 << 16)
    if rest == "normal":
        x = rng.standard_normal(d)
    else:
        x = np.zeros(d)
        x[rng.choice(d, 20_000, replace=False)] = rng.standard_normal(20_000)
    sampled = np.arange(1 << 16) * stride + stride // 2
    x[sampled] = 0.0
    x[rng.choice(sampled, 5_000, replace=False)] = rng.uniform(100.0, 300.0, 5_000)
    return x


@pytest.mark.parametrize("rest", ["normal", "zeros"])
def test_cuda_topk_abs_when_the_sampled_guess_is_too_high(rest: str) -> None:
    d, k = 1 << 21, 100_000
    x = on_gpu(_guess_too_high(d, rest), "float32")
    host = x.cpu().numpy()
    indices, values = ops.topk_abs(x, k)
    expected = topk_reference(host, k)
    np.testing.assert_array_equal(indices.cpu().numpy(), expected)
    np.testing.assert_array_equal(values.cpu().numpy(), host[expected])


@pytest.mark.parametrize("rest", ["normal", "zeros"])
def test_cuda_accumulate_select_when_the_sampled_guess_is_too_high(rest: str) -> None:
    """The retry pass reads the residual pass 1 has already accumulated (not gradient +
    residual again): the selection and the residual equal the host kernel's, bit for bit."""
    d, k = 1 << 21, 100_000
    x = _guess_too_high(d, rest).astype(np.float32)
    gradient_host = (x * np.float32(0.75)).astype(np.float32)
    residual_host = (x * np.float32(0.25)).astype(np.float32)
    gradient, residual = on_gpu(gradient_host, "float32"), on_gpu(residual_host, "float32")
    indices, values = ops.accumulate_select(gradient, residual, k)
    expected_indices, expected_values = ops.accumulate_select(gradient_host, residual_host, k)
    np.testing.assert_array_equal(indices.cpu().numpy(), expected_indices)
    np.testing.assert_array_equal(values.cpu().numpy(), expected_values)
    np.testing.assert_array_equal(residual.cpu().numpy(), residual_host)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("divisor", [1.0, 3.0])
def test_cuda_momentum_update_equals_the_host_bit_for_bit(dtype: str, divisor: float) -> None:
    """float32: the one-pass kernel; float64: torch's two operations. Both round as numpy's
    product, quotient and sum of float32 momentum and divisor (no fused multiply-add)."""
    rng = np.random.default_rng(9)
    n = 3_000_017
    velocity_host, gradient_host = rng.standard_normal((2, n)).astype(dtype)
    velocity_host[:3] = [1e-40, -3e38, 0.0]
    gradient_host[:3] = [1e-40, -3e38, -0.0]
    expected = velocity_host.copy()
    ops.momentum_update(expected, gradient_host, 0.9, divisor)
    velocity, gradient = on_gpu(velocity_host, dtype), on_gpu(gradient_host, dtype)
    ops.momentum_update(velocity, gradient, 0.9, divisor)
    assert velocity.cpu().numpy().tobytes() == expected.tobytes()


def test_cuda_topk_abs_calls_in_a_row_share_the_cached_workspace() -> None:
    """The device state (arrival counts, histograms) starts afresh at every call: alternating
    sizes, dtypes and k on the cached workspace give each call's own reference."""
    cases = [(1 << 20, 1000, "float32"), (300_007, 5, "float64"), (1 << 20, 1 << 16, "float32"),
             (65_537, 4096, "bfloat16"), (1 << 20, 1000, "float32")]
    for step, (d, k, dtype) in enumerate(cases):
        kind = KINDS[step % len(KINDS)]
        x = on_gpu(make_input(kind, d, np.float64), dtype)
        host = x.float().cpu().numpy() if dtype == "bfloat16" else x.cpu().numpy()
        value_type = _C.ValueType.__members__[dtype]
        index_type = _C.IndexType.int32
        indices = torch.empty(k, dtype=torch.int32, device=x.device)
        values = torch.empty(k, dtype=x.dtype, device=x.device)
        _C.cuda_topk_abs(value_type, index_type, x.data_ptr(), d, k, indices.data_ptr(),
                         values.data_ptr(), torch.cuda.current_stream().cuda_stream, 0, 0)
        np.testing.assert_array_equal(indices.cpu().numpy(), topk_reference(host, k))


def planted(d: int, count: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """|noise| < 1 everywhere, and magnitude 4 at `count`-odd distinct random positions (sorted),
    so that the top-k for k <= their number is known without sorting d: the k smallest of the
    positions (the tie rule). Generated on the GPU."""
    generator = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.rand(d, device="cuda", generator=generator).mul_(1.5).sub_(0.75)  # no temporaries
    positions = torch.randint(0, d, (count,), device="cuda", generator=generator,
                              dtype=torch.int64).unique()
    signs = torch.where(positions % 2 == 0, 4.0, -4.0)
    x[positions] = signs
    return x, positions


@pytest.mark.parametrize("d", [(1 << 28) + 3, 3 * (1 << 30) + 5])
def test_cuda_topk_abs_huge_inputs_with_planted_ties(d: int) -> None:
    """Beyond 2^28 and past int32 indices (3 * 2^30 + 5: int64 indices): the planted entries tie,
    so the k-th is decided by the index digits."""
    free, _ = torch.cuda.mem_get_info()
    if free < 2 * 4 * d:
        pytest.skip(f"needs {2 * 4 * d / 2**30:.1f} GiB of free GPU memory")
    x, positions = planted(d, 1_000_000, seed=5)
    for k in (positions.numel(), positions.numel() // 2, 1000):
        indices, values = ops.topk_abs(x, k)
        assert indices.dtype == (torch.int32 if d < 2**31 else torch.int64)
        assert torch.equal(indices.long(), positions[:k])
        assert torch.equal(values, x[positions[:k]])
    del x, positions
    torch.cuda.empty_cache()


def test_cuda_accumulate_select_huge_input_with_planted_ties() -> None:
    d = (1 << 28) + 3
    free, _ = torch.cuda.mem_get_info()
    if free < 3 * 4 * d:
        pytest.skip(f"needs {3 * 4 * d / 2**30:.1f} GiB of free GPU memory")
    gradient, positions = planted(d, 1_000_000, seed=6)
    residual = torch.zeros(d, device="cuda")
    k = positions.numel() // 2
    accumulated = gradient.clone()
    indices, values = ops.accumulate_select(gradient, residual, k)
    assert torch.equal(indices.long(), positions[:k])
    assert torch.equal(values, accumulated[positions[:k]])
    accumulated[positions[:k]] = 0
    assert torch.equal(residual, accumulated)


@pytest.mark.parametrize("n,d,k", [(0, 10, 3), (100, 150, 100), (50_000, 120_000, 50_000)])
def test_cuda_merge_matches_reference_and_is_symmetric(n: int, d: int, k: int) -> None:
    rng = np.random.default_rng(2)
    sets = []
    for _ in range(2):
        index = np.sort(rng.choice(d, size=n, replace=False)).astype(np.int32)
        sets.append((index, rng.integers(-3, 4, n).astype(np.float32)))
    (ia, va), (ib, vb) = sets
    gpu = [torch.from_numpy(a).cuda() for a in (ia, va, ib, vb)]
    indices, values = ops.merge_topk(*gpu, k)
    expected_index, expected_value = merge_reference(ia, va, ib, vb, k)
    np.testing.assert_array_equal(indices.cpu().numpy(), expected_index)
    np.testing.assert_array_equal(values.cpu().numpy(), expected_value)
    swapped = ops.merge_topk(gpu[2], gpu[3], gpu[0], gpu[1], k)
    assert torch.equal(swapped[0], indices) and torch.equal(swapped[1], values)


@pytest.mark.parametrize("n_a,n_b,k,overlap", [
    (100, 0, 100, 0.0), (300, 0, 100, 0.0), (0, 300, 100, 0.0), (100, 40, 100, 0.5),
    (100, 100, 100, 1.0), (1000, 1000, 1000, 0.9), (1000, 999, 1000, 0.0), (5, 7000, 6000, 0.0)])
@pytest.mark.parametrize("index_dtype", [np.int32, np.int64])
def test_cuda_merge_with_a_full_set_waits_for_nothing_and_matches_the_reference(
        n_a: int, n_b: int, k: int, overlap: float, index_dtype: type) -> None:
    """A set of k entries on either side (gTop-k's rounds): the union holds at least k, so the
    merge selects over the whole merged length with the places past the union zeroed, enqueued
    without a host wait (checked with the stream kept busy), equal to numpy's reference bit
    for bit, ties and zeros included (values drawn from a few integers), written into `out`."""
    rng = np.random.default_rng([n_a, n_b, k])
    d = 4 * (n_a + n_b) + 10
    index_a = np.sort(rng.choice(d, size=n_a, replace=False))
    shared = rng.choice(index_a, size=min(int(overlap * n_b), n_a), replace=False)
    rest = rng.choice(np.setdiff1d(np.arange(d), index_a), size=n_b - shared.size, replace=False)
    index_b = np.sort(np.concatenate([shared, rest]))
    value_a = rng.integers(-3, 4, n_a).astype(np.float32)
    value_b = rng.integers(-3, 4, n_b).astype(np.float32)
    gpu = [torch.from_numpy(np.ascontiguousarray(a)).cuda() for a in (
        index_a.astype(index_dtype), value_a, index_b.astype(index_dtype), value_b)]
    out = (torch.full((k,), -1, dtype=gpu[0].dtype, device="cuda"),
           torch.full((k,), 99.0, device="cuda"))
    ops.merge_topk(*gpu, k)  # loads the kernels and fills the allocator's cache
    torch.cuda.synchronize()
    # keeps the stream busy for about 0.1 s: 14 test processes on one machine can make a
    # merge's first call take longer on the host than a 25 ms sleep on the device
    torch.cuda._sleep(200_000_000)
    indices, values = ops.merge_topk(*gpu, k, out=out)
    assert not torch.cuda.current_stream().query(), "the merge waited for the device"
    assert indices.data_ptr() == out[0].data_ptr() and values.data_ptr() == out[1].data_ptr()
    expected_index, expected_value = merge_reference(index_a.astype(index_dtype), value_a,
                                                     index_b.astype(index_dtype), value_b, k)
    assert len(expected_index) == k
    np.testing.assert_array_equal(indices.cpu().numpy(), expected_index)
    assert values.cpu().numpy().tobytes() == expected_value.tobytes()
    swapped = ops.merge_topk(gpu[2], gpu[3], gpu[0], gpu[1], k)
    assert torch.equal(swapped[0], indices) and torch.equal(swapped[1], values)


def test_cuda_merge_into_an_out_it_cannot_write_directly_copies_there() -> None:
    """`out` of another index dtype than the sets': the merge's result is copied into it."""
    rng = np.random.default_rng(9)
    sets = [np.sort(rng.choice(5000, size=800, replace=False)).astype(np.int32)
            for _ in range(2)]
    gpu = [torch.from_numpy(a).cuda() for a in (
        sets[0], rng.standard_normal(800).astype(np.float32),
        sets[1], rng.standard_normal(800).astype(np.float32))]
    expected = ops.merge_topk(*gpu, 500)
    out = (torch.zeros(600, dtype=torch.int64, device="cuda"),
           torch.zeros(600, device="cuda"))
    indices, values = ops.merge_topk(*gpu, 500, out=out)
    assert indices.data_ptr() == out[0].data_ptr()
    assert torch.equal(indices, expected[0].long()) and torch.equal(values, expected[1])


def test_cuda_workspace_from_torch_or_from_the_cache() -> None:
    d, k = 1 << 20, 1000
    x = on_gpu(make_input("normal", d, np.float64), "float32")
    value_type, index_type = _C.ValueType.float32, _C.IndexType.int32
    nbytes = _C.cuda_select_workspace_bytes(value_type, index_type, d, k)
    assert nbytes > 0
    assert _C.cuda_select_workspace_bytes(value_type, index_type, d, d) == 0
    expected = ops.topk_abs(x, k)  # a workspace from torch
    stream = torch.cuda.current_stream().cuda_stream

    def run(workspace: int, workspace_bytes: int) -> tuple[torch.Tensor, torch.Tensor]:
        indices = torch.empty(k, dtype=torch.int32, device=x.device)
        values = torch.empty(k, dtype=x.dtype, device=x.device)
        _C.cuda_topk_abs(value_type, index_type, x.data_ptr(), d, k, indices.data_ptr(),
                         values.data_ptr(), stream, workspace, workspace_bytes)
        return indices, values

    for _ in range(2):  # the cached workspace: grown by the first call, reused by the second
        indices, values = run(0, 0)
        assert torch.equal(indices, expected[0]) and torch.equal(values, expected[1])
    small = torch.empty(nbytes + 256, dtype=torch.uint8, device=x.device)
    with pytest.raises(ValueError, match="bytes"):
        run(small.data_ptr(), nbytes - 1)
    with pytest.raises(ValueError, match="aligned"):
        run(small.data_ptr() + 1, nbytes)


def test_cuda_merge_workspace_from_the_cache() -> None:
    rng = np.random.default_rng(3)
    n, d, k = 50_000, 120_000, 20_000
    sets = [np.sort(rng.choice(d, size=n, replace=False)).astype(np.int32) for _ in range(2)]
    gpu = [torch.from_numpy(a).cuda() for a in (sets[0], rng.standard_normal(n).astype(
        np.float32), sets[1], rng.standard_normal(n).astype(np.float32))]
    expected = ops.merge_topk(*gpu, k)
    value_type, index_type = _C.ValueType.float32, _C.IndexType.int32
    assert _C.cuda_merge_topk_workspace_bytes(value_type, index_type, n, n, k) > 0
    indices = torch.empty(k, dtype=torch.int32, device="cuda")
    values = torch.empty(k, dtype=torch.float32, device="cuda")
    count = _C.cuda_merge_topk(value_type, index_type, gpu[0].data_ptr(), gpu[1].data_ptr(), n,
                               gpu[2].data_ptr(), gpu[3].data_ptr(), n, k, indices.data_ptr(),
                               values.data_ptr(), torch.cuda.current_stream().cuda_stream, 0, 0)
    assert count == expected[0].numel()
    assert torch.equal(indices[:count], expected[0]) and torch.equal(values[:count], expected[1])


# -- the threshold selection pass (MiCRO, ExDyna): the CUDA kernels against the CPU kernel -----

def threshold_inputs(d: int, dtype: str) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(4)
    gradient = rng.standard_normal(d).astype(dtype)
    residual = rng.standard_normal(d).astype(dtype)
    if d > 10:
        gradient[[3, d // 2, d - 2]] = [np.nan, np.inf, -np.inf]
        residual[[4, 5]] = [0.0, -0.0]
        gradient[[4, 5]] = [-0.0, 0.0]
    return gradient, residual


def assert_same_bits_but_nan_payloads(got: np.ndarray, want: np.ndarray) -> None:
    nan = np.isnan(want)
    np.testing.assert_array_equal(np.isnan(got), nan)
    assert got[~nan].tobytes() == want[~nan].tobytes()


# (histogram_shift, n_bins, n_fine, coarse_shift): fine bins only; fine then coarse (the
# schemes' window); more bins than a block's shared memory holds (global counters)
BIN_LAYOUTS = [(19, 41, -1, 0), (17, 93, 64, 20), (12, 6000, 5000, 16)]


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("d,begin,end", [(0, 0, 0), (10, 2, 9), (300_007, 0, 300_007),
                                         (300_007, 77, 77), (1 << 24, 1_000_003, 9_000_001)])
@pytest.mark.parametrize("layout", BIN_LAYOUTS, ids=["fine", "fine+coarse", "global-bins"])
@pytest.mark.parametrize("clear_gradient", [False, True])
def test_cuda_accumulate_threshold_equals_the_cpu_kernel(dtype: str, d: int, begin: int,
                                                         end: int, layout: tuple,
                                                         clear_gradient: bool) -> None:
    """Residual, gradient, selected indices (dtype and order) and histogram bit for bit, with
    NaN/Inf/-0.0 in the input, a threshold above and one below the histogram's base. NaN
    payloads excepted (cuda_ops.h: a GPU's float32 sums give one canonical NaN): NaNs at the same
    places, every other value's bits equal."""
    shift, n_bins, n_fine, coarse_shift = layout
    if dtype == "float64":
        shift, coarse_shift = shift + 29, coarse_shift + 29
    gradient, residual = threshold_inputs(d, dtype)
    base_key = ops.magnitude_key(0.75, dtype)
    for threshold in (2.5, 0.5):
        key = ops.magnitude_key(threshold, dtype)
        cpu_gradient, cpu_residual = gradient.copy(), residual.copy()
        want = ops.accumulate_threshold(cpu_gradient, cpu_residual, begin, end, key, base_key,
                                        shift, n_bins, clear_gradient, n_fine, coarse_shift)
        gpu_gradient = torch.from_numpy(gradient).cuda()
        gpu_residual = torch.from_numpy(residual).cuda()
        got = ops.accumulate_threshold(gpu_gradient, gpu_residual, begin, end, key, base_key,
                                       shift, n_bins, clear_gradient, n_fine, coarse_shift)
        assert got[0].is_cuda and str(got[0].dtype) == f"torch.{want[0].dtype}"
        np.testing.assert_array_equal(got[0].cpu().numpy(), want[0])
        np.testing.assert_array_equal(got[1], want[1])
        assert_same_bits_but_nan_payloads(gpu_residual.cpu().numpy(), cpu_residual)
        assert gpu_gradient.cpu().numpy().tobytes() == cpu_gradient.tobytes()
        if d > 10 and end - begin > d // 2:
            assert want[0].size > 0 and want[1].sum() > 0, "the case selected nothing"


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_cuda_threshold_indices_equals_the_cpu_kernel(dtype: str) -> None:
    """A read of the partition; a key above NaN's selects nothing, key 0 selects every entry."""
    x = threshold_inputs(1_000_003, dtype)[1]
    gpu = torch.from_numpy(x).cuda()
    above_nan = 0xFFFFFFFF if dtype == "float32" else 0xFFFFFFFFFFFFFFFF
    for begin, end in ((0, x.size), (12_345, 600_000), (5, 5)):
        for key in (ops.magnitude_key(1.5, dtype), 0, above_nan):
            want = ops.threshold_indices(x, begin, end, key)
            got = ops.threshold_indices(gpu, begin, end, key)
            np.testing.assert_array_equal(got.cpu().numpy(), want)
    with pytest.raises(ValueError, match="need 0 <= begin <= end <= d"):
        ops.threshold_indices(gpu, 7, 6, 0)
    with pytest.raises(ValueError, match="need 0 <= begin <= end <= d"):
        ops.accumulate_threshold(gpu, gpu.clone(), 0, x.size + 1, 0, 0, 19, 4)
    if dtype == "float32":
        with pytest.raises(ValueError, match="does not fit the values' key type"):
            ops.threshold_indices(gpu, 0, 10, 1 << 32)
        with pytest.raises(ValueError, match="does not fit the values' key type"):
            ops.accumulate_threshold(gpu, gpu.clone(), 0, 10, 1 << 32, 0, 19, 4)


@pytest.mark.parametrize("d,begin,end", [(0, 0, 0), (300_007, 77, 77),
                                         (1_000_003, 12_345, 900_001)])
@pytest.mark.parametrize("gradient_given", [True, False])
@pytest.mark.parametrize("window", [(0.75, 17, 93, 64, 20), (0.05, 12, 5_000, -1, 0)],
                         ids=["micro-window", "bins-beyond-shared-memory"])
def test_cuda_histogram_on_device_equals_accumulate_threshold_and_waits_for_nothing(
        d: int, begin: int, end: int, gradient_given: bool, window: tuple) -> None:
    """MiCRO's lockstep (gtopk_hvd.lockstep): the histogram left in device memory, enqueued
    behind a busy stream without a host wait, equal to the waiting kernel's bit for bit, and
    the accumulation too; MiCRO's window (its bins in shared memory) and one of more bins
    than a block holds there (kSharedBins: global atomics)."""
    gradient, residual = threshold_inputs(d, "float32")
    window = (ops.magnitude_key(window[0]), *window[1:])
    cpu_gradient, cpu_residual = gradient.copy(), residual.copy()
    _, want = ops.accumulate_threshold(cpu_gradient if gradient_given else None, cpu_residual,
                                       begin, end, 0xFFFFFFFF, window[0], window[1], window[2],
                                       gradient_given, window[3], window[4])
    gpu_gradient = torch.from_numpy(gradient).cuda() if gradient_given else None
    gpu_residual = torch.from_numpy(residual).cuda()
    arguments = {"histogram_base_key": window[0], "histogram_shift": window[1],
                 "n_bins": window[2], "n_fine": window[3], "coarse_shift": window[4]}
    ops.histogram_on_device(None, gpu_residual.clone(), begin, end, **arguments)  # loads it
    torch.cuda.synchronize()
    torch.cuda._sleep(200_000_000)
    histogram = ops.histogram_on_device(gpu_gradient, gpu_residual, begin, end,
                                        clear_gradient=gradient_given, **arguments)
    assert not torch.cuda.current_stream().query(), "histogram_on_device waited for the device"
    assert histogram.is_cuda and histogram.dtype == torch.int64
    np.testing.assert_array_equal(ops.read_to_host([histogram])[0], want)
    assert_same_bits_but_nan_payloads(gpu_residual.cpu().numpy(), cpu_residual)
    if gradient_given:
        assert gpu_gradient.cpu().numpy().tobytes() == cpu_gradient.tobytes()


@pytest.mark.parametrize("begin,end", [(0, 1_000_003), (12_345, 600_000), (5, 5)])
def test_cuda_threshold_indices_on_device_equals_threshold_indices_and_waits_for_nothing(
        begin: int, end: int) -> None:
    """The count left in device memory: enqueued without a host wait; the indices taken at the
    count read later equal threshold_indices'; a capacity below the count writes no more than
    it and raises when the indices are taken."""
    x = threshold_inputs(1_000_003, "float32")[1]
    gpu = torch.from_numpy(x).cuda()
    key = ops.magnitude_key(1.5)
    want = ops.threshold_indices(x, begin, end, key)
    ops.threshold_indices_on_device(gpu, begin, end, key, want.size + 5)  # loads the kernels
    torch.cuda.synchronize()
    torch.cuda._sleep(200_000_000)
    indices, count = ops.threshold_indices_on_device(gpu, begin, end, key, want.size + 5)
    assert not torch.cuda.current_stream().query(), "threshold_indices_on_device waited"
    (n,) = ops.read_to_host([count])
    np.testing.assert_array_equal(ops.selected_indices(indices, int(n[0])).cpu().numpy(), want)
    if want.size > 2:
        short, count = ops.threshold_indices_on_device(gpu, begin, end, key, 2)
        np.testing.assert_array_equal(short.cpu().numpy(), want[:2])
        with pytest.raises(RuntimeError, match="more than the bound"):
            ops.selected_indices(short, int(ops.read_to_host([count])[0][0]))


# -- the reads without gradient-sized temporaries (tests/ops/test_memory_kernels.py on the host) --


@pytest.mark.parametrize("dtype", list(TORCH_DTYPES))
@pytest.mark.parametrize("bad", [None, float("nan"), float("inf"), float("-inf")])
def test_cuda_all_finite_matches_isfinite(dtype: str, bad: object) -> None:
    x = on_gpu(np.random.default_rng(8).standard_normal(1_000_003), dtype)
    if bad is not None:
        x[999_999] = bad
    assert ops.all_finite(x) == bool(torch.isfinite(x).all())
    assert ops.all_finite(x[:0])


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_cuda_all_finite_makes_no_temporary_of_its_size(dtype: str) -> None:
    x = on_gpu(np.random.default_rng(9).standard_normal(1 << 22), dtype)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    start = torch.cuda.memory_allocated()
    assert ops.all_finite(x)
    assert torch.cuda.max_memory_allocated() - start < 0.05 * x.numel() * x.element_size()


@pytest.mark.parametrize("dtype", list(TORCH_DTYPES))
@pytest.mark.parametrize("bad", [None, float("nan"), float("inf"), float("-inf")])
def test_cuda_mark_nonfinite_matches_numpy_and_only_sets(dtype: str, bad: object) -> None:
    """The flag against numpy's isfinite over the same values; a set flag stays set for a
    finite x; an empty x leaves the flag as it is."""
    values = np.random.default_rng(11).standard_normal(1_000_003)
    if bad is not None:
        values[999_998] = bad
    x = on_gpu(values, dtype)
    expected = int(not np.isfinite(x.cpu().double().numpy()).all())
    flag = ops.nonfinite_flag(x)
    assert flag.device == x.device and flag.dtype == torch.int32
    ops.mark_nonfinite(x, flag)
    ops.mark_nonfinite(x[:0], flag)
    assert ops.read_flag(flag) == expected
    finite = on_gpu(np.ones(1000), dtype)
    ops.mark_nonfinite(finite, flag)
    assert ops.read_flag(flag) == expected
    set_flag = torch.ones(1, dtype=torch.int32, device=x.device)
    ops.mark_nonfinite(finite, set_flag)
    assert ops.read_flag(set_flag) == 1


def test_cuda_mark_nonfinite_does_not_wait_for_the_device() -> None:
    """Enqueued behind a long kernel, the mark returns while the stream is still busy (it
    neither copies to the host nor waits); read_flag then waits and sees the NaN written by
    a kernel queued before the mark."""
    x = torch.zeros(1 << 20, device="cuda")
    flag = ops.nonfinite_flag(x)
    # A first call loads the kernels (CUDA's lazy module loading may wait for the device then)
    ops.mark_nonfinite(x, flag)
    assert ops.read_flag(flag) == 0
    torch.cuda.synchronize()
    # ~1 s of GPU time on the current stream: the host calls below must end well inside it,
    # also with other processes loading this GPU and the host (0.1 s did not, under xdist)
    torch.cuda._sleep(2_000_000_000)
    x.narrow(0, 12345, 1).fill_(float("nan"))  # a kernel (x[i] = v copies v from the host)
    ops.mark_nonfinite(x, flag)
    assert not torch.cuda.current_stream().query()
    assert ops.read_flag(flag) == 1
    assert torch.cuda.current_stream().query()


@pytest.mark.parametrize("skip", [None, 0, 1])
def test_cuda_zero_at_does_not_wait_for_the_device(skip: int | None) -> None:
    """x[indices] = 0 with the zero made on the device (a Python 0.0 would be copied from the
    host, a copy that waits for the stream): behind a busy stream the call returns at once;
    the result is numpy's, and nothing is cleared when the skip flag is set."""
    x = torch.arange(1, 1001, dtype=torch.float32, device="cuda")
    indices = torch.tensor([3, 9, 9, 400], dtype=torch.int32, device="cuda")
    flag = None if skip is None else torch.tensor([skip], dtype=torch.int32, device="cuda")
    ops.zero_at(x.clone(), indices, flag)  # loads the kernels first
    torch.cuda.synchronize()
    # ~1 s of GPU time: the call must end well inside it, also with other test processes
    # loading the GPU and the host (as the mark_nonfinite test above)
    torch.cuda._sleep(2_000_000_000)
    ops.zero_at(x, indices, flag)
    assert not torch.cuda.current_stream().query(), "zero_at waited for the stream"
    want = np.arange(1, 1001, dtype=np.float32)
    if skip != 1:
        want[[3, 9, 400]] = 0
    np.testing.assert_array_equal(x.cpu().numpy(), want)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("n", [0, 1, 5000])
@pytest.mark.parametrize("flag", [None, 0, 1])
def test_cuda_zero_at_equals_numpy_in_one_launch(dtype: str, index_dtype: torch.dtype, n: int,
                                                 flag: int | None,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """`ops.zero_at` by its kernel (contiguous indices, repeats among them) and by the
    framework's operations (strided indices): numpy's x[indices] = 0 bit for bit, nothing
    cleared when the flag is set."""
    d = 1 << 16
    rng = np.random.default_rng([n, d])
    x = rng.standard_normal(d)
    indices = np.sort(rng.integers(0, d, n))  # with repeats
    want = x.astype(dtype)
    if not flag:
        want[indices] = 0
    skip = None if flag is None else torch.full((1,), flag, dtype=torch.int32, device="cuda")
    kernel, calls = ops._C.cuda_zero_at, []
    monkeypatch.setattr(ops._C, "cuda_zero_at", lambda *args: calls.append(1) or kernel(*args))
    for contiguous in (True, False):
        device_indices = torch.from_numpy(indices).to(index_dtype).cuda()
        if not contiguous:
            device_indices = torch.stack([device_indices, device_indices], dim=1)[:, 0]
        got = on_gpu(x, dtype)
        calls.clear()
        ops.zero_at(got, device_indices, skip)
        assert len(calls) == int(device_indices.is_contiguous())
        assert got.cpu().numpy().tobytes() == want.tobytes()


def test_cuda_mark_nonfinite_makes_no_temporary_of_its_size() -> None:
    x = on_gpu(np.random.default_rng(12).standard_normal(1 << 22), "float32")
    flag = ops.nonfinite_flag(x)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    start = torch.cuda.memory_allocated()
    ops.mark_nonfinite(x, flag)
    assert ops.read_flag(flag) == 0
    assert torch.cuda.max_memory_allocated() - start < 0.05 * x.numel() * x.element_size()


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_cuda_largest_finite_magnitude_and_histogram(dtype: str) -> None:
    rng = np.random.default_rng(10)
    x, y = rng.standard_normal((2, 300_001))
    x[[5, 77]] = [np.nan, np.inf]
    gx, gy = on_gpu(x, dtype), on_gpu(y, dtype)
    hx, hy = gx.cpu().numpy(), gy.cpu().numpy()
    assert ops.largest_finite_magnitude(gx, 3, 290_000, plus=gy) == (
        ops.largest_finite_magnitude(hx, 3, 290_000, plus=hy))
    if dtype == "float32":
        base = ops.magnitude_key(0.01)
        np.testing.assert_array_equal(ops.magnitude_histogram(gx, 10, 280_000, base, 19, 322),
                                      ops.magnitude_histogram(hx, 10, 280_000, base, 19, 322))
    key = ops.magnitude_key(1.5, hx.dtype)
    np.testing.assert_array_equal(ops.threshold_indices(gx, 10, 280_000, key).cpu().numpy(),
                                  ops.threshold_indices(hx, 10, 280_000, key))


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_cuda_threshold_indices_with_a_bound_equals_the_cpu_kernel(dtype: str) -> None:
    """at_most (a bound from the histogram): one read, no count pass, the same indices; a
    bound below the count raises, and the kernel writes nothing beyond its output."""
    x = threshold_inputs(1_000_003, dtype)[1]
    gpu = torch.from_numpy(x).cuda()
    for begin, end in ((0, x.size), (12_345, 600_000), (5, 5)):
        for key in (ops.magnitude_key(1.5, dtype), 0):
            want = ops.threshold_indices(x, begin, end, key)
            for slack in (0, 1, 1000):
                got = ops.threshold_indices(gpu, begin, end, key, at_most=want.size + slack)
                np.testing.assert_array_equal(got.cpu().numpy(), want)
            if want.size:
                with pytest.raises(RuntimeError, match="more than the bound"):
                    ops.threshold_indices(gpu, begin, end, key, at_most=want.size - 1)
    key = ops.magnitude_key(1.5, dtype)
    count = ops.threshold_indices(x, 0, x.size, key).size
    room = torch.full((count + 100,), -7, dtype=torch.int32, device="cuda")
    written = ops.threshold._cuda_threshold_indices_into(room[:count // 2], gpu, 0, x.size, key)
    assert written == count
    assert bool((room[count // 2:] == -7).all())
    np.testing.assert_array_equal(room[:count // 2].cpu().numpy(),
                                  ops.threshold_indices(x, 0, x.size, key)[:count // 2])


SEGMENT_LAYOUTS = {
    # (lengths, ks): empty segments, k = 0, k >= length, one huge and many tiny, more segments
    # than one launch sequence takes (256), segments over several chunks (2^15 entries).
    "mixed": ([5, 0, 17, 1, 40_000, 3, 0, 300], [2, 4, 0, 1, 40, 3, 1, 500]),
    "huge_and_tiny": ([1_500_000] + [int(n) for n in np.random.default_rng(5).integers(1, 70, 600)],
                      [1_500] + [1 + int(n) % 7 for n in range(600)]),
    "k_at_least_length": ([1, 2, 3, 70_000, 100_000], [1, 5, 3, 70_000, 100_001]),
    "k_zero": ([100, 70_000], [0, 0]),
    "all_empty": ([0, 0], [1, 2]),
    "resnet_like": ([9408, 64, 64, 4096, 64, 64, 36864, 64, 64, 16384, 256, 256, 2359296,
                     2048, 2048, 2048000, 1000], [0] * 17),
}


def _segmented_case(layout: str, kind: str, dtype: str, density: float = 0.001):
    lengths, ks = SEGMENT_LAYOUTS[layout]
    if layout == "resnet_like":
        ks = [max(1, int(np.ceil(density * n))) for n in lengths]
    offsets = [0, *np.cumsum(lengths, dtype=np.int64).tolist()]
    d = offsets[-1]
    gradient = make_input(kind, d, np.float64).astype(dtype)
    residual = make_input("normal" if kind != "all_zero" else kind, d, np.float64).astype(dtype)
    return offsets, ks, gradient, residual


def _assert_same_bits(actual: torch.Tensor, expected: np.ndarray) -> None:
    """Bit for bit, but for NaN payloads (a GPU's arithmetic returns one canonical NaN)."""
    actual = actual.cpu().numpy()
    assert actual.dtype == expected.dtype
    both_nan = np.isnan(actual) & np.isnan(expected)
    np.testing.assert_array_equal(actual[~both_nan].view(np.uint8),
                                  expected[~both_nan].view(np.uint8))
    np.testing.assert_array_equal(np.isnan(actual), np.isnan(expected))


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("layout", list(SEGMENT_LAYOUTS))
def test_cuda_segmented_select_matches_the_cpu_kernel(dtype: str, kind: str, layout: str) -> None:
    offsets, ks, gradient, residual = _segmented_case(layout, kind, dtype)
    clear_gradient = kind in ("normal", "few_levels", "nan_inf")  # the fused clear, some cases
    host_gradient, host_residual = gradient.copy(), residual.copy()
    expected = ops.segmented_accumulate_select(host_gradient, host_residual, offsets, ks,
                                               clear_gradient)
    device_gradient = torch.from_numpy(gradient).cuda()
    device_residual = torch.from_numpy(residual).cuda()
    indices, values = ops.segmented_accumulate_select(device_gradient, device_residual, offsets,
                                                      ks, clear_gradient)
    assert indices.is_cuda and indices.dtype == torch.int32
    np.testing.assert_array_equal(indices.cpu().numpy(), expected[0])
    _assert_same_bits(values, expected[1])
    _assert_same_bits(device_residual, host_residual)
    _assert_same_bits(device_gradient, host_gradient)


@pytest.mark.parametrize("kind", ["normal", "all_zero", "few_levels", "plateau"])
def test_cuda_segmented_select_without_gradient_matches_the_reference(kind: str) -> None:
    offsets, ks, _, residual = _segmented_case("huge_and_tiny", kind, "float32")
    expected_residual = residual.copy()
    chosen = [begin + topk_reference(expected_residual[begin:end], k)
              for begin, end, k in zip(offsets[:-1], offsets[1:], ks)]
    expected = np.concatenate(chosen)
    device_residual = torch.from_numpy(residual).cuda()
    indices, values = ops.segmented_accumulate_select(None, device_residual, offsets, ks)
    np.testing.assert_array_equal(indices.cpu().numpy(), expected)
    _assert_same_bits(values, expected_residual[expected])
    expected_residual[expected] = 0
    _assert_same_bits(device_residual, expected_residual)


def test_cuda_segmented_select_equals_per_part_cuda_calls() -> None:
    offsets, ks, gradient, residual = _segmented_case("resnet_like", "normal", "float32")
    parts_gradient = torch.from_numpy(gradient).cuda()
    parts_residual = torch.from_numpy(residual).cuda()
    chosen, picked = [], []
    for begin, end, k in zip(offsets[:-1], offsets[1:], ks):
        part_indices, part_values = ops.accumulate_select(
            parts_gradient[begin:end], parts_residual[begin:end], k, clear_gradient=True)
        chosen.append(part_indices.long() + begin)
        picked.append(part_values)
    device_gradient = torch.from_numpy(gradient).cuda()
    device_residual = torch.from_numpy(residual).cuda()
    indices, values = ops.segmented_accumulate_select(device_gradient, device_residual, offsets,
                                                      ks, True)
    assert torch.equal(indices.long(), torch.cat(chosen))
    assert torch.equal(values.view(torch.int32), torch.cat(picked).view(torch.int32))
    assert torch.equal(device_residual.view(torch.int32), parts_residual.view(torch.int32))
    assert torch.equal(device_gradient, parts_gradient)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("d,k", [(10, 3), (10, 10), (10, 0), (1_000_003, 1000),
                                 (1 << 22, 1 << 12)])
@pytest.mark.parametrize("segmented", [False, True])
def test_cuda_kernels_read_the_skip_flag_on_the_device(kind: str, d: int, k: int,
                                                        segmented: bool) -> None:
    """A set device flag (gtopk_hvd.core.skip): the residual and velocity stay bit for bit
    and the set is the residual's own top-k (numpy's); the gradient is cleared; a clear flag
    gives the flagless call's result, residual and velocity."""
    rng = np.random.default_rng([d, k])
    residual = on_gpu(make_input(kind, d, np.float64), "float32")
    gradient = on_gpu(rng.standard_normal(d), "float32")
    velocity = on_gpu(rng.standard_normal(d), "float32")
    offsets, ks = [0, d // 3, d], [k // 2, k - k // 2]

    def select(g: torch.Tensor, r: torch.Tensor, skip: torch.Tensor | None) -> tuple:
        if segmented:
            return ops.segmented_accumulate_select(g, r, offsets, ks, True, skip)
        return ops.accumulate_select(g, r, k, clear_gradient=True, skip=skip)

    before = residual.clone()
    set_flag = torch.ones(1, dtype=torch.int32, device="cuda")
    indices, values = select(gradient.clone(), residual, set_flag)
    assert torch.equal(residual.view(torch.int32), before.view(torch.int32))
    if segmented:
        want_indices, want_values = ops.segmented_accumulate_select(None, before.cpu().clone(),
                                                                    offsets, ks)
        want_indices = want_indices.numpy()
    else:
        want_indices = topk_reference(before.cpu().numpy(), k)
    np.testing.assert_array_equal(indices.cpu().numpy(), want_indices)
    np.testing.assert_array_equal(values.cpu().view(torch.int32).numpy(),
                                  before.cpu()[torch.from_numpy(want_indices).long()]
                                  .view(torch.int32).numpy())
    moved = velocity.clone()
    ops.momentum_update(moved, gradient, 0.9, 4.0, set_flag)
    assert torch.equal(moved.view(torch.int32), velocity.view(torch.int32))

    clear_flag = torch.zeros(1, dtype=torch.int32, device="cuda")
    flagged_residual, plain_residual = before.clone(), before.clone()
    flagged_gradient, plain_gradient = gradient.clone(), gradient.clone()
    got = select(flagged_gradient, flagged_residual, clear_flag)
    want = select(plain_gradient, plain_residual, None)
    for a, b in zip((*got, flagged_residual, flagged_gradient),
                    (*want, plain_residual, plain_gradient)):
        assert torch.equal(a.view(torch.uint8), b.view(torch.uint8))
    flagged, plain = velocity.clone(), velocity.clone()
    ops.momentum_update(flagged, gradient, 0.9, 4.0, clear_flag)
    ops.momentum_update(plain, gradient, 0.9, 4.0)
    assert torch.equal(flagged.view(torch.int32), plain.view(torch.int32))


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("d,n", [(10, 0), (10, 10), (1_000_003, 1000), (3 << 20, 1 << 12)])
@pytest.mark.parametrize("flag", [None, 0, 1])
@pytest.mark.parametrize("zeroed", [False, True])
def test_cuda_write_sparse_with_and_without_the_skip_flag(dtype: str, index_dtype: torch.dtype,
                                                          d: int, n: int, flag: int | None,
                                                          zeroed: bool) -> None:
    """`ops.write_sparse` on the device (one fill and one scatter, or the scatter alone over a
    zeroed dest): numpy's dense vector bit for bit, all NaN when the flag is set, every entry
    written (the dest is poisoned first unless it is declared zeroed)."""
    rng = np.random.default_rng([d, n])
    indices = np.sort(rng.choice(d, n, replace=False))
    values = rng.standard_normal(n)
    dest = (torch.zeros(d, dtype=TORCH_DTYPES[dtype], device="cuda") if zeroed else
            torch.full((d,), 7.0, dtype=TORCH_DTYPES[dtype], device="cuda"))
    skip = None if flag is None else torch.full((1,), flag, dtype=torch.int32, device="cuda")
    ops.write_sparse(dest, torch.from_numpy(indices).to(index_dtype).cuda(),
                     on_gpu(values, dtype), skip, zeroed=zeroed)
    if flag:
        assert torch.isnan(dest).all()
        return
    expected = np.zeros(d, dtype)
    expected[indices] = values.astype(dtype)
    assert dest.cpu().numpy().tobytes() == expected.tobytes()


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("n,share", [(0, 0.5), (1, 0.0), (1, 1.0), (1000, 0.5), (1 << 16, 0.9)])
@pytest.mark.parametrize("taken_kind", ["none", "empty", "some"])
@pytest.mark.parametrize("flag", [None, 0, 1])
def test_cuda_take_at_equals_the_host_and_reads_the_skip_flag(
        dtype: str, index_dtype: torch.dtype, n: int, share: float, taken_kind: str,
        flag: int | None, monkeypatch: pytest.MonkeyPatch) -> None:
    """`ops.take_at` on the device (one launch, a binary search per entry) against its host
    side on the same data bit for bit: the values at the set with the taken values added (taken
    entries outside the set ignored), the set cleared, or kept when the flag is set; and with
    a non-contiguous set (the framework operations' path, not the kernel) the same."""
    d = 1 << 20
    rng = np.random.default_rng([n, int(share * 10), ["none", "empty", "some"].index(taken_kind)])
    indices = np.sort(rng.choice(d, n, replace=False))
    taken = None
    if taken_kind != "none":
        count = int(share * n) if taken_kind == "some" else 0
        inside = rng.choice(indices, count, replace=False) if n else indices
        outside = rng.choice(np.setdiff1d(np.arange(0, d, 97), indices), 300, replace=False)
        taken_indices = np.union1d(inside, outside) if taken_kind == "some" else inside
        taken = (taken_indices, rng.standard_normal(taken_indices.size))
    residual = rng.standard_normal(d)
    host_residual = residual.astype(dtype)
    host_flag = None if flag is None else np.array([flag], np.int32)
    want = ops.take_at(host_residual, indices.astype(np.int64),
                       None if taken is None else (taken[0].astype(np.int64),
                                                   taken[1].astype(dtype)), host_flag)
    skip = None if flag is None else torch.full((1,), flag, dtype=torch.int32, device="cuda")
    kernel, calls = ops._C.cuda_take_at, []
    monkeypatch.setattr(ops._C, "cuda_take_at", lambda *args: calls.append(1) or kernel(*args))
    for contiguous in (True, False):
        device_residual = on_gpu(residual, dtype)
        device_indices = torch.from_numpy(indices).to(index_dtype).cuda()
        if not contiguous:
            device_indices = torch.stack([device_indices, device_indices], dim=1)[:, 0]
        device_taken = None if taken is None else (
            torch.from_numpy(taken[0]).to(index_dtype).cuda(), on_gpu(taken[1], dtype))
        calls.clear()
        got = ops.take_at(device_residual, device_indices, device_taken, skip)
        assert len(calls) == int(device_indices.is_contiguous())  # the kernel, or the fallback
        assert got.device == device_residual.device
        assert got.cpu().numpy().tobytes() == want.tobytes()
        assert device_residual.cpu().numpy().tobytes() == host_residual.tobytes()


@pytest.mark.parametrize("skip", [None, 0, 1])
def test_cuda_take_at_does_not_wait_for_the_device(skip: int | None) -> None:
    """Behind a busy stream the call returns at once (the flag read and the search on the
    device); the result is the host's."""
    residual = torch.arange(1, 1001, dtype=torch.float32, device="cuda")
    indices = torch.tensor([3, 9, 400], dtype=torch.int64, device="cuda")
    taken = (torch.tensor([9, 500], device="cuda"), torch.tensor([0.5, 7.0], device="cuda"))
    flag = None if skip is None else torch.tensor([skip], dtype=torch.int32, device="cuda")
    ops.take_at(residual.clone(), indices, taken, flag)  # loads the kernel first
    torch.cuda.synchronize()
    torch.cuda._sleep(2_000_000_000)  # ~1 s of GPU time (as the zero_at test above)
    got = ops.take_at(residual, indices, taken, flag)
    assert not torch.cuda.current_stream().query(), "take_at waited for the stream"
    np.testing.assert_array_equal(got.cpu().numpy(), np.array([4.0, 10.5, 401.0], np.float32))
    want = np.arange(1, 1001, dtype=np.float32)
    if skip != 1:
        want[[3, 9, 400]] = 0
    np.testing.assert_array_equal(residual.cpu().numpy(), want)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("n,share", [(0, 0.5), (1, 0.0), (1, 1.0), (1000, 0.5), (1 << 16, 0.9)])
@pytest.mark.parametrize("flag", [None, 0, 1])
def test_cuda_restore_unselected_equals_the_mask_path_and_reads_the_skip_flag(
        dtype: str, index_dtype: torch.dtype, n: int, share: float, flag: int | None) -> None:
    """`ops.restore_unselected` (one launch, a binary search per entry) against the host's
    mask and restore (`mark_survivors`, `restore_residual`) bit for bit; nothing restored when
    the flag is set; a global set holding indices this worker did not send, and an empty one."""
    d = 1 << 20
    rng = np.random.default_rng([n, int(share * 10)])
    indices = np.sort(rng.choice(d, n, replace=False))
    values = rng.standard_normal(n)
    kept = rng.choice(indices, int(share * n), replace=False) if n else indices
    others = rng.choice(np.setdiff1d(np.arange(0, d, 97), indices), 300, replace=False)
    selected = np.union1d(kept, others)
    residual = rng.standard_normal(d)
    host_residual = residual.astype(dtype)
    if not flag:
        ops.restore_residual(host_residual, indices.astype(np.int64), values.astype(dtype),
                             ~ops.mark_survivors(indices.astype(np.int64),
                                                 selected.astype(np.int64)))
    device_residual = on_gpu(residual, dtype)
    skip = None if flag is None else torch.full((1,), flag, dtype=torch.int32, device="cuda")
    ops.restore_unselected(device_residual, torch.from_numpy(indices).to(index_dtype).cuda(),
                           on_gpu(values, dtype), torch.from_numpy(selected).to(index_dtype).cuda(),
                           skip)
    assert device_residual.cpu().numpy().tobytes() == host_residual.tobytes()
    empty = torch.empty(0, dtype=index_dtype, device="cuda")
    everything = on_gpu(residual, dtype)
    ops.restore_unselected(everything, torch.from_numpy(indices).to(index_dtype).cuda(),
                           on_gpu(values, dtype), empty)
    expected = residual.astype(dtype)
    np.add.at(expected, indices, values.astype(dtype))
    assert everything.cpu().numpy().tobytes() == expected.tobytes()
