"""The density of each step and the k it allows: the one place the rule is written.

density_at(step) = warmup_densities[step // warmup_steps]  for step < warmup_steps * stages
                 = density                                  after (and without a warm-up)

k per part of the fused gradient (parts: each parameter for granularity "bucket", the whole
gradient for "model"): k_i = max(1, ceil(density * n_i)) for every part with n_i > 0; the step's
k is their sum. A `Budget` holds both, computed once per density.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


def density_at(config: Any, step: int) -> float:
    """The density of optimizer step `step` (0-based) of a sparse configuration, warm-up
    included (`config`: a `gtopk_hvd.compression.SparseCompression`)."""
    if config.warmup_steps and step < config.warmup_steps * len(config.warmup_densities):
        return config.warmup_densities[step // config.warmup_steps]
    return config.density


@dataclass(frozen=True)
class Budget:
    """The k of one density: `parts` as (part, begin, end, k) over the fused gradient (part: the
    source's position in the layout, 0 for "model"), `k` their sum."""

    density: float
    k: int
    parts: tuple[tuple[int, int, int, int], ...]


def shard_budget(shard_size: int, density: float) -> int:
    """k of one shard of FSDP's sparse reduce-scatter (`gtopk_hvd.torch.sparse_reduce_scatter`):
    the entries each worker sends the shard's owner, min(S, max(1, ceil(density S)))."""
    return min(shard_size, max(1, math.ceil(density * shard_size)))


def budget_for(density: float, sizes: Sequence[int], granularity: str) -> Budget:
    """The module docstring's rule for parts of `sizes` values ("model": one part of sum(sizes);
    "bucket": one per size, empty ones left out)."""
    if granularity == "model":
        spans = [(0, 0, sum(sizes))]
    else:
        spans, begin = [], 0
        for part, n in enumerate(sizes):
            if n:
                spans.append((part, begin, begin + n))
            begin += n
    parts = tuple((part, begin, end, max(1, math.ceil(density * (end - begin))))
                  for part, begin, end in spans)
    return Budget(density, sum(part[3] for part in parts), parts)


class Schedule:
    """density_at and budget_for of one configuration and layout, each density's budget
    computed once."""

    def __init__(self, config: Any, sizes: Sequence[int]) -> None:
        self.config = config
        self.sizes = list(sizes)
        self._budgets: dict[float, Budget] = {}

    def budget(self, step: int) -> Budget:
        density = density_at(self.config, step)
        budget = self._budgets.get(density)
        if budget is None:
            budget = self._budgets[density] = budget_for(density, self.sizes,
                                                          self.config.granularity)
        return budget
