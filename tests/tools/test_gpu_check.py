"""The GPU check (scripts/gpu/gpu_check.sh) on the CPU: its Python stages in their CPU mode
at tiny sizes, the report writer on what they wrote (every stage and every target in the report),
the shell scripts' syntax, and the whole script in its dry mode on a few stages. What it measures
needs a GPU; that its parts run, write their JSON and reach the report does not."""

from __future__ import annotations

import gzip
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = REPO_ROOT / "scripts" / "gpu"
sys.path.insert(0, str(SCRIPTS))

import gpu_report  # noqa: E402


def run_script(*args: str, timeout_s: float = 240) -> str:
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "OMP_NUM_THREADS": "1"}
    result = subprocess.run([sys.executable, *args], cwd=REPO_ROOT, capture_output=True,
                            text=True, timeout=timeout_s, env=env)
    assert result.returncode == 0, (result.stdout[-3000:], result.stderr[-3000:])
    return result.stdout


@pytest.fixture(scope="module")
def figures(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A work folder as gpu_check.sh leaves it, from the CPU modes of the stage scripts."""
    work = tmp_path_factory.mktemp("gpu_check")
    (work / "logs").mkdir()
    run_script(str(SCRIPTS / "gpu_e2e.py"), "--device", "cpu", "--model", "tiny", "--batch", "4",
               "--steps", "2", "--warmup", "1", "--schemes", "dense", "gtopk-0.001",
               "--precisions", "float32", "float16-amp", "--syncs",
               "--trace", "dense", "gtopk-0.001", "--json", str(work / "e2e.json"))
    run_script(str(SCRIPTS / "gpu_step.py"), "--device", "cpu", "--sizes", "5e4", "--steps", "1",
               "--schemes", "gtopk", "gtopk-exact", "sketch", "--granularity-steps", "1",
               "--json", str(work / "step.json"))
    run_script("-m", "gtopk_hvd.bench", "topk", "--device", "cpu", "--sizes", "1e5",
               "--densities", "0.001", "--repeats", "1", "--torch-repeats", "1",
               "--json", str(work / "topk.json"))
    run_script(str(SCRIPTS / "gpu_profile.py"), "--device", "cpu", "--topk-d", "5e4",
               "--step-d", "5e4", "--schemes", "gtopk", "--update-schemes", "gtopk",
               "--repeats", "1",
               "--json", str(work / "profile.json"))
    run_script(str(SCRIPTS / "gpu_machine.py"), "build", str(work / "build.json"))
    (work / "logs" / "tests.log").write_text("....\n4 passed, 1 skipped in 3.2s\n")
    (work / "test_figures.jsonl").write_text(
        json.dumps({"figure": "hook_host_syncs", "scheme": "micro", "iterations": [4, 5, 6],
                    "skipped_iteration": 5, "torch_on_gpu": [2, 0, 2],
                    "cpu_model": [3, 1, 3]}) + "\n" + '{"figure": "hook_host_sy')  # cut short
    (work / "stages.tsv").write_text(
        "machine\tskipped\t99\t0\t30\tnot in this test\n"
        "ddp_e2e\tok\t0\t10\t200\t\n"
        "step_memory\tok\t0\t5\t120\t\n"
        "tests\tok\t0\t3\t400\t4 passed, 1 skipped in 3.2s\n"
        "horovod_run\tfailed\t1\t2\t120\tno Horovod wheel\n")
    return work


def test_the_stage_scripts_write_their_figures(figures: Path) -> None:
    e2e = json.loads((figures / "e2e.json").read_text())
    runs = {(r["precision"], r["scheme"]): r for r in e2e["runs"]}
    assert set(runs) == {(p, s) for p in ("float32", "float16-amp")
                         for s in ("dense", "gtopk-0.001")}
    for run in runs.values():
        assert "error" not in run, run
        assert run["timed_steps"] >= 1 and run["median_s"] > 0
    assert runs["float32", "gtopk-0.001"]["ratio_to_dense"] > 0
    assert "runtime_blocking_calls_per_step" in runs["float32", "gtopk-0.001"]["syncs"]
    assert runs["float16-amp", "dense"]["skipped_steps"] >= 1  # GradScaler from 2^24 overflows
    for scheme in ("dense", "gtopk-0.001"):  # one float32 step's timeline each
        trace = runs["float32", scheme]["trace"]
        assert trace["path"] == f"trace_{scheme}.json.gz", trace
        with gzip.open(figures / trace["path"]) as file:
            events = json.load(file)["traceEvents"]
        assert any("backward" in str(e.get("name", "")).lower() for e in events)
        assert trace["bytes"] == (figures / trace["path"]).stat().st_size < 8 << 20
    assert "trace" not in runs["float16-amp", "gtopk-0.001"]
    step = json.loads((figures / "step.json").read_text())
    entry = step["sizes"]["50000"]
    assert set(entry["schemes"]) == {"gtopk", "gtopk-exact", "sketch"}
    assert all("ratio_to_fused" in r and "update_ratio_to_fused" in r
               for r in entry["schemes"].values()), entry
    assert entry["exact_over_gtopk"] > 0
    assert step["granularity"]["tensors"] == 161 and step["granularity"]["bucket_over_model"] > 0
    profile = json.loads((figures / "profile.json").read_text())["cases"]
    assert set(profile) == {"read@50000", "topk@50000", "fused@50000", "gtopk@50000",
                            "gtopk-update@50000"}
    for case in profile.values():  # on the CPU no device kernel: all of the wall is the host's
        assert "error" not in case, case
        assert case["wall_us"] > 0 and case["device_busy_us"] == 0
        assert case["host_and_idle_us"] == case["wall_us"]


def test_the_report_has_every_stage_and_target(figures: Path, tmp_path: Path) -> None:
    run_script(str(SCRIPTS / "gpu_report.py"), str(figures), "--md", str(tmp_path / "r.md"),
               "--json", str(tmp_path / "r.json"))
    markdown = (tmp_path / "r.md").read_text()
    report = json.loads((tmp_path / "r.json").read_text())
    for name, _ in gpu_report.STAGES:
        assert f"| {name}: " in markdown, name
    assert [s["stage"] for s in report["stages"]] == [name for name, _ in gpu_report.STAGES]
    assert {s["stage"]: s["status"] for s in report["stages"]}["horovod_build"] == "not run"
    for target, _ in gpu_report.TARGETS:
        assert f"| {target}: " in markdown, target
        assert any(row["target"] == target for row in report["targets"]), target
    verdicts = {(row["target"], row["figure"]): row["met"] for row in report["targets"]}
    assert verdicts["tests", "pytest"] is True
    assert verdicts["host_syncs", "DDP hook test, 3 buckets, micro"] is True
    assert verdicts["build", "ops.cuda_built"] is not None
    assert any(t == "ddp_step" and met is not None for (t, _), met in verdicts.items())
    assert any(t == "step_vs_fused" and met is not None for (t, _), met in verdicts.items())
    horovod = [row for row in report["targets"] if row["target"] == "horovod_amp"]
    assert horovod and horovod[0]["met"] is None and "failed" in horovod[0]["note"]
    assert "Targets:" in markdown and report["figures"]["e2e"]["runs"]


def test_the_report_survives_an_empty_work_folder(tmp_path: Path) -> None:
    report = gpu_report.Report(tmp_path)
    report.evaluate()
    markdown = report.markdown()
    assert all(row["met"] is None for row in report.targets)
    assert {row["target"] for row in report.targets} == {t for t, _ in gpu_report.TARGETS}
    assert markdown.count("| not run |") == len(gpu_report.STAGES)


@pytest.mark.parametrize("script", ["gpu_check.sh", "gpu_bundle.sh"])
def test_the_shell_scripts_parse(script: str) -> None:
    subprocess.run(["bash", "-n", str(SCRIPTS / script)], check=True)
    if shutil.which("shellcheck"):
        result = subprocess.run(["shellcheck", str(SCRIPTS / script)], capture_output=True,
                                text=True)
        assert result.returncode == 0, result.stdout


def test_the_check_runs_dry_on_the_cpu(tmp_path: Path) -> None:
    """gpu_check.sh end to end in its CPU mode, on the quick stages (one of them asked to fail:
    the next still runs, and the report says so)."""
    out = tmp_path / "out"
    env = {**os.environ, "GPU_CHECK_DEVICE": "cpu", "GPU_CHECK_PYTHON": sys.executable,
           "OUT": str(out), "GPU_CHECK_WORK": str(tmp_path / "work"),
           "GPU_CHECK_STAGES": "machine build bench_topk horovod_build",
           "GPU_CHECK_BUNDLE": str(tmp_path / "no-bundle"), "OMP_NUM_THREADS": "1"}
    result = subprocess.run(["bash", str(SCRIPTS / "gpu_check.sh")], cwd=REPO_ROOT, env=env,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, (result.stdout[-3000:], result.stderr[-3000:])
    assert sorted(p.name for p in out.iterdir()) == [
        "gpu_check.log", "gpu_logs.tar.gz", "gpu_report.json", "gpu_report.md"]
    stages = {s["stage"]: s for s in json.loads((out / "gpu_report.json").read_text())["stages"]}
    assert stages["machine"]["status"] == "ok"
    assert stages["build"]["status"] == "ok"
    assert stages["bench_topk"]["status"] == "ok"
    assert stages["horovod_build"]["status"] == "failed"  # no bundle: recorded, not fatal
    assert "gpu_bundle.sh" in stages["horovod_build"]["note"]
    assert stages["tests"]["status"] == "not run"


def test_the_baseline_stage_measures_another_tree_on_the_same_machine(tmp_path: Path) -> None:
    """GPU_CHECK_BASELINE: ddp_e2e's and step_memory's measurements run again on another tree's
    Python (here a copy of this one's, without its extension: the stage copies the build in),
    and the report sets each configuration's two figures side by side."""
    baseline = tmp_path / "baseline"
    shutil.copytree(REPO_ROOT / "gtopk_hvd", baseline / "gtopk_hvd",
                    ignore=shutil.ignore_patterns("_C*.so", "__pycache__"))
    out = tmp_path / "out"
    env = {**os.environ, "GPU_CHECK_DEVICE": "cpu", "GPU_CHECK_PYTHON": sys.executable,
           "OUT": str(out), "GPU_CHECK_WORK": str(tmp_path / "work"),
           "GPU_CHECK_STAGES": "ddp_e2e step_memory baseline",
           "GPU_CHECK_BASELINE": str(baseline), "OMP_NUM_THREADS": "1",
           "GPU_CHECK_E2E_ARGS": "--schemes dense gtopk-0.001 --precisions float32"}
    result = subprocess.run(["bash", str(SCRIPTS / "gpu_check.sh")], cwd=REPO_ROOT, env=env,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, (result.stdout[-3000:], result.stderr[-3000:])
    report = json.loads((out / "gpu_report.json").read_text())
    stages = {s["stage"]: s for s in report["stages"]}
    assert stages["baseline"]["status"] == "ok", stages["baseline"]
    assert list(baseline.glob("gtopk_hvd/_C*.so")), "the build was not copied in"
    assert [(r["precision"], r["scheme"]) for r in report["figures"]["e2e_baseline"]["runs"]] == [
        ("float32", "dense"), ("float32", "gtopk-0.001")]
    markdown = (out / "gpu_report.md").read_text()
    for row in ("| float32 | dense |", "| float32 | gtopk-0.001 |"):
        line = markdown[markdown.index("against the baseline"):].split(row)[1].split("\n")[0]
        assert line.rstrip().endswith("% |"), line  # both medians, and the change
    assert "| 200,000 | gtopk | update() |" in markdown


def test_the_end_to_end_in_rounds_times_every_configuration_in_each_round(
        tmp_path: Path) -> None:
    """gpu_e2e.py --rounds: a precision's configurations side by side, --steps timed steps each
    per round; the figure the median over all rounds' steps, each round's median recorded, and
    the float32 counts and traces taken after the rounds as without them."""
    out = tmp_path / "e2e.json"
    run_script(str(SCRIPTS / "gpu_e2e.py"), "--device", "cpu", "--model", "tiny", "--batch", "4",
               "--steps", "2", "--warmup", "1", "--rounds", "3", "--schemes", "dense",
               "gtopk-0.001", "--precisions", "float32", "float16-amp", "--syncs", "--trace",
               "gtopk-0.001", "--json", str(out))
    runs = {(r["precision"], r["scheme"]): r for r in json.loads(out.read_text())["runs"]}
    assert set(runs) == {(p, s) for p in ("float32", "float16-amp")
                         for s in ("dense", "gtopk-0.001")}
    for run in runs.values():
        assert "error" not in run, run
        assert run["timed_steps"] == 6 and len(run["round_medians_s"]) == 3
        assert run["steps_done"] == 6 + 2 + 1  # DDP's 2 dense iterations and 1 warm-up step
        assert run["ratio_to_dense"] > 0
    assert runs["float32", "dense"]["ratio_to_dense"] == 1.0
    assert "runtime_blocking_calls_per_step" in runs["float32", "gtopk-0.001"]["syncs"]
    assert (tmp_path / runs["float32", "gtopk-0.001"]["trace"]["path"]).exists()
    assert runs["float16-amp", "dense"]["skipped_steps"] >= 1
