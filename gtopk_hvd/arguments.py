"""Horovod's optimizer arguments, checked once for every adapter (torch, TF tape, Keras).

`parse_arguments` fills Horovod's defaults (op=Average, the global process set), refuses what a
compression cannot do with a clear error, and returns what the step needs.
`warn_if_density_needs_warmup` (called by every SparseState, so by every adapter and the DDP
hook) warns once per process when a sparse density is aggressive and nothing protects accuracy.
"""

from __future__ import annotations

import sys
import warnings
from dataclasses import dataclass
from typing import Any

from gtopk_hvd.compression import Compression, DenseCompression, SparseCompression


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
    if (isinstance(backward_passes_per_step, bool) or not isinstance(backward_passes_per_step, int)
            or backward_passes_per_step < 1):
        raise ValueError(f"backward_passes_per_step must be an integer >= 1, "
                         f"got {backward_passes_per_step!r}")
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
        raise ValueError(f"unknown compression {compression!r}; use gtopk_hvd.{framework}."
                         "Compression.none, .fp16, .topk(density) or .gtopk(density) (or "
                         f"horovod.{framework}.Compression.none / .fp16)")
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


WARMUP_DENSITY_THRESHOLD = 0.01
"""Below this density, without a warm-up or momentum correction, the sparse step warns.

From results/convergence (digits CNN, 4 workers, 30 epochs; README, Convergence): at density
0.01 plain error feedback ends within about one point of dense (gTop-k -1.1, Top-k +0.0); at
0.001 gTop-k ends 23.3 points below (0.750 against 0.983) and DGC's warm-up with momentum
correction brings it back to -2.2 (0.961; momentum correction alone: 0.961 too, the warm-up
alone: 0.861, one run each with the same seed). So 0.01 itself is not warned about, anything
below is."""

_FRAMEWORK_MODULES = ("gtopk_hvd", "horovod", "torch", "tensorflow", "keras", "tf_keras")

_density_warning_issued = False


def density_warning_text(compression: SparseCompression) -> str:
    """The warning for an aggressive density without protection (names the fixes)."""
    return (f"gtopk_hvd: density {compression.density:g} is below "
            f"{WARMUP_DENSITY_THRESHOLD:g} with no warm-up (warmup_steps=0) and no momentum "
            "correction: accuracy can drop silently (digits CNN, 4 workers, 30 epochs: gTop-k "
            "at 0.001 reached 0.750 test accuracy against 0.983 dense; 0.961 with momentum "
            "correction, 0.861 with the warm-up alone). Add a warm-up: warmup_steps=<steps per "
            "stage>, warmup_densities=gtopk_hvd.compression.DGC_WARMUP (DGC's exponentially "
            "decreasing density), and/or momentum_correction=True (with an optimizer without "
            "momentum of its own). This warning is shown once per process.")


def needs_warmup_warning(compression: object) -> bool:
    """True for a sparse compression with density < WARMUP_DENSITY_THRESHOLD whose warm-up is
    off (warmup_steps == 0 or no warmup_densities) and without momentum correction."""
    if not isinstance(compression, SparseCompression):
        return False
    warmup = compression.warmup_steps > 0 and len(compression.warmup_densities) > 0
    return (compression.density < WARMUP_DENSITY_THRESHOLD and not warmup
            and not compression.momentum_correction)


def warn_if_density_needs_warmup(compression: object) -> bool:
    """Emits the `density_warning_text` UserWarning on the first call in this process for which
    `needs_warmup_warning` holds; never again after. Returns whether it warned. The numerics
    are unchanged: it only tells."""
    global _density_warning_issued
    if _density_warning_issued or not needs_warmup_warning(compression):
        return False
    _density_warning_issued = True
    warnings.warn(density_warning_text(compression), UserWarning, stacklevel=_user_stacklevel())
    return True


def _user_stacklevel() -> int:
    """The stacklevel of warnings.warn (called by our caller) that names the first frame
    outside gtopk_hvd and the frameworks: the user's line that built the optimizer."""
    frame, level = sys._getframe(2), 2  # 2: the frame that called our caller
    while frame.f_back is not None and frame.f_globals.get("__name__", "").split(".")[0] in (
            _FRAMEWORK_MODULES):
        frame, level = frame.f_back, level + 1
    return level
