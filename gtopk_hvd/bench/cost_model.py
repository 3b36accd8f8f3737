"""The alpha-beta cost model of one step's communication, fitted to measurements.

Per worker and step, P workers, d parameters, k = density * d entries of 8 bytes (int32 index,
float32 value), alpha = seconds per message (latency), beta = seconds per byte:

    dense ring all-reduce      T = 2 (P-1) alpha + 2 (P-1)/P * 4 d * beta
    Top-k all-gather           T = (P-1) alpha   + (P-1) * 8 k * beta
    gTop-k recursive doubling  T = R alpha       + R * 8 k * beta,   R = ceil(log2 P) rounds,
                                                                      + 2 when P is not 2^n

Each scheme gets its own (alpha, beta): beta then absorbs what a scheme does per byte besides
sending it (the dense sum, gTop-k's merges), alpha what it does per round. The fit is a
non-negative least squares on relative errors, so that short and long steps weigh alike.
Scaling efficiency with t_compute seconds of computation and t_select seconds of selection per
step, communication not overlapped: e(P) = t_compute / (t_compute + t_select + T(P)).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import numpy as np
from scipy.optimize import nnls

SCHEMES = ("dense", "topk", "gtopk")
VALUE_BYTES = 8  # one int32 index + one float32 value


def gtopk_rounds(workers: int) -> int:
    """Message rounds of gTop-k's recursive doubling, with fold-in/fold-out when P != 2^n."""
    if workers <= 1:
        return 0
    below = 1 << (workers.bit_length() - 1)
    return int(math.log2(below)) + (2 if below != workers else 0)


def terms(scheme: str, workers: int, d: int, k: int) -> tuple[float, float]:
    """(messages, bytes) of one worker's step: T = messages * alpha + bytes * beta."""
    p = workers
    if scheme == "dense":
        return 2.0 * (p - 1), 2.0 * (p - 1) / p * 4 * d
    if scheme == "topk":
        return float(p - 1), float((p - 1) * VALUE_BYTES * k)
    if scheme == "gtopk":
        rounds = gtopk_rounds(p)
        return float(rounds), float(rounds * VALUE_BYTES * k)
    raise ValueError(f"unknown scheme {scheme!r}; expected one of {SCHEMES}")


@dataclass(frozen=True)
class LinkModel:
    """A scheme's fitted latency (seconds per message) and inverse bandwidth (seconds/byte)."""

    scheme: str
    alpha: float
    beta: float

    def seconds(self, workers: int, d: int, k: int) -> float:
        messages, sent = terms(self.scheme, workers, d, k)
        return messages * self.alpha + sent * self.beta


def fit(scheme: str, measurements: Iterable[Mapping]) -> LinkModel:
    """Fits (alpha, beta) to measurements with keys workers, d, k and `<scheme>_s`."""
    rows = [m for m in measurements if m["workers"] > 1]
    if len(rows) < 2:
        raise ValueError(f"{scheme}: need at least two measurements with more than one worker")
    design = np.array([terms(scheme, m["workers"], m["d"], m["k"]) for m in rows])
    measured = np.array([m[f"{scheme}_s"] for m in rows])
    weights = 1.0 / measured
    column_scale = design.max(axis=0)
    column_scale[column_scale == 0] = 1.0
    solution, _ = nnls(design / column_scale * weights[:, None], measured * weights)
    alpha, beta = solution / column_scale
    return LinkModel(scheme, float(alpha), float(beta))


def relative_errors(model: LinkModel, measurements: Iterable[Mapping]) -> list[float]:
    """(predicted - measured) / measured for each measurement."""
    return [(model.seconds(m["workers"], m["d"], m["k"]) - m[f"{model.scheme}_s"])
            / m[f"{model.scheme}_s"] for m in measurements]


def scaling_efficiency(model: LinkModel, workers: int, d: int, k: int, compute_s: float,
                       select_s: float = 0.0) -> float:
    """e(P) = t_compute / (t_compute + t_select + T(P)) (module docstring)."""
    overhead = select_s if model.scheme != "dense" else 0.0
    return compute_s / (compute_s + overhead + model.seconds(workers, d, k))
