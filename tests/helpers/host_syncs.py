"""Counts the host synchronisations a CUDA state would make, on DeviceLikeTensors (CPU tensors
with a CUDA tensor's refusals: tests/helpers/device_like.py), without a GPU.

On a CUDA tensor these operations wait for the device: a value read on the host (`item`,
`tolist`, `bool(t)`, `int(t)`, `float(t)`, `.cpu()`), and the operations whose output size
depends on the data (`nonzero`, `argwhere`, `masked_select`, `unique`, boolean-mask indexing,
`repeat_interleave` without `output_size`); and a Python number put into a tensor at tensor
indices or at one integer index (`t[indices] = 0.0`, `t[0] = 1`): torch makes the number a
host tensor and copies it to t's device (index_put_, or a copy into one element), and on a GPU
that copy waits for the stream (a slice, `t[:] = 0.0`, is a fill on the device instead).
Inside `count_host_syncs()`, every such call on a DeviceLikeTensor made outside the kernel
layer (`gtopk_hvd.ops`, `gtopk_hvd._arrays`) is recorded with the first gtopk_hvd frame that
made it; the copy of a host number is recorded inside the kernel layer too (its CUDA side
makes the same call). The kernel layer's own synchronisations
(a count its CUDA side brings back) are not seen by `count_host_syncs`: the GPU check counts
those (scripts/gpu/gpu_e2e.py --syncs). `count_kernel_host_reads` counts them by the contract's
shape instead: a public `gtopk_hvd.ops` function called (not from inside the kernel layer) with
a tensor (or a list of tensors) that returns a host value (a Python bool, int or float, a numpy
array or scalar, or a tuple holding one) must have brought it from the device, so it waited.
On a GPU, `torch_sync_warnings` lists what torch itself sees; the sum of the two counts above
must bound it (tests/torch/test_ddp_hook_cuda.py checks that, scheme by scheme, so that a wait this
model misses shows up on the next GPU).
"""

from __future__ import annotations

import functools
import sys
import threading
import warnings
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import pytest
import torch

from gtopk_hvd import ops
from helpers.device_like import DeviceLikeTensor, in_kernel_layer

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


def _where(kernel_layer_too: bool = False) -> str | None:
    """The first gtopk_hvd frame above this call, or None when the kernel layer made it (unless
    kernel_layer_too; every frame is looked at: a C-level dunder such as `int(t)` reaches the
    torch function handler through fewer Python frames than a method call)."""
    frame = sys._getframe(1)
    found = None
    while frame is not None:
        name = frame.f_globals.get("__name__", "")
        if in_kernel_layer(name) and not kernel_layer_too:
            return None
        if found is None and name.startswith("gtopk_hvd"):
            found = f"{name}.{frame.f_code.co_name}:{frame.f_lineno}"
        frame = frame.f_back
    return found or "outside gtopk_hvd"


def _copies_a_host_number(name: str, args: tuple) -> bool:
    """t[index] = a Python number, index holding a tensor or being one integer (module
    docstring)."""
    if name != "__setitem__" or len(args) < 3 or not isinstance(args[2], (int, float)):
        return False
    if isinstance(args[1], int):
        return True
    index = args[1] if isinstance(args[1], tuple) else (args[1],)
    return any(isinstance(i, torch.Tensor) for i in index)


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
        where = None
        if _syncs(name, args, kwargs):
            where = _where()
        elif _copies_a_host_number(name, args):
            where = _where(kernel_layer_too=True)
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
def torch_sync_warnings() -> Iterator[list[str]]:
    """On a GPU, while open: the first line of each host synchronisation that torch itself
    reports (`torch.cuda.set_sync_debug_mode("warn")`: a value read on the host, `.cpu()`, an
    operation whose output size depends on the data, a stream's `synchronize()`, a blocking
    copy). Waits made inside gtopk_hvd's extension are not torch's and are not seen."""
    lines: list[str] = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            yield lines
        finally:
            torch.cuda.set_sync_debug_mode("default")
    lines.extend(str(w.message).splitlines()[0] for w in caught
                 if "synchroniz" in str(w.message).lower())


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


def _host_value(result: Any) -> bool:
    if isinstance(result, tuple):
        return any(_host_value(item) for item in result)
    return isinstance(result, (bool, int, float, np.ndarray, np.generic))


def _holds_a_tensor(value: Any) -> bool:
    """A tensor, or a list or tuple holding one (read_to_host's). Any tensor: in the kernel
    layer's CPU branches a tensor made from a device state's values (e.g. a histogram made
    with numpy, then `torch.from_numpy(...).to(device)`) is a plain tensor, where on a GPU it
    lies on the device."""
    if isinstance(value, (list, tuple)):
        return any(_holds_a_tensor(item) for item in value)
    return isinstance(value, torch.Tensor)



@contextmanager
def count_kernel_host_reads() -> Iterator[HostSyncs]:
    """While open, the kernel layer's calls that bring a value of a DeviceLikeTensor to the
    host (module docstring), by (function, "gtopk_hvd.ops"); calls made from inside the kernel
    layer are part of the outer call and not counted again."""
    counter = HostSyncs()
    depth = threading.local()
    patch = pytest.MonkeyPatch()

    def counted(name: str, function: Any) -> Any:
        @functools.wraps(function)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            outer = getattr(depth, "n", 0) == 0
            depth.n = getattr(depth, "n", 0) + 1
            try:
                result = function(*args, **kwargs)
            finally:
                depth.n -= 1
            if outer and _holds_a_tensor((*args, *kwargs.values())) and _host_value(result):
                counter[(name, "gtopk_hvd.ops")] += 1
            return result
        return wrapper

    for name in ops.__all__:
        function = getattr(ops, name)
        if callable(function) and not isinstance(function, type):
            patch.setattr(ops, name, counted(name, function))
    try:
        yield counter
    finally:
        patch.undo()
