"""What the GPU check's Python stages share (scripts/gpu/gpu_check.sh runs them): ResNet-50's
parameter shapes without torchvision, the models, an incremental JSON writer, a stack dump on
SIGTERM.

Each stage script writes one JSON file and rewrites it after every measurement, so a stage cut
short by its time box (or the whole call by its limit) still leaves what it measured.
"""

from __future__ import annotations

import faulthandler
import json
import os
import signal
import sys
import traceback
from pathlib import Path
from typing import Any

import torch
from torch import nn

RESNET50_PARAMETERS = 25_557_032
RESNET50_TENSORS = 161


def resnet50_shapes() -> list[tuple[int, ...]]:
    """The 161 parameter shapes of torchvision's ResNet-50, in its parameter order (conv
    weights, batch-norm weights and biases, the classifier): 25,557,032 values."""
    shapes: list[tuple[int, ...]] = [(64, 3, 7, 7), (64,), (64,)]
    inplanes = 64
    for planes, blocks in ((64, 3), (128, 4), (256, 6), (512, 3)):
        for block in range(blocks):
            width, out = planes, planes * 4
            shapes += [(width, inplanes, 1, 1), (width,), (width,),
                       (width, width, 3, 3), (width,), (width,),
                       (out, width, 1, 1), (out,), (out,)]
            if block == 0:
                shapes += [(out, inplanes, 1, 1), (out,), (out,)]
            inplanes = out
    shapes += [(1000, 2048), (1000,)]
    return shapes


def numel(shape: tuple[int, ...]) -> int:
    count = 1
    for n in shape:
        count *= n
    return count


def resnet50_sizes() -> list[int]:
    return [numel(shape) for shape in resnet50_shapes()]


def make_model(name: str) -> tuple[nn.Module, tuple[int, ...], int, str]:
    """(module, input shape without the batch, classes, what it is) for `name`:
    "resnet50": torchvision's if installed, else a model with ResNet-50's 161 parameter tensors
    and a cheap forward ("resnet50-shapes": the step's sizes are right, its compute is not);
    "tiny": a small CNN for CPU runs."""
    if name == "resnet50":
        try:
            import torchvision
        except ImportError:
            return ShapesModel(resnet50_shapes(), 1000), (3, 32, 32), 1000, \
                "resnet50-shapes (torchvision missing: ResNet-50's tensors, not its compute)"
        return torchvision.models.resnet50(weights=None), (3, 224, 224), 1000, \
            f"torchvision {torchvision.__version__} resnet50"
    if name == "tiny":
        model = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
                              nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(),
                              nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 10))
        return model, (3, 8, 8), 10, "tiny CNN (CPU dry run)"
    raise SystemExit(f"unknown model {name!r}")


class ShapesModel(nn.Module):
    """Parameters of the given shapes; logits from the pooled input times the last two
    (classifier) tensors, plus a small term touching every other tensor so that each has a
    gradient."""

    def __init__(self, shapes: list[tuple[int, ...]], classes: int) -> None:
        super().__init__()
        self.weights = nn.ParameterList(nn.Parameter(torch.randn(s) * 0.01) for s in shapes)
        self.classes = classes

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        *body, weight, bias = self.weights
        features = x.flatten(1).mean(1, keepdim=True).expand(-1, weight.shape[1])
        touch = sum(p.float().mean() for p in body)
        return features @ weight.t() + bias + touch


class JsonRecord:
    """A dict written to `path` (atomically) each time `save()` is called."""

    def __init__(self, path: str | None, **fields: Any) -> None:
        self.path = path
        self.data: dict[str, Any] = dict(fields)

    def save(self) -> None:
        if not self.path:
            return
        tmp = f"{self.path}.tmp"
        with open(tmp, "w") as file:
            json.dump(self.data, file, indent=1, default=str)
        os.replace(tmp, self.path)


def error_record(error: BaseException) -> dict[str, str]:
    """An exception as the report shows it: type, message, and the last frames."""
    lines = traceback.format_exception(type(error), error, error.__traceback__)
    return {"error": f"{type(error).__name__}: {error}"[:2000],
            "traceback": "".join(lines)[-4000:]}


def dump_stacks_on_term() -> None:
    """On SIGTERM (the stage's `timeout`), print every thread's stack before dying: a hang
    shows where it hung."""
    faulthandler.register(signal.SIGTERM, file=sys.stderr, all_threads=True, chain=True)


def ensure_parent(path: str | None) -> None:
    if path:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
