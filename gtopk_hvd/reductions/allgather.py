"""Top-k S-SGD's reduction: an all-gather of every worker's set (registered as "allgather")."""

from __future__ import annotations

import time

import numpy as np

from gtopk_hvd.reductions.base import REDUCTIONS, Reduction
from gtopk_hvd.reductions.result import ReductionStats, SparseResult
from gtopk_hvd.transports import Transport, resolve_transport


def topk_allgather(indices: np.ndarray, values: np.ndarray,
                   transport: Transport | str | None = None) -> SparseResult:
    """Top-k S-SGD baseline: every worker gathers every local set and sums them.

    The result is the union of all sets (up to P k entries), index-sorted, each value the sum
    of the workers' values in rank order. Byte counters are those of a ring all-gather: this
    worker receives every other worker's set and forwards all but one.
    stats.wait_seconds is the all-gather of the set sizes (one value per worker: it ends when
    the slowest worker arrives, so it is the readiness probe of `wait_probe`, at no extra
    message); stats.transfer_seconds the two all-gathers of the sets.
    """
    return allgather_sets(resolve_transport(transport), indices, values)


def allgather_sets(transport: Transport, indices: np.ndarray, values: np.ndarray
                   ) -> SparseResult:
    """`topk_allgather` over a resolved transport."""
    indices = np.ascontiguousarray(indices)
    values = np.ascontiguousarray(values, dtype=np.float32)
    stats = ReductionStats(rounds=transport.size - 1)
    start = time.perf_counter()
    counts = transport.allgather(np.array([indices.size], dtype=np.int64))[:, 0]
    ready = time.perf_counter()
    all_indices = transport.allgatherv(indices, counts)
    all_values = transport.allgatherv(values, counts)
    stats.add_exchange(ready - start, time.perf_counter() - ready)

    start = time.perf_counter()
    union, position = np.unique(all_indices, return_inverse=True)
    summed = np.zeros(union.size, dtype=np.float32)
    np.add.at(summed, position, all_values)  # unbuffered: sums in rank order on every worker
    stats.merge_seconds = time.perf_counter() - start

    entry = indices.itemsize + 4
    others = counts.sum() - indices.size
    stats.bytes_received = int(entry * others + 8 * (transport.size - 1))
    forwarded = counts.sum() - counts[(transport.rank + 1) % transport.size]
    if transport.size > 1:
        stats.bytes_sent = int(entry * forwarded + 8 * (transport.size - 1))
    stats.messages_sent = 3 * (transport.size - 1)
    return SparseResult(union, summed, np.ones(indices.size, bool), stats)


@REDUCTIONS.register("allgather")
class AllgatherReduction(Reduction):
    """Every worker's set, summed; values travel as float32 (other wire dtypes are refused)."""

    wire_dtypes = ("float32",)

    def reduce(self, indices: np.ndarray, values: np.ndarray, k: int) -> SparseResult:
        return allgather_sets(self.transport, indices, values)
