"""The tables of scripts/studies/adamw_study.sh: one row per run (results/adamw/<name>.json, or the
folder given), grouped by P, dense first.

1. The validation perplexity at every evaluation, the test perplexity and the bytes each worker
   sent per step once sparse (a run with a dense start, `--sparsify preconditioned`, sends
   dense's bytes for its first --dense-steps steps).
2. Time to target, a model built from measurements, by the planner's own rule
   (`gtopk_hvd.plan.times_to_target`, which `python -m gtopk_hvd.plan --convergence
   results/adamw` prints too): the first evaluated step at or below dense's final perplexity at
   that P (and within 10% of it), times a step modelled at the given link and compute with each
   run's own bytes: its dense steps at dense's step, the rest at its scheme's step with the
   bytes it sent.

    .venv/bin/python scripts/studies/adamw_table.py [results/adamw] [--compute-ms 4] [--link 1gbit]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from gtopk_hvd import convergence
from gtopk_hvd.plan import TimeToTarget, configurations, parse_rate, times_to_target

NEAR = (1.0, 1.1)


def load(folder: str) -> dict[str, dict]:
    runs = sorted(Path(folder).glob("*.json"))
    if not runs:
        raise SystemExit(f"no runs in {folder}: run scripts/studies/adamw_study.sh first")
    histories = {path.stem: json.loads(path.read_text()) for path in runs}
    return dict(sorted(histories.items(),
                       key=lambda item: (item[1]["workers"], item[1]["compression"] != "none",
                                         item[0])))


def dense_steps(history: dict) -> int:
    """Steps the run reduced densely (a dense start: k = d)."""
    if history["compression"] == "none":
        return history["steps"]
    return convergence.dense_start(history)


def perplexity_table(histories: dict[str, dict]) -> None:
    steps = sorted({e["step"] for h in histories.values() for e in h["evaluations"]})
    print("| run | P | dense steps | bytes / step | " + " | ".join(f"step {s}" for s in steps)
          + " | test |")
    print("|---" * (len(steps) + 5) + "|")
    for name, history in histories.items():
        by_step = {e["step"]: e["valid_perplexity"] for e in history["evaluations"]}
        cells = [f"{by_step[s]:.1f}" if s in by_step else "" for s in steps]
        sent = history["evaluations"][-1]["bytes_per_step"]
        print(f"| {name} | {history['workers']} | {dense_steps(history)} | {sent:,} | "
              + " | ".join(cells) + f" | {history['test_perplexity']:.1f} |")


def time_table(folder: str, histories: dict[str, dict], args: argparse.Namespace) -> None:
    """Each run's modelled time to the targets, by the planner's own time to target
    (`gtopk_hvd.plan.times_to_target` over `gtopk_hvd.convergence.load_runs(folder)`)."""
    print(f"\nModelled seconds to dense's final perplexity at the same P / to within 10% of it "
          f"(evaluated steps x modelled step; link {args.link / 1e9:g} Gbit/s, "
          f"{args.latency_us:g} us per message, compute {args.compute_ms:g} ms, selection "
          f"{args.select_ms:g} ms; - : not within the run):\n")
    print("| run | P | final | steps to dense's final / 10% | seconds | vs dense |")
    print("|---|---|---|---|---|---|")
    runs = convergence.load_runs(folder)
    rows: dict[tuple[str, int], list[TimeToTarget]] = {}
    for workers in convergence.measured_workers(runs):
        d = next(run.params for run in runs if run.workers == workers)
        for near in NEAR:
            _, timed = times_to_target(
                runs, workers, near, d, args.link, args.latency_us * 1e-6, args.compute_ms / 1e3,
                {run.density: args.select_ms / 1e3 for run in runs},
                dict.fromkeys(configurations(), 1.0))
            for row in timed:
                rows.setdefault((row.config, workers), []).append(row)
    for name, history in histories.items():
        config = "dense" if history["compression"] == "none" else convergence.configuration(name)
        workers = history["workers"]
        timed, base = rows.get((config, workers)), rows.get(("dense", workers))
        if timed is None or base is None:
            continue
        steps = " / ".join("-" if row.steps is None else str(row.steps) for row in timed)
        shown = " / ".join("-" if row.seconds is None else f"{row.seconds:.1f}" for row in timed)
        versus = " / ".join("-" if row.seconds is None or dense.seconds is None
                            else f"{dense.seconds / row.seconds:.1f}x"
                            for row, dense in zip(timed, base))
        print(f"| {name} | {history['workers']} | "
              f"{history['evaluations'][-1]['valid_perplexity']:.1f} | {steps} | {shown} | "
              f"{versus} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", nargs="?", default="results/adamw",
                        help="the runs' history JSONs (scripts/studies/adamw_study.sh's folder)")
    parser.add_argument("--compute-ms", type=float, default=4.0,
                        help="forward + backward per step on one worker (default 4: a GPU's "
                             "launch-bound step for a model of this size, docs/adamw.md)")
    parser.add_argument("--link", type=parse_rate, default=parse_rate("1gbit"))
    parser.add_argument("--latency-us", type=float, default=50.0)
    parser.add_argument("--select-ms", type=float, default=0.5)
    args = parser.parse_args()
    histories = load(args.folder)
    perplexity_table(histories)
    time_table(args.folder, histories, args)


if __name__ == "__main__":
    main()
