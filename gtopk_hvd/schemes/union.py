"""The exchanges the union schemes share (MiCRO, ExDyna, sketched SGD, exact gTop-k).

    gather_indices    every worker's selected indices: an all-gather of the counts, then of
                      the indices (variable counts)
    sum_at            the sum over workers of every worker's accumulated values at one global
                      index set I (the same on every worker), by one sum all-reduce; the
                      residual is cleared at I
    sum_counted       one sum all-reduce with its time and bytes counted (also the threshold
                      schemes' histogram and the sketch's table)

With sum_at, what is applied at I is the exact sum of every worker's accumulated gradient there
and nothing of it stays behind, so "applied + every residual = every gradient" holds to the
float32 rounding of the sums. Byte counters are a ring's, as the other reductions count them:
all-gather: this worker receives every other set and forwards all but its right neighbour's;
all-reduce: 2 (P-1)/P of the array each way.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from gtopk_hvd.backend import ArrayBackend
from gtopk_hvd.options import refuse
from gtopk_hvd.reductions.result import ReductionStats
from gtopk_hvd.transports.base import Transport


def check_fused_float32(config: Any) -> None:
    """Raises ValueError unless `config` selects over the fused gradient (granularity "model")
    and sends float32 values: what the union schemes need."""
    name = config.scheme
    if config.granularity != "model":
        refuse("granularity", f"'model' for scheme {name!r}, which works on the fused "
               "gradient", config.granularity, "leave granularity out (it is 'model' by default)")
    if config.wire_dtype != "float32":
        refuse("wire_dtype", f"'float32' for scheme {name!r}, which sums float32 values",
               config.wire_dtype, "leave wire_dtype out, or use gTop-k (Compression.gtopk), "
               "which sends float16 and bfloat16")


def gather_indices(transport: Transport, mine: np.ndarray, stats: ReductionStats
                   ) -> tuple[np.ndarray, np.ndarray]:
    """(every worker's indices in rank order, the counts per rank). The counts' all-gather
    ends when the slowest worker arrives: it is the wait (stats.wait_seconds)."""
    size = transport.size
    if size == 1:
        return mine, np.array([mine.size], np.int64)
    start = time.perf_counter()
    counts = transport.allgather(np.array([mine.size], np.int64))[:, 0]
    ready = time.perf_counter()
    everyone = transport.allgatherv(np.ascontiguousarray(mine), counts)
    stats.add_exchange(ready - start, time.perf_counter() - ready)
    total = int(counts.sum())
    stats.bytes_received += mine.itemsize * (total - mine.size) + 8 * (size - 1)
    stats.bytes_sent += (mine.itemsize * (total - int(counts[(transport.rank + 1) % size]))
                         + 8 * (size - 1))
    stats.messages_sent += 2 * (size - 1)
    stats.rounds += size - 1
    return everyone, counts


def sum_counted(transport: Transport, array: np.ndarray, stats: ReductionStats) -> np.ndarray:
    """array = its sum over workers, in place (one all-reduce, none at P = 1), its time and a
    ring's bytes counted in stats; returns array."""
    size = transport.size
    if size > 1:
        start = time.perf_counter()
        transport.allreduce_sum(array)
        stats.add_exchange(0.0, time.perf_counter() - start)
        ring = 2 * (size - 1) * array.nbytes // size
        stats.bytes_sent += ring
        stats.bytes_received += ring
        stats.messages_sent += 2 * (size - 1)
        stats.rounds += 2 * (size - 1)
    return array


def sum_at(transport: Transport, backend: ArrayBackend, residual: Any, indices: np.ndarray,
           stats: ReductionStats, taken: tuple[np.ndarray, np.ndarray] | None = None
           ) -> np.ndarray:
    """V[j] = sum over workers of acc[I[j]]; residual[I] = 0 after.

    indices: I, host, sorted, the same on every worker. acc is the residual, except at the
    entries this worker already took out of it (taken = (indices, values), host, sorted: the
    values stand in for the residual there).
    """
    index = backend.index(indices)
    values = backend.to_host(residual[index]).astype(np.float32, copy=True)
    if taken is not None and taken[0].size:
        position = np.searchsorted(indices, taken[0])
        inside = position < indices.size
        inside[inside] = indices[position[inside]] == taken[0][inside]
        values[position[inside]] += taken[1][inside]
    sum_counted(transport, values, stats)
    residual[index] = 0
    return values
