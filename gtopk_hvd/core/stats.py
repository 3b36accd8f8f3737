"""What one sparse step did on one worker: `StepStats`."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class StepStats:
    """What the last step did on this worker (readable as `optimizer.last_stats`).

    How to read the communication time: communicate_seconds = wait_seconds + transfer_seconds.
    Before each data exchange of the reduction the workers swap an empty message with the same
    partner(s) (`gtopk_hvd.reductions.wait_probe`):

    - wait_seconds: time until the partners were ready. gTop-k: each round's partner (who may
      itself have waited for its own partner in an earlier round); Top-k's all-gather and the
      dense / shared-index all-reduce: the slowest worker. It includes one small-message latency
      per exchange. Large on some workers, small on one: that
      one is the straggler (a slower worker, a late step, a data loader), not the network.
    - transfer_seconds: time of the data exchanges, started with every partner ready: the link's
      share (bandwidth, latency). Large on every worker: the network (or k) is the cost.

    The probe is on by default over MPI and off over Horovod's collectives and torch.distributed
    (there each probe is one more negotiated operation; docs/results.md has its measured cost);
    GTOPK_HVD_WAIT_PROBE=1 / 0 forces it on / off on every worker. Without it wait_seconds is 0
    and transfer_seconds holds the whole communication, waits included (Top-k's all-gather
    splits either way: its all-gather of set sizes is the probe). A registered reduction that
    does not fill the split reports both as 0. merge_seconds (gTop-k's merges) is in neither.

    Attributes:
        step: the step count when the step ran (0-based; skipped steps not counted).
        density: the density of the step's budget (the warm-up's, or the configuration's);
            1.0 for a dense step.
        k: the number of entries this worker selects in the step (the budget; d for a dense
            step).
        global_entries: the entries of the global set applied (identical on every worker; 0
            for a skipped step, d for a dense one).
        bytes_sent: the data bytes this worker sent (the probes not counted; a dense step: a
            ring all-reduce's 2 (P - 1) / P x 4 d).
        bytes_received: the data bytes this worker received, counted as bytes_sent.
        select_seconds: this worker's local work before its first exchange: predivision,
            momentum correction, accumulation into the residual and selection.
        communicate_seconds: wait_seconds + transfer_seconds.
        merge_seconds: gTop-k's merges of received sets (0 for the other reductions).
        write_seconds: the write of the global set into the caller's buffer as the dense
            update (zeros, then the scatter); 0 where the set is returned instead.
        wait_seconds: time until the partners (or the slowest worker) were ready, the
            step's opening count of workers (non-finite, joined) included.
        transfer_seconds: time of the data exchanges themselves.
        check_seconds: with nonfinite="propagate", the read of this worker's gradient for
            NaN / Inf (the count that follows it is a wait).
        skipped: True when a worker's gradient was not finite: no exchange, the update all
            NaN, the state unchanged.
    """

    step: int
    density: float
    k: int
    global_entries: int
    bytes_sent: int
    bytes_received: int
    select_seconds: float
    communicate_seconds: float  # = wait_seconds + transfer_seconds
    merge_seconds: float
    write_seconds: float = 0.0  # the adapter's write-back of the update (zero + scatter)
    wait_seconds: float = 0.0  # until the partners (or the slowest worker) were ready
    transfer_seconds: float = 0.0  # the data exchanges themselves
    check_seconds: float = 0.0  # nonfinite="propagate": the finiteness read (its count: a wait)
    skipped: bool = False  # a worker's gradient was not finite: no reduction, update all NaN
