"""Magnitude keys and the threshold schemes' kernels: a value's order-preserving key, the
largest finite magnitude, histograms of the keys (with the accumulation r += g, or alone), the
indices at or above a key (on the host, or left on the device with their count), each with its
CPU, torch and CUDA sides."""

from __future__ import annotations

from typing import Any

import numpy as np

from gtopk_hvd import _C
from gtopk_hvd._arrays import (
    NumpyView,
    as_numpy,
    check_count,
    framework_of,
    is_cuda,
    like,
)
from gtopk_hvd.ops._support import (
    _FAST_VALUE_TYPES,
    _address,
    _check_accumulation,
    _check_range,
    _cuda_check,
    _cuda_check_pair,
    _host_empty,
    _index_type,
    _itemsize,
    _length,
    _on_device,
    _require_cuda_build,
    _stream,
    _torch_index_dtype,
    _value_type,
    _workspace,
    cuda_built,
    index_dtype_for,
)


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
    _check_accumulation(gradient_array, residual_view.array, clear_gradient)
    d = residual_view.array.size
    _check_range(begin, end, d)
    value_type = _value_type(residual_view.value_type, arithmetic=True)
    histogram = _host_empty(max(int(n_bins), 0), np.int64)  # n_bins: the kernels' rule
    indices = _C.accumulate_threshold(
        value_type, _index_type(np.dtype(index_dtype_for(d))), _address(gradient_array),
        _address(residual_view.array), d, int(begin), int(end), int(threshold_key),
        int(histogram_base_key), int(histogram_shift), int(n_bins), int(n_fine),
        int(coarse_shift), bool(clear_gradient), _address(histogram))
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
        d = view.array.size
        _check_range(begin, end, d)
        value_type = _value_type(view.value_type, arithmetic=True)
        indices = like(_C.threshold_indices(
            value_type, _index_type(np.dtype(index_dtype_for(d))), _address(view.array), d,
            int(begin), int(end), int(threshold_key)), view)
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
            _value_type(residual.dtype), 0 if gradient is None else gradient.data_ptr(),
            residual.data_ptr(), residual.numel(), int(begin), int(end), nothing,
            int(histogram_base_key), int(histogram_shift), int(n_bins), int(n_fine),
            int(coarse_shift), bool(clear_gradient), _stream(device), 0, 0, histogram=0,
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
        value_type, index_type = _value_type(x.dtype), _index_type(dtype)
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


def _max_key(x: Any, begin: int, end: int, plus: Any = None, finite_only: bool = False) -> int:
    """The largest magnitude key of x[begin:end) (+ plus there): a CUDA tensor, or the
    NumpyView of a host array (plus: of x's type)."""
    if end <= begin:
        return 0
    if not isinstance(x, NumpyView):
        return _cuda_max_key(x, begin, end, plus, finite_only)
    first = x.array[begin:end]
    other = None if plus is None else as_numpy(plus, "plus").array[begin:end]
    if plus is None and not finite_only and x.value_type in _FAST_VALUE_TYPES.values():
        return int(_C.read_pass(_value_type(x.value_type), _address(first), first.size))
    if other is not None:
        if other.size != first.size or other.dtype != first.dtype:
            raise ValueError("x and y must have the same length and dtype")
        if x.value_type not in _FAST_VALUE_TYPES.values():
            raise TypeError("max_key adds y to x for float32 / float64 only")
    return int(_C.max_key(_value_type(x.value_type), _address(first), _address(other),
                          first.size, bool(finite_only)))


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
    value_type = _value_type(residual.dtype)
    with _on_device(device):
        workspace = _workspace(_C.cuda_accumulate_count_workspace_bytes(int(n_bins)), device)
        histogram = _host_empty(max(int(n_bins), 0), np.int64)  # n_bins: the kernels' rule
        count = _C.cuda_accumulate_count(
            value_type, 0 if gradient is None else gradient.data_ptr(), residual.data_ptr(), d,
            int(begin), int(end), int(threshold_key), int(histogram_base_key),
            int(histogram_shift), int(n_bins), int(n_fine), int(coarse_shift),
            bool(clear_gradient), _stream(device), workspace.data_ptr(), workspace.numel(),
            _address(histogram))
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
    histogram = _host_empty(1, np.int64)
    count = _C.cuda_accumulate_count(
        _value_type(x.dtype), 0, x.data_ptr(), x.numel(), int(begin), int(end),
        int(threshold_key), int(threshold_key), 0, 1, -1, 0, False, _stream(x.device),
        workspace.data_ptr(), workspace.numel(), _address(histogram))
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
    value_type, n = _value_type(x.dtype), end - begin
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
    value_type, index_type = _value_type(x.dtype), _index_type(out.dtype)
    workspace = _workspace(
        _C.cuda_threshold_indices_workspace_bytes(value_type, index_type, end - begin), x.device)
    return _C.cuda_threshold_indices(value_type, index_type, x.data_ptr(), x.numel(),
                                     int(begin), int(end), int(threshold_key), out.data_ptr(),
                                     out.numel(), _stream(x.device), workspace.data_ptr(),
                                     workspace.numel())
