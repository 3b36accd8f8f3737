"""gtopk_hvd.fsdp_plan: FSDP's traffic and step, against closed forms worked out by hand from the
strategies (the bytes the sparse comm counts are checked under torchrun,
tests/torch/test_fsdp.py)."""

from __future__ import annotations

import math
import subprocess
import sys

import pytest

from gtopk_hvd import fsdp_plan

D, UNITS, RATE = 24_000_000, 12, 1e9


def step(reduction: str, strategy: str, compute_s: float, latency_s: float = 0.0,
         workers: int = 8, unit_select_s: float = 0.0) -> fsdp_plan.FSDPStep:
    return fsdp_plan.predict(reduction, workers, D, UNITS, strategy, RATE, latency_s, compute_s,
                             unit_select_s, 0.01)


@pytest.mark.parametrize("strategy, share", [("full-shard", 1 / 3), ("shard-grad-op", 1 / 2)])
def test_the_reduce_scatter_is_a_third_or_a_half_of_fsdps_bytes(strategy: str,
                                                                 share: float) -> None:
    dense = step("dense", strategy, 0.1)
    assert dense.reduce_bytes / dense.bytes_sent == pytest.approx(share)
    shard = D // (UNITS * 8)
    assert dense.bytes_sent == UNITS * (1 / share) * 7 * shard * 4
    sparse = step("sparse", strategy, 0.1)
    assert sparse.reduce_bytes == UNITS * (8 * math.ceil(0.01 * shard) * 7 + 4)
    assert sparse.bytes_sent - sparse.reduce_bytes == dense.bytes_sent - dense.reduce_bytes


@pytest.mark.parametrize("reduction", ["dense", "sparse"])
@pytest.mark.parametrize("strategy", ["full-shard", "shard-grad-op"])
def test_without_compute_the_step_is_the_links_time(reduction: str, strategy: str) -> None:
    predicted = step(reduction, strategy, 0.0, latency_s=20e-6)
    assert predicted.step_s == pytest.approx(predicted.link_s)


@pytest.mark.parametrize("reduction", ["dense", "sparse"])
@pytest.mark.parametrize("strategy, gathers", [("full-shard", 2), ("shard-grad-op", 1)])
def test_with_long_compute_only_the_first_gathers_and_the_last_reduction_show(
        reduction: str, strategy: str, gathers: int) -> None:
    """Forward waits for the first unit's all-gather, FULL_SHARD's backward for the last
    unit's second one, and the first unit's reduce-scatter (and its selection) is ready only
    when backward ends: compute + gathers x one all-gather + one unit's reduction."""
    compute, select = 50.0, 0.002
    predicted = step(reduction, strategy, compute, unit_select_s=select)
    shard = D // (UNITS * 8)
    gather = 7 * shard * 4 * 8 / RATE
    if reduction == "dense":
        tail = 7 * shard * 4 * 8 / RATE
    else:
        tail = UNITS * select + (8 * math.ceil(0.01 * shard) * 7 + 4) * 8 / RATE
    assert predicted.step_s == pytest.approx(compute + gathers * gather + tail)


def test_the_sparse_reduction_pays_where_the_link_binds_and_not_at_one_worker() -> None:
    assert step("sparse", "full-shard", 0.01).step_s < step("dense", "full-shard", 0.01).step_s
    alone = [step(reduction, "full-shard", 0.3, workers=1) for reduction in ("dense", "sparse")]
    assert alone[0].step_s == alone[1].step_s == pytest.approx(0.3)
    assert alone[0].bytes_sent == alone[1].bytes_sent == 0


def test_the_command_prints_both_rows_and_a_verdict_per_p() -> None:
    result = subprocess.run([sys.executable, "-m", "gtopk_hvd.fsdp_plan", "--params", "350M",
                             "--workers", "8", "32", "--compute-ms", "300", "--units", "24"],
                            capture_output=True, text=True, check=True)
    rows = [line.split() for line in result.stdout.splitlines()
            if line.split() and line.split()[0] in ("8", "32")]
    assert [(row[0], row[1]) for row in rows] == [("8", "FSDP's"), ("8", "sparse"),
                                                  ("32", "FSDP's"), ("32", "sparse")]
    assert "can save at most" in result.stdout and "A model, not a measurement" in result.stdout
    assert "fewer than that many times FSDP's steps" in result.stdout


def test_time_to_target_pays_only_where_the_step_gain_beats_the_extra_steps() -> None:
    steps = [step(reduction, "full-shard", 0.01, workers=p) for p in (8, 32)
             for reduction in ("dense", "sparse")]
    gain = steps[0].step_s / steps[1].step_s
    assert 1.0 < gain < 1.5  # at most the third FULL_SHARD's reduce-scatter is of the bytes
    assert "it pays at P = 8, 32" in fsdp_plan.verdict(steps, "full-shard", gain * 0.9)
    assert "it pays at no P given" in fsdp_plan.verdict(steps, "full-shard", 1.8)
