"""Whether a step is skipped for a non-finite gradient, as one value: `Skip`.

With nonfinite="propagate" a step whose gradient holds a NaN or Inf on any worker is skipped on
every worker alike (`gtopk_hvd.core.step`). Who decides, and where the decision lives, is one
of three kinds of the one type the step takes:

- `Skip.COUNT`: the step decides: it reads its gradient and counts the workers (one all-reduce
  of one integer), or with nonfinite="raise" counts no gradient;
- `Skip.decided(skipped)`: the caller has already counted, on the host (the DDP hook counts
  once per iteration over all its buckets: `gtopk_hvd.nonfinite.count_nonfinite_workers`);
- `Skip.on_device(flag)`: the caller's count left on the device as a flag (one int32, nonzero:
  skip, summed over the workers there), which the step's kernels read instead of the host.

Deciding on the host means reading the count there, which on a GPU waits for everything
enqueued before it (for the DDP hook, the whole backward). A flag on the device is read by the
kernels instead:

- the selection reads the residual as it is and writes nothing to it (`ops.accumulate_select`'s
  skip), the velocity update writes nothing (`ops.momentum_update`), the residual's restore and
  the velocity's zeroing are masked (`ops.restore_residual`, `ops.zero_at`);
- the exchange runs as usual on the sets so selected (every message keeps its size, so every
  worker issues the same collectives);
- the update is all NaN (`ops.write_sparse`'s skip): a loss scaler sees the overflow.

So the residual and the velocity end bit for bit as a host-decided skip leaves them. The host
integers (the step count, which sets k in the warm-up; the count of skipped steps;
`last_stats.skipped`) are counted as if applied and corrected when the flag's value reaches the
host: it is copied there without a wait (`ops.LaterFlag`) and read before the next step needs
the step count, when the device has long finished that copy. A step that cannot honour a flag
(`SparseStep.skips_on_device`, fixed when the step is built) reads it on the host first
(`on_host`).
"""

from __future__ import annotations

from typing import Any, ClassVar

from gtopk_hvd import ops


class Skip:
    """One step's skip decision: to be counted by the step, decided on the host, or a flag on
    the device (module docstring). Immutable; `of` turns a caller's bool / None into one."""

    __slots__ = ("_later", "counted_by_step", "flag", "known")

    COUNT: ClassVar[Skip]

    def __init__(self, known: bool | None = None, flag: Any = None) -> None:
        self.known = known  # the host decision; None while undecided or on the device
        self.flag = flag  # the device flag, or None
        self._later = None if flag is None else ops.LaterFlag(flag)
        self.counted_by_step = known is None and flag is None  # COUNT: the step decides

    @classmethod
    def decided(cls, skipped: bool) -> Skip:
        """A decision the caller counted on the host."""
        return cls(known=bool(skipped))

    @classmethod
    def on_device(cls, flag: Any) -> Skip:
        """A decision left on the device as `flag` (one int32 tensor; nonzero: skip)."""
        return cls(flag=flag)

    @classmethod
    def of(cls, value: Skip | bool | None) -> Skip:
        """The Skip a caller means: a Skip as it is, None: COUNT, a bool: `decided`."""
        if isinstance(value, Skip):
            return value
        return cls.COUNT if value is None else cls.decided(value)

    def skipped(self) -> bool:
        """Whether the step is (was) skipped; a device flag is read on the host (the first call
        may wait for its copy). COUNT has no answer."""
        if self._later is not None:
            return self._later.value() != 0
        if self.known is None:
            raise ValueError("Skip.COUNT: the step decides; there is no decision to read yet")
        return self.known

    def on_host(self) -> Skip:
        """This decision on the host: a device flag read (`decided`), the others as they are."""
        return self if self.flag is None else Skip.decided(self.skipped())

    def __repr__(self) -> str:
        if self.flag is not None:
            return "Skip.on_device(flag)"
        return "Skip.COUNT" if self.known is None else f"Skip.decided({self.known})"


Skip.COUNT = Skip()
