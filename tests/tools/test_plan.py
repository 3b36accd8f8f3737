"""The planner (gtopk_hvd.plan): its bytes are what the schemes send, its arithmetic is the
model's, and its command line picks a scheme and refuses bad input by name."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from gtopk_hvd import plan
from gtopk_hvd.compression import Compression
from gtopk_hvd.simulate import SimulatedCluster

CONFIGS = {
    "dense": None,
    "topk": Compression.topk(0.01),
    "gtopk": Compression.gtopk(0.01),
    "gtopk-exact": Compression.gtopk(0.01, exact=True),
    "micro": Compression.micro(0.01),
    "exdyna": Compression.exdyna(0.01),
    "sketch": Compression.sketch(0.01),
}


@pytest.mark.parametrize("workers", [4, 8])
@pytest.mark.parametrize("scheme", list(CONFIGS))
def test_planned_bytes_are_what_the_simulated_workers_send(scheme: str, workers: int) -> None:
    d = 40_000
    cluster = SimulatedCluster(CONFIGS[scheme], [d], workers)
    rng = np.random.default_rng(3)
    sent = []
    for _ in range(4):
        for gradient in cluster.gradients:
            gradient[:] = rng.standard_t(3, d)
        cluster.reduce()
        sent.append(max(cluster.bytes_sent))
    cluster.close()
    _, planned = plan.messages_and_bytes(scheme, workers, d, int(0.01 * d))
    measured = float(np.mean(sent[1:]))  # the threshold schemes settle after their first step
    assert planned == pytest.approx(measured, rel=0.12), (scheme, planned, sent)


def test_prediction_is_the_model() -> None:
    p = plan.predict("gtopk", 16, 1_000_000, 0.001, 1e9, 50e-6, 0.1, 0.01)
    comm = 4 * 50e-6 + 4 * 8 * 1000 * 8 / 1e9
    assert p.comm_s == pytest.approx(comm)
    assert p.step_s == pytest.approx(0.1 + 0.01 + comm)
    assert p.efficiency == pytest.approx(0.1 / (0.11 + comm))
    dense = plan.predict("dense", 16, 1_000_000, 0.001, 1e9, 50e-6, 0.1, 0.01)
    assert dense.step_s == pytest.approx(0.1 + 30 * 50e-6 + 2 * 15 / 16 * 4e6 * 8 / 1e9)


def test_command_line_picks_the_fastest_and_refuses_bad_input() -> None:
    command = [sys.executable, "-m", "gtopk_hvd.plan", "--params", "25.6M", "--workers", "4",
               "32", "--compute-ms", "200", "--select-ms", "5", "--link", "1gbit",
               "--density", "0.001", "--schemes", "topk", "gtopk", "micro"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    steps_table = done.stdout.split("Time to target")[0]
    picks = [line.split()[1] for line in steps_table.splitlines() if "<- fastest step" in line]
    assert picks == ["micro", "gtopk"], done.stdout  # fewest bytes at 4, fewest messages at 32
    bad = subprocess.run([*command[:3], "--params", "many", "--compute-ms", "1"],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "--params" in bad.stderr


def test_fitted_link_shares_slow_each_scheme_by_its_own(tmp_path) -> None:
    """--links: a scheme whose transfers achieved half the rate takes twice the byte time."""
    fit = tmp_path / "model.json"
    fit.write_text(json.dumps({"link_share": {"dense": 0.5, "gtopk": 0.8}}))
    shares = plan.link_shares(str(fit))
    assert shares["dense"] == 0.5 and shares["gtopk"] == 0.8 and shares["topk"] == 1.0
    full = plan.predict("dense", 16, 1_000_000, 0.001, 1e9, 50e-6, 0.1, 0.0)
    half = plan.predict("dense", 16, 1_000_000, 0.001, 1e9, 50e-6, 0.1, 0.0, shares["dense"])
    latency = 30 * 50e-6
    assert half.comm_s - latency == pytest.approx(2 * (full.comm_s - latency))
    done = subprocess.run([sys.executable, "-m", "gtopk_hvd.plan", "--params", "25.6M",
                           "--workers", "32", "--compute-ms", "200", "--select-ms", "5",
                           "--links", str(fit)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "dense 50%" in done.stdout and "gtopk 80%" in done.stdout, done.stdout


def write_run(folder, scheme: str, density: float, workers: int,
              perplexities: list[float]) -> None:
    """A run as scripts/studies/scale_study.py writes it (the fields the planner reads)."""
    name = "dense" if scheme == "none" else f"{scheme}_{density:g}"
    history = {"params": 1000, "workers": workers, "steps": 25 * len(perplexities),
               "compression": scheme, "density_asked": density,
               "evaluations": [{"step": 25 * (i + 1), "valid_perplexity": value,
                                "bytes_per_step": 8.0}
                               for i, value in enumerate(perplexities)]}
    (folder / f"lm_{name}_p{workers}.json").write_text(json.dumps(history))


def test_time_to_target_counts_the_measured_steps_times_the_modelled_step(tmp_path) -> None:
    from gtopk_hvd import convergence

    write_run(tmp_path, "none", 1.0, 8, [100.0, 60.0, 50.0])           # target 1.1 x 50 = 55
    write_run(tmp_path, "topk", 0.01, 8, [90.0, 54.0, 49.0])           # reaches it at 50
    write_run(tmp_path, "gtopk", 0.001, 8, [95.0, 70.0, 56.0])         # never
    (tmp_path / "lm_dense_p8_lr0.5.json").write_text("{}")             # a sweep: not read
    runs = convergence.load_runs(tmp_path)
    target, steps = convergence.steps_to_target(runs, 8, 1.1)
    assert target == pytest.approx(55.0)
    assert steps == {"dense": 75, "topk_0.01": 50, "gtopk_0.001": None}
    assert convergence.steps_to_target(runs, 8, 1.0)[1]["topk_0.01"] == 75
    with pytest.raises(ValueError, match="no dense run measured at P = 16"):
        convergence.steps_to_target(runs, 16, 1.1)

    args = dict(d=25_600_000, rate_bps=1e9, latency_s=50e-6, compute_s=0.05,
                select_s={0.01: 0.002, 0.001: 0.001},
                shares=dict.fromkeys(plan.configurations(), 1.0))
    _, rows = plan.times_to_target(runs, 8, 1.1, **args)
    by_name = {row.config: row for row in rows}
    # dense: the modelled all-reduce (its bytes are the formula's); topk_0.01: the run's 8 bytes
    # per step at d = 1000, scaled to 25.6M, replace the formula's bytes
    dense = plan.predict("dense", 8, 25_600_000, 1.0, 1e9, 50e-6, 0.05, 0.0)
    assert by_name["dense"].seconds == pytest.approx(steps["dense"] * dense.step_s)
    topk = plan.predict("topk", 8, 25_600_000, 0.01, 1e9, 50e-6, 0.05, 0.002)
    step = topk.step_s + (8.0 * 25_600 - topk.bytes_sent) * 8.0 / 1e9
    assert by_name["topk_0.01"].seconds == pytest.approx(steps["topk_0.01"] * step)
    # with the model's buckets, dense's step is the pipelined one
    model = plan.Model(25_600_000)
    _, rows = plan.times_to_target(runs, 8, 1.1, **args, model=model, overlap=1.0)
    pipelined = plan.predict_baseline("dense", 8, model, 1e9, 50e-6, 0.05, 1.0)
    assert pipelined.step_s < dense.step_s
    assert {row.config: row for row in rows}["dense"].seconds == pytest.approx(
        steps["dense"] * pipelined.step_s)
    assert by_name["gtopk_0.001"].seconds is None

    out = subprocess.run([sys.executable, "-m", "gtopk_hvd.plan", "--params", "25.6M",
                          "--workers", "8", "16", "--compute-ms", "50", "--select-ms", "2",
                          "--near", "1.1", "--convergence", str(tmp_path)],
                         capture_output=True, text=True, check=True).stdout
    target_tables = out.split("Time to target")[1]
    picked = [line for line in target_tables.splitlines() if "<- pick" in line]
    assert len(picked) == 1 and "topk_0.01" in picked[0], out
    assert "-(75)" in out and "P = 16: no measured run" in out


def test_another_studys_runs_are_read_by_their_names_with_their_dense_start(tmp_path) -> None:
    """The transformer's histories (scripts/studies/adamw_study.sh): any name, the configuration
    named by the file less -p<P>; a dense start's steps (k = d) take dense's modelled step. The
    scale study's seeds and digits runs in the same folder are not read."""
    from gtopk_hvd import convergence

    def history(compression: str, density: float, perplexities: list[float],
                dense_start: int = 0) -> dict:
        steps = 25 * len(perplexities)
        return {"params": 1000, "workers": 32, "steps": steps, "compression": compression,
                "density_asked": density,
                "sparse_steps": [{"k": 1000 if step < dense_start else 10, "selected": 10}
                                 for step in range(steps if compression != "none" else 0)],
                "evaluations": [{"step": 25 * (i + 1), "valid_perplexity": value,
                                 "bytes_per_step": 0.0 if compression == "none" else 80.0}
                                for i, value in enumerate(perplexities)]}

    runs = {"dense-p32": history("none", 1.0, [80.0, 50.0]),
            "topk-0.01-preconditioned-dense30-p32": history("topk", 0.01, [70.0, 49.0], 30),
            "lm_topk_0.01_p32_seed7": history("topk", 0.01, [10.0, 10.0]),
            "digits_topk_0.01_p32": history("topk", 0.01, [10.0, 10.0])}
    for name, run in runs.items():
        (tmp_path / f"{name}.json").write_text(json.dumps(run))
    loaded = {run.name: run for run in convergence.load_runs(tmp_path)}
    assert sorted(loaded) == ["dense", "topk-0.01-preconditioned-dense30"]
    assert loaded["topk-0.01-preconditioned-dense30"].dense_steps == 30
    assert convergence.describe(list(loaded.values()), tmp_path) == f"the runs in {tmp_path}"

    shares = dict.fromkeys(plan.configurations(), 1.0)
    _, rows = plan.times_to_target(list(loaded.values()), 32, 1.0, 1000, 1e9, 50e-6, 0.004,
                                   {0.01: 0.0005}, shares)
    by_name = {row.config: row for row in rows}
    dense_step = plan.predict("dense", 32, 1000, 1.0, 1e9, 50e-6, 0.004, 0.0).step_s
    topk = plan.predict("topk", 32, 1000, 0.01, 1e9, 50e-6, 0.004, 0.0005)
    topk_step = topk.step_s + (80.0 - topk.bytes_sent) * 8.0 / 1e9
    assert by_name["dense"].seconds == pytest.approx(50 * dense_step)
    assert by_name["topk-0.01-preconditioned-dense30"].seconds == pytest.approx(
        30 * dense_step + 20 * topk_step)
