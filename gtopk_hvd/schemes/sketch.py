"""Sketched SGD (Ivkin et al., NeurIPS 2019): a count sketch of the accumulated gradient,
all-reduced densely, its heavy hitters, and a second round for their exact values (registered
as "sketch").

On worker p with acc_p = r_p + g_p (d entries), a table S of `rows` x `columns` and, for each row
j, a bucket h_j(i) in [0, columns) and a sign s_j(i) in {-1, +1} drawn by hashing i with the
configuration's seed (the same on every worker):

    S_p[j, b] = sum over i with h_j(i) = b of s_j(i) acc_p[i]       (sketches are linear)
    S = sum over p of S_p                                   (one dense all-reduce of rows x columns)
    est(i) = median over j of s_j(i) S[j, h_j(i)]           (every worker, all d entries)
    I = the k largest |est| (the same on every worker: S is)
    second_round:    V = sum over p of acc_p[I] (one all-reduce of k values, `union.sum_at`),
                     r_p = acc_p with r_p[I] = 0: applied + every residual = every gradient
    no second round: V = est(I), r_p[I] = 0: what the sketch misestimated at I is lost

Bytes per worker per step: 8 rows columns (P-1)/P, plus 8k (P-1)/P for the second round. The
table must be much larger than k for the heavy hitters to stand out (the authors: 5 x 10k),
so it pays where d is much larger than 10 rows k. Recovering costs rows reads of the table at d
positions per step on every worker. Options:

    rows          rows of the table (default 5; odd is best, the median of an even count is
                  the mean of the middle two)
    columns       columns of the table (default: 10 k at the configured density)
    second_round  True (default) or False

Needs granularity "model" and float32 on the wire; keeps no state between steps (the hashes
follow from the seed).
"""

from __future__ import annotations

import math
import time
from typing import Any

import numpy as np

from gtopk_hvd import ops
from gtopk_hvd.density import Budget
from gtopk_hvd.options import check_flag, check_integer
from gtopk_hvd.reductions.result import ReductionStats
from gtopk_hvd.schemes.base import SCHEMES, Exchange, Scheme
from gtopk_hvd.schemes.union import check_fused_float32, sum_at, sum_counted

CACHE_ENTRIES = 1 << 24  # rows x d at most this: the buckets and signs (8 bytes an entry) are
# kept between steps; beyond, they are hashed again at every step
CHUNK = 1 << 20


def mix32(x: np.ndarray) -> np.ndarray:
    """MurmurHash3's 32-bit finaliser (a bijection of uint32 that mixes every bit)."""
    x = x ^ (x >> np.uint32(16))
    x = x * np.uint32(0x85EBCA6B)
    x = x ^ (x >> np.uint32(13))
    x = x * np.uint32(0xC2B2AE35)
    return x ^ (x >> np.uint32(16))


class CountSketch:
    """The hashes of one table: buckets and signs of the indices [0, d) for each row."""

    def __init__(self, rows: int, columns: int, d: int, seed: int) -> None:
        self.rows, self.columns, self.d = rows, columns, d
        keys = np.random.default_rng([seed, 0x5EED]).integers(0, 2**32, (rows, 2),
                                                               dtype=np.uint64)
        self.keys = keys.astype(np.uint32)
        self._cache = [self._hashes(j, 0, d) for j in range(rows)] if (
            rows * d <= CACHE_ENTRIES) else None

    def _hashes(self, row: int, begin: int, end: int) -> tuple[np.ndarray, np.ndarray]:
        index = np.arange(begin, end, dtype=np.uint32)
        bucket = (mix32(index ^ self.keys[row, 0]).astype(np.uint64) * np.uint64(self.columns)
                  >> np.uint64(32)).astype(np.int32)
        sign = np.where(mix32(index ^ self.keys[row, 1]) >> np.uint32(31), -1.0, 1.0)
        return bucket, sign.astype(np.float32)

    def _chunks(self, row: int):
        if self._cache is not None:
            yield 0, self.d, *self._cache[row]
            return
        for begin in range(0, self.d, CHUNK):
            end = min(self.d, begin + CHUNK)
            yield begin, end, *self._hashes(row, begin, end)

    def sketch(self, acc: np.ndarray) -> np.ndarray:
        """S[j, b] = sum of s_j(i) acc[i] over h_j(i) = b, float32 (sums in float64)."""
        table = np.zeros((self.rows, self.columns), np.float64)
        for j in range(self.rows):
            for begin, end, bucket, sign in self._chunks(j):
                table[j] += np.bincount(bucket, weights=acc[begin:end] * sign,
                                        minlength=self.columns)
        return table.astype(np.float32)

    def estimate(self, table: np.ndarray) -> np.ndarray:
        """est(i) = median over rows of s_j(i) table[j, h_j(i)], float32, for all d."""
        out = np.empty(self.d, np.float32)
        for begin in range(0, self.d, CHUNK):
            end = min(self.d, begin + CHUNK)
            rows = np.empty((self.rows, end - begin), np.float32)
            for j in range(self.rows):
                if self._cache is not None:
                    bucket, sign = (a[begin:end] for a in self._cache[j])
                else:
                    bucket, sign = self._hashes(j, begin, end)
                rows[j] = table[j, bucket] * sign
            out[begin:end] = np.median(rows, axis=0)
        return out


@SCHEMES.register("sketch")
class Sketch(Scheme):

    option_names = ("rows", "columns", "second_round")

    @classmethod
    def check(cls, config: Any) -> None:
        check_fused_float32(config)
        options = dict(config.options)
        check_integer("rows", options.get("rows", 5), 1,
                      fix="the count sketch's rows (default 5; odd is best)")
        if options.get("columns") is not None:
            check_integer("columns", options["columns"], 1,
                          fix="the count sketch's columns, or None (the default): 10 k")
        check_flag("second_round", options.get("second_round", True),
                   fix="True (the default): exact values of the heavy hitters; False: the "
                       "sketch's estimates")

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        options = dict(self.config.options)
        self.d = sum(self.sizes)
        k = max(1, math.ceil(self.config.density * self.d))
        columns = options.get("columns") or 10 * k
        self.second_round = bool(options.get("second_round", True))
        self.table = CountSketch(int(options.get("rows", 5)), int(columns), self.d,
                                 self.config.seed)

    def exchange(self, gradient: Any, residual: Any, budget: Budget, step: int,
                 clear_gradient: bool) -> Exchange:
        start = time.perf_counter()
        stats = ReductionStats()
        residual += gradient
        if clear_gradient:
            gradient[:] = 0
        acc = self.backend.to_host(residual)
        table = self.table.sketch(acc)
        select_seconds = time.perf_counter() - start
        sum_counted(self.transport, table, stats)
        merge_start = time.perf_counter()
        estimate = self.table.estimate(table)
        union, estimated = ops.topk_abs(estimate, min(budget.k, self.d))
        union = union.astype(self.index_dtype, copy=False)
        stats.merge_seconds += time.perf_counter() - merge_start
        taken = self.backend.index(union)
        if self.second_round:
            values = sum_at(self.transport, self.backend, residual, union, stats)
        else:
            values = estimated
            residual[taken] = 0
        return Exchange(union, values, taken, stats, select_seconds)
