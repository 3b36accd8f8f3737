"""Top-k by magnitude, the selection of Top-k and gTop-k S-SGD (registered as "topk")."""

from __future__ import annotations

from typing import Any

from gtopk_hvd import ops
from gtopk_hvd.sparsifiers.base import SPARSIFIERS, Sparsifier


@SPARSIFIERS.register("topk")
class MagnitudeTopK(Sparsifier):
    """I_p = the k largest |acc| (ties: lower index first; NaN and Inf rank highest); one fused
    pass over d (`ops.accumulate_select`)."""

    def select(self, gradient: Any, residual: Any, k: int, clear_gradient: bool, step: int,
               part: int) -> tuple[Any, Any]:
        return ops.accumulate_select(gradient, residual, k, clear_gradient=clear_gradient)
