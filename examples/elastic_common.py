"""What the elastic examples share (examples/elastic_torch.py, elastic_ddp.py, elastic_keras.py):
the training options, a regression generated here (the same on every worker), each step's rows,
a short digest of the weights, and the fault injection: its options, the SIGKILL and the clock
from the kill to the first step after it."""

from __future__ import annotations

import argparse
import hashlib
import os
import signal
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

FEATURES, SAMPLES = 32, 4096


def add_training_options(parser: argparse.ArgumentParser, steps: int, marker: str) -> None:
    """--compression, --density, --steps, --batch, --lr, --compute-ms and --marker."""
    parser.add_argument("--compression", default="gtopk", choices=["gtopk", "topk", "none"])
    parser.add_argument("--density", type=float, default=0.05)
    parser.add_argument("--steps", type=int, default=steps)
    parser.add_argument("--batch", type=int, default=96, help="global batch per step")
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--compute-ms", type=float, default=0.0,
                        help="sleep this long per step (stands for a bigger model's compute)")
    parser.add_argument("--marker", type=Path, default=Path(marker),
                        help="written at the kill (its time); no second kill while it exists")


def add_kill_options(parser: argparse.ArgumentParser) -> None:
    """--kill-rank, --kill-at and --kill-phase (the Elastic Horovod examples)."""
    parser.add_argument("--kill-rank", type=int, default=None,
                        help="the worker started as this rank kills itself (SIGKILL), once")
    parser.add_argument("--kill-at", type=int, default=10, help="at this step")
    parser.add_argument("--kill-phase", choices=["reduction", "commit"], default="reduction",
                        help="die where the others are in the sparse step, or in the commit")


def arrays() -> tuple[np.ndarray, np.ndarray]:
    """x (SAMPLES x FEATURES, standard normal) and y = tanh(x w / sqrt(FEATURES)) + 0.1 noise
    (SAMPLES x 1), float32."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((SAMPLES, FEATURES)).astype(np.float32)
    w = rng.standard_normal(FEATURES).astype(np.float32)
    y = np.tanh(x @ w / np.sqrt(FEATURES)) + 0.1 * rng.standard_normal(SAMPLES)
    return x, y.astype(np.float32)[:, None]


def dataset() -> tuple[Any, Any]:
    """`arrays()` as torch tensors."""
    import torch

    x, y = arrays()
    return torch.from_numpy(x), torch.from_numpy(y)


def step_rows(step: int, batch: int, rank: int, size: int) -> np.ndarray:
    """This worker's rows of step `step`'s global batch (a partition over the current workers,
    so it stays one after a reset)."""
    rows = np.random.default_rng(step).choice(SAMPLES, batch, replace=False)
    return np.array_split(rows, size)[rank]


def digest(values: Iterable[np.ndarray]) -> str:
    """The first 16 hex digits of the SHA-256 of the arrays' bytes."""
    hashed = hashlib.sha256()
    for value in values:
        hashed.update(np.ascontiguousarray(value).tobytes())
    return hashed.hexdigest()[:16]


def checksum(model: Any) -> str:
    """`digest` of a torch module's parameters."""
    return digest(p.detach().numpy() for p in model.parameters())


def die(marker: Path) -> None:
    """SIGKILL this worker, the time written to `marker` first."""
    marker.write_text(str(time.time()))
    os.kill(os.getpid(), signal.SIGKILL)


class RecoveryClock:
    """Seconds from the kill (the time `die` wrote to the marker) to the first step this worker
    completes at a number of workers it had not trained at before; None until then. Lives
    across Elastic Horovod's resets (made outside the retried function)."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker
        self.sizes: set[int] = set()
        self.seconds: float | None = None

    def step_done(self, size: int) -> None:
        if (self.seconds is None and self.sizes and size not in self.sizes
                and self.marker.exists()):
            self.seconds = time.time() - float(self.marker.read_text())
        self.sizes.add(size)
