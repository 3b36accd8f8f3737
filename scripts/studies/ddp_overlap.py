"""How much of DDP's own all-reduce overlaps backward, measured under torchrun, against the
planner's bucket pipeline (`gtopk_hvd.bench.pipeline`).

    torchrun --standalone --nproc_per_node 2 scripts/studies/ddp_overlap.py
    .venv/bin/python scripts/studies/emulated_cluster.py --workers 2 --rate 1gbit -- \\
        .venv/bin/python scripts/studies/ddp_overlap.py          # Gloo over shaped links

A model of --layers Linear(--width, --width) layers under DDP (dense all-reduce, --bucket-cap-mb:
several buckets). After --warmup iterations, --steps rounds of three iterations each, alike on
every worker:

  compute    forward and backward under no_sync() (nothing sent): the step's compute t_c, and
             forward's share of it
  buckets    each of DDP's buckets (`gtopk_hvd.ddp_wire.ddp_buckets`, which DDP's own
             assignment was checked against) all-reduced alone, one after another: T_i
  ddp        forward and backward with DDP's all-reduce (backward returns once every bucket's
             reduction is done)

Rank 0 prints the medians and the model's step from them: at overlap 0 (t_c + sum T_i), at
overlap 1, and the overlap that makes the model equal the measured DDP step (bisection), with the
model's error at overlap 1. A measurement on this machine's CPUs, where the all-reduce's Gloo
threads and backward share two cores; a GPU's overlap is the planner's --overlap.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
import torch.distributed as dist
from hook_overlap import init_process_group
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from gtopk_hvd.bench import pipeline
from gtopk_hvd.ddp_wire import ddp_buckets
from gtopk_hvd.torch.ddp import end_process_group


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--bucket-cap-mb", type=float, default=4.0)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--steps", type=int, default=10)
    return parser.parse_args()


def fitted_overlap(measured: float, compute: float, seconds: list[float], values: list[int],
                   backward_share: float) -> float:
    """The overlap in [0, 1] at which the pipeline's step is `measured` (clamped)."""
    low, high = 0.0, 1.0
    for _ in range(40):
        middle = (low + high) / 2
        if pipeline.pipelined_step(compute, seconds, values, middle, backward_share) > measured:
            low = middle
        else:
            high = middle
    return (low + high) / 2


def main() -> None:
    args = parse_args()
    init_process_group()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    layers = nn.Sequential(*[nn.Sequential(nn.Linear(args.width, args.width), nn.ReLU())
                             for _ in range(args.layers)])
    model = DDP(layers, bucket_cap_mb=args.bucket_cap_mb)
    sizes = [p.numel() for p in layers.parameters()]
    buckets = ddp_buckets([tuple(p.shape) for p in layers.parameters()], args.bucket_cap_mb)
    values = [sum(sizes[i] for i in bucket) for bucket in buckets]
    flats = [torch.zeros(n) for n in values]
    samples: dict[str, list[float]] = {"compute": [], "forward": [], "ddp": []}
    bucket_times: list[list[float]] = [[] for _ in buckets]

    def forward_backward(step: int, sync: bool) -> tuple[float, float]:
        x = torch.randn(args.batch, args.width, generator=torch.Generator().manual_seed(step))
        model.zero_grad()
        dist.barrier()
        began = time.perf_counter()
        if sync:
            loss = model(x).square().mean()
            forwarded = time.perf_counter()
            loss.backward()
        else:
            with model.no_sync():
                loss = model(x).square().mean()
                forwarded = time.perf_counter()
                loss.backward()
        return forwarded - began, time.perf_counter() - began

    for step in range(args.warmup + args.steps):
        forward, compute = forward_backward(step, sync=False)
        times = []
        for flat in flats:
            dist.barrier()
            began = time.perf_counter()
            dist.all_reduce(flat)
            times.append(time.perf_counter() - began)
        _, ddp = forward_backward(step, sync=True)
        if step < args.warmup:
            continue
        samples["compute"].append(compute)
        samples["forward"].append(forward)
        samples["ddp"].append(ddp)
        for seconds, per_bucket in zip(times, bucket_times):
            per_bucket.append(seconds)
    everyone: list = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, (samples, bucket_times))
    if dist.get_rank() == 0:
        def median(key: str) -> float:
            return statistics.median(v for worker, _ in everyone for v in worker[key])

        compute, ddp = median("compute"), median("ddp")
        backward_share = 1.0 - median("forward") / compute
        seconds = [statistics.median(v for _, times in everyone for v in times[i])
                   for i in range(len(buckets))]
        no_overlap = pipeline.pipelined_step(compute, seconds, values, 0.0, backward_share)
        full = pipeline.pipelined_step(compute, seconds, values, 1.0, backward_share)
        fitted = fitted_overlap(ddp, compute, seconds, values, backward_share)
        summary = {
            "workers": dist.get_world_size(), "params": sum(values), "buckets": len(buckets),
            "compute_ms": 1e3 * compute, "backward_share": backward_share,
            "buckets_ms": 1e3 * sum(seconds), "last_bucket_ms": 1e3 * seconds[-1],
            "ddp_ms": 1e3 * ddp, "model_no_overlap_ms": 1e3 * no_overlap,
            "model_overlap_1_ms": 1e3 * full,
            "model_overlap_1_error": (full - ddp) / ddp, "fitted_overlap": fitted}
        print("DDP_OVERLAP " + json.dumps({k: round(v, 4) if isinstance(v, float) else v
                                           for k, v in summary.items()}), flush=True)
    end_process_group()


if __name__ == "__main__":
    main()
