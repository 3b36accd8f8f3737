"""The readiness probe: how a reduction splits its communication time into wait and transfer.

A data exchange's wall time mixes two things a user wants apart: waiting for the other side to
reach the exchange (a straggler: a slower worker, a late step) and moving the bytes (the link).
Before each data exchange the reduction first exchanges an empty message with the same
partner(s) (`probe_partner`, a zero-byte `sendrecv` in the phase's own probe tag; for a
collective, a one-value all-gather, `probe_everyone`), so that

    wait     = time of the probe: until the slowest of the partners (or of all workers, for a
               collective) reached the exchange, plus one small-message latency (microseconds
               on shared memory, a network round trip's worth between hosts)
    transfer = time of the data exchange itself, which starts with every partner ready

and comm_seconds = wait + transfer. A partner can be late because it waited for its own partner
in an earlier round: the wait says "someone upstream was late", not who. On a transport whose
phases are collectives (Horovod's: every sendrecv is one alltoall of all workers) each probe
waits for every worker, and a worker idle in a phase (gTop-k's folds) waits there too: its idle
phases count, probe as wait and data as transfer (on point-to-point transports they take no
time).

The probe costs one more operation per data exchange (per gTop-k round, fold message, dense
all-reduce): over MPI a zero-byte message, small next to the data; over Horovod's collectives
and torch.distributed one more negotiated operation (an alltoall, a length exchange) per
exchange, whose fixed cost is a large share of a step at small k. The measured figures, with
their command, are in docs/results.md ("The wait probe"). Hence the default follows the transport
(`Transport.wait_probe_default`: on for "mpi" and for transports that do not say, off for
"horovod" and "torch"), and GTOPK_HVD_WAIT_PROBE=1 / 0 forces it on / off. Without the probe
wait_seconds is 0 and transfer_seconds holds all of the communication, waits included. Every
worker must use the same setting (the probe adds phases to the schedule): gTop-k checks it at
its first call, the sparse step as part of its workers' agreement. Top-k's all-gather needs no
extra message: its all-gather of the set sizes is already a small collective before the data,
and serves as its probe whatever the setting.
"""

from __future__ import annotations

import os
import time

import numpy as np

from gtopk_hvd.transports.base import Transport

ENVIRONMENT_VARIABLE = "GTOPK_HVD_WAIT_PROBE"
PROBE_TAG_OFFSET = 10
"""A phase's probe runs under tag + PROBE_TAG_OFFSET (gTop-k's 11, 12, 13 -> 21, 22, 23)."""

_EMPTY = np.zeros(1, dtype=np.uint8)


def wait_probe_from_environment() -> bool | None:
    """GTOPK_HVD_WAIT_PROBE: "1" on, "0" off, unset or empty None (the transport decides)."""
    text = os.environ.get(ENVIRONMENT_VARIABLE, "").strip()
    if text == "":
        return None
    if text in ("0", "1"):
        return text == "1"
    raise ValueError(f"{ENVIRONMENT_VARIABLE} must be 0 or 1, got {text!r}")


def resolve_wait_probe(wait_probe: bool | None, transport: Transport) -> bool:
    """Whether to probe: wait_probe if given, else GTOPK_HVD_WAIT_PROBE if set, else the
    transport's `wait_probe_default`."""
    if wait_probe is None:
        wait_probe = wait_probe_from_environment()
    if wait_probe is None:
        wait_probe = getattr(transport, "wait_probe_default", True)
    return bool(wait_probe)


def probe_partner(transport: Transport, dest: int | None, source: int | None, tag: int,
                  receive: np.ndarray) -> float:
    """Seconds until `dest` / `source` reached this phase: a zero-byte sendrecv with them under
    tag + PROBE_TAG_OFFSET. dest = source = None: a worker without a partner in the phase; a
    no-op on point-to-point transports, while on a collective one (Horovod's alltoall) it waits
    for every worker to reach the phase, which is then its wait.
    `receive`: any buffer (nothing is written to it)."""
    start = time.perf_counter()
    transport.sendrecv(_EMPTY, 0, dest, receive, source, tag + PROBE_TAG_OFFSET)
    return time.perf_counter() - start


def probe_everyone(transport: Transport) -> float:
    """Seconds until the last worker reached this collective: a one-value all-gather."""
    start = time.perf_counter()
    transport.allgather(np.zeros(1, dtype=np.int64))
    return time.perf_counter() - start
