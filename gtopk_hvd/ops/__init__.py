"""Kernels of gtopk_hvd on numpy arrays, torch tensors (CPU and CUDA) and TensorFlow tensors.

Selection order (the same everywhere, CPU and CUDA): entry (i, v) comes before (j, w) iff
|v| > |w|, or |v| == |w| and i < j. NaN counts as larger than every number (all NaNs equal), so
a NaN is always selected and reaches the caller; -0.0 == 0.0. Top-k = the first k entries in that
order. Every function returns its (indices, values) sorted by index, indices of dtype
index_dtype_for(d) (int32 when the dense length d <= INT32_INDEX_LIMIT = 2^31, int64 beyond),
values in the input's dtype, as the caller's array type.

Inputs are read in place (no copy): they must be contiguous; any shape is flattened.

Each contract is one function here, its CPU and CUDA sides behind it, grouped by what they act
on: `selection` (top-k and the fused accumulate-and-select), `threshold` (magnitude keys,
histograms, threshold selection), `sets` (merges, writes, gathers and clears at a sparse set),
`flags` (non-finite checks, skip flags, reads to the host), `sketch` (the count sketch),
`dense` (one-pass dense updates); `_support` holds what their calls share.
"""

from __future__ import annotations

import numbers

from gtopk_hvd import _C, threads
from gtopk_hvd.ops._support import (
    INT32_INDEX_LIMIT,
    cuda_built,
    index_dtype_for,
)
from gtopk_hvd.ops.dense import (
    add_divided,
    momentum_update,
)
from gtopk_hvd.ops.flags import (
    LaterFlag,
    all_finite,
    flag_set,
    mark_nonfinite,
    nonfinite_flag,
    read_flag,
    read_to_host,
    skipped_here,
)
from gtopk_hvd.ops.selection import (
    accumulate_select,
    segmented_accumulate_select,
    topk_abs,
)
from gtopk_hvd.ops.sets import (
    mark_survivors,
    merge_topk,
    restore_residual,
    restore_unselected,
    sorted_union,
    take_at,
    write_sparse,
    zero_at,
)
from gtopk_hvd.ops.sketch import (
    sketch_estimate,
    sketch_select,
    sketch_table,
)
from gtopk_hvd.ops.threshold import (
    accumulate_threshold,
    histogram_bin,
    histogram_count_from,
    histogram_on_device,
    keep_at_or_above,
    largest_finite_magnitude,
    magnitude_histogram,
    magnitude_key,
    selected_indices,
    threshold_histogram,
    threshold_indices,
    threshold_indices_on_device,
    value_of_key,
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
    "accumulate_threshold",
    "histogram_bin",
    "histogram_count_from",
    "keep_at_or_above",
    "largest_finite_magnitude",
    "magnitude_histogram",
    "magnitude_key",
    "threshold_histogram",
    "threshold_indices",
    "value_of_key",
    "skipped_here",
]

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
