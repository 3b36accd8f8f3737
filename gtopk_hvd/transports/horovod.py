"""The Transport over Horovod's own collectives: works wherever Horovod does (Gloo, MPI, NCCL).

    a phase of a schedule (sendrecv)   hvd.alltoall with splits: only the partner gets bytes
    allgather / allgatherv             hvd.allgather (first dimensions may differ)
    allreduce_sum                      hvd.allreduce(op=hvd.Sum), in place for torch

It runs on the Horovod module the adapter uses (horovod.torch or horovod.tensorflow, after
`hvd.init()`), so its workers are Horovod's by construction, and needs no MPI world: this is the
transport under `horovodrun --gloo`, chosen automatically there (`gtopk_hvd.transports`).

An alltoall is collective: every worker joins every phase, an idle one with all splits zero
(the Transport contract). Each operation has a fixed name per phase, the same on every worker,
so Horovod's response cache reuses its negotiation from step to step.

The buffers are the reductions' host numpy arrays: torch tensors share their memory (no copy),
TensorFlow copies them into and out of tensors. With Horovod built with NCCL the collectives of
GPU tensors run on NCCL; the k-entry sets the reductions pass are host buffers, so here they go
through Horovod's CPU path (Gloo or MPI) whatever the model's device.
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

from gtopk_hvd.transports.base import Transport
from gtopk_hvd.transports.wait_bound import WaitBound

HOROVOD_MODULES = ("horovod.torch", "horovod.tensorflow")


def initialized_horovod() -> Any:
    """The imported Horovod module (torch first, then TensorFlow) on which hvd.init() ran."""
    for name in HOROVOD_MODULES:
        module = sys.modules.get(name)
        if module is not None and module.is_initialized():
            return module
    raise RuntimeError("the Horovod transport needs Horovod initialised first: call hvd.init() "
                       "(horovod.torch or horovod.tensorflow) before building the optimizer")


class _TorchTensors:
    """numpy <-> torch without copies."""

    def __init__(self) -> None:
        import torch

        self.torch = torch

    def tensor(self, array: np.ndarray) -> Any:
        return self.torch.from_numpy(array if array.flags.writeable else array.copy())

    def array(self, tensor: Any) -> np.ndarray:
        return tensor.numpy()

    def splits(self, counts: np.ndarray) -> Any:
        return self.torch.from_numpy(counts)


class _TensorFlowTensors:
    """numpy <-> TensorFlow eager tensors (copies)."""

    def __init__(self) -> None:
        import tensorflow as tf

        self.tf = tf

    def tensor(self, array: np.ndarray) -> Any:
        return self.tf.convert_to_tensor(array)

    def array(self, tensor: Any) -> np.ndarray:
        return tensor.numpy()

    def splits(self, counts: np.ndarray) -> Any:
        return self.tf.convert_to_tensor(counts)


class HorovodTransport(Transport):
    """Transport over the collectives of an initialised Horovod module (default: the one that
    is initialised, torch first)."""

    # Off: each wait probe would be one more negotiated operation (a whole hvd.alltoall) per
    # data exchange (`gtopk_hvd.reductions.wait_probe`; measured cost: docs/results.md).
    wait_probe_default = False

    def __init__(self, hvd: Any = None, wait_timeout_s: float | None = None) -> None:
        self.hvd = hvd if hvd is not None else initialized_horovod()
        if not self.hvd.is_initialized():
            raise RuntimeError(f"{self.hvd.__name__} is not initialised: call hvd.init() first")
        is_torch = self.hvd.__name__.startswith("horovod.torch")
        self._tensors = _TorchTensors() if is_torch else _TensorFlowTensors()
        self._in_place_allreduce = is_torch
        self.rank, self.size = self.hvd.rank(), self.hvd.size()
        self._splits = np.zeros(self.size, dtype=np.int32)
        self._bound = WaitBound(self.abort, wait_timeout_s)

    def sendrecv(self, send: np.ndarray, send_bytes: int, dest: int | None,
                 receive: np.ndarray, source: int | None, tag: int) -> int:
        self._splits[:] = 0
        if dest is not None:
            self._splits[dest] = send_bytes
        payload = send[:send_bytes if dest is not None else 0]
        with self._bound.waiting(f"Horovod alltoall of phase {tag} (to {dest}, from {source})"):
            received, _ = self.hvd.alltoall(self._tensors.tensor(payload),
                                            splits=self._tensors.splits(self._splits),
                                            name=f"gtopk_hvd.phase.{tag}")
        received = self._tensors.array(received)
        if source is None and received.size:
            raise RuntimeError(f"rank {self.rank} received {received.size} bytes in phase {tag} "
                               "where it expected none: the workers' schedules differ")
        receive[:received.size] = received
        return int(received.size)

    def allgather(self, local: np.ndarray) -> np.ndarray:
        local = np.ascontiguousarray(local)
        flat = self._allgather(local.reshape(1, -1), "allgather")
        return flat.reshape(self.size, *local.shape)

    def allgatherv(self, local: np.ndarray, counts: np.ndarray) -> np.ndarray:
        return self._allgather(np.ascontiguousarray(local), "allgatherv")

    def allreduce_sum(self, array: np.ndarray) -> None:
        name = f"gtopk_hvd.allreduce.{array.dtype}"
        with self._bound.waiting("Horovod allreduce"):
            if self._in_place_allreduce:
                self.hvd.allreduce_(self._tensors.tensor(array), op=self.hvd.Sum, name=name)
            else:
                summed = self.hvd.allreduce(self._tensors.tensor(array), op=self.hvd.Sum,
                                            name=name)
                array[...] = self._tensors.array(summed)

    def _allgather(self, local: np.ndarray, what: str) -> np.ndarray:
        name = f"gtopk_hvd.{what}.{local.dtype}"
        with self._bound.waiting(f"Horovod {what}"):
            gathered = self.hvd.allgather(self._tensors.tensor(local), name=name)
        return self._tensors.array(gathered)


_by_module: dict[str, HorovodTransport] = {}


def horovod_transport(hvd: Any = None) -> HorovodTransport:
    """One HorovodTransport per Horovod module per process, made on first use and again when
    Horovod's rank or size changed (an Elastic Horovod reset)."""
    hvd = hvd if hvd is not None else initialized_horovod()
    transport = _by_module.get(hvd.__name__)
    if transport is None or (transport.rank, transport.size) != (hvd.rank(), hvd.size()):
        # First use, or Elastic Horovod reset the workers: a transport for the new ones.
        transport = _by_module[hvd.__name__] = HorovodTransport(hvd)
    return transport
