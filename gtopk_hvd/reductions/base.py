"""The `Reduction` interface and its registry (`REDUCTIONS`).

A reduction turns every worker's local set of (index, value) entries into one global set,
identical on every worker, with values summed over the workers that sent each index:

    (I, V) = reduce((I_p, V_p) for p in workers),  survived_p = [i in I for i in I_p]

A new one is a subclass in its own module, registered with `@REDUCTIONS.register(name)` and
imported by `gtopk_hvd.reductions`; `SparseCompression(reduction=name)` then selects it.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, ClassVar

import numpy as np

from gtopk_hvd.reductions.result import SparseResult
from gtopk_hvd.registry import Registry
from gtopk_hvd.transports import Transport
from gtopk_hvd.wire import WIRE_VALUE_TYPES


class Reduction(ABC):
    """One reduction's state for one sparse step (a transport, an index dtype, a wire dtype)."""

    needs_shared_indices: ClassVar[bool] = False
    """True when correct only if every worker selects the same indices (no indices are sent)."""
    wire_dtypes: ClassVar[tuple[str, ...]] = WIRE_VALUE_TYPES
    """The value dtypes it can send."""

    def __init__(self, transport: Transport, index_dtype: Any, wire_dtype: str) -> None:
        self.transport = transport
        self.index_dtype = np.dtype(index_dtype)
        self.wire_dtype = wire_dtype

    @classmethod
    def wire(cls, workers: int, k: int, entry_bytes: int) -> tuple[float, float]:
        """(messages, bytes) one worker sends to reduce sets of k entries of `entry_bytes` each
        (an index and a value) over P = workers, for the planner and `bench schemes`."""
        raise NotImplementedError(f"reduction {cls.__name__} states no wire cost")

    @abstractmethod
    def reduce(self, indices: np.ndarray, values: np.ndarray, k: int) -> SparseResult:
        """The global set of this worker's index-sorted local set (at most k entries): host
        numpy arrays; or, where `takes_tensors_on` the sets' device, torch tensors there with
        exactly k entries, and then the result (survived included) is tensors there too."""

    takes_tensors: ClassVar[bool] = False
    """True when `reduce` can also take k-entry sets as torch tensors (`takes_tensors_on`)."""

    def takes_tensors_on(self, device: Any) -> bool:
        """Whether `reduce` takes k-entry sets as torch tensors on `device`, sending and merging
        them there (no host copy): where the reduction can (`takes_tensors`) and the transport
        sends tensors from that device, or anywhere for one worker (no message is sent)."""
        return self.takes_tensors and (self.transport.size == 1
                                       or self.transport.takes_tensors_on(device))


REDUCTIONS: Registry[type[Reduction]] = Registry("reduction")
