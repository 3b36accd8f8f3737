"""Wall-clock timing helpers for the benchmarks (on one worker, or the slowest of all)."""

from __future__ import annotations

import statistics
import time
from typing import Callable

import numpy as np

from gtopk_hvd.transports import Transport


def median_seconds(fn: Callable[[], object], repeats: int, warmup: int = 1,
                   synchronize: Callable[[], None] = lambda: None) -> float:
    """Median wall time of fn() over `repeats` runs after `warmup` runs."""
    for _ in range(warmup):
        fn()
    synchronize()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def barrier(transport: Transport) -> None:
    """Returns once every worker has called it (a one-value all-gather)."""
    transport.allgather(np.zeros(1))


def slowest(transport: Transport, seconds: float) -> float:
    """The largest of every worker's `seconds`."""
    return float(transport.allgather(np.array([seconds]))[:, 0].max())
