"""Where the step's arrays live, decided once when the step is built.

The residual, the velocity and the gradients a step reads are either numpy arrays on the host
or torch tensors on one device (a GPU: then selection and residual updates run there, and only
the k-entry sets cross to the host for the reduction). An `ArrayBackend` answers every
"numpy or torch?" question of the step's data path with the one answer chosen at build time:
make zeros, bring a local set to the host for the transport, take a host array back, join the
parts of a per-bucket selection, cast indices, index its arrays with host indices, assign a
checkpoint's values.

The backends import no framework at module level: `TorchBackend` imports torch when made.
"""

from __future__ import annotations

from typing import Any

import numpy as np


class ArrayBackend:
    """numpy on the host (the default)."""

    name = "numpy"

    def zeros(self, n: int) -> Any:
        """n float32 zeros."""
        return np.zeros(n, dtype=np.float32)

    def to_host(self, x: Any) -> np.ndarray:
        """x as a host numpy array (a view where it already is one)."""
        return x

    def from_host(self, x: np.ndarray) -> Any:
        """A host array as this backend's array."""
        return x

    def concatenate(self, parts: list[Any]) -> Any:
        return np.concatenate(parts)

    def index(self, indices: np.ndarray) -> Any:
        """Host indices as what indexes this backend's arrays (here: the same array)."""
        return indices

    def as_index_dtype(self, indices: Any, dtype: np.dtype) -> Any:
        """indices as the integer dtype `dtype` (no copy where they already are)."""
        return indices.astype(dtype, copy=False)

    def assign(self, target: Any, values: np.ndarray) -> None:
        """target[:] = values (host float32)."""
        target[:] = values


class TorchBackend(ArrayBackend):
    """torch tensors on `device` (the adapters run a CPU step on numpy views of their buffers,
    so they choose this backend for GPUs)."""

    name = "torch"

    def __init__(self, device: Any) -> None:
        import torch

        self._torch = torch
        self.device = torch.device(device)

    def zeros(self, n: int) -> Any:
        return self._torch.zeros(n, dtype=self._torch.float32, device=self.device)

    def to_host(self, x: Any) -> np.ndarray:
        return x.detach().cpu().numpy()

    def from_host(self, x: np.ndarray) -> Any:
        return self._torch.from_numpy(x).to(self.device)

    def concatenate(self, parts: list[Any]) -> Any:
        return self._torch.cat(parts)

    def index(self, indices: np.ndarray) -> Any:
        return self.from_host(indices.astype(np.int64))

    def as_index_dtype(self, indices: Any, dtype: np.dtype) -> Any:
        return indices.to(getattr(self._torch, np.dtype(dtype).name))

    def assign(self, target: Any, values: np.ndarray) -> None:
        target.copy_(self._torch.from_numpy(values))


NUMPY = ArrayBackend()


def backend_for(device: Any = None) -> ArrayBackend:
    """None: numpy on the host; a torch device (e.g. "cuda:0", or "cpu" for CPU tensors):
    torch tensors there."""
    if device is None:
        return NUMPY
    return TorchBackend(device)
