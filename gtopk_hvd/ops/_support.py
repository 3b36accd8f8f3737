"""What every kernel call of the package needs: the index dtype rule, facts about the arrays
handed in (length, contiguity, host copies), the checks of the arrays (csrc/bindings/bindings.h:
the kernels' entries take addresses and type codes, and every array is checked here before its
address is taken: lengths, dtypes, order and range of index sets, a sketch's keys), and the
plumbing of a CUDA call (the build check, the device checks, outputs, workspace, stream,
device, the skip flag's address)."""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from gtopk_hvd import _C
from gtopk_hvd._arrays import (
    dtype_name,
    framework_of,
    is_cuda,
)

cuda_built: bool = bool(_C.built_with_cuda)

INT32_INDEX_LIMIT: int = int(_C.INT32_INDEX_LIMIT)
"""The longest dense length whose indices 0 .. d-1 all fit in int32 (2^31)."""


def index_dtype_for(d: int) -> type[np.signedinteger]:
    """The index dtype of a dense length d: np.int32 when its indices fit in int32, else
    np.int64 (the kernels' rule, gtopk/types.h)."""
    return np.int32 if _C.int32_indices_fit(d) else np.int64


def _itemsize(x: Any) -> int:
    return x.element_size() if framework_of(x) == "torch" else x.dtype.itemsize


def _length(x: Any) -> int:
    return x.numel() if framework_of(x) == "torch" else x.size


def _torch_index_dtype(d: int) -> Any:
    """index_dtype_for(d) as a torch dtype."""
    import torch

    return getattr(torch, index_dtype_for(d).__name__)


_FAST_VALUE_TYPES = {"f": "float32", "d": "float64"}
_FAST_CODES = frozenset("fdilq")


def _plain_numpy(*arrays: Any) -> bool:
    """All 1-D numpy arrays of float32/float64/integer dtype: the host checks below take them as
    they are (contiguity, dtypes, order), without the views of the general path."""
    return all(type(a) is np.ndarray and a.ndim == 1 and a.dtype.char in _FAST_CODES
               for a in arrays)


def _contiguous(x: Any) -> bool:
    framework = framework_of(x)
    if framework == "torch":
        return x.is_contiguous()
    return framework == "tensorflow" or x.flags.c_contiguous


def _to_cpu(x: Any) -> Any:
    return x.cpu() if is_cuda(x) else x


def _to_numpy_any(x: Any) -> np.ndarray:
    if isinstance(x, np.ndarray):
        return x
    return _to_cpu(x).numpy()


def _require_cuda_build() -> None:
    if not cuda_built:
        raise RuntimeError("gtopk_hvd was built without CUDA kernels (no nvcc when it was built); "
                           "reinstall with a CUDA toolkit on PATH, or move the tensors to the CPU")


def _cuda_check(tensor: Any, what: str, device: Any) -> None:
    if not is_cuda(tensor) or tensor.device != device:
        raise ValueError(f"{what} must be a CUDA tensor on {device}")
    if not tensor.is_contiguous():
        raise ValueError(f"{what} must be contiguous; call .contiguous() first")


def _cuda_check_pair(gradient: Any, residual: Any) -> None:
    """gradient and residual: contiguous CUDA tensors on one device, of one length and dtype."""
    device = gradient.device if is_cuda(gradient) else residual.device
    _cuda_check(gradient, "gradient", device)
    _cuda_check(residual, "residual", device)
    if gradient.numel() != residual.numel() or gradient.dtype != residual.dtype:
        raise ValueError("gradient and residual must have the same length and dtype")


def _value_type(dtype: Any, arithmetic: bool = False) -> Any:
    """The kernels' code of a value dtype (_C.ValueType members are named like dtypes; a
    dtype's name, e.g. a NumpyView's value_type, names it too); arithmetic: float32 / float64
    only (the kernels that add values)."""
    name, code = _value_code(dtype)
    if arithmetic and name not in _ARITHMETIC:
        raise TypeError(f"unsupported value dtype '{name}'; expected float32 or float64")
    if code is None:
        raise TypeError(f"unsupported dtype {dtype}")
    return code


_ARITHMETIC = ("float32", "float64")


@functools.cache
def _value_code(dtype: Any) -> tuple[str, Any]:
    """(the dtype's name, its _C.ValueType or None), once per dtype: a kernel call asks for it
    every time."""
    name = dtype if isinstance(dtype, str) else dtype_name(dtype)
    return name, _C.ValueType.__members__.get(name)


@functools.cache
def _index_type(dtype: Any) -> Any:
    """The kernels' code of an index dtype (_C.IndexType members are named like dtypes)."""
    code = _C.IndexType.__members__.get(dtype_name(dtype))
    if code is None:
        raise TypeError(f"indices must be int32 or int64, got {dtype}")
    return code


def _cuda_outputs(like_values: Any, n: int, d: int,
                  index_dtype: Any = None) -> tuple[Any, Any, Any, Any]:
    """Output tensors for n entries, values like `like_values`; indices of index_dtype_for(d)
    unless index_dtype is given; and the kernels' type codes."""
    import torch

    if index_dtype is None:
        index_dtype = _torch_index_dtype(d)
    value_type = _value_type(like_values.dtype)
    indices = torch.empty(n, dtype=index_dtype, device=like_values.device)
    values = torch.empty(n, dtype=like_values.dtype, device=like_values.device)
    return indices, values, value_type, _index_type(index_dtype)


def _workspace(nbytes: int, device: Any) -> Any:
    """Scratch memory of one kernel call from torch's caching allocator (on the current stream,
    the one the call is enqueued on)."""
    import torch

    return torch.empty(nbytes, dtype=torch.uint8, device=device)


def _stream(device: Any) -> int:
    import torch

    return torch.cuda.current_stream(device).cuda_stream


def _on_device(device: Any) -> Any:
    """Makes `device` current for a kernel call: the kernels size their grids for it."""
    import torch

    return torch.cuda.device(device)


def _check_flag(flag: Any, like: Any, what: str) -> None:
    """Raises unless `flag` is one int32 on like's device (a torch tensor)."""
    import torch

    if flag.device != like.device or flag.dtype != torch.int32 or flag.numel() != 1:
        raise ValueError(f"{what} must be one int32 on {like.device}, got {flag.dtype} "
                         f"{tuple(flag.shape)} on {flag.device}")


def _flag_address(skip: Any, like: Any) -> int:
    """The device address of a skip flag for the kernels (0: none), checked to be one int32 on
    like's device."""
    if skip is None:
        return 0
    _check_flag(skip, like, "skip")
    return skip.data_ptr()


def _check_range(begin: int, end: int, d: int) -> None:
    if not 0 <= begin <= end <= d:
        raise ValueError(f"need 0 <= begin <= end <= d, got begin={begin}, end={end}, d={d}")


# -- arrays on the host: the checks the kernels rely on, and their addresses --------------------

def _address(array: np.ndarray | None) -> np.ndarray | int:
    """A host array as an entry takes its address (bindings.h, Address): the array itself, whose
    buffer the binding reads without a copy (contiguous: checked by the caller); 0 for None."""
    return 0 if array is None else array


def _host_empty(n: int, dtype: Any) -> np.ndarray:
    return np.empty(int(n), dtype=dtype)


def _check_accumulation(gradient: np.ndarray | None, residual: np.ndarray,
                        clear_gradient: bool) -> None:
    """What the accumulating kernels rely on (residual += gradient in place, gradient = 0 if
    asked): one length and dtype, and not one array when the gradient is cleared."""
    if gradient is None:
        return
    if gradient.size != residual.size or gradient.dtype != residual.dtype:
        raise ValueError("gradient and residual must have the same length and dtype")
    if clear_gradient and gradient.ctypes.data == residual.ctypes.data:
        raise ValueError("gradient and residual must not be the same array when the gradient "
                         "is cleared")


def _check_hint(hint: np.ndarray | None, like: np.ndarray, what: str) -> None:
    if hint is not None and (hint.size != 1 or hint.itemsize != like.itemsize):
        raise ValueError(f"threshold_hint must be one value of {what}'s dtype")


def _check_set(index: np.ndarray, value: np.ndarray, what: str) -> None:
    """A sparse set: as many indices as values."""
    if index.size != value.size:
        raise ValueError(f"{what}: indices and values differ in length ({index.size} vs "
                         f"{value.size})")


def _check_sorted(index: np.ndarray, what: str) -> None:
    """index strictly increasing (sorted, no duplicates): one multi-threaded read."""
    j = _C.first_not_increasing(_index_type(index.dtype), _address(index), index.size)
    if j != 0:
        raise ValueError(f"{what} must be strictly increasing (sorted, no duplicates); "
                         f"position {j} breaks it")


def _check_within(index: np.ndarray, d: int, what: str) -> None:
    """Every index in [0, d) (what: the array they index)."""
    if index.size and (int(index.min()) < 0 or int(index.max()) >= d):
        raise IndexError(f"indices out of range for {what} of length {d}")


def _sketch_keys(keys: Any, columns: int) -> tuple[np.ndarray, int]:
    """A count sketch's keys on the host, checked: a C-contiguous uint32 array of shape
    (rows, 2), with 1 <= rows <= SKETCH_MAX_ROWS and 1 <= columns < 2^32 (the kernels' rule,
    _C.check_sketch_shape); returns (keys, rows)."""
    keys = np.ascontiguousarray(_to_numpy_any(keys))
    if (keys.dtype != np.uint32 or keys.ndim != 2 or keys.shape[1] != 2
            or not keys.flags.c_contiguous):
        raise TypeError("keys must be a C-contiguous uint32 array of shape (rows, 2)")
    _C.check_sketch_shape(keys.shape[0], int(columns))
    return keys, int(keys.shape[0])


def _require_float32(array: Any, what: str) -> None:
    if dtype_name(array.dtype) != "float32":
        raise TypeError(f"{what} must be float32 (the sketch sums float32)")
