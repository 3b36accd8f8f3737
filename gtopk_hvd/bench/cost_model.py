"""The alpha-beta cost model of one step's communication, fitted to measurements.

Per worker and step, P workers, d parameters, k = density * d entries, alpha = seconds per
message (latency), beta = seconds per byte, and (m, b) the step's messages and bytes:

    T = m alpha + b beta
    dense ring all-reduce      m = 2 (P-1), b = 2 (P-1)/P 4 d
    a sparse scheme            its own wire cost (`Scheme.wire`, in the scheme's module)

Each scheme gets its own (alpha, beta): beta then absorbs what a scheme does per byte besides
sending it (the dense sum, gTop-k's merges), alpha what it does per round. The fit is a
non-negative least squares on relative errors, so that short and long steps weigh alike.
Scaling efficiency with t_compute seconds of computation and t_select seconds of selection per
step, communication not overlapped: e(P) = t_compute / (t_compute + t_select + T(P)).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import numpy as np
from scipy.optimize import nnls

from gtopk_hvd.compression import wire_cost
from gtopk_hvd.reductions.gtopk_reduction import gtopk_rounds  # noqa: F401  (the rounds' one home)
from gtopk_hvd.schemes import known_scheme_names

FITTED = ("dense", "topk", "gtopk")
"""The configurations whose links are fitted (`fit`)."""


def terms(scheme: str, workers: int, d: int, k: int) -> tuple[float, float]:
    """(messages, bytes) of one worker's step: T = messages * alpha + bytes * beta; dense's ring
    all-reduce, a sparse scheme's own wire cost (`gtopk_hvd.compression.wire_cost`)."""
    p = workers
    if scheme == "dense":
        return 2.0 * (p - 1), 2.0 * (p - 1) / p * 4 * d
    if scheme not in known_scheme_names():
        raise ValueError(f"unknown scheme {scheme!r}; one of dense, "
                         f"{', '.join(known_scheme_names())}")
    return wire_cost(scheme, workers, d, k)


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
