"""Wall-clock timing helpers for the benchmarks."""

from __future__ import annotations

import statistics
import time
from typing import Callable


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
