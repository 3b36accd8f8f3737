"""Sketched SGD (Ivkin et al., NeurIPS 2019): a count sketch of the accumulated gradient,
all-reduced densely, its heavy hitters, and a second round for their exact values (registered
as "sketch").

On worker p with acc_p = r_p + g_p (d entries), a table S of `rows` x `columns` and, for each row
j, a bucket h_j(i) in [0, columns) and a sign s_j(i) in {-1, +1} hashed from i and the row's two
32-bit keys (drawn from the configuration's seed: the same on every worker), computed inside
the kernels (gtopk/count_sketch.h), never stored:

    word(i, key) = mix32(lo32(i) ^ key ^ mix32(hi32(i)))       (mix32: MurmurHash3's finaliser)
    h_j(i) = (word(i, key0_j) columns) >> 32,   s_j(i) = -1 iff word(i, key1_j) >> 31
    S_p[j, b] = sum over i with h_j(i) = b of s_j(i) acc_p[i]       (sketches are linear)
    S = sum over p of S_p                                   (one dense all-reduce of rows x columns)
    est(i) = median over j of s_j(i) S[j, h_j(i)]           (every worker, all d entries)
    I = the k largest |est| (the same on every worker: S is)
    second_round:    V = sum over p of acc_p[I] (one all-reduce of k values, `union.sum_at`),
                     r_p = acc_p with r_p[I] = 0: applied + every residual = every gradient
    no second round: V = est(I), r_p[I] = 0: what the sketch misestimated at I is lost

S_p is summed exactly: as the integers rint(acc_p[i] 2^s), s = 62 - ceil(log2 d) - E with every
finite |acc_p| < 2^E (a resolution of about 2^-37 of the largest entry at d = 2^25), each bucket
rounded once to float32, so that the table does not depend on the threads or the device (CPU and
CUDA give the same bits). A NaN in acc_p makes its buckets NaN, so est is NaN at every index
sharing a bucket with it (about rows d / columns of them) and those come first in the top-k (the
NaN's own index among them while they number at most k). The median of an even number of rows is
(lo + hi) / 2 in float32.

Cost per step on every worker (`ops.sketch_table`, `ops.sketch_select`), in passes over d:
    1   the accumulation r += g (read g and r, write r; g = 0 in it when clearing), with the
        largest finite |acc| for the scale: the pass every error-feedback scheme makes
    1   CPU: the table, row by row over chunks of acc (its reads from cache after the first
        row), `rows` scattered integer adds an entry into one row's sums at a time. CUDA: one
        read of acc per tile of the table (a tile: at most one row, and at most half the L2
        cache of int64 sums: `rows` reads while a row fits), each adding the entries that fall
        in the tile, so that the integer atomics stay in the L2 cache
    1   the selection. CPU: a threshold t sampled from the estimates, then one pass reading one
        bit per row an entry (|S[j, b]| >= t, a 32nd of the table) and computing est(i) only
        where half the rows' bits are set: an entry with fewer cannot reach t (the median of
        rows); a missed guess or a non-finite table computes every estimate into a temporary
        buffer and selects over it. CUDA: the estimates (`rows` hashed reads of the table an
        entry) computed as the selection's passes read them, never stored; 0-1 more passes
        when the sampled guess misses
and O(rows columns + k) besides. Memory: the table; the int64 sums (CPU: of the whole table,
plus one per thread where they fit in 4d bytes; CUDA: of one tile, and the non-finite flags in
the table's own memory); the CPU's bitmaps. Nothing of d entries is kept. The scattered adds,
not the reads of d, set the time (`rows` random read-modify-writes an entry: each costs
several read passes' worth per entry, from any cache), so the step stays tens of read passes
however the passes are arranged; docs/results.md measures it. At P = 1 the table never leaves
the device; at P > 1 on a transport of host arrays it goes to the host for the sum and back
into the same memory. On tensors a step skipped for a non-finite gradient can be decided on the
device (`skips_on_device`; the DDP hook's `skip_on_device`): the table's accumulation and the
clears read the flag, so the step makes no host read.

Bytes per worker per step: 8 rows columns (P-1)/P, plus 8k (P-1)/P for the second round. The
table must be much larger than k for the heavy hitters to stand out (the authors: 5 x 10k),
so it pays where d is much larger than 10 rows k. Options:

    rows          rows of the table (default 5, at most 64; odd is best, the median of an even
                  count is the mean of the middle two)
    columns       columns of the table (default: 10 k at the configured density)
    second_round  True (default) or False

Needs granularity "model" and float32 on the wire and in the residual; keeps no state between
steps (the hashes follow from the seed).

With the state in torch tensors and one worker, or a transport that sends tensors from their
device (`union.on_device`), the table's all-reduce, the selection and the second round stay in
tensors there (`union.sum_counted_tensors`, `union.sum_at_tensors`): no host copy.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from gtopk_hvd import _C, ops
from gtopk_hvd.density import Budget
from gtopk_hvd.options import check_flag, check_integer, refuse
from gtopk_hvd.reductions.result import ReductionStats
from gtopk_hvd.schemes.base import SCHEMES, Exchange, Scheme, Wire, reads_nothing
from gtopk_hvd.schemes.union import (
    check_fused_float32,
    on_device,
    sum_at,
    sum_at_tensors,
    sum_counted,
    sum_counted_tensors,
)

MAX_ROWS: int = int(_C.SKETCH_MAX_ROWS)


def sketch_keys(rows: int, seed: int) -> np.ndarray:
    """The (rows, 2) uint32 hash keys (key0_j: buckets, key1_j: signs) of a seed."""
    keys = np.random.default_rng([seed, 0x5EED]).integers(0, 2**32, (rows, 2), dtype=np.uint64)
    return keys.astype(np.uint32)


@dataclass(frozen=True)
class SketchOptions:
    """The sketch's own options (module docstring), checked when made."""

    rows: int = 5
    columns: int | None = None
    second_round: bool = True

    def __post_init__(self) -> None:
        check_integer("rows", self.rows, 1, fix="the count sketch's rows (default 5; odd is best)")
        if self.rows > MAX_ROWS:
            refuse("rows", f"an integer in [1, {MAX_ROWS}]", self.rows,
                   "the kernels take the median of at most that many rows")
        if self.columns is not None:
            check_integer("columns", self.columns, 1,
                          fix="the count sketch's columns, or None (the default): 10 k")
        check_flag("second_round", self.second_round,
                   fix="True (the default): exact values of the heavy hitters; False: the "
                       "sketch's estimates")


class CountSketch:
    """One table's shape and hash keys; the kernels compute the hashes from them."""

    def __init__(self, rows: int, columns: int, seed: int) -> None:
        self.rows, self.columns = rows, columns
        self.keys = sketch_keys(rows, seed)

    def table(self, gradient: Any, residual: Any, clear_gradient: bool = False,
              skip: Any = None) -> Any:
        """residual += gradient (gradient = 0 if clear_gradient; None: the residual holds r + g
        already; skip: a device skip flag, `ops.sketch_table`'s); returns S_p of the residual,
        (rows, columns) float32 where it lives."""
        return ops.sketch_table(gradient, residual, self.keys, self.columns, clear_gradient,
                                skip=skip)

    def select(self, table: Any, k: int, d: int) -> tuple[Any, Any]:
        """The top-k of |est| of the (summed) table over d entries (indices, values)."""
        return ops.sketch_select(table, self.keys, k, None, d)


@SCHEMES.register("sketch")
class Sketch(Scheme):

    Options = SketchOptions
    takes_accumulated = True  # ops.sketch_table(None, ...) sketches the residual as it is

    @classmethod
    def check(cls, config: Any) -> None:
        check_fused_float32(config)
        super().check(config)

    @classmethod
    def wire(cls, config: Any, workers: int, d: int, k: int, union: float | None = None
             ) -> Wire:
        """The table's all-reduce, then the second round's k values (module docstring)."""
        p, options = workers, cls.options_of(config)
        if p <= 1:
            return Wire(0.0, 0.0)
        ring = (p - 1) / p
        return Wire(4.0 * (p - 1),
                    2 * ring * 4 * (options.rows * (options.columns or 10 * k) + k))

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.d = sum(self.sizes)
        k = max(1, math.ceil(self.config.density * self.d))
        columns = self.options.columns or 10 * k
        self.second_round = bool(self.options.second_round)
        self.sketch = CountSketch(int(self.options.rows), int(columns), self.config.seed)
        self.on_tensors = on_device(self.transport, self.backend)  # decided once

    def skips_on_device(self) -> bool:
        """On tensors (`union.on_device`): the table's accumulation, the second round's clear
        and the no-second-round clear read the flag, and the rest writes no state."""
        return self.on_tensors

    @reads_nothing
    def exchange(self, gradient: Any, residual: Any, budget: Budget, step: int,
                 clear_gradient: bool, skip: Any = None) -> Exchange:
        start = time.perf_counter()
        stats = ReductionStats()
        backend = self.backend
        on_tensors = self.on_tensors
        if skip is not None and not on_tensors:
            raise RuntimeError("gtopk_hvd: a sketch step skipped on the device reached the "
                               "host exchange; skips_on_device() should have been False")
        table = self.sketch.table(gradient, residual, clear_gradient, skip)
        select_seconds = time.perf_counter() - start
        if on_tensors:
            sum_counted_tensors(self.transport, table, stats)
        elif self.transport.size > 1:  # the transport sums host arrays: S = sum of the S_p
            summed = sum_counted(self.transport, backend.to_host(table), stats)
            backend.assign(table, summed)
        merge_start = time.perf_counter()
        indices, estimated = self.sketch.select(table, min(budget.k, self.d), self.d)
        if on_tensors:
            union = taken = backend.as_index_dtype(indices, self.index_dtype)
        else:
            union = backend.to_host(indices).astype(self.index_dtype, copy=False)
            taken = backend.index(union)
        stats.merge_seconds += time.perf_counter() - merge_start
        if not self.second_round:
            if not on_tensors:
                estimated = backend.to_host(estimated).astype(np.float32, copy=False)
            ops.zero_at(residual, taken, skip)
            return Exchange(union, estimated, taken, stats, select_seconds)
        if on_tensors:
            values = sum_at_tensors(self.transport, residual, union, stats, skip=skip)
        else:
            values = sum_at(self.transport, backend, residual, union, stats)
        return Exchange(union, values, taken, stats, select_seconds)
