"""What the two PyTorch digits examples share (the Horovod one, pytorch_digits.py, and the DDP
one, ddp_digits.py): the data as tensors, the CNN, the evaluation, the checksum, and the sparse
compression the command line asks for. Imports neither Horovod nor torch.distributed."""

from __future__ import annotations

import argparse

import digits_common
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset

from gtopk_hvd.compression import DGC_WARMUP, Compression, SparseCompression


def load_data() -> tuple[TensorDataset, TensorDataset]:
    """The digits as 1x8x8 images, split 80/20 the same way on every worker."""
    x_train, y_train, x_test, y_test = digits_common.load_digits_split((1, 8, 8))
    return (TensorDataset(torch.from_numpy(x_train), torch.from_numpy(y_train)),
            TensorDataset(torch.from_numpy(x_test), torch.from_numpy(y_test)))


def build_model(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(
        nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(),
        nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(32 * 4 * 4, 64), nn.ReLU(),
        nn.Linear(64, 10),
    )


def add_sparse_arguments(parser: argparse.ArgumentParser) -> None:
    """--warmup-epochs and --momentum-correction, read by sparse_compression."""
    parser.add_argument("--warmup-epochs", type=float, default=0.0,
                        help="topk/gtopk: DGC's density warm-up (0.25, 0.0625, 0.015625, 0.004; "
                             "the stages above --density) spread over the first N epochs")
    parser.add_argument("--momentum-correction", action="store_true",
                        help="topk/gtopk: DGC's momentum correction (the momentum moves from "
                             "SGD into the sparsified accumulation)")


def sparse_compression(args: argparse.Namespace, steps_per_epoch: int) -> SparseCompression:
    """--compression topk|gtopk at --density, with the DGC warm-up over --warmup-epochs (its
    densities above --density, in equal stages) and --momentum-correction."""
    factory = getattr(Compression, args.compression)  # .topk or .gtopk (argparse choices)
    stages = tuple(density for density in DGC_WARMUP if density > args.density)
    stage_steps = round(args.warmup_epochs * steps_per_epoch / len(stages)) if stages else 0
    return factory(density=args.density, warmup_densities=stages,
                   warmup_steps=stage_steps if args.warmup_epochs > 0 else 0,
                   momentum_correction=args.momentum_correction, momentum=args.momentum)


@torch.no_grad()
def evaluate(model: nn.Module, test_set: TensorDataset) -> tuple[float, float]:
    """Accuracy and mean cross-entropy over the whole test set (same on every replica)."""
    model.eval()
    images, labels = test_set.tensors
    logits = model(images)
    loss = F.cross_entropy(logits, labels).item()
    accuracy = (logits.argmax(dim=1) == labels).float().mean().item()
    return accuracy, loss


def parameter_count(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def checksum(model: nn.Module) -> str:
    return digits_common.sha256_hex(
        tensor.detach().cpu().numpy() for tensor in model.state_dict().values())
