"""The selection time a step adds on a device: gtopk_hvd's fused error-feedback top-k
(`ops.accumulate_select`: r += g, the top k of |r| selected, their entries cleared), for the
planner.

A GPU's is affine in d through two measured points (launches, then one pass over memory):

    t_select(d) = t_1 + (d - d_1) (t_2 - t_1) / (d_2 - d_1)

measured at density 0.001 and used at every density. "cpu" is this machine's, measured when
asked (`measure_select_s`): never a CPU's time added to a GPU's compute.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

MEASURE_AT_MOST = 1 << 25


@dataclass(frozen=True)
class MeasuredDevice:
    card: str
    points: tuple[tuple[int, float], tuple[int, float]]  # (d, seconds), two sizes
    source: str  # the command, commit and run the points come from

    def select_s(self, d: int) -> float:
        (d1, t1), (d2, t2) = self.points
        return max(t1 * d / d1 if d < d1 else t1 + (d - d1) * (t2 - t1) / (d2 - d1), 0.0)


DEVICES = {
    "h200": MeasuredDevice(
        "NVIDIA H200", ((25_600_000, 0.359e-3), (1_000_000_000, 7.07e-3)),
        "scripts/gpu/gpu_step.py, the fused kernel at density 0.001, run 1 of 2026-11-26 at "
        "f1cdd17 (results/gpu/HISTORY.md, Runs 1 and 2)"),
}
CHOICES = (*DEVICES, "cpu")


def measure_select_s(d: int, density: float, repeats: int = 3) -> float:
    """Median seconds of ops.accumulate_select here at d values (measured on at most 2^25,
    scaled linearly beyond)."""
    from gtopk_hvd import ops

    n = min(d, MEASURE_AT_MOST)
    rng = np.random.default_rng(0)
    gradient = rng.standard_normal(n, dtype=np.float32)
    residual = np.zeros(n, dtype=np.float32)
    k = max(1, int(density * n))
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        ops.accumulate_select(gradient, residual, k)
        times.append(time.perf_counter() - start)
    return float(np.median(times)) * d / n


def select_s(device: str, d: int, density: float) -> float:
    """Seconds of selection per step on `device` (one of CHOICES) at d and density."""
    if device == "cpu":
        return measure_select_s(d, density)
    if device not in DEVICES:
        raise ValueError(f"unknown device {device!r}; one of {CHOICES} (or give --select-ms)")
    return DEVICES[device].select_s(d)


def describe(device: str) -> str:
    if device == "cpu":
        return "measured on this machine's CPU"
    return f"{DEVICES[device].card}, {DEVICES[device].source}"
