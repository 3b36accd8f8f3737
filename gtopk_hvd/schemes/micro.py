"""MiCRO (Yoon & Oh, HiPC 2023): partitioned threshold selection with an exact union sum
(registered as "micro").

The fused gradient is cut into P contiguous partitions (`bounds`). At step t worker p owns
partition (p + t) mod P and selects only there, by one compare against the threshold tau shared
by every worker (no top-k, and no index is chosen by two workers):

    acc_p = r_p + g_p                                  (every worker, all d entries)
    S_p = { i in partition (p + t) mod P : |acc_p[i]| >= tau }     (fused: ops.accumulate_threshold)
    I = S_0 u ... u S_{P-1}                            (all-gather of counts, then of indices)
    V = sum over p of acc_p[I]                         (one sum all-reduce, `union.sum_at`)
    r_p = acc_p, then r_p[I] = 0 on every worker

Bytes per worker per step (`Micro.wire`): 4 |I| (P-1)/P (indices, all-gather) + 8 |I| (P-1)/P
(values, ring all-reduce) + 8 N_BINS (P-1)/P (the density histogram) + 16 (P-1) (counts): about
12k at |I| = k, nearly independent of P (gTop-k: 8k log2 P; Top-k: 8k (P-1)).

tau is set for each step's k (`gtopk_hvd.schemes.threshold`): "histogram" (default) measures it
on the step (a histogram counted in the accumulation pass, summed by one all-reduce, then a read
of the partition); "multiplicative" is the authors' rule (one pass; tau carried between steps).
Options:

    threshold    the first step's tau for "multiplicative", the centre of the first
                 histogram for "histogram" (None, the default: the first histogram hangs from
                 the largest |acc| over workers)
    controller   "histogram" or "multiplicative"

The last tau and |I| are the scheme's state (checkpointed with the step). Needs granularity
"model" and float32 on the wire.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

import gtopk_hvd.schemes.threshold as control
from gtopk_hvd import ops
from gtopk_hvd.density import Budget
from gtopk_hvd.lockstep import OwnTime, Phases
from gtopk_hvd.options import check_choice, is_number, refuse
from gtopk_hvd.reductions.result import ReductionStats
from gtopk_hvd.schemes.base import SCHEMES, Exchange, Scheme, Wire
from gtopk_hvd.schemes.union import (
    check_fused_float32,
    gather_indices,
    gather_indices_tensors,
    on_device,
    sum_at,
    sum_at_tensors,
    sum_counted,
    sum_counted_tensors,
)


@dataclass(frozen=True)
class MicroOptions:
    """MiCRO's own options (module docstring), checked when made."""

    threshold: float | None = None
    controller: str = "histogram"

    def __post_init__(self) -> None:
        start = self.threshold
        if start is not None and not (is_number(start) and 0 < start < math.inf):
            refuse("threshold", "a finite number > 0 or None", start,
                   "the first step's threshold (a magnitude); None (the default) measures it "
                   "at the first step", wrong_type=not is_number(start))
        check_choice("controller", self.controller, control.CONTROLLERS,
                     fix="'histogram' (ours, the default) or the authors' 'multiplicative'")


@SCHEMES.register("micro")
class Micro(Scheme):

    Options = MicroOptions
    takes_accumulated = True  # ops.accumulate_threshold(None, ...) reads the residual as it is

    @classmethod
    def check(cls, config: Any) -> None:
        check_fused_float32(config)
        super().check(config)

    @classmethod
    def wire(cls, config: Any, workers: int, d: int, k: int, union: float | None = None
             ) -> Wire:
        p, union = workers, k if union is None else union
        if p <= 1:
            return Wire(0.0, 0.0)
        ring = (p - 1) / p
        return Wire(6.0 * (p - 1),
                    ring * (4 * union + 2 * 4 * union + 2 * 4 * control.N_BINS) + 16 * (p - 1))

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.controller = self.options.controller
        start = self.options.threshold
        self.threshold: float | None = None if start is None else float(np.float32(start))
        self.selected = -1  # |I| of the last step (-1: none yet)
        self.d = sum(self.sizes)
        # The accumulation pass keeps candidates on the host only (`_measured`).
        self.candidates = self.backend.name == "numpy"
        self.on_tensors = on_device(self.transport, self.backend)  # the union stays there

    # -- partitions -------------------------------------------------------------------------

    def bounds(self) -> np.ndarray:
        """P + 1 partition edges over [0, d): partition q is [bounds[q], bounds[q + 1])."""
        size = self.transport.size
        return (np.arange(size + 1, dtype=np.int64) * self.d) // size

    def owned(self, step: int) -> int:
        """The partition this worker selects in at `step`."""
        return (self.transport.rank + step) % self.transport.size

    def after_step(self, counts: np.ndarray, step: int) -> None:
        """Hook for what moves with the selected counts (per partition, summed): ExDyna."""

    # -- the step ---------------------------------------------------------------------------

    def exchange(self, gradient: Any, residual: Any, budget: Budget, step: int,
                 clear_gradient: bool) -> Phases:
        """The step (module docstring); on tensors with the histogram controller, two host
        reads yielded (`_measured_on_device`), so that the DDP hook's buckets share them
        (`gtopk_hvd.lockstep`; its time at them beyond its share of their waits is not in
        select_seconds)."""
        clock = OwnTime()
        stats = ReductionStats()
        bounds = self.bounds()
        part = self.owned(step)
        begin, end = int(bounds[part]), int(bounds[part + 1])
        tensors = self.on_tensors
        counts = None
        if self.controller == "multiplicative" and self.threshold is not None:
            tau = self.threshold if self.selected < 0 else control.multiplicative(
                self.threshold, self.selected, budget.k)
            key = ops.magnitude_key(tau)
            mine, _ = ops.accumulate_threshold(gradient, residual, begin, end, key, key, 0, 1,
                                               clear_gradient)
        elif tensors:
            tau, mine, counts = yield from self._measured_on_device(
                gradient, residual, budget.k, begin, end, clear_gradient, stats, clock)
        else:
            tau, mine = self._measured(gradient, residual, budget.k, begin, end,
                                       clear_gradient, stats)
        if tensors:
            mine = self.backend.as_index_dtype(mine, self.index_dtype)
        else:
            mine = self.backend.to_host(mine).astype(self.index_dtype, copy=False)
        select_seconds = clock.seconds()

        if tensors:
            everyone, counts = gather_indices_tensors(self.transport, mine, stats, counts)
        else:
            everyone, counts = gather_indices(self.transport, mine, stats)
        union = self._in_partition_order(everyone, counts, step)
        merge_start = time.perf_counter()
        if tensors:
            values = sum_at_tensors(self.transport, residual, union, stats)
        else:
            values = sum_at(self.transport, self.backend, residual, union, stats)
        stats.merge_seconds += time.perf_counter() - merge_start
        self.threshold, self.selected = tau, int(counts.sum())
        per_partition = np.zeros(self.transport.size, np.int64)
        per_partition[(np.arange(self.transport.size) + step) % self.transport.size] = counts
        self.after_step(per_partition, step)
        taken = union if tensors else self.backend.index(union)
        return Exchange(union, values, taken, stats, select_seconds)

    def _in_partition_order(self, everyone: Any, counts: np.ndarray, step: int) -> Any:
        """The union sorted by index: rank q's indices lie in partition (q + step) mod P, and the
        partitions are contiguous and in order, so the segments are put in partition order
        (host arrays, or tensors: cut at host offsets, joined where they lie)."""
        size = self.transport.size
        if size == 1:
            return everyone
        offsets = np.concatenate([[0], np.cumsum(counts)])
        ranks = [(part - step) % size for part in range(size)]
        join = np.concatenate if isinstance(everyone, np.ndarray) else self.backend.concatenate
        return join([everyone[offsets[q]:offsets[q + 1]] for q in ranks])

    def _measured(self, gradient: Any, residual: Any, k: int, begin: int, end: int,
                  clear_gradient: bool, stats: ReductionStats) -> tuple[float, Any]:
        """This step's tau, measured on this step (`gtopk_hvd.schemes.threshold`), and this
        worker's indices at or above it.

        On the host the accumulation pass also keeps the candidates at or above
        CANDIDATE_MARGIN x the last tau (written in that pass, they save a second read). On a
        torch state (`self.candidates` False: a GPU's) they would cost what they save: the
        CUDA side writes any selection in a read of the partition after its count, and their
        number is unbounded (every entry of a partition whose magnitudes rose). So the pass
        only counts there, and the indices at or above tau are written in one read of the
        partition into room for this worker's histogram's count from tau's bin on
        (`ops.histogram_count_from`: a bound, no count pass)."""
        window = self._window(gradient, residual, begin, end, stats)
        candidate_key = control.NO_KEY
        if self.candidates and self.threshold is not None:
            candidate_key = ops.magnitude_key(self.threshold * control.CANDIDATE_MARGIN)
        candidates, histogram = ops.accumulate_threshold(
            gradient, residual, begin, end, candidate_key, clear_gradient=clear_gradient,
            **window.kernel_arguments())
        summed = sum_counted(self.transport, histogram.astype(np.float32), stats)
        if summed.sum() < k and window.base_key > 0:  # tau fell below the window: look lower
            window = control.window_under(window.edge(0))
            histogram = ops.magnitude_histogram(residual, begin, end, window.base_key,
                                                window.shift, window.n_bins)
            summed = sum_counted(self.transport, histogram.astype(np.float32), stats)
        tau = control.from_histogram(summed, window, k)
        key = ops.magnitude_key(tau)
        if key >= candidate_key:  # the pass kept every entry at or above tau: no second read
            return tau, ops.keep_at_or_above(residual, candidates, key)
        at_most = None if self.candidates else window.count_from(histogram, key)
        return tau, ops.threshold_indices(residual, begin, end, key, at_most=at_most)

    def _measured_on_device(self, gradient: Any, residual: Any, k: int, begin: int, end: int,
                            clear_gradient: bool, stats: ReductionStats, clock: OwnTime
                            ) -> Phases:
        """`_measured` on tensors, where the transport sums and gathers them: (tau, this
        worker's indices, every worker's count on the host), with two host reads yielded and
        nothing else waiting (but a first step's largest |acc|, and a window that held fewer
        than k, which read as they go, on every worker alike):

            1. the accumulation pass leaves this worker's histogram on the device
               (`ops.histogram_on_device`); summed over workers there; read: both
            2. tau from the sum; the indices at or above it written into room for this
               worker's count from tau's bin on, the count left on the device
               (`ops.threshold_indices_on_device`); every worker's count gathered there; read:
               the counts

        The same tau, indices and counts as `_measured`'s."""
        import torch

        size, device = self.transport.size, residual.device
        window = self._window(gradient, residual, begin, end, stats)
        own, summed = yield from clock.read(self._histograms_on_device(
            gradient, residual, begin, end, window, clear_gradient, stats))
        if summed.sum() < k and window.base_key > 0:  # tau fell below the window: look lower
            window = control.window_under(window.edge(0))
            own, summed = ops.read_to_host(self._histograms_on_device(
                None, residual, begin, end, window, False, stats))
        tau = control.from_histogram(summed, window, k)
        key = ops.magnitude_key(tau)
        at_most = window.count_from(own, key)
        if at_most is None:  # below the window (not reached: tau is at or above its edge)
            indices = ops.threshold_indices(residual, begin, end, key)
            count = torch.full((1,), int(indices.numel()), dtype=torch.int64, device=device)
        else:
            indices, count = ops.threshold_indices_on_device(residual, begin, end, key, at_most)
        everyone = count
        if size > 1:
            everyone = torch.empty(size, dtype=torch.int64, device=device)
            self.transport.allgather_tensors([count], [everyone])
        (counts,) = yield from clock.read((everyone,))
        counts = counts.astype(np.int64)
        return tau, ops.selected_indices(indices, int(counts[self.transport.rank])), counts

    def _histograms_on_device(self, gradient: Any, residual: Any, begin: int, end: int,
                              window: control.Window, clear_gradient: bool,
                              stats: ReductionStats) -> tuple[Any, Any]:
        """(this worker's histogram of the window, int64; its sum over workers, float32), both
        tensors on the device, nothing waited for (gradient None: of the residual as it is)."""
        import torch

        histogram = ops.histogram_on_device(gradient, residual, begin, end,
                                            clear_gradient=clear_gradient,
                                            **window.kernel_arguments())
        return histogram, sum_counted_tensors(self.transport, histogram.to(torch.float32), stats)

    def _window(self, gradient: Any, residual: Any, begin: int, end: int,
                stats: ReductionStats) -> control.Window:
        """This step's histogram bins: around the last tau, or at the first step hanging from
        the largest |acc| over workers (one all-gather of one value)."""
        if self.threshold is not None:
            return control.window_around(self.threshold)
        size = self.transport.size
        largest = ops.largest_finite_magnitude(residual, begin, end, plus=gradient)
        if size > 1:
            largest = float(self.transport.allgather(np.array([largest], np.float64)).max())
            stats.bytes_sent += 8 * (size - 1)
            stats.bytes_received += 8 * (size - 1)
        return control.window_under(largest)

    # -- checkpoint -------------------------------------------------------------------------

    def state_dict(self) -> dict:
        state: dict = {"selected": np.array(self.selected, np.int64)}
        if self.threshold is not None:
            state["threshold"] = np.array(self.threshold, np.float32)
        return state

    def load_state_dict(self, state: dict) -> None:
        self.selected = int(state.get("selected", -1))
        if "threshold" in state:
            self.threshold = float(state["threshold"])
