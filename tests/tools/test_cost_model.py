"""gtopk_hvd.bench.cost_model: the alpha-beta terms, the fit and the scaling efficiency."""

from __future__ import annotations

import math

import numpy as np
import pytest

from gtopk_hvd.bench import cost_model


@pytest.mark.parametrize("workers,rounds", [(1, 0), (2, 1), (3, 3), (4, 2), (5, 4), (7, 4),
                                            (8, 3), (12, 5), (1024, 10)])
def test_gtopk_rounds_follow_the_recursive_doubling_schedule(workers: int, rounds: int) -> None:
    assert cost_model.gtopk_rounds(workers) == rounds


def test_terms_are_the_notes_formulas() -> None:
    d, k = 25_557_032, 25_557
    assert cost_model.terms("dense", 8, d, k) == (14, 2 * 7 / 8 * 4 * d)
    assert cost_model.terms("topk", 8, d, k) == (7, 7 * 8 * k)
    assert cost_model.terms("gtopk", 32, d, k) == (5, 5 * 8 * k)
    with pytest.raises(ValueError, match="unknown scheme 'ring'"):
        cost_model.terms("ring", 8, d, k)


def synthetic(scheme: str, alpha: float, beta: float, noise: float = 0.0) -> list[dict]:
    rng = np.random.default_rng(1)
    rows = []
    for workers in (2, 4, 8, 16):
        for d in (269_722, 14_728_266, 25_557_032):
            for density in (0.001, 0.01):
                k = int(d * density)
                messages, sent = cost_model.terms(scheme, workers, d, k)
                seconds = (messages * alpha + sent * beta) * (1 + noise * rng.standard_normal())
                rows.append({"workers": workers, "d": d, "k": k, f"{scheme}_s": seconds})
    return rows


@pytest.mark.parametrize("scheme", cost_model.FITTED)
def test_the_fit_recovers_known_latency_and_bandwidth(scheme: str) -> None:
    rows = synthetic(scheme, alpha=80e-6, beta=8e-9)
    model = cost_model.fit(scheme, rows)
    assert math.isclose(model.alpha, 80e-6, rel_tol=1e-6)
    assert math.isclose(model.beta, 8e-9, rel_tol=1e-6)
    assert max(map(abs, cost_model.relative_errors(model, rows))) < 1e-6


def test_a_fit_on_small_worker_counts_predicts_larger_ones_within_the_noise() -> None:
    rows = synthetic("gtopk", alpha=100e-6, beta=10e-9, noise=0.05)
    model = cost_model.fit("gtopk", [r for r in rows if r["workers"] <= 4])
    held_out = [r for r in rows if r["workers"] > 4]
    assert np.median(np.abs(cost_model.relative_errors(model, held_out))) < 0.1


def test_fit_needs_two_multi_worker_measurements() -> None:
    with pytest.raises(ValueError, match="at least two"):
        cost_model.fit("dense", [{"workers": 1, "d": 10, "k": 1, "dense_s": 0.0}])


def test_scaling_efficiency() -> None:
    dense = cost_model.LinkModel("dense", alpha=0.0, beta=8e-9)
    gtopk = cost_model.LinkModel("gtopk", alpha=0.0, beta=8e-9)
    # Dense at P = 2 sends 4d bytes: 4 * 1e6 * 8 ns = 32 ms against 96 ms of computation.
    assert math.isclose(cost_model.scaling_efficiency(dense, 2, 10**6, 1000, 0.096, 0.5), 0.75)
    # Sparse schemes pay the selection: 96 / (96 + 32 + 1 round * 8 kB * 8 ns).
    expected = 0.096 / (0.096 + 0.032 + 8000 * 8e-9)
    assert math.isclose(cost_model.scaling_efficiency(gtopk, 2, 10**6, 1000, 0.096, 0.032),
                        expected)
