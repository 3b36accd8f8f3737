"""Zero-copy views between the caller's arrays (numpy, torch, TensorFlow) and numpy.

The CPU kernels take contiguous 1-D numpy arrays. `as_numpy` gives one that shares memory with
the caller's array or tensor; `like` turns a kernel result back into the caller's type.
16-bit floats without a numpy dtype (bfloat16) travel as uint16 bit patterns.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass
from typing import Any

import numpy as np

VALUE_TYPES = ("float32", "float64", "float16", "bfloat16")


@dataclass(frozen=True)
class NumpyView:
    """A numpy array sharing memory with `source`, and the name of its value type."""

    array: np.ndarray
    value_type: str  # dtype name: float32, float64, float16, bfloat16, int32 or int64
    framework: str  # "numpy", "torch" or "tensorflow"
    source: Any


def framework_of(x: Any) -> str:
    """"numpy", "torch" or "tensorflow", by the module of x's class or of a class it derives
    from (a subclass of torch.Tensor is torch's), without importing either framework."""
    if isinstance(x, np.ndarray):
        return "numpy"
    for cls in type(x).__mro__:
        module = cls.__module__
        if module.startswith("torch"):
            return "torch"
        if module.startswith("tensorflow") or module.startswith("tf_keras"):
            return "tensorflow"
    raise TypeError(f"expected a numpy array, torch tensor or TensorFlow tensor, got {type(x)}")


def is_cuda(x: Any) -> bool:
    return framework_of(x) == "torch" and x.is_cuda


def dtype_name(dtype: Any) -> str:
    """numpy / torch / TF dtype -> canonical name ("float32", "bfloat16", "int64", ...)."""
    name = getattr(dtype, "name", None) or str(dtype)
    name = name.replace("torch.", "")
    return {"half": "float16", "float": "float32", "double": "float64"}.get(name, name)


def as_numpy(x: Any, what: str, *, values: bool = True, writeable: bool = False) -> NumpyView:
    """A contiguous 1-D numpy view of x (any shape: it is flattened without a copy)."""
    framework = framework_of(x)
    if framework == "torch":
        if x.is_cuda:
            raise ValueError(f"{what} is on a GPU; use CUDA tensors for every argument")
        if not x.is_contiguous():
            raise ValueError(f"{what} must be contiguous; call .contiguous() first")
        tensor = x.detach().reshape(-1)
        name = dtype_name(tensor.dtype)
        if name == "bfloat16":
            array = tensor.view(__import__("torch").int16).numpy().view(np.uint16)
        else:
            array = tensor.numpy()
    elif framework == "tensorflow":
        if writeable:
            raise TypeError(f"{what} must be mutable (a numpy array or torch tensor), "
                            "TensorFlow tensors are immutable")
        if "GPU" in getattr(x, "device", ""):
            raise ValueError(f"{what} is on a GPU; the CUDA kernels take torch tensors only")
        array = np.asarray(x.numpy()).reshape(-1)
        name = array.dtype.name
        if name == "bfloat16":
            array = array.view(np.uint16)
    else:
        if not x.flags.c_contiguous:
            raise ValueError(f"{what} must be contiguous; use np.ascontiguousarray first")
        array = x.reshape(-1)
        name = x.dtype.name
        if name == "bfloat16":
            array = array.view(np.uint16)
    if writeable and not array.flags.writeable:
        raise ValueError(f"{what} must be writeable")
    if values and name not in VALUE_TYPES:
        raise TypeError(f"{what} has dtype {name}; expected one of {', '.join(VALUE_TYPES)}")
    if not values and name not in ("int32", "int64"):
        raise TypeError(f"{what} has dtype {name}; expected int32 or int64 indices")
    return NumpyView(array, name, framework, x)


def like(result: np.ndarray, view: NumpyView) -> Any:
    """The kernel result as the type of view.source (bfloat16 restored from its bits)."""
    if view.framework == "torch":
        import torch

        tensor = torch.from_numpy(result)
        if view.value_type == "bfloat16" and result.dtype == np.uint16:
            tensor = tensor.view(torch.int16).view(torch.bfloat16)
        return tensor
    if view.framework == "tensorflow":
        import tensorflow as tf

        if view.value_type == "bfloat16" and result.dtype == np.uint16:
            return tf.bitcast(tf.convert_to_tensor(result), tf.bfloat16)
        return tf.convert_to_tensor(result)
    if view.value_type == "bfloat16" and result.dtype == np.uint16:
        return result.view(view.source.dtype)
    return result


def check_count(k: Any) -> int:
    if isinstance(k, bool) or not isinstance(k, numbers.Integral):
        raise TypeError(f"k must be an integer, got {k!r}")
    if k < 0:
        raise ValueError(f"k must be >= 0, got {k}")
    return int(k)


def to_host_numpy(x: Any) -> np.ndarray:
    """x as a numpy array on the host: a view of a numpy array or CPU torch tensor, a copy of a
    GPU tensor's values."""
    if isinstance(x, np.ndarray):
        return x
    if framework_of(x) == "torch":
        return x.detach().cpu().numpy()
    return np.asarray(x)
