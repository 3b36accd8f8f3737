"""The benchmark commands run end to end and print their ratios (small sizes; no timing is
asserted: the machines are shared)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from helpers.mpi_launcher import REPO_ROOT, mpirun_command, run_mpi, run_with_time_limit

from gtopk_hvd import _C


def bench(*args: str) -> str:
    result = subprocess.run([sys.executable, "-m", "gtopk_hvd.bench", *args], cwd=REPO_ROOT,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


def test_bench_merge_prints_its_ratios() -> None:
    output = bench("merge", "--ks", "1000", "70000", "--d", "1000000", "--overlap", "0.3",
                   "--repeats", "1")
    rows = [line for line in output.splitlines() if line.strip().startswith(("1,000", "70,000"))]
    assert len(rows) == 2, output
    assert all(len(row.split("|")) == 3 for row in rows), output
    assert f"CPU SIMD: {_C.simd_level()} (ours, float32 / int32)" in output, output


def test_bench_topk_prints_its_ratios_and_simd_level() -> None:
    output = bench("topk", "--sizes", "200000", "--densities", "0.001", "--repeats", "1",
                   "--torch-repeats", "1", "--device", "cpu")
    assert f"CPU SIMD: {_C.simd_level()} (ours, float32)" in output, output
    row = next(line.split() for line in output.splitlines() if line.startswith("cpu "))
    assert row[1:3] == ["200,000", "200"] and len(row) == 12, output
    assert "hint ms: ours given threshold_hint" in output and " ours (" in output, output


def test_bench_select_prints_every_pass_and_its_selected_count() -> None:
    output = bench("select", "--sizes", "200000", "--workers", "1", "4", "--repeats", "1",
                   "--sketch")
    passes = ("read", "accumulate", "topk fused", "topk alone", "micro P=1", "1-pass P=1",
              "micro P=4", "1-pass P=4", "sketch 5x10k")
    rows = {name: line for line in output.splitlines() for name in passes
            if line.strip().startswith("200,000") and f" {name} " in line}
    assert set(rows) == set(passes), output
    selected = {name: int(rows[name].split()[-1].replace(",", "")) for name in passes}
    assert selected["topk fused"] == 200
    assert abs(selected["micro P=1"] - 200) <= 20 and abs(selected["micro P=4"] - 50) <= 5


SCHEMES = ("dense", "topk", "gtopk", "gtopk-exact", "micro", "exdyna", "sketch")


def scheme_rows(output: str) -> dict[str, list[str]]:
    return {line.split()[0]: line.split() for line in output.splitlines()
            if line.split() and line.split()[0] in SCHEMES}


@pytest.mark.mpi
def test_bench_schemes_bytes_follow_their_formulas_under_mpirun(tmp_path: Path) -> None:
    """Every scheme's bytes per worker per step on 4 workers within 10% of its formula; the
    JSON holds the same rows with a measured latency."""
    output = run_mpi("gtopk_hvd/bench/__main__.py", 4, "schemes", "--parameters", "200000",
                     "--steps", "3", "--schemes", *SCHEMES, "--json", str(tmp_path / "rows.json"),
                     timeout_s=300)
    rows = scheme_rows(output)
    assert len(rows) == len(SCHEMES), output
    for name, row in rows.items():
        assert abs(float(row[4]) - 1) <= 0.1, (name, row)
    records = json.loads((tmp_path / "rows.json").read_text())
    assert [r["scheme"] for r in records] == list(SCHEMES)
    assert all(r["workers"] == 4 and r["d"] == 200_000 and r["seconds"] > 0
               and 0 < r["latency_s"] < 0.1 and r["gradients"] == "random" for r in records)
    assert [round(r["bytes"]) for r in records] == [int(row[2].replace(",", ""))
                                                     for row in rows.values()]


def recorded_sets(path: Path, workers: int, d: int, count: int) -> None:
    """A --record-k-sets file: each worker's `count` entries, half of them shared."""
    rng = np.random.default_rng(4)
    shared = rng.choice(d, count // 2, replace=False)
    indices = np.stack([np.sort(np.union1d(shared, rng.choice(
        np.setdiff1d(np.arange(d), shared), count - count // 2, replace=False)))
        for _ in range(workers)]).astype(np.int32)
    values = (1 + rng.random((workers, count), dtype=np.float32)) * rng.choice([-1, 1], count)
    np.savez(path, d=d, workers=workers, density=0.01, indices=indices, values=values)


@pytest.mark.mpi
def test_bench_schemes_replays_recorded_k_sets(tmp_path: Path) -> None:
    """With --k-sets each worker's gradient is its recorded one: Top-k's union of 4 workers'
    sets that share half their entries is 2.5 k (random sets: about 4 k)."""
    d = 100_000
    recorded_sets(tmp_path / "sets.npz", 4, d, 1000)  # k = 0.01 d
    output = run_mpi("gtopk_hvd/bench/__main__.py", 4, "schemes", "--k-sets",
                     str(tmp_path / "sets.npz"), "--density", "0.01", "--steps", "2",
                     "--schemes", "topk", "gtopk", timeout_s=300)
    assert f"d = {d:,}" in output and "recorded in" in output, output
    rows = scheme_rows(output)
    assert float(rows["topk"][1]) == pytest.approx(2.5, abs=0.05), rows
    assert float(rows["gtopk"][4]) == pytest.approx(1.0, abs=0.01), rows
    status, failed = run_with_time_limit(
        mpirun_command(2, [sys.executable, str(REPO_ROOT / "gtopk_hvd/bench/__main__.py"),
                           "schemes", "--k-sets", str(tmp_path / "sets.npz")]),
        300, "bench schemes --k-sets on the wrong number of workers")
    assert status != 0 and "holds 4 workers' sets; this job has 2 workers" in failed, failed


def test_bench_step_prints_phases_and_floors() -> None:
    output = bench("step", "--parameters", "200000", "--tensors", "7", "--density", "0.01",
                   "--steps", "2")
    for expected in ("plain SGD step", "gtopk_hvd step", "write", "floors:",
                     "x (accumulate_select + zero)"):
        assert expected in output, output


@pytest.mark.mpi
def test_bench_step_under_mpirun() -> None:
    output = run_mpi("gtopk_hvd/bench/__main__.py", 2, "step", "--parameters", "200000",
                     "--tensors", "7", "--steps", "2", "--scheme", "topk", timeout_s=300)
    assert "workers: 2" in output and "communicate" in output, output[-3000:]


@pytest.mark.mpi
@pytest.mark.parametrize(("launcher", "transport"), [("mpirun", "mpi"),
                                                     ("horovodrun", "horovod"),
                                                     ("torchrun", "torch")])
def test_bench_comm_on_each_transport(launcher: str, transport: str) -> None:
    output = run_mpi("gtopk_hvd/bench/__main__.py", 2, "comm", "--transport", transport,
                     "--models", "resnet20", "--densities", "0.01", "--repeats", "1",
                     timeout_s=300, launcher=launcher)
    assert f"workers: 2; transport: {transport}" in output, output[-3000:]
    row = next(line for line in output.splitlines() if "resnet20" in line)
    assert len(row.split("|")) == 5, row  # model, dense, topk, gtopk, ratios
