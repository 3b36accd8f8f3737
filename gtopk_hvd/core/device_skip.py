"""A skip decision that stays on the device: `DeviceSkip`.

With nonfinite="propagate" a step whose gradient holds a NaN or Inf on any worker is skipped on
every worker. Deciding that on the host means reading the count there, which on a GPU waits
for everything enqueued before it (for the DDP hook, the whole backward), so that what follows is
launched on an idle device. A `DeviceSkip` carries the decision as a flag on the device instead
(one int32, nonzero: skip, summed over the workers there), which the step's kernels read:

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
the step count, when the device has long finished that copy.
"""

from __future__ import annotations

from typing import Any

from gtopk_hvd import ops


class DeviceSkip:
    """One step's skip flag on the device (`flag`: one int32) and its later host value."""

    __slots__ = ("_later", "flag")

    def __init__(self, flag: Any) -> None:
        self.flag = flag
        self._later = ops.LaterFlag(flag)

    def skipped(self) -> bool:
        """Whether the step was skipped (the first call may wait for the flag's copy)."""
        return self._later.value() != 0
