"""Gradients summed over several backward passes before one step (backward_passes_per_step).

Frameworks whose gradients are fresh tensors at every call (TensorFlow) add them up here; torch
accumulates in `.grad` itself. With passes = n, calls 1 .. n-1 return None, call n returns the
sum of the n gradients (divided by n if `average`) and starts a new cycle.
"""

from __future__ import annotations

import numpy as np


class PassAccumulator:
    """The running sum of one cycle of `passes` calls (float32, host)."""

    def __init__(self, passes: int, average: bool = False) -> None:
        self.passes = passes
        self.average = average
        self.calls = 0  # calls summed in the current cycle
        self._sum: np.ndarray | None = None

    def add(self, flat: np.ndarray) -> np.ndarray | None:
        """None until the cycle's last call; then the cycle's sum (or mean), a new array the
        caller owns. With passes == 1, `flat` itself."""
        if self.passes == 1:
            return flat
        self._sum = flat.astype(np.float32, copy=True) if self._sum is None else (
            np.add(self._sum, flat, out=self._sum))
        self.calls += 1
        if self.calls < self.passes:
            return None
        total, self._sum, self.calls = self._sum, None, 0
        if self.average:
            total /= np.float32(self.passes)
        return total
