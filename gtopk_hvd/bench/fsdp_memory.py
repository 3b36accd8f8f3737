"""Memory of the sparse reduce-scatter under FSDP2, per worker, against FSDP's own.

    python -m gtopk_hvd.bench fsdp-memory [--workers 4] [--parameters 4e6] [--units 8]

Launches torchrun (Gloo, CPU) over P workers; each shards a stack of --units square Linear
layers (d = --parameters in all) with `fully_shard`, trains it with AdamW, and counts, in bytes
per parameter of the whole model on one worker:

    FSDP's state   the worker's shards of the parameters, their gradients and AdamW's two
                   moments: 16 / P
    residual       what the sparse reduce-scatter keeps (the unit's unsharded gradient): 4, or
                   2 with residual_dtype=torch.bfloat16
    frozen scale   freeze_variance_after's s, gathered whole: 4
    step peak      the largest of torch's CPU allocations during one training step beyond what
                   was allocated when it began (torch.profiler's memory events), FSDP's own and
                   each configuration's, after two steps that made every state

The counts are of the tensors each worker holds, read from them (`SparseFSDP.residual_bytes`,
the rule's scales, the optimizer's state); the step's peak is measured.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
from typing import Any

CONFIGS = ("fsdp", "sparse", "sparse-bf16", "sparse-adamw")
"""FSDP's own reduce-scatter; the sparse one with a float32 residual, a bfloat16 residual, and
with freeze_variance_after."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--parameters", type=float, default=4e6, help="d, the whole model's")
    parser.add_argument("--units", type=int, default=8)
    parser.add_argument("--density", type=float, default=0.01)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)


def run(args: argparse.Namespace) -> None:
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               f"--nproc_per_node={args.workers}", "-m", "gtopk_hvd.bench.fsdp_memory",
               "--worker", f"--parameters={args.parameters}", f"--units={args.units}",
               f"--density={args.density}"]
    environment = dict(os.environ, OMP_NUM_THREADS="1")
    output = subprocess.run(command, capture_output=True, text=True, env=environment,
                            timeout=900)
    if output.returncode:
        sys.exit(f"fsdp-memory: torchrun failed ({output.returncode}):\n{output.stderr[-4000:]}")
    rows = [json.loads(line[len("ROW "):]) for line in output.stdout.splitlines()
            if line.startswith("ROW ")]
    print(report(rows, args.workers))


def report(rows: list[dict[str, Any]], workers: int) -> str:
    """The rows as a table, bytes per parameter per worker."""
    d = rows[0]["parameters"]
    dense_peak = next(row["step_peak"] for row in rows if row["config"] == "fsdp")
    lines = [f"P = {workers}, d = {d:,}, bytes per parameter of the model, on one worker",
             f"{'configuration':<14} {'FSDP state':>10} {'residual':>9} {'scale':>7} "
             f"{'total':>7} {'x FSDP':>7} {'step peak':>10} {'peak - FSDP':>12}"]
    for row in rows:
        state, extra = row["fsdp_state"] / d, (row["residual"] + row["scale"]) / d
        lines.append(f"{row['config']:<14} {state:>10.2f} {row['residual'] / d:>9.2f} "
                     f"{row['scale'] / d:>7.2f} {state + extra:>7.2f} "
                     f"{(state + extra) / state:>6.2f}x {row['step_peak'] / d:>10.2f} "
                     f"{(row['step_peak'] - dense_peak) / d:>12.2f}")
    return "\n".join(lines)


def worker(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.distributed.fsdp import fully_shard

    from gtopk_hvd.bench.memory import torch_cpu_peak
    from gtopk_hvd.torch import fsdp

    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    width = int(math.sqrt(args.parameters / args.units))
    for config in CONFIGS:
        torch.manual_seed(0)
        model = nn.Sequential(*(nn.Linear(width, width) for _ in range(args.units)))
        d = sum(p.numel() for p in model.parameters())
        for layer in model:
            fully_shard(layer)
        fully_shard(model)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
        sparse = None
        if config != "fsdp":
            sparse = fsdp.register(
                model, args.density,
                residual_dtype=torch.bfloat16 if config == "sparse-bf16" else torch.float32,
                freeze_variance_after=1 if config == "sparse-adamw" else None,
                optimizer=optimizer if config == "sparse-adamw" else None)
        inputs = torch.randn(8, width, generator=torch.Generator().manual_seed(dist.get_rank()))

        from torch.profiler import ProfilerActivity, profile

        for _ in range(2):
            train_step(model, optimizer, inputs)
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as profiler:
            train_step(model, optimizer, inputs)
        local = [p.to_local() for p in model.parameters()]
        moments = [t.to_local() for s in optimizer.state.values() for t in s.values()
                   if isinstance(t, torch.Tensor) and t.dim() > 0]
        fsdp_state = sum(2 * t.numel() * t.element_size() for t in local) + sum(
            t.numel() * t.element_size() for t in moments)
        scales = sparse.remedy.rule.scales.values() if sparse and sparse.remedy else []
        row = {"config": config, "parameters": d, "fsdp_state": fsdp_state,
               "residual": sparse.residual_bytes() if sparse else 0,
               "scale": sum(s.numel() * s.element_size() for s in scales),
               "step_peak": torch_cpu_peak(profiler)}
        if dist.get_rank() == 0:
            print("ROW " + json.dumps(row), flush=True)
        dist.barrier()
    dist.destroy_process_group()


def train_step(model: Any, optimizer: Any, inputs: Any) -> None:
    optimizer.zero_grad()
    model(inputs).square().mean().backward()
    optimizer.step()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    worker(parser.parse_args())
