"""Dense S-SGD's all-reduce, the baseline the sparse reductions are measured against."""

from __future__ import annotations

import time

import numpy as np

from gtopk_hvd.reductions.result import ReductionStats
from gtopk_hvd.reductions.wait_probe import probe_everyone, resolve_wait_probe
from gtopk_hvd.transports import Transport, resolve_transport


def dense_allreduce(array: np.ndarray, transport: Transport | str | None = None,
                    wait_probe: bool | None = None) -> ReductionStats:
    """Dense S-SGD baseline: array = sum over workers, in place (MPI_Allreduce).

    Byte counters are those of a ring all-reduce: 2 (P-1)/P of the array each way.
    wait_probe (None: GTOPK_HVD_WAIT_PROBE if set, else the transport's default; every worker
    must agree): a one-value
    all-gather first, whose time is stats.wait_seconds (until the slowest worker arrived, plus
    one small collective's latency); the all-reduce's is stats.transfer_seconds.
    """
    return sum_over_workers(resolve_transport(transport), array, wait_probe)


def sum_over_workers(transport: Transport, array: np.ndarray,
                     wait_probe: bool | None = None) -> ReductionStats:
    """`dense_allreduce` over a resolved transport."""
    stats = ReductionStats()
    wait = 0.0
    if transport.size > 1 and resolve_wait_probe(wait_probe, transport):
        wait = probe_everyone(transport)
    start = time.perf_counter()
    if transport.size > 1:
        transport.allreduce_sum(array)
    stats.add_exchange(wait, time.perf_counter() - start)
    ring_bytes = 2 * (transport.size - 1) * array.nbytes // transport.size
    stats.bytes_sent = stats.bytes_received = int(ring_bytes)
    stats.rounds = 2 * (transport.size - 1)
    return stats
