"""Top-k by magnitude, the selection of Top-k and gTop-k S-SGD (registered as "topk")."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from gtopk_hvd import ops
from gtopk_hvd.sparsifiers.base import SPARSIFIERS, Sparsifier


@SPARSIFIERS.register("topk")
class MagnitudeTopK(Sparsifier):
    """I_p = the k largest |acc| (ties: lower index first; NaN and Inf rank highest); one fused
    pass over d (`ops.accumulate_select`)."""

    takes_skip_flag = True

    def select(self, gradient: Any, residual: Any, k: int, clear_gradient: bool, step: int,
               part: int, skip: Any = None) -> tuple[Any, Any]:
        return ops.accumulate_select(gradient, residual, k, clear_gradient=clear_gradient,
                                     skip=skip)

    def select_parts(self, gradient: Any, residual: Any, parts: Sequence[tuple[int, int, int, int]],
                     clear_gradient: bool, step: int, index_dtype: Any,
                     skip: Any = None) -> tuple[Any, Any]:
        """Every part's top-k_i in one call (`ops.segmented_accumulate_select`: one launch
        sequence on a GPU, not one per part), bit for bit the per-part selections joined."""
        offsets, ks = segments_of(parts)
        indices, values = ops.segmented_accumulate_select(gradient, residual, offsets, ks,
                                                          clear_gradient, skip)
        return self.backend.as_index_dtype(indices, index_dtype), values


def segments_of(parts: Sequence[tuple[int, int, int, int]]) -> tuple[list[int], list[int]]:
    """(offsets, ks) of contiguous parts (part, begin, end, k) from 0: offsets = [begin of each
    part..., end of the last], ks = [k of each part...]."""
    offsets = [begin for _, begin, _, _ in parts]
    offsets.append(parts[-1][2] if parts else 0)
    for (_, _, end, _), begin in zip(parts, offsets[1:]):
        if end != begin:
            raise ValueError("the parts must be contiguous, in order")
    return offsets, [k for _, _, _, k in parts]
