"""ops.segmented_accumulate_select on the host: each segment's top-k_i of |r + g| against the
numpy reference (a full sort per segment, ties by index), and bit for bit the per-segment
ops.accumulate_select calls it replaces (granularity "bucket"). CUDA: tests/ops/test_ops_cuda.py."""

from __future__ import annotations

import numpy as np
import pytest
from helpers.reference import topk_reference
from test_ops import KINDS, make_input

from gtopk_hvd import ops
from gtopk_hvd.sparsifiers.topk import segments_of

RNG = np.random.default_rng(11)


def layouts() -> dict[str, tuple[list[int], list[int]]]:
    """Named (lengths, ks): empty segments, k = 0, k >= length, one huge and many tiny."""
    tiny = [int(n) for n in RNG.integers(1, 70, 300)]
    return {
        "mixed": ([5, 0, 17, 1, 40_000, 3, 0, 300], [2, 4, 0, 1, 40, 3, 1, 500]),
        "huge_and_tiny": ([1_200_000] + tiny, [1_200] + [max(1, n // 10) for n in tiny]),
        "all_empty": ([0, 0, 0], [1, 0, 2]),
        "none": ([], []),
        "k_at_least_length": ([1, 2, 3, 70_000], [1, 5, 3, 70_000]),
        "k_zero": ([100, 70_000], [0, 0]),
    }


def offsets_of(lengths: list[int]) -> list[int]:
    return [0, *np.cumsum(lengths, dtype=np.int64).tolist()]


def reference(accumulated: np.ndarray, offsets: list[int],
              ks: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """Each segment's top-k of the accumulated values (full sort, ties by lower index), the
    indices offset by the segment's start, concatenated."""
    chosen = [begin + topk_reference(accumulated[begin:end], k)
              for begin, end, k in zip(offsets[:-1], offsets[1:], ks)]
    indices = np.concatenate(chosen).astype(np.int64) if chosen else np.zeros(0, np.int64)
    return indices, accumulated[indices]


def assert_bits(actual: np.ndarray, expected: np.ndarray) -> None:
    assert actual.dtype == expected.dtype
    np.testing.assert_array_equal(actual.view(np.uint8), expected.view(np.uint8))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("layout", list(layouts()))
@pytest.mark.parametrize("clear_gradient", [False, True])
def test_segmented_matches_the_reference(dtype: type, layout: str, clear_gradient: bool) -> None:
    lengths, ks = layouts()[layout]
    offsets = offsets_of(lengths)
    d = offsets[-1]
    gradient = RNG.standard_normal(d).astype(dtype)
    residual = RNG.standard_normal(d).astype(dtype)
    accumulated = residual + gradient
    expected_indices, expected_values = reference(accumulated, offsets, ks)
    indices, values = ops.segmented_accumulate_select(gradient, residual, offsets, ks,
                                                      clear_gradient)
    assert indices.dtype == np.int32
    np.testing.assert_array_equal(indices, expected_indices)
    assert_bits(values, expected_values)
    remaining = accumulated.copy()
    remaining[expected_indices] = 0
    assert_bits(residual, remaining)
    assert not clear_gradient or not gradient.any()
    assert len(indices) == sum(min(k, n) for k, n in zip(ks, lengths))


@pytest.mark.parametrize("kind", KINDS)
def test_segmented_ties_and_nonfinite_match_the_reference(kind: str) -> None:
    lengths = [3, 65_537, 1, 0, 4_000, 70_000]
    ks = [1, 66, 1, 3, 4_000, 7]
    offsets = offsets_of(lengths)
    residual = make_input(kind, offsets[-1], np.float32)
    expected = residual.copy()
    expected_indices, expected_values = reference(expected, offsets, ks)
    indices, values = ops.segmented_accumulate_select(None, residual, offsets, ks)
    np.testing.assert_array_equal(indices, expected_indices)
    assert_bits(values, expected_values)
    expected[expected_indices] = 0
    assert_bits(residual, expected)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_segmented_equals_the_per_part_calls_bit_for_bit(dtype: type) -> None:
    lengths, ks = layouts()["huge_and_tiny"]
    offsets = offsets_of(lengths)
    d = offsets[-1]
    gradient = make_input("few_levels", d, dtype)
    residual = make_input("normal", d, dtype)
    gradient_parts, residual_parts = gradient.copy(), residual.copy()
    chosen, picked = [], []
    for begin, end, k in zip(offsets[:-1], offsets[1:], ks):
        part_indices, part_values = ops.accumulate_select(
            gradient_parts[begin:end], residual_parts[begin:end], k, clear_gradient=True)
        chosen.append(part_indices.astype(np.int64) + begin)
        picked.append(part_values)
    indices, values = ops.segmented_accumulate_select(gradient, residual, offsets, ks, True)
    np.testing.assert_array_equal(indices, np.concatenate(chosen))
    assert_bits(values, np.concatenate(picked))
    assert_bits(residual, residual_parts)
    assert_bits(gradient, gradient_parts)


def test_segmented_takes_torch_tensors() -> None:
    torch = pytest.importorskip("torch")
    lengths, ks = layouts()["mixed"]
    offsets = offsets_of(lengths)
    gradient = torch.randn(offsets[-1])
    residual = torch.randn(offsets[-1])
    accumulated = (residual + gradient).numpy()
    indices, values = ops.segmented_accumulate_select(gradient, residual, offsets, ks)
    expected_indices, expected_values = reference(accumulated, offsets, ks)
    assert isinstance(indices, torch.Tensor) and indices.dtype == torch.int32
    np.testing.assert_array_equal(indices.numpy(), expected_indices)
    assert_bits(values.numpy(), expected_values)


@pytest.mark.parametrize("offsets,ks", [
    ([1, 5], [1]),          # does not start at 0
    ([0, 4], [1]),          # does not end at d
    ([0, 6, 5], [1, 1]),    # decreasing
    ([0, 5], [-1]),         # negative k
])
def test_segmented_refuses_bad_segments(offsets: list[int], ks: list[int]) -> None:
    residual = np.zeros(5, np.float32)
    with pytest.raises(ValueError):
        ops.segmented_accumulate_select(None, residual, offsets, ks)


def test_segmented_refuses_mismatched_lengths() -> None:
    with pytest.raises(ValueError, match="one more value"):
        ops.segmented_accumulate_select(None, np.zeros(5, np.float32), [0, 5], [1, 2])


def test_segments_of_budget_parts() -> None:
    parts = ((0, 0, 4, 1), (2, 4, 9, 2), (3, 9, 10, 1))
    assert segments_of(parts) == ([0, 4, 9, 10], [1, 2, 1])
    assert segments_of(()) == ([0], [])
    with pytest.raises(ValueError, match="contiguous"):
        segments_of(((0, 0, 4, 1), (1, 5, 9, 1)))
