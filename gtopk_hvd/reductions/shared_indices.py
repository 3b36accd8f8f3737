"""The reduction for sparsifiers whose indices every worker knows (registered as "allreduce").

When every worker selected the same indices I (e.g. random-k from a generator seeded alike on
all), no index needs sending: the global set is (I, sum over workers of V_p), one dense
all-reduce of k float32 values, and every local entry survives.
"""

from __future__ import annotations

import time

import numpy as np

from gtopk_hvd.reductions.base import REDUCTIONS, Reduction
from gtopk_hvd.reductions.result import ReductionStats, SparseResult


@REDUCTIONS.register("allreduce")
class SharedIndexAllreduce(Reduction):
    needs_shared_indices = True
    wire_dtypes = ("float32",)

    def reduce(self, indices: np.ndarray, values: np.ndarray, k: int) -> SparseResult:
        summed = np.array(values, dtype=np.float32)  # a copy: the caller's set stays as it was
        stats = ReductionStats()
        size = self.transport.size
        if size > 1:
            start = time.perf_counter()
            self.transport.allreduce_sum(summed)
            stats.comm_seconds = time.perf_counter() - start
            stats.bytes_sent = stats.bytes_received = 2 * (size - 1) * summed.nbytes // size
            stats.rounds = 2 * (size - 1)
        return SparseResult(np.asarray(indices), summed, np.ones(len(indices), bool), stats)
