"""The elastic examples' data and checksum (examples/elastic_torch.py, examples/elastic_ddp.py):
a regression generated here, the same on every worker, and a short digest of the weights."""

from __future__ import annotations

import hashlib

import numpy as np
import torch

FEATURES, SAMPLES = 32, 4096


def dataset() -> tuple[torch.Tensor, torch.Tensor]:
    """x (SAMPLES x FEATURES, standard normal) and y = tanh(x w / sqrt(FEATURES)) + 0.1 noise."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((SAMPLES, FEATURES)).astype(np.float32)
    w = rng.standard_normal(FEATURES).astype(np.float32)
    y = np.tanh(x @ w / np.sqrt(FEATURES)) + 0.1 * rng.standard_normal(SAMPLES)
    return torch.from_numpy(x), torch.from_numpy(y.astype(np.float32)).unsqueeze(1)


def checksum(model: torch.nn.Module) -> str:
    digest = hashlib.sha256()
    for p in model.parameters():
        digest.update(p.detach().numpy().tobytes())
    return digest.hexdigest()[:16]
