"""Top-k by magnitude: `topk_abs`, and the fused accumulate-and-select of error feedback
(`accumulate_select`, and `segmented_accumulate_select` over the parts of one buffer, one launch
for all), each with its CPU and CUDA sides."""

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
    _address,
    _check_accumulation,
    _check_hint,
    _cuda_check,
    _cuda_check_pair,
    _cuda_outputs,
    _flag_address,
    _host_empty,
    _index_type,
    _on_device,
    _require_cuda_build,
    _stream,
    _value_type,
    _workspace,
    index_dtype_for,
)
from gtopk_hvd.ops.flags import skipped_here
from gtopk_hvd.ops.sets import zero_at


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
    hint = _hint_array(threshold_hint, view)
    _check_hint(hint, view.array, "x")
    d = view.array.size
    indices = _host_empty(min(k, d), index_dtype_for(d))
    values = _host_empty(min(k, d), view.array.dtype)
    _C.topk_abs(_value_type(view.value_type), _index_type(indices.dtype), _address(view.array),
                d, k, _address(hint), _address(indices), _address(values))
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
    _check_accumulation(gradient_view.array, residual_view.array, clear_gradient)
    hint = _hint_array(threshold_hint, gradient_view)
    _check_hint(hint, gradient_view.array, "the gradient")
    d = gradient_view.array.size
    value_type = _value_type(gradient_view.value_type, arithmetic=True)
    indices = _host_empty(min(k, d), index_dtype_for(d))
    values = _host_empty(min(k, d), gradient_view.array.dtype)
    _C.accumulate_select(value_type, _index_type(indices.dtype), _address(gradient_view.array),
                         _address(residual_view.array), d, k, _address(hint), _address(indices),
                         _address(values), bool(clear_gradient))
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
    _check_accumulation(gradient_array, residual_view.array, clear_gradient)
    d = residual_view.array.size
    value_type = _value_type(residual_view.value_type, arithmetic=True)
    n = int(_segment_table(offsets, ks, d)[2 * len(ks) + 1])  # out_offsets[S]
    indices, values = _host_empty(n, index_dtype_for(d)), _host_empty(n, residual_view.array.dtype)
    _C.segmented_accumulate_select(
        value_type, _index_type(indices.dtype), _address(gradient_array),
        _address(residual_view.array), d, _address(offsets), _address(ks), len(ks),
        _address(indices), _address(values), bool(clear_gradient))
    return like(indices, residual_view), like(values, residual_view)


def _segments(offsets: Any, ks: Any) -> tuple[np.ndarray, np.ndarray]:
    """offsets and ks as contiguous int64 arrays (the kernels check their values)."""
    offsets = np.ascontiguousarray(offsets, dtype=np.int64).reshape(-1)
    ks = np.ascontiguousarray(ks, dtype=np.int64).reshape(-1)
    if offsets.size != ks.size + 1:
        raise ValueError(f"offsets must hold one more value than ks, got {offsets.size} and "
                         f"{ks.size}")
    return offsets, ks


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
        workspace = _workspace(_C.cuda_segmented_select_workspace_bytes(
            value_type, index_type, _address(table), len(ks)), device)
        _C.cuda_segmented_accumulate_select(
            value_type, index_type, 0 if gradient is None else gradient.data_ptr(),
            residual.data_ptr(), d, _address(table), device_table.data_ptr(), len(ks),
            bool(clear_gradient),
            indices.data_ptr(), values.data_ptr(), _stream(device), workspace.data_ptr(),
            workspace.numel(), _flag_address(skip, residual))
    return indices, values


def _segment_table(offsets: np.ndarray, ks: np.ndarray, d: int) -> np.ndarray:
    """The segments' table (gtopk/segments.h), the segments checked for a vector of d values
    (ValueError otherwise)."""
    table = _host_empty(_C.SEGMENT_TABLE_ROWS * (len(ks) + 1), np.int64)
    _C.segment_table(_address(offsets), _address(ks), len(ks), d, _address(table))
    return table


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
        table = _segment_table(offsets, ks, d)
        found = (table, torch.from_numpy(table).to(device))
        if len(_SEGMENT_TABLES) >= _SEGMENT_TABLES_KEPT:
            _SEGMENT_TABLES.pop(next(iter(_SEGMENT_TABLES)))
        _SEGMENT_TABLES[key] = found
    return found
