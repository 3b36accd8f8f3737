"""A step taken before it is known whether it counts, then committed or discarded.

Whether a step is skipped (nonfinite="propagate": a NaN or Inf in any worker's gradient) can be
known only after the step would have to start, when a caller wants its exchange to run early:
the DDP hook starts a bucket's exchange as the bucket arrives, while backward goes on, and learns
whether the iteration counts only once every bucket of every worker is in. A tentative step runs
the whole exchange and leaves the step's state as it was until told; the caller's buffer (the
bucket's gradient, which the update replaces either way) holds the accumulated gradient:

    buffer := r + g               (r, if this worker's g is not finite: every message finite)
    (I, V) = scheme.exchange(None, buffer, k)          the buffer stands in for the residual
    commit:   r := buffer;  buffer := V * scale at I, 0 elsewhere;  the step count and the
              scheme's state as the exchange left them (what `SparseStep.update` leaves)
    discard:  buffer := all NaN;  r, the step count and the scheme's state as before the step
              (what a skipped `update` leaves)

Committed, the residual and the update are bit-equal to `update`'s on the same gradient: the
same sums (r + g is g + r in IEEE arithmetic), the same selection, the same writes. No array of
the gradient's size is made: the buffer holds the accumulation, and the commit copies it once.

The rules: the step keeps host (numpy) state, its scheme takes the accumulated gradient
(`Scheme.takes_accumulated`), it has no momentum correction (the velocity would need a second
buffer of the gradient's size) and no predivision: `can_step_tentatively`. Every worker must
take the same tentative steps in the same order (their exchanges are collectives), and commit or
discard them alike, which a count of the non-finite workers after them decides
(`count_workers`).
"""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING

import numpy as np

from gtopk_hvd import ops
from gtopk_hvd.core.skip import Skip
from gtopk_hvd.lockstep import Phases, drive

if TYPE_CHECKING:
    from gtopk_hvd.core.step import SparseStep


def can_step_tentatively(step: SparseStep) -> bool:
    """Whether `step` can take tentative steps (the module docstring's rules)."""
    return (step.backend.name == "numpy" and step.velocity is None
            and step.predivide == 1.0 and step.scheme.takes_accumulated)


class TentativeStep:
    """One tentative step of a SparseStep (module docstring): `run` it (or `run_phases`), then
    `commit` or `discard` it, once.

    step: the SparseStep (`can_step_tentatively`); buffer: this worker's gradient, d float32
    values (numpy), which becomes the accumulation and then the update or all NaN; finite:
    whether the gradient is finite (the caller's read: a worker that is not sends the residual's
    selection, and its step will be discarded, since it counts as not finite)."""

    __slots__ = ("buffer", "finite", "result", "saved_count", "saved_scheme", "step")

    def __init__(self, step: SparseStep, buffer: np.ndarray, finite: bool) -> None:
        if not can_step_tentatively(step):
            raise ValueError("a tentative step needs host state, a scheme that takes the "
                             "accumulated gradient, no momentum correction and no predivision")
        if buffer.dtype != np.float32 or buffer.size != step.d:
            raise ValueError(f"the buffer must be {step.d} float32 values, got {buffer.size} "
                             f"{buffer.dtype}")
        self.step = step
        self.buffer = buffer
        self.finite = finite
        self.result: tuple | None = None
        self.saved_count = 0
        self.saved_scheme: dict = {}

    def run(self) -> None:
        """The exchange, now (collectives with the other workers' tentative steps)."""
        drive(self.run_phases())

    def run_phases(self) -> Phases:
        """`run` as a generator of the scheme's host reads (`gtopk_hvd.lockstep`)."""
        step = self.step
        step._check_agreement()  # before the count is saved: it may take the job's count
        self.saved_count = step.step_count
        self.saved_scheme = copy.deepcopy(step.scheme.state_dict())
        if not self.finite:
            self.buffer[:] = 0
        np.add(self.buffer, step.residual, out=self.buffer)
        residual, step.residual = step.residual, self.buffer
        try:
            self.result = yield from step.phases(None, skip=Skip.decided(False))
        finally:
            step.residual = residual

    def commit(self) -> None:
        """The step counts: the residual takes the accumulation's remainder, the buffer the
        update."""
        indices, values = self.result
        self.step.residual[:] = self.buffer
        ops.write_sparse(self.buffer, indices, values)

    def discard(self) -> None:
        """The step is skipped: the state as before it, the buffer all NaN; `last_stats` keeps
        what the exchange sent, marked skipped."""
        step = self.step
        step.step_count = self.saved_count
        step.scheme.load_state_dict(self.saved_scheme)
        step.skipped_steps += 1
        step.last_stats.skipped = True
        self.buffer[:] = np.nan
