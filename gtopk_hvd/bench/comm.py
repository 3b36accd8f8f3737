"""Per-step communication: dense all-reduce vs Top-k all-gather vs gTop-k, on any transport.

    mpirun -np 4 python -m gtopk_hvd.bench comm                          (mpi4py)
    horovodrun --gloo -np 4 python -m gtopk_hvd.bench comm --transport horovod
    torchrun --standalone --nproc_per_node 4 -m gtopk_hvd.bench comm --transport torch

Gradient sizes of ResNet-20, VGG-16 and ResNet-50; each worker's local set is k random indices
with Gaussian values (selection is not timed: kernels have their own benchmark). A step's time is
the slowest worker's, median over repeats; bytes are what one worker sends. Rank 0 prints.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any, Callable

import numpy as np

from gtopk_hvd.bench.timing import barrier, slowest
from gtopk_hvd.reductions import dense_allreduce, gtopk_allreduce, topk_allgather
from gtopk_hvd.transports import Transport
from gtopk_hvd.transports.launch import LAUNCHABLE, close_transports, open_transport

MODELS = {"resnet20": 269_722, "vgg16": 14_728_266, "resnet50": 25_557_032}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS),
                        help="models whose parameter count d is exchanged")
    parser.add_argument("--densities", type=float, nargs="+", default=[0.001, 0.01],
                        help="k / d")
    parser.add_argument("--repeats", type=int, default=5, help="timed runs of each exchange")
    parser.add_argument("--wire-dtype", default="float32", choices=["float32", "float16",
                                                                    "bfloat16"],
                        help="the sparse values' dtype on the wire")
    parser.add_argument("--transport", default="mpi", choices=LAUNCHABLE,
                        help="how the workers communicate (start them with its launcher)")
    parser.add_argument("--json", metavar="PATH", default=None,
                        help="also write the rows to PATH as JSON (rank 0), for the cost model")


def slowest_worker_seconds(transport: Transport, fn: Callable[[], Any],
                           repeats: int) -> tuple[float, Any]:
    """Median over repeats of the slowest worker's time for fn(); also fn's last result."""
    result = None

    def timed() -> float:
        nonlocal result
        barrier(transport)
        start = time.perf_counter()
        result = fn()
        return slowest(transport, time.perf_counter() - start)

    timed()  # warm-up
    return float(np.median([timed() for _ in range(repeats)])), result


def run(args: argparse.Namespace) -> None:
    transport = open_transport(args.transport)
    rank, size = transport.rank, transport.size
    rows = []
    for model in args.models:
        d = MODELS[model]
        rng = np.random.default_rng([rank, d])
        gradient = rng.standard_normal(d).astype(np.float32)
        dense_time, dense_stats = slowest_worker_seconds(
            transport, lambda g=gradient: dense_allreduce(g.copy(), transport), args.repeats)
        for density in args.densities:
            k = max(1, int(d * density))
            indices = np.sort(rng.choice(d, size=k, replace=False)).astype(np.int32)
            values = rng.standard_normal(k).astype(np.float32)
            topk_time, topk_result = slowest_worker_seconds(
                transport, lambda i=indices, v=values: topk_allgather(i, v, transport),
                args.repeats)
            gtopk_time, gtopk_result = slowest_worker_seconds(
                transport, lambda i=indices, v=values, k=k: gtopk_allreduce(
                    i, v, k, transport, wire_dtype=args.wire_dtype), args.repeats)
            rows.append((model, d, density, k, dense_time, dense_stats.bytes_sent, topk_time,
                         topk_result.stats.bytes_sent, gtopk_time, gtopk_result.stats.bytes_sent,
                         gtopk_result.stats.merge_seconds))
    if rank == 0 and args.json:
        write_json(args.json, size, args.wire_dtype, rows)
    if rank == 0:
        print(f"workers: {size}; transport: {args.transport} ({type(transport).__name__}); "
              f"wire values: {args.wire_dtype}; times: slowest worker, median of "
              f"{args.repeats}; bytes: sent per worker per step")
        header = (f"{'model':9} {'d':>11} {'density':>7} {'k':>8} | {'dense ms':>9} "
                  f"{'dense MB':>8} | {'topk ms':>8} {'topk MB':>8} | {'gtopk ms':>8} "
                  f"{'gtopk MB':>8} {'merge ms':>8} | {'dense/gtopk':>11} {'topk/gtopk':>10}")
        print(header)
        print("-" * len(header))
        for (model, d, density, k, t_dense, b_dense, t_topk, b_topk, t_gtopk, b_gtopk,
             merge) in rows:
            print(f"{model:9} {d:>11,} {density:>7} {k:>8,} | {t_dense * 1e3:9.2f} "
                  f"{b_dense / 1e6:8.2f} | {t_topk * 1e3:8.2f} {b_topk / 1e6:8.3f} | "
                  f"{t_gtopk * 1e3:8.2f} {b_gtopk / 1e6:8.3f} {merge * 1e3:8.2f} | "
                  f"{t_dense / t_gtopk:11.1f} {t_topk / t_gtopk:10.2f}", flush=True)
    close_transports()


def write_json(path: str, workers: int, wire_dtype: str, rows: list[tuple]) -> None:
    keys = ("model", "d", "density", "k", "dense_s", "dense_bytes", "topk_s", "topk_bytes",
            "gtopk_s", "gtopk_bytes", "gtopk_merge_s")
    records = [dict(zip(keys, row), workers=workers, wire_dtype=wire_dtype) for row in rows]
    with open(path, "w") as file:
        json.dump(records, file, indent=1)
