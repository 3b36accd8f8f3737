"""scikit-learn's digits as flat float32 pixels in [0, 1] and int64 labels, split 80/20 the same
way on every worker (for the programs under tests/mpi that train to an accuracy)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import numpy as np
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split


def digits_split() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """x_train, y_train, x_test, y_test."""
    digits = load_digits()
    x = (digits.images / 16.0).astype(np.float32).reshape(-1, 64)
    x_train, x_test, y_train, y_test = train_test_split(
        x, digits.target.astype(np.int64), test_size=0.2, random_state=0,
        stratify=digits.target)
    return x_train, y_train, x_test, y_test


def model_seed() -> int:
    """The seed of a test program's model: GTOPK_TEST_SEED, else 0. The suite runs with 0;
    scripts/studies/accuracy_spread.py varies it to measure the spread the thresholds must allow."""
    return int(os.environ.get("GTOPK_TEST_SEED", "0"))


def worker_batches(count: int, epochs: int, rank: int, size: int, batch: int) -> Iterator[Any]:
    """This worker's batches of sample indices (torch tensors), epoch after epoch: one shared
    permutation per epoch, every size-th sample from `rank`, whole batches only."""
    import torch

    for epoch in range(epochs):
        order = torch.randperm(count, generator=torch.Generator().manual_seed(epoch))
        mine = order[rank::size]
        for start in range(0, len(mine) - batch + 1, batch):
            yield mine[start:start + batch]
