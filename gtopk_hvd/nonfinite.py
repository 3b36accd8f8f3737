"""Counting the workers whose gradients hold a NaN or Inf, for callers that decide several steps
at once (the DDP hook: one count an iteration over all its buckets), outside the core's step,
which counts for one step itself (`gtopk_hvd.core.step`, `count_workers`).

    NonfiniteFlags           one flag per place (the host, a device), each gradient's check
                             enqueued there as it arrives, one host read per place
    count_nonfinite_workers  the flags of some gradients read, then one all-reduce of one
                             integer: the same count on every worker
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from gtopk_hvd import ops
from gtopk_hvd.core.step import count_workers
from gtopk_hvd.transports.base import Transport


class NonfiniteFlags:
    """Whether any gradient checked since the last `read` held a NaN or Inf, gathered where the
    gradients are: one flag per place (the host, or a device), each check enqueued there
    (`ops.mark_nonfinite`: on a GPU no copy to the host and no wait, so a check can run as its
    gradient arrives), and one host read per place at `read` (`ops.read_flag`): many
    gradients, one wait."""

    __slots__ = ("flags",)

    def __init__(self) -> None:
        self.flags: dict[str, Any] = {}

    def check(self, gradient: Any) -> None:
        """Enqueues the read of `gradient` (numpy array or torch tensor) into its place's
        flag."""
        place = str(gradient.device) if hasattr(gradient, "is_cuda") else "host"  # torch?
        flag = self.flags.get(place)
        if flag is None:
            flag = self.flags[place] = ops.nonfinite_flag(gradient)
        ops.mark_nonfinite(gradient, flag)

    def take(self, device: Any) -> Any:
        """The flag of the gradients checked on `device` (a torch device), not read; clears.
        Raises if none was checked there or some elsewhere. For a decision that stays on the
        device (`gtopk_hvd.core.skip`)."""
        flags, self.flags = self.flags, {}
        flag = flags.get(str(device))
        if flag is None or len(flags) != 1:
            raise ValueError(f"the checked gradients are on {sorted(flags)}, not only on "
                             f"{device}")
        return flag

    def read(self) -> bool:
        """Whether a checked gradient was not finite (one host read per place); clears."""
        flags, self.flags = self.flags, {}
        return any([ops.read_flag(flag) != 0 for flag in flags.values()])

    def clear(self) -> None:
        """Forgets the checks so far (nothing is read)."""
        self.flags = {}


def count_nonfinite_workers(transport: Transport, gradients: Sequence[Any]) -> int:
    """How many workers hold a NaN or Inf in any of `gradients` (numpy arrays or torch tensors):
    one read of each, gathered on its device (`NonfiniteFlags`: one host read per device, not
    per gradient), and one all-reduce of one integer, so the same count on every worker. Every
    worker must call it at the same point, with any number of gradients."""
    flags = NonfiniteFlags()
    for gradient in gradients:
        flags.check(gradient)
    return count_workers(transport, flags.read())


__all__ = ["NonfiniteFlags", "count_nonfinite_workers"]
