"""gtopk_hvd.ops on CUDA tensors against the numpy references. Skipped without a GPU (the CUDA
sources are still compiled by every install where nvcc is found)."""

from __future__ import annotations

import numpy as np
import pytest
from reference import merge_reference, topk_reference
from test_ops import KINDS, make_input

from gtopk_hvd import ops

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.skipif(not (torch.cuda.is_available() and ops.cuda_built),
                                reason="needs a CUDA GPU and an extension built with nvcc")

TORCH_DTYPES = {"float32": torch.float32, "float64": torch.float64, "float16": torch.float16,
                "bfloat16": torch.bfloat16}


def on_gpu(x: np.ndarray, dtype: str) -> torch.Tensor:
    return torch.from_numpy(x.astype(np.float64)).to(TORCH_DTYPES[dtype]).cuda()


@pytest.mark.parametrize("dtype", list(TORCH_DTYPES))
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("d", [0, 1, 7, 65_537, 1_000_003, 1 << 24])
def test_cuda_topk_abs_matches_full_sort(dtype: str, kind: str, d: int) -> None:
    x = on_gpu(make_input(kind, d, np.float64), dtype)
    host = x.float().cpu().numpy() if dtype == "bfloat16" else x.cpu().numpy()
    for k in sorted({0, 1, d // 1000, d // 100, d // 3, d, d + 1}):
        indices, values = ops.topk_abs(x, k)
        expected = topk_reference(host, k)
        np.testing.assert_array_equal(indices.cpu().numpy(), expected)
        selected = x.cpu()[torch.from_numpy(expected).long()]
        assert torch.equal(values.cpu().view(torch.uint8), selected.view(torch.uint8))


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("d,k", [(10, 3), (1_000_003, 1000), (1 << 22, 1 << 12)])
def test_cuda_accumulate_select(dtype: str, d: int, k: int) -> None:
    rng = np.random.default_rng(1)
    gradient = on_gpu(rng.standard_normal(d), dtype)
    residual = on_gpu(rng.standard_normal(d), dtype)
    accumulated = (residual + gradient).cpu().numpy()
    indices, values = ops.accumulate_select(gradient, residual, k)
    expected = topk_reference(accumulated, k)
    np.testing.assert_array_equal(indices.cpu().numpy(), expected)
    np.testing.assert_array_equal(values.cpu().numpy(), accumulated[expected])
    remaining = accumulated.copy()
    remaining[expected] = 0
    np.testing.assert_array_equal(residual.cpu().numpy(), remaining)


@pytest.mark.parametrize("n,d,k", [(0, 10, 3), (100, 150, 100), (50_000, 120_000, 50_000)])
def test_cuda_merge_matches_reference_and_is_symmetric(n: int, d: int, k: int) -> None:
    rng = np.random.default_rng(2)
    sets = []
    for _ in range(2):
        index = np.sort(rng.choice(d, size=n, replace=False)).astype(np.int32)
        sets.append((index, rng.integers(-3, 4, n).astype(np.float32)))
    (ia, va), (ib, vb) = sets
    gpu = [torch.from_numpy(a).cuda() for a in (ia, va, ib, vb)]
    indices, values = ops.merge_topk(*gpu, k)
    expected_index, expected_value = merge_reference(ia, va, ib, vb, k)
    np.testing.assert_array_equal(indices.cpu().numpy(), expected_index)
    np.testing.assert_array_equal(values.cpu().numpy(), expected_value)
    swapped = ops.merge_topk(gpu[2], gpu[3], gpu[0], gpu[1], k)
    assert torch.equal(swapped[0], indices) and torch.equal(swapped[1], values)
