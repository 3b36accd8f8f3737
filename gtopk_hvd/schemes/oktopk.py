"""Ok-Topk (Li & Hoefler, PPoPP 2022): local threshold selection, a balanced sparse
reduce-scatter and a global threshold over the summed regions (registered as "oktopk").

On worker p of P, with k the step's budget and d the fused size, at step t:

    acc_p = r_p + g_p
    S_p   = { i : |acc_p[i]| >= tau_local }                         (one compare pass; NaN in)
    regions: [0, d) cut at b_0 = 0 <= b_1 <= ... <= b_P = d; region q = [b_q, b_{q+1})
    worker p sends (i, acc_p[i]) for i in S_p n region q to worker q  (sparse reduce-scatter:
        P - 1 point-to-point phases, phase s: to p + s, from p - s, mod P)
    owner q: s[i] = sum over p in rank order, i in S_p, of acc_p[i]   (float32, for every i of
        U_q = the union of the received indices in region q)
    T_q   = { i in U_q : |s[i]| >= tau_global }                      (NaN in)
    I, V  = T_0, ..., T_{P-1} concatenated (all-gather of the counts, then of indices and of
            values): sorted, since the regions are contiguous and in rank order; V = s at I
    r_p   = acc_p, then r_p[S_p n I] = 0

The thresholds are estimated exactly every `reestimate_every` steps (t mod reestimate_every
== 0, the first step, or a step whose k differs from the last estimate's) and reused as they
are in between:

    tau_local  = the k-th largest |acc_p| (`ops.topk_abs`): this worker's own
    b_q        = the regions balanced by the selected counts: every worker counts S_p in
                 n = min(d, 16 P) equal bins of [0, d) (bin j = [j d // n, (j+1) d // n)),
                 one sum all-reduce of the counts (float64: exact integers, the same on every
                 worker) gives C(j) = the count below bin j's lower edge, and b_q = the lower
                 edge of the first bin j with P C(j) >= q C(n) (equal regions if nothing is
                 selected)
    tau_global = the k-th largest |s| over all regions (the smallest if fewer than k), exact
                 in at most two all-gathers of the owners' largest magnitudes (counts, then
                 values; NaN ranks as +Inf): first each owner's largest m = min(k, ceil(2k / P))
                 and tau_1 = their k-th largest; an owner that sent m with the m-th >= tau_1
                 may hold more above the true threshold, so if any does, those owners send
                 their next largest, up to k in all, and tau_global = the k-th largest of both
                 rounds. (tau_1 <= the true threshold, and an owner that is not saturated kept
                 only magnitudes below tau_1 back: both rounds hold the true top k.)

Both thresholds are at least the smallest normal float32 (a zero is never selected). On a
re-estimation step the regions are rebalanced first, then the step runs with the new
thresholds and regions; so on such a step I is exactly the top k of s over U = U_0 u ... u
U_{P-1} (ties included), which is the top k of the sum over workers of acc whenever every
entry of that top k is in every worker's S_p (only the senders' values are in s). In between,
|I| follows how far the magnitudes moved, as in the paper.

Residual: a worker's residual keeps everything it did not send, and what it sent that did not
survive (S_p minus I); only what was applied leaves it. Since V at i in I is the sum of every
sender's acc at i and exactly the senders clear i, what is applied plus every worker's residual
equals the sum of every worker's gradients, to the float32 rounding of the sums: nothing is
dropped (the non-senders at i in I keep their acc[i] for a later step).

Bytes sent per worker per step (a ring's count for the all-gathers, as the union schemes'
`gtopk_hvd.schemes.union`; w = the index itemsize + 4):

    w (|S_p| - |S_p n region p|)                 the reduce-scatter
    + 8 (P - 1) + w (|I| - |T_{p+1 mod P}|)       the all-gather of the survivors
    on a re-estimation step also: 16 (P - 1) n / P (the counts' all-reduce), and per round
    of the global threshold 8 (P - 1) + 4 (M - M_{p+1 mod P}) (M_q: the magnitudes owner q
    sends, M their sum: about 8k (P - 1) / P in the first round)

With |S_p| ~ k and balanced regions a step is about 2w k (P - 1) / P: 16k (P - 1) / P bytes,
2k values and 2k indices, under the paper's 6k (P - 1) / P; a re-estimation step adds about
8k (P - 1) / P + 256 (P - 1) with one round of the global threshold. Between two estimates
|S_p| and |I| follow how the magnitudes moved (several k where the accumulated magnitudes
grow steadily), and the bytes with them. Options:

    reestimate_every   steps between two exact estimates of the thresholds and the regions
                       (default 32, the paper's)

The thresholds, the regions and the k of the last estimate are the scheme's state
(checkpointed with the step). Needs granularity "model" and float32 on the wire. The selection
runs on the state's arrays (numpy, or torch on any device); the exchange on the host.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from gtopk_hvd import ops
from gtopk_hvd.density import Budget
from gtopk_hvd.options import check_integer
from gtopk_hvd.reductions.result import ReductionStats
from gtopk_hvd.schemes.base import SCHEMES, Exchange, Scheme, Wire, reads_nothing
from gtopk_hvd.schemes.threshold import SMALLEST_THRESHOLD
from gtopk_hvd.schemes.union import check_fused_float32, sum_counted
from gtopk_hvd.transports.base import Transport

REESTIMATE_EVERY = 32
"""The paper's period of the exact threshold estimates (in steps)."""
BINS_PER_REGION = 16
"""Bins of the selected counts per worker, from which the regions are balanced."""
TAG_SCATTER = 31
"""Message tag of the sparse reduce-scatter's phases."""


def balance_bins(d: int, size: int) -> int:
    """The number of equal bins of [0, d) the selected counts are counted in."""
    return max(1, min(d, BINS_PER_REGION * size))


def bin_edges(d: int, n_bins: int) -> np.ndarray:
    """The n_bins + 1 bin edges j d // n_bins."""
    return (np.arange(n_bins + 1, dtype=np.int64) * d) // n_bins


def balanced_bounds(counts: np.ndarray, d: int, size: int) -> np.ndarray:
    """The P + 1 region bounds from the selected counts per bin (module docstring): b_q = the
    lower edge of the first bin j with P C(j) >= q C(n)."""
    edges = bin_edges(d, counts.size)
    below = np.concatenate([[0], np.cumsum(counts.astype(np.int64))])  # C(j)
    total = int(below[-1])
    if total == 0:
        return (np.arange(size + 1, dtype=np.int64) * d) // size
    first = np.searchsorted(below * size, np.arange(size + 1, dtype=np.int64) * total, "left")
    bounds = edges[first]
    bounds[0], bounds[-1] = 0, d
    return bounds


def kth_magnitude(magnitudes: np.ndarray, k: int) -> float:
    """The k-th largest of `magnitudes` (NaN as +Inf; the smallest if fewer than k), at least
    the smallest normal float32; that smallest for an empty array."""
    if magnitudes.size == 0:
        return SMALLEST_THRESHOLD
    keys = np.where(np.isnan(magnitudes), np.float32(np.inf), magnitudes)
    k = min(k, keys.size)
    value = float(np.partition(keys, keys.size - k)[keys.size - k])
    return max(value, SMALLEST_THRESHOLD)


def at_or_above(values: np.ndarray, tau: float) -> np.ndarray:
    """The mask of |values| >= tau, NaN included (the kernels' magnitude order)."""
    magnitudes = np.abs(values)
    return (magnitudes >= np.float32(tau)) | np.isnan(magnitudes)


@dataclass(frozen=True)
class OkTopkOptions:
    """Ok-Topk's own option (module docstring), checked when made."""

    reestimate_every: int = REESTIMATE_EVERY

    def __post_init__(self) -> None:
        check_integer("reestimate_every", self.reestimate_every, 1,
                      fix="the steps between two exact estimates of the thresholds (default 32; "
                          "1: every step)")


@SCHEMES.register("oktopk")
class OkTopk(Scheme):

    Options = OkTopkOptions

    @classmethod
    def check(cls, config: Any) -> None:
        check_fused_float32(config)
        super().check(config)

    @classmethod
    def wire(cls, config: Any, workers: int, d: int, k: int, union: float | None = None
             ) -> Wire:
        """A step with the thresholds reused, |S_p| = k and balanced regions (module
        docstring): the sparse reduce-scatter of k entries, the all-gather of the |I|
        survivors and their counts; a re-estimation step's extra is left out."""
        p, union = workers, k if union is None else union
        if p <= 1:
            return Wire(0.0, 0.0)
        ring = (p - 1) / p
        return Wire(4.0 * (p - 1), ring * 8 * k + ring * 8 * union + 8 * (p - 1))

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.every = int(self.options.reestimate_every)
        self.d = sum(self.sizes)
        size = self.transport.size
        self.local_threshold: float | None = None
        self.global_threshold: float | None = None
        self.estimated_k = -1
        self.bounds = (np.arange(size + 1, dtype=np.int64) * self.d) // size

    def reestimates(self, step: int, k: int) -> bool:
        """Whether `step` estimates the thresholds and the regions anew."""
        return self.local_threshold is None or step % self.every == 0 or k != self.estimated_k

    # -- the step ---------------------------------------------------------------------------

    @reads_nothing
    def exchange(self, gradient: Any, residual: Any, budget: Budget, step: int,
                 clear_gradient: bool) -> Exchange:
        start = time.perf_counter()
        stats = ReductionStats()
        k = budget.k
        if gradient is not None:
            residual += gradient
            if clear_gradient:
                gradient[:] = 0
        fresh = self.reestimates(step, k)
        if fresh:
            _, top = ops.topk_abs(residual, k)
            self.local_threshold = kth_magnitude(np.abs(self.backend.to_host(top)), k)
        selected = self.backend.to_host(ops.threshold_indices(
            residual, 0, self.d, ops.magnitude_key(self.local_threshold)))
        selected = selected.astype(self.index_dtype, copy=False)
        index = self.backend.index(selected)
        values = self.backend.to_host(residual[index]).astype(np.float32, copy=True)
        if fresh:
            self.bounds = self._balanced(selected, stats)
        select_seconds = time.perf_counter() - start

        region, summed = self._reduce_scatter(selected, values, stats)
        if fresh:
            self.global_threshold = self._global_threshold(summed, k, stats)
            self.estimated_k = k
        keep = at_or_above(summed, self.global_threshold)
        indices, totals = self._allgather_survivors(region[keep], summed[keep], stats)
        taken = selected[np.isin(selected, indices, assume_unique=True)]
        ops.zero_at(residual, self.backend.index(taken))
        return Exchange(indices, totals, self.backend.index(taken), stats, select_seconds)

    def _balanced(self, selected: np.ndarray, stats: ReductionStats) -> np.ndarray:
        """The regions balanced by every worker's selected counts (module docstring)."""
        size = self.transport.size
        if size == 1:
            return np.array([0, self.d], np.int64)
        n_bins = balance_bins(self.d, size)
        edges = bin_edges(self.d, n_bins)
        bins = np.searchsorted(edges, selected, "right") - 1
        counts = np.bincount(bins, minlength=n_bins).astype(np.float64)
        sum_counted(self.transport, counts, stats)
        return balanced_bounds(np.rint(counts).astype(np.int64), self.d, size)

    def _reduce_scatter(self, selected: np.ndarray, values: np.ndarray, stats: ReductionStats
                        ) -> tuple[np.ndarray, np.ndarray]:
        """(U_q, s at U_q) for this worker's region q: every worker's selected entries there,
        summed in rank order (float32), U_q sorted."""
        transport, rank, size = self.transport, self.transport.rank, self.transport.size
        cuts = np.searchsorted(selected, self.bounds, "left")
        begin, end = int(self.bounds[rank]), int(self.bounds[rank + 1])
        parts: list[tuple[np.ndarray, np.ndarray] | None] = [None] * size
        parts[rank] = (selected[cuts[rank]:cuts[rank + 1]], values[cuts[rank]:cuts[rank + 1]])
        width = self.index_dtype.itemsize
        receive = np.empty(max(1, (end - begin) * (width + 4)), np.uint8)
        for shift in range(1, size):
            dest, source = (rank + shift) % size, (rank - shift) % size
            lo, hi = cuts[dest], cuts[dest + 1]
            send = np.concatenate([selected[lo:hi].view(np.uint8), values[lo:hi].view(np.uint8)])
            started = time.perf_counter()
            received = transport.sendrecv(send, send.size, dest, receive, source, TAG_SCATTER)
            stats.add_exchange(0.0, time.perf_counter() - started)
            stats.bytes_sent += int(send.size)
            stats.bytes_received += int(received)
            stats.messages_sent += 1
            stats.rounds += 1
            n = received // (width + 4)
            parts[source] = (receive[:n * width].view(self.index_dtype).copy(),
                             receive[n * width:n * (width + 4)].view(np.float32).copy())
        merge_start = time.perf_counter()
        sums = np.zeros(end - begin, np.float32)
        present = np.zeros(end - begin, bool)
        for indices, part_values in parts:  # rank order: the same float32 sums everywhere
            sums[indices - begin] += part_values
            present[indices - begin] = True
        region = (np.nonzero(present)[0] + begin).astype(self.index_dtype)
        stats.merge_seconds += time.perf_counter() - merge_start
        return region, sums[present]

    def _global_threshold(self, summed: np.ndarray, k: int, stats: ReductionStats) -> float:
        """The k-th largest |s| over every region, exactly, in one or two all-gathers (module
        docstring)."""
        size = self.transport.size
        ranked = np.abs(summed)
        ranked = -np.sort(-np.where(np.isnan(ranked), np.float32(np.inf), ranked))[:k]
        first = min(k, -(-2 * k // size))
        everyone, counts = gather(self.transport, ranked[:first], stats)
        tau = kth_magnitude(everyone, k)
        if size == 1:
            return tau
        ends = np.cumsum(counts)
        saturated = [q for q in range(size)
                     if counts[q] == first and everyone[ends[q] - 1] >= np.float32(tau)]
        if not saturated:
            return tau
        more, _ = gather(self.transport, ranked[first:] if self.transport.rank in saturated
                         else ranked[:0], stats)
        return kth_magnitude(np.concatenate([everyone, more]), k)

    def _allgather_survivors(self, indices: np.ndarray, values: np.ndarray,
                             stats: ReductionStats) -> tuple[np.ndarray, np.ndarray]:
        """(I, V): every owner's survivors in rank order (sorted: the regions are in order)."""
        everyone, counts = gather(self.transport, indices, stats)
        if self.transport.size == 1:
            return everyone, values
        started = time.perf_counter()
        totals = self.transport.allgatherv(np.ascontiguousarray(values), counts)
        stats.add_exchange(0.0, time.perf_counter() - started)
        count_ring_gather(stats, counts, self.transport.rank, values.itemsize, with_counts=False)
        return everyone, totals

    # -- checkpoint -------------------------------------------------------------------------

    def state_dict(self) -> dict:
        state: dict = {"bounds": self.bounds.copy(), "estimated_k": np.array(self.estimated_k,
                                                                              np.int64)}
        if self.local_threshold is not None:
            state["local_threshold"] = np.array(self.local_threshold, np.float32)
            state["global_threshold"] = np.array(self.global_threshold, np.float32)
        return state

    def load_state_dict(self, state: dict) -> None:
        if "bounds" in state:
            bounds = np.asarray(state["bounds"], np.int64)
            if bounds.shape != self.bounds.shape:
                raise ValueError(f"checkpoint has Ok-Topk regions for {bounds.size - 1} "
                                 f"workers, this job has {self.bounds.size - 1}")
            self.bounds = bounds.copy()
        self.estimated_k = int(state.get("estimated_k", -1))
        if "local_threshold" in state:
            self.local_threshold = float(state["local_threshold"])
            self.global_threshold = float(state["global_threshold"])


def gather(transport: Transport, local: np.ndarray, stats: ReductionStats
           ) -> tuple[np.ndarray, np.ndarray]:
    """(every worker's 1-D `local` in rank order, the counts per rank): an all-gather of the
    counts, then of the arrays, timed and counted as a ring's (`count_ring_gather`)."""
    size = transport.size
    if size == 1:
        return local, np.array([local.size], np.int64)
    started = time.perf_counter()
    counts = transport.allgather(np.array([local.size], np.int64))[:, 0]
    ready = time.perf_counter()
    everyone = transport.allgatherv(np.ascontiguousarray(local), counts)
    stats.add_exchange(ready - started, time.perf_counter() - ready)
    count_ring_gather(stats, counts, transport.rank, local.itemsize, with_counts=True)
    return everyone, counts


def count_ring_gather(stats: ReductionStats, counts: np.ndarray, rank: int, itemsize: int,
                      with_counts: bool) -> None:
    """A ring all-gather's bytes: this worker receives every other set and forwards all but
    its right neighbour's (and the 8-byte counts, with_counts)."""
    size, total = counts.size, int(counts.sum())
    extra = 8 * (size - 1) if with_counts else 0
    stats.bytes_received += itemsize * (total - int(counts[rank])) + extra
    stats.bytes_sent += itemsize * (total - int(counts[(rank + 1) % size])) + extra
    stats.messages_sent += (2 if with_counts else 1) * (size - 1)
    stats.rounds += size - 1
