"""Validation perplexity against step and against modelled time, every run of a folder at one P
(the scale study's LSTM runs or the transformer's), for the results docs.

    .venv/bin/python scripts/studies/curves.py results/scale/per_worker8_long --workers 32 \\
        --params lstm-lm-128 --compute-ms 2.8 --out results/scale/per_worker8_long/curves.png

Left: perplexity per evaluated step (measured). Right: the same against the planner's modelled
seconds at --link and --compute-ms (`gtopk_hvd.plan.times_to_target`'s step per configuration,
a dense start's steps at dense's step), dense's final perplexity dashed. A model built from
measurements, as the planner's.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from gtopk_hvd import convergence, plan  # noqa: E402
from gtopk_hvd.bench import devices  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path)
    parser.add_argument("--workers", type=int, required=True)
    parser.add_argument("--params", default="lstm-lm-128",
                        help="a model of gtopk_hvd.model_shapes (prices PowerSGD) or a count")
    parser.add_argument("--compute-ms", type=float, default=2.8)
    parser.add_argument("--link", type=plan.parse_rate, default=plan.parse_rate("1gbit"))
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    runs = [run for run in convergence.load_runs(args.folder) if run.workers == args.workers]
    if not any(run.scheme == "dense" for run in runs):
        raise SystemExit(f"no dense run at P = {args.workers} in {args.folder}")
    named = args.params in plan.MODELS
    d = plan.MODELS[args.params] if named else plan.parse_count(args.params)
    shapes = plan.model_shapes.MODELS[args.params]() if named else None
    model = plan.Model(d, shapes)
    selects = {run.density: devices.select_s("h200", d, run.density) for run in runs}
    _, rows = plan.times_to_target(runs, args.workers, 1.0, d, args.link, 50e-6,
                                   args.compute_ms / 1e3, selects,
                                   plan.link_shares(None), model, overlap=1.0)
    steps_of = {row.config: row for row in rows}
    dense_final = next(run.final for run in runs if run.scheme == "dense")
    figure, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    for run in sorted(runs, key=lambda r: r.name):
        steps = [step for step, _ in run.evaluations]
        values = [value for _, value in run.evaluations]
        left.plot(steps, values, label=run.name)
        if run.name in steps_of:
            row = steps_of[run.name]
            right.plot([row.seconds_at(step) for step in steps], values, label=run.name)
    for axis in (left, right):
        axis.axhline(dense_final, color="grey", linestyle="--", linewidth=0.8)
        axis.set(yscale="log", ylabel="validation perplexity")
        axis.legend(fontsize=7)
    left.set(xlabel="step", title=f"P = {args.workers}, measured ({args.folder.name})")
    right.set(xscale="log", xlabel=f"modelled seconds at {args.link / 1e9:g} Gbit/s, "
              f"{args.compute_ms:g} ms compute", title="model built from measurements")
    figure.tight_layout()
    figure.savefig(args.out, dpi=110)
    print(f"{args.out}")


if __name__ == "__main__":
    main()
