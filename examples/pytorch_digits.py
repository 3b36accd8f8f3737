"""Horovod PyTorch training of a small CNN on scikit-learn's digits, with gTop-k as one option.

A plain Horovod script (hvd.init, a DistributedSampler shard per worker, broadcast of parameters
and optimizer state, hvd.DistributedOptimizer) in which one call, `distributed_optimizer`, picks
the distributed optimizer: Horovod's own for --compression none/fp16, gtopk_hvd's for topk/gtopk.
The data (1797 8x8 images, 10 classes) ships with scikit-learn, so nothing is downloaded.

    mpirun --allow-run-as-root --oversubscribe -np 4 -x OMP_NUM_THREADS=1 \\
        .venv/bin/python examples/pytorch_digits.py --compression gtopk --density 0.01

Rank 0 ends with a machine-readable RESULT line and every rank with a CHECKSUM line of its
parameters, so that the replicas can be checked to be bitwise identical (see digits_common).
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Optional

import digits_common
import horovod.torch as hvd
import numpy as np
import torch
import torch.nn.functional as F
from sparse_options import add_sparse_arguments, sparse_compression
from step_timing import StepTimer, timed_step
from torch import nn
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

import gtopk_hvd.torch as gtopk  # before hvd.init(): under mpirun it loads MPI first


def parse_args(argv: Optional[list[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    digits_common.add_common_arguments(parser, seed="seed of the model and the sampler")
    parser.add_argument("--backward-passes-per-step", type=int, default=1,
                        help="micro-batches per batch, gradients accumulated before each step")
    parser.add_argument("--checkpoint", metavar="PATH", default=None,
                        help="save model and optimizer state at the end, one file per worker: "
                             "PATH.rank<r> (sparse compression keeps a residual per worker)")
    parser.add_argument("--resume", metavar="PATH", default=None,
                        help="resume from the files --checkpoint PATH wrote (same worker count)")
    add_sparse_arguments(parser)
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    parser.add_argument("--history", metavar="PATH", default=None,
                        help="rank 0 writes each epoch's training loss (mean over workers), "
                             "test loss and test accuracy to PATH as JSON (topk/gtopk: also "
                             "the density and k of each of its sparse steps)")
    args = parser.parse_args(argv)
    if args.backward_passes_per_step < 1:
        parser.error("--backward-passes-per-step must be at least 1")
    digits_common.check_common_arguments(parser, args)
    return args


def distributed_optimizer(args: argparse.Namespace, optimizer: torch.optim.Optimizer,
                          model: nn.Module, steps_per_epoch: int) -> torch.optim.Optimizer:
    """The one place that differs from a plain Horovod script."""
    if args.compression in ("none", "fp16"):
        compression = getattr(hvd.Compression, args.compression)
        return hvd.DistributedOptimizer(
            optimizer, named_parameters=model.named_parameters(), compression=compression,
            backward_passes_per_step=args.backward_passes_per_step)
    return gtopk.DistributedOptimizer(
        optimizer, named_parameters=model.named_parameters(),
        compression=sparse_compression(args, steps_per_epoch),
        backward_passes_per_step=args.backward_passes_per_step)


def worker_file(path: str) -> str:
    return f"{path}.rank{hvd.rank()}"


def load_checkpoint(path: str, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
    state = torch.load(worker_file(path), map_location="cpu")
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])


def save_checkpoint(path: str, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()},
               worker_file(path))


def train_step(model: nn.Module, optimizer: torch.optim.Optimizer, images: torch.Tensor,
               labels: torch.Tensor, passes: int, timer: StepTimer) -> float:
    """One optimizer step over a batch split into `passes` micro-batches; returns the loss."""
    def forward_backward() -> float:
        total = 0.0
        for micro_images, micro_labels in zip(images.chunk(passes), labels.chunk(passes)):
            loss = F.cross_entropy(model(micro_images), micro_labels) / passes
            loss.backward()
            total += loss.item()
        return total

    return timed_step(optimizer, forward_backward, timer)


def train_epoch(model: nn.Module, optimizer: torch.optim.Optimizer, loader: DataLoader,
                passes: int, progress: tqdm, timer: StepTimer,
                sparse_steps: list[dict]) -> tuple[float, float]:
    """One pass over this worker's shard; returns the mean training loss and the seconds the
    steps took, and appends each sparse step's density, k and global set size (its
    `last_stats`: the warm-up's stages show there) to sparse_steps."""
    model.train()
    losses = []
    start = time.perf_counter()
    for images, labels in loader:
        losses.append(train_step(model, optimizer, images, labels, passes, timer))
        stats = getattr(optimizer, "last_stats", None)  # gtopk_hvd's sparse optimizers
        if stats is not None:
            sparse_steps.append({"density": stats.density, "k": stats.k,
                                 "selected": stats.global_entries})
        progress.update(1)
        progress.set_postfix(loss=f"{losses[-1]:.4f}", refresh=False)
    seconds = time.perf_counter() - start
    return (float(np.mean(losses)) if losses else float("nan")), seconds


def main() -> None:
    args = parse_args()
    hvd.init()
    torch.set_num_threads(1)
    rank, workers = hvd.rank(), hvd.size()

    train_set, test_set = load_data()
    sampler = DistributedSampler(train_set, num_replicas=workers, rank=rank, shuffle=True,
                                 seed=args.seed)
    loader = DataLoader(train_set, batch_size=args.batch_size, sampler=sampler)

    model = build_model(args.seed)
    corrected = args.momentum_correction and args.compression not in digits_common.DENSE
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr * workers,
                                momentum=0.0 if corrected else args.momentum)
    optimizer = distributed_optimizer(args, optimizer, model, len(loader))
    if args.resume:  # after wrapping: the sparse optimizer's state holds this worker's residual
        load_checkpoint(args.resume, model, optimizer)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)

    show = rank == 0 and not args.quiet
    history, timer, seconds = [], StepTimer(), 0.0
    with tqdm(total=args.epochs * len(loader), disable=not show, desc="train") as progress:
        for epoch in range(args.epochs):
            sampler.set_epoch(epoch)
            sparse_steps: list[dict] = []
            train_loss, epoch_seconds = train_epoch(
                model, optimizer, loader, args.backward_passes_per_step, progress, timer,
                sparse_steps)
            seconds += epoch_seconds
            if args.history:  # every worker: the means are collectives
                train_loss = hvd.allreduce(torch.tensor(train_loss), op=hvd.Average,
                                           name="train_loss").item()
                phases = hvd.allreduce(torch.tensor(list(timer.means().values())),
                                       op=hvd.Average, name="phases").tolist()
            if rank == 0 and (show or args.history):
                accuracy, test_loss = evaluate(model, test_set)
                history.append({"epoch": epoch + 1, "step": (epoch + 1) * len(loader),
                                "seconds": seconds, "train_loss": train_loss,
                                "test_loss": test_loss, "test_accuracy": accuracy})
                if args.history:
                    history[-1]["phases"] = dict(zip(timer.means(), phases))
                    if sparse_steps:
                        history[-1]["sparse_steps"] = sparse_steps
                if show:
                    progress.write(f"epoch {epoch + 1}/{args.epochs} train_loss="
                                   f"{train_loss:.4f} test_loss={test_loss:.4f} "
                                   f"test_accuracy={accuracy:.4f}")
            timer.reset()
    if rank == 0 and args.history:
        with open(args.history, "w") as file:
            json.dump(history, file, indent=1)

    hvd.barrier()  # rank 0's progress bar is closed before any rank prints its results
    accuracy, test_loss = evaluate(model, test_set)
    params = parameter_count(model)
    sent, density = digits_common.communication(  # gtopk_hvd's optimizers have last_stats
        args.compression, args.density, getattr(optimizer, "last_stats", None), params, workers)
    if args.checkpoint:
        save_checkpoint(args.checkpoint, model, optimizer)
    if rank == 0:
        digits_common.emit(digits_common.result_line(
            compression=args.compression, density=density, workers=workers, epochs=args.epochs,
            test_accuracy=accuracy, test_loss=test_loss, bytes_per_step=sent, params=params))
    digits_common.emit(digits_common.checksum_line(rank, checksum(model)))


if __name__ == "__main__":
    main()
