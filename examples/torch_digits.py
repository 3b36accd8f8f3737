"""What the two PyTorch digits examples share (the Horovod one, pytorch_digits.py, and the DDP
one, ddp_digits.py): the data as tensors, the CNN, the evaluation and the checksum. Imports
neither Horovod nor torch.distributed."""

from __future__ import annotations

import digits_common
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset


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
