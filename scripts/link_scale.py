"""Links at scale: every scheme's communication at P = 2..32 on emulated links, the model checked.

    .venv/bin/python scripts/link_scale.py record     # the LM's k-sets at each P (simulated)
    .venv/bin/python scripts/link_scale.py measure    # bench schemes in emulated clusters
    .venv/bin/python scripts/link_scale.py report     # fit on P <= 8, predict 16 and 32

`record` trains the scale study's LM (scripts/scale_study.py: width 128, global batch 64, lr 40)
with --record-scheme for --record-steps steps at each P with P simulated workers and writes each
worker's largest entries of residual + gradient at the last step (examples/simulated_cluster.py
--record-k-sets) to <out>/k_sets_p<P>.npz.

`measure` runs `python -m gtopk_hvd.bench schemes` (every scheme, dense included) in an emulated
cluster (scripts/emulated_cluster.py: one network namespace per worker, every link shaped to
--rate each way) at each P: with random gradients of the LM's size at each --densities, and
with the recorded k-sets where `record` wrote them; <out>/<gradients>_<density>_p<P>.json.
Dense runs once per P (its bytes do not depend on the gradient). --rate is chosen so that this
machine's CPU carries every link at P = 32; --queue (a port's buffer) also sends the small
packets (acknowledgements) first (scripts/emulated_cluster.py). MPI's all-reduces (dense, the
sketch's table, the values of exact gTop-k, MiCRO, ExDyna) run OpenMPI's ring algorithm, the one
Horovod's, Gloo's and NCCL's all-reduce use and the model's formula; OpenMPI's own choice for
these sizes reached 43-62% of the link rate here, the ring 96%.

`report` fits each scheme's model on the runs with P <= --fit-at-most and checks it on the
others (<out>/summary.md, <out>/link_scale.png; the fit in <out>/model.json, whose "link_share"
per scheme, 8 / (rate beta), `python -m gtopk_hvd.plan --links` reads):

    T(P) = messages(P) alpha + bytes(P) beta      messages, bytes: gtopk_hvd.plan's terms
    alpha = the per-message latency measured in the runs fitted (a one-byte exchange)
    beta  = fitted (least squares on relative errors, alpha fixed): seconds per byte

It also prints each run's achieved rate per link (bytes sent / time, against --rate) and what
the planner predicts with the link's nominal rate (beta = 8 / rate).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))
import emulated_cluster  # noqa: E402
import scale_study  # noqa: E402

from gtopk_hvd import plan  # noqa: E402

SCHEMES = ("dense", "topk", "gtopk", "gtopk-exact", "micro", "exdyna", "sketch")
LM_PARAMETERS = 1_554_450  # scale_study's LM (width 128, vocabulary 10000)
RING_ALLREDUCE = {"OMPI_MCA_coll_tuned_use_dynamic_rules": "1",
                  "OMPI_MCA_coll_tuned_allreduce_algorithm": "4"}


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("action", choices=["record", "measure", "report"])
    parser.add_argument("--workers", type=int, nargs="+", default=[2, 4, 8, 16, 32])
    parser.add_argument("--rate", default="10mbit", help="each link's rate, each way (tc units)")
    parser.add_argument("--queue", default="4mb",
                        help="each link's buffer (scripts/emulated_cluster.py --queue)")
    parser.add_argument("--densities", type=float, nargs="+", default=[0.001, 0.01],
                        help="random gradients' densities (recorded ones: the record's)")
    parser.add_argument("--steps", type=int, default=4, help="steps per scheme (first: warm-up)")
    parser.add_argument("--schemes", nargs="+", default=list(SCHEMES), choices=SCHEMES)
    parser.add_argument("--record-scheme", default="gtopk_0.001",
                        choices=[s for s in scale_study.SCHEMES if s != "dense"])
    parser.add_argument("--record-steps", type=int, default=100)
    parser.add_argument("--fit-at-most", type=int, default=8,
                        help="report: fit on P <= this, check on the larger P")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds per cluster run")
    parser.add_argument("--out", type=Path, default=ROOT / "results" / "links_scale")
    return parser.parse_args()


def k_sets_path(out: Path, workers: int) -> Path:
    return out / f"k_sets_p{workers}.npz"


def record(args: argparse.Namespace) -> None:
    args.out.mkdir(parents=True, exist_ok=True)
    compression, density = scale_study.SCHEMES[args.record_scheme]
    for workers in args.workers:
        path = k_sets_path(args.out, workers)
        if path.exists():
            print(f"{path.name}: kept")
            continue
        command = [sys.executable, "-W", "ignore", str(ROOT / "examples/simulated_cluster.py"),
                   "lm", "--workers", str(workers), "--global-batch", "64", "--compression",
                   compression, "--density", str(density), "--lr", "40", "--max-steps",
                   str(args.record_steps), "--eval-every", str(args.record_steps), "--quiet",
                   "--record-k-sets", str(path), *scale_study.MODEL]
        subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
        print(f"{path.name}: recorded after {args.record_steps} steps of "
              f"{args.record_scheme}", flush=True)


def measure(args: argparse.Namespace) -> None:
    args.out.mkdir(parents=True, exist_ok=True)
    os.environ.update(RING_ALLREDUCE)  # mpirun passes OMPI_MCA_* on to every rank
    for workers in args.workers:
        runs = [(f"random_{density:g}", ["--parameters", str(LM_PARAMETERS), "--density",
                                         str(density)]) for density in args.densities]
        recorded = k_sets_path(args.out, workers)
        if recorded.exists():
            with np.load(recorded) as sets:
                density = float(sets["density"])
            runs.append((f"recorded_{density:g}", ["--k-sets", str(recorded), "--density",
                                                   str(density)]))
        for number, (name, options) in enumerate(runs):
            schemes = [s for s in args.schemes if number == 0 or s != "dense"]
            path = args.out / f"{name}_p{workers}.json"
            if path.exists():
                print(f"{path.name}: kept")
                continue
            command = [sys.executable, "-W", "ignore", "-m", "gtopk_hvd.bench", "schemes",
                       "--schemes", *schemes, "--steps", str(args.steps), "--json",
                       str(path), *options]
            start = time.monotonic()
            status = emulated_cluster.main(["--workers", str(workers), "--rate", args.rate,
                                            "--queue", args.queue, "--timeout",
                                            str(args.timeout), "--", *command])
            if status != 0:
                raise SystemExit(f"link_scale: {name} on {workers} workers failed (exit "
                                 f"{status})")
            rows = json.loads(path.read_text())
            for row in rows:
                row.update(rate=args.rate, queue=args.queue)
            path.write_text(json.dumps(rows, indent=1))
            print(f"link_scale: {name} on {workers} workers measured in "
                  f"{time.monotonic() - start:.0f} s", flush=True)


def load(out: Path) -> list[dict]:
    rows = [row for path in sorted(out.glob("*_p*.json")) for row in json.loads(path.read_text())]
    if not rows:
        raise SystemExit(f"link_scale: no measurements in {out}; run `measure` first")
    return rows


def terms(row: dict) -> tuple[float, float]:
    """(messages, bytes) of the row's scheme from the planner's model, at k = density d."""
    k = max(1, int(row["density"] * row["d"]))
    return plan.messages_and_bytes(row["scheme"], row["workers"], row["d"], k)


def fit_beta(rows: list[dict], alpha: float) -> float:
    """beta minimising sum ((m alpha + b beta - t) / t)^2 over the rows, alpha fixed."""
    m, b = np.array([terms(row) for row in rows]).T
    t = np.array([row["seconds"] for row in rows])
    return float(np.sum(b / t * (1 - m * alpha / t)) / np.sum((b / t) ** 2))


def predicted(row: dict, alpha: float, beta: float) -> float:
    messages, sent = terms(row)
    return messages * alpha + sent * beta


def report(args: argparse.Namespace) -> None:
    rows = load(args.out)
    rate = emulated_cluster.rate_bits(rows[0]["rate"])
    fitted = [row for row in rows if row["workers"] <= args.fit_at_most]
    alpha = float(np.median([row["latency_s"] for row in fitted]))
    lines = ["# Links at scale (emulated, `scripts/link_scale.py`)", "",
             f"Every link shaped to {rows[0]['rate']} each way; the LM's gradient size "
             f"(d = {rows[0]['d']:,}); times are the slowest worker's communication per step "
             "(median), bytes what one worker sends. Model: T = messages alpha + bytes beta "
             "(gtopk_hvd.plan's terms), alpha = the latency measured on P <= "
             f"{args.fit_at_most} ({alpha * 1e6:.0f} us, one-byte exchange), beta fitted per "
             f"scheme on P <= {args.fit_at_most}.", "",
             "| scheme | gradients | P | MB sent | measured s | achieved link rate | "
             "fitted model s | error | planner (nominal rate) s | error |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    betas, held_out = {}, {}
    for scheme in args.schemes:
        mine = [row for row in fitted if row["scheme"] == scheme]
        if len(mine) < 2:
            continue
        betas[scheme] = beta = fit_beta(mine, alpha)
        for row in sorted((r for r in rows if r["scheme"] == scheme),
                          key=lambda r: (r["gradients"], r["density"], r["workers"])):
            model = predicted(row, alpha, beta)
            nominal = predicted(row, alpha, 8.0 / rate)
            errors = [(value - row["seconds"]) / row["seconds"] for value in (model, nominal)]
            if row["workers"] > args.fit_at_most:
                held_out.setdefault(scheme, []).append(errors[0])
            achieved = row["bytes"] * 8 / row["seconds"] / rate
            lines.append(f"| {scheme} | {row['gradients']} {row['density']:g} | "
                         f"{row['workers']} | {row['bytes'] / 1e6:.3f} | {row['seconds']:.3f} "
                         f"| {achieved:.0%} | {model:.3f} | {errors[0]:+.0%} | {nominal:.3f} | "
                         f"{errors[1]:+.0%} |")
    every = [e for errors in held_out.values() for e in errors]
    lines += ["", f"Held-out error of the fitted model (P > {args.fit_at_most}), |median| and "
              "largest |error| per scheme:", "",
              "| scheme | beta (ns/B) | effective Mbit/s | median error | largest |",
              "|---|---|---|---|---|"]
    for scheme, errors in held_out.items():
        lines.append(f"| {scheme} | {betas[scheme] * 1e9:.0f} | {8 / betas[scheme] / 1e6:.2f} "
                     f"| {np.median(errors):+.0%} | {np.max(np.abs(errors)):.0%} |")
    if every:
        lines += ["", f"All schemes: median held-out error {np.median(every):+.0%}, median "
                  f"|error| {np.median(np.abs(every)):.0%}."]
    (args.out / "summary.md").write_text("\n".join(lines) + "\n")
    (args.out / "model.json").write_text(json.dumps({
        "rate": rows[0]["rate"], "fit_at_most": args.fit_at_most, "alpha_s": alpha,
        "beta_s_per_byte": betas,
        "link_share": {scheme: 8.0 / rate / beta for scheme, beta in betas.items()}}, indent=1))
    print("\n".join(lines))
    plot(args, rows, alpha, betas)


def plot(args: argparse.Namespace, rows: list[dict], alpha: float, betas: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    groups = sorted({(row["gradients"], row["density"]) for row in rows})
    figure, axes = plt.subplots(1, len(groups), figsize=(5.5 * len(groups), 4.5), squeeze=False)
    for axis, (gradients, density) in zip(axes[0], groups):
        for scheme, beta in betas.items():
            mine = sorted((r for r in rows if r["scheme"] == scheme and r["gradients"] ==
                           gradients and r["density"] == density), key=lambda r: r["workers"])
            if not mine:
                continue
            color = f"C{SCHEMES.index(scheme)}"  # one colour per scheme in every panel
            axis.plot([r["workers"] for r in mine], [predicted(r, alpha, beta) for r in mine],
                      label=scheme, color=color)
            axis.scatter([r["workers"] for r in mine], [r["seconds"] for r in mine],
                         color=color, zorder=3)
        axis.axvline(args.fit_at_most + 0.5, color="grey", linestyle="--", linewidth=1)
        axis.set(xscale="log", yscale="log", xlabel="workers P",
                 ylabel="communication per step (s)",
                 title=f"{gradients} gradients, density {density:g}, {rows[0]['rate']} links\n"
                       f"dots measured, lines fitted on P <= {args.fit_at_most}")
        axis.set_xticks(sorted({r["workers"] for r in rows}),
                        [str(p) for p in sorted({r["workers"] for r in rows})])
        axis.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        axis.legend(fontsize=7)
    figure.tight_layout()
    figure.savefig(args.out / "link_scale.png", dpi=120)


def main() -> None:
    args = parse_args()
    {"record": record, "measure": measure, "report": report}[args.action](args)


if __name__ == "__main__":
    main()
