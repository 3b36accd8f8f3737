"""Communication on emulated links: measure dense / Top-k / gTop-k, fit the cost model, plot.

    .venv/bin/python scripts/studies/link_evidence.py                 # measure P = 2, 4, 8, model
    .venv/bin/python scripts/studies/link_evidence.py --skip-measure  # model, plot the saved JSON
    .venv/bin/python scripts/studies/link_evidence.py --rate 100mbit --repeats 3 --scale-to 1gbit

Measuring runs `python -m gtopk_hvd.bench comm` (gradient sizes 0.27M / 14.7M / 25.6M, densities
0.001 / 0.01) in an emulated cluster (scripts/studies/emulated_cluster.py: one network namespace per
worker, links shaped to --rate each way) for each worker count, writing <out>/comm_p<P>.json.
Modelling fits each scheme's (alpha, beta) (gtopk_hvd/bench/cost_model.py) to the worker counts
in --fit-workers, prints its error on the held-out ones, extrapolates to P = 16..1024 and plots
communication time and scaling efficiency for the --model gradient size at --density, with the
paper's setting (32 workers, 1 Gbps) marked.

The emulation is only as fast as the host: every byte crosses the kernel twice (veth, bridge,
token bucket) on the machine's few cores, so P links of RATE are faithful only while P x RATE
stays well below what the host moves (here, 2 cores: about 14 Gbit/s for one unshaped stream;
at 1 Gbit/s and P = 8 the dense all-reduce got 0.23 Gbit/s per link). --scale-to measures at a
low rate where the links are the bottleneck and extrapolates with beta scaled by the rate ratio
(alpha unchanged): the CPU's per-byte share of beta is then scaled too, a small error at
100 Mbit/s, where sending a byte costs 80 ns.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import emulated_cluster  # noqa: E402

from gtopk_hvd import ops  # noqa: E402
from gtopk_hvd.bench import cost_model  # noqa: E402
from gtopk_hvd.bench.comm import MODELS  # noqa: E402

EXTRAPOLATED_WORKERS = [2 ** n for n in range(1, 11)]
PAPER_WORKERS = 32
LABELS = {"dense": "dense all-reduce (S-SGD)", "topk": "Top-k all-gather",
          "gtopk": "gTop-k (recursive doubling)"}


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, nargs="+", default=[2, 4, 8])
    parser.add_argument("--rate", default="1gbit", help="link rate each way (tc units)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--timeout", type=float, default=1200, help="seconds per worker count")
    parser.add_argument("--out", type=Path, default=None, help="default: results/links_<rate>")
    parser.add_argument("--scale-to", default=None, metavar="RATE",
                        help="extrapolate to links of RATE (beta x measured rate / RATE)")
    parser.add_argument("--skip-measure", action="store_true", help="model the saved JSON only")
    parser.add_argument("--fit-workers", type=int, nargs="+", default=[2, 4],
                        help="worker counts the model is fitted to; the others check it")
    parser.add_argument("--model", default="resnet50", choices=list(MODELS))
    parser.add_argument("--density", type=float, default=0.001)
    parser.add_argument("--compute-s", type=float, default=0.25,
                        help="assumed computation seconds per step for the scaling efficiency")
    args = parser.parse_args()
    args.out = args.out or Path(f"results/links_{args.rate}")
    return args


def measure(args: argparse.Namespace) -> None:
    args.out.mkdir(parents=True, exist_ok=True)
    for workers in args.workers:
        path = args.out / f"comm_p{workers}.json"
        command = [sys.executable, "-m", "gtopk_hvd.bench", "comm", "--repeats",
                   str(args.repeats), "--json", str(path)]
        start = time.monotonic()
        status = emulated_cluster.main(["--workers", str(workers), "--rate", args.rate,
                                        "--timeout", str(args.timeout), "--", *command])
        if status != 0:
            raise SystemExit(f"link_evidence: the benchmark on {workers} workers failed "
                             f"(exit {status})")
        print(f"link_evidence: {workers} workers measured in {time.monotonic() - start:.0f} s",
              flush=True)


def load(out: Path) -> list[dict]:
    rows = []
    for path in sorted(out.glob("comm_p*.json")):
        rows.extend(json.loads(path.read_text()))
    if not rows:
        raise SystemExit(f"link_evidence: no measurements in {out}; run without --skip-measure")
    return rows


def selection_seconds(d: int, k: int, repeats: int = 5) -> float:
    """Median time of this machine's top-k selection of k among d Gaussian values."""
    gradient = np.random.default_rng(0).standard_normal(d).astype(np.float32)
    times = []
    for _ in range(repeats + 1):
        start = time.perf_counter()
        ops.topk_abs(gradient, k)
        times.append(time.perf_counter() - start)
    return float(np.median(times[1:]))


def report_measurements(rows: list[dict]) -> None:
    print("\n| P | model | d | density | dense ms | Top-k ms | gTop-k ms | dense/gTop-k | "
          "Top-k/gTop-k | MB sent dense / Top-k / gTop-k |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for m in sorted(rows, key=lambda m: (m["workers"], m["d"], m["density"])):
        print(f"| {m['workers']} | {m['model']} | {m['d']:,} | {m['density']} | "
              f"{m['dense_s'] * 1e3:.1f} | {m['topk_s'] * 1e3:.1f} | {m['gtopk_s'] * 1e3:.1f} | "
              f"{m['dense_s'] / m['gtopk_s']:.1f} | {m['topk_s'] / m['gtopk_s']:.2f} | "
              f"{m['dense_bytes'] / 1e6:.1f} / {m['topk_bytes'] / 1e6:.2f} / "
              f"{m['gtopk_bytes'] / 1e6:.2f} |")


def fit_models(rows: list[dict], fit_workers: list[int]) -> dict[str, cost_model.LinkModel]:
    fitted, held_out = ([m for m in rows if (m["workers"] in fit_workers) == keep]
                        for keep in (True, False))
    models = {}
    print(f"\ncost model fitted to P = {sorted({m['workers'] for m in fitted})}, "
          f"checked on P = {sorted({m['workers'] for m in held_out}) or 'none'}")
    print("| scheme | alpha (us) | beta (ns/B) | effective Gbit/s | fit error (median, max) | "
          "held-out error (median, max) |")
    print("|---|---|---|---|---|---|")
    for scheme in cost_model.FITTED:
        model = models[scheme] = cost_model.fit(scheme, fitted)
        errors = [np.abs(cost_model.relative_errors(model, part)) if part else np.array([np.nan])
                  for part in (fitted, held_out)]
        gbits = 8 / model.beta / 1e9 if model.beta > 0 else float("inf")
        print(f"| {scheme} | {model.alpha * 1e6:.1f} | {model.beta * 1e9:.3f} | {gbits:.2f} | "
              + " | ".join(f"{np.median(e):.0%}, {np.max(e):.0%}" for e in errors) + " |")
    return models


def plot(models: dict[str, cost_model.LinkModel], rows: list[dict], args: argparse.Namespace,
         select_s: float, png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    d = MODELS[args.model]
    k = max(1, int(d * args.density))
    figure, (times, efficiency) = plt.subplots(1, 2, figsize=(12, 4.8))
    for scheme, model in models.items():
        seconds = [model.seconds(p, d, k) for p in EXTRAPOLATED_WORKERS]
        line, = times.plot(EXTRAPOLATED_WORKERS, seconds, label=LABELS[scheme])
        measured = [m for m in rows if m["model"] == args.model and m["density"] == args.density]
        if not args.scale_to:  # measured on other links than the lines show otherwise
            times.scatter([m["workers"] for m in measured], [m[f"{scheme}_s"] for m in measured],
                          color=line.get_color(), marker="o", zorder=3)
        efficiency.plot(EXTRAPOLATED_WORKERS,
                        [cost_model.scaling_efficiency(model, p, d, k, args.compute_s, select_s)
                         for p in EXTRAPOLATED_WORKERS], label=LABELS[scheme])
    for axis in (times, efficiency):
        axis.set_xscale("log", base=2)
        axis.axvline(PAPER_WORKERS, color="grey", linestyle="--", linewidth=1)
        axis.set_xlabel("workers P")
        axis.grid(True, which="both", alpha=0.3)
    times.set_yscale("log")
    times.set_ylabel("communication per step (s)")
    links = (f"{args.scale_to} links (fitted on {args.rate}, beta scaled)" if args.scale_to
             else f"{args.rate} links; dots: measured")
    times.set_title(f"{args.model} (d = {d:,}), density {args.density}\n"
                    f"{links}; dashed: paper's 32 workers", fontsize=10)
    efficiency.set_ylabel("scaling efficiency")
    efficiency.set_ylim(0, 1.02)
    efficiency.set_title(f"t_compute = {args.compute_s} s (assumed), "
                         f"t_select = {select_s * 1e3:.1f} ms (measured)")
    times.legend()
    efficiency.legend()
    figure.tight_layout()
    figure.savefig(png, dpi=120)
    print(f"\nplot: {png}")


def report_extrapolation(models: dict[str, cost_model.LinkModel], args: argparse.Namespace,
                         select_s: float) -> None:
    d = MODELS[args.model]
    k = max(1, int(d * args.density))
    print(f"\nextrapolated, {args.model}, density {args.density}, t_compute {args.compute_s} s, "
          f"t_select {select_s * 1e3:.1f} ms")
    print("| P | dense s | Top-k s | gTop-k s | eff. dense | eff. Top-k | eff. gTop-k | "
          "gTop-k/dense eff. | gTop-k/Top-k eff. |")
    print("|---|---|---|---|---|---|---|---|---|")
    for p in EXTRAPOLATED_WORKERS[2:]:
        t = {s: models[s].seconds(p, d, k) for s in models}
        e = {s: cost_model.scaling_efficiency(models[s], p, d, k, args.compute_s, select_s)
             for s in models}
        print(f"| {p} | {t['dense']:.3f} | {t['topk']:.3f} | {t['gtopk']:.4f} | "
              f"{e['dense']:.3f} | {e['topk']:.3f} | {e['gtopk']:.3f} | "
              f"{e['gtopk'] / e['dense']:.1f} | {e['gtopk'] / e['topk']:.2f} |")


def main() -> None:
    args = parse_args()
    if not args.skip_measure:
        measure(args)
    rows = load(args.out)
    report_measurements(rows)
    models = fit_models(rows, args.fit_workers)
    if args.scale_to:
        ratio = emulated_cluster.rate_bits(args.rate) / emulated_cluster.rate_bits(args.scale_to)
        models = {scheme: cost_model.LinkModel(scheme, model.alpha, model.beta * ratio)
                  for scheme, model in models.items()}
        print(f"\nbeta scaled by {ratio:g} from {args.rate} to {args.scale_to} links")
    d = MODELS[args.model]
    select_s = selection_seconds(d, max(1, int(d * args.density)))
    report_extrapolation(models, args, select_s)
    suffix = f"_at_{args.scale_to}" if args.scale_to else ""
    plot(models, rows, args, select_s, args.out / f"scaling_{args.model}{suffix}.png")


if __name__ == "__main__":
    main()
