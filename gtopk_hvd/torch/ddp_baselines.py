"""DDP's own compression hooks for P workers in one process: torch's `bf16_compress_hook` and
`powerSGD_hook` (torch.distributed.algorithms.ddp_comm_hooks), step for step.

For the simulated cluster (`gtopk_hvd.simulate.SimulatedCluster(baseline=...)`): the baselines
a DDP user already has, on the same model, data and workers as the sparse schemes. Each
`reduce(gradients)` takes every worker's flat float32 gradient (numpy, in the fused order of
the buckets' tensors) and returns the update every worker applies. The arithmetic is the hook's,
in the hook's order; each all-reduce is a sum in rank order here and in the collective's order
there, so the two agree to rounding (tests/torch/test_ddp_baselines.py, under torchrun).

bf16 (`Bf16Allreduce`): each worker's bucket cast to bfloat16 and divided by P in bfloat16; the
sum over the workers in bfloat16 (each addition rounded to bfloat16); cast back. Wire: one ring
all-reduce of 2 d bytes.

PowerSGD (`PowerSGD`), per DDP bucket b, PowerSGDState's fields as given (rank r,
start_powerSGD_iter, min_compression_rate, error feedback, warm start, the seed):

1. Before start_powerSGD_iter iterations: the plain average (each gradient divided by P, then
   summed). After:
2. with error feedback, worker p's bucket M_p = g_p + e_p;
3. each tensor of the bucket, viewed as (rows, -1) with rank r' = min(rows, cols, r), is
   compressed if (rows + cols) r' min_compression_rate < rows cols; the others are averaged
   uncompressed;
4. Q (cols x r'): at the bucket's first PowerSGD iteration (and every iteration without warm
   start) standard normal draws from torch's generator seeded by the state's
   `np.random.RandomState(seed).randint(1_000_000_000)`, then orthogonalised (Gram-Schmidt for
   r' <= 2, else QR); with warm start the last iteration's Q, orthogonalised;
5. P = sum_p M_p Q, orthogonalised; Q = sum_p M_p^T P / P_workers; the tensor := P Q^T, the same
   on every worker;
6. e_p = M_p - the bucket's result (the uncompressed tensors' average included).

What each sends: `gtopk_hvd.ddp_wire` (the planner prices the same), which also holds DDP's
bucket assignment (`ddp_buckets`).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from gtopk_hvd.ddp_wire import (
    Shapes,
    bucket_wire,
    ddp_buckets,
    powersgd_matrix,
    ring_allreduce,
)

__all__ = ["Bf16Allreduce", "PowerSGD", "ddp_buckets"]


class Bf16Allreduce:
    """torch's bf16_compress_hook for `workers` workers (module docstring)."""

    name = "bf16"

    def __init__(self, workers: int, d: int) -> None:
        self.workers, self.d = workers, d

    def reduce(self, gradients: Sequence[np.ndarray]) -> np.ndarray:
        total = None
        for gradient in gradients:
            part = torch.from_numpy(gradient).to(torch.bfloat16).div_(self.workers)
            total = part if total is None else total.add_(part)
        return total.to(torch.float32).numpy()

    def wire(self) -> tuple[int, int]:
        """(messages, bytes) one worker sends a step."""
        return ring_allreduce(self.workers, self.d, 2)


class PowerSGD:
    """torch's powerSGD_hook for `workers` workers (module docstring).

    shapes: the parameters' shapes in the fused order of the gradients `reduce` takes; buckets:
    DDP's buckets, in their index order, each the parameters (indices into shapes) in the order
    of its gradients (None: one bucket of every parameter in the fused order). The other
    arguments are PowerSGDState's (its defaults but start_powerSGD_iter, which torch requires
    > 1 with error feedback or warm start)."""

    name = "powersgd"

    def __init__(self, workers: int, shapes: Shapes,
                 buckets: Sequence[Sequence[int]] | None = None, rank: int = 1,
                 start_iter: int = 10, min_compression_rate: float = 2.0,
                 use_error_feedback: bool = True, warm_start: bool = True,
                 orthogonalization_epsilon: float = 0.0, random_seed: int = 0) -> None:
        if rank < 1:
            raise ValueError(f"PowerSGD's rank must be >= 1, got {rank}")
        if (use_error_feedback or warm_start) and start_iter <= 1:
            raise ValueError("PowerSGD's start_iter must be > 1 with error feedback or warm "
                             "start (torch's PowerSGDState: DDP rebuilds its buckets first)")
        self.workers, self.rank, self.start_iter = workers, rank, start_iter
        self.min_compression_rate = min_compression_rate
        self.use_error_feedback, self.warm_start = use_error_feedback, warm_start
        self.epsilon = orthogonalization_epsilon
        self.rng = np.random.RandomState(random_seed)
        self.shapes = [tuple(int(n) for n in shape) for shape in shapes]
        sizes = [int(np.prod(shape)) for shape in self.shapes]
        self.offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        self.buckets = [list(bucket) for bucket in
                        (buckets if buckets is not None else [range(len(self.shapes))])]
        if sorted(i for bucket in self.buckets for i in bucket) != list(range(len(sizes))):
            raise ValueError("PowerSGD's buckets must hold every parameter once")
        self.iter = 0
        self.errors: list[list[torch.Tensor | None]] = [[None] * len(self.buckets)
                                                        for _ in range(workers)]
        self.qs: list[list[torch.Tensor] | None] = [None] * len(self.buckets)

    def compressed(self, shape: Sequence[int]) -> tuple[int, int, int] | None:
        """(rows, cols, r') of a tensor PowerSGD compresses, None for one it sends whole."""
        return powersgd_matrix(shape, self.rank, self.min_compression_rate)

    def reduce(self, gradients: Sequence[np.ndarray]) -> np.ndarray:
        flats = [torch.from_numpy(gradient) for gradient in gradients]
        out = torch.empty_like(flats[0])
        for index, bucket in enumerate(self.buckets):
            parts = [torch.cat([self._of(flat, i) for i in bucket]) for flat in flats]
            result = (self._average(parts) if self.iter < self.start_iter
                      else self._bucket(index, parts))
            start = 0
            for i in bucket:
                size = int(self.offsets[i + 1] - self.offsets[i])
                self._of(out, i).copy_(result[start:start + size])
                start += size
        self.iter += 1
        return out.numpy()

    def _of(self, flat: torch.Tensor, parameter: int) -> torch.Tensor:
        return flat[int(self.offsets[parameter]):int(self.offsets[parameter + 1])]

    def _average(self, parts: Sequence[torch.Tensor]) -> torch.Tensor:
        total = parts[0] / self.workers
        for part in parts[1:]:
            total = total + part / self.workers
        return total

    def _bucket(self, index: int, parts: Sequence[torch.Tensor]) -> torch.Tensor:
        inputs = []
        for worker, part in enumerate(parts):
            error = self.errors[worker][index]
            inputs.append(part + error if self.use_error_feedback and error is not None
                          else part.clone())
        shapes = [self.shapes[i] for i in self.buckets[index]]
        views = [_tensors(flat, shapes) for flat in inputs]
        result = torch.empty_like(inputs[0])
        out = _tensors(result, shapes)
        matrices = [i for i, shape in enumerate(shapes) if self.compressed(shape)]
        plain = [i for i in range(len(shapes)) if i not in matrices]
        for i in plain:
            out[i].copy_(_sum([view[i] for view in views]).div_(self.workers))
        qs = self._start_qs(index, [self.compressed(shapes[i]) for i in matrices])
        for q, i in zip(qs, matrices):
            rows = shapes[i][0]
            ms = [view[i].reshape(rows, -1).unsqueeze(0) for view in views]
            p = _sum([torch.bmm(m, q) for m in ms])
            _orthogonalize(p, self.epsilon)
            q.copy_(_sum([torch.bmm(m.transpose(1, 2), p) for m in ms]).div_(self.workers))
            out[i].copy_(torch.bmm(p, q.transpose(1, 2)).reshape(out[i].shape))
        if self.use_error_feedback:
            for worker, flat in enumerate(inputs):
                self.errors[worker][index] = flat - result
        self.qs[index] = qs if self.warm_start else None
        return result

    def _start_qs(self, index: int, matrices: Sequence[tuple[int, int, int]]
                  ) -> list[torch.Tensor]:
        """Step 4: the bucket's Qs (1, cols, r') for this iteration."""
        if self.qs[index] is not None:
            for q in self.qs[index]:
                _orthogonalize(q, self.epsilon)
            return self.qs[index]
        qs = []
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.rng.randint(1_000_000_000))
            for _, cols, rank in matrices:
                q = torch.randn(1, cols, rank, dtype=torch.float32)
                _orthogonalize(q, self.epsilon)
                qs.append(q)
        return qs

    def wire(self) -> tuple[int, int]:
        """(messages, bytes) one worker sends in a PowerSGD step (after start_iter)."""
        per_bucket = [bucket_wire("powersgd", self.workers, self.shapes, bucket, self.rank,
                                  self.min_compression_rate) for bucket in self.buckets]
        return sum(m for m, _ in per_bucket), sum(b for _, b in per_bucket)


def _tensors(flat: torch.Tensor, shapes: Shapes) -> list[torch.Tensor]:
    """Views of `flat` as the bucket's tensors."""
    views, start = [], 0
    for shape in shapes:
        size = int(np.prod(shape))
        views.append(flat[start:start + size].view(*shape))
        start += size
    return views


def _sum(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    total = tensors[0].clone()
    for tensor in tensors[1:]:
        total += tensor
    return total


def _orthogonalize(matrices: torch.Tensor, epsilon: float) -> None:
    """torch's: Gram-Schmidt on each column for rank <= 2, else QR (in place)."""
    rank = matrices.shape[2]
    if rank > 2:
        torch.linalg.qr(matrices, out=(matrices, torch.empty(matrices.shape[0], rank, rank)))
        return
    for i in range(rank):
        col = matrices[:, :, i:i + 1]
        col /= torch.norm(col, dim=1, keepdim=True) + epsilon
        if i + 1 < rank:
            rest = matrices[:, :, i + 1:]
            rest -= torch.sum(col * rest, dim=1, keepdim=True) * col
