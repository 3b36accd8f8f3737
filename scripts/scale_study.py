"""Convergence at scale: the LM with P simulated workers per scheme, at one global batch.

    .venv/bin/python scripts/scale_study.py run --workers 4 16 64 --jobs 2
    .venv/bin/python scripts/scale_study.py report

`run` trains examples/simulated_cluster.py lm for every (scheme, P) whose history is not yet in
--out (so an interrupted study resumes), --jobs runs at a time, every run with the same global
batch, steps, learning rate and schedule; `sweep` runs dense at several learning rates (the
schedule is picked on dense first). `report` writes --out/summary.md (final validation
perplexity per scheme and P; steps each scheme needed to reach dense's final perplexity at the
same P) and --out/lm_scale.png (final perplexity against P).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import matplotlib
import matplotlib.ticker

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from gtopk_hvd import plan  # noqa: E402

LINKS = ROOT / "results" / "links_scale" / "model.json"  # scripts/link_scale.py's fit


def link_model() -> tuple[float, dict[str, float], str]:
    """(latency s, each scheme's achieved link share, where from): the emulated links' fit
    when scripts/link_scale.py has written one, else 50 us and the full rate."""
    if LINKS.exists():
        fit = json.loads(LINKS.read_text())
        return (fit["alpha_s"], plan.link_shares(str(LINKS)),
                f"latency {fit['alpha_s'] * 1e6:.0f} us and each scheme's achieved share of "
                f"the link rate as measured on emulated links ({LINKS.relative_to(ROOT)}: "
                + ", ".join(f"{s} {v:.0%}" for s, v in fit["link_share"].items()) + ")")
    return 50e-6, plan.link_shares(None), "latency 50 us, links at their full rate"
SCHEMES = {  # name -> (--compression, --density)
    "dense": ("none", 1.0),
    "topk_0.01": ("topk", 0.01),
    "gtopk_0.01": ("gtopk", 0.01),
    "topk_0.001": ("topk", 0.001),
    "gtopk_0.001": ("gtopk", 0.001),
    "gtopk-exact_0.001": ("gtopk-exact", 0.001),
    "micro_0.001": ("micro", 0.001),
    "exdyna_0.001": ("exdyna", 0.001),
    "sketch_0.001": ("sketch", 0.001),
}
SWEPT = re.compile(r"^lm_(.+)_p(\d+)_lr([\d.]+)$")
MODEL = ["--size", "128", "--vocab-size", "10000"]


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("action", choices=["run", "sweep", "report"])
    parser.add_argument("--workers", type=int, nargs="+", default=[4, 8, 16, 32, 64])
    parser.add_argument("--schemes", nargs="+", choices=list(SCHEMES), default=list(SCHEMES))
    parser.add_argument("--global-batch", type=int, default=64)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--eval-every", type=int, default=25)
    parser.add_argument("--lr", type=float, default=20.0)
    parser.add_argument("--sweep-lrs", type=float, nargs="+", default=[5.0, 10.0, 20.0])
    parser.add_argument("--sweep-workers", type=int, default=16)
    parser.add_argument("--sweep-schemes", action="store_true",
                        help="sweep: every --schemes entry (default: dense only)")
    parser.add_argument("--jobs", type=int, default=2, help="runs at a time")
    parser.add_argument("--near", type=float, default=1.1,
                        help="report: also the steps to this x dense's final perplexity")
    parser.add_argument("--out", type=Path, default=ROOT / "results" / "scale")
    return parser.parse_args()


def history_path(out: Path, scheme: str, workers: int, lr: float | None = None) -> Path:
    suffix = f"_lr{lr:g}" if lr is not None else ""
    return out / f"lm_{scheme}_p{workers}{suffix}.json"


def train(args: argparse.Namespace, scheme: str, workers: int, lr: float, path: Path) -> str:
    if path.exists():
        return f"{path.name}: kept"
    compression, density = SCHEMES[scheme]
    command = [sys.executable, "-W", "ignore", str(ROOT / "examples/simulated_cluster.py"), "lm",
               "--workers", str(workers), "--global-batch", str(args.global_batch),
               "--compression", compression, "--density", str(density), "--lr", str(lr),
               "--max-steps", str(args.steps), "--eval-every", str(args.eval_every),
               "--quiet", "--history", str(path.with_suffix(".partial")), *MODEL]
    done = subprocess.run(command, capture_output=True, text=True,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    if done.returncode != 0:
        return f"{path.name}: FAILED\n{done.stderr[-2000:]}"
    path.with_suffix(".partial").rename(path)
    return done.stdout.strip().splitlines()[-2]


def run_all(args: argparse.Namespace, jobs: list[tuple[str, int, float, Path]]) -> None:
    args.out.mkdir(parents=True, exist_ok=True)
    with ThreadPoolExecutor(args.jobs) as pool:
        for line in pool.map(lambda job: train(args, *job), jobs):
            print(line, flush=True)


def load(path: Path) -> dict | None:
    return json.loads(path.read_text()) if path.exists() else None


def steps_to(history: dict, target: float) -> int | None:
    """The first evaluated step whose validation perplexity is at or below target."""
    return next((e["step"] for e in history["evaluations"] if e["valid_perplexity"] <= target),
                None)


def sweep_lines(args: argparse.Namespace) -> list[str]:
    """The dense sweep that picked the learning rate, then each scheme swept at its own P."""
    found = sorted((float(path.stem.split("_lr")[1]), load(path)) for path in
                   args.out.glob(f"lm_dense_p{args.sweep_workers}_lr*.json"))
    lines = [] if not found else [
        "", f"Learning rate picked on dense at P = {args.sweep_workers} (same steps and "
        "schedule): " + ", ".join(f"lr {lr:g}: {run['evaluations'][-1]['valid_perplexity']:.1f}"
                                  for lr, run in found) + "."]
    swept: dict[tuple[str, int], dict[float, float]] = {}
    for path in args.out.glob("lm_*_p*_lr*.json"):
        scheme, workers, lr = SWEPT.match(path.stem).groups()
        if scheme in SCHEMES and (scheme, int(workers)) != ("dense", args.sweep_workers):
            swept.setdefault((scheme, int(workers)), {})[float(lr)] = final(load(path))
    for (scheme, workers), finals in swept.items():
        if (main_run := load(history_path(args.out, scheme, workers))) is not None:
            finals[float(main_run["lr"])] = final(main_run)
    if swept:
        rates = sorted({lr for finals in swept.values() for lr in finals})
        lines += ["", "Each scheme at its own learning rate (final validation perplexity; same "
                  "steps and schedule):", "",
                  "| scheme | P | " + " | ".join(f"lr {lr:g}" for lr in rates) + " | best |",
                  "|---|---|" + "---|" * (len(rates) + 1)]
        for (scheme, workers), finals in sorted(swept.items(), key=lambda item: (
                item[0][1], list(SCHEMES).index(item[0][0]))):
            best = min(finals, key=finals.get)
            lines.append(f"| {scheme} | {workers} | " + " | ".join(
                f"{finals[lr]:.1f}" if lr in finals else "" for lr in rates)
                + f" | lr {best:g}: {finals[best]:.1f} |")
    return lines


def final(run: dict) -> float:
    return run["evaluations"][-1]["valid_perplexity"]


def time_lines(args: argparse.Namespace, runs: dict, present: list[str], d: int) -> list[str]:
    """A model built from measurements (module docstring of gtopk_hvd.plan): steps to within
    --near of dense's final perplexity (measured) x (compute per worker at global / P, measured
    in the dense run of that P + selection measured here + communication from the planner's
    model)."""
    lines = []
    for rate_name, rate in (("1 Gbit/s", 1e9), ("10 Gbit/s", 1e10)):
        lines += ["", f"Modelled seconds to come within {(args.near - 1) * 100:g}% of dense's "
                  f"final perplexity at {rate_name} (steps measured x step time modelled; - : "
                  "not within the run):", "",
                  "| scheme | " + " | ".join(f"P = {p}" for p in args.workers) + " |",
                  "|---|" + "---|" * len(args.workers)]
        for scheme in present:
            cells = []
            for p in args.workers:
                if runs[(scheme, p)] is None or runs.get(("dense", p)) is None:
                    cells.append("")
                    continue
                seconds = modelled_seconds(runs, scheme, p, d, rate, args.near)
                cells.append("-" if seconds is None else f"{seconds:.1f}")
            lines.append(f"| {scheme} | " + " | ".join(cells) + " |")
    lines += ["", f"Links: {link_model()[2]}; selection measured on this "
              "machine (`gtopk_hvd.plan.measure_select_s`); compute per worker = the dense run's "
              "compute phase / P. A model built from measurements, not a measured time."]
    return lines


def modelled_seconds(runs: dict, scheme: str, workers: int, d: int, rate: float,
                     near: float) -> float | None:
    """Steps to `near` x dense's final perplexity at P x the modelled step (time_lines); None
    if not reached or not run."""
    run, dense = runs[(scheme, workers)], runs.get(("dense", workers))
    if run is None or dense is None:
        return None
    reached = steps_to(run, dense["evaluations"][-1]["valid_perplexity"] * near)
    if reached is None:
        return None
    compression, density = SCHEMES[scheme]
    planned = "dense" if compression == "none" else compression
    select_s = 0.0 if planned == "dense" else selection_seconds(d, density)
    compute = dense["evaluations"][-1]["phases"]["compute"] / workers
    latency, shares, _ = link_model()
    return reached * plan.predict(planned, workers, d, density, rate, latency, compute,
                                  select_s, shares[planned]).step_s


_selection: dict[tuple[int, float], float] = {}


def selection_seconds(d: int, density: float) -> float:
    if (d, density) not in _selection:
        _selection[(d, density)] = plan.measure_select_s(d, density, repeats=5)
    return _selection[(d, density)]


def report(args: argparse.Namespace) -> None:
    runs = {(s, p): load(history_path(args.out, s, p)) for s in args.schemes for p in args.workers}
    present = [s for s in args.schemes if any(runs[(s, p)] for p in args.workers)]
    if not present:
        raise SystemExit(f"no histories under {args.out}: run `scale_study.py run` first")
    lines = ["# LM at scale (simulated workers, `scripts/scale_study.py`)", "",
             "Final validation perplexity (lower is better); in brackets the steps to reach "
             "dense's final perplexity at the same P / to come within "
             f"{(args.near - 1) * 100:g}% of it (- : not within the run; evaluated every "
             f"{args.eval_every} steps).", "",
             "| scheme | " + " | ".join(f"P = {p}" for p in args.workers) + " |",
             "|---|" + "---|" * len(args.workers)]
    for scheme in present:
        cells = []
        for p in args.workers:
            run, dense = runs[(scheme, p)], runs.get(("dense", p))
            if run is None:
                cells.append("")
                continue
            final = run["evaluations"][-1]["valid_perplexity"]
            target = dense["evaluations"][-1]["valid_perplexity"] if dense else math.inf
            reached = [steps_to(run, target * ratio) for ratio in (1.0, args.near)]
            cells.append(f"{final:.1f} (" + " / ".join("-" if r is None else str(r)
                                                       for r in reached) + ")")
        lines.append(f"| {scheme} | " + " | ".join(cells) + " |")
    any_run = next(r for r in runs.values() if r)
    lines += ["", f"Global batch {any_run['global_batch']} sequences, {any_run['steps']} steps, "
              f"lr {any_run['lr']:g} (x0.25 at 50% and 75%), {any_run['params']} parameters.",
              *sweep_lines(args), *time_lines(args, runs, present, any_run["params"])]
    (args.out / "summary.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    figure, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    d = any_run["params"]
    for scheme in present:
        points = [(p, runs[(scheme, p)]["evaluations"][-1]["valid_perplexity"])
                  for p in args.workers if runs[(scheme, p)]]
        left.plot(*zip(*points), marker="o", label=scheme)
        times = [(p, seconds) for p in args.workers
                 if (seconds := modelled_seconds(runs, scheme, p, d, 1e9, args.near))
                 is not None]
        if times:
            right.plot(*zip(*times), marker="o", label=scheme)
    left.set(ylabel="final validation perplexity", title="LSTM LM, simulated workers (measured)")
    right.set(yscale="log", ylabel=f"seconds to within {(args.near - 1) * 100:g}% of dense's "
              "final perplexity",
              title="at 1 Gbit/s (model built from measurements)")
    for axis in (left, right):
        axis.set(xscale="log", xlabel="workers P (global batch fixed)")
        axis.set_xticks(args.workers, [str(p) for p in args.workers])
        axis.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        axis.legend(fontsize=7)
    figure.tight_layout()
    figure.savefig(args.out / "lm_scale.png", dpi=120)


def main() -> None:
    args = parse_args()
    if args.action == "sweep":
        schemes = args.schemes if args.sweep_schemes else ["dense"]
        run_all(args, [(s, args.sweep_workers, lr, history_path(args.out, s, args.sweep_workers,
                                                                lr))
                       for s in schemes for lr in args.sweep_lrs])
        for scheme in schemes:
            for lr in args.sweep_lrs:
                run = load(history_path(args.out, scheme, args.sweep_workers, lr))
                print(f"{scheme} P={args.sweep_workers} lr={lr:g}: final valid perplexity "
                      f"{run['evaluations'][-1]['valid_perplexity']:.2f}")
    elif args.action == "run":
        run_all(args, [(s, p, args.lr, history_path(args.out, s, p))
                       for p in args.workers for s in args.schemes])
    else:
        report(args)


if __name__ == "__main__":
    main()
