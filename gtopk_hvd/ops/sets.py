"""Kernels at a sparse set: the sorted merge of two sets (`merge_topk`), the dense write of a set
(`write_sparse`), what goes back to the residual (`restore_residual`, `restore_unselected`,
`mark_survivors`), the gather at a global set (`take_at`), the clear at a set (`zero_at`) and
the union of two sorted sets (`sorted_union`)."""

from __future__ import annotations

from typing import Any

import numpy as np

from gtopk_hvd import _C
from gtopk_hvd._arrays import (
    as_numpy,
    check_count,
    dtype_name,
    framework_of,
    is_cuda,
    like,
)
from gtopk_hvd.ops._support import (
    _FAST_VALUE_TYPES,
    _address,
    _check_set,
    _check_sorted,
    _check_within,
    _cuda_check,
    _cuda_outputs,
    _flag_address,
    _host_empty,
    _index_type,
    _on_device,
    _plain_numpy,
    _require_cuda_build,
    _stream,
    _to_cpu,
    _to_numpy_any,
    _value_type,
    _workspace,
    cuda_built,
)
from gtopk_hvd.ops.flags import flag_set


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
        return _host_merge_topk(index_a, value_a, index_b, value_b, k, out,
                                _FAST_VALUE_TYPES.get(value_a.dtype.char) or value_a.dtype.name)
    if is_cuda(value_a):
        return _cuda_merge_topk(index_a, value_a, index_b, value_b, k, out)
    ia, va = as_numpy(index_a, "index_a", values=False), as_numpy(value_a, "value_a")
    ib, vb = as_numpy(index_b, "index_b", values=False), as_numpy(value_b, "value_b")
    host_out = None
    if out is not None:
        host_out = (as_numpy(out[0], "out indices", values=False, writeable=True).array,
                    as_numpy(out[1], "out values", writeable=True).array)
    indices, values = _host_merge_topk(ia.array, va.array, ib.array, vb.array, k, host_out,
                                       va.value_type)
    return like(indices, va), like(values, va)


def _host_merge_topk(index_a: np.ndarray, value_a: np.ndarray, index_b: np.ndarray,
                     value_b: np.ndarray, k: int, out: tuple[np.ndarray, np.ndarray] | None,
                     value_type: str) -> tuple[np.ndarray, np.ndarray]:
    """merge_topk of 1-D numpy arrays (contiguous; dtypes checked here), into out if given (the
    result is then a view of its first entries)."""
    for index, value, what in ((index_a, value_a, "set a"), (index_b, value_b, "set b")):
        if not (index.flags.c_contiguous and value.flags.c_contiguous):
            raise ValueError(f"{what} must be contiguous")
        _check_set(index, value, what)
    if index_a.dtype != index_b.dtype or value_a.dtype != value_b.dtype:
        raise TypeError("sets a and b must have the same index dtype and value dtype")
    index_type = _index_type(index_a.dtype)
    code = _value_type(value_type, arithmetic=True)
    size = min(k, index_a.size + index_b.size)
    if out is not None:
        out_index, out_value = out
        if not (out_index.flags.c_contiguous and out_value.flags.c_contiguous):
            raise ValueError("out arrays must be contiguous")
        if out_index.dtype != index_a.dtype or out_value.dtype != value_a.dtype:
            raise TypeError("out arrays must have the sets' index dtype and value dtype")
        if out_index.size < size or out_value.size < size:
            raise ValueError(f"out arrays hold fewer than min(k, n_a + n_b) = {size} entries")
        if not (out_index.flags.writeable and out_value.flags.writeable):
            raise ValueError("out arrays must be writeable")
    _check_sorted(index_a, "indices of set a")
    _check_sorted(index_b, "indices of set b")
    if out is None:
        out = (_host_empty(size, index_a.dtype), _host_empty(size, value_a.dtype))
    n = _C.merge_topk(code, index_type, _address(index_a), _address(value_a), index_a.size,
                      _address(index_b), _address(value_b), index_b.size, k, _address(out[0]),
                      _address(out[1]))
    return out[0][:n], out[1][:n]


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
                _C.cuda_write_sparse(_value_type(dest.dtype),
                                     _index_type(indices.dtype), dest.data_ptr(),
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
    index = as_numpy(indices, "indices", values=False).array
    value_view = as_numpy(values, "values")
    _check_set(index, value_view.array, "sparse set")
    if dest_view.array.dtype != value_view.array.dtype:
        raise TypeError("dest and values must have the same dtype")
    value_type = _value_type(value_view.value_type, arithmetic=True)
    _check_sorted(index, "indices")
    d = dest_view.array.size
    if index.size and (index[0] < 0 or index[-1] >= d):
        raise IndexError(f"indices out of range for dest of length {d}")
    _C.write_sparse(value_type, _index_type(index.dtype), _address(dest_view.array), d,
                    _address(index), _address(value_view.array), index.size)


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
            _C.cuda_restore_unselected(_value_type(residual.dtype),
                                       _index_type(indices.dtype), residual.data_ptr(),
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
            _C.cuda_take_at(_value_type(residual.dtype), _index_type(indices.dtype),
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
    index = as_numpy(indices, "indices", values=False).array
    value_view = as_numpy(values, "values")
    restore_mask = np.ascontiguousarray(_to_numpy_any(restore), dtype=np.uint8).reshape(-1)
    _check_set(index, value_view.array, "restore set")
    if restore_mask.size != index.size:
        raise ValueError("restore mask must have one entry per index")
    if residual_view.array.dtype != value_view.array.dtype:
        raise TypeError("residual and values must have the same dtype")
    value_type = _value_type(value_view.value_type, arithmetic=True)
    d = residual_view.array.size
    _check_within(index, d, "a residual")
    _C.restore_residual(value_type, _index_type(index.dtype), _address(residual_view.array), d,
                        _address(index), _address(value_view.array), _address(restore_mask),
                        index.size)


def mark_survivors(local_indices: Any, global_indices: Any) -> Any:
    """Boolean mask over the index-sorted local set: local_indices[j] is in global_indices
    (sorted too). A numpy array; for CUDA tensors a bool tensor on their device."""
    if _plain_numpy(local_indices, global_indices):
        return _host_mark_survivors(local_indices, global_indices)
    if is_cuda(local_indices) and is_cuda(global_indices):
        return _cuda_mark_survivors(local_indices, global_indices)
    local = as_numpy(_to_cpu(local_indices), "local_indices", values=False)
    global_ = as_numpy(_to_cpu(global_indices), "global_indices", values=False)
    return _host_mark_survivors(local.array, global_.array)


def _host_mark_survivors(local: np.ndarray, global_: np.ndarray) -> np.ndarray:
    if not (local.flags.c_contiguous and global_.flags.c_contiguous):
        raise ValueError("local and global indices must be contiguous")
    if local.dtype != global_.dtype:
        raise TypeError("local and global indices must have the same dtype")
    index_type = _index_type(local.dtype)
    _check_sorted(local, "local indices")
    _check_sorted(global_, "global indices")
    survived = _host_empty(local.size, np.uint8)
    _C.mark_survivors(index_type, _address(local), local.size, _address(global_), global_.size,
                      _address(survived))
    return survived.view(np.bool_)


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
            _C.cuda_zero_at(_value_type(x.dtype), _index_type(indices.dtype),
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


def sorted_union(a: Any, b: Any) -> Any:
    """The sorted union of two strictly increasing index arrays of one dtype (int32 / int64),
    each index once. numpy or CPU torch: a linear merge (`_C.sorted_union`), not a sort, which
    refuses unsorted input. CUDA tensors: torch's sort of the concatenation, then
    unique_consecutive, on the device (inputs not checked: a check would read them); the
    union's length is data-dependent, so its allocation waits for the device once."""
    if is_cuda(a) or is_cuda(b):
        return _cuda_sorted_union(a, b)
    view_a, view_b = as_numpy(a, "a", values=False), as_numpy(b, "b", values=False)
    if view_a.array.dtype != view_b.array.dtype:
        raise TypeError("a and b must have the same dtype")
    _check_sorted(view_a.array, "a")
    _check_sorted(view_b.array, "b")
    out = _host_empty(view_a.array.size + view_b.array.size, view_a.array.dtype)
    n = _C.sorted_union(_index_type(out.dtype), _address(view_a.array), view_a.array.size,
                        _address(view_b.array), view_b.array.size, _address(out))
    return like(out[:n], view_a)


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
        value_type, index_type = _value_type(values.dtype), _index_type(indices.dtype)
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
        _C.cuda_restore_residual(_value_type(values.dtype), _index_type(indices.dtype),
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
