"""Top-k S-SGD's reduction: an all-gather of every worker's set (registered as "allgather")."""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from gtopk_hvd import ops
from gtopk_hvd._arrays import framework_of
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
    """`topk_allgather` over a resolved transport. One worker holding an index-sorted set (a
    sparsifier's) gathers nothing: the set is the union, each value summed from +0.0 as the
    general path sums it."""
    indices = np.ascontiguousarray(indices)
    values = np.ascontiguousarray(values, dtype=np.float32)
    stats = ReductionStats(rounds=transport.size - 1)
    if transport.size == 1 and bool(np.all(indices[1:] > indices[:-1])):
        return SparseResult(indices, values + np.float32(0.0), np.ones(indices.size, bool),
                            stats, all_survived=True)
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
    return SparseResult(union, summed, np.ones(indices.size, bool), stats, all_survived=True)


def allgather_tensors(transport: Transport, indices: Any, values: Any) -> SparseResult:
    """`allgather_sets` for k-entry sets held as torch tensors on the transport's tensor device
    (or any device for one worker): one all-gather of the indices and one of the values, there,
    then the sets merged in rank order by `ops.merge_topk` with room for every entry, so each
    value is the sum of the workers' values in rank order, bit for bit the host result (whose
    sums start from +0.0: the final + 0.0 turns a lone -0.0 into +0.0 as there). Nothing is
    marked (`survived` is None): every entry is in the global set (`all_survived`)."""
    import torch

    size, k = transport.size, len(values)
    stats = ReductionStats(rounds=size - 1)
    if size == 1:
        return SparseResult(indices, values + 0.0, None, stats, all_survived=True)
    all_indices = torch.empty(size * k, dtype=indices.dtype, device=indices.device)
    all_values = torch.empty(size * k, dtype=values.dtype, device=values.device)
    start = time.perf_counter()
    transport.allgather_tensors([indices, values], [all_indices, all_values])
    stats.add_exchange(0.0, time.perf_counter() - start)
    start = time.perf_counter()
    union, summed = all_indices[:k], all_values[:k]
    for rank in range(1, size):
        part = slice(rank * k, (rank + 1) * k)
        union, summed = ops.merge_topk(union, summed, all_indices[part], all_values[part],
                                       size * k)
    stats.merge_seconds = time.perf_counter() - start
    entry = indices.element_size() + 4
    stats.bytes_received = stats.bytes_sent = entry * k * (size - 1)
    stats.messages_sent = 2 * (size - 1)
    return SparseResult(union, summed + 0.0, None, stats, all_survived=True)


@REDUCTIONS.register("allgather")
class AllgatherReduction(Reduction):
    """Every worker's set, summed; values travel as float32 (other wire dtypes are refused)."""

    wire_dtypes = ("float32",)

    @classmethod
    def wire(cls, workers: int, k: int, entry_bytes: int) -> tuple[float, float]:
        """A ring all-gather: P - 1 messages of k entries."""
        return float(workers - 1), float((workers - 1) * entry_bytes * k)
    takes_tensors = True

    def reduce(self, indices: Any, values: Any, k: int) -> SparseResult:
        if framework_of(values) == "torch":
            return allgather_tensors(self.transport, indices, values)
        return allgather_sets(self.transport, indices, values)
