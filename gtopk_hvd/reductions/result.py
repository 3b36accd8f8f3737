"""What a reduction returns: the global set and what it cost."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass
class ReductionStats:
    """What one reduction cost this worker."""

    bytes_sent: int = 0
    bytes_received: int = 0
    messages_sent: int = 0
    rounds: int = 0
    merge_seconds: float = 0.0
    comm_seconds: float = 0.0


@dataclass
class SparseResult:
    """The global set (identical on every worker) and which local entries are in it."""

    indices: np.ndarray
    values: np.ndarray  # float32 sums over workers
    survived: np.ndarray  # bool, one per local entry: its index is in `indices`
    stats: ReductionStats = field(default_factory=ReductionStats)
