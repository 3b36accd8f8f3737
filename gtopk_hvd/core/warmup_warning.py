"""The warning for an aggressive density with nothing protecting accuracy.

`warn_if_density_needs_warmup` (called by every `SparseStep`, so by every adapter and the DDP
hook) warns once per process when a sparse density is below `WARMUP_DENSITY_THRESHOLD` and
neither a warm-up nor momentum correction is on. The numerics are unchanged: it only tells.
"""

from __future__ import annotations

import sys
import warnings

from gtopk_hvd.compression import SparseCompression

WARMUP_DENSITY_THRESHOLD = 0.01
"""Below this density, without a warm-up or momentum correction, the sparse step warns.

The rule: at and above it plain error feedback ends close to dense S-SGD on the project's
convergence runs; below it, the measured loss without protection is large and DGC's warm-up with
momentum correction recovers most of it (docs/results.md, "Convergence", has the figures and
the command)."""

_FRAMEWORK_MODULES = ("gtopk_hvd", "horovod", "torch", "tensorflow", "keras", "tf_keras")

_density_warning_issued = False


def density_warning_text(compression: SparseCompression) -> str:
    """The warning for an aggressive density without protection (names the fixes, and what of
    the warm-up is missing)."""
    return (f"gtopk_hvd: density {compression.density:g} is below "
            f"{WARMUP_DENSITY_THRESHOLD:g} with {missing_warmup(compression)} and no momentum "
            "correction: accuracy can drop silently (digits CNN, 4 workers, 30 epochs: gTop-k "
            "at 0.001 reached 0.750 test accuracy against 0.983 dense; 0.961 with momentum "
            "correction, 0.861 with the warm-up alone). Add a warm-up: warmup_steps=<steps per "
            "stage>, warmup_densities=gtopk_hvd.compression.DGC_WARMUP (DGC's exponentially "
            "decreasing density), and/or momentum_correction=True (with an optimizer without "
            "momentum of its own). This warning is shown once per process.")


def missing_warmup(compression: SparseCompression) -> str:
    """Why the warm-up is off, naming what is missing (warmup_steps, warmup_densities)."""
    steps, stages = compression.warmup_steps, compression.warmup_densities
    if steps and not stages:
        return (f"no warm-up (warmup_steps={steps} but no warmup_densities: the warm-up has no "
                "stages)")
    if stages and not steps:
        return (f"no warm-up (warmup_densities={tuple(stages)} but warmup_steps=0: each stage "
                "lasts no step)")
    return "no warm-up (warmup_steps=0 and no warmup_densities)"


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
