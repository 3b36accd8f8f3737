"""Non-finite checks and skip flags: whether a tensor holds a NaN / Inf read once
(`all_finite`), or marked into a flag on its device (`mark_nonfinite`), and the reads of flags and
small values to the host (`read_flag`, `LaterFlag`, `read_to_host`)."""

from __future__ import annotations

from typing import Any

import numpy as np

from gtopk_hvd import _C
from gtopk_hvd._arrays import (
    as_numpy,
    dtype_name,
    framework_of,
    is_cuda,
)
from gtopk_hvd.ops._support import (
    _check_flag,
    _contiguous,
    _cuda_check,
    _on_device,
    _stream,
    _value_type,
    _workspace,
    cuda_built,
)
from gtopk_hvd.ops.threshold import _max_key


def read_to_host(tensors: Any) -> tuple[np.ndarray, ...]:
    """The values of several small tensors of one device on the host, as numpy arrays of their
    shapes and dtypes (integer, float32 or float64), with one wait for them all: on a GPU each
    is copied into pinned memory without a wait, then the current stream is waited for once,
    however many tensors (a bucket's counts and sums, read with the other buckets'). numpy
    arrays are returned as they are."""
    tensors = list(tensors)
    on_gpu = [t for t in tensors if is_cuda(t)]
    if not on_gpu:
        return tuple(t if isinstance(t, np.ndarray) else t.detach().cpu().numpy().copy()
                     for t in tensors)
    import torch

    hosts = [t if isinstance(t, np.ndarray) else
             torch.empty(tuple(t.shape), dtype=t.dtype, pin_memory=True) for t in tensors]
    for host, tensor in zip(hosts, tensors):
        if host is not tensor:
            host.copy_(tensor.detach(), non_blocking=True)
    torch.cuda.current_stream(on_gpu[0].device).synchronize()
    return tuple(host if isinstance(host, np.ndarray) else host.numpy() for host in hosts)


_FIRST_NONFINITE_KEY = {"float32": 0x7F800000, "float64": 0x7FF0000000000000,
                        "float16": 0x7C00, "bfloat16": 0x7F80}
"""The magnitude key of +Inf of each value type; NaN's keys are above it
(gtopk/magnitude_order.h)."""


def all_finite(x: Any) -> bool:
    """Whether x holds no NaN and no +-Inf, i.e. its largest magnitude key is below +Inf's.

    One contract on numpy arrays and torch tensors, CPU and CUDA: for a contiguous x of
    float32 / float64 / float16 / bfloat16, one read of x and no temporary of its size (host:
    `_C.read_pass`, vectorised, for float32 / float64, `_C.max_key` for the 16-bit types; CUDA:
    `_C.cuda_max_key`, cub::DeviceReduce over the keys). Otherwise (strided, other dtypes, CUDA
    tensors of a build without the CUDA kernels): isfinite(x).all() of x's framework, which
    makes temporaries of x's size."""
    name = dtype_name(x.dtype)
    if name in _FIRST_NONFINITE_KEY and _contiguous(x) and (cuda_built or not is_cuda(x)):
        view = x.reshape(-1) if is_cuda(x) else as_numpy(x, "x")
        n = x.numel() if is_cuda(x) else view.array.size
        return _max_key(view, 0, n) < _FIRST_NONFINITE_KEY[name]
    if framework_of(x) == "torch":
        import torch

        return bool(torch.isfinite(x).all())
    return bool(np.isfinite(np.asarray(x)).all())


def mark_nonfinite(x: Any, flag: Any) -> None:
    """flag[0] := 1 if x holds a NaN or +-Inf; flag left as it is otherwise (so one flag
    gathers the answer for several tensors, read once: `all_finite` without the host read).

    flag: one int32 value where x is: a torch tensor on x's CUDA device, or a numpy array / CPU
    tensor for a host x. CUDA (contiguous float32 / float64 / float16 / bfloat16, built
    kernels): `_C.cuda_mark_nonfinite`, the read of `all_finite` (cub::DeviceReduce over the
    keys, no temporary of x's size) then a one-thread compare writing the flag, both enqueued
    on the current stream: no copy to the host, no wait. Other CUDA tensors: isfinite(x).all()
    on the device (temporaries of x's size, no wait). Host x: `all_finite` (its read)."""
    if not is_cuda(x):
        if not all_finite(x):
            flag[:] = 1  # a slice: a fill where the flag lives (flag[0] = 1 copies from the host)
        return
    import torch

    _check_flag(flag, x, "flag")
    name = dtype_name(x.dtype)
    if not (cuda_built and name in _FIRST_NONFINITE_KEY and x.is_contiguous()):
        flag.copy_(torch.maximum(flag, (~torch.isfinite(x).all()).to(torch.int32).reshape(1)))
        return
    _cuda_check(flag, "flag", x.device)
    with _on_device(x.device):
        value_type, n = _value_type(x.dtype), x.numel()
        workspace = _workspace(_C.cuda_max_key_workspace_bytes(value_type, n), x.device)
        _C.cuda_mark_nonfinite(value_type, x.data_ptr(), n, flag.data_ptr(), _stream(x.device),
                               workspace.data_ptr(), workspace.numel())


def nonfinite_flag(like: Any) -> Any:
    """A cleared flag for `mark_nonfinite` where `like` lives: one int32 zero (a numpy array
    for a numpy `like`, else a torch tensor of like's kind on its device)."""
    if framework_of(like) != "torch":
        return np.zeros(1, dtype=np.int32)
    import torch

    return like.new_zeros(1, dtype=torch.int32)


def flag_set(flag: Any) -> bool:
    """Whether a skip / non-finite flag (one int32: numpy, or a torch tensor) is nonzero, read on
    the host (a CUDA flag waits for its stream: `read_flag`)."""
    return read_flag(flag) != 0


def skipped_here(skip: Any, gradient: Any, clear_gradient: bool) -> bool:
    """Whether the skip flag is set, read on the host, for the fused kernels' host side: a
    skipped step still clears the gradient if asked (gradient[:] = 0), as the kernels do."""
    if not flag_set(skip):
        return False
    if clear_gradient and gradient is not None:
        gradient[:] = 0
    return True


class LaterFlag:
    """A flag's value brought to the host without waiting now: on a GPU its copy into pinned
    memory is enqueued where the flag is written, with an event after it; `value()` waits for
    that event only (long done when read an iteration later). A host flag is read at `value()`
    (nothing writes a flag once it is handed over)."""

    __slots__ = ("_event", "_host", "_value")

    def __init__(self, flag: Any) -> None:
        self._value: int | None = None
        self._host, self._event = flag, None
        if not is_cuda(flag):
            return
        import torch

        self._host = torch.empty(1, dtype=torch.int32, pin_memory=True)
        self._host.copy_(flag.reshape(1), non_blocking=True)
        self._event = torch.cuda.Event()
        self._event.record(torch.cuda.current_stream(flag.device))

    def value(self) -> int:
        """The flag's value (waits for its copy the first time, if that is not done yet)."""
        if self._value is None:
            if self._event is not None:
                self._event.synchronize()
            self._value = int(self._host.reshape(-1)[0])
            self._host = self._event = None
        return self._value

    @property
    def read(self) -> bool:
        """Whether `value()` has brought the flag to the host yet."""
        return self._value is not None


def read_flag(flag: Any) -> int:
    """A `mark_nonfinite` flag's value on the host: the one host read of the flags' scheme.
    CUDA: copied into pinned memory, then one wait for the current stream (which the marks
    were enqueued on); host: read as it is."""
    if not is_cuda(flag):
        return int(flag[0])
    import torch

    host = torch.empty(1, dtype=torch.int32, pin_memory=True)
    host.copy_(flag.reshape(1), non_blocking=True)
    torch.cuda.current_stream(flag.device).synchronize()
    return int(host[0])
