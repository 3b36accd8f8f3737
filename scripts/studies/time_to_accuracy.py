"""Time to accuracy on emulated slow links: dense vs Top-k vs gTop-k, an LSTM language model and
the digits CNN, 4 workers, 1 Gbit/s and 100 Mbit/s.

    .venv/bin/python scripts/studies/time_to_accuracy.py               # every run, tables, figures
    .venv/bin/python scripts/studies/time_to_accuracy.py --skip-train  # tables and figures only
    .venv/bin/python scripts/studies/time_to_accuracy.py --models digits --rates 100mbit

Each run is one training script under scripts/studies/emulated_cluster.py (every worker in its own
network namespace, its link shaped to the rate each way, OpenMPI over TCP): examples/pytorch_lm.py
(--lm-steps steps, validation every --lm-eval-every) or examples/pytorch_digits.py
(--digits-epochs epochs), with Horovod's dense allreduce, then Top-k and gTop-k at densities 0.01
and 0.001, the same seed, steps and learning-rate schedule. The scripts write their history
(metric, training seconds without the evaluations, mean seconds per step of each phase) to
<out>/<model>_<run>_<rate>.json.

The scaling runs train each scheme for a few steps on one worker (no link: nothing to send) and
compare step throughput: efficiency = (steps/s at P workers) / (steps/s at 1 worker), the
samples per step growing P-fold. On this project's 2-core machine the P = 4 workers share 2
cores, so compute per step is ~2x slower at P = 4 for every scheme alike; the table says so.

Then for each model and rate: a table (final metric, time to reach the dense run's final metric
or "not reached", mean step time and its split, bytes each worker sent per step, gTop-k's speed-up
in time to target over dense and over Top-k) into <out>/summary.md, and one figure per model:
<out>/<model>.png (metric vs step; metric vs training seconds at each rate).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from gtopk_hvd._mpirun import stop_mpirun

REPO = Path(__file__).resolve().parents[2]
SCHEMES = (("none", 1.0), ("topk", 0.01), ("gtopk", 0.01), ("topk", 0.001), ("gtopk", 0.001),
           ("gtopk-exact", 0.001), ("micro", 0.001), ("exdyna", 0.001), ("sketch", 0.001))
LABELS = {"none": "dense", "topk": "Top-k", "gtopk": "gTop-k", "gtopk-exact": "gTop-k exact",
          "micro": "MiCRO", "exdyna": "ExDyna", "sketch": "sketch"}
COLORS = {"none": "black", "topk": "tab:orange", "gtopk": "tab:blue", "gtopk-exact": "tab:cyan",
          "micro": "tab:green", "exdyna": "tab:olive", "sketch": "tab:red"}
PHASES = ("compute", "select", "wait", "transfer", "merge", "other", "apply")


@dataclass(frozen=True)
class Model:
    """How to run one model's script and read its history."""

    name: str
    script: str
    metric: str
    higher_is_better: bool

    def better_or_equal(self, value: float, target: float) -> bool:
        return value >= target if self.higher_is_better else value <= target


MODELS = {
    "lm": Model("lm", "examples/pytorch_lm.py", "valid_perplexity", False),
    "digits": Model("digits", "examples/pytorch_digits.py", "test_accuracy", True),
}


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", choices=sorted(MODELS), default=["lm", "digits"])
    parser.add_argument("--rates", nargs="+", default=["1gbit", "100mbit"])
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--lm-steps", type=int, default=200)
    parser.add_argument("--lm-eval-every", type=int, default=25)
    parser.add_argument("--lm-size", type=int, default=200, help="LSTM width (tied embedding)")
    parser.add_argument("--lm-options", default="",
                        help="extra options for the LM's sparse runs, e.g. '--warmup-epochs 0.2'")
    parser.add_argument("--digits-epochs", type=int, default=30)
    parser.add_argument("--digits-options", default="",
                        help="extra options for the digits' sparse runs")
    parser.add_argument("--scaling-steps", type=int, default=20,
                        help="steps of each one-worker run (LM; digits: 1 epoch)")
    parser.add_argument("--timeout", type=float, default=1500, help="seconds per run")
    parser.add_argument("--schemes", nargs="+", choices=sorted(LABELS), default=None,
                        help="train only these (the tables and figures show every run found)")
    parser.add_argument("--out", type=Path, default=Path("results/time_to_accuracy"))
    parser.add_argument("--skip-train", action="store_true", help="tables and figures of saved "
                                                                  "runs")
    parser.add_argument("--skip-single", action="store_true",
                        help="train on the links only (keep saved one-worker runs)")
    return parser.parse_args()


def run_name(model: str, compression: str, density: float, where: str) -> str:
    scheme = "dense" if compression == "none" else f"{compression}_{density:g}"
    return f"{model}_{scheme}_{where}"


def script_command(args: argparse.Namespace, model: Model, compression: str, density: float,
                   history: Path, steps: int | None = None) -> list[str]:
    """The training script's command line for one run (steps: a short scaling run)."""
    command = [sys.executable, str(REPO / model.script), "--compression", compression,
               "--density", str(density), "--seed", str(args.seed), "--quiet",
               "--history", str(history)]
    if model.name == "lm":
        total = steps or args.lm_steps
        command += ["--size", str(args.lm_size), "--max-steps", str(total),
                    "--eval-every", str(total if steps else args.lm_eval_every)]
        extra = args.lm_options
    else:
        command += ["--epochs", str(1 if steps else args.digits_epochs)]
        extra = args.digits_options
    return command + (extra.split() if compression != "none" else [])


def launch(command: list[str], name: str, log: Path, timeout: float) -> None:
    start = time.monotonic()
    with open(log, "w") as output:
        process = subprocess.Popen(command, stdout=output, stderr=subprocess.STDOUT,
                                   start_new_session=True, cwd=REPO)
        try:
            code = process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            code = 124
        finally:
            stop_mpirun(process)
    if code != 0:
        tail = log.read_text()[-3000:]
        raise SystemExit(f"time_to_accuracy: run {name} failed (exit {code}):\n{tail}")
    result = re.search(r"^RESULT .*$", log.read_text(), re.MULTILINE)
    print(f"time_to_accuracy: {name} in {time.monotonic() - start:.0f} s, load average "
          f"{os.getloadavg()[1]:.2f} over the last 5 min (a quiet 2-core machine: < 2 + the "
          f"run's own): {result.group(0) if result else '(no RESULT line)'}", flush=True)


def train(args: argparse.Namespace, model: Model, compression: str, density: float,
          rate: str) -> None:
    name = run_name(model.name, compression, density, rate)
    command = [sys.executable, str(REPO / "scripts/studies/emulated_cluster.py"),
               "--workers", str(args.workers), "--rate", rate, "--timeout", str(args.timeout),
               "--", *script_command(args, model, compression, density,
                                     args.out / f"{name}.json")]
    launch(command, name, args.out / f"{name}.log", args.timeout + 60)


def train_single(args: argparse.Namespace, model: Model, compression: str,
                 density: float) -> None:
    name = run_name(model.name, compression, density, "p1")
    command = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", "1",
               "-x", "OMP_NUM_THREADS=1",
               *script_command(args, model, compression, density, args.out / f"{name}.json",
                               steps=args.scaling_steps)]
    launch(command, name, args.out / f"{name}.log", args.timeout)


@dataclass
class Run:
    """One finished run: its evaluations (step, seconds, metric) and summary numbers."""

    compression: str
    density: float
    steps: list[int]
    seconds: list[float]
    metric: list[float]
    phases: dict[str, float]
    bytes_per_step: int

    @property
    def label(self) -> str:
        return "dense" if self.compression == "none" else (
            f"{LABELS[self.compression]} {self.density:g}")

    @property
    def step_seconds(self) -> float:
        return self.seconds[-1] / self.steps[-1]

    def time_to(self, model: Model, target: float) -> float | None:
        for seconds, value in zip(self.seconds, self.metric):
            if model.better_or_equal(value, target):
                return seconds
        return None


def load_run(model: Model, compression: str, density: float, where: str,
             out: Path) -> Run | None:
    name = run_name(model.name, compression, density, where)
    history_path, log_path = out / f"{name}.json", out / f"{name}.log"
    if not history_path.exists() or not log_path.exists():
        return None
    history = json.loads(history_path.read_text())
    entries = history["evaluations"] if isinstance(history, dict) else history
    result = re.search(r"^RESULT .*$", log_path.read_text(), re.MULTILINE)
    fields = dict(re.findall(r"(\w+)=(\S+)", result.group(0))) if result else {}
    total = sum(_steps_between(entries))
    phases = {phase: sum(entry["phases"][phase] * count for entry, count in
                         zip(entries, _steps_between(entries))) / total for phase in PHASES}
    return Run(compression, density, [entry["step"] for entry in entries],
               [entry["seconds"] for entry in entries],
               [entry[model.metric] for entry in entries], phases,
               int(fields.get("bytes_per_step", 0)))


def _steps_between(entries: list[dict]) -> list[int]:
    steps = [entry["step"] for entry in entries]
    return [after - before for before, after in zip([0, *steps], steps)]


def load_runs(model: Model, where: str, out: Path) -> list[Run]:
    runs = [load_run(model, c, d, where, out) for c, d in SCHEMES]
    return [run for run in runs if run is not None]


def _format_metric(model: Model, value: float) -> str:
    return f"{value:.4f}" if model.higher_is_better else f"{value:.2f}"


def _versus(ours: float | None, other: float | None, other_label: str) -> str:
    """How much sooner `ours` reached the target than the other run (seconds or None)."""
    if other is None:
        return f"{other_label} never reached it"
    if other >= ours:
        return f"{other / ours:.2f}x sooner than {other_label} ({other:.1f} s)"
    return f"{ours / other:.2f}x later than {other_label} ({other:.1f} s)"


def report(model: Model, rate: str, runs: list[Run]) -> str:
    """The markdown table of one model at one rate."""
    dense = next((run for run in runs if run.compression == "none"), None)
    if dense is None:
        return f"(no dense run of {model.name} at {rate})\n"
    target = dense.metric[-1]
    times = {run.label: run.time_to(model, target) for run in runs}
    lines = [f"**{model.name} at {rate}** (target: dense's final {model.metric} "
             f"{_format_metric(model, target)})", "",
             "| scheme | final | time to target (s) | step (ms) | "
             + " | ".join(PHASES) + " | bytes/step |",
             "|---" * (5 + len(PHASES)) + "|"]
    for run in runs:
        reached = times[run.label]
        lines.append(
            f"| {run.label} | {_format_metric(model, run.metric[-1])} | "
            f"{'not reached' if reached is None else f'{reached:.1f}'} | "
            f"{1000 * run.step_seconds:.1f} | "
            + " | ".join(f"{1000 * run.phases[p]:.1f}" for p in PHASES)
            + f" | {run.bytes_per_step:,} |")
    for density in (0.01, 0.001):
        if f"gTop-k {density:g}" not in times:
            continue
        ours = times[f"gTop-k {density:g}"]
        if ours is None:
            lines.append(f"\ngTop-k {density:g} did not reach the target.")
            continue
        lines.append(f"\ngTop-k {density:g} reached the target in {ours:.1f} s: "
                     f"{_versus(ours, times['dense'], 'dense')}, "
                     f"{_versus(ours, times.get(f'Top-k {density:g}'), f'Top-k {density:g}')}.")
    return "\n".join(lines) + "\n"


def scaling(model: Model, rates: list[str], out: Path, workers: int) -> str:
    """Efficiency table: (steps/s at P workers, per rate) / (steps/s at 1 worker), measured, and
    with the P-worker step's compute replaced by the 1-worker compute (what a machine with a
    core per worker would see, the communication and the rest as measured)."""
    single = {run.label: run for run in load_runs(model, "p1", out)}
    multi = {rate: {run.label: run for run in load_runs(model, rate, out)} for rate in rates}
    lines = [f"**{model.name}: scaling efficiency, {workers} workers vs 1** (step throughput "
             f"ratio; the {workers} workers share this machine's 2 cores, so their compute is "
             "slower: the last column of each rate puts back the 1-worker compute)", "",
             "| scheme | 1 worker step (ms) | " + " | ".join(
                 f"{rate} step (ms) | {rate} efficiency | {rate} efficiency at 1-worker compute"
                 for rate in rates) + " |",
             "|---" * (2 + 3 * len(rates)) + "|"]
    for label, base in single.items():
        cells = []
        for rate in rates:
            run = multi[rate].get(label)
            if run is None:
                cells += ["-", "-", "-"]
                continue
            own_core = run.step_seconds - run.phases["compute"] + base.phases["compute"]
            cells += [f"{1000 * run.step_seconds:.1f}",
                      f"{base.step_seconds / run.step_seconds:.2f}",
                      f"{base.step_seconds / own_core:.2f}"]
        lines.append(f"| {label} | {1000 * base.step_seconds:.1f} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def plot(model: Model, rates: list[str], out: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(1, 1 + len(rates), figsize=(5.5 * (1 + len(rates)), 4.5),
                                sharey=True)
    for column, rate in enumerate(rates):
        for run in load_runs(model, rate, out):
            style = {"label": run.label, "linestyle": "--" if run.density == 0.01 else "-",
                     "color": COLORS[run.compression]}
            if column == 0:
                axes[0].plot(run.steps, run.metric, marker=".", **style)
            axes[column + 1].plot(run.seconds, run.metric, marker=".", **style)
        axes[column + 1].set_xlabel(f"training seconds, links {rate}")
    axes[0].set_xlabel("step")
    axes[0].set_ylabel(model.metric.replace("_", " "))
    if not model.higher_is_better:
        axes[0].set_yscale("log")
    for axis in axes:
        axis.grid(True, alpha=0.3)
        axis.legend(fontsize=7)
    figure.suptitle(f"{model.name}: dense vs Top-k vs gTop-k, 4 workers on emulated links "
                    f"({model.script})")
    figure.tight_layout()
    path = out / f"{model.name}.png"
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path


def main() -> None:
    args = parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    models = [MODELS[name] for name in args.models]
    if not args.skip_train:
        for model in models:
            for compression, density in SCHEMES:
                if args.schemes and compression not in args.schemes:
                    continue
                if not args.skip_single:
                    train_single(args, model, compression, density)
                for rate in args.rates:
                    train(args, model, compression, density, rate)
    sections = []
    for model in models:
        sections += [report(model, rate, load_runs(model, rate, args.out))
                     for rate in args.rates]
        sections.append(scaling(model, args.rates, args.out, args.workers))
        print(f"figure: {plot(model, args.rates, args.out)}")
    summary = "\n".join(sections)
    (args.out / "summary.md").write_text(summary)
    print(summary)


if __name__ == "__main__":
    main()
