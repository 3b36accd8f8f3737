"""An independent numpy reference of sketched SGD's count sketch (gtopk/count_sketch.h states
the maths): the hashes, the table's exact integer sums rounded once to float32, the median of
rows. No code shared with gtopk_hvd."""

from __future__ import annotations

import numpy as np

MASK32 = np.uint64(0xFFFFFFFF)


def mix32(x: np.ndarray) -> np.ndarray:
    """MurmurHash3's 32-bit finaliser on uint64 holding 32-bit values."""
    x = x ^ (x >> np.uint64(16))
    x = (x * np.uint64(0x85EBCA6B)) & MASK32
    x = x ^ (x >> np.uint64(13))
    x = (x * np.uint64(0xC2B2AE35)) & MASK32
    return x ^ (x >> np.uint64(16))


def word(indices: np.ndarray, key: int) -> np.ndarray:
    """mix32(lo32(i) ^ key ^ mix32(hi32(i)))."""
    indices = indices.astype(np.uint64)
    return mix32((indices & MASK32) ^ np.uint64(key) ^ mix32(indices >> np.uint64(32)))


def hashes(keys: np.ndarray, columns: int, d: int) -> tuple[np.ndarray, np.ndarray]:
    """(buckets, negative): rows x d, h_j(i) and whether s_j(i) = -1."""
    indices = np.arange(d, dtype=np.uint64)
    buckets = np.stack([(word(indices, int(k0)) * np.uint64(columns)) >> np.uint64(32)
                        for k0 in keys[:, 0]]).astype(np.int64)
    negative = np.stack([(word(indices, int(k1)) >> np.uint64(31)) == 1 for k1 in keys[:, 1]])
    return buckets.reshape(len(keys), d), negative.reshape(len(keys), d)


def scale_exponent(acc: np.ndarray) -> int:
    """s = 62 - ceil(log2 d) - E, E the least integer >= -126 above every finite |acc|."""
    finite = np.abs(acc[np.isfinite(acc)]).astype(np.float64)
    largest = float(finite.max()) if finite.size else 0.0
    exponent = -126 if largest == 0.0 else max(int(np.frexp(largest)[1]), -126)
    return 62 - (max(acc.size, 1) - 1).bit_length() - exponent


def table_reference(acc: np.ndarray, keys: np.ndarray, columns: int) -> np.ndarray:
    """S (rows x columns float32) of the float32 vector acc."""
    rows, d = len(keys), acc.size
    buckets, negative = hashes(keys, columns, d)
    s = scale_exponent(acc)
    finite = np.isfinite(acc)
    q = np.zeros(d, np.int64)
    q[finite] = np.rint(acc[finite].astype(np.float64) * np.ldexp(1.0, s)).astype(np.int64)
    sums = np.zeros((rows, columns), np.int64)
    nan = np.zeros((rows, columns), bool)
    plus = np.zeros((rows, columns), bool)
    minus = np.zeros((rows, columns), bool)
    for j in range(rows):
        np.add.at(sums[j], buckets[j], np.where(negative[j], -q, q))
        signed = np.where(negative[j], -acc.astype(np.float64), acc.astype(np.float64))
        nan[j, buckets[j][np.isnan(acc)]] = True
        plus[j, buckets[j][signed == np.inf]] = True
        minus[j, buckets[j][signed == -np.inf]] = True
    table = (sums.astype(np.float64) * np.ldexp(1.0, -s)).astype(np.float32)
    table[plus] = np.inf
    table[minus] = -np.inf
    table[nan | (plus & minus)] = np.nan
    return table


def estimate_reference(table: np.ndarray, keys: np.ndarray, d: int) -> np.ndarray:
    """est(i) for i < d: the median over rows of s_j(i) S[j, h_j(i)], float32."""
    rows, columns = table.shape
    buckets, negative = hashes(keys, columns, d)
    values = np.stack([np.where(negative[j], -table[j, buckets[j]], table[j, buckets[j]])
                       for j in range(rows)]).astype(np.float32).reshape(rows, d)
    ordered = np.sort(values, axis=0)
    if rows % 2:
        middle = ordered[rows // 2]
    else:
        middle = (ordered[rows // 2 - 1] + ordered[rows // 2]) * np.float32(0.5)
    middle = np.where(middle == 0, np.float32(0.0), middle).astype(np.float32)
    middle[np.isnan(values).any(axis=0)] = np.float32(np.nan)
    return middle
