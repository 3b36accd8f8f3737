"""Wall-clock timing helpers for the benchmarks (on one worker, or the slowest of all)."""

from __future__ import annotations

import os
import statistics
import time
from dataclasses import dataclass
from typing import Callable

import numpy as np

from gtopk_hvd import _C
from gtopk_hvd.transports import Transport

SPREAD_WARNING = 0.25
"""A read pass whose repeats spread by more than this share of their median (min to max) marks
the machine as loaded."""


@dataclass(frozen=True)
class Timing:
    """Wall times of the repeats of one call: their median, fastest and slowest."""

    median: float
    low: float
    high: float

    @property
    def spread(self) -> float:
        """(slowest - fastest) / median: 0 on a quiet machine, large on a loaded one."""
        return (self.high - self.low) / self.median if self.median > 0 else 0.0


def timed(fn: Callable[[], object], repeats: int, warmup: int = 1,
          synchronize: Callable[[], None] = lambda: None) -> Timing:
    """Wall times of fn() over `repeats` runs after `warmup` runs."""
    for _ in range(warmup):
        fn()
    synchronize()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        synchronize()
        times.append(time.perf_counter() - start)
    return Timing(statistics.median(times), min(times), max(times))


def median_seconds(fn: Callable[[], object], repeats: int, warmup: int = 1,
                   synchronize: Callable[[], None] = lambda: None) -> float:
    """Median wall time of fn() over `repeats` runs after `warmup` runs."""
    return timed(fn, repeats, warmup, synchronize).median


def load_warning(read: Timing | None = None) -> str | None:
    """A warning when the machine looks loaded (the 1-minute load average above the cores
    this process may use, or the read pass's repeats spread by more than SPREAD_WARNING of
    their median), else None: absolute times then drift, ratios less so."""
    reasons = []
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (
        os.cpu_count() or 1)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0
    if load > cores:
        reasons.append(f"the load average ({load:.1f}) exceeds the {cores} cores")
    if read is not None and read.spread > SPREAD_WARNING:
        reasons.append(f"the read pass's repeats spread by {read.spread:.0%} of their median")
    if not reasons:
        return None
    return (f"warning: the machine looks loaded ({'; '.join(reasons)}): the times are "
            "unreliable; rerun on a quiet machine, or read the ratios only")


def barrier(transport: Transport) -> None:
    """Returns once every worker has called it (a one-value all-gather)."""
    transport.allgather(np.zeros(1))


def slowest(transport: Transport, seconds: float) -> float:
    """The largest of every worker's `seconds`."""
    return float(transport.allgather(np.array([seconds]))[:, 0].max())


def read_floor(x: np.ndarray) -> int:
    """One multi-threaded read of a contiguous float32 / float64 numpy array by the kernels
    (`_C.read_pass`, its largest magnitude key): the floor of any pass over it."""
    if x.dtype not in (np.float32, np.float64) or not x.flags.c_contiguous:
        raise TypeError("read_floor reads a contiguous float32 / float64 array")
    return _C.read_pass(_C.ValueType.__members__[x.dtype.name], x, x.size)
