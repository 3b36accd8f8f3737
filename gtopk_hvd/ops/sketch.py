"""The count sketch's kernels: the table of the accumulated gradient (`sketch_table`), the top-k
of its estimates (`sketch_select`) and the estimates themselves (`sketch_estimate`), with the
hashes computed in the kernels (gtopk/count_sketch.h)."""

from __future__ import annotations

from typing import Any

import numpy as np

from gtopk_hvd import _C
from gtopk_hvd._arrays import (
    as_numpy,
    check_count,
    is_cuda,
    like,
)
from gtopk_hvd.ops._support import (
    _address,
    _check_accumulation,
    _cuda_check,
    _cuda_check_pair,
    _cuda_outputs,
    _flag_address,
    _host_empty,
    _index_type,
    _on_device,
    _require_cuda_build,
    _require_float32,
    _sketch_keys,
    _stream,
    _workspace,
    index_dtype_for,
)
from gtopk_hvd.ops.flags import skipped_here


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
    _check_accumulation(gradient_array, residual_view.array, clear_gradient)
    _require_float32(residual_view.array, "residual")
    keys, rows = _sketch_keys(keys, columns)
    table = _host_empty(rows * columns, np.float32).reshape(rows, columns)
    _C.sketch_table(_address(gradient_array), _address(residual_view.array),
                    residual_view.array.size, _address(keys), rows, columns,
                    bool(clear_gradient), _address(table))
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
    kernel's bitmap filter (cuda_ops.h) is not used: on the GPU it makes pass 1 slower, not
    faster (docs/results.md, On a GPU).
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
    keys, rows = _sketch_keys(keys, columns)
    table_view = as_numpy(table, "table")
    _require_float32(table_view.array, "table")
    if table_view.array.size != rows * columns:
        raise ValueError(f"the table holds {table_view.array.size} values, rows x columns = "
                         f"{rows * columns}")
    estimate_view = None if estimate is None else as_numpy(estimate, "estimate", writeable=True)
    if estimate_view is not None:
        _require_float32(estimate_view.array, "estimate")
    indices = _host_empty(min(k, d), index_dtype_for(d))
    values = _host_empty(min(k, d), np.float32)
    _C.sketch_select(_address(table_view.array), _address(keys), rows, columns, d, k,
                     _address(None if estimate_view is None else estimate_view.array),
                     _index_type(indices.dtype), _address(indices), _address(values))
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


def _table_columns(table: Any) -> int:
    if len(table.shape) != 2:
        raise ValueError(f"the table must have shape (rows, columns), got {tuple(table.shape)}")
    return int(table.shape[1])


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
    keys, rows = _sketch_keys(keys, columns)
    device = residual.device
    with _on_device(device):
        workspace = _workspace(
            _C.cuda_sketch_table_workspace_bytes(rows, columns, tile_columns), device)
        table = torch.empty((rows, columns), dtype=torch.float32, device=device)
        gradient_pointer = 0 if gradient is None else gradient.data_ptr()
        _C.cuda_sketch_table(gradient_pointer, residual.data_ptr(), residual.numel(),
                             _address(keys), rows, columns, bool(clear_gradient),
                             table.data_ptr(), _stream(device),
                             workspace.data_ptr(), workspace.numel(), tile_columns,
                             _flag_address(skip, residual))
    return table


def _cuda_sketch_device_table(table: Any, rows: int, columns: int, device: Any) -> Any:
    """The table as a float32 tensor on `device` holding rows x columns values."""
    import torch

    table = torch.as_tensor(table, device=device)
    _cuda_check(table, "table", device)
    if table.dtype != torch.float32:
        raise TypeError(f"the table must be float32, got {table.dtype}")
    if table.numel() != rows * columns:
        raise ValueError(f"the table holds {table.numel()} values, rows x columns = "
                         f"{rows * columns}")
    return table


def _cuda_sketch_select(table: Any, keys: Any, columns: int, k: int, d: int, estimate: Any,
                        row_filter: bool = False) -> tuple[Any, Any]:
    """row_filter: size the workspace for the kernel's row bitmaps, so that its pass 1 filters
    (an A/B for scripts/gpu/gpu_profile.py; the same selection either way)."""
    _require_cuda_build()
    keys, rows = _sketch_keys(keys, columns)
    device = table.device if is_cuda(table) else estimate.device
    table = _cuda_sketch_device_table(table, rows, columns, device)
    indices, values, _, index_type = _cuda_outputs(table, min(k, d), d)
    with _on_device(device):
        room = (_C.cuda_sketch_select_workspace_bytes(index_type, d, k, rows, columns)
                if row_filter else _C.cuda_sketch_select_workspace_bytes(index_type, d, k))
        workspace = _workspace(room, device)
        _C.cuda_sketch_select(table.data_ptr(), _address(keys), rows, columns, d, k, index_type,
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
    keys, rows = _sketch_keys(keys, columns)
    table = _cuda_sketch_device_table(table, rows, columns, device)
    with _on_device(device):
        _C.cuda_sketch_estimate(table.data_ptr(), _address(keys), rows, columns,
                                estimate.numel(), estimate.data_ptr(), _stream(device))
