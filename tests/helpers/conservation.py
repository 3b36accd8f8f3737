"""Checks shared by the schemes' thread-worker tests: identical replicas and conservation."""

from __future__ import annotations

import numpy as np


def check_replicas_and_conservation(results: list[list[dict]], gradients: np.ndarray) -> None:
    """Every worker applied the same (indices, values) at every step, bit for bit, and what was
    applied (values are averages: x P) plus every worker's last residual equals the sum of all
    the gradients (float64 sums, to float32 rounding). results[rank][step] holds "indices",
    "values" and "residual"; gradients has shape (workers, steps, d)."""
    workers, steps, d = gradients.shape
    applied = np.zeros(d, np.float64)
    for t in range(steps):
        for rank in range(1, workers):
            np.testing.assert_array_equal(results[rank][t]["indices"], results[0][t]["indices"])
            np.testing.assert_array_equal(results[rank][t]["values"], results[0][t]["values"])
        applied[results[0][t]["indices"]] += results[0][t]["values"].astype(np.float64) * workers
    residuals = sum(results[rank][-1]["residual"].astype(np.float64) for rank in range(workers))
    np.testing.assert_allclose(applied + residuals, gradients.astype(np.float64).sum(axis=(0, 1)),
                               rtol=1e-5, atol=1e-4)
