"""Independent numpy references for the kernels: full sorts, no shared code with gtopk_hvd."""

from __future__ import annotations

import numpy as np


def magnitude_order(values: np.ndarray) -> np.ndarray:
    """Positions of `values` in selection order: NaN first, then |v| descending, then index."""
    as_float = values.astype(np.float64)
    is_nan = np.isnan(as_float)
    magnitude = np.where(is_nan, 0.0, np.abs(as_float))
    return np.lexsort((np.arange(values.size), -magnitude, ~is_nan))


def topk_reference(values: np.ndarray, k: int) -> np.ndarray:
    """Index-sorted positions of the top-k entries by magnitude."""
    return np.sort(magnitude_order(values)[: min(k, values.size)])


def merge_reference(index_a: np.ndarray, value_a: np.ndarray, index_b: np.ndarray,
                    value_b: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Union with summed values (in the value dtype), then top-k, index-sorted."""
    summed: dict[int, np.floating] = {}
    for index, value in zip(index_a.tolist(), value_a):
        summed[index] = value
    for index, value in zip(index_b.tolist(), value_b):
        summed[index] = summed[index] + value if index in summed else value
    union_index = np.array(sorted(summed), dtype=index_a.dtype)
    union_value = np.array([summed[i] for i in union_index.tolist()], dtype=value_a.dtype)
    keep = topk_reference(union_value, k)
    return union_index[keep], union_value[keep]


def gtopk_schedule_reference(sets: list[tuple[np.ndarray, np.ndarray]], k: int, entry_bytes: int,
                             round_values) -> tuple[list, list[int], list[int]]:
    """Replays the gTop-k schedule (fold in, recursive doubling, fold out) on every worker's
    local set. Returns each worker's final set and the bytes each sent and received."""
    size = len(sets)
    base = 1 << (size.bit_length() - 1)
    current = [(index, round_values(value)) for index, value in sets]
    sent, received = [0] * size, [0] * size

    def transfer(source: int, dest: int) -> None:
        n_bytes = entry_bytes * current[source][0].size
        sent[source] += n_bytes
        received[dest] += n_bytes

    def merged(a: int, b: int) -> tuple[np.ndarray, np.ndarray]:
        index, value = merge_reference(*current[a], *current[b], k)
        return index, round_values(value)

    for extra in range(base, size):
        transfer(extra, extra - base)
        current[extra - base] = merged(extra - base, extra)
    distance = 1
    while distance < base:
        for rank in range(base):
            transfer(rank, rank ^ distance)
        current[:base] = [merged(rank, rank ^ distance) for rank in range(base)]
        distance <<= 1
    for extra in range(base, size):
        transfer(extra - base, extra)
        current[extra] = current[extra - base]
    return current, sent, received
