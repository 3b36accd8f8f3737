"""ExDyna (Yoon & Oh, CCGrid 2024): MiCRO with partitions of fine blocks whose boundaries move
to balance the selected counts (registered as "exdyna").

The fused gradient is cut into n blocks (option `blocks`, default 1024; a block holds a
multiple of 32 values, at least one value) and the blocks into P contiguous partitions, equal at
the start. Selection, exchange, residual and threshold are MiCRO's (`gtopk_hvd.schemes.micro`).
After each step, with c_q the count selected in partition q (from the all-gathered counts, so
the same on every worker) and m their mean, each boundary between partitions q and q + 1, for
q = 0 .. P-2 in order, moves by one block:

    c_q > (1 + tol) m and c_{q+1} < (1 - tol) m   ->  q gives its last block to q + 1
    c_{q+1} > (1 + tol) m and c_q < (1 - tol) m   ->  q + 1 gives its first block to q

unless the giver would fall below max(1, n / (4P)) blocks. tol is option `balance` (default
0.05). Options: MiCRO's (`threshold`, `controller`), `blocks`, `balance`. The boundaries are
part of the scheme's state (checkpointed with the step).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from gtopk_hvd.options import check_integer, check_number
from gtopk_hvd.schemes.base import SCHEMES
from gtopk_hvd.schemes.micro import Micro, MicroOptions


@dataclass(frozen=True)
class ExDynaOptions(MicroOptions):
    """ExDyna's own options: MiCRO's, `blocks` and `balance` (module docstring)."""

    blocks: int = 1024
    balance: float = 0.05

    def __post_init__(self) -> None:
        super().__post_init__()
        check_integer("blocks", self.blocks, 1,
                      fix="the number of fine blocks the partitions are made of (default 1024)")
        check_number("balance", self.balance, 0.0, 1.0, high_open=True,
                     fix="the count imbalance, as a fraction of the mean, that moves a boundary "
                         "(default 0.05)")


@SCHEMES.register("exdyna")
class ExDyna(Micro):

    Options = ExDynaOptions

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.tolerance = float(self.options.balance)
        size = self.transport.size
        block = -(-self.d // int(self.options.blocks))
        self.block = 32 * -(-block // 32) if block >= 32 else max(1, block)
        self.n_blocks = -(-self.d // self.block)
        self.min_blocks = max(1, self.n_blocks // (4 * size)) if self.n_blocks >= size else 0
        self.boundaries = (np.arange(size + 1, dtype=np.int64) * self.n_blocks) // size

    def bounds(self) -> np.ndarray:
        return np.minimum(self.boundaries * self.block, self.d)

    def after_step(self, counts: np.ndarray, step: int) -> None:
        mean = counts.sum() / counts.size
        high, low = (1 + self.tolerance) * mean, (1 - self.tolerance) * mean
        edges = self.boundaries
        for q in range(counts.size - 1):
            left_blocks, right_blocks = edges[q + 1] - edges[q], edges[q + 2] - edges[q + 1]
            if counts[q] > high and counts[q + 1] < low and left_blocks > self.min_blocks:
                edges[q + 1] -= 1
            elif counts[q + 1] > high and counts[q] < low and right_blocks > self.min_blocks:
                edges[q + 1] += 1

    def state_dict(self) -> dict:
        return {**super().state_dict(), "boundaries": self.boundaries.copy()}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        if "boundaries" in state:
            boundaries = np.asarray(state["boundaries"], np.int64)
            if boundaries.shape != self.boundaries.shape:
                raise ValueError(f"checkpoint has ExDyna boundaries for "
                                 f"{boundaries.size - 1} workers, this job has "
                                 f"{self.boundaries.size - 1}")
            self.boundaries = boundaries.copy()
