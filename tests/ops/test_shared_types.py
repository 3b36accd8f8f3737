"""The index width rule and the CUDA type codes that the C++ headers define and the extension
exports (gtopk/types.h): checked against expectations derived here, from numpy's int32."""

from __future__ import annotations

import numpy as np
import pytest

from gtopk_hvd import _C, ops

INT32_MAX = int(np.iinfo(np.int32).max)


def expected_index_dtype(d: int) -> type:
    """int32 iff the largest index of a length-d vector, d - 1, is representable in int32."""
    return np.int32 if d - 1 <= INT32_MAX else np.int64


def test_the_limit_is_the_longest_length_int32_can_index() -> None:
    assert ops.INT32_INDEX_LIMIT == _C.INT32_INDEX_LIMIT == INT32_MAX + 1
    largest_index = np.int64(ops.INT32_INDEX_LIMIT - 1)
    assert largest_index.astype(np.int32) == largest_index
    assert (largest_index + 1).astype(np.int32) != largest_index + 1


@pytest.mark.parametrize("d", [0, 1, 1000, INT32_MAX - 1, INT32_MAX, INT32_MAX + 1,
                               INT32_MAX + 2, INT32_MAX + 3, 2 * INT32_MAX, 1 << 40])
def test_index_dtype_at_the_boundary(d: int) -> None:
    assert ops.index_dtype_for(d) is expected_index_dtype(d)
    assert _C.int32_indices_fit(d) == (expected_index_dtype(d) is np.int32)


@pytest.mark.parametrize("d", [1, 7, 70_000])
def test_cpu_kernels_return_the_index_dtype_of_their_length(d: int) -> None:
    indices, _ = ops.topk_abs(np.ones(d, np.float32), 3)
    assert indices.dtype == ops.index_dtype_for(d)


@pytest.mark.parametrize("codes, names", [
    (_C.ValueType, {"float32", "float64", "float16", "bfloat16"}),
    (_C.IndexType, {"int32", "int64"}),
])
def test_type_codes_round_trip(codes: type, names: set[str]) -> None:
    members = codes.__members__
    assert set(members) == names
    assert len({int(member) for member in members.values()}) == len(members)
    for name, member in members.items():
        assert codes(int(member)) == member
        assert member.name == name


def test_ops_maps_dtypes_to_the_exported_codes() -> None:
    torch = pytest.importorskip("torch")
    for name, member in _C.ValueType.__members__.items():
        assert ops._support._value_type(getattr(torch, name)) == member
    for name, member in _C.IndexType.__members__.items():
        assert ops._support._index_type(getattr(torch, name)) == member
        assert ops._support._index_type(np.dtype(name)) == member
    with pytest.raises(TypeError, match="unsupported dtype"):
        ops._support._value_type(torch.int8)
    with pytest.raises(TypeError, match="int32 or int64"):
        ops._support._index_type(torch.int16)
