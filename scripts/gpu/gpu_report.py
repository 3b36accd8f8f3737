"""The GPU check's report: every stage's status and every figure beside its target.

    python scripts/gpu/gpu_report.py WORK_DIR --md OUT/gpu_report.md --json OUT/gpu_report.json

Reads what scripts/gpu/gpu_check.sh leaves in WORK_DIR (any of it may be missing: a stage that did
not run or was cut short): stages.tsv (one line per stage: name, status, exit code, seconds,
time box, note), machine.json, build.json, e2e.json, step.json, topk.json, select.json,
horovod.json, test_figures.jsonl (figures the CUDA tests measured: tests/helpers/figures.py),
logs/*.log. Writes the Markdown report and one JSON with the stages, the target
rows and every figure. Runs on the standard library alone (no torch), so it can always run,
and the check script runs it after every stage.
"""

from __future__ import annotations

import argparse
import json
import math
import re
from pathlib import Path
from typing import Any

STAGES = [
    ("machine", "the machine: nvidia-smi, Python, torch, CUDA, nvcc"),
    ("build", "build the extension (pip install --no-build-isolation --no-deps -e .)"),
    ("horovod_build", "build Horovod 0.28.1 with NCCL from the bundled sdist (background)"),
    ("ddp_e2e", "DDP hook end to end: ResNet-50, every scheme, float32 / bf16 / fp16+scaler, "
                "host syncs (scripts/gpu/gpu_e2e.py)"),
    ("step_memory", "SparseStep per scheme at P = 1: time vs the fused kernel, peak memory, "
                    "granularity (scripts/gpu/gpu_step.py)"),
    ("baseline", "ddp_e2e and step_memory (d = 25.6M) on GPU_CHECK_BASELINE's Python (another "
                 "commit) with this build's extension: before and after on one machine"),
    ("profile", "where the time goes: the top-k kernel's and each step's device kernels beside "
                "its wall time (scripts/gpu/gpu_profile.py)"),
    ("bench_memory", "python -m gtopk_hvd.bench memory (when the command exists)"),
    ("bench_topk", "python -m gtopk_hvd.bench topk --device cuda"),
    ("bench_select", "python -m gtopk_hvd.bench select --device cuda"),
    ("horovod_run", "gtopk_hvd.torch.DistributedOptimizer under Horovod, float32 and the AMP "
                    "recipe (scripts/gpu/gpu_horovod.py)"),
    ("tests", "the CUDA tests (pytest -n: test_ops_cuda, test_sparse_state_devices, "
              "test_shared_types, test_ops)"),
]

TARGETS = [
    ("build", "the extension builds with its CUDA kernels (ops.cuda_built)"),
    ("tests", "every CUDA test passes"),
    ("memory", "peak extra memory of a step <= state (1x, 2x with velocity) + 0.05x gradient"),
    ("step_vs_fused", "step at P = 1 <= 1.5x the fused accumulate-and-select kernel alone, "
                      "every scheme, d = 25.6M and 1e9"),
    ("topk_vs_read", "top-k kernel <= 1.5x a read pass at d = 1e8, k = 0.1%"),
    ("topk_vs_torch", "top-k kernel >= 10x faster than torch.topk at d = 1e8, k = 0.1%"),
    ("exact_vs_gtopk", "exact gTop-k <= 1.3x plain gTop-k"),
    ("sketch_vs_read", "sketch step <= 10 read passes"),
    ("granularity", "granularity \"bucket\" <= 1.5x \"model\" (161 tensors of ResNet-50 sizes)"),
    ("ddp_step", "ResNet-50 step within +3% of DDP's all-reduce, every scheme, float32 and AMP"),
    ("ddp_amp_trains", "DDP with float16 + GradScaler: training does not raise, skipped steps "
                       "recorded"),
    ("host_syncs", "host synchronisations per step counted and stated, per scheme"),
    ("horovod_amp", "Horovod DistributedOptimizer (gtopk / topk / micro), AMP recipe on CUDA: "
                    "trains, skipped steps recorded"),
]
STEP_LIMIT, TOPK_READ_LIMIT, TOPK_TORCH_MIN = 1.5, 1.5, 10.0
EXACT_LIMIT, SKETCH_READS, GRANULARITY_LIMIT, DDP_LIMIT = 1.3, 10.0, 1.5, 1.03


def load_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def read_stages(work: Path) -> dict[str, dict]:
    stages: dict[str, dict] = {}
    path = work / "stages.tsv"
    if path.is_file():
        for line in path.read_text().splitlines():
            fields = line.split("\t")
            if len(fields) < 5:
                continue
            name, status, rc, seconds, box = fields[:5]
            stages[name] = {"status": status, "rc": _number(rc), "seconds": _number(seconds),
                            "box_s": _number(box), "note": fields[5] if len(fields) > 5 else ""}
    return stages


def _number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def tests_summary(work: Path) -> dict | None:
    """Counts from pytest's last summary line in logs/tests.log (also after an interrupt)."""
    log = work / "logs" / "tests.log"
    if not log.is_file():
        return None
    text = log.read_text(errors="replace")
    counts = {}
    for line in reversed(text.splitlines()):
        if re.search(r"\b(passed|failed|error|errors|skipped|no tests ran)\b", line) and \
                re.search(r"\bin [0-9.]+s", line):
            for count, what in re.findall(r"(\d+) (passed|failed|errors?|skipped|xfailed|"
                                          r"xpassed|deselected)", line):
                counts["errors" if what.startswith("error") else what] = int(count)
            counts["line"] = line.strip("= ").strip()
            break
    counts["interrupted"] = "KeyboardInterrupt" in text or "Interrupted" in text
    counts["failures"] = re.findall(r"^(?:FAILED|ERROR) (\S+)", text, re.M)[:40]
    return counts


def test_figures(work: Path) -> list[dict]:
    """The JSON lines of test_figures.jsonl (a line cut short by a killed test is dropped)."""
    path = work / "test_figures.jsonl"
    rows = []
    if path.is_file():
        for line in path.read_text(errors="replace").splitlines():
            try:
                rows.append(json.loads(line))
            except ValueError:
                continue
    return rows


def baseline_comparison(e2e: dict, baseline: dict | None) -> list[str]:
    """Markdown rows: each configuration's median step on the baseline's Python and on this
    tree's, measured in one call (the baseline stage), and the change."""
    if not baseline or not baseline.get("runs"):
        return []
    before = {(r["precision"], r["scheme"]): r.get("median_s") for r in baseline["runs"]}
    out = ["### DDP end to end against the baseline's Python, same machine and call", "",
           "| precision | scheme | baseline ms | this tree ms | change |",
           "| --- | --- | --- | --- | --- |"]
    for run in e2e.get("runs", []):
        old, new = before.get((run["precision"], run["scheme"])), run.get("median_s")
        out.append(f"| {run['precision']} | {run['scheme']} | {_msv(old)} | {_msv(new)} | "
                   f"{_change(old, new)} |")
    return out + [""]


def step_baseline_comparison(step: dict, baseline: dict | None) -> list[str]:
    """Markdown rows: each scheme's step() and update() medians on the baseline's Python and on
    this tree's, at the sizes both measured in one call (the baseline stage), and the change."""
    if not baseline or not baseline.get("sizes"):
        return []
    out = ["### SparseStep against the baseline's Python, same machine and call", "",
           "| d | scheme | call | baseline ms | this tree ms | change |",
           "| --- | --- | --- | --- | --- | --- |"]
    for d, entry in baseline["sizes"].items():
        ours = step.get("sizes", {}).get(d, {}).get("schemes", {})
        for name, before in entry.get("schemes", {}).items():
            for call, key in (("step()", "median_s"), ("update()", "update_median_s")):
                old, new = before.get(key), ours.get(name, {}).get(key)
                out.append(f"| {int(d):,} | {name} | {call} | {_msv(old)} | {_msv(new)} | "
                           f"{_change(old, new)} |")
    return out + [""]


class Report:
    def __init__(self, work: Path) -> None:
        self.work = work
        self.stages = read_stages(work)
        self.figures = {name: load_json(work / f"{name}.json") for name in
                        ("machine", "build", "e2e", "e2e_baseline", "step", "step_baseline",
                         "topk", "select", "horovod", "profile")}
        self.figures["tests"] = tests_summary(work)
        self.figures["test_figures"] = test_figures(work)
        self.targets: list[dict] = []

    # -- target rows ---------------------------------------------------------------------

    def add(self, target: str, figure: str, value: Any, limit: str, met: bool | None,
            note: str = "") -> None:
        self.targets.append({"target": target, "figure": figure, "value": value,
                             "limit": limit, "met": met, "note": note})

    def missing(self, target: str, stage: str) -> None:
        status = self.stages.get(stage, {}).get("status", "not run")
        self.add(target, "-", None, "-", None, f"not measured (stage {stage}: {status})")

    def evaluate(self) -> None:
        self.build_target()
        self.tests_target()
        self.step_targets()
        self.topk_targets()
        self.ddp_targets()
        self.hook_sync_targets()
        self.horovod_target()

    def build_target(self) -> None:
        build = self.figures["build"]
        if not build:
            return self.missing("build", "build")
        self.add("build", "ops.cuda_built", build.get("cuda_built"), "True",
                 bool(build.get("cuda_built")), build.get("note", ""))

    def tests_target(self) -> None:
        tests = self.figures["tests"]
        if not tests or "line" not in tests:
            return self.missing("tests", "tests")
        failed = tests.get("failed", 0) + tests.get("errors", 0)
        complete = not tests.get("interrupted") and \
            self.stages.get("tests", {}).get("status") == "ok"
        self.add("tests", "pytest", tests["line"], "0 failed, complete",
                 failed == 0 and complete,
                 "" if complete else "interrupted or cut by its time box: counts are partial")

    def step_targets(self) -> None:
        step = self.figures["step"]
        if not step or not step.get("sizes"):
            for target in ("memory", "step_vs_fused", "exact_vs_gtopk", "sketch_vs_read",
                           "granularity"):
                self.missing(target, "step_memory")
            return
        for d, entry in step["sizes"].items():
            for name, record in entry.get("schemes", {}).items():
                where = f"{name}, d = {int(d):,}"
                if "error" in record:
                    self.add("step_vs_fused", where, None, f"<= {STEP_LIMIT}x", False,
                             f"raised {record['error'][:200]}")
                    continue
                if "skipped" in record:
                    self.add("step_vs_fused", where, None, f"<= {STEP_LIMIT}x", None,
                             record["skipped"])
                    continue
                ratio = record.get("ratio_to_fused")
                self.add("step_vs_fused", where, _fmt(ratio, "x") + _ms(record["median_s"]),
                         f"<= {STEP_LIMIT}x", None if ratio is None else ratio <= STEP_LIMIT,
                         record.get("note", ""))
                update_ratio = record.get("update_ratio_to_fused")
                if update_ratio is not None:
                    self.add("step_vs_fused", f"{name} update() into a device buffer, d = "
                             f"{int(d):,}", _fmt(update_ratio, "x")
                             + _ms(record["update_median_s"]), f"<= {STEP_LIMIT}x",
                             update_ratio <= STEP_LIMIT, "what the adapters run")
                if "peak_extra_x_gradient" in record:
                    extra, limit = record["peak_extra_x_gradient"], \
                        record["memory_target_x_gradient"]
                    steady = record.get("steady_extra_x_gradient")
                    self.add("memory", where, f"{extra:.2f}x gradient" + (
                        "" if steady is None else f" (a later step alone {steady:.2f}x)"),
                        f"<= {limit:.2f}x", extra <= limit)
                if name == "sketch" and "read_passes" in record:
                    self.add("sketch_vs_read", where, _fmt(record["read_passes"], " reads"),
                             f"<= {SKETCH_READS:g} reads", record["read_passes"] <= SKETCH_READS,
                             record.get("note", ""))
            if "exact_over_gtopk" in entry:
                ratio = entry["exact_over_gtopk"]
                self.add("exact_vs_gtopk", f"d = {int(d):,}", _fmt(ratio, "x"),
                         f"<= {EXACT_LIMIT}x", ratio <= EXACT_LIMIT)
        if not any(row["target"] == "memory" for row in self.targets):
            self.add("memory", "-", None, "-", None,
                     "not measured (no CUDA peak-memory counters: a CPU run)")
        for target in ("exact_vs_gtopk", "sketch_vs_read"):
            if not any(row["target"] == target for row in self.targets):
                self.missing(target, "step_memory")
        granularity = step.get("granularity") or {}
        if "bucket_over_model" in granularity:
            ratio = granularity["bucket_over_model"]
            self.add("granularity", f"gtopk 0.001, {granularity['tensors']} tensors, d = "
                     f"{granularity['d']:,}", _fmt(ratio, "x") + " (model "
                     f"{granularity['model']['median_s'] * 1e3:.2f} ms, bucket "
                     f"{granularity['bucket']['median_s'] * 1e3:.2f} ms)",
                     f"<= {GRANULARITY_LIMIT}x", ratio <= GRANULARITY_LIMIT)
        else:
            self.missing("granularity", "step_memory")

    def topk_targets(self) -> None:
        rows = self.figures["topk"] or []
        picked = [r for r in rows if r.get("device") == "cuda" and r.get("d") == 100_000_000
                  and r.get("k") == 100_000]
        if not picked:
            picked = [r for r in rows if r.get("device") == "cpu"]  # a dry run's rows
        if not picked:
            self.missing("topk_vs_read", "bench_topk")
            self.missing("topk_vs_torch", "bench_topk")
            return
        row = picked[-1]
        where = f"{row['device']}, d = {row['d']:,}, k = {row['k']:,}"
        read_ratio, torch_ratio = row["ours"] / row["floor"], row["torch"] / row["ours"]
        self.add("topk_vs_read", where, _fmt(read_ratio, "x") + _ms(row["ours"]),
                 f"<= {TOPK_READ_LIMIT}x", read_ratio <= TOPK_READ_LIMIT)
        self.add("topk_vs_torch", where, _fmt(torch_ratio, "x faster") + _ms(row["torch"]),
                 f">= {TOPK_TORCH_MIN:g}x", torch_ratio >= TOPK_TORCH_MIN)

    def ddp_targets(self) -> None:
        e2e = self.figures["e2e"]
        if not e2e or not e2e.get("runs"):
            for target in ("ddp_step", "ddp_amp_trains", "host_syncs"):
                self.missing(target, "ddp_e2e")
            return
        for run in e2e["runs"]:
            where = f"{run['precision']}, {run['scheme']}"
            if run["scheme"] != "dense":
                if "error" in run:
                    self.add("ddp_step", where, None, f"<= {DDP_LIMIT}x dense", False,
                             f"raised {run['error'][:200]}")
                elif "ratio_to_dense" in run:
                    self.add("ddp_step", where, _fmt(run["ratio_to_dense"], "x")
                             + _ms(run["median_s"]), f"<= {DDP_LIMIT}x dense",
                             run["ratio_to_dense"] <= DDP_LIMIT,
                             f"{run['timed_steps']} timed steps")
                else:
                    self.add("ddp_step", where, None, f"<= {DDP_LIMIT}x dense", None,
                             "no dense baseline" if "median_s" in run else "not finished")
            if run["precision"] == "float16-amp":
                raised = "error" in run
                self.add("ddp_amp_trains", where,
                         f"skipped {run.get('skipped_steps', 0)} of {run.get('steps_done', 0)} "
                         "steps" + (f"; raised {run['error'][:200]}" if raised else ""),
                         "no exception, finite loss", not raised and run.get("finite_loss") is
                         not False)
            if "syncs" in run:
                syncs = run["syncs"]
                value = (f"torch-visible {syncs.get('torch_sync_warnings_per_step', 'n/a')}, "
                         f"blocking CUDA runtime calls "
                         f"{syncs.get('runtime_blocking_calls_per_step', 'n/a')}")
                self.add("host_syncs", where, value + " per step", "counted",
                         "runtime_blocking_calls_per_step" in syncs
                         or "torch_sync_warnings_per_step" in syncs,
                         syncs.get("profiler_error", "") or syncs.get("torch_sync_warnings_error",
                                                                      ""))
        for target in ("ddp_step", "ddp_amp_trains", "host_syncs"):
            if not any(row["target"] == target for row in self.targets):
                self.missing(target, "ddp_e2e")

    def hook_sync_targets(self) -> None:
        """The hook's host synchronisations as tests/torch/test_ddp_hook_cuda.py counted them: what
        torch saw wait on the GPU, each iteration, against the CPU tests' model (its bound)."""
        for row in self.figures["test_figures"]:
            if row.get("figure") != "hook_host_syncs":
                continue
            seen, model = row.get("torch_on_gpu", []), row.get("cpu_model", [])
            self.add("host_syncs", f"DDP hook test, 3 buckets, {row.get('scheme')}",
                     f"torch-visible {seen} per iteration {row.get('iterations')} (CPU model "
                     f"{model}; iteration {row.get('skipped_iteration')} skipped)",
                     "<= the CPU model", len(seen) == len(model) and all(
                         a <= b for a, b in zip(seen, model)))

    def horovod_target(self) -> None:
        horovod = self.figures["horovod"]
        runs = [r for r in (horovod or {}).get("runs", []) if r["precision"] == "float16-amp"
                and r["scheme"] != "dense"]
        if not runs:
            return self.missing("horovod_amp", "horovod_run")
        for run in runs:
            raised = "error" in run
            self.add("horovod_amp", f"{run['scheme']}, size {horovod.get('size')}",
                     f"skipped {run.get('skipped_steps', 0)} of {run.get('steps_done', 0)} steps"
                     + (f"; raised {run['error'][:200]}" if raised else
                        f"; loss {run['first_loss']:.3f} -> {run['last_loss']:.3f}"
                        if "last_loss" in run else "; not finished"),
                     "trains, no exception",
                     not raised and bool(run.get("trained")) and run.get("finite_loss", True))

    # -- output ---------------------------------------------------------------------------

    def as_json(self) -> dict:
        return {"stages": [{"stage": name, "what": what, **self.stages.get(
                    name, {"status": "not run"})} for name, what in STAGES],
                "target_definitions": dict(TARGETS), "targets": self.targets,
                "figures": self.figures}

    def markdown(self) -> str:
        out: list[str] = ["# GPU check report", ""]
        machine = self.figures["machine"] or {}
        meta = load_json(self.work / "meta.json") or {}
        out += [f"- commit: {meta.get('commit', 'unknown')}; started {meta.get('started', '?')};"
                f" device mode: {meta.get('device', '?')}; budget {meta.get('budget_s', '?')} s;"
                f" elapsed {meta.get('elapsed_s', '?')} s",
                f"- GPU: {machine.get('gpu', 'none seen')}; driver {machine.get('driver', '?')};"
                f" torch {machine.get('torch', '?')} (CUDA {machine.get('torch_cuda', '?')}); "
                f"Python {machine.get('python', '?')}; nvcc {machine.get('nvcc', '?')}; "
                f"CPUs {machine.get('cpus', '?')}",
                f"- {meta.get('overlap_note', '')}", ""]
        met = [row["met"] for row in self.targets]
        out += [f"Targets: {met.count(True)} met, {met.count(False)} not met, "
                f"{met.count(None)} not measured.", "", "## Stages", "",
                "| stage | status | seconds | time box | note |", "| --- | --- | --- | --- | --- |"]
        for name, what in STAGES:
            stage = self.stages.get(name, {"status": "not run"})
            out.append(f"| {name}: {what} | {stage['status']} | {_int(stage.get('seconds'))} | "
                       f"{_int(stage.get('box_s'))} | {_cell(stage.get('note', ''))} |")
        out += ["", "## Targets", "", "| target | where | figure | target | verdict | note |",
                "| --- | --- | --- | --- | --- | --- |"]
        for target, what in TARGETS:
            rows = [row for row in self.targets if row["target"] == target]
            for row in rows:
                verdict = {True: "met", False: "NOT MET", None: "not measured"}[row["met"]]
                out.append(f"| {target}: {what} | {_cell(row['figure'])} | "
                           f"{_cell(row['value'])} | {_cell(row['limit'])} | {verdict} | "
                           f"{_cell(row['note'])} |")
        out += self.details()
        return "\n".join(out) + "\n"

    def profile_details(self) -> list[str]:
        profile = self.figures["profile"]
        if not profile:
            return []
        out = ["### Where the time goes (scripts/gpu/gpu_profile.py: median wall; device kernels "
               "per call under torch.profiler)", ""]
        for name, case in profile.get("cases", {}).items():
            if "error" in case:
                out += [f"- {name}: {_cell(case['error'])}"]
                continue
            out += [f"- **{name}**: wall {case['wall_us']:.0f} us, device busy "
                    f"{case['device_busy_us']:.0f} us, host + idle "
                    f"{case['host_and_idle_us']:.0f} us, {case['launches_per_call']:.0f} device "
                    "operations; " + "; ".join(
                        f"{row['name'][:60]} x{row['calls_per_call']:g} "
                        f"{row['us_per_call']:.1f} us" for row in case["kernels"])]
        return out + [""]

    def details(self) -> list[str]:
        out = ["", "## Figures", ""]
        e2e = self.figures["e2e"]
        if e2e:
            out += [f"### DDP end to end: {e2e.get('model')}, batch {e2e.get('batch')}, "
                    f"{e2e.get('backend')} at P = 1, GradScaler from {e2e.get('init_scale'):g}",
                    "", "| precision | scheme | median ms | ratio to dense | timed steps | "
                    "skipped | host syncs per step (torch / runtime) | error |",
                    "| --- | --- | --- | --- | --- | --- | --- | --- |"]
            for run in e2e.get("runs", []):
                syncs = run.get("syncs", {})
                out.append(
                    f"| {run['precision']} | {run['scheme']} | {_msv(run.get('median_s'))} | "
                    f"{_fmt(run.get('ratio_to_dense'), '')} | {run.get('timed_steps', '')} | "
                    f"{run.get('skipped_steps', '')} | "
                    f"{syncs.get('torch_sync_warnings_per_step', '')} / "
                    f"{syncs.get('runtime_blocking_calls_per_step', '')} | "
                    f"{_cell(run.get('error', ''))} |")
            calls = {run["scheme"]: run["syncs"].get("runtime_calls_per_step")
                     for run in e2e.get("runs", []) if run.get("syncs")}
            if calls:
                out += ["", "CUDA runtime copy and synchronisation calls per step (float32):", ""]
                out += [f"- {scheme}: {_cell(json.dumps(c))}" for scheme, c in calls.items()]
            out.append("")
            out += baseline_comparison(e2e, self.figures["e2e_baseline"])
        step = self.figures["step"]
        if step:
            out += [f"### SparseStep at P = 1 ({step.get('device')}, density "
                    f"{step.get('density')})", "",
                    "| d | scheme | median ms | x fused | update() ms | x fused | read passes | "
                    "peak extra x gradient | steady x gradient | memory target | note |",
                    "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
            for d, entry in step.get("sizes", {}).items():
                out.append(f"| {int(d):,} | read / fused floors | {_msv(entry.get('read_s'))} / "
                           f"{_msv(entry.get('fused_s'))} | | | | | | | | |")
                for name, r in entry.get("schemes", {}).items():
                    out.append(
                        f"| {int(d):,} | {name} | {_msv(r.get('median_s'))} | "
                        f"{_fmt(r.get('ratio_to_fused'), '')} | {_msv(r.get('update_median_s'))} | "
                        f"{_fmt(r.get('update_ratio_to_fused'), '')} | "
                        f"{_fmt(r.get('read_passes'), '')}"
                        f" | {_fmt(r.get('peak_extra_x_gradient'), '')} | "
                        f"{_fmt(r.get('steady_extra_x_gradient'), '')} | "
                        f"{_fmt(r.get('memory_target_x_gradient'), '')} | "
                        f"{_cell(r.get('error') or r.get('skipped') or r.get('note', ''))} |")
            out.append("")
            out += step_baseline_comparison(step, self.figures["step_baseline"])
        for name, title in (("topk", "bench topk"), ("select", "bench select")):
            rows = self.figures[name]
            if rows:
                out += [f"### {title}", "", "```", *(json.dumps(row) for row in rows), "```", ""]
        horovod = self.figures["horovod"]
        if horovod:
            out += [f"### Horovod {horovod.get('horovod')} (size {horovod.get('size')}, NCCL "
                    f"built: {horovod.get('nccl_built')}), {horovod.get('model')}", "",
                    "| precision | scheme | median ms | ratio to dense | skipped | loss | error |",
                    "| --- | --- | --- | --- | --- | --- | --- |"]
            for run in horovod.get("runs", []):
                loss = (f"{run['first_loss']:.3f} -> {run['last_loss']:.3f}"
                        if "last_loss" in run else "")
                out.append(f"| {run['precision']} | {run['scheme']} | "
                           f"{_msv(run.get('median_s'))} | {_fmt(run.get('ratio_to_dense'), '')}"
                           f" | {run.get('skipped_steps', '')} | {loss} | "
                           f"{_cell(run.get('error', ''))} |")
            out.append("")
        tests = self.figures["tests"]
        if tests:
            out += ["### Tests", "", f"- {tests.get('line', 'no summary line')}"]
            out += [f"- {name}" for name in tests.get("failures", [])]
            out.append("")
        memory_log = self.work / "logs" / "bench_memory.log"
        if memory_log.is_file():
            out += ["### bench memory (its output)", "", "```",
                    *memory_log.read_text(errors="replace").splitlines()[-40:], "```", ""]
        failures = [(name, s) for name, s in self.stages.items() if s["status"] != "ok"]
        out += self.profile_details()
        if failures:
            out += ["## Stages that did not end well (last lines of their logs)", ""]
            for name, _ in failures:
                log = self.work / "logs" / f"{name}.log"
                tail = log.read_text(errors="replace").splitlines()[-25:] if log.is_file() else []
                out += [f"### {name}", "", "```", *tail, "```", ""]
        tracebacks = [(f"{r['precision']} {r['scheme']}", r["traceback"])
                      for source in ("e2e", "horovod") for r in
                      (self.figures[source] or {}).get("runs", []) if "traceback" in r]
        if tracebacks:
            out += ["## Exceptions recorded", ""]
            for where, text in tracebacks[:6]:
                out += [f"### {where}", "", "```", *text.splitlines()[-15:], "```", ""]
        machine = self.figures["machine"] or {}
        if machine.get("nvidia_smi"):
            out += ["## nvidia-smi", "", "```", machine["nvidia_smi"].rstrip(), "```"]
        return out


def _fmt(value: Any, unit: str) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    return f"{value:.2f}{unit}"


def _ms(seconds: Any) -> str:
    return "" if seconds is None else f" ({seconds * 1e3:.3f} ms)"


def _change(old: float | None, new: float | None) -> str:
    """new against old in percent, signed; empty unless both were measured."""
    return f"{(new / old - 1) * 100:+.1f}%" if old and new else ""


def _msv(seconds: Any) -> str:
    return "" if seconds is None else f"{seconds * 1e3:.3f}"


def _int(value: Any) -> str:
    return "" if value is None else f"{value:.0f}"


def _cell(value: Any) -> str:
    return "" if value is None else str(value).replace("|", "/").replace("\n", " ")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("work", type=Path)
    parser.add_argument("--md", type=Path, required=True)
    parser.add_argument("--json", type=Path, required=True)
    args = parser.parse_args()
    try:
        report = Report(args.work)
        report.evaluate()
        args.md.write_text(report.markdown())
        args.json.write_text(json.dumps(report.as_json(), indent=1, default=str))
    except Exception:  # a report of some kind must come back: the raw stages and the error
        import traceback

        stages = (args.work / "stages.tsv").read_text() if (args.work / "stages.tsv").is_file() \
            else ""
        args.md.write_text("# GPU check report (the report writer failed)\n\n```\n"
                           f"{traceback.format_exc()}```\n\nstages.tsv:\n\n```\n{stages}```\n"
                           "\nThe stages' JSON and logs are in gpu_logs.tar.gz.\n")
        raise


if __name__ == "__main__":
    main()
