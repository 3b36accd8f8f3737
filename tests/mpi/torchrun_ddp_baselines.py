"""Under torchrun (Gloo, CPU): the simulated cluster's DDP baselines
(`gtopk_hvd.torch.ddp_baselines`) against torch's own `bf16_compress_hook` and `powerSGD_hook`.

A DDP model in several buckets trains ITERATIONS iterations with torch's hook; every call's
input (each worker's bucket) and output are recorded. From the second iteration on (DDP's
rebuilt buckets), every worker's inputs are gathered and fed, iteration by iteration, to the
simulated baseline for all P workers, whose update is compared with the hook's. Printed per
configuration on rank 0:

  BASELINE name=N iterations=I max_rel=R moved=M

max_rel: the largest |simulated - hook| over all entries and iterations, relative to the
largest |hook| of the same bucket and iteration; moved: the same of |plain average - hook|
(from start_powerSGD_iter on for PowerSGD): how far the hook is from no compression.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook
from torch.nn.parallel import DistributedDataParallel as DDP

from gtopk_hvd.torch.ddp import end_process_group
from gtopk_hvd.torch.ddp_baselines import Bf16Allreduce, PowerSGD

ITERATIONS, START_ITER = 9, 3
CONFIGS = {"bf16": None, "powersgd-1": 1, "powersgd-2": 2, "powersgd-4": 4}


def train(rank: int | None) -> list[list[tuple]]:
    """Each iteration's hook calls: (bucket index, input, output, the bucket's shapes)."""
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(32, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(),
                              nn.Linear(64, 8)), bucket_cap_mb=0.02)
    if rank is None:
        state, hook = None, default_hooks.bf16_compress_hook
    else:
        state = powerSGD_hook.PowerSGDState(process_group=None, matrix_approximation_rank=rank,
                                            start_powerSGD_iter=START_ITER)
        hook = powerSGD_hook.powerSGD_hook
    calls: list[tuple] = []

    def recording(hook_state, bucket):  # unannotated: DDP checks annotations as objects
        entry = [bucket.index(), bucket.buffer().clone(), None,
                 [tuple(g.shape) for g in bucket.gradients()]]
        calls.append(entry)

        def keep(future: torch.futures.Future) -> torch.Tensor:
            entry[2] = future.value().clone()
            return future.value()

        return hook(hook_state, bucket).then(keep)

    model.register_comm_hook(state, recording)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    iterations = []
    for iteration in range(ITERATIONS):
        generator = torch.Generator().manual_seed(100 * dist.get_rank() + iteration)
        x = torch.randn(16, 32, generator=generator)
        optimizer.zero_grad()
        calls.clear()
        F.mse_loss(model(x), x[:, :8].sin()).backward()
        optimizer.step()
        iterations.append(sorted(calls, key=lambda call: call[0]))
    return iterations


def compare(name: str, rank: int | None) -> tuple[float, float]:
    iterations = train(rank)
    workers = dist.get_world_size()
    layout = iterations[-1]
    shapes = [shape for call in layout for shape in call[3]]
    buckets, start = [], 0
    for call in layout:
        buckets.append(list(range(start, start + len(call[3]))))
        start += len(call[3])
    d = sum(int(np.prod(shape)) for shape in shapes)
    simulated = (Bf16Allreduce(workers, d) if rank is None else
                 PowerSGD(workers, shapes, buckets, rank=rank, start_iter=START_ITER))
    if rank is not None:
        simulated.iter = 1  # iteration 0 (construction-time buckets, dense) is not fed
    worst = moved = 0.0
    for iteration, calls in enumerate(iterations[1:], start=1):
        assert [call[3] for call in calls] == [call[3] for call in layout]
        mine = torch.cat([call[1] for call in calls])
        everyone = [torch.empty_like(mine) for _ in range(workers)]
        dist.all_gather(everyone, mine)
        update = torch.from_numpy(simulated.reduce([t.numpy().copy() for t in everyone]))
        average = torch.stack(everyone).mean(dim=0)
        offset = 0
        for call in calls:
            size = call[2].numel()
            part = update[offset:offset + size]
            scale = float(call[2].abs().max()) or 1.0
            worst = max(worst, float((part - call[2]).abs().max()) / scale)
            if iteration >= START_ITER or rank is None:
                plain = average[offset:offset + size]
                moved = max(moved, float((plain - call[2]).abs().max()) / scale)
            offset += size
    return worst, moved


def main() -> None:
    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    for name, rank in CONFIGS.items():
        worst, moved = compare(name, rank)
        if dist.get_rank() == 0:
            print(f"BASELINE name={name} iterations={ITERATIONS - 1} max_rel={worst:.3g} "
                  f"moved={moved:.3g}", flush=True)
    if dist.get_rank() == 0:
        print(f"baselines ok on {dist.get_world_size()} workers", flush=True)
    end_process_group()


if __name__ == "__main__":
    main()
