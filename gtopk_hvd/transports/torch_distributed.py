"""The Transport over torch.distributed (Gloo, NCCL, ...): the only module that imports it.

`TorchDistributedTransport(process_group)` runs the reductions on a torch.distributed process
group (default: the default group, as `init_process_group` made it), e.g. for the DDP hook
(`gtopk_hvd.torch.ddp`) or under `torchrun`. Registered as "torch": `transport="torch"` is one
process-wide instance over the default group.

The reductions pass host numpy arrays; they are wrapped as tensors without a copy
(`torch.from_numpy`). With NCCL alone, whose tensors must be on the current CUDA device, each
buffer is copied to that device and the result back; a group with a CPU backend beside NCCL
(`init_process_group()` without a backend on a GPU machine: Gloo for CPU tensors, NCCL for CUDA
ones) sends them from the host. `sendrecv_tensors` sends tensors that are already on the group's
device (`tensor_device`: the current GPU where NCCL serves CUDA tensors, else the CPU) as they
are: gTop-k's rounds on a GPU's state, with no host copy; `allgather_tensors` and
`allreduce_sum_tensors` gather and sum such tensors there (Top-k's sets, the union schemes'
indices and sums).

Point to point (`sendrecv`): the receiver knows only its buffer's capacity, and Gloo silently
receives a shorter message into a longer buffer (what lies past the message is garbage, and
nothing says how much arrived), so every message is two: its length as one int64, then exactly
that many bytes. Both directions of an exchange are posted together (`batch_isend_irecv`), so
two partners that both send first do not deadlock.

`abort` ends this process with exit status 1; `torchrun`'s agent then ends every other worker
(SIGTERM) and exits non-zero itself.
"""

from __future__ import annotations

import gc
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from gtopk_hvd.transports.base import Transport
from gtopk_hvd.transports.wait_bound import WaitBound


class TorchDistributedTransport(Transport):
    """Transport over a torch.distributed process group (None: the default group).

    wait_timeout_s: the bound on any one wait (`gtopk_hvd.transports.wait_bound`; None: from
    GTOPK_HVD_WAIT_TIMEOUT, default 600 s; 0: none), past which the job is aborted.
    """

    # Off: each wait probe would be one more negotiated operation (a length exchange) per data
    # exchange (`gtopk_hvd.reductions.wait_probe`; measured cost: docs/results.md).
    wait_probe_default = False
    mismatch_hint = ("Initialise torch.distributed (init_process_group) with the same workers "
                     "as Horovod: the same world size and each process's rank, e.g. "
                     "dist.init_process_group(backend, rank=hvd.rank(), "
                     "world_size=hvd.size()), or use transport='mpi' under mpirun.")

    def __init__(self, process_group: Any = None, wait_timeout_s: float | None = None) -> None:
        if not dist.is_available() or not dist.is_initialized():
            raise RuntimeError("TorchDistributedTransport needs torch.distributed initialised: "
                               "call torch.distributed.init_process_group first (torchrun sets "
                               "its environment)")
        self.group = process_group
        self.rank = dist.get_rank(process_group)
        self.size = dist.get_world_size(process_group)
        if self.rank < 0:
            raise ValueError("this process is not a member of the process group given")
        self.device, self.tensor_device = group_devices(backend_config(process_group))
        self._length_out = np.zeros(1, dtype=np.int64)
        self._length_in = np.zeros(1, dtype=np.int64)
        self._bound = WaitBound(self.abort, wait_timeout_s)

    # -- the interface ----------------------------------------------------------------------

    def sendrecv(self, send: np.ndarray, send_bytes: int, dest: int | None,
                 receive: np.ndarray, source: int | None, tag: int) -> int:
        if dest is None and source is None:
            return 0
        if dest == self.rank and source == self.rank:  # to itself: no network (Gloo has none)
            if send_bytes > receive.nbytes:
                raise ValueError(f"sendrecv: {send_bytes} bytes to itself, buffer of "
                                 f"{receive.nbytes}")
            _bytes(receive)[:send_bytes] = _bytes(send)[:send_bytes]
            return int(send_bytes)
        if self.rank in (dest, source):
            raise ValueError(f"sendrecv: rank {self.rank} cannot send to or receive from itself "
                             "alone (dest and source must both be itself, or neither)")
        self._length_out[0] = send_bytes
        self._length_in[0] = 0
        with self._bound.waiting(f"torch.distributed message tag {tag} (to {dest}, from "
                                 f"{source})"):
            self._exchange(self._length_out, dest, self._length_in, source, tag)
            received = int(self._length_in[0]) if source is not None else 0
            if received > receive.nbytes:
                self.abort(f"sendrecv: rank {source} sent {received} bytes for tag {tag}, more "
                           f"than the {receive.nbytes} this worker can receive")
            payload_in = _bytes(receive)[:received] if received else None
            payload_out = _bytes(send)[:send_bytes] if dest is not None and send_bytes else None
            self._exchange(payload_out, dest if payload_out is not None else None,
                           payload_in, source if payload_in is not None else None, tag)
        return received

    def sendrecv_tensors(self, send: Sequence[torch.Tensor], dest: int | None,
                         receive: Sequence[torch.Tensor], source: int | None, tag: int) -> None:
        operations = []
        if dest is not None:
            operations += [dist.P2POp(dist.isend, tensor, self._peer(dest), self.group, tag)
                           for tensor in send]
        if source is not None:
            operations += [dist.P2POp(dist.irecv, tensor, self._peer(source), self.group, tag)
                           for tensor in receive]
        if not operations:
            return
        with self._bound.waiting(f"torch.distributed tensors tag {tag} (to {dest}, from "
                                 f"{source})"):
            for work in dist.batch_isend_irecv(operations):
                work.wait()

    def allgather_tensors(self, local: Sequence[torch.Tensor],
                          gathered: Sequence[torch.Tensor]) -> None:
        gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
        with self._bound.waiting("torch.distributed all-gather of tensors"):
            for source, target in zip(local, gathered, strict=True):
                gather(target, source, group=self.group)

    def allreduce_sum_tensors(self, tensors: Sequence[torch.Tensor]) -> None:
        with self._bound.waiting("torch.distributed all-reduce of tensors"):
            for tensor in tensors:
                if tensor.numel():
                    dist.all_reduce(tensor, op=dist.ReduceOp.SUM, group=self.group)

    def allgather(self, local: np.ndarray) -> np.ndarray:
        local = np.ascontiguousarray(local)
        gathered = np.empty((self.size, *local.shape), dtype=local.dtype)
        if local.nbytes:
            with self._bound.waiting("torch.distributed all-gather"):
                self._all_gather_bytes(local.reshape(-1).view(np.uint8),
                                       gathered.reshape(-1).view(np.uint8))
        return gathered

    def allgatherv(self, local: np.ndarray, counts: np.ndarray) -> np.ndarray:
        """A padded all-gather: every worker sends max(counts) values (padding after its own)."""
        local = np.ascontiguousarray(local).reshape(-1)
        counts = np.asarray(counts, dtype=np.int64)
        if counts.size != self.size or counts[self.rank] != local.size:
            raise ValueError(f"allgatherv: counts {counts.tolist()} do not match {self.size} "
                             f"workers and this worker's {local.size} values")
        width = int(counts.max()) if counts.size else 0
        if width == 0:
            return np.empty(0, dtype=local.dtype)
        padded = np.zeros(width, dtype=local.dtype)
        padded[:local.size] = local
        gathered = np.empty((self.size, width), dtype=local.dtype)
        with self._bound.waiting("torch.distributed all-gather (variable sizes)"):
            self._all_gather_bytes(padded.view(np.uint8), gathered.reshape(-1).view(np.uint8))
        return np.concatenate([gathered[r, :counts[r]] for r in range(self.size)])

    def allreduce_sum(self, array: np.ndarray) -> None:
        if array.size == 0:
            return
        work = array if array.flags.c_contiguous else np.ascontiguousarray(array)
        tensor = torch.from_numpy(work)
        on_device = self._to_device(tensor)
        with self._bound.waiting("torch.distributed all-reduce"):
            dist.all_reduce(on_device, op=dist.ReduceOp.SUM, group=self.group)
        if on_device is not tensor:
            tensor.copy_(on_device)
        if work is not array:
            array[...] = work

    # -- helpers ----------------------------------------------------------------------------

    def _peer(self, group_rank: int) -> int:
        """The global rank that point-to-point calls take for a rank of our group."""
        if self.group is None or self.group is dist.group.WORLD:
            return group_rank
        return dist.get_global_rank(self.group, group_rank)

    def _to_device(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor if tensor.device == self.device else tensor.to(self.device)

    def _exchange(self, send: np.ndarray | None, dest: int | None, receive: np.ndarray | None,
                  source: int | None, tag: int) -> None:
        """Posts the send and the receive together and waits for both (either may be None)."""
        operations = []
        incoming = None
        if dest is not None and send is not None:
            outgoing = self._to_device(_tensor(send))
            operations.append(dist.P2POp(dist.isend, outgoing, self._peer(dest), self.group,
                                         tag))
        if source is not None and receive is not None:
            incoming = torch.from_numpy(receive)
            target = self._to_device(incoming)
            operations.append(dist.P2POp(dist.irecv, target, self._peer(source), self.group,
                                         tag))
        if not operations:
            return
        for work in dist.batch_isend_irecv(operations):
            work.wait()
        if incoming is not None and target is not incoming:
            incoming.copy_(target)

    def _all_gather_bytes(self, local: np.ndarray, out: np.ndarray) -> None:
        """out (size * local.size bytes) = every worker's bytes, in rank order."""
        source = self._to_device(_tensor(local))
        result = torch.from_numpy(out)
        target = self._to_device(result)
        gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
        gather(target, source, group=self.group)
        if target is not result:
            result.copy_(target)


def _bytes(array: np.ndarray) -> np.ndarray:
    """A C-contiguous array's memory as a flat uint8 view (never a copy)."""
    if not array.flags.c_contiguous:
        raise ValueError("sendrecv buffers must be C-contiguous")
    return array.reshape(-1).view(np.uint8)


def _tensor(array: np.ndarray) -> torch.Tensor:
    """The array as a tensor sharing its memory (a copy if it is read-only: torch has no
    read-only tensors)."""
    return torch.from_numpy(array if array.flags.writeable else array.copy())


_default: TorchDistributedTransport | None = None


def default_transport() -> TorchDistributedTransport:
    """One TorchDistributedTransport over the default process group per process."""
    global _default
    if _default is None:
        _default = TorchDistributedTransport()
    return _default


def backend_config(group: Any = None) -> dict[str, str]:
    """The group's backend for each device type, e.g. {"cuda": "nccl"} for NCCL, {"cpu": "gloo",
    "cuda": "gloo"} for Gloo, {"cpu": "gloo", "cuda": "nccl"} for `init_process_group()` without
    a backend on a GPU machine (torch's `get_backend_config`; a plain backend name where it is
    missing)."""
    get = getattr(dist, "get_backend_config", None)
    text = str(get(group) if get is not None else dist.get_backend(group))
    if ":" not in text:
        return {"cuda": text} if text == "nccl" else {"cpu": text}
    return dict(part.split(":", 1) for part in text.split(","))


def group_devices(config: dict[str, str]) -> tuple[torch.device, torch.device]:
    """(where host messages travel, where the tensor operations take tensors) for a group of
    this backend config: tensors stay on the current GPU where NCCL serves CUDA tensors (the
    device reduction then needs no host copy); host bytes travel as CPU tensors where the group
    has a CPU backend, else through that GPU (NCCL alone takes no CPU tensor)."""
    cpu = torch.device("cpu")
    if config.get("cuda") != "nccl":
        return cpu, cpu
    gpu = torch.device("cuda", torch.cuda.current_device())
    return (cpu if "cpu" in config else gpu), gpu


def end_process_group() -> None:
    """The normal end of a torch.distributed program, on every rank, after its training
    function has returned (its DDP models and hook states out of scope): frees what still holds
    the default group in reference cycles while the interpreter is whole, waits for every rank
    (none takes its Gloo pairs down while a peer still talks on them), destroys the group and
    frees what it left. A Gloo group whose last reference dies during the interpreter's exit can
    abort the process ("terminate called without an active exception") after the program has
    succeeded."""
    global _default
    _default = None
    gc.collect()
    dist.barrier()
    dist.destroy_process_group()
    gc.collect()
