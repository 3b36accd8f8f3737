"""The exchanges the union schemes share (MiCRO, ExDyna, sketched SGD, exact gTop-k).

    gather_indices    every worker's selected indices: an all-gather of the counts, then of
                      the indices (variable counts)
    sum_at            the sum over workers of every worker's accumulated values at one global
                      index set I (the same on every worker), by one sum all-reduce; the
                      residual is cleared at I
    sum_counted       one sum all-reduce with its time and bytes counted (also the threshold
                      schemes' histogram and the sketch's table)

On tensors, where the state is torch tensors on a device and either one worker runs or the
transport sends tensors from that device (`on_device`; torch.distributed: a GPU under NCCL, the
CPU under Gloo), the same exchanges without a host copy of the sets or the sums:

    gather_indices_tensors   the counts all-gathered on the host (the tensors' lengths are known
                             there), then the indices padded to the largest count, all-gathered
                             as tensors and cut back (`Transport.allgather_tensors`)
    sum_at_tensors           sum_at with I and the taken entries as tensors on the residual's
                             device: the sum by `Transport.allreduce_sum_tensors`
    sum_counted_tensors      sum_counted of a tensor

Each computes what its host twin computes, in the same float32 operations and order (the
all-reduce's own summation order is the transport's: the same as the host all-reduce's where
both sum in rank order), and counts the same bytes. At P = 1 none sends anything, and none
waits for the device.

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

from gtopk_hvd import ops
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
    _count_gather(stats, counts, transport.rank, mine.itemsize)
    return everyone, counts


def _count_gather(stats: ReductionStats, counts: np.ndarray, rank: int, itemsize: int) -> None:
    """A ring all-gather's bytes of the counts and of sets of `counts` indices (module
    docstring)."""
    size, total = counts.size, int(counts.sum())
    stats.bytes_received += itemsize * (total - int(counts[rank])) + 8 * (size - 1)
    stats.bytes_sent += itemsize * (total - int(counts[(rank + 1) % size])) + 8 * (size - 1)
    stats.messages_sent += 2 * (size - 1)
    stats.rounds += size - 1


def sum_counted(transport: Transport, array: np.ndarray, stats: ReductionStats) -> np.ndarray:
    """array = its sum over workers, in place (one all-reduce, none at P = 1), its time and a
    ring's bytes counted in stats; returns array."""
    size = transport.size
    if size > 1:
        start = time.perf_counter()
        transport.allreduce_sum(array)
        stats.add_exchange(0.0, time.perf_counter() - start)
        _count_allreduce(stats, size, array.nbytes)
    return array


def _count_allreduce(stats: ReductionStats, size: int, nbytes: int) -> None:
    """A ring all-reduce's bytes of `nbytes` (module docstring)."""
    ring = 2 * (size - 1) * nbytes // size
    stats.bytes_sent += ring
    stats.bytes_received += ring
    stats.messages_sent += 2 * (size - 1)
    stats.rounds += 2 * (size - 1)


def sum_at(transport: Transport, backend: ArrayBackend, residual: Any, indices: np.ndarray,
           stats: ReductionStats, taken: tuple[np.ndarray, np.ndarray] | None = None
           ) -> np.ndarray:
    """V[j] = sum over workers of acc[I[j]]; residual[I] = 0.

    indices: I, host, sorted, the same on every worker. acc is the residual, except at the
    entries this worker already took out of it (taken = (indices, values), host, sorted: the
    values stand in for the residual there). The gather, the add and the clear are
    `ops.take_at` where the residual lies (the sets brought there), then V, on the host, is
    summed.
    """
    if taken is not None:
        taken = (backend.index(taken[0]), backend.from_host(taken[1]))
    values = ops.take_at(residual, backend.index(indices), taken)
    values = backend.to_host(values).astype(np.float32, copy=False)
    sum_counted(transport, values, stats)
    return values


# -- the same exchanges on tensors ---------------------------------------------------------


def on_device(transport: Transport, backend: ArrayBackend) -> bool:
    """Whether the union exchange can keep the sets in the state's tensors: a torch state, and
    one worker (nothing is sent) or a transport that sends tensors from the state's device."""
    return backend.name == "torch" and (transport.size == 1
                                        or transport.takes_tensors_on(backend.device))


def gather_indices_tensors(transport: Transport, mine: Any, stats: ReductionStats,
                           counts: np.ndarray | None = None) -> tuple[Any, np.ndarray]:
    """`gather_indices` for a 1-D tensor of indices on the transport's tensor device (any device
    at P = 1): (every worker's indices in rank order, a tensor there; the counts per rank, host).
    The counts' all-gather is a host one (each length is known on the host without reading the
    tensor) and is the wait; the indices travel padded to the largest count and are cut back,
    so the only device work is one copy into the padded buffer and one concatenation. Bytes as
    `gather_indices` counts them (the sets, not the padding). counts: every worker's count,
    already gathered (on the device, then read with other values: MiCRO's lockstep), or None."""
    import torch

    size, n = transport.size, int(mine.numel())
    if size == 1:
        return mine, np.array([n], np.int64)
    start = time.perf_counter()
    if counts is None:
        counts = transport.allgather(np.array([n], np.int64))[:, 0]
    ready = time.perf_counter()
    width = int(counts.max())
    if width:
        padded = torch.zeros(width, dtype=mine.dtype, device=mine.device)
        padded[:n] = mine
        gathered = torch.empty(size * width, dtype=mine.dtype, device=mine.device)
        transport.allgather_tensors([padded], [gathered])
        everyone = torch.cat([gathered[r * width:r * width + int(counts[r])]
                              for r in range(size)])
    else:
        everyone = mine[:0]
    stats.add_exchange(ready - start, time.perf_counter() - ready)
    _count_gather(stats, counts, transport.rank, mine.element_size())
    return everyone, counts


def sum_counted_tensors(transport: Transport, tensor: Any, stats: ReductionStats) -> Any:
    """`sum_counted` of a float32 tensor on the transport's tensor device (any device at
    P = 1), in place by `Transport.allreduce_sum_tensors`; returns it."""
    size = transport.size
    if size > 1:
        start = time.perf_counter()
        transport.allreduce_sum_tensors([tensor])
        stats.add_exchange(0.0, time.perf_counter() - start)
        _count_allreduce(stats, size, tensor.numel() * tensor.element_size())
    return tensor


def sum_at_tensors(transport: Transport, residual: Any, indices: Any, stats: ReductionStats,
                   taken: tuple[Any, Any] | None = None, skip: Any = None) -> Any:
    """`sum_at` on tensors: V[j] = sum over workers of acc[I[j]]; residual[I] = 0.

    residual: float32 tensor; indices: I, a sorted tensor of indices on its device, the same on
    every worker; taken = (indices, values): this worker's entries already taken out of the
    residual, index-sorted tensors there (indices of I's dtype). V is a new float32 tensor
    there. As on the host, acc[I[j]] = residual[I[j]] (+ the taken value where I[j] is taken,
    found by binary search: one rounding): the gather, the add and the clear are one call
    (`ops.take_at`: on a GPU one launch, no host wait), then V is summed.
    skip: a device skip flag (`gtopk_hvd.core.skip`): when set, residual[I] keeps its
    values (chosen on the device)."""
    values = ops.take_at(residual, indices, taken, skip)
    return sum_counted_tensors(transport, values, stats)
