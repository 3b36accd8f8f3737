"""P workers as threads of one process: the transport of the simulated cluster.

`LocalGroup(P)` owns P `LocalTransport`s (rank 0..P-1) and runs one function on every worker
at once, each in its own thread (`run`). Inside such a thread the registered name "local"
resolves to that worker's transport, so code that takes `transport="local"` runs unchanged.

Semantics are those of the real transports, rank for rank: `sendrecv` matches messages by
(source, destination, tag) through one queue per link; the collectives (`allgather`,
`allgatherv`, `allreduce_sum`) hand every worker the same result, stacked or summed in rank
order. Which sums a reduction does itself (gTop-k's merges, Top-k's scatter of the gathered
sets) are therefore the same operations in the same order as under mpirun; a dense all-reduce
sums in rank order, MPI in an order of its own (equal to float rounding).

A worker that raises breaks the group: every other worker's pending or next call raises
`LocalGroupBroken` instead of waiting, and `run` re-raises the first error. No call waits
longer than `timeout_s` (a missed collective is an error naming the call, not a hang).
"""

from __future__ import annotations

import queue
import threading
from collections import defaultdict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

import numpy as np

from gtopk_hvd.transports.base import Transport

T = TypeVar("T")
_POLL_S = 0.2
_current = threading.local()


class LocalGroupBroken(RuntimeError):
    """Another worker of the group failed (or a call waited past the group's timeout)."""


class LocalGroup:
    """`size` workers as threads of this process (module docstring)."""

    def __init__(self, size: int, timeout_s: float = 600.0) -> None:
        if size < 1:
            raise ValueError(f"a local group needs at least 1 worker, got {size}")
        self.size = size
        self.timeout_s = timeout_s
        self.transports = [LocalTransport(self, rank) for rank in range(size)]
        self._links: defaultdict[tuple[int, int, int], queue.SimpleQueue] = defaultdict(
            queue.SimpleQueue)
        self._links_lock = threading.Lock()
        self._barrier = threading.Barrier(size)
        self._slots: list[object] = [None] * size
        self._failure: BaseException | None = None
        self._pool = ThreadPoolExecutor(size, thread_name_prefix="gtopk-local") if size > 1 \
            else None

    def run(self, work: Callable[[int], T]) -> list[T]:
        """work(rank) on every worker at once (worker r's thread resolves "local" to
        transports[r]); the results in rank order. Re-raises the first worker's error."""
        if self._failure is not None:
            raise LocalGroupBroken("the local group broke earlier") from self._failure
        if self._pool is None:
            return [self._as_worker(0, work)]
        futures = [self._pool.submit(self._as_worker, rank, work) for rank in range(self.size)]
        results, errors = [], []
        for future in futures:
            try:
                results.append(future.result())
            except BaseException as error:  # noqa: BLE001 - collected, the first re-raised
                errors.append(error)
        if errors:
            first = next((e for e in errors if not isinstance(e, LocalGroupBroken)), errors[0])
            raise first
        return results

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown()

    def _as_worker(self, rank: int, work: Callable[[int], T]) -> T:
        _current.transport = self.transports[rank]
        try:
            return work(rank)
        except BaseException as error:
            self._break(error)
            raise
        finally:
            _current.transport = None

    def _break(self, error: BaseException) -> None:
        if self._failure is None:
            self._failure = error
        self._barrier.abort()

    def _exchange(self, rank: int, item: object, what: str) -> list[object]:
        """Every worker's item in rank order; a barrier before and after the read."""
        self._slots[rank] = item
        self._wait(what)
        items = list(self._slots)
        self._wait(what)
        return items

    def _wait(self, what: str) -> None:
        try:
            self._barrier.wait(timeout=self.timeout_s)
        except threading.BrokenBarrierError:
            if self._failure is None:
                self._failure = LocalGroupBroken(f"{what}: not every worker arrived within "
                                                 f"{self.timeout_s:g} s")
            raise LocalGroupBroken(f"{what}: the local group broke ({self._failure!r})") \
                from None

    def _link(self, source: int, dest: int, tag: int) -> queue.SimpleQueue:
        with self._links_lock:
            return self._links[(source, dest, tag)]

    def _receive(self, source: int, dest: int, tag: int) -> bytes:
        link = self._link(source, dest, tag)
        waited = 0.0
        while True:
            try:
                return link.get(timeout=_POLL_S)
            except queue.Empty:
                waited += _POLL_S
                if self._failure is not None:
                    raise LocalGroupBroken(f"message tag {tag} from {source} to {dest}: the "
                                           f"local group broke ({self._failure!r})") from None
                if waited >= self.timeout_s:
                    error = LocalGroupBroken(f"message tag {tag} from {source} to {dest}: none "
                                             f"came within {self.timeout_s:g} s")
                    self._break(error)
                    raise error from None


class LocalTransport(Transport):
    """Worker `rank` of a LocalGroup."""

    wait_probe_default = False  # every worker is in this process: nothing to wait for apart

    def __init__(self, group: LocalGroup, rank: int) -> None:
        self.group, self.rank, self.size = group, rank, group.size

    def sendrecv(self, send: np.ndarray, send_bytes: int, dest: int | None,
                 receive: np.ndarray, source: int | None, tag: int) -> int:
        if dest is not None:
            self.group._link(self.rank, dest, tag).put(send[:send_bytes].tobytes())
        if source is None:
            return 0
        message = self.group._receive(source, self.rank, tag)
        receive[:len(message)] = np.frombuffer(message, dtype=np.uint8)
        return len(message)

    def allgather(self, local: np.ndarray) -> np.ndarray:
        return np.stack(self.group._exchange(self.rank, np.array(local, copy=True), "allgather"))

    def allgatherv(self, local: np.ndarray, counts: np.ndarray) -> np.ndarray:
        parts = self.group._exchange(self.rank, np.array(local, copy=True), "allgatherv")
        return np.concatenate(parts)

    def allreduce_sum(self, array: np.ndarray) -> None:
        parts = self.group._exchange(self.rank, array.copy(), "allreduce")
        total = parts[0].copy()
        for part in parts[1:]:
            total += part
        array[...] = total

    def abort(self, message: str) -> None:
        error = LocalGroupBroken(f"worker {self.rank}: {message}")
        self.group._break(error)
        raise error


def current_transport() -> LocalTransport:
    """The transport of the LocalGroup worker whose thread calls this (the name "local")."""
    transport = getattr(_current, "transport", None)
    if transport is None:
        raise RuntimeError("transport=\"local\" names the worker of a LocalGroup whose thread "
                           "runs the code (gtopk_hvd.transports.local.LocalGroup.run); this "
                           "thread is not one. Pass a LocalTransport, or run inside "
                           "LocalGroup.run.")
    return transport
