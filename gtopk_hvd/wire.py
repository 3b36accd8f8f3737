"""Wire format of a sparse set: one contiguous message of n indices followed by n values.

    message = indices (n x int32; int64 when d > 2^31) ++ values (n x float32|float16|bfloat16)

(the index dtype is `ops.index_dtype_for(d)`).

No header: the receiver learns n from the message length, n = bytes / (index bytes + value bytes).
Values travel in the wire dtype and are merged in float32; a sender rounds its own set to the
wire dtype too, so that both ends of an exchange merge the same numbers (replicas stay identical).
bfloat16 is float32 rounded to its upper 16 bits (round to nearest even; NaN stays NaN).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

WIRE_VALUE_TYPES = ("float32", "float16", "bfloat16")
VALUE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}
"""Bytes of one value of each wire dtype."""


def bfloat16_bits(values: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 bit patterns (uint16), round to nearest even."""
    bits = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32)
    rounded = (bits + np.uint32(0x7FFF) + ((bits >> 16) & np.uint32(1))) >> 16
    quiet_nan = (bits >> 16) | np.uint32(0x0040)
    return np.where(np.isnan(values), quiet_nan, rounded).astype(np.uint16)


def from_bfloat16_bits(bits: np.ndarray) -> np.ndarray:
    return (bits.astype(np.uint32) << 16).view(np.float32)


@dataclass(frozen=True)
class WireFormat:
    """Sizes and codecs of one (index dtype, wire value dtype) pair."""

    index_dtype: np.dtype
    value_type: str  # one of WIRE_VALUE_TYPES

    def __post_init__(self) -> None:
        if self.value_type not in WIRE_VALUE_TYPES:
            raise ValueError(f"wire value dtype must be one of {WIRE_VALUE_TYPES}, "
                             f"got {self.value_type!r}")
        if np.dtype(self.index_dtype) not in (np.dtype(np.int32), np.dtype(np.int64)):
            raise ValueError(f"indices must be int32 or int64, got {self.index_dtype}")

    @property
    def value_bytes(self) -> int:
        return 4 if self.value_type == "float32" else 2

    @property
    def entry_bytes(self) -> int:
        return np.dtype(self.index_dtype).itemsize + self.value_bytes

    def round_values(self, values: np.ndarray) -> np.ndarray:
        """values (float32) as they arrive after a trip over the wire."""
        if self.value_type == "float32":
            return values
        if self.value_type == "float16":
            return values.astype(np.float16).astype(np.float32)
        return from_bfloat16_bits(bfloat16_bits(values))

    def pack(self, indices: np.ndarray, values: np.ndarray, buffer: np.ndarray) -> int:
        """Writes the message into buffer (uint8); returns its length in bytes."""
        n = indices.size
        index_bytes = n * np.dtype(self.index_dtype).itemsize
        buffer[:index_bytes] = indices.view(np.uint8)
        if self.value_type == "float32":
            encoded = values.astype(np.float32, copy=False)
        elif self.value_type == "float16":
            encoded = values.astype(np.float16)
        else:
            encoded = bfloat16_bits(values)
        buffer[index_bytes:index_bytes + n * self.value_bytes] = encoded.view(np.uint8)
        return n * self.entry_bytes

    def unpack(self, buffer: np.ndarray, n_bytes: int) -> tuple[np.ndarray, np.ndarray]:
        """(indices, float32 values) of a received message of n_bytes."""
        if n_bytes % self.entry_bytes:
            raise ValueError(f"a message of {n_bytes} bytes is not a whole number of "
                             f"{self.entry_bytes}-byte entries")
        n = n_bytes // self.entry_bytes
        index_bytes = n * np.dtype(self.index_dtype).itemsize
        indices = buffer[:index_bytes].view(self.index_dtype)
        raw = buffer[index_bytes:index_bytes + n * self.value_bytes]
        if self.value_type == "float32":
            values = raw.view(np.float32)
        elif self.value_type == "float16":
            values = raw.view(np.float16).astype(np.float32)
        else:
            values = from_bfloat16_bits(raw.view(np.uint16))
        return indices, values
