"""The fused layout: where each source's gradient lives in the one flat vector the step sees.

Sources (parameters, variables) i = 0 .. n-1 in the order every worker uses, with n_i values:

    offsets[0] = 0,  offsets[i + 1] = offsets[i] + n_i,  d = offsets[n]
    fused[offsets[i] : offsets[i + 1]] = float32(gradient_i).reshape(-1)   (zeros for none)

`signature` names every source's name, shape and dtype; the step checks at its first call that
all workers have the same one (otherwise their fused vectors would not line up).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Source:
    """One source as an adapter describes it (dtype as the framework names it)."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    floating: bool


class FusedLayout:
    """Sizes, offsets and signature of a list of sources; `what` names them in errors."""

    def __init__(self, sources: Sequence[Source], what: str = "parameter") -> None:
        for source in sources:
            if not source.floating:
                raise ValueError(f"{what} {source.name!r} has dtype {source.dtype}; gradients "
                                 f"can only be compressed for floating-point {what}s")
        self.sizes = [math.prod(source.shape) for source in sources]
        self.offsets = [0]
        for size in self.sizes:
            self.offsets.append(self.offsets[-1] + size)
        self.d = self.offsets[-1]
        self.signature = ";".join(f"{source.name}:{list(source.shape)}:{source.dtype}"
                                  for source in sources)
