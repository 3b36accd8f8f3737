"""The sparse step's gTop-k reduction (registered as "gtopk"): one reducer per k, on the host
(`gtopk_hvd.reductions.gtopk`) or, for sets held as tensors where the transport sends tensors
from, on that device (`gtopk_hvd.reductions.gtopk_device`)."""

from __future__ import annotations

from typing import Any

from gtopk_hvd._arrays import framework_of
from gtopk_hvd.reductions.base import REDUCTIONS, Reduction
from gtopk_hvd.reductions.gtopk import GTopkReducer
from gtopk_hvd.reductions.gtopk_device import DeviceGTopkReducer
from gtopk_hvd.reductions.result import SparseResult
from gtopk_hvd.transports import Transport


def gtopk_rounds(workers: int) -> int:
    """Message rounds of gTop-k's recursive doubling, with fold-in/fold-out when P != 2^n."""
    if workers <= 1:
        return 0
    below = 1 << (workers.bit_length() - 1)
    return below.bit_length() - 1 + (2 if below != workers else 0)


@REDUCTIONS.register("gtopk")
class GTopkReduction(Reduction):
    """The sparse step's gTop-k: one GTopkReducer per k (the warm-up uses a few, then one), or
    per k a `DeviceGTopkReducer` for sets held as tensors."""

    takes_tensors = True

    @classmethod
    def wire(cls, workers: int, k: int, entry_bytes: int) -> tuple[float, float]:
        """One set of k entries a round, R = gtopk_rounds(P) rounds."""
        rounds = gtopk_rounds(workers)
        return float(rounds), float(rounds * entry_bytes * k)

    def __init__(self, transport: Transport, index_dtype: Any, wire_dtype: str) -> None:
        super().__init__(transport, index_dtype, wire_dtype)
        self._reducers: dict[tuple[int, bool], GTopkReducer] = {}

    def reduce(self, indices: Any, values: Any, k: int) -> SparseResult:
        on_device = framework_of(values) == "torch"
        reducer = self._reducers.get((k, on_device))
        if reducer is None:
            if on_device:
                reducer = DeviceGTopkReducer(k, self.index_dtype, self.wire_dtype,
                                             self.transport, values.device)
            else:
                reducer = GTopkReducer(k, self.index_dtype, self.wire_dtype, self.transport)
            self._reducers[(k, on_device)] = reducer
        return reducer.allreduce(indices, values)
