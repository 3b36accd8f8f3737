"""gTop-k's schedule on torch tensors where the state lives (a GPU under NCCL): no host copies.

The rounds, partners and merges of `GTopkReducer` (`gtopk_hvd.reductions.gtopk`), over
`Transport.sendrecv_tensors` instead of byte buffers: each message is two tensors on the device,
the sender's k indices and its k values in the wire dtype; each merge is `ops.merge_topk` on the
device (the CUDA merge kernel on a GPU). What survived is not marked (`survived` is None): the
caller restores the rest with `ops.restore_unselected`, one launch. The result is the host
reducer's bit for bit: the same merges in the same order, the same rounding to the wire dtype
(round to nearest even, in torch as in `gtopk_hvd.wire`).

It needs every set to have exactly k entries, so that both sides of every message know its size
without a length message (a length read back would be a host synchronisation): top-k and
random-k selections have k entries, and a merge of two k-sets keeps k. The sets are taken as
the selection made them (index-sorted, unique); unlike the host reducer it does not read them to
check, which would synchronise with the device.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from gtopk_hvd import ops
from gtopk_hvd.reductions.gtopk import TAG_ROUND, GTopkReducer
from gtopk_hvd.reductions.result import ReductionStats, SparseResult
from gtopk_hvd.transports import Transport

Pair = tuple[Any, Any]


class DeviceGTopkReducer(GTopkReducer):
    """gTop-k all-reduce of k-entry sets held as torch tensors on `transport.tensor_device`.

    Buffers (k entries each: two merge outputs the rounds alternate between, one received
    message) are allocated once on the device and reused; the global set returned is a view of
    one of them, valid until the next call."""

    def __init__(self, k: int, index_dtype: Any, wire_dtype: str, transport: Transport,
                 device: Any) -> None:
        import torch

        super().__init__(k, index_dtype, wire_dtype, transport)
        self._torch = torch
        index = getattr(torch, np.dtype(index_dtype).name)
        self._wire_dtype = getattr(torch, wire_dtype)
        self._merged_device = [(torch.empty(self.k, dtype=index, device=device),
                                torch.empty(self.k, dtype=torch.float32, device=device))
                               for _ in range(2)]
        self._incoming = (torch.empty(self.k, dtype=index, device=device),
                          torch.empty(self.k, dtype=self._wire_dtype, device=device))

    def allreduce(self, indices: Any, values: Any) -> SparseResult:
        """The global top-k set of every worker's local k-entry set (module docstring)."""
        self._check_shapes(indices, values)
        stats = ReductionStats()
        if not self._agreed:
            self._agree_on_parameters()
        current = (indices, self._round(values))
        if self.transport.size > 1:
            current = self._schedule(current, stats)
        global_indices, global_values = current
        return SparseResult(global_indices, global_values, None, stats)

    # -- the schedule's steps on the device ------------------------------------------------

    def _round(self, values: Any) -> Any:
        """float32 values as they arrive after a trip over the wire."""
        if self._wire_dtype == self._torch.float32:
            return values
        return values.to(self._wire_dtype).to(self._torch.float32)

    def _merge(self, mine: Pair, theirs: Pair, stats: ReductionStats) -> Pair:
        start = time.perf_counter()
        out = self._merged_device[0]
        if mine[0].data_ptr() == out[0].data_ptr() or mine[1].data_ptr() == out[1].data_ptr():
            out = self._merged_device[1]
        indices, values = ops.merge_topk(mine[0], mine[1], theirs[0], theirs[1], self.k, out=out)
        merged = indices, self._round(values)
        stats.merge_seconds += time.perf_counter() - start
        return merged

    def _message(self, current: Pair) -> list[Any]:
        return [current[0], current[1].to(self._wire_dtype)]

    def _arrived(self) -> Pair:
        indices, values = self._incoming
        return indices, values.to(self._torch.float32)

    def _exchange(self, current: Pair, partner: int, stats: ReductionStats) -> Pair:
        wait = self._probe(partner, partner, TAG_ROUND)
        start = time.perf_counter()
        self.transport.sendrecv_tensors(self._message(current), partner, list(self._incoming),
                                        partner, TAG_ROUND)
        stats.add_exchange(wait, time.perf_counter() - start)
        stats.bytes_sent += self._bytes
        stats.bytes_received += self._bytes
        stats.messages_sent += 1
        return self._arrived()  # merged before the next message

    def _send_set(self, current: Pair, dest: int, tag: int, stats: ReductionStats) -> None:
        wait = self._probe(dest, dest, tag)
        start = time.perf_counter()
        self.transport.sendrecv_tensors(self._message(current), dest, [], None, tag)
        stats.add_exchange(wait, time.perf_counter() - start)
        stats.bytes_sent += self._bytes
        stats.messages_sent += 1

    def _receive_set(self, source: int, tag: int, stats: ReductionStats) -> Pair:
        wait = self._probe(source, source, tag)
        start = time.perf_counter()
        self.transport.sendrecv_tensors([], None, list(self._incoming), source, tag)
        stats.add_exchange(wait, time.perf_counter() - start)
        stats.bytes_received += self._bytes
        return self._arrived()

    def _idle(self, tag: int, stats: ReductionStats) -> None:
        """A phase without a partner: nothing (the tensor transports are point to point)."""
        stats.add_exchange(self._probe(None, None, tag), 0.0)

    @property
    def _bytes(self) -> int:
        return self.k * self.wire.entry_bytes

    def _check_shapes(self, indices: Any, values: Any) -> None:
        """What can be checked without reading the sets: one dimension, k entries each, the
        index dtype. A wrong set is a bug in the caller: the job is aborted with the reason
        (raising on one worker would leave the others waiting)."""
        problem = None
        if indices.dim() != 1 or values.dim() != 1 or indices.numel() != values.numel():
            problem = "indices and values must be 1-D and of the same length"
        elif indices.numel() != self.k:
            problem = (f"the local set has {indices.numel()} entries; the device path needs "
                       f"k={self.k}")
        elif str(indices.dtype) != f"torch.{self.wire.index_dtype.name}":
            problem = f"indices must be {self.wire.index_dtype}, got {indices.dtype}"
        elif values.dtype != self._torch.float32:
            problem = f"values must be float32, got {values.dtype}"
        if problem is not None:
            if self.transport.size == 1:
                raise ValueError(problem)
            self.transport.abort(f"gtopk_allreduce (device): {problem}")
