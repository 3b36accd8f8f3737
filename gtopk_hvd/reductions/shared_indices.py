"""The reduction for sparsifiers whose indices every worker knows (registered as "allreduce").

When every worker selected the same indices I (e.g. random-k from a generator seeded alike on
all), no index needs sending: the global set is (I, sum over workers of V_p), one dense
all-reduce of k float32 values, and every local entry survives.
"""

from __future__ import annotations

import numpy as np

from gtopk_hvd.reductions.base import REDUCTIONS, Reduction
from gtopk_hvd.reductions.dense import sum_over_workers
from gtopk_hvd.reductions.result import SparseResult


@REDUCTIONS.register("allreduce")
class SharedIndexAllreduce(Reduction):
    needs_shared_indices = True
    wire_dtypes = ("float32",)

    @classmethod
    def wire(cls, workers: int, k: int, entry_bytes: int) -> tuple[float, float]:
        """A ring all-reduce of k float32 values, no index."""
        if workers <= 1:
            return 0.0, 0.0
        return 2.0 * (workers - 1), 2.0 * (workers - 1) / workers * 4 * k

    def reduce(self, indices: np.ndarray, values: np.ndarray, k: int) -> SparseResult:
        summed = np.array(values, dtype=np.float32)  # a copy: the caller's set stays as it was
        stats = sum_over_workers(self.transport, summed)
        return SparseResult(np.asarray(indices), summed, np.ones(len(indices), bool), stats)
