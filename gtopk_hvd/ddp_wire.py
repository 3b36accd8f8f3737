"""What DDP's own gradient reductions send, bucket by bucket: its dense all-reduce, torch's
`bf16_compress_hook` and `powerSGD_hook`; and how DDP groups parameters into buckets.

Per bucket of n float32 values, P workers, ring all-reduces:

    dense      one all-reduce of n values, 4 bytes each     2 (P-1) messages, 2 (P-1)/P 4 n bytes
    bf16       one all-reduce of n values, 2 bytes each     2 (P-1) messages, 2 (P-1)/P 2 n bytes
    powersgd   three all-reduces of 4-byte values: the tensors sent whole (u values), the Ps
               (sum of rows r'), the Qs (sum of cols r'), where a tensor viewed as (rows, cols)
               with r' = min(rows, cols, rank) is compressed if
               (rows + cols) r' min_compression_rate < rows cols

(PowerSGD's first start_powerSGD_iter iterations are the dense all-reduce.) Numpy only: the
planner prices these, `gtopk_hvd.torch.ddp_baselines` runs their arithmetic.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

Shapes = Sequence[Sequence[int]]
BASELINES = ("dense", "bf16", "powersgd")


def ring_allreduce(workers: int, values: int, value_bytes: int) -> tuple[int, int]:
    """(messages, bytes) one worker sends in a ring all-reduce of `values` values."""
    if workers <= 1:
        return 0, 0
    return 2 * (workers - 1), 2 * (workers - 1) * value_bytes * values // workers


def ddp_buckets(shapes: Shapes, bucket_cap_mb: float = 25.0,
                first_bucket_mb: float = 1.0) -> list[list[int]]:
    """DDP's buckets for float32 parameters of `shapes` (in the model's order), as its
    construction assigns them: the parameters in reverse order, each added to the open bucket,
    which closes once it holds at least its cap (the first bucket's, then bucket_cap_mb). DDP
    rebuilds them after its first iteration in the order the gradients became ready, which for
    a model whose backward runs its layers in reverse is the same grouping. The first bucket
    listed is the first whose gradients are ready."""
    buckets: list[list[int]] = [[]]
    filled, cap = 0, first_bucket_mb * 2 ** 20
    for index in reversed(range(len(shapes))):
        buckets[-1].append(index)
        filled += 4 * int(np.prod(shapes[index]))
        if filled >= cap:
            buckets.append([])
            filled, cap = 0, bucket_cap_mb * 2 ** 20
    return [bucket for bucket in buckets if bucket]


def powersgd_matrix(shape: Sequence[int], rank: int,
                    min_compression_rate: float = 2.0) -> tuple[int, int, int] | None:
    """(rows, cols, r') of a tensor PowerSGD compresses, None for one it sends whole."""
    rows = int(shape[0]) if len(shape) else 1
    cols = int(np.prod(shape)) // rows if rows else 0
    reduced = min(rows, cols, rank)
    if (rows + cols) * reduced * min_compression_rate < rows * cols:
        return rows, cols, reduced
    return None


def bucket_wire(baseline: str, workers: int, shapes: Shapes, bucket: Sequence[int],
                rank: int = 1, min_compression_rate: float = 2.0) -> tuple[int, int]:
    """(messages, bytes) one worker sends for one bucket (the parameters `bucket` indexes in
    shapes) in one step of `baseline` (module docstring; powersgd after its dense start)."""
    sizes = [int(np.prod(shapes[i])) for i in bucket]
    if baseline == "dense":
        return ring_allreduce(workers, sum(sizes), 4)
    if baseline == "bf16":
        return ring_allreduce(workers, sum(sizes), 2)
    if baseline != "powersgd":
        raise ValueError(f"unknown baseline {baseline!r}; one of {BASELINES}")
    whole = ps = qs = 0
    for i, size in zip(bucket, sizes):
        matrix = powersgd_matrix(shapes[i], rank, min_compression_rate)
        if matrix is None:
            whole += size
        else:
            rows, cols, reduced = matrix
            ps, qs = ps + rows * reduced, qs + cols * reduced
    messages = sent = 0
    for values in (whole, ps, qs):
        m, b = ring_allreduce(workers, values, 4)
        messages, sent = messages + m, sent + b
    return messages, sent
