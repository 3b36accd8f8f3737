"""Smoke run of the extension under Horovod (the main job until the training example lands).

Each worker makes a gradient, selects its top-k by magnitude with gtopk_hvd.ops, the workers
all-gather their k-entry sets with Horovod, and every worker merges them in rank order with
gtopk_hvd.ops.merge_topk. The merged sets must be bitwise identical on every worker.

    mpirun --allow-run-as-root --oversubscribe -np 4 .venv/bin/python examples/extension_smoke.py
"""

from __future__ import annotations

import argparse
import time

import horovod.torch as hvd
import numpy as np
import torch
from mpi4py import MPI  # noqa: F401  (loaded before hvd.init(), see README)

from gtopk_hvd import ops


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=1_000_000, help="gradient entries d")
    parser.add_argument("--density", type=float, default=0.001, help="k / d")
    args = parser.parse_args()

    hvd.init()
    rank, workers = hvd.rank(), hvd.size()
    k = max(1, int(args.size * args.density))
    gradient = torch.randn(args.size, generator=torch.Generator().manual_seed(rank))

    start = time.perf_counter()
    indices, values = ops.topk_abs(gradient, k)
    select_ms = (time.perf_counter() - start) * 1e3

    all_indices = hvd.allgather(indices).split(k)
    all_values = hvd.allgather(values).split(k)
    merged_indices, merged_values = all_indices[0], all_values[0]
    for other_indices, other_values in zip(all_indices[1:], all_values[1:]):
        merged_indices, merged_values = ops.merge_topk(merged_indices, merged_values,
                                                       other_indices, other_values, k)

    fingerprint = torch.tensor([float(merged_indices.double().sum()),
                                float(merged_values.double().sum())], dtype=torch.float64)
    fingerprints = hvd.allgather(fingerprint.unsqueeze(0))
    if not torch.equal(fingerprints.min(0).values, fingerprints.max(0).values):
        raise SystemExit(f"rank {rank}: merged sets differ between workers: {fingerprints}")
    if rank == 0:
        sparse_bytes = 8 * k * (workers - 1)
        print(f"workers={workers} d={args.size:,} k={k:,} select={select_ms:.2f} ms "
              f"merged={merged_indices.numel():,} entries, identical on all workers; "
              f"all-gather bytes/worker={sparse_bytes:,} vs dense {4 * args.size:,} "
              f"({4 * args.size / max(1, sparse_bytes):.0f}x less); "
              f"largest |merged|={float(np.abs(merged_values.numpy()).max()):.3f}", flush=True)


if __name__ == "__main__":
    main()
