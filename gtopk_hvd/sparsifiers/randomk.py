"""Random-k (registered as "randomk"): k indices drawn uniformly without replacement.

The generator is seeded with (seed, step, part), so every worker draws the same
I_p at the same step without sending it, and the reduction is a dense all-reduce of k values
("allreduce"). A baseline from the literature (Stich et al., "Sparsified SGD with Memory",
NeurIPS 2018): its traffic is k values, but it ignores magnitude, so with error feedback it
needs a larger k than top-k for the same convergence.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from gtopk_hvd import ops
from gtopk_hvd.sparsifiers.base import SPARSIFIERS, Sparsifier


@SPARSIFIERS.register("randomk")
class RandomK(Sparsifier):
    shared_indices = True
    default_reduction = "allreduce"

    def select(self, gradient: Any, residual: Any, k: int, clear_gradient: bool, step: int,
               part: int) -> tuple[Any, Any]:
        d = residual.shape[0]
        generator = np.random.default_rng([self.seed, step, part])
        chosen = self.backend.from_host(np.sort(generator.choice(d, size=min(k, d),
                                                                 replace=False)))
        if gradient is not None:
            residual += gradient
        values = residual[chosen]  # a copy (advanced indexing)
        ops.zero_at(residual, chosen)
        if clear_gradient and gradient is not None:
            gradient[:] = 0
        return chosen, values
