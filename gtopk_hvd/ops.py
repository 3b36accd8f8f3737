"""Kernels of gtopk_hvd on numpy arrays, torch tensors (CPU and CUDA) and TensorFlow tensors.

Selection order (the same everywhere, CPU and CUDA): entry (i, v) comes before (j, w) iff
|v| > |w|, or |v| == |w| and i < j. NaN counts as larger than every number (all NaNs equal), so
a NaN is always selected and reaches the caller; -0.0 == 0.0. Top-k = the first k entries in that
order. Every function returns its (indices, values) sorted by index, indices of dtype
index_dtype_for(d) (int32 when the dense length d <= INT32_INDEX_LIMIT = 2^31, int64 beyond),
values in the input's dtype, as the caller's array type.

Inputs are read in place (no copy): they must be contiguous; any shape is flattened.
"""

from __future__ import annotations

import numbers
from typing import Any

import numpy as np

from gtopk_hvd import _C, threads
from gtopk_hvd._arrays import (
    NumpyView,
    as_numpy,
    check_count,
    dtype_name,
    framework_of,
    is_cuda,
    like,
)

__all__ = [
    "topk_abs",
    "accumulate_select",
    "segmented_accumulate_select",
    "merge_topk",
    "write_sparse",
    "take_at",
    "restore_unselected",
    "restore_residual",
    "mark_survivors",
    "all_finite",
    "mark_nonfinite",
    "nonfinite_flag",
    "read_flag",
    "sketch_table",
    "sketch_select",
    "sketch_estimate",
    "sorted_union",
    "histogram_on_device",
    "threshold_indices_on_device",
    "selected_indices",
    "read_to_host",
    "add_divided",
    "momentum_update",
    "zero_at",
    "flag_set",
    "LaterFlag",
    "set_num_threads",
    "get_num_threads",
    "cuda_built",
    "INT32_INDEX_LIMIT",
    "index_dtype_for",
]

cuda_built: bool = bool(_C.built_with_cuda)

threads.configure_kernels(_C)


def set_num_threads(n: int) -> None:
    """Threads of the CPU kernels (0: OpenMP's default). The default is sized by
    `gtopk_hvd.threads` from the cores and the ranks on this machine."""
    if isinstance(n, bool) or not isinstance(n, numbers.Integral) or n < 0:
        raise ValueError(f"the number of threads must be an integer >= 0, got {n!r}")
    _C.set_num_threads(int(n))


def get_num_threads() -> int:
    """Threads the CPU kernels use for large inputs (small ones run on one)."""
    return int(_C.get_num_threads())


INT32_INDEX_LIMIT: int = int(_C.INT32_INDEX_LIMIT)
"""The longest dense length whose indices 0 .. d-1 all fit in int32 (2^31)."""


def index_dtype_for(d: int) -> type[np.signedinteger]:
    """The index dtype of a dense length d: np.int32 when its indices fit in int32, else
    np.int64 (the kernels' rule, gtopk/types.h)."""
    return np.int32 if _C.int32_indices_fit(d) else np.int64


def _hint_array(threshold_hint: float | None, view: NumpyView) -> np.ndarray | None:
    """The hint as one value of the input's dtype (16-bit types as their bit pattern)."""
    if threshold_hint is None:
        return None
    if view.value_type == "bfloat16":
        bits = np.array([abs(float(threshold_hint))], np.float32).view(np.uint32)
        return (bits >> 16).astype(np.uint16)  # truncation rounds toward zero: stays a lower bound
    return np.array([abs(float(threshold_hint))], dtype=view.array.dtype)


def topk_abs(x: Any, k: int, threshold_hint: float | None = None) -> tuple[Any, Any]:
    """The top-k entries of x by magnitude: (indices, values), sorted by index.

    Returns min(k, x.size) entries. threshold_hint, a magnitude believed to be at or below the
    k-th largest |x| (e.g. 0.8 x the smallest |value| selected at the previous step), only
    changes the speed: one pass over x when it is right, one more when it is wrong.
    """
    k = check_count(k)
    if is_cuda(x):
        return _cuda_topk_abs(x, k)
    view = as_numpy(x, "x")
    indices, values = _C.topk_abs(view.array, k, _hint_array(threshold_hint, view),
                                  view.value_type)
    return like(indices, view), like(values, view)


def accumulate_select(
    gradient: Any, residual: Any, k: int, threshold_hint: float | None = None,
    clear_gradient: bool = False, skip: Any = None,
) -> tuple[Any, Any]:
    """Error-feedback selection in one pass over d, updating `residual` in place:

        residual += gradient
        (indices, values) = topk_abs(residual, k)
        residual[indices] = 0
        gradient[:] = 0                     (only if clear_gradient, in the same pass)

    float32 / float64; gradient and residual of the same length and dtype. gradient None: the
    residual already holds the accumulated gradient (the same result: `topk_abs` of it, zeroed
    there).

    skip: None, or a skip flag where the residual lives (`nonfinite_flag`'s kind: one int32).
    When it holds a nonzero value, the residual is left as it is and the result is
    topk_abs(residual, k), a valid set for a step skipped without the host knowing (the gradient
    is still cleared if asked). On a GPU the kernels read the flag (no host wait); elsewhere it
    is read here.
    """
    k = check_count(k)
    if skip is not None and not is_cuda(residual):
        if skipped_here(skip, gradient, clear_gradient):
            return topk_abs(residual, k)
        skip = None
    if gradient is None:  # the residual already holds the accumulated gradient
        indices, values = topk_abs(residual, k, threshold_hint)
        zero_at(residual, indices)
        return indices, values
    if is_cuda(gradient) or is_cuda(residual):
        return _cuda_accumulate_select(gradient, residual, k, clear_gradient, skip)
    gradient_view = as_numpy(gradient, "gradient", writeable=clear_gradient)
    residual_view = as_numpy(residual, "residual", writeable=True)
    indices, values = _C.accumulate_select(
        gradient_view.array, residual_view.array, k,
        _hint_array(threshold_hint, gradient_view), gradient_view.value_type,
        bool(clear_gradient))
    return like(indices, gradient_view), like(values, gradient_view)


def segmented_accumulate_select(
    gradient: Any, residual: Any, offsets: Any, ks: Any, clear_gradient: bool = False,
    skip: Any = None,
) -> tuple[Any, Any]:
    """`accumulate_select` over each segment of the vector, each with its own k, in one call:
    for segment s = [offsets[s], offsets[s + 1]) and its k = ks[s],

        residual[s] += gradient[s]
        (I_s, V_s) = topk_abs(residual[s], ks[s]),  I_s local to the segment (ties: lower index)
        residual[s][I_s] = 0
        gradient = 0                        (only if clear_gradient)

    and returns (concatenation of offsets[s] + I_s, concatenation of V_s) in segment order, so
    sorted by index; indices of index_dtype_for(d), d the residual's length. Bit for bit the
    per-segment `accumulate_select` calls (concatenated, offsets added). offsets: S + 1
    non-decreasing integers from 0 to d; ks: S integers >= 0 (min(k_s, segment length) entries
    each; empty segments and k_s = 0 give none). float32 / float64; gradient None: the residual
    already holds the sum. CPU: one kernel call looping over the segments (`_C`); CUDA: one
    launch sequence for all the segments (segmented_select.cu), its segment table copied to the
    device once per (device, segments) and kept. skip: as `accumulate_select`'s (when set, the
    residual is left as it is and the sets are those of the residual as it is).
    """
    offsets, ks = _segments(offsets, ks)
    if gradient is None:
        clear_gradient = False
    if skip is not None and not is_cuda(residual):
        if skipped_here(skip, gradient, clear_gradient):
            indices, values = segmented_accumulate_select(None, residual, offsets, ks)
            residual[indices.long() if framework_of(indices) == "torch" else indices] = values
            return indices, values
        skip = None
    if is_cuda(residual) or (gradient is not None and is_cuda(gradient)):
        return _cuda_segmented_accumulate_select(gradient, residual, offsets, ks,
                                                 clear_gradient, skip)
    gradient_array = None
    if gradient is not None:
        gradient_array = as_numpy(gradient, "gradient", writeable=clear_gradient).array
    residual_view = as_numpy(residual, "residual", writeable=True)
    indices, values = _C.segmented_accumulate_select(
        gradient_array, residual_view.array, offsets, ks, residual_view.value_type,
        bool(clear_gradient))
    return like(indices, residual_view), like(values, residual_view)


def _segments(offsets: Any, ks: Any) -> tuple[np.ndarray, np.ndarray]:
    """offsets and ks as contiguous int64 arrays (the kernels check their values)."""
    offsets = np.ascontiguousarray(offsets, dtype=np.int64).reshape(-1)
    ks = np.ascontiguousarray(ks, dtype=np.int64).reshape(-1)
    if offsets.size != ks.size + 1:
        raise ValueError(f"offsets must hold one more value than ks, got {offsets.size} and "
                         f"{ks.size}")
    return offsets, ks


def accumulate_threshold(gradient: Any, residual: Any, begin: int, end: int,
                         threshold_key: int, histogram_base_key: int, histogram_shift: int,
                         n_bins: int, clear_gradient: bool = False, n_fine: int = -1,
                         coarse_shift: int = 0) -> tuple[Any, np.ndarray]:
    """Threshold selection fused with the accumulation (MiCRO / ExDyna), one pass over d:

        residual += gradient                              (gradient = 0 too if clear_gradient)
        indices = [i in [begin, end) with key(residual[i]) >= max(threshold_key,
                                                                   histogram_base_key)]
        histogram[b] = #[i in [begin, end) with key >= histogram_base_key, bin(key) = b]

    key(v): the magnitude's bits (`magnitude_key`: NaN above +Inf above every number), so every
    NaN reaches the selection. bin: `histogram_bin` (n_fine bins of 2^histogram_shift keys,
    then bins of 2^coarse_shift; n_fine < 0: all fine). Returns (indices, histogram int64, on
    the host). float32 / float64. CUDA tensors: the CUDA kernels (one pass over d, then one
    read of [begin, end) to write the indices in order), or torch operations on their device
    where gtopk_hvd was built without them.

    gradient None: no accumulation; the histogram and the selection of `residual` as it is, a
    read of [begin, end) only (what `magnitude_histogram` and a pre-accumulated residual need).
    """
    if gradient is None:
        clear_gradient = False
    on_gpu = is_cuda(residual) or (gradient is not None and is_cuda(gradient))
    if on_gpu and cuda_built:
        return _cuda_accumulate_threshold(gradient, residual, begin, end, threshold_key,
                                          histogram_base_key, histogram_shift, n_bins,
                                          clear_gradient, n_fine, coarse_shift)
    if on_gpu:
        return _torch_accumulate_threshold(gradient, residual, begin, end, threshold_key,
                                           histogram_base_key, histogram_shift, n_bins,
                                           clear_gradient, n_fine, coarse_shift)
    gradient_array = None
    if gradient is not None:
        gradient_array = as_numpy(gradient, "gradient", writeable=clear_gradient).array
    residual_view = as_numpy(residual, "residual", writeable=gradient is not None)
    indices, histogram = _C.accumulate_threshold(
        gradient_array, residual_view.array, int(begin), int(end), int(threshold_key),
        int(histogram_base_key), int(histogram_shift), int(n_bins), residual_view.value_type,
        bool(clear_gradient), int(n_fine), int(coarse_shift))
    return like(indices, residual_view), histogram


def histogram_bin(offset: Any, histogram_shift: int, n_bins: int, n_fine: int = -1,
                  coarse_shift: int = 0) -> Any:
    """The kernels' histogram bin of keys at `offset` = key - base >= 0 (int64 numpy arrays or
    torch tensors): offset >> histogram_shift for the first n_fine bins, then n_fine +
    ((offset - (n_fine << histogram_shift)) >> coarse_shift), at most n_bins - 1 (n_fine < 0:
    every bin is a fine one; gtopk/histogram_bins.h)."""
    n_fine = n_fine if 0 <= n_fine <= n_bins else n_bins
    span = n_fine << histogram_shift
    fine = offset >> histogram_shift
    coarse = n_fine + ((offset - span) >> coarse_shift)
    return (fine * (offset < span) + coarse * (offset >= span)).clip(0, n_bins - 1)


def threshold_indices(x: Any, begin: int, end: int, threshold_key: int,
                      at_most: int | None = None) -> Any:
    """The indices i in [begin, end) with magnitude_key(x[i]) >= threshold_key, sorted: one
    read of x[begin:end) (float32 / float64, numpy or torch; a NaN's key is above every
    number's, so every NaN is in).

    at_most: an upper bound of their count known without reading x, e.g. the entries of a
    histogram of the same x[begin:end) in the bins at or above threshold_key's
    (`histogram_count_from`). It changes no result: the CUDA side then writes into a tensor of
    that size in its one read and skips the count pass that sizes the output otherwise (a read
    of the range and a wait for the host); every side raises RuntimeError if more than at_most
    are selected (a bound that was not one)."""
    if at_most is not None:
        at_most = min(check_count(at_most), max(0, int(end) - int(begin)))
    if is_cuda(x) and cuda_built:
        return _cuda_threshold_indices(x, begin, end, threshold_key, at_most)
    if is_cuda(x):
        indices = _torch_threshold_indices(x, begin, end, threshold_key)
    else:
        view = as_numpy(x, "x")
        indices = like(_C.threshold_indices(view.array, int(begin), int(end),
                                            int(threshold_key), view.value_type), view)
    if at_most is not None and len(indices) > at_most:
        raise RuntimeError(f"gtopk_hvd: threshold_indices selected {len(indices)} entries, "
                           f"more than the bound at_most={at_most}")
    return indices


def histogram_on_device(gradient: Any, residual: Any, begin: int, end: int,
                        histogram_base_key: int, histogram_shift: int, n_bins: int,
                        clear_gradient: bool = False, n_fine: int = -1,
                        coarse_shift: int = 0) -> Any:
    """`accumulate_threshold` selecting nothing, its histogram left where the state is: an int64
    tensor of n_bins on residual's device, and no wait for it (torch tensors only; read it with
    `read_to_host`, e.g. with other buckets', one wait for all). The accumulation and the counts are
    accumulate_threshold's; the CUDA side writes the counters in device memory and copies
    nothing."""
    import torch

    if framework_of(residual) != "torch":
        raise TypeError("histogram_on_device takes torch tensors (numpy: accumulate_threshold)")
    nothing = (1 << (8 * _itemsize(residual))) - 1  # above every key: nothing is selected
    on_gpu = is_cuda(residual) or (gradient is not None and is_cuda(gradient))
    if not (on_gpu and cuda_built):
        _, histogram = accumulate_threshold(gradient, residual, begin, end, nothing,
                                            histogram_base_key, histogram_shift, n_bins,
                                            clear_gradient, n_fine, coarse_shift)
        return torch.from_numpy(np.asarray(histogram, np.int64)).to(residual.device)
    if gradient is None:
        clear_gradient = False
        _cuda_check(residual, "residual", residual.device)
    else:
        _cuda_check_pair(gradient, residual)
    device = residual.device
    counts = torch.empty(int(n_bins) + 1, dtype=torch.int64, device=device)
    with _on_device(device):
        _C.cuda_accumulate_count(
            _cuda_value_type(residual.dtype), 0 if gradient is None else gradient.data_ptr(),
            residual.data_ptr(), residual.numel(), int(begin), int(end), nothing,
            int(histogram_base_key), int(histogram_shift), int(n_bins), int(n_fine),
            int(coarse_shift), bool(clear_gradient), _stream(device), 0, 0,
            device_counts=counts.data_ptr())
    return counts[:n_bins]


def threshold_indices_on_device(x: Any, begin: int, end: int, threshold_key: int,
                                capacity: int) -> tuple[Any, Any]:
    """`threshold_indices` into room for `capacity` entries, with no wait for the count (torch
    tensors only): (indices: a tensor of `capacity` entries whose first `count` are the sorted
    selection, count: an int64 tensor of one value on x's device). The caller brings the count
    to the host (`read_to_host`, with others) and takes `selected_indices(indices, count)`,
    which raises if the capacity was not a bound. On the CUDA side one read of the range, and
    CUB leaves the count in device memory."""
    import torch

    if framework_of(x) != "torch":
        raise TypeError("threshold_indices_on_device takes torch tensors")
    capacity = min(check_count(capacity), max(0, int(end) - int(begin)))
    dtype = _torch_index_dtype(x.numel())
    if not (is_cuda(x) and cuda_built):
        chosen = threshold_indices(x, begin, end, threshold_key)
        indices = torch.zeros(capacity, dtype=dtype, device=x.device)
        kept = min(int(chosen.numel()), capacity)
        indices[:kept] = chosen[:kept]
        return indices, torch.tensor([int(chosen.numel())], dtype=torch.int64, device=x.device)
    _cuda_check(x, "x", x.device)
    _check_range(begin, end, x.numel())
    indices = torch.empty(capacity, dtype=dtype, device=x.device)
    count = torch.empty(1, dtype=torch.int64, device=x.device)
    with _on_device(x.device):
        value_type, index_type = _cuda_value_type(x.dtype), _cuda_index_type(dtype)
        workspace = _workspace(_C.cuda_threshold_indices_workspace_bytes(
            value_type, index_type, int(end) - int(begin)), x.device)
        _C.cuda_threshold_indices(value_type, index_type, x.data_ptr(), x.numel(), int(begin),
                                  int(end), int(threshold_key), indices.data_ptr(), capacity,
                                  _stream(x.device), workspace.data_ptr(), workspace.numel(),
                                  device_count=count.data_ptr())
    return indices, count


def selected_indices(indices: Any, count: int) -> Any:
    """The first `count` of `threshold_indices_on_device`'s indices; RuntimeError if its
    capacity was below the count (a bound that was not one: the kernel wrote only the first
    capacity)."""
    if count > _length(indices):
        raise RuntimeError(f"gtopk_hvd: threshold_indices selected {count} entries, more than "
                           f"the bound at_most={_length(indices)}")
    return indices[:count]


def read_to_host(tensors: Any) -> tuple[np.ndarray, ...]:
    """The values of several small tensors of one device on the host, as numpy arrays of their
    shapes and dtypes (integer, float32 or float64), with one wait for them all: on a GPU each
    is copied into pinned memory without a wait, then the current stream is waited for once,
    however many tensors (a bucket's counts and sums, read with the other buckets'). numpy
    arrays are returned as they are."""
    tensors = list(tensors)
    on_gpu = [t for t in tensors if is_cuda(t)]
    if not on_gpu:
        return tuple(t if isinstance(t, np.ndarray) else t.detach().cpu().numpy().copy()
                     for t in tensors)
    import torch

    hosts = [t if isinstance(t, np.ndarray) else
             torch.empty(tuple(t.shape), dtype=t.dtype, pin_memory=True) for t in tensors]
    for host, tensor in zip(hosts, tensors):
        if host is not tensor:
            host.copy_(tensor.detach(), non_blocking=True)
    torch.cuda.current_stream(on_gpu[0].device).synchronize()
    return tuple(host if isinstance(host, np.ndarray) else host.numpy() for host in hosts)


def histogram_count_from(histogram: np.ndarray, base_key: int, shift: int, n_bins: int,
                         threshold_key: int, n_fine: int = -1,
                         coarse_shift: int = 0) -> int | None:
    """An upper bound of #{i : key(x[i]) >= threshold_key} from the histogram of x that
    `accumulate_threshold` counted (its bins: `histogram_bin`): the sum of the bins from
    threshold_key's on, since the bin is non-decreasing in the key. None where threshold_key
    is below base_key (entries there are not counted)."""
    if threshold_key < base_key:
        return None
    first = int(histogram_bin(np.int64(threshold_key - base_key), shift, n_bins, n_fine,
                              coarse_shift))
    return int(np.asarray(histogram, np.int64)[first:].sum())


def threshold_histogram(x: Any, begin: int, end: int, base_key: int, shift: int, n_bins: int,
                        n_fine: int = -1, coarse_shift: int = 0) -> np.ndarray:
    """The histogram of `accumulate_threshold` over x[begin:end) without accumulating: one read
    of the range by the same kernel (float32 / float64, numpy or torch), no temporary."""
    no_selection = (1 << (8 * _itemsize(x))) - 1  # above every key: nothing is selected
    return accumulate_threshold(None, x, begin, end, no_selection, base_key, shift, n_bins,
                                n_fine=n_fine, coarse_shift=coarse_shift)[1]


def _itemsize(x: Any) -> int:
    return x.element_size() if framework_of(x) == "torch" else x.dtype.itemsize


def keep_at_or_above(x: Any, indices: Any, threshold_key: int) -> Any:
    """The entries of `indices` (sorted) where magnitude_key(x) >= threshold_key (numpy or
    torch, float32)."""
    if is_cuda(x):
        return indices[_torch_keys(x[indices]) >= threshold_key]
    host = as_numpy(x, "x").array
    keys = host[as_numpy(indices, "indices", values=False).array].view(np.uint32)
    np.bitwise_and(keys, np.uint32(0x7FFFFFFF), out=keys)  # a NaN's key stays above every number
    kept = as_numpy(indices, "indices", values=False).array[keys >= np.uint32(threshold_key)]
    return kept if isinstance(indices, np.ndarray) else __import__("torch").from_numpy(kept)


def magnitude_histogram(x: Any, begin: int, end: int, base_key: int, shift: int,
                        n_bins: int) -> np.ndarray:
    """The histogram of `accumulate_threshold` over x[begin:end) without accumulating, all bins
    fine (float32 / float64, numpy or torch): `threshold_histogram`."""
    return threshold_histogram(x, begin, end, base_key, shift, n_bins)


def largest_finite_magnitude(x: Any, begin: int = 0, end: int | None = None,
                             plus: Any = None) -> float:
    """max |x[i] + plus[i]| (|x[i]| when plus is None) over the finite sums, i in [begin, end)
    (end None: x's length); 0.0 if none. float32 / float64, numpy or torch (x and plus alike,
    contiguous): one read by the max-key kernel (`_C.max_key`, `_C.cuda_max_key`), no
    temporary; the sum is rounded to x's dtype as `x + plus` would be."""
    end = _length(x) if end is None else end
    _check_range(begin, end, _length(x))
    if is_cuda(x) and not cuda_built:
        return _torch_largest_finite(x[begin:end], None if plus is None else plus[begin:end])
    view = x if is_cuda(x) else as_numpy(x, "x")
    dtype = np.float64 if _itemsize(x) == 8 else np.float32
    return value_of_key(_max_key(view, begin, end, plus, finite_only=True), dtype)


def _length(x: Any) -> int:
    return x.numel() if framework_of(x) == "torch" else x.size


def _max_key(x: Any, begin: int, end: int, plus: Any = None, finite_only: bool = False) -> int:
    """The largest magnitude key of x[begin:end) (+ plus there): a CUDA tensor, or the
    NumpyView of a host array (plus: of x's type)."""
    if end <= begin:
        return 0
    if not isinstance(x, NumpyView):
        return _cuda_max_key(x, begin, end, plus, finite_only)
    other = None if plus is None else as_numpy(plus, "plus").array[begin:end]
    if plus is None and not finite_only and x.value_type in _FAST_VALUE_TYPES.values():
        return int(_C.read_pass(x.array[begin:end]))  # the vectorised read
    return int(_C.max_key(x.array[begin:end], other, finite_only, x.value_type))


def _torch_largest_finite(x: Any, plus: Any) -> float:
    """`largest_finite_magnitude` as torch operations in blocks of 2^20 entries (CUDA tensors
    of a build without the CUDA kernels): temporaries of a block's size, not x's."""
    import torch

    largest = 0.0
    for start in range(0, x.numel(), _TORCH_BLOCK):
        part = x[start:start + _TORCH_BLOCK]
        if plus is not None:
            part = part + plus[start:start + _TORCH_BLOCK]
        finite = part[torch.isfinite(part)]
        if finite.numel():
            largest = max(largest, float(finite.abs().max()))
    return largest


_TORCH_BLOCK = 1 << 20


def magnitude_key(value: float, dtype: Any = np.float32) -> int:
    """The kernels' magnitude key of one value of `dtype` (float32 / float64): its bits with
    the sign cleared, every NaN mapped to one key above +Inf (gtopk/magnitude_order.h)."""
    if np.dtype(dtype) == np.float64:
        bits = int(np.array([value], np.float64).view(np.uint64)[0]) & 0x7FFFFFFFFFFFFFFF
        return min(bits, 0x7FF0000000000001)
    bits = int(np.array([value], np.float32).view(np.uint32)[0]) & 0x7FFFFFFF
    return min(bits, 0x7F800001)


def value_of_key(key: int, dtype: Any = np.float32) -> float:
    """The non-negative value whose magnitude key is `key` (the inverse of magnitude_key)."""
    if np.dtype(dtype) == np.float64:
        return float(np.array([key], np.uint64).view(np.float64)[0])
    return float(np.array([key], np.uint32).view(np.float32)[0])


def _torch_index_dtype(d: int) -> Any:
    """index_dtype_for(d) as a torch dtype."""
    import torch

    return getattr(torch, index_dtype_for(d).__name__)


def _torch_keys(x: Any) -> Any:
    """magnitude_key of every entry of a float32 / float64 tensor, as int64."""
    import torch

    wide = x.dtype == torch.float64
    keys = x.view(torch.int64 if wide else torch.int32).to(torch.int64)
    keys = keys & (0x7FFFFFFFFFFFFFFF if wide else 0x7FFFFFFF)
    return keys.clamp(max=0x7FF0000000000001 if wide else 0x7F800001)


def _torch_threshold_indices(x: Any, begin: int, end: int, threshold_key: int) -> Any:
    """`threshold_indices` as torch operations, in blocks of _TORCH_BLOCK entries."""
    import torch

    parts = [torch.nonzero(_torch_keys(x[start:min(start + _TORCH_BLOCK, end)])
                           >= threshold_key).reshape(-1) + start
             for start in range(begin, end, _TORCH_BLOCK)]
    indices = torch.cat(parts) if parts else torch.empty(0, dtype=torch.int64, device=x.device)
    return indices.to(_torch_index_dtype(x.numel()))


def _torch_accumulate_threshold(gradient: Any, residual: Any, begin: int, end: int,
                                threshold_key: int, histogram_base_key: int,
                                histogram_shift: int, n_bins: int, clear_gradient: bool,
                                n_fine: int = -1, coarse_shift: int = 0
                                ) -> tuple[Any, np.ndarray]:
    """`accumulate_threshold` as torch operations (tensors on any one device), the range in
    blocks of _TORCH_BLOCK entries: temporaries of a block's size, not the range's; the
    histogram summed on the device and brought to the host once."""
    import torch

    if gradient is not None:
        residual += gradient
    if clear_gradient:
        gradient.zero_()
    histogram = torch.zeros(n_bins, dtype=torch.int64, device=residual.device)
    selected = max(threshold_key, histogram_base_key)
    parts = []
    for start in range(begin, end, _TORCH_BLOCK):
        keys = _torch_keys(residual[start:min(start + _TORCH_BLOCK, end)])
        counted = keys[keys >= histogram_base_key]
        bins = histogram_bin(counted - histogram_base_key, histogram_shift, n_bins, n_fine,
                             coarse_shift)
        histogram += torch.bincount(bins, minlength=n_bins)
        parts.append(torch.nonzero(keys >= selected).reshape(-1) + start)
    index_dtype = _torch_index_dtype(residual.numel())
    indices = torch.cat(parts) if parts else torch.empty(0, dtype=torch.int64,
                                                        device=residual.device)
    return indices.to(index_dtype), histogram.cpu().numpy()


def sketch_table(gradient: Any, residual: Any, keys: np.ndarray, columns: int,
                 clear_gradient: bool = False, tile_columns: int = 0, skip: Any = None) -> Any:
    """Sketched SGD's count sketch fused with the accumulation (gtopk/count_sketch.h):

        residual += gradient                        (gradient = 0 too if clear_gradient)
        table[j, b] = S[j, b] = sum over i with h_j(i) = b of s_j(i) residual[i]

    keys: (rows, 2) uint32 on the host (1 <= rows <= 64), the hash keys of each row: h_j(i) =
    (word(i, key0_j) columns) >> 32, s_j(i) = -1 iff word(i, key1_j) >> 31, word(i, key) =
    mix32(lo32(i) ^ key ^ mix32(hi32(i))). The sums are exact integer sums of rint(residual[i]
    2^s), s = 62 - ceil(log2 d) - E (every finite |residual| < 2^E, E >= -126), each rounded
    once to float32 (float64(sum) 2^-s, then float32): the table does not depend on threads,
    tiles or device. A bucket with a NaN term, or with +Inf and -Inf terms, is NaN; with one
    infinity, that infinity. float32 only; returns a (rows, columns) float32 array of the
    residual's kind (numpy, or a torch tensor on its device). CPU: two passes over d (one
    write), rows scattered adds per entry. CUDA: one pass over d, then the table in tiles of at
    most tile_columns columns of one row (0: as many as half the L2 cache holds as int64 sums),
    one read of d and one tile's sums of workspace each; tile_columns never changes the result
    (the CPU ignores it). gradient None: the sketch of the residual as it is (a read instead of
    the accumulation; clear_gradient ignored). skip: as `accumulate_select`'s (when set, the
    sketch of the residual as it is, left so, the gradient still cleared if asked; the CUDA
    kernel reads the flag, elsewhere it is read here).
    """
    columns = int(columns)
    if gradient is None:
        clear_gradient = False
    if is_cuda(residual) or (gradient is not None and is_cuda(gradient)):
        return _cuda_sketch_table(gradient, residual, keys, columns, clear_gradient,
                                  int(tile_columns), skip)
    if skip is not None and skipped_here(skip, gradient, clear_gradient):
        gradient, clear_gradient = None, False
    gradient_array = None
    if gradient is not None:
        gradient_array = as_numpy(gradient, "gradient", writeable=clear_gradient).array
    residual_view = as_numpy(residual, "residual", writeable=gradient is not None)
    table = _C.sketch_table(gradient_array, residual_view.array, _host_keys(keys), columns,
                            bool(clear_gradient))
    return like(table, residual_view)


def sketch_select(table: Any, keys: np.ndarray, k: int, estimate: Any = None,
                  d: int | None = None) -> tuple[Any, Any]:
    """The count sketch's heavy hitters: for every i < d

        est(i) = median over rows j of s_j(i) table[j, h_j(i)]

    (odd rows: the middle value; even: (lo + hi) / 2 in float32; NaN if any row value is NaN;
    a zero median is +0.0), then the top-min(k, d) of est by magnitude in the selection order
    above: (indices, values = est there), sorted by index. table: (rows, columns) float32 (the
    all-reduced S of `sketch_table`), keys as there.

    estimate: a writeable float32 buffer of d values on the table's device, filled with est (for
    checks and tools), or None; d: the entries (default: estimate's size). With None nothing
    of d entries is stored. CPU: a threshold sampled from the estimates, then one pass that reads
    a bit per row for every entry (|S[j, h_j(i)]| at or above it) and computes est(i) only where
    half the rows have their bit set (no other entry can reach the threshold); if the guess
    misses, or the table holds a non-finite value, the estimates go to a temporary buffer and
    the selection runs over it. CUDA (a CUDA table): the selection's passes compute est(i) from
    the table as they read entry i; a given estimate is filled besides (one more pass). The
    kernel's bitmap filter (cuda_ops.h) is not used: on the GPU it made pass 1 slower, not
    faster (docs/results.md, run 9).
    """
    k = check_count(k)
    columns = _table_columns(table)
    if estimate is not None:
        if d is not None and int(d) != estimate.shape[0]:
            raise ValueError(f"d = {d} but the estimate buffer holds {estimate.shape[0]} values")
        d = int(estimate.shape[0])
    if d is None or int(d) < 0:
        raise ValueError(f"sketch_select needs d >= 0 or an estimate buffer of d values, got "
                         f"d = {d}")
    d = int(d)
    if is_cuda(table) or (estimate is not None and is_cuda(estimate)):
        if estimate is not None:
            _cuda_sketch_estimate(table, keys, columns, estimate)
        return _cuda_sketch_select(table, keys, columns, k, d, estimate)
    table_view = as_numpy(table, "table")
    estimate_view = None if estimate is None else as_numpy(estimate, "estimate", writeable=True)
    indices, values = _C.sketch_select(table_view.array, _host_keys(keys), columns,
                                       None if estimate_view is None else estimate_view.array, k, d)
    like_view = table_view if estimate_view is None else estimate_view
    return like(indices, like_view), like(values, like_view)


def sketch_estimate(table: Any, keys: np.ndarray, estimate: Any) -> Any:
    """estimate[i] = est(i) for every i (`sketch_select` without the selection); returns
    estimate."""
    if is_cuda(estimate):
        _cuda_sketch_estimate(table, keys, _table_columns(table), estimate)
    else:
        sketch_select(table, keys, 0, estimate)
    return estimate


def _host_keys(keys: Any) -> np.ndarray:
    """The sketch's keys as the kernels take them (the bindings check dtype and shape)."""
    return np.ascontiguousarray(_to_numpy_any(keys))


def _table_columns(table: Any) -> int:
    if len(table.shape) != 2:
        raise ValueError(f"the table must have shape (rows, columns), got {tuple(table.shape)}")
    return int(table.shape[1])


def merge_topk(index_a: Any, value_a: Any, index_b: Any, value_b: Any, k: int,
               out: tuple[Any, Any] | None = None) -> tuple[Any, Any]:
    """Merge two sparse sets and re-select: top-k of union(a, b) with values summed where an
    index is in both. Inputs index-sorted with unique indices; float32 / float64 values.
    Symmetric: merge_topk(a, b) equals merge_topk(b, a) bit for bit (a NaN sum is canonical).

    out: (indices, values) arrays of at least min(k, len(a) + len(b)) entries, of the inputs'
    dtypes, to write the result into (no allocation); the result is then their first n entries.
    """
    k = check_count(k)
    if _plain_numpy(index_a, value_a, index_b, value_b, *(out or ())):  # the reduction's case
        return _C.merge_topk(index_a, value_a, index_b, value_b, k,
                             _FAST_VALUE_TYPES.get(value_a.dtype.char, "unsupported"),
                             *(out or (None, None)))
    if is_cuda(value_a):
        return _cuda_merge_topk(index_a, value_a, index_b, value_b, k, out)
    ia, va = as_numpy(index_a, "index_a", values=False), as_numpy(value_a, "value_a")
    ib, vb = as_numpy(index_b, "index_b", values=False), as_numpy(value_b, "value_b")
    out_index = out_value = None
    if out is not None:
        out_index = as_numpy(out[0], "out indices", values=False, writeable=True).array
        out_value = as_numpy(out[1], "out values", writeable=True).array
    indices, values = _C.merge_topk(ia.array, va.array, ib.array, vb.array, k, va.value_type,
                                    out_index, out_value)
    return like(indices, va), like(values, va)


# numpy's one-letter dtype codes (dtype.name builds a string: 4 us a call, as much as a merge
# of a few hundred entries): float32, float64, and the integer codes of int32 / int64.
_FAST_VALUE_TYPES = {"f": "float32", "d": "float64"}
_FAST_CODES = frozenset("fdilq")


def _plain_numpy(*arrays: Any) -> bool:
    """All 1-D numpy arrays of float32/float64/integer dtype: the kernel takes them as they are
    (it checks contiguity, dtypes and order itself), without the views of the general path."""
    return all(type(a) is np.ndarray and a.ndim == 1 and a.dtype.char in _FAST_CODES
               for a in arrays)


def add_divided(target: Any, source: Any, divisor: float) -> None:
    """target += source / divisor in place, rounded as the two whole-array operations (a float32
    division, then the sum) would be, bit for bit, without a temporary of source's size: torch:
    one addcdiv_ (target + 1 * source / divisor, one pass); numpy: through a scratch block of
    max(2^12, n / 256) values. 1-D, one length and dtype, one device."""
    if divisor == 1.0:
        target += source
        return
    divisor = np.float32(divisor)
    if framework_of(source) == "torch":
        import torch

        target.addcdiv_(source, torch.tensor(divisor, device=source.device))
        return
    n = len(source)
    block = max(_DIVIDE_BLOCK, -(-n // 256))
    scratch = np.empty(min(block, n), source.dtype)
    for start in range(0, n, block):
        part = scratch[:min(block, n - start)]
        np.divide(source[start:start + block], divisor, out=part)
        target[start:start + block] += part


_DIVIDE_BLOCK = 1 << 12


def momentum_update(velocity: Any, gradient: Any, momentum: float, divisor: float = 1.0,
                    skip: Any = None) -> None:
    """Momentum correction's velocity (DGC), in place:

        velocity = momentum * velocity + gradient / divisor

    rounded as `velocity *= float32(momentum)` then `add_divided(velocity, gradient, divisor)`
    round it (a product, a quotient when divisor != 1, a sum), bit for bit on every device.
    CUDA (float32, contiguous, one device, built kernels): `_C.cuda_momentum_update`, one pass
    (a read of each, a write of the velocity), no host wait. Otherwise those two operations.
    skip: as `accumulate_select`'s (when set, the velocity is left as it is)."""
    if (is_cuda(velocity) and cuda_built and dtype_name(velocity.dtype) == "float32"
            and velocity.is_contiguous() and gradient.is_contiguous()):
        _cuda_check_pair(gradient, velocity)
        with _on_device(velocity.device):
            _C.cuda_momentum_update(_cuda_value_type(velocity.dtype), velocity.data_ptr(),
                                    gradient.data_ptr(), velocity.numel(),
                                    float(np.float32(momentum)), float(np.float32(divisor)),
                                    _stream(velocity.device), _flag_address(skip, velocity))
        return
    if skip is not None and flag_set(skip):  # a CUDA tensor here reads its flag: a wait
        return
    velocity *= np.float32(momentum)
    add_divided(velocity, gradient, divisor)


def write_sparse(dest: Any, indices: Any, values: Any, skip: Any = None,
                 zeroed: bool = False) -> None:
    """dest = 0 except dest[indices] = values, in one pass over dest (in place).

    indices sorted and unique, values of dest's dtype (float32 / float64). skip: as
    `accumulate_select`'s: when set, dest is all NaN instead (on a GPU the fill value is chosen
    on the device: the same one pass, no host wait). zeroed: dest is known to hold zeros already
    (e.g. the gradient the step has cleared): on a GPU the zero fill is left out, so the write is
    the scatter of the set alone (and, with a skip flag, a launch that fills NaN only if set).
    CUDA (contiguous float32 / float64, built kernels): `_C.cuda_write_sparse`, one call."""
    if is_cuda(dest):
        import torch

        values = torch.as_tensor(values, device=dest.device)
        indices = torch.as_tensor(indices, device=dest.device)
        if _sparse_kernels_take(dest, indices, values):
            _cuda_check(indices, "indices", dest.device)
            with _on_device(dest.device):
                _C.cuda_write_sparse(_cuda_value_type(dest.dtype),
                                     _cuda_index_type(indices.dtype), dest.data_ptr(),
                                     dest.numel(), indices.data_ptr(), values.data_ptr(),
                                     indices.numel(), bool(zeroed), _stream(dest.device),
                                     _flag_address(skip, dest))
            return
        if skip is None:
            dest.zero_()
        else:
            skipping = skip.reshape(()) != 0  # a fill kernel each, no copy from the host:
            nan = torch.full((), float("nan"), dtype=dest.dtype, device=dest.device)
            dest.copy_(torch.where(skipping, nan, torch.zeros_like(nan)).expand_as(dest))
            values = torch.where(skipping, nan, values)
        dest[indices.long()] = values
        return
    if skip is not None and flag_set(skip):
        dest[:] = float("nan")
        return
    dest_view = as_numpy(dest, "dest", writeable=True)
    index_view = as_numpy(indices, "indices", values=False)
    value_view = as_numpy(values, "values")
    _C.write_sparse(dest_view.array, index_view.array, value_view.array, value_view.value_type)


def _sparse_kernels_take(x: Any, indices: Any, values: Any = None,
                         same_indices: tuple[Any, ...] = ()) -> bool:
    """Whether the CUDA kernels at a set (write_sparse, restore_unselected, take_at, zero_at)
    take these tensors: built kernels; x contiguous float32 / float64; values, if given,
    contiguous of x's dtype, one per index; indices and each of same_indices contiguous int32 /
    int64 CUDA tensors of one dtype."""
    index_sets = (indices, *same_indices)
    return (cuda_built and dtype_name(x.dtype) in ("float32", "float64") and x.is_contiguous()
            and dtype_name(indices.dtype) in ("int32", "int64")
            and all(is_cuda(i) and i.dtype == indices.dtype and i.is_contiguous()
                    for i in index_sets)
            and (values is None or (values.dtype == x.dtype and values.is_contiguous()
                                    and values.numel() == indices.numel())))


def restore_unselected(residual: Any, indices: Any, values: Any, selected: Any,
                       skip: Any = None) -> None:
    """residual[indices[j]] += values[j] for each j whose index is not in `selected` (in place):
    what was sent and not kept globally goes back to the residual. indices: a worker's
    index-sorted set; selected: the global set's indices, sorted, of the same index dtype.
    `restore_residual` with the mask `not mark_survivors(indices, selected)`, bit for bit.
    skip: as `accumulate_select`'s (nothing is restored when set). CUDA (contiguous float32 /
    float64, built kernels): `_C.cuda_restore_unselected`, one launch (a binary search per
    entry), no host wait; elsewhere the mask, then the restore."""
    if is_cuda(residual) and _sparse_kernels_take(residual, indices, values, (selected,)):
        for tensor, what in ((indices, "indices"), (values, "values"), (selected, "selected")):
            _cuda_check(tensor, what, residual.device)
        with _on_device(residual.device):
            _C.cuda_restore_unselected(_cuda_value_type(residual.dtype),
                                       _cuda_index_type(indices.dtype), residual.data_ptr(),
                                       indices.data_ptr(), values.data_ptr(), indices.numel(),
                                       selected.data_ptr(), selected.numel(),
                                       _stream(residual.device), _flag_address(skip, residual))
        return
    unselected = ~mark_survivors(indices, selected)
    restore_residual(residual, indices, values, unselected, skip)


def take_at(residual: Any, indices: Any, taken: tuple[Any, Any] | None = None,
            skip: Any = None) -> Any:
    """The accumulated values at a global set, taken out of the residual (in place):

        values[j] = residual[indices[j]] (+ taken_values[m] where taken_indices[m] == indices[j])
        residual[indices] = 0                        (left as it is when the skip flag is set)

    Returns values, residual's dtype, where residual lives. indices: sorted, distinct; taken =
    (taken_indices, taken_values): entries already taken out of this residual (standing in for
    it there), index-sorted, distinct, indices of `indices`' dtype; entries of taken not in
    indices are ignored. Each value found in taken is one rounding, residual + taken. skip: as
    `accumulate_select`'s. CUDA (contiguous float32 / float64, built kernels):
    `_C.cuda_take_at`, one launch (a binary search per entry), no host wait; other CUDA tensors:
    a gather, a search and an index add (atomics: float32 subnormal sums flush to zero), then
    `zero_at`; host: numpy."""
    if is_cuda(residual):
        return _cuda_take_at(residual, indices, taken, skip)
    view = as_numpy(residual, "residual", writeable=True)
    if view.value_type not in ("float32", "float64"):
        raise TypeError(f"take_at: the residual must be float32 or float64, got "
                        f"{view.value_type}")
    index = as_numpy(indices, "indices", values=False).array
    values = view.array[index]
    if taken is not None:
        taken_index = as_numpy(taken[0], "taken indices", values=False).array
        taken_values = as_numpy(taken[1], "taken values").array
        if taken_values.dtype != values.dtype:
            raise TypeError(f"take_at: the taken values are {taken_values.dtype}, the residual "
                            f"{values.dtype}")
        position = np.searchsorted(index, taken_index)
        inside = position < index.size
        inside[inside] = index[position[inside]] == taken_index[inside]
        with np.errstate(invalid="ignore", over="ignore"):  # Inf - Inf is NaN, as on a GPU
            values[position[inside]] += taken_values[inside]
    if skip is None or not flag_set(skip):
        view.array[index] = 0
    return like(values, view)


def _cuda_take_at(residual: Any, indices: Any, taken: tuple[Any, Any] | None,
                  skip: Any) -> Any:
    """take_at of CUDA tensors (its docstring)."""
    import torch

    n = int(indices.numel())
    if taken is None or not taken[0].numel():
        taken = (indices[:0], residual[:0])
    if _sparse_kernels_take(residual, taken[0], taken[1], (indices,)):
        for tensor, what in ((indices, "indices"), (taken[0], "taken indices"),
                             (taken[1], "taken values")):
            _cuda_check(tensor, what, residual.device)
        values = torch.empty(n, dtype=residual.dtype, device=residual.device)
        with _on_device(residual.device):
            _C.cuda_take_at(_cuda_value_type(residual.dtype), _cuda_index_type(indices.dtype),
                            residual.data_ptr(), indices.data_ptr(), n, taken[0].data_ptr(),
                            taken[1].data_ptr(), taken[0].numel(), values.data_ptr(),
                            _stream(residual.device), _flag_address(skip, residual))
        return values
    # Entries taken but not in indices go to a spare slot past the end: nothing waits for a count.
    values = torch.empty(n + 1, dtype=residual.dtype, device=residual.device)
    torch.index_select(residual, 0, indices, out=values[:n])
    if taken[0].numel() and n:
        position = torch.searchsorted(indices, taken[0])
        found = indices[position.clamp(max=n - 1)] == taken[0]
        values.index_add_(0, torch.where(found, position, n), taken[1])
    zero_at(residual, indices, skip)
    return values[:n]


def restore_residual(residual: Any, indices: Any, values: Any, restore: Any,
                     skip: Any = None) -> None:
    """residual[indices[j]] += values[j] wherever restore[j] is true (in place); nowhere when
    the skip flag (as `accumulate_select`'s) is set: on a GPU the mask is cut on the device."""
    if skip is not None:
        if is_cuda(residual):
            import torch

            restore = torch.as_tensor(restore, device=residual.device) & (
                skip.reshape(()) == 0)
        elif flag_set(skip):
            return
    if is_cuda(residual):
        _cuda_restore_residual(residual, indices, values, restore)
        return
    residual_view = as_numpy(residual, "residual", writeable=True)
    index_view = as_numpy(indices, "indices", values=False)
    value_view = as_numpy(values, "values")
    restore_mask = np.ascontiguousarray(_to_numpy_any(restore), dtype=np.uint8).reshape(-1)
    _C.restore_residual(residual_view.array, index_view.array, value_view.array, restore_mask,
                        value_view.value_type)


def mark_survivors(local_indices: Any, global_indices: Any) -> Any:
    """Boolean mask over the index-sorted local set: local_indices[j] is in global_indices
    (sorted too). A numpy array; for CUDA tensors a bool tensor on their device."""
    if _plain_numpy(local_indices, global_indices):
        return _C.mark_survivors(local_indices, global_indices).view(np.bool_)
    if is_cuda(local_indices) and is_cuda(global_indices):
        return _cuda_mark_survivors(local_indices, global_indices)
    local = as_numpy(_to_cpu(local_indices), "local_indices", values=False)
    global_ = as_numpy(_to_cpu(global_indices), "global_indices", values=False)
    return _C.mark_survivors(local.array, global_.array).view(np.bool_)


_FIRST_NONFINITE_KEY = {"float32": 0x7F800000, "float64": 0x7FF0000000000000,
                        "float16": 0x7C00, "bfloat16": 0x7F80}
"""The magnitude key of +Inf of each value type; NaN's keys are above it
(gtopk/magnitude_order.h)."""


def all_finite(x: Any) -> bool:
    """Whether x holds no NaN and no +-Inf, i.e. its largest magnitude key is below +Inf's.

    One contract on numpy arrays and torch tensors, CPU and CUDA: for a contiguous x of
    float32 / float64 / float16 / bfloat16, one read of x and no temporary of its size (host:
    `_C.read_pass`, vectorised, for float32 / float64, `_C.max_key` for the 16-bit types; CUDA:
    `_C.cuda_max_key`, cub::DeviceReduce over the keys). Otherwise (strided, other dtypes, CUDA
    tensors of a build without the CUDA kernels): isfinite(x).all() of x's framework, which
    makes temporaries of x's size."""
    name = dtype_name(x.dtype)
    if name in _FIRST_NONFINITE_KEY and _contiguous(x) and (cuda_built or not is_cuda(x)):
        view = x.reshape(-1) if is_cuda(x) else as_numpy(x, "x")
        n = x.numel() if is_cuda(x) else view.array.size
        return _max_key(view, 0, n) < _FIRST_NONFINITE_KEY[name]
    if framework_of(x) == "torch":
        import torch

        return bool(torch.isfinite(x).all())
    return bool(np.isfinite(np.asarray(x)).all())


def mark_nonfinite(x: Any, flag: Any) -> None:
    """flag[0] := 1 if x holds a NaN or +-Inf; flag left as it is otherwise (so one flag
    gathers the answer for several tensors, read once: `all_finite` without the host read).

    flag: one int32 value where x is: a torch tensor on x's CUDA device, or a numpy array / CPU
    tensor for a host x. CUDA (contiguous float32 / float64 / float16 / bfloat16, built
    kernels): `_C.cuda_mark_nonfinite`, the read of `all_finite` (cub::DeviceReduce over the
    keys, no temporary of x's size) then a one-thread compare writing the flag, both enqueued
    on the current stream: no copy to the host, no wait. Other CUDA tensors: isfinite(x).all()
    on the device (temporaries of x's size, no wait). Host x: `all_finite` (its read)."""
    if not is_cuda(x):
        if not all_finite(x):
            flag[:] = 1  # a slice: a fill where the flag lives (flag[0] = 1 copies from the host)
        return
    import torch

    _check_flag(flag, x, "flag")
    name = dtype_name(x.dtype)
    if not (cuda_built and name in _FIRST_NONFINITE_KEY and x.is_contiguous()):
        flag.copy_(torch.maximum(flag, (~torch.isfinite(x).all()).to(torch.int32).reshape(1)))
        return
    _cuda_check(flag, "flag", x.device)
    with _on_device(x.device):
        value_type, n = _cuda_value_type(x.dtype), x.numel()
        workspace = _workspace(_C.cuda_max_key_workspace_bytes(value_type, n), x.device)
        _C.cuda_mark_nonfinite(value_type, x.data_ptr(), n, flag.data_ptr(), _stream(x.device),
                               workspace.data_ptr(), workspace.numel())


def nonfinite_flag(like: Any) -> Any:
    """A cleared flag for `mark_nonfinite` where `like` lives: one int32 zero (a numpy array
    for a numpy `like`, else a torch tensor of like's kind on its device)."""
    if framework_of(like) != "torch":
        return np.zeros(1, dtype=np.int32)
    import torch

    return like.new_zeros(1, dtype=torch.int32)


def flag_set(flag: Any) -> bool:
    """Whether a skip / non-finite flag (one int32: numpy, or a torch tensor) is nonzero, read on
    the host (a CUDA flag waits for its stream: `read_flag`)."""
    return read_flag(flag) != 0


def skipped_here(skip: Any, gradient: Any, clear_gradient: bool) -> bool:
    """Whether the skip flag is set, read on the host, for the fused kernels' host side: a
    skipped step still clears the gradient if asked (gradient[:] = 0), as the kernels do."""
    if not flag_set(skip):
        return False
    if clear_gradient and gradient is not None:
        gradient[:] = 0
    return True


def zero_at(x: Any, indices: Any, skip: Any = None) -> None:
    """x[indices] = 0 in place (indices may repeat); left as it is where the skip flag (as
    `accumulate_select`'s) is set. CUDA (contiguous float32 / float64, contiguous int32 / int64
    indices there, built kernels): `_C.cuda_zero_at`, one launch reading the flag, no host
    wait; other CUDA tensors: with a flag a gather and a scatter of len(indices) values chosen
    on the device. On a torch tensor the zero is made where x lives: a Python 0.0 put at tensor
    indices is copied from the host, and on a GPU that copy waits for the stream (torch's
    index_put_)."""
    if is_cuda(x) and _sparse_kernels_take(x, indices):
        _cuda_check(indices, "indices", x.device)
        with _on_device(x.device):
            _C.cuda_zero_at(_cuda_value_type(x.dtype), _cuda_index_type(indices.dtype),
                            x.data_ptr(), indices.data_ptr(), indices.numel(), _stream(x.device),
                            _flag_address(skip, x))
        return
    if skip is not None and is_cuda(x):  # chosen on the device
        import torch

        zero = torch.zeros((), dtype=x.dtype, device=x.device)
        x[indices] = torch.where(skip.reshape(()) != 0, x[indices], zero)
        return
    if skip is not None and flag_set(skip):
        return
    if framework_of(x) == "torch":
        import torch

        x[indices] = torch.zeros((), dtype=x.dtype, device=x.device)
    else:
        x[indices] = 0.0


class LaterFlag:
    """A flag's value brought to the host without waiting now: on a GPU its copy into pinned
    memory is enqueued where the flag is written, with an event after it; `value()` waits for
    that event only (long done when read an iteration later). A host flag is read at `value()`
    (nothing writes a flag once it is handed over)."""

    __slots__ = ("_event", "_host", "_value")

    def __init__(self, flag: Any) -> None:
        self._value: int | None = None
        self._host, self._event = flag, None
        if not is_cuda(flag):
            return
        import torch

        self._host = torch.empty(1, dtype=torch.int32, pin_memory=True)
        self._host.copy_(flag.reshape(1), non_blocking=True)
        self._event = torch.cuda.Event()
        self._event.record(torch.cuda.current_stream(flag.device))

    def value(self) -> int:
        """The flag's value (waits for its copy the first time, if that is not done yet)."""
        if self._value is None:
            if self._event is not None:
                self._event.synchronize()
            self._value = int(self._host.reshape(-1)[0])
            self._host = self._event = None
        return self._value

    @property
    def read(self) -> bool:
        """Whether `value()` has brought the flag to the host yet."""
        return self._value is not None


def read_flag(flag: Any) -> int:
    """A `mark_nonfinite` flag's value on the host: the one host read of the flags' scheme.
    CUDA: copied into pinned memory, then one wait for the current stream (which the marks
    were enqueued on); host: read as it is."""
    if not is_cuda(flag):
        return int(flag[0])
    import torch

    host = torch.empty(1, dtype=torch.int32, pin_memory=True)
    host.copy_(flag.reshape(1), non_blocking=True)
    torch.cuda.current_stream(flag.device).synchronize()
    return int(host[0])


def _contiguous(x: Any) -> bool:
    framework = framework_of(x)
    if framework == "torch":
        return x.is_contiguous()
    return framework == "tensorflow" or x.flags.c_contiguous


def sorted_union(a: Any, b: Any) -> Any:
    """The sorted union of two strictly increasing index arrays of one dtype (int32 / int64),
    each index once. numpy or CPU torch: a linear merge (`_C.sorted_union`), not a sort, which
    refuses unsorted input. CUDA tensors: torch's sort of the concatenation, then
    unique_consecutive, on the device (inputs not checked: a check would read them); the
    union's length is data-dependent, so its allocation waits for the device once."""
    if is_cuda(a) or is_cuda(b):
        return _cuda_sorted_union(a, b)
    view_a, view_b = as_numpy(a, "a", values=False), as_numpy(b, "b", values=False)
    return like(_C.sorted_union(view_a.array, view_b.array), view_a)


def _to_cpu(x: Any) -> Any:
    return x.cpu() if is_cuda(x) else x


def _to_numpy_any(x: Any) -> np.ndarray:
    if isinstance(x, np.ndarray):
        return x
    return _to_cpu(x).numpy()


# ---- CUDA (torch tensors on a GPU) ----------------------------------------------------------


def _require_cuda_build() -> None:
    if not cuda_built:
        raise RuntimeError("gtopk_hvd was built without CUDA kernels (no nvcc when it was built); "
                           "reinstall with a CUDA toolkit on PATH, or move the tensors to the CPU")


def _cuda_check(tensor: Any, what: str, device: Any) -> None:
    if not is_cuda(tensor) or tensor.device != device:
        raise ValueError(f"{what} must be a CUDA tensor on {device}")
    if not tensor.is_contiguous():
        raise ValueError(f"{what} must be contiguous; call .contiguous() first")


def _cuda_check_pair(gradient: Any, residual: Any) -> None:
    """gradient and residual: contiguous CUDA tensors on one device, of one length and dtype."""
    device = gradient.device if is_cuda(gradient) else residual.device
    _cuda_check(gradient, "gradient", device)
    _cuda_check(residual, "residual", device)
    if gradient.numel() != residual.numel() or gradient.dtype != residual.dtype:
        raise ValueError("gradient and residual must have the same length and dtype")


def _cuda_value_type(dtype: Any) -> Any:
    """The kernels' code of a value dtype (_C.ValueType members are named like dtypes)."""
    code = _C.ValueType.__members__.get(dtype_name(dtype))
    if code is None:
        raise TypeError(f"unsupported dtype {dtype}")
    return code


def _cuda_index_type(dtype: Any) -> Any:
    """The kernels' code of an index dtype (_C.IndexType members are named like dtypes)."""
    code = _C.IndexType.__members__.get(dtype_name(dtype))
    if code is None:
        raise TypeError(f"indices must be int32 or int64, got {dtype}")
    return code


def _cuda_outputs(like_values: Any, n: int, d: int,
                  index_dtype: Any = None) -> tuple[Any, Any, Any, Any]:
    """Output tensors for n entries, values like `like_values`; indices of index_dtype_for(d)
    unless index_dtype is given; and the kernels' type codes."""
    import torch

    if index_dtype is None:
        index_dtype = _torch_index_dtype(d)
    value_type = _cuda_value_type(like_values.dtype)
    indices = torch.empty(n, dtype=index_dtype, device=like_values.device)
    values = torch.empty(n, dtype=like_values.dtype, device=like_values.device)
    return indices, values, value_type, _cuda_index_type(index_dtype)


def _workspace(nbytes: int, device: Any) -> Any:
    """Scratch memory of one kernel call from torch's caching allocator (on the current stream,
    the one the call is enqueued on)."""
    import torch

    return torch.empty(nbytes, dtype=torch.uint8, device=device)


def _stream(device: Any) -> int:
    import torch

    return torch.cuda.current_stream(device).cuda_stream


def _on_device(device: Any) -> Any:
    """Makes `device` current for a kernel call: the kernels size their grids for it."""
    import torch

    return torch.cuda.device(device)


def _cuda_topk_abs(x: Any, k: int) -> tuple[Any, Any]:
    _require_cuda_build()
    _cuda_check(x, "x", x.device)
    d = x.numel()
    indices, values, value_type, index_type = _cuda_outputs(x, min(k, d), d)
    with _on_device(x.device):
        workspace = _workspace(_C.cuda_select_workspace_bytes(value_type, index_type, d, k),
                               x.device)
        _C.cuda_topk_abs(value_type, index_type, x.data_ptr(), d, k, indices.data_ptr(),
                         values.data_ptr(), _stream(x.device), workspace.data_ptr(),
                         workspace.numel())
    return indices, values


def _check_flag(flag: Any, like: Any, what: str) -> None:
    """Raises unless `flag` is one int32 on like's device (a torch tensor)."""
    import torch

    if flag.device != like.device or flag.dtype != torch.int32 or flag.numel() != 1:
        raise ValueError(f"{what} must be one int32 on {like.device}, got {flag.dtype} "
                         f"{tuple(flag.shape)} on {flag.device}")


def _flag_address(skip: Any, like: Any) -> int:
    """The device address of a skip flag for the kernels (0: none), checked to be one int32 on
    like's device."""
    if skip is None:
        return 0
    _check_flag(skip, like, "skip")
    return skip.data_ptr()


def _cuda_accumulate_select(gradient: Any, residual: Any, k: int,
                            clear_gradient: bool, skip: Any = None) -> tuple[Any, Any]:
    _require_cuda_build()
    _cuda_check_pair(gradient, residual)
    d = gradient.numel()
    indices, values, value_type, index_type = _cuda_outputs(gradient, min(k, d), d)
    with _on_device(gradient.device):
        workspace = _workspace(_C.cuda_select_workspace_bytes(value_type, index_type, d, k),
                               gradient.device)
        _C.cuda_accumulate_select(value_type, index_type, gradient.data_ptr(),
                                  residual.data_ptr(), d, k, indices.data_ptr(),
                                  values.data_ptr(), _stream(gradient.device),
                                  workspace.data_ptr(), workspace.numel(),
                                  _flag_address(skip, residual))
        if clear_gradient:  # on the same stream, after the kernel has read it
            gradient.zero_()
    return indices, values


def _cuda_segmented_accumulate_select(gradient: Any, residual: Any, offsets: np.ndarray,
                                      ks: np.ndarray, clear_gradient: bool,
                                      skip: Any = None) -> tuple[Any, Any]:
    _require_cuda_build()
    if gradient is None:
        _cuda_check(residual, "residual", residual.device)
    else:
        _cuda_check_pair(gradient, residual)
    d, device = residual.numel(), residual.device
    table, device_table = _segment_tables(offsets, ks, d, device)
    n = int(table[2 * len(ks) + 1])  # out_offsets[S]: the entries selected
    indices, values, value_type, index_type = _cuda_outputs(residual, n, d)
    if d == 0:  # every segment empty: nothing to read (an empty tensor has no address)
        return indices, values
    with _on_device(device):
        workspace = _workspace(
            _C.cuda_segmented_select_workspace_bytes(value_type, index_type, table), device)
        _C.cuda_segmented_accumulate_select(
            value_type, index_type, 0 if gradient is None else gradient.data_ptr(),
            residual.data_ptr(), d, table, device_table.data_ptr(), bool(clear_gradient),
            indices.data_ptr(), values.data_ptr(), _stream(device), workspace.data_ptr(),
            workspace.numel(), _flag_address(skip, residual))
    return indices, values


_SEGMENT_TABLES: dict[tuple[Any, ...], tuple[np.ndarray, Any]] = {}
_SEGMENT_TABLES_KEPT = 16


def _segment_tables(offsets: np.ndarray, ks: np.ndarray, d: int, device: Any
                    ) -> tuple[np.ndarray, Any]:
    """The segments' table (gtopk/segments.h) on the host, and its copy on `device`: made once
    per (device, segments) and kept (the last _SEGMENT_TABLES_KEPT), so a step copies nothing
    to the device."""
    import torch

    key = (str(device), d, offsets.tobytes(), ks.tobytes())
    found = _SEGMENT_TABLES.get(key)
    if found is None:
        table = _C.segment_table(offsets, ks, d)
        found = (table, torch.from_numpy(table).to(device))
        if len(_SEGMENT_TABLES) >= _SEGMENT_TABLES_KEPT:
            _SEGMENT_TABLES.pop(next(iter(_SEGMENT_TABLES)))
        _SEGMENT_TABLES[key] = found
    return found


def _cuda_accumulate_threshold(gradient: Any, residual: Any, begin: int, end: int,
                               threshold_key: int, histogram_base_key: int, histogram_shift: int,
                               n_bins: int, clear_gradient: bool, n_fine: int,
                               coarse_shift: int) -> tuple[Any, np.ndarray]:
    import torch

    if gradient is None:
        _cuda_check(residual, "residual", residual.device)
    else:
        _cuda_check_pair(gradient, residual)  # begin and end: the kernel checks them
    d, device = residual.numel(), residual.device
    value_type = _cuda_value_type(residual.dtype)
    with _on_device(device):
        workspace = _workspace(_C.cuda_accumulate_count_workspace_bytes(int(n_bins)), device)
        count, histogram = _C.cuda_accumulate_count(
            value_type, 0 if gradient is None else gradient.data_ptr(), residual.data_ptr(), d,
            int(begin), int(end), int(threshold_key), int(histogram_base_key),
            int(histogram_shift), int(n_bins), int(n_fine), int(coarse_shift),
            bool(clear_gradient), _stream(device), workspace.data_ptr(), workspace.numel())
        indices = torch.empty(count, dtype=_torch_index_dtype(d), device=device)
        if count:
            _check_written(count, _cuda_threshold_indices_into(
                indices, residual, begin, end, max(int(threshold_key), int(histogram_base_key))))
    return indices, histogram


def _cuda_threshold_indices(x: Any, begin: int, end: int, threshold_key: int,
                            at_most: int | None = None) -> Any:
    """Counts the entries first (a read of [begin, end) by the count kernel), then writes them
    into a tensor of that size: no room for the whole range. With at_most (a bound of the
    count, `threshold_indices`): writes into at_most entries at once, one read, and returns the
    first `written` (the count comes back with the write's own wait)."""
    import torch

    _cuda_check(x, "x", x.device)
    _check_range(begin, end, x.numel())
    with _on_device(x.device):
        if at_most is not None:
            indices = torch.empty(at_most, dtype=_torch_index_dtype(x.numel()), device=x.device)
            written = _cuda_threshold_indices_into(indices, x, begin, end, threshold_key)
            return selected_indices(indices, written)  # raises if the bound was not one
        count = _cuda_count(x, begin, end, threshold_key)
        indices = torch.empty(count, dtype=_torch_index_dtype(x.numel()), device=x.device)
        if count:
            _check_written(count, _cuda_threshold_indices_into(indices, x, begin, end,
                                                               threshold_key))
    return indices


def _cuda_count(x: Any, begin: int, end: int, threshold_key: int) -> int:
    """#{i in [begin, end): magnitude_key(x[i]) >= threshold_key}, by the count kernel without
    accumulating (one bin at the threshold)."""
    workspace = _workspace(_C.cuda_accumulate_count_workspace_bytes(1), x.device)
    count, _ = _C.cuda_accumulate_count(
        _cuda_value_type(x.dtype), 0, x.data_ptr(), x.numel(), int(begin), int(end),
        int(threshold_key), int(threshold_key), 0, 1, -1, 0, False, _stream(x.device),
        workspace.data_ptr(), workspace.numel())
    return int(count)


def _check_written(count: int, written: int) -> None:
    if written != count:  # the kernels' contract broken: say so rather than go on
        raise RuntimeError(f"gtopk_hvd: the threshold pass counted {count} entries and "
                           f"wrote {written}")


def _cuda_max_key(x: Any, begin: int, end: int, plus: Any, finite_only: bool) -> int:
    """`_max_key` of a contiguous CUDA tensor (plus: one of its length, dtype and device)."""
    _require_cuda_build()
    _cuda_check(x, "x", x.device)
    if plus is not None:
        _cuda_check_pair(plus, x)
    value_type, n = _cuda_value_type(x.dtype), end - begin
    first = x.reshape(-1)[begin:end]
    other = 0 if plus is None else plus.reshape(-1)[begin:end].data_ptr()
    with _on_device(x.device):
        workspace = _workspace(_C.cuda_max_key_workspace_bytes(value_type, n), x.device)
        return int(_C.cuda_max_key(value_type, first.data_ptr(), other, n, bool(finite_only),
                                   _stream(x.device), workspace.data_ptr(), workspace.numel()))


def _cuda_threshold_indices_into(out: Any, x: Any, begin: int, end: int,
                                 threshold_key: int) -> int:
    """The kernel of threshold_indices, writing into `out`: the count selected, of which only
    the first out.numel() are written (the kernel writes nothing beyond `out`)."""
    value_type, index_type = _cuda_value_type(x.dtype), _cuda_index_type(out.dtype)
    workspace = _workspace(
        _C.cuda_threshold_indices_workspace_bytes(value_type, index_type, end - begin), x.device)
    return _C.cuda_threshold_indices(value_type, index_type, x.data_ptr(), x.numel(),
                                     int(begin), int(end), int(threshold_key), out.data_ptr(),
                                     out.numel(), _stream(x.device), workspace.data_ptr(),
                                     workspace.numel())


def _check_range(begin: int, end: int, d: int) -> None:
    if not 0 <= begin <= end <= d:
        raise ValueError(f"need 0 <= begin <= end <= d, got begin={begin}, end={end}, d={d}")


def _cuda_merge_topk(index_a: Any, value_a: Any, index_b: Any, value_b: Any, k: int,
                     out: tuple[Any, Any] | None = None) -> tuple[Any, Any]:
    """The CUDA merge, written into `out` (copied there unless its tensors can take the
    kernel's output: contiguous, the inputs' dtypes, on their device, room for the result), else
    into new tensors. With a set of k entries on either side, nothing waits for the device
    (cuda_ops.h)."""
    _require_cuda_build()
    device = value_a.device
    for tensor, what in ((index_a, "index_a"), (value_a, "value_a"), (index_b, "index_b"),
                         (value_b, "value_b")):
        _cuda_check(tensor, what, device)
    if index_a.numel() != value_a.numel() or index_b.numel() != value_b.numel():
        raise ValueError("each set needs as many indices as values")
    if index_a.dtype != index_b.dtype or value_a.dtype != value_b.dtype:
        raise TypeError("sets a and b must have the same index dtype and value dtype")
    n_a, n_b = index_a.numel(), index_b.numel()
    size = min(k, n_a + n_b)
    direct = out is not None and _takes_merge(out, index_a, value_a, size)
    if direct:  # the kernels read both sets before they write the result: out may be either
        indices, values = out
        value_type, index_type = _cuda_value_type(values.dtype), _cuda_index_type(indices.dtype)
    else:
        indices, values, value_type, index_type = _cuda_outputs(value_a, size, n_a + n_b,
                                                                index_a.dtype)
    with _on_device(device):
        workspace = _workspace(
            _C.cuda_merge_topk_workspace_bytes(value_type, index_type, n_a, n_b, k), device)
        n = _C.cuda_merge_topk(value_type, index_type,
                               index_a.data_ptr(), value_a.data_ptr(), n_a, index_b.data_ptr(),
                               value_b.data_ptr(), n_b, k, indices.data_ptr(),
                               values.data_ptr(), _stream(device), workspace.data_ptr(),
                               workspace.numel())
    if out is not None and not direct:
        out[0][:n].copy_(indices[:n])
        out[1][:n].copy_(values[:n])
        indices, values = out
    return indices[:n], values[:n]


def _takes_merge(out: tuple[Any, Any], index_like: Any, value_like: Any, size: int) -> bool:
    """Whether the merge kernel can write into out = (indices, values) directly."""
    return all(is_cuda(t) and t.device == value_like.device and t.is_contiguous()
               and t.numel() >= size for t in out) and (
        out[0].dtype == index_like.dtype and out[1].dtype == value_like.dtype)


def _cuda_mark_survivors(local_indices: Any, global_indices: Any) -> Any:
    """A binary search of each local index in the sorted global set, on the device."""
    import torch

    if global_indices.numel() == 0:
        return torch.zeros(local_indices.numel(), dtype=torch.bool, device=local_indices.device)
    position = torch.searchsorted(global_indices, local_indices)
    position.clamp_(max=global_indices.numel() - 1)
    return global_indices[position] == local_indices


def _cuda_restore_residual(residual: Any, indices: Any, values: Any, restore: Any) -> None:
    import torch

    _require_cuda_build()
    device = residual.device
    for tensor, what in ((residual, "residual"), (indices, "indices"), (values, "values")):
        _cuda_check(tensor, what, device)
    mask = torch.as_tensor(restore, device=device).to(torch.uint8).contiguous()
    if mask.numel() != indices.numel() or values.numel() != indices.numel():
        raise ValueError("indices, values and restore must have the same length")
    with _on_device(device):
        _C.cuda_restore_residual(_cuda_value_type(values.dtype), _cuda_index_type(indices.dtype),
                                 residual.data_ptr(), indices.data_ptr(), values.data_ptr(),
                                 mask.data_ptr(), indices.numel(), _stream(device))


def _cuda_sorted_union(a: Any, b: Any) -> Any:
    import torch

    if not (is_cuda(a) and is_cuda(b)) or a.device != b.device:
        raise ValueError("a and b must be CUDA tensors on one device")
    if a.dtype != b.dtype or a.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"a and b must have one index dtype (int32 / int64), got {a.dtype} and "
                        f"{b.dtype}")
    both = torch.cat((a.reshape(-1), b.reshape(-1)))
    return torch.unique_consecutive(torch.sort(both).values)


def _cuda_sketch_table(gradient: Any, residual: Any, keys: np.ndarray, columns: int,
                       clear_gradient: bool, tile_columns: int, skip: Any = None) -> Any:
    import torch

    _require_cuda_build()
    if gradient is None:
        _cuda_check(residual, "residual", residual.device)
    else:
        _cuda_check_pair(gradient, residual)
    if residual.dtype != torch.float32:
        raise TypeError(f"residual must be float32 (the sketch sums float32), got "
                        f"{residual.dtype}")
    keys = _host_keys(keys)
    device = residual.device
    with _on_device(device):
        workspace = _workspace(
            _C.cuda_sketch_table_workspace_bytes(keys, columns, tile_columns), device)
        table = torch.empty((len(keys), columns), dtype=torch.float32, device=device)
        gradient_pointer = 0 if gradient is None else gradient.data_ptr()
        _C.cuda_sketch_table(gradient_pointer, residual.data_ptr(), residual.numel(), keys,
                             columns, bool(clear_gradient), table.data_ptr(), _stream(device),
                             workspace.data_ptr(), workspace.numel(), tile_columns,
                             _flag_address(skip, residual))
    return table


def _cuda_sketch_device_table(table: Any, keys: np.ndarray, columns: int, device: Any) -> Any:
    """The table as a float32 tensor on `device` holding rows x columns values."""
    import torch

    table = torch.as_tensor(table, device=device)
    _cuda_check(table, "table", device)
    if table.dtype != torch.float32:
        raise TypeError(f"the table must be float32, got {table.dtype}")
    if table.numel() != len(keys) * columns:
        raise ValueError(f"the table holds {table.numel()} values, rows x columns = "
                         f"{len(keys) * columns}")
    return table


def _cuda_sketch_select(table: Any, keys: Any, columns: int, k: int, d: int, estimate: Any,
                        row_filter: bool = False) -> tuple[Any, Any]:
    """row_filter: size the workspace for the kernel's row bitmaps, so that its pass 1 filters
    (an A/B for scripts/gpu_profile.py; the same selection either way)."""
    _require_cuda_build()
    keys = _host_keys(keys)
    device = table.device if is_cuda(table) else estimate.device
    table = _cuda_sketch_device_table(table, keys, columns, device)
    indices, values, _, index_type = _cuda_outputs(table, min(k, d), d)
    with _on_device(device):
        room = (_C.cuda_sketch_select_workspace_bytes(index_type, d, k, keys, columns)
                if row_filter else _C.cuda_sketch_select_workspace_bytes(index_type, d, k))
        workspace = _workspace(room, device)
        _C.cuda_sketch_select(table.data_ptr(), keys, columns, d, k, index_type,
                              indices.data_ptr(), values.data_ptr(), _stream(device),
                              workspace.data_ptr(), workspace.numel())
    return indices, values


def _cuda_sketch_estimate(table: Any, keys: Any, columns: int, estimate: Any) -> None:
    import torch

    _require_cuda_build()
    device = estimate.device
    _cuda_check(estimate, "estimate", device)
    if estimate.dtype != torch.float32:
        raise TypeError(f"the estimate must be float32, got {estimate.dtype}")
    keys = _host_keys(keys)
    table = _cuda_sketch_device_table(table, keys, columns, device)
    with _on_device(device):
        _C.cuda_sketch_estimate(table.data_ptr(), keys, columns, estimate.numel(),
                                estimate.data_ptr(), _stream(device))
