"""Horovod's optimizer arguments, checked once for every adapter (torch, TF tape, Keras).

`parse_arguments` fills Horovod's defaults (op=Average, the global process set), refuses what a
compression cannot do with a clear error, and returns what the step needs.
(The warning for an aggressive density is the core's: `gtopk_hvd.core.warmup_warning`.)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gtopk_hvd.compression import SCHEME_NAMES, Compression, DenseCompression, SparseCompression
from gtopk_hvd.options import check_integer, check_number, refuse


@dataclass(frozen=True)
class Arguments:
    """What the adapters' steps use of Horovod's arguments."""

    compression: DenseCompression | SparseCompression
    op: Any
    average: bool  # op is Average (else Sum)
    predivide: float  # gradient_predivide_factor
    process_set: Any
    passes: int  # backward_passes_per_step

    @property
    def sparse(self) -> bool:
        return isinstance(self.compression, SparseCompression)


def parse_arguments(hvd: Any, compression: object, op: object = None,
                    gradient_predivide_factor: float = 1.0, num_groups: int = 0,
                    groups: object = None, process_set: object = None,
                    backward_passes_per_step: int = 1, dense_by_horovod: bool = False
                    ) -> Arguments:
    """Checks Horovod's arguments for `compression`. hvd: the adapter's Horovod module
    (horovod.torch or horovod.tensorflow). dense_by_horovod: a dense compression is handed to
    Horovod's own wrapper, which checks its arguments itself. Horovod's own
    `hvd.Compression.none` / `.fp16` are taken as gtopk_hvd's: a script's unchanged
    `compression=` argument keeps working with the one-line swap."""
    compression = _ours(hvd, compression)
    op = hvd.Average if op is None else op
    process_set = hvd.global_process_set if process_set is None else process_set
    check_integer("backward_passes_per_step", backward_passes_per_step, 1,
                  fix="backward passes accumulated before each step (Horovod's default 1)")
    check_number("gradient_predivide_factor", gradient_predivide_factor, 0.0, float("inf"),
                 low_open=True, fix="Horovod's default is 1.0")
    if isinstance(compression, SparseCompression):
        if num_groups or groups is not None:
            raise NotImplementedError(
                "num_groups / groups: sparse compression fuses every gradient into one "
                "selection (use granularity='bucket' for per-tensor shares)")
        if process_set is not hvd.global_process_set:
            raise NotImplementedError("sparse compression runs on the global process set only")
    elif isinstance(compression, DenseCompression):
        if not dense_by_horovod and (num_groups or groups is not None):
            raise NotImplementedError("num_groups / groups are not supported: each gradient is "
                                      "allreduced on its own")
    else:
        framework = hvd.__name__.split(".")[-1]
        refuse("compression", f"one of gtopk_hvd.{framework}.Compression's choices: .none, "
               ".fp16 (dense), .gtopk(density), .topk(density), .sparse(density, ...), "
               ".micro(density), .exdyna(density), .sketch(density) or .scheme(name, density) "
               f"(names: {', '.join(SCHEME_NAMES)})", compression,
               f"horovod.{framework}.Compression.none / .fp16 are taken too",
               wrong_type=True)
    if not (dense_by_horovod and isinstance(compression, DenseCompression)):
        kind = "sparse" if isinstance(compression, SparseCompression) else "dense"
        if op not in (hvd.Average, hvd.Sum):
            raise NotImplementedError(f"{kind} compression supports op=hvd.Average or hvd.Sum")
        if gradient_predivide_factor != 1.0 and op != hvd.Average:
            raise ValueError("gradient_predivide_factor not supported with op != Average")
    return Arguments(compression, op, op == hvd.Average, float(gradient_predivide_factor),
                     process_set, backward_passes_per_step)


def _ours(hvd: Any, compression: object) -> object:
    """Horovod's `hvd.Compression.none` / `.fp16` (compressor classes) as gtopk_hvd's
    Compression.none / .fp16, which run the same dense allreduce; anything else unchanged."""
    horovod_compression = getattr(hvd, "Compression", None)
    for name in ("none", "fp16"):
        if horovod_compression is not None and compression is getattr(horovod_compression,
                                                                      name, None):
            return getattr(Compression, name)
    return compression
