"""A simulated cluster: P workers' sparse steps in one process, the real algorithm on each.

In synchronous SGD every worker applies the same update to the same weights, so the P replicas
are one model; what differs between workers is their data shard, their micro-batch gradient
and the sparse step's state (residual, velocity, the scheme's own). `SimulatedCluster` holds
that per-worker part: P flat gradient buffers and P `SparseStep`s, worker r's over rank r of a
`LocalGroup` (`gtopk_hvd.transports.local`: threads of this process). A training loop
accumulates worker r's micro-batch gradient into `gradients[r]` (in the fused order of `sizes`),
calls `reduce()`, and applies the returned update once to its one model:

    reduce():  update_r = SparseStep_r.update(gradients[r])      on every worker r at once
               every update_r bitwise identical (checked: replicas stay identical)
               gradients[r] = 0                                   (cleared within the step)
               returns update_0

Dense S-SGD (`compression=None`): update = sum_r gradients[r] (in rank order) / P for an
average, the sum for `average=False`; bytes are a ring all-reduce's, 2 (P - 1) / P * 4 d. A DDP
user's own compression (`baseline=`, with compression=None: an object whose
`reduce(gradients)` returns the update and `wire()` the (messages, bytes) a worker sends, e.g.
`gtopk_hvd.torch.ddp_baselines`' bf16 and PowerSGD): update = baseline.reduce(gradients).

The sparse steps, schemes, reductions and byte counts are the ones a real job runs (under
mpirun the same configuration ends with bitwise the same weights: tests/tools/test_simulate.py);
only the transport differs. Each worker's kernels run on one thread (the P workers are the
parallelism), as under a launcher with P ranks on a machine.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from gtopk_hvd import ops
from gtopk_hvd.core import SparseStep
from gtopk_hvd.core.stats import StepStats
from gtopk_hvd.transports.local import LocalGroup


class SimulatedCluster:
    """P workers' gradients and sparse steps (module docstring).

    compression: a sparse configuration (`Compression.gtopk(0.001)`, ...) or None for dense.
    sizes: the values of each source (parameter) in the fused order. workers: P.
    average: the update is the average (True) or the sum of the workers' contributions.
    check_replicas: compare every worker's update with worker 0's at each step (raises if one
    differs); costs one comparison of d values per worker. baseline: dense's reduction
    replaced (module docstring).
    """

    __slots__ = ("workers", "d", "average", "baseline", "check_replicas", "group", "steps",
                 "gradients", "_updates", "last_stats")

    def __init__(self, compression: Any, sizes: Sequence[int], workers: int, *,
                 average: bool = True, check_replicas: bool = True,
                 timeout_s: float = 600.0, baseline: Any = None) -> None:
        if workers < 1:
            raise ValueError(f"workers must be >= 1, got {workers}")
        if baseline is not None and (compression is not None or not average):
            raise ValueError("a baseline replaces dense's average: give compression=None and "
                             "average=True with it")
        self.baseline = baseline
        self.workers = workers
        self.d = int(sum(sizes))
        self.average = average
        self.check_replicas = check_replicas
        self.group = LocalGroup(workers, timeout_s)
        self.gradients = [np.zeros(self.d, dtype=np.float32) for _ in range(workers)]
        self.last_stats: list[StepStats] = []
        if compression is None:
            self.steps: list[SparseStep] | None = None
            self._updates = [np.zeros(self.d, dtype=np.float32)]
        else:
            self.steps = self.group.run(lambda rank: SparseStep(
                compression, sizes, self.group.transports[rank], average=average))
            self._updates = [np.zeros(self.d, dtype=np.float32) for _ in range(workers)]

    @property
    def bytes_sent(self) -> list[int]:
        """What each worker sent in the last step."""
        if self.baseline is not None:
            return [int(self.baseline.wire()[1])] * self.workers
        if self.steps is None:
            return [int(2 * (self.workers - 1) / self.workers * 4 * self.d)] * self.workers
        return [stats.bytes_sent for stats in self.last_stats]

    def reduce(self, dense: bool = False) -> np.ndarray:
        """Every worker's step on its gradient at once; returns the update (module docstring).
        The array is reused by the next call. dense: each worker's `SparseStep.update(dense=True)`
        instead (an optimizer's dense start; the sparse state is kept)."""
        if self.steps is None:
            return self._dense()

        def one_worker(rank: int) -> StepStats:
            ops.set_num_threads(1)
            step = self.steps[rank]
            step.update(self.gradients[rank], self._updates[rank], clear_gradient=True,
                        dense=dense)
            return step.last_stats

        self.last_stats = self.group.run(one_worker)
        if self.check_replicas:
            reference = self._updates[0].view(np.uint32)
            for rank in range(1, self.workers):
                if not np.array_equal(self._updates[rank].view(np.uint32), reference):
                    raise RuntimeError(f"simulated worker {rank}'s update differs from worker "
                                       "0's: the replicas would diverge")
        return self._updates[0]

    def _dense(self) -> np.ndarray:
        update = self._updates[0]
        if self.baseline is not None:
            np.copyto(update, self.baseline.reduce(self.gradients))
            for gradient in self.gradients:
                gradient.fill(0.0)
            return update
        np.copyto(update, self.gradients[0])
        for gradient in self.gradients[1:]:
            update += gradient
        if self.average and self.workers > 1:
            update /= np.float32(self.workers)
        for gradient in self.gradients:
            gradient.fill(0.0)
        return update

    def largest_entries(self, count: int) -> tuple[np.ndarray, np.ndarray]:
        """Each worker's `count` largest-magnitude entries of residual + gradient (what its
        error-feedback selection ranks; call it before `reduce`): (indices, values), arrays of
        shape (P, count), indices ascending within a row."""
        indices = np.empty((self.workers, count), dtype=np.int64)
        values = np.empty((self.workers, count), dtype=np.float32)
        for rank, gradient in enumerate(self.gradients):
            accumulated = gradient.copy()
            if self.steps is not None:
                step = self.steps[rank]
                accumulated += step.backend.to_host(step.residual)
            chosen = np.sort(np.argpartition(np.abs(accumulated), -count)[-count:])
            indices[rank], values[rank] = chosen, accumulated[chosen]
        return indices, values

    def state_dict(self) -> list[dict]:
        """Each worker's sparse-step state (residual, velocity, step count, the scheme's)."""
        return [] if self.steps is None else [step.state_dict() for step in self.steps]

    def load_state_dict(self, states: list[dict]) -> None:
        if self.steps is not None:
            if len(states) != self.workers:
                raise ValueError(f"{len(states)} worker states for {self.workers} workers")
            for step, state in zip(self.steps, states):
                step.load_state_dict(state)

    def close(self) -> None:
        self.group.close()
