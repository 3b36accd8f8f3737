"""A Transport whose workers are threads of one process (for property tests of the schedules).

Real MPI is what the mpirun tests use; this lets hypothesis explore many worker counts and set
shapes in one process. Links are queues keyed by (source, destination, tag).
"""

from __future__ import annotations

import queue
import threading
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from typing import Callable

import numpy as np

from gtopk_hvd.transports import Transport


class ThreadGroup:
    """size workers. check_phases: every sendrecv is also a barrier that fails unless every
    worker calls it with the same tag (what a collective transport such as Horovod's needs)."""

    def __init__(self, size: int, check_phases: bool = False) -> None:
        self.size = size
        self.check_phases = check_phases
        self.phases: list[int] = []  # the tags of the phases, in order (with check_phases)
        self._links: defaultdict[tuple, queue.Queue] = defaultdict(queue.Queue)
        self._lock = threading.Lock()
        self._barrier = threading.Barrier(size)
        self._slots: list = [None] * size

    def link(self, source: int, dest: int, tag: int) -> queue.Queue:
        with self._lock:
            return self._links[(source, dest, tag)]

    def exchange(self, rank: int, item: object) -> list:
        """Every worker's item, in rank order (a barrier on both sides)."""
        self._slots[rank] = item
        self._barrier.wait(timeout=30)
        items = list(self._slots)
        self._barrier.wait(timeout=30)
        return items

    def run(self, work: Callable[[ThreadTransport], object]) -> list:
        """work(transport) on every worker at once; the results in rank order."""
        with ThreadPoolExecutor(self.size) as pool:
            futures = [pool.submit(work, ThreadTransport(self, rank)) for rank in range(self.size)]
            return [future.result(timeout=60) for future in futures]


class ThreadTransport(Transport):
    def __init__(self, group: ThreadGroup, rank: int) -> None:
        self.group, self.rank, self.size = group, rank, group.size

    def sendrecv(self, send: np.ndarray, send_bytes: int, dest: int | None, receive: np.ndarray,
                 source: int | None, tag: int) -> int:
        if self.group.check_phases:
            tags = self.group.exchange(self.rank, tag)
            if len(set(tags)) != 1:
                raise AssertionError(f"workers are in different phases: tags {tags}")
            if self.rank == 0:
                self.group.phases.append(tag)
        if dest is not None:
            self.group.link(self.rank, dest, tag).put(send[:send_bytes].tobytes())
        if source is None:
            return 0
        message = self.group.link(source, self.rank, tag).get(timeout=30)
        receive[:len(message)] = np.frombuffer(message, dtype=np.uint8)
        return len(message)

    tensor_device = "cpu"  # sendrecv_tensors takes CPU tensors (a GPU transport's path)

    def sendrecv_tensors(self, send: list, dest: int | None, receive: list, source: int | None,
                         tag: int) -> None:
        if dest is not None:
            self.group.link(self.rank, dest, tag).put([t.detach().clone() for t in send])
        if source is not None:
            message = self.group.link(source, self.rank, tag).get(timeout=30)
            assert [(t.shape, t.dtype) for t in message] == [(t.shape, t.dtype)
                                                             for t in receive], "mismatch"
            for target, arrived in zip(receive, message):
                target.copy_(arrived)

    def allgather_tensors(self, local: list, gathered: list) -> None:
        import torch

        everyone = self.group.exchange(self.rank, [t.detach().clone() for t in local])
        for j, target in enumerate(gathered):
            target.copy_(torch.cat([tensors[j] for tensors in everyone]))

    def allreduce_sum_tensors(self, tensors: list) -> None:
        """Each tensor summed as `allreduce_sum` sums an array (numpy, in rank order), so a
        device path over it gives the host path's bits. The copies to numpy are the test's
        stand-in for the network, not the step's: made on plain tensors, which the host-sync
        counter (tests/helpers/host_syncs.py) does not see."""
        import torch

        for tensor in tensors:
            mine = tensor.detach().as_subclass(torch.Tensor).cpu().numpy().copy()
            total = np.sum(self.group.exchange(self.rank, mine), axis=0)
            tensor.copy_(torch.from_numpy(total))

    def allgather(self, local: np.ndarray) -> np.ndarray:
        return np.stack(self.group.exchange(self.rank, np.array(local, copy=True)))

    def allgatherv(self, local: np.ndarray, counts: np.ndarray) -> np.ndarray:
        return np.concatenate(self.group.exchange(self.rank, np.array(local, copy=True)))

    def allreduce_sum(self, array: np.ndarray) -> None:
        array[:] = np.sum(self.group.exchange(self.rank, array.copy()), axis=0)

    def abort(self, message: str) -> None:
        raise RuntimeError(message)
