"""PyTorch DDP training of the digits CNN, with gtopk_hvd's gTop-k hook as one option.

The DDP version of examples/pytorch_digits.py (same model, data split, shards, epochs, learning
rate and seed), so that the two are comparable. A plain DDP script in which one call,
`register_compression`, picks the communication: DDP's own all-reduce for --compression none,
PyTorch's fp16 hook for fp16, gtopk_hvd's hook (`gtopk_hvd.torch.ddp`) for topk/gtopk.

    OMP_NUM_THREADS=1 torchrun --nproc_per_node 4 examples/ddp_digits.py \\
        --compression gtopk --density 0.01

Rank 0 ends with the RESULT line of digits_common (plus a TIME line), every rank with a
CHECKSUM line of its parameters, so that the replicas can be checked to be bitwise identical.
"""

from __future__ import annotations

import argparse
import time
from types import SimpleNamespace
from typing import Any, Optional

import digits_common
import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from sparse_options import add_sparse_arguments, sparse_compression
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler
from torch_digits import (
    build_model,
    checksum,
    evaluate,
    load_data,
    parameter_count,
)
from tqdm import tqdm

from gtopk_hvd.torch.ddp import end_process_group


def parse_args(argv: Optional[list[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    digits_common.add_common_arguments(
        parser, compression="gradient compression (none: DDP's all-reduce; fp16: PyTorch's "
                            "fp16 hook; topk/gtopk: gtopk_hvd's hook)",
        seed="seed of the model and the sampler")
    add_sparse_arguments(parser)
    parser.add_argument("--start-iter", type=int, default=2,
                        help="topk/gtopk: iterations of plain all-reduce first (at least 2)")
    parser.add_argument("--backend", default="gloo", help="torch.distributed backend")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    args = parser.parse_args(argv)
    digits_common.check_common_arguments(parser, args)
    if args.start_iter < 2:
        parser.error("--start-iter must be at least 2")
    return args


def register_compression(args: argparse.Namespace, model: DDP, steps_per_epoch: int) -> Any:
    """The one place that differs from a plain DDP script; returns the hook state, if any."""
    if args.compression == "none":
        return None
    if args.compression == "fp16":
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

        model.register_comm_hook(None, default_hooks.fp16_compress_hook)
        return None
    from gtopk_hvd.torch.ddp import GTopkHookState, gtopk_hook

    state = GTopkHookState(compression=sparse_compression(args, steps_per_epoch),
                           start_iter=args.start_iter)
    model.register_comm_hook(state, gtopk_hook)
    return state


def train_epoch(model: nn.Module, optimizer: torch.optim.Optimizer, loader: DataLoader,
                progress: tqdm) -> float:
    """One pass over this worker's shard; returns the mean training loss."""
    model.train()
    losses = []
    for images, labels in loader:
        optimizer.zero_grad()
        loss = F.cross_entropy(model(images), labels)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
        progress.update(1)
        progress.set_postfix(loss=f"{losses[-1]:.4f}", refresh=False)
    return float(np.mean(losses)) if losses else float("nan")


def bytes_sent(args: argparse.Namespace, state: Any, params: int, workers: int) -> tuple[int,
                                                                                        float]:
    """Bytes this worker sent in the last step (all buckets) and the density sent."""
    stats = None
    if state is not None and state.last_stats:
        buckets = list(state.last_stats.values())
        stats = SimpleNamespace(bytes_sent=sum(s.bytes_sent for s in buckets),
                                density=buckets[0].density)
    if args.compression == "fp16":
        return digits_common.dense_bytes_per_step("fp16", params, workers), 1.0
    return digits_common.communication(args.compression, args.density, stats, params, workers)


def train(args: argparse.Namespace) -> None:
    rank, workers = dist.get_rank(), dist.get_world_size()

    train_set, test_set = load_data()
    sampler = DistributedSampler(train_set, num_replicas=workers, rank=rank, shuffle=True,
                                 seed=args.seed)
    loader = DataLoader(train_set, batch_size=args.batch_size, sampler=sampler)

    model = DDP(build_model(args.seed))  # broadcasts rank 0's parameters
    corrected = args.momentum_correction and args.compression not in digits_common.DENSE
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr * workers,
                                momentum=0.0 if corrected else args.momentum)
    state = register_compression(args, model, len(loader))

    show = rank == 0 and not args.quiet
    start = time.perf_counter()
    with tqdm(total=args.epochs * len(loader), disable=not show, desc="train") as progress:
        for epoch in range(args.epochs):
            sampler.set_epoch(epoch)
            train_loss = train_epoch(model, optimizer, loader, progress)
            if show:
                accuracy, test_loss = evaluate(model.module, test_set)
                progress.write(f"epoch {epoch + 1}/{args.epochs} train_loss={train_loss:.4f} "
                               f"test_loss={test_loss:.4f} test_accuracy={accuracy:.4f}")
    dist.barrier()  # rank 0's progress bar is closed before any rank prints its results
    seconds = time.perf_counter() - start

    accuracy, test_loss = evaluate(model.module, test_set)
    params = parameter_count(model)
    sent, density = bytes_sent(args, state, params, workers)
    if rank == 0:
        digits_common.emit(digits_common.result_line(
            compression=args.compression, density=density, workers=workers, epochs=args.epochs,
            test_accuracy=accuracy, test_loss=test_loss, bytes_per_step=sent, params=params))
        digits_common.emit(f"TIME train_seconds={seconds:.2f}")
    digits_common.emit(digits_common.checksum_line(rank, checksum(model.module)))


def main() -> None:
    args = parse_args()
    dist.init_process_group(args.backend)
    torch.set_num_threads(1)
    train(args)
    end_process_group()


if __name__ == "__main__":
    main()
