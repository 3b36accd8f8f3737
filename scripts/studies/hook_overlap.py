"""How much of the DDP hook's sparse step overlaps backward: a measurement under torchrun.

    torchrun --standalone --nproc_per_node 4 scripts/studies/hook_overlap.py --compression gtopk

A model of --layers Linear(--width, --width) layers under DDP (--bucket-cap-mb: several buckets),
--warmup iterations, then 2 x --steps alternating between the hook's two ways (the same state,
`state.overlap` switched between iterations, alike on every worker): held, every bucket held
until the last arrives and then stepped (nothing of the sparse step runs during backward), and
early, each bucket that can stepping tentatively as it arrives on the hook's thread
(`gtopk_hvd.torch.early_steps`). For the held iterations the script records when each bucket
reached the hook, when backward ended, and each bucket's step (`state.last_stats`: its
selection and its communication seconds); for both, backward() from its call to its return
(DDP waits there for every bucket's future). It prints the medians over iterations and workers
(rank 0):

  backward_ms        backward, from its start to the last bucket's arrival
  span_ms            the first bucket's arrival to the last's: the backward an early
                     bucket's step could hide behind
  step_ms            the hook's time at the last bucket (every bucket's step)
  select_ms / communicate_ms   its parts, summed over the buckets
  early_communicate_ms  the communication of every bucket but the last
  bound_ms           what starting early buckets at arrival could save at most: their
                     communication on a thread of its own, min(early_communicate_ms, span_ms)
                     (their selection computes on the same cores as backward here, so on a CPU
                     it only moves; on a GPU it queues behind backward on the same device)
  held_total_ms / early_total_ms   backward() with the step, held and early
  saved_ms           held_total_ms - early_total_ms (medians' difference), and saved_fraction
                     of held_total_ms

Over a shaped link (wire time, which no core spends, for the early exchanges to hide behind):
run under scripts/studies/emulated_cluster.py, which starts it with mpirun, each rank in a network
namespace; the process group is then Gloo over the bridge (rank 0's address, found and
broadcast with mpi4py) and --transport mpi carries the sparse exchanges over the same links:

    .venv/bin/python scripts/studies/emulated_cluster.py --workers 2 --rate 100mbit -- \
        .venv/bin/python scripts/studies/hook_overlap.py --transport mpi

A measurement on this machine's CPUs, over loopback or the emulated links, not a GPU's.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from gtopk_hvd.compression import Compression
from gtopk_hvd.torch import ddp as ddp_hook
from gtopk_hvd.torch.ddp import GTopkHookState, end_process_group


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--compression", default="gtopk", help="a Compression method's name")
    parser.add_argument("--density", type=float, default=0.01)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--width", type=int, default=512)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--bucket-cap-mb", type=float, default=2.0)
    parser.add_argument("--warmup", type=int, default=4)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--transport", default=None,
                        help="the hook's transport (default: torch.distributed over the group)")
    return parser.parse_args()


def init_process_group() -> None:
    """Gloo: from torchrun's variables, or under mpirun over the interface that carries this
    rank's 10.213.x.y address (scripts/studies/emulated_cluster.py's namespaces)."""
    if "OMPI_COMM_WORLD_RANK" not in os.environ:
        dist.init_process_group("gloo")
        return
    from mpi4py import MPI

    interface, address = next(
        (line.split()[1], line.split()[3].split("/")[0]) for line in subprocess.run(
            ["ip", "-4", "-o", "addr"], capture_output=True, text=True, check=True
        ).stdout.splitlines() if " 10.213." in line)
    comm = MPI.COMM_WORLD
    os.environ.update(MASTER_ADDR=comm.bcast(address), MASTER_PORT="29533",
                      GLOO_SOCKET_IFNAME=interface)
    dist.init_process_group("gloo", rank=comm.rank, world_size=comm.size)


def main() -> None:
    args = parse_args()
    init_process_group()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = DDP(nn.Sequential(*[nn.Sequential(nn.Linear(args.width, args.width), nn.ReLU())
                                for _ in range(args.layers)]), bucket_cap_mb=args.bucket_cap_mb)
    state = GTopkHookState(compression=getattr(Compression, args.compression)(args.density),
                           transport=args.transport)
    arrivals: list[float] = []

    def timed_hook(hook_state: GTopkHookState, bucket: dist.GradBucket) -> torch.futures.Future:
        arrivals.append(time.perf_counter())
        future = ddp_hook.gtopk_hook(hook_state, bucket)
        if bucket.is_last():
            arrivals.append(time.perf_counter())  # the end of the held steps
        return future

    timed_hook.__annotations__ = ddp_hook.gtopk_hook.__annotations__
    model.register_comm_hook(state, timed_hook)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    rows, totals = [], {False: [], True: []}
    for step in range(args.warmup + 2 * args.steps):
        early = step >= args.warmup and step % 2 == 1
        state.overlap = early
        x = torch.randn(args.batch, args.width, generator=torch.Generator().manual_seed(step))
        optimizer.zero_grad()
        loss = model(x).square().mean()
        arrivals.clear()
        began = time.perf_counter()
        loss.backward()
        ended = time.perf_counter()
        optimizer.step()
        if step < args.warmup:
            continue
        totals[early].append(1e3 * (ended - began))
        if early:
            continue
        last_arrival, stepped = arrivals[-2], arrivals[-1]
        stats = state.last_stats
        last = max(stats)
        rows.append({
            "buckets": len(stats),
            "backward_ms": 1e3 * (last_arrival - began),
            "span_ms": 1e3 * (last_arrival - arrivals[0]),
            "step_ms": 1e3 * (stepped - last_arrival),
            "select_ms": 1e3 * sum(s.select_seconds for s in stats.values()),
            "communicate_ms": 1e3 * sum(s.communicate_seconds for s in stats.values()),
            "early_communicate_ms": 1e3 * sum(s.communicate_seconds for index, s in
                                              stats.items() if index != last),
        })
    for row, held, early in zip(rows, totals[False], totals[True]):
        row.update(held_total_ms=held, early_total_ms=early)
    everyone: list = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, rows)
    if dist.get_rank() == 0:
        merged = [row for worker in everyone for row in worker]
        summary = {key: round(statistics.median(row[key] for row in merged), 3)
                   for key in merged[0]}
        summary["bound_ms"] = round(min(summary["early_communicate_ms"], summary["span_ms"]), 3)
        summary["saved_ms"] = round(summary["held_total_ms"] - summary["early_total_ms"], 3)
        summary["saved_fraction"] = round(summary["saved_ms"] / summary["held_total_ms"], 3)
        summary["started_early"] = state.book.early.started
        summary.update(workers=dist.get_world_size(), compression=args.compression,
                       density=args.density, params=sum(p.numel() for p in model.parameters()))
        print("OVERLAP " + json.dumps(summary), flush=True)
    end_process_group()


if __name__ == "__main__":
    main()
