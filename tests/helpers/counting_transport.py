"""A Transport that wraps another and records every call that reaches it, with its bytes.

Given to an adapter (`transport=`), it shows what the sparse step sends through the transport
it was given: which operations, how many, how many bytes, step by step (`take()` returns the
calls since the last take). Byte counts are this worker's: for sendrecv what it handed over to
send (0 with no destination) and what it received; for the collectives its own array and what
came back from the others.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gtopk_hvd.transports import Transport


@dataclass(frozen=True)
class Call:
    operation: str  # "sendrecv", "allgather", "allgatherv" or "allreduce_sum"
    sent: int  # bytes
    received: int  # bytes
    tag: int | None = None  # sendrecv's phase tag


class CountingTransport(Transport):
    """`inner`'s workers, rank and size, its wait-probe default and hint; records each call."""

    def __init__(self, inner: Transport) -> None:
        self.inner = inner
        self.rank, self.size = inner.rank, inner.size
        self.wait_probe_default = inner.wait_probe_default
        self.mismatch_hint = inner.mismatch_hint
        self.calls: list[Call] = []

    def take(self) -> list[Call]:
        """The calls since the last take (or since construction)."""
        calls, self.calls = self.calls, []
        return calls

    def sendrecv(self, send: np.ndarray, send_bytes: int, dest: int | None, receive: np.ndarray,
                 source: int | None, tag: int) -> int:
        received = self.inner.sendrecv(send, send_bytes, dest, receive, source, tag)
        self.calls.append(Call("sendrecv", send_bytes if dest is not None else 0, received, tag))
        return received

    def allgather(self, local: np.ndarray) -> np.ndarray:
        result = self.inner.allgather(local)
        self.calls.append(Call("allgather", local.nbytes, result.nbytes - local.nbytes))
        return result

    def allgatherv(self, local: np.ndarray, counts: np.ndarray) -> np.ndarray:
        result = self.inner.allgatherv(local, counts)
        self.calls.append(Call("allgatherv", local.nbytes, result.nbytes - local.nbytes))
        return result

    def allreduce_sum(self, array: np.ndarray) -> None:
        self.inner.allreduce_sum(array)
        self.calls.append(Call("allreduce_sum", array.nbytes, array.nbytes))

    def abort(self, message: str) -> None:
        self.inner.abort(message)


def data_messages(calls: list[Call]) -> list[Call]:
    """The sendrecv calls that moved bytes (not a readiness probe, not an idle phase)."""
    return [c for c in calls if c.operation == "sendrecv" and (c.sent or c.received)]


def gtopk_messages(rank: int, size: int, message_bytes: int) -> tuple[list[int], list[int]]:
    """The bytes of each message worker `rank` sends and receives in one gTop-k reduction whose
    sets all have the same size (message_bytes each): fold in (workers >= P' send to
    rank - P'), log2(P') rounds among the first P' workers (r XOR 2^j), fold out (back)."""
    base = 1 << (size.bit_length() - 1)
    sent, received = [], []
    if rank >= base:
        sent.append(message_bytes)  # fold in
    elif rank < size - base:
        received.append(message_bytes)
    distance = 1
    while distance < base:
        if rank < base:
            sent.append(message_bytes)
            received.append(message_bytes)
        distance <<= 1
    if rank >= base:
        received.append(message_bytes)  # fold out
    elif rank < size - base:
        sent.append(message_bytes)
    return sent, received


ENTRY_BYTES = 8  # a sparse set's entry on the wire: int32 index + float32 value


def check_reduction_calls(calls: list[Call], stats: object, reduction: str, k: int, rank: int,
                          size: int, what: str) -> None:
    """The calls of one sparse step (every set of k entries, float32 on the wire) carried its
    reduction: gTop-k ("gtopk"): the schedule's messages (`gtopk_messages`), their bytes the
    step's stats; Top-k ("allgather"): two all-gathers of this worker's k indices and k values,
    the others' coming back, and no point-to-point data."""
    if reduction == "gtopk":
        messages = data_messages(calls)
        want = gtopk_messages(rank, size, ENTRY_BYTES * k)
        got = ([c.sent for c in messages if c.sent], [c.received for c in messages if c.received])
        assert got == want, (what, calls)
        assert (stats.bytes_sent, stats.bytes_received) == (sum(got[0]), sum(got[1])), (
            what, stats)
        assert not [c for c in calls if c.operation == "allgatherv"], (what, calls)
    else:
        gathers = [(c.sent, c.received) for c in calls if c.operation == "allgatherv"]
        assert gathers == [(4 * k, 4 * k * (size - 1))] * 2, (what, calls)
        assert not data_messages(calls), (what, calls)
