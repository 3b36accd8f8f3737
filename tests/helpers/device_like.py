"""CPU tensors that refuse what a CUDA tensor refuses, for testing the torch-state path without a
GPU.

The step's state may live on a GPU (`gtopk_hvd.backend.TorchBackend`). Code outside the kernel
layer that treats a torch tensor as numpy (np.asarray, .numpy(), assigning a numpy scalar, a
host copy that is really a view) works on CPU tensors and fails on CUDA ones, so CPU tests miss
it. Inside `device_like_cpu()`, the state's tensors are `DeviceLikeTensor`s, and so is every
tensor computed from them (torch keeps a subclass through its operations):

- `.numpy()` and `np.asarray(t)` raise TypeError, as for a CUDA tensor, except when called from
  the kernel layer (`gtopk_hvd.ops` and `gtopk_hvd._arrays`), whose CPU side legitimately reads
  CPU tensors as numpy, as its CUDA side launches kernels;
- `.cpu()` returns a copy, a plain CPU tensor, as it does for a CUDA tensor: a "host copy"
  is never a view of the state;
- torch itself already refuses numpy scalars and arrays in `t[...] = value` on every device.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import torch

from gtopk_hvd.backend import TorchBackend

KERNEL_LAYER = ("gtopk_hvd.ops", "gtopk_hvd._arrays")


def in_kernel_layer(module: str) -> bool:
    """Whether a module is the kernel layer: `gtopk_hvd._arrays`, or `gtopk_hvd.ops` or one of its
    modules."""
    return module in KERNEL_LAYER or module.startswith("gtopk_hvd.ops.")


def _called_from_kernel_layer() -> bool:
    frame = sys._getframe(2)
    while frame is not None:
        if in_kernel_layer(frame.f_globals.get("__name__", "")):
            return True
        frame = frame.f_back
    return False


class DeviceLikeTensor(torch.Tensor):
    """A CPU tensor with a CUDA tensor's refusals (module docstring)."""

    def numpy(self, *args: Any, **kwargs: Any) -> Any:
        if not _called_from_kernel_layer():
            raise TypeError("can't convert a device tensor to numpy (DeviceLikeTensor: a CUDA "
                            "tensor refuses this; use Tensor.cpu() first)")
        return self.as_subclass(torch.Tensor).numpy(*args, **kwargs)

    def __array__(self, *args: Any, **kwargs: Any) -> Any:
        if not _called_from_kernel_layer():
            raise TypeError("can't convert a device tensor to numpy (DeviceLikeTensor: a CUDA "
                            "tensor refuses np.asarray)")
        return self.as_subclass(torch.Tensor).numpy().__array__(*args, **kwargs)

    def cpu(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        return self.as_subclass(torch.Tensor).clone()


def device_like(tensor: torch.Tensor) -> DeviceLikeTensor:
    """A CPU tensor as a DeviceLikeTensor (the same memory)."""
    return tensor.as_subclass(DeviceLikeTensor)


@contextmanager
def device_like_cpu() -> Iterator[None]:
    """While open, every TorchBackend makes DeviceLikeTensors: the step's residual, velocity
    and every array it brings from the host."""
    patch = pytest.MonkeyPatch()
    zeros, from_host = TorchBackend.zeros, TorchBackend.from_host
    patch.setattr(TorchBackend, "zeros", lambda self, n: device_like(zeros(self, n)))
    patch.setattr(TorchBackend, "from_host", lambda self, x: device_like(from_host(self, x)))
    try:
        yield
    finally:
        patch.undo()


@pytest.fixture(params=["host", "device-like"])
def optimizer_state_on(request: pytest.FixtureRequest,
                       monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """The torch DistributedOptimizer's step state: host (numpy views of the CPU buffers) or
    device-like (the path of a GPU, torch state, on CPU tensors that refuse numpy)."""
    if request.param == "host":
        yield request.param
        return
    from gtopk_hvd.torch import optimizer as optimizer_module

    monkeypatch.setattr(optimizer_module, "_step_device", lambda device: device)
    monkeypatch.setattr(optimizer_module, "_step_array",
                        lambda buffer, step_device: device_like(buffer))
    with device_like_cpu():
        yield request.param
