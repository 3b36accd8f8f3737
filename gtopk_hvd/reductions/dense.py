"""Dense S-SGD's all-reduce, the baseline the sparse reductions are measured against."""

from __future__ import annotations

import time

import numpy as np

from gtopk_hvd.reductions.result import ReductionStats
from gtopk_hvd.transports import Transport, resolve_transport


def dense_allreduce(array: np.ndarray,
                    transport: Transport | str | None = None) -> ReductionStats:
    """Dense S-SGD baseline: array = sum over workers, in place (MPI_Allreduce).

    Byte counters are those of a ring all-reduce: 2 (P-1)/P of the array each way.
    """
    transport = resolve_transport(transport)
    start = time.perf_counter()
    if transport.size > 1:
        transport.allreduce_sum(array)
    stats = ReductionStats(comm_seconds=time.perf_counter() - start)
    ring_bytes = 2 * (transport.size - 1) * array.nbytes // transport.size
    stats.bytes_sent = stats.bytes_received = int(ring_bytes)
    stats.rounds = 2 * (transport.size - 1)
    return stats
