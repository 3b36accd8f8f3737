"""Compression choices shared by the framework adapters (`gtopk_hvd.torch`, `.tensorflow`).

    Compression.none              dense, through Horovod's allreduce
    Compression.fp16              dense in float16, through Horovod's allreduce
    Compression.topk(density)     Top-k S-SGD: all-gather of every worker's local top-k
    Compression.gtopk(density)    gTop-k S-SGD: the global top-k by recursive doubling

Sparse choices carry their hyper-parameters:
    density                 k / d, in (0, 1]
    wire_dtype              value dtype on the wire: "float32", "float16" or "bfloat16"
    warmup_densities        densities of the warm-up stages, e.g. (0.25, 0.0625, 0.015625, 0.004)
    warmup_steps            optimizer steps per warm-up stage (0: no warm-up)
    momentum_correction     DGC momentum correction: u = m u + g accumulates into the residual
                            instead of g, and u is cleared where entries are sent; use it with
                            an optimizer without momentum of its own
    momentum                m of the momentum correction
    selection               "model": one top-k over all parameters fused (as in the paper);
                            "bucket": each parameter keeps its own share ceil(density * size)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gtopk_hvd.wire import WIRE_VALUE_TYPES

SPARSE_SCHEMES = ("topk", "gtopk")
SELECTIONS = ("model", "bucket")


@dataclass(frozen=True)
class DenseCompression:
    """Dense gradients through Horovod's own allreduce (`name`: "none" or "fp16")."""

    name: str


@dataclass(frozen=True)
class SparseCompression:
    scheme: str
    density: float
    wire_dtype: str = "float32"
    warmup_densities: tuple[float, ...] = ()
    warmup_steps: int = 0
    momentum_correction: bool = False
    momentum: float = 0.9
    selection: str = "model"

    def __post_init__(self) -> None:
        if self.scheme not in SPARSE_SCHEMES:
            raise ValueError(f"unknown sparse scheme {self.scheme!r}; expected {SPARSE_SCHEMES}")
        for name, density in [("density", self.density)] + [
                ("warmup density", d) for d in self.warmup_densities]:
            if isinstance(density, bool) or not isinstance(density, (int, float)) or not (
                    0.0 < density <= 1.0):
                raise ValueError(f"{name} must be in (0, 1], got {density!r}")
        if self.wire_dtype not in WIRE_VALUE_TYPES:
            raise ValueError(f"wire_dtype must be one of {WIRE_VALUE_TYPES}, "
                             f"got {self.wire_dtype!r}")
        if not isinstance(self.warmup_steps, int) or self.warmup_steps < 0:
            raise ValueError(f"warmup_steps must be an integer >= 0, got {self.warmup_steps!r}")
        if not 0.0 <= self.momentum < 1.0:
            raise ValueError(f"momentum must be in [0, 1), got {self.momentum!r}")
        if self.selection not in SELECTIONS:
            raise ValueError(f"selection must be one of {SELECTIONS}, got {self.selection!r}")

    def density_at(self, step: int) -> float:
        """The density of optimizer step `step` (0-based), warm-up included."""
        if self.warmup_steps and step < self.warmup_steps * len(self.warmup_densities):
            return self.warmup_densities[step // self.warmup_steps]
        return self.density


class Compression:
    """The namespace users pass as `compression=` (mirrors horovod.*.Compression)."""

    none = DenseCompression("none")
    fp16 = DenseCompression("fp16")

    @staticmethod
    def topk(density: float, **options: object) -> SparseCompression:
        """Top-k S-SGD (all-gather of local top-k sets). Options: see the module docstring."""
        return SparseCompression("topk", density, **options)

    @staticmethod
    def gtopk(density: float, **options: object) -> SparseCompression:
        """gTop-k S-SGD (global top-k by recursive doubling). Options: module docstring."""
        return SparseCompression("gtopk", density, **options)


def check_sparse_arguments(hvd: Any, compression: object, op: object,
                           gradient_predivide_factor: float, num_groups: int, groups: object,
                           process_set: object) -> bool:
    """Raises for Horovod arguments a sparse compression does not support; returns whether op is
    Average. hvd: the adapter's Horovod module (horovod.torch or horovod.tensorflow)."""
    framework = hvd.__name__.split(".")[-1]
    if not isinstance(compression, SparseCompression):
        raise ValueError(f"unknown compression {compression!r}; use gtopk_hvd.{framework}."
                         "Compression.none, .fp16, .topk(density) or .gtopk(density)")
    if op not in (hvd.Average, hvd.Sum):
        raise NotImplementedError("sparse compression supports op=hvd.Average or hvd.Sum")
    if num_groups or groups is not None:
        raise NotImplementedError("num_groups / groups: sparse compression fuses every gradient "
                                  "into one selection (use selection='bucket' for per-tensor "
                                  "shares)")
    if process_set is not None and process_set is not hvd.global_process_set:
        raise NotImplementedError("sparse compression runs on the global process set only")
    if gradient_predivide_factor != 1.0 and op != hvd.Average:
        raise ValueError("gradient_predivide_factor not supported with op != Average")
    return op == hvd.Average


DGC_WARMUP = (0.25, 0.0625, 0.015625, 0.004)
"""The density warm-up of Deep Gradient Compression (Lin et al., ICLR 2018)."""
