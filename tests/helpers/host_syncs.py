"""Counts the host synchronisations a CUDA state would make, on DeviceLikeTensors (CPU tensors
with a CUDA tensor's refusals: tests/helpers/device_like.py), without a GPU.

On a CUDA tensor these operations wait for the device: a value read on the host (`item`,
`tolist`, `bool(t)`, `int(t)`, `float(t)`, `.cpu()`), and the operations whose output size
depends on the data (`nonzero`, `argwhere`, `masked_select`, `unique`, boolean-mask indexing,
`repeat_interleave` without `output_size`). Inside `count_host_syncs()`, every such call on a
DeviceLikeTensor made outside the kernel layer (`gtopk_hvd.ops`, `gtopk_hvd._arrays`) is
recorded with the first gtopk_hvd frame that made it. The kernel layer's own synchronisations
(a count its CUDA side brings back) are not seen here: the GPU check counts those
(scripts/gpu_e2e.py --syncs).
"""

from __future__ import annotations

import sys
import threading
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

from helpers.device_like import KERNEL_LAYER, DeviceLikeTensor

SYNCING = frozenset({"item", "tolist", "nonzero", "argwhere", "masked_select", "unique",
                     "unique_consecutive", "__bool__", "__int__", "__float__", "__index__",
                     "cpu"})
MASK_INDEXED = frozenset({"__getitem__", "__setitem__", "index_put_", "index_put"})


class HostSyncs(Counter):
    """(operation, where) -> calls; `total` is their sum."""

    @property
    def total(self) -> int:
        return sum(self.values())


_local = threading.local()  # each thread (a ThreadGroup worker) counts its own


def _counters() -> list[HostSyncs]:
    if not hasattr(_local, "active"):
        _local.active = []
    return _local.active


def _where() -> str | None:
    """The first gtopk_hvd frame above this call, or None when the kernel layer made it."""
    frame = sys._getframe(3)
    found = None
    while frame is not None:
        name = frame.f_globals.get("__name__", "")
        if name in KERNEL_LAYER:
            return None
        if found is None and name.startswith("gtopk_hvd"):
            found = f"{name}.{frame.f_code.co_name}:{frame.f_lineno}"
        frame = frame.f_back
    return found or "outside gtopk_hvd"


def _syncs(name: str, args: tuple, kwargs: dict) -> bool:
    if name in SYNCING:
        return True
    if name == "repeat_interleave":
        return "output_size" not in kwargs
    if name in MASK_INDEXED and len(args) > 1:
        index = args[1] if isinstance(args[1], tuple) else (args[1],)
        return any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in index)
    return False


def _torch_function(cls: type, func: Any, types: Any, args: tuple = (),
                    kwargs: dict | None = None) -> Any:
    kwargs = kwargs or {}
    if _counters():
        name = getattr(func, "__name__", "")
        if _syncs(name, args, kwargs):
            where = _where()
            if where is not None:
                for counter in _counters():
                    counter[(name, where)] += 1
    return torch.Tensor.__torch_function__.__func__(cls, func, types, args, kwargs)


DeviceLikeTensor.__torch_function__ = classmethod(_torch_function)
_plain_cpu = DeviceLikeTensor.cpu


def _counted_cpu(self: DeviceLikeTensor, *args: Any, **kwargs: Any) -> torch.Tensor:
    if _counters():
        where = _where()
        if where is not None:
            for counter in _counters():
                counter[("cpu", where)] += 1
    return _plain_cpu(self, *args, **kwargs)


DeviceLikeTensor.cpu = _counted_cpu


@contextmanager
def count_host_syncs() -> Iterator[HostSyncs]:
    """While open, the host synchronisations made outside the kernel layer on DeviceLikeTensors
    (module docstring), by (operation, where); this thread's calls only."""
    counter = HostSyncs()
    _counters().append(counter)
    try:
        yield counter
    finally:
        _counters().remove(counter)
