"""Launched by torchrun on 2 workers (tests/torch/test_hook_errors.py): each bad choice a DDP user
can make with gtopk_hook, made on every rank, must raise gtopk_hvd's error naming the problem and
the fix on every rank, when the choice is made (the constructor, the registration's first
backward, the load), with no hang. Every rank prints `RAISED <case> rank=<r> <type>: <message>`
for each case, then `errors ok`.

`--case some-ranks` instead registers the hook on rank 0 only and trains: rank 0 must raise
gtopk_hvd's error before the first sparse collective (the job then exits non-zero).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from gtopk_hvd.compression import Compression
from gtopk_hvd.torch.ddp import GTopkHookState, end_process_group, gtopk_hook


def model() -> DDP:
    torch.manual_seed(0)
    return DDP(nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3)))


def train(ddp: DDP, steps: int, optimizer: torch.optim.Optimizer | None = None) -> None:
    optimizer = optimizer or torch.optim.SGD(ddp.parameters(), lr=0.1)
    for step in range(steps):
        generator = torch.Generator().manual_seed(step)
        x, y = torch.randn(4, 6, generator=generator), torch.randint(0, 3, (4,),
                                                                     generator=generator)
        optimizer.zero_grad()
        nn.functional.cross_entropy(ddp(x), y).backward()
        optimizer.step()


def compression_as_state() -> None:
    ddp = model()
    ddp.register_comm_hook(Compression.gtopk(0.1), gtopk_hook)
    train(ddp, 1)


def one_state_two_models() -> None:
    state = GTopkHookState(density=0.1)
    first, second = model(), model()
    first.register_comm_hook(state, gtopk_hook)
    second.register_comm_hook(state, gtopk_hook)
    train(first, 1)
    train(second, 1)


def other_compression() -> None:
    state = GTopkHookState(density=0.1)
    ddp = model()
    ddp.register_comm_hook(state, gtopk_hook)
    train(ddp, 3)
    saved = state.state_dict()
    GTopkHookState(compression=Compression.topk(0.05)).load_state_dict(saved)


def scheme_as_reduction() -> None:
    GTopkHookState(density=0.01, reduction="micro")


def remedy_with_sgd() -> None:
    ddp = model()
    GTopkHookState(density=0.1, freeze_variance_after=4,
                   optimizer=torch.optim.SGD(ddp.parameters(), lr=0.1))


def remedy_without_optimizer() -> None:
    ddp = model()
    ddp.register_comm_hook(GTopkHookState(density=0.1, freeze_variance_after=4), gtopk_hook)
    train(ddp, 1)


def remedy_on_adam_with_l2() -> None:
    ddp = model()
    GTopkHookState(density=0.1, freeze_variance_after=4,
                   optimizer=torch.optim.Adam(ddp.parameters(), weight_decay=0.01))


def clip_without_remedy() -> None:
    GTopkHookState(density=0.1, max_grad_norm=1.0)


CASES: dict[str, tuple[Callable[[], None], type, str]] = {
    "compression-as-state": (compression_as_state, TypeError, "GTopkHookState(compression="),
    "one-state-two-models": (one_state_two_models, RuntimeError, "one GTopkHookState per"),
    "other-compression": (other_compression, ValueError, "density=0.1 (this state: 0.05)"),
    "scheme-as-reduction": (scheme_as_reduction, ValueError, "Compression.micro(0.01)"),
    "remedy-with-sgd": (remedy_with_sgd, ValueError, "needs Adam or AdamW; got SGD"),
    "remedy-without-optimizer": (remedy_without_optimizer, RuntimeError,
                                 "attach_optimizer(optimizer)"),
    "remedy-on-adam-with-l2": (remedy_on_adam_with_l2, ValueError, "use AdamW"),
    "clip-without-remedy": (clip_without_remedy, ValueError, "without freeze_variance_after"),
}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--case", default="all")
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    if args.case == "some-ranks":
        ddp = model()
        if rank == 0:
            ddp.register_comm_hook(GTopkHookState(density=0.1), gtopk_hook)
        train(ddp, 4)
        print(f"rank {rank} trained: the error was not raised", flush=True)
        sys.exit(1)
    failures = []
    for name, (case, expected, fix) in CASES.items():
        try:
            case()
        except Exception as error:  # noqa: BLE001 - what each case raises is the check
            print(f"RAISED {name} rank={rank} {type(error).__name__}: {error}", flush=True)
            if not isinstance(error, expected) or fix not in str(error):
                failures.append(f"{name}: {type(error).__name__}: {error}")
        else:
            failures.append(f"{name}: nothing raised")
        dist.barrier()
    if failures:
        print("\n".join(f"FAILED rank={rank} {line}" for line in failures), flush=True)
        sys.exit(1)
    print(f"rank {rank}: errors ok", flush=True)
    end_process_group()


if __name__ == "__main__":
    main()
