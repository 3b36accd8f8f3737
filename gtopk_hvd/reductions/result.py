"""What a reduction returns: the global set and what it cost."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass
class ReductionStats:
    """What one reduction cost this worker.

    comm_seconds = wait_seconds + transfer_seconds (`gtopk_hvd.reductions.wait_probe`):
    wait_seconds is the time spent until the partners (gTop-k: each round's partner; a collective:
    the slowest worker) reached each data exchange, measured by a zero-byte probe exchange just
    before it, so it includes one small-message latency per exchange; transfer_seconds is the
    time of the data exchanges themselves. With the probe off (GTOPK_HVD_WAIT_PROBE=0)
    wait_seconds is 0 and transfer_seconds includes the waits. Bytes and messages count the
    data only, not the probes.
    """

    bytes_sent: int = 0
    bytes_received: int = 0
    messages_sent: int = 0
    rounds: int = 0
    merge_seconds: float = 0.0
    comm_seconds: float = 0.0
    wait_seconds: float = 0.0
    transfer_seconds: float = 0.0

    def add_exchange(self, wait: float, transfer: float) -> None:
        """Counts one data exchange: `wait` seconds of its probe, `transfer` of its data."""
        self.wait_seconds += wait
        self.transfer_seconds += transfer
        self.comm_seconds += wait + transfer


@dataclass
class SparseResult:
    """The global set (identical on every worker) and which local entries are in it."""

    indices: np.ndarray
    values: np.ndarray  # float32 sums over workers
    # bool, one per local entry: its index is in `indices`; None where not marked (the device
    # reduction: the caller restores with `ops.restore_unselected`, a search per entry, instead;
    # the all-gather on tensors: `all_survived`)
    survived: np.ndarray | None
    stats: ReductionStats = field(default_factory=ReductionStats)
    # every local entry is in `indices` by construction (the all-gather sums every set): there
    # is nothing to restore, and the caller need not read `survived`
    all_survived: bool = False
