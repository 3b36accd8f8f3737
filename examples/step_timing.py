"""One training step in Horovod's explicit form, timed by phase (the PyTorch examples share it).

    forward + backward            -> compute
    optimizer.synchronize()       -> select + wait + transfer + merge + other (sparse
                                     compressions, split by the optimizer's `last_stats`: wait
                                     for the partners to be ready, then the data's transfer), or
                                     transfer alone (Horovod's dense allreduce: the wait for its
                                     result, waiting for slower workers included)
    clip; with optimizer.skip_synchronize(): optimizer.step()   -> apply

`other` is what synchronize() spent outside the three phases gtopk_hvd times itself (fusing the
gradients into one buffer, writing the update back). Times are this worker's wall-clock seconds.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Optional

import torch

PHASES = ("compute", "select", "wait", "transfer", "merge", "other", "apply")


class StepTimer:
    """Sums of each phase's seconds over the steps recorded since the last `reset`."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.totals = dict.fromkeys(PHASES, 0.0)
        self.steps = 0

    def record(self, compute: float, synchronize: float, apply: float, stats: Any) -> None:
        """Adds one step; `stats` is the sparse optimizer's last_stats, None for dense."""
        if stats is None:
            parts = {"transfer": synchronize}
        else:
            merge = stats.merge_seconds + stats.write_seconds
            parts = {"select": stats.select_seconds, "wait": stats.wait_seconds,
                     "transfer": stats.transfer_seconds, "merge": merge}
            parts["other"] = max(0.0, synchronize - sum(parts.values()))
        for phase, seconds in {"compute": compute, "apply": apply, **parts}.items():
            self.totals[phase] += seconds
        self.steps += 1

    def means(self) -> dict[str, float]:
        """Mean seconds per step of each phase."""
        return {phase: total / max(self.steps, 1) for phase, total in self.totals.items()}


def timed_step(optimizer: torch.optim.Optimizer, forward_backward: Callable[[], float],
               timer: StepTimer, clip: Optional[Callable[[], Any]] = None,
               clip_first: bool = False) -> float:
    """zero_grad, forward_backward() (returns the loss), synchronize, clip, step (clip_first:
    clip, then synchronize); returns the loss and records the phases in `timer`."""
    optimizer.zero_grad()
    start = time.perf_counter()
    loss = forward_backward()
    if clip is not None and clip_first:
        clip()
    computed = time.perf_counter()
    optimizer.synchronize()
    synchronized = time.perf_counter()
    if clip is not None and not clip_first:
        clip()
    with optimizer.skip_synchronize():
        optimizer.step()
    applied = time.perf_counter()
    timer.record(computed - start, synchronized - computed, applied - synchronized,
                 getattr(optimizer, "last_stats", None))
    return loss
