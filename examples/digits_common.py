"""What the digits examples (pytorch_digits, tensorflow2_digits, keras_digits) share.

The options every script takes, scikit-learn's digits split the same way on every worker, the
shard of the training set a worker sees (the TensorFlow scripts), the bytes sent per step, and
the lines the scripts end with. Rank 0 prints one machine-readable line,

    RESULT compression=.. density=.. workers=.. epochs=.. test_accuracy=.. test_loss=..
        bytes_per_step=.. params=..

(on one line), and every rank prints `CHECKSUM rank=<r> <sha256 of its parameters>` so that the
replicas can be checked to be bitwise identical. The scripts run as `python examples/<name>.py`,
which puts this folder on sys.path: they `import digits_common`.
"""

from __future__ import annotations

import argparse
import hashlib
import math
import sys
from collections.abc import Iterable
from typing import Any

import numpy as np
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

COMPRESSIONS = ("none", "fp16", "topk", "gtopk", "gtopk-exact", "micro", "exdyna", "sketch",
                "oktopk")
DENSE = ("none", "fp16")  # Horovod's dense allreduce; the others are gtopk_hvd's sparse ones

_HELP = {
    "compression": "gradient compression (none/fp16: Horovod's; the others gtopk_hvd's "
                   "sparse schemes)",
    "epochs": "passes over the training set",
    "seed": "seed of the model and the shards",
}


def add_common_arguments(parser: argparse.ArgumentParser, **help_texts: str) -> None:
    """--compression, --density, --epochs, --batch-size, --lr, --momentum and --seed.

    `help_texts` replaces the help of compression, epochs or seed (keyed by the option's dest).
    """
    unknown = set(help_texts) - set(_HELP)
    if unknown:
        raise TypeError(f"no help text to replace for {sorted(unknown)}")
    helps = {**_HELP, **help_texts}
    parser.add_argument("--compression", choices=COMPRESSIONS, default="gtopk",
                        help=helps["compression"])
    parser.add_argument("--density", type=float, default=0.01,
                        help="fraction k/d of gradient entries sent (sparse schemes)")
    parser.add_argument("--epochs", type=int, default=30, help=helps["epochs"])
    parser.add_argument("--batch-size", type=int, default=32, help="batch size per worker")
    parser.add_argument("--lr", type=float, default=0.02,
                        help="learning rate per worker (scaled by the number of workers)")
    parser.add_argument("--momentum", type=float, default=0.9, help="SGD momentum")
    parser.add_argument("--seed", type=int, default=42, help=helps["seed"])


def check_common_arguments(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Exits through `parser.error` when a common option is out of range."""
    if not 0.0 < args.density <= 1.0:
        parser.error("--density must be in (0, 1]")


def load_digits_split(
    image_shape: tuple[int, ...] = (8, 8, 1),
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """x_train, y_train, x_test, y_test: the digits, pixels scaled to [0, 1] (float32, each
    image reshaped to `image_shape`), labels int64, split 80/20 the same way on every worker."""
    digits = load_digits()
    images = (digits.images / 16.0).astype(np.float32).reshape(-1, *image_shape)
    labels = digits.target.astype(np.int64)
    x_train, x_test, y_train, y_test = train_test_split(
        images, labels, test_size=0.2, random_state=0, stratify=labels)
    return x_train, y_train, x_test, y_test


def shard(count: int, seed: int, rank: int, workers: int) -> np.ndarray:
    """This worker's sample indices: one permutation (from `seed`) shared by all workers,
    padded (by wrapping) to a multiple of the worker count, every workers-th from `rank`, so
    every worker gets as many samples, hence runs as many steps (as torch's DistributedSampler
    does)."""
    order = np.random.default_rng(seed).permutation(count)
    total = math.ceil(count / workers) * workers
    order = np.concatenate([order, order[:total - count]])
    return order[rank::workers]


def dense_bytes_per_step(compression: str, params: int, workers: int) -> int:
    """Bytes each worker sends per step in Horovod's dense all-reduce (a ring): 2 (P - 1) / P
    values of 4 bytes (none) or 2 bytes (fp16) per parameter."""
    value_bytes = 4 if compression == "none" else 2
    return int(2 * (workers - 1) / workers * value_bytes * params)


def communication(compression: str, density: float, stats: Any, params: int,
                  workers: int) -> tuple[int, float]:
    """Bytes each worker sent in the last step, and the density sent.

    gtopk_hvd reports both for its sparse compressions in `stats` (its `last_stats`, None
    before the first step); the dense ones follow `dense_bytes_per_step`.
    """
    if compression in DENSE:
        return dense_bytes_per_step(compression, params, workers), 1.0
    if stats is None:
        return 0, density
    return int(stats.bytes_sent), float(stats.density)


def sha256_hex(arrays: Iterable[Any]) -> str:
    """The sha256 of the arrays' bytes, one after the other."""
    digest = hashlib.sha256()
    for array in arrays:
        digest.update(np.asarray(array).tobytes())
    return digest.hexdigest()


def result_line(*, compression: str, density: float, workers: int, epochs: int,
                test_accuracy: float, test_loss: float, bytes_per_step: int,
                params: int) -> str:
    """The RESULT line rank 0 ends with."""
    return (f"RESULT compression={compression} density={density:g} "
            f"workers={workers} epochs={epochs} test_accuracy={test_accuracy:.4f} "
            f"test_loss={test_loss:.4f} bytes_per_step={bytes_per_step} params={params}")


def checksum_line(rank: int, checksum: str) -> str:
    """The CHECKSUM line every rank ends with."""
    return f"CHECKSUM rank={rank} {checksum}"


def emit(line: str) -> None:
    """Print a whole line in one write, so that lines from several ranks never run together."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()
