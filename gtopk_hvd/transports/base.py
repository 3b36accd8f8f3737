"""What the reductions need from the network: the `Transport` interface.

A Transport is a group of `size` workers, this one being `rank`, that can exchange byte buffers
point to point, gather arrays, all-reduce dense arrays and end the job. The reductions and the
sparse step use nothing else, so a new way to communicate (MPI, Horovod's collectives,
torch.distributed, threads in a test) is one subclass, registered by name in
`gtopk_hvd.transports`.
"""

from __future__ import annotations

import os
import sys
from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any

import numpy as np


class Transport(ABC):
    """A group of workers; implementations set `rank` and `size`."""

    rank: int
    size: int
    mismatch_hint: str = ""
    """Appended to the error when the transport's workers are not Horovod's (names the fix)."""
    wait_probe_default: bool = True
    """Whether the reductions time a readiness probe before each data exchange by default
    (`gtopk_hvd.reductions.wait_probe`; GTOPK_HVD_WAIT_PROBE overrides): True where an empty
    message costs next to nothing next to the data, False where each is a costly operation."""

    @abstractmethod
    def sendrecv(self, send: np.ndarray, send_bytes: int, dest: int | None,
                 receive: np.ndarray, source: int | None, tag: int) -> int:
        """Sends send[:send_bytes] to dest while receiving into `receive` from source.

        One phase of a schedule: every worker calls it, in the same order, a worker without a
        partner in the phase with dest=None and source=None (a no-op for point-to-point
        transports; a collective one, e.g. Horovod's alltoall, joins sending nothing).
        Messages of one phase match by (source, tag). Both directions run at once, so two
        partners that send to each other do not deadlock.

        Args:
            send: the outgoing bytes, a contiguous host uint8 array of at least send_bytes.
            send_bytes: how many bytes of send go out (>= 0; 0: an empty message).
            dest: the rank to send to, or None: receive only.
            receive: a host uint8 array the incoming message is written into from its start,
                at least as long as the longest message the schedule sends in this phase.
            source: the rank to receive from, or None: send only.
            tag: the phase's number, the same on the sender and the receiver.

        Returns:
            The number of bytes received into `receive` (0 when source is None).
        """

    tensor_device: Any = None
    """The torch device whose tensors `sendrecv_tensors`, `allgather_tensors` and
    `allreduce_sum_tensors` take as they are (torch.distributed: the process group's, a GPU
    under NCCL), or None: this transport sends host arrays only. A transport that sets it
    implements the first two (the third has a default through the host)."""

    def sendrecv_tensors(self, send: Sequence[Any], dest: int | None, receive: Sequence[Any],
                         source: int | None, tag: int) -> None:
        """`sendrecv` for torch tensors on `tensor_device`, without a host copy.

        The receive is complete, on the tensors' stream, when it returns (a GPU's host need not
        wait). A phase without a partner (dest and source None) is a no-op.

        Args:
            send: the tensors to send to dest (ignored when dest is None).
            dest: the rank to send to, or None: receive only.
            receive: the tensors written in place with source's `send`, which they match in
                number, shape and dtype (the schedule fixes them on both sides).
            source: the rank to receive from, or None: send only.
            tag: the phase's number, the same on the sender and the receiver.

        Raises:
            NotImplementedError: a transport that sends host arrays only (this base method).
        """
        raise NotImplementedError(f"{type(self).__name__} sends host arrays only "
                                  "(tensor_device is None)")

    def allgather_tensors(self, local: Sequence[Any], gathered: Sequence[Any]) -> None:
        """`allgather` for torch tensors on `tensor_device`, in place into `gathered`.

        Args:
            local: this worker's 1-D tensors, each of the same length and dtype on every
                worker.
            gathered: one flat tensor per local tensor, of size x its length and its dtype:
                gathered[j][r n:(r + 1) n] = worker r's local[j] (n its length), in rank order.

        Raises:
            NotImplementedError: a transport that gathers host arrays only (this base method).
        """
        raise NotImplementedError(f"{type(self).__name__} gathers host arrays only "
                                  "(tensor_device is None)")

    def allreduce_sum_tensors(self, tensors: Sequence[Any]) -> None:
        """`allreduce_sum` for torch tensors on `tensor_device`, in place.

        A transport that sends tensors from a device overrides it to sum there
        (torch.distributed: one all-reduce per tensor, no host copy); this default, for any
        other, goes through the host: a copy there, `allreduce_sum`, a copy back. Empty tensors
        are left as they are.

        Args:
            tensors: float32 tensors, each of the same shape on every worker; each becomes
                the elementwise sum of every worker's.
        """
        for tensor in tensors:
            if tensor.numel() == 0:
                continue
            array = tensor.detach().cpu().numpy().copy()
            self.allreduce_sum(array)
            import torch

            tensor.copy_(torch.from_numpy(array))

    def takes_tensors_on(self, device: Any) -> bool:
        """Whether the tensor operations take tensors on `device` as they are.

        Args:
            device: a torch device, or anything `torch.device` takes ("cuda:0", "cpu").

        Returns:
            True when `tensor_device` is set and is that device; False otherwise (the caller
            then goes through host arrays).
        """
        if self.tensor_device is None:
            return False
        import torch

        return torch.device(self.tensor_device) == torch.device(device)

    @abstractmethod
    def allgather(self, local: np.ndarray) -> np.ndarray:
        """Stacks every worker's array, in rank order.

        Args:
            local: this worker's host array, of the same shape and dtype on every worker.

        Returns:
            An array of shape (size, *local.shape) and local's dtype, the same on every
            worker: result[r] is worker r's local.
        """

    @abstractmethod
    def allgatherv(self, local: np.ndarray, counts: np.ndarray) -> np.ndarray:
        """Concatenates every worker's 1-D array, in rank order (lengths may differ).

        Args:
            local: this worker's 1-D host array, of the same dtype on every worker.
            counts: an integer array of `size` lengths, the same on every worker:
                counts[r] = worker r's len(local) (usually from an `allgather` of the lengths).

        Returns:
            A 1-D array of sum(counts) values and local's dtype, the same on every worker:
            worker r's local at [sum(counts[:r]), sum(counts[:r + 1])).
        """

    @abstractmethod
    def allreduce_sum(self, array: np.ndarray) -> None:
        """In place: array = its elementwise sum over every worker's.

        Args:
            array: a host numpy array of the same shape and dtype on every worker: float32 or
                float64 values, or int32 counts (the step's count of workers).
        """

    def abort(self, message: str) -> None:
        """Ends every worker of the job with `message` printed; does not return.

        Called where a worker finds the others cannot go on (a schedule broken, a wait past its
        bound) and waiting would hang them. This default prints to stderr and exits the process
        with status 1, which horovodrun, mpirun and torchrun turn into the end of every worker;
        MPI's calls MPI_Abort, the local group's raises `LocalGroupBroken` in every thread.

        Args:
            message: what went wrong, printed with this worker's rank.
        """
        print(f"gtopk_hvd [rank {self.rank}]: {message}", file=sys.stderr, flush=True)
        sys.stdout.flush()
        os._exit(1)


def check_same_workers(transport: Transport, rank: int, size: int, needed_by: str,
                       whose: str, owner: str, hint: str) -> None:
    """Raises RuntimeError if the transport is not this worker of `owner`'s group (rank `rank`
    of `size`): "<needed_by> needs a transport whose workers are <whose>: <transport> sees rank
    .. of .., <owner> rank .. of ... <hint>"."""
    if transport.size != size or transport.rank != rank:
        raise RuntimeError(
            f"{needed_by} needs a transport whose workers are {whose}: "
            f"{type(transport).__name__} sees rank {transport.rank} of {transport.size}, "
            f"{owner} rank {rank} of {size}. {hint}".rstrip())


def check_matches_horovod(transport: Transport, hvd_rank: int, hvd_size: int) -> None:
    """Raises if the transport's workers are not Horovod's (same rank, same size)."""
    check_same_workers(transport, hvd_rank, hvd_size, "gtopk_hvd", "Horovod's", "Horovod",
                       transport.mismatch_hint)
