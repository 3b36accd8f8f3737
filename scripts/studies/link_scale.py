"""Links at scale: every scheme's communication at P = 2..32 on emulated links, the model checked.

    .venv/bin/python scripts/studies/link_scale.py record   # the LM's k-sets at each P (simulated)
    .venv/bin/python scripts/studies/link_scale.py measure  # bench schemes in emulated clusters
    .venv/bin/python scripts/studies/link_scale.py report   # fit on P <= 8, predict 16 and 32
    .venv/bin/python scripts/studies/link_scale.py spread --workers 16 32 --repeats 5  # repeats

`record` trains the scale study's LM (scripts/studies/scale_study.py: width 128, global batch 64, lr
40) with --record-scheme for --record-steps steps at each P with P simulated workers and writes each
worker's largest entries of residual + gradient at the last step (examples/simulated_cluster.py
--record-k-sets) to <out>/k_sets_p<P>.npz.

`measure` runs `python -m gtopk_hvd.bench schemes` (every scheme, dense included) in an emulated
cluster (scripts/studies/emulated_cluster.py: one network namespace per worker, every link shaped to
--rate each way) at each P: with random gradients of the LM's size at each --densities, and
with the recorded k-sets where `record` wrote them; <out>/<gradients>_<density>_p<P>.json.
Dense runs once per P (its bytes do not depend on the gradient). --rate is chosen so that this
machine's CPU carries every link at P = 32; --queue (a port's buffer) also sends the small
packets (acknowledgements) first (scripts/studies/emulated_cluster.py). MPI's all-reduces (dense,
the sketch's table, the values of exact gTop-k, MiCRO, ExDyna) and all-gathers (Top-k's sets,
MiCRO's and ExDyna's indices, the counts) run OpenMPI's ring algorithms, the ones Horovod's, Gloo's
and NCCL's collectives use and the model's formula; OpenMPI's own choice for these sizes reached
43-62% of the link rate here (all-reduce; Top-k's all-gather at P = 8 and 16: about 60%), the
ring 96% (85-100%). --eager-limit raises OpenMPI's TCP eager limit: above it a message waits for
the receiver's acknowledgement, which on a shaped link waits behind the partner's own data.
Every rank opens its connections at start-up (PRECONNECT). Each P also runs a floor (k = 2 P:
the same messages with a few bytes each), the host's part of the step (HostModel below).

`report` fits each scheme's model on the runs with P <= --fit-at-most and checks it on the
others (<out>/summary.md, <out>/link_scale.png; the fit in <out>/model.json, whose "link_share"
per scheme, 8 / (rate beta), `python -m gtopk_hvd.plan --links` reads):

    T(P) = messages(P) alpha + bytes(P) beta      messages, bytes: gtopk_hvd.plan's terms
    alpha = the per-message latency measured in the runs fitted (a one-byte exchange)
    beta  = fitted (least squares on relative errors, alpha fixed): seconds per byte

It also prints each run's achieved rate per link (bytes sent / time, against --rate) and what
the planner predicts with the link's nominal rate (beta = 8 / rate).

`spread` measures the same random-gradient runs --repeats times at each P (without dense and
the sketch by default: <out>/spread/random_<density>_p<P>_r<repeat>.json), and `report` then
adds how far the repeats of one cell lie apart (min, median, max of the seconds) and where the
fitted model falls against them: an error of the model smaller than the spread of the
measurement it is checked against cannot be told from noise.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts" / "studies"))
import emulated_cluster  # noqa: E402
import scale_study  # noqa: E402

from gtopk_hvd import plan  # noqa: E402

SCHEMES = ("dense", "topk", "gtopk", "gtopk-exact", "micro", "exdyna", "sketch", "oktopk")
LM_PARAMETERS = 1_554_450  # scale_study's LM (width 128, vocabulary 10000)
FLOOR_K_PER_WORKER = 2
"""The floor runs' k per worker: messages of a few bytes (the links idle), and at least one value
per worker, so that the collectives take the algorithms they take at the real k (OpenMPI's ring
all-reduce falls back to recursive doubling below one value per rank)."""
RING_COLLECTIVES = {"OMPI_MCA_coll_tuned_use_dynamic_rules": "1",
                    "OMPI_MCA_coll_tuned_allreduce_algorithm": "4",     # ring
                    "OMPI_MCA_coll_tuned_allgather_algorithm": "4",     # ring
                    "OMPI_MCA_coll_tuned_allgatherv_algorithm": "3"}    # ring
PRECONNECT = {"OMPI_MCA_mpi_preconnect_mpi": "1"}
"""Every rank's TCP connections opened in MPI_Init, in turn, rather than at first use: Ok-Topk's
reduce-scatter opens one to every rank at once, and at P = 32 on 2 cores OpenMPI's connect()
then failed (EAGAIN) and the job hung, twice. The bench's first step is untimed either way."""


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("action", choices=["record", "measure", "spread", "report"])
    parser.add_argument("--workers", type=int, nargs="+", default=[2, 4, 8, 16, 32])
    parser.add_argument("--rate", default="10mbit", help="each link's rate, each way (tc units)")
    parser.add_argument("--queue", default="4mb",
                        help="each link's buffer (scripts/studies/emulated_cluster.py --queue)")
    parser.add_argument("--densities", type=float, nargs="+", default=[0.001, 0.01],
                        help="random gradients' densities (recorded ones: the record's)")
    parser.add_argument("--steps", type=int, default=4, help="steps per scheme (first: warm-up)")
    parser.add_argument("--schemes", nargs="+", default=list(SCHEMES), choices=SCHEMES)
    parser.add_argument("--record-scheme", default="gtopk_0.001",
                        choices=[s for s in scale_study.SCHEMES if s != "dense"])
    parser.add_argument("--record-steps", type=int, default=100)
    parser.add_argument("--fit-at-most", type=int, default=8,
                        help="report: fit on P <= this, check on the larger P")
    parser.add_argument("--repeats", type=int, default=5, help="spread: runs of each cell")
    parser.add_argument("--eager-limit", type=int, default=None, metavar="BYTES",
                        help="OpenMPI's TCP eager limit (btl_tcp_eager_limit; default: "
                             "OpenMPI's, 64 KiB): messages up to it go without a rendezvous")
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
    set_mpi_environment(args)
    for workers in args.workers:
        runs = [(f"random_{density:g}", ["--parameters", str(LM_PARAMETERS), "--density",
                                         str(density)]) for density in args.densities]
        runs.append(("floor", ["--parameters", str(LM_PARAMETERS), "--density",
                               str(FLOOR_K_PER_WORKER * workers / LM_PARAMETERS)]))
        recorded = k_sets_path(args.out, workers)
        if recorded.exists():
            with np.load(recorded) as sets:
                density = float(sets["density"])
            runs.append((f"recorded_{density:g}", ["--k-sets", str(recorded), "--density",
                                                   str(density)]))
        for number, (name, options) in enumerate(runs):
            schemes = [s for s in args.schemes if number == 0 or s != "dense"]
            path = args.out / f"{name}_p{workers}.json"
            kept = json.loads(path.read_text()) if path.exists() else []
            schemes = [s for s in schemes if s not in {row["scheme"] for row in kept}]
            if not schemes:
                print(f"{path.name}: kept")
                continue
            part = path.with_suffix(".part")  # the schemes missing from the file, then added
            bench_in_cluster(args, workers, schemes, options, part,
                             "floor" if name == "floor" else None)
            path.write_text(json.dumps(kept + json.loads(part.read_text()), indent=1))
            part.unlink()


def set_mpi_environment(args: argparse.Namespace) -> None:
    """OpenMPI's settings for every rank (mpirun passes OMPI_MCA_* on): the ring all-reduce
    and all-gathers, connections opened at start-up, and the eager limit where one is asked
    for."""
    os.environ.update(RING_COLLECTIVES)
    os.environ.update(PRECONNECT)
    if args.eager_limit is not None:
        os.environ["OMPI_MCA_btl_tcp_eager_limit"] = str(args.eager_limit)


def bench_in_cluster(args: argparse.Namespace, workers: int, schemes: list[str],
                     options: list[str], path: Path, gradients: str | None = None) -> None:
    """`gtopk_hvd.bench schemes` on `workers` emulated workers, its rows written to `path`
    (their "gradients" set to `gradients` where given)."""
    command = [sys.executable, "-W", "ignore", "-m", "gtopk_hvd.bench", "schemes", "--schemes",
               *schemes, "--steps", str(args.steps), "--json", str(path), *options]
    start = time.monotonic()
    status = emulated_cluster.main(["--workers", str(workers), "--rate", args.rate, "--queue",
                                    args.queue, "--timeout", str(args.timeout), "--", *command])
    if status != 0:
        raise SystemExit(f"link_scale: {path.stem} on {workers} workers failed (exit {status})")
    rows = json.loads(path.read_text())
    for row in rows:
        row.update(rate=args.rate, queue=args.queue, eager_limit=args.eager_limit)
        if gradients is not None:
            row["gradients"] = gradients
    path.write_text(json.dumps(rows, indent=1))
    print(f"link_scale: {path.stem} on {workers} workers measured in "
          f"{time.monotonic() - start:.0f} s", flush=True)


def spread(args: argparse.Namespace) -> None:
    """The random-gradient runs `args.repeats` times at each P (module docstring)."""
    folder = args.out / "spread"
    folder.mkdir(parents=True, exist_ok=True)
    set_mpi_environment(args)
    schemes = [s for s in args.schemes if s not in ("dense", "sketch")] \
        if args.schemes == list(SCHEMES) else args.schemes
    for repeat in range(args.repeats):  # repeats outermost: a slow spell hits every cell once
        for workers in args.workers:
            for density in args.densities:
                path = folder / f"random_{density:g}_p{workers}_r{repeat}.json"
                if path.exists():
                    print(f"{path.name}: kept")
                    continue
                bench_in_cluster(args, workers, schemes, ["--parameters", str(LM_PARAMETERS),
                                                          "--density", str(density)], path)


def load(out: Path) -> list[dict]:
    rows = [row for path in sorted(out.glob("*_p*.json")) for row in json.loads(path.read_text())]
    if not rows:
        raise SystemExit(f"link_scale: no measurements in {out}; run `measure` first")
    return rows


def terms(row: dict) -> tuple[float, float]:
    """(messages, bytes) of the row's scheme from the planner's model, at k = density d."""
    k = max(1, int(row["density"] * row["d"]))
    return plan.messages_and_bytes(row["scheme"], row["workers"], row["d"], k)


def fit_beta(rows: list[dict], offset: Callable[[dict], float],
             sent: Callable[[dict], float] = lambda row: terms(row)[1]) -> float:
    """beta minimising sum ((offset + sent beta - t) / t)^2 over the rows, the offsets fixed."""
    o = np.array([offset(row) for row in rows])
    b = np.array([sent(row) for row in rows])
    t = np.array([row["seconds"] for row in rows])
    return float(np.sum(b / t * (1 - o / t)) / np.sum((b / t) ** 2))


def predicted(row: dict, alpha: float, beta: float) -> float:
    messages, sent = terms(row)
    return messages * alpha + sent * beta


class HostModel:
    """The host's share of a scheme's communication at P, from its floor runs (k = 2 P: the
    same messages, a few bytes each, the links idle): what the P processes on this machine's
    cores cost apart from the bytes (scheduling P polling ranks, each rank's per-step work on
    d values), which the alpha-beta model does not have.

        T(P) = floor(P) + (bytes(P) - bytes_floor(P)) beta_host      bytes: as counted

    floor(P) either measured at that P ("measured floor") or a line a + c P fitted to the
    floors at P <= fit_at_most ("modelled floor"); beta_host fitted on P <= fit_at_most with
    the measured floors. No floor run for a scheme (dense: its bytes do not depend on k): 0."""

    def __init__(self, rows: list[dict], fit_at_most: int) -> None:
        self.floors = {(row["scheme"], row["workers"]): row for row in rows
                       if row["gradients"] == "floor"}
        self.lines = {}
        for scheme in {scheme for scheme, _ in self.floors}:
            points = [(p, row["seconds"]) for (s, p), row in self.floors.items()
                      if s == scheme and p <= fit_at_most]
            if len(points) >= 2:
                p, t = np.array(points).T
                self.lines[scheme] = np.polyfit(p, t, 1)

    def floor(self, row: dict, modelled: bool = False) -> float | None:
        if modelled:
            line = self.lines.get(row["scheme"])
            return None if line is None else float(max(0.0, np.polyval(line, row["workers"])))
        found = self.floors.get((row["scheme"], row["workers"]))
        return None if found is None else found["seconds"]

    def extra_bytes(self, row: dict) -> float:
        """The bytes the run sent beyond its floor's, as counted (not the formula's: the
        question here is the time of the bytes; Ok-Topk's, for one, are above its formula)."""
        found = self.floors.get((row["scheme"], row["workers"]))
        return row["bytes"] - (found["bytes"] if found is not None else 0.0)

    def predicted(self, row: dict, beta: float | None, modelled: bool = False) -> float | None:
        """T(P) for the row (class docstring); None without a floor or a fitted beta_host."""
        floor = self.floor(row, modelled)
        return None if floor is None or beta is None else floor + self.extra_bytes(row) * beta

    def covers(self, rows: list[dict]) -> bool:
        return all(self.floor(row) is not None for row in rows)


def report(args: argparse.Namespace) -> None:
    every_row = load(args.out)
    host = HostModel(every_row, args.fit_at_most)
    rows = [row for row in every_row if row["gradients"] != "floor"]
    rate = emulated_cluster.rate_bits(rows[0]["rate"])
    fitted = [row for row in rows if row["workers"] <= args.fit_at_most]
    alpha = float(np.median([row["latency_s"] for row in fitted]))
    eager = rows[0].get("eager_limit")
    lines = ["# Links at scale (emulated, `scripts/studies/link_scale.py`)", "",
             f"Every link shaped to {rows[0]['rate']} each way; OpenMPI's TCP eager limit "
             f"{'its default (64 KiB)' if eager is None else f'{eager:,} bytes'}; the LM's "
             f"gradient size (d = {rows[0]['d']:,}); times are the slowest worker's "
             "communication per step (median), bytes what one worker sends. Alpha-beta model: T "
             "= messages alpha + bytes beta (gtopk_hvd.plan's terms), alpha = the latency "
             f"measured on P <= {args.fit_at_most} ({alpha * 1e6:.0f} us, one-byte exchange), "
             f"beta fitted per scheme on P <= {args.fit_at_most}. Host-aware model (where the "
             "floor runs exist): T = floor(P) + (bytes - the floor's bytes) beta_host, the "
             "floor the scheme's own step at k = 2 P on the same P (measured), or a line in P "
             f"fitted to the floors at P <= {args.fit_at_most} (modelled).", "",
             "| scheme | gradients | P | MB sent | measured s | achieved link rate | "
             "alpha-beta s | error | floor s | host-aware s (measured floor) | error | "
             "host-aware s (modelled floor) | error | planner (nominal rate) s | error |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    betas, host_betas, held_out = {}, {}, {}
    for scheme in args.schemes:
        mine = [row for row in fitted if row["scheme"] == scheme]
        if len(mine) < 2:
            continue
        betas[scheme] = beta = fit_beta(mine, lambda row: terms(row)[0] * alpha)
        if host.covers(mine):
            host_betas[scheme] = fit_beta(mine, host.floor, host.extra_bytes)
        for row in sorted((r for r in rows if r["scheme"] == scheme),
                          key=lambda r: (r["gradients"], r["density"], r["workers"])):
            values = [predicted(row, alpha, beta),
                      host.predicted(row, host_betas.get(scheme)),
                      host.predicted(row, host_betas.get(scheme), modelled=True),
                      predicted(row, alpha, 8.0 / rate)]
            errors = [None if v is None else (v - row["seconds"]) / row["seconds"]
                      for v in values]
            if row["workers"] > args.fit_at_most:
                held_out.setdefault(scheme, []).append(errors[:3])
            achieved = row["bytes"] * 8 / row["seconds"] / rate
            floor = host.floor(row)
            cells = [f"{v:.3f} | {e:+.0%}" if v is not None else "- | -"
                     for v, e in zip(values, errors)]
            lines.append(f"| {scheme} | {row['gradients']} {row['density']:g} | "
                         f"{row['workers']} | {row['bytes'] / 1e6:.3f} | {row['seconds']:.3f} "
                         f"| {achieved:.0%} | {cells[0]} | "
                         f"{'-' if floor is None else f'{floor:.3f}'} | {cells[1]} | "
                         f"{cells[2]} | {cells[3]} |")
    lines += ["", f"Held-out error (P > {args.fit_at_most}) per scheme: median and largest "
              "|error| of each model:", "",
              "| scheme | beta (ns/B) | effective Mbit/s | alpha-beta median | largest | "
              "host-aware (measured floor) median | largest | host-aware (modelled floor) "
              "median | largest |", "|---|---|---|---|---|---|---|---|---|"]
    columns: list[list[float]] = [[], [], []]
    for scheme, errors in held_out.items():
        cells = []
        for column, values in enumerate(zip(*errors)):
            known = [e for e in values if e is not None]
            columns[column] += known
            cells.append(f"{np.median(known):+.0%} | {np.max(np.abs(known)):.0%}" if known
                         else "- | -")
        lines.append(f"| {scheme} | {betas[scheme] * 1e9:.0f} | {8 / betas[scheme] / 1e6:.2f} "
                     f"| {' | '.join(cells)} |")
    names = ("alpha-beta", "host-aware (measured floor)", "host-aware (modelled floor)")
    for name, values in zip(names, columns):
        if values:
            lines.append(f"\n{name}: median held-out error {np.median(values):+.0%}, median "
                         f"|error| {np.median(np.abs(values)):.0%}, within 25% in "
                         f"{sum(abs(e) <= 0.25 for e in values)} of {len(values)} cells.")
    lines += spread_lines(args, alpha, betas, host, host_betas)
    (args.out / "summary.md").write_text("\n".join(lines) + "\n")
    (args.out / "model.json").write_text(json.dumps({
        "rate": rows[0]["rate"], "eager_limit": eager, "fit_at_most": args.fit_at_most,
        "alpha_s": alpha, "beta_s_per_byte": betas, "host_beta_s_per_byte": host_betas,
        "link_share": {scheme: 8.0 / rate / beta for scheme, beta in betas.items()}}, indent=1))
    print("\n".join(lines))
    plot(args, rows, alpha, betas, host, host_betas)


def spread_lines(args: argparse.Namespace, alpha: float, betas: dict, host: HostModel,
                 host_betas: dict) -> list[str]:
    """The repeats written by `spread`, against both fitted models (module docstring)."""
    paths = sorted((args.out / "spread").glob("random_*_p*_r*.json"))
    cells: dict[tuple, list[dict]] = {}
    for path in paths:
        for row in json.loads(path.read_text()):
            cells.setdefault((row["scheme"], row["density"], row["workers"]), []).append(row)
    if not cells:
        return []
    lines = ["", "Repeats (`spread`): the same cell measured again, in turn with the other cells; "
             "seconds min / median / max, the spread (max / min - 1), and each model against "
             "the median:", "",
             "| scheme | density | P | runs | min s | median s | max s | spread | alpha-beta s "
             "| error vs median | host-aware s (measured floor) | error vs median |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    spreads, errors = [], []
    for (scheme, density, workers), rows in sorted(cells.items()):
        if scheme not in betas:
            continue
        seconds = np.array([row["seconds"] for row in rows])
        median = float(np.median(seconds))
        model = predicted(rows[0], alpha, betas[scheme])
        aware = host.predicted(rows[0], host_betas.get(scheme))
        spreads.append(seconds.max() / seconds.min() - 1)
        if aware is not None:
            errors.append((aware - median) / median)
        lines.append(f"| {scheme} | {density:g} | {workers} | {len(rows)} | {seconds.min():.3f} "
                     f"| {median:.3f} | {seconds.max():.3f} | {spreads[-1]:.0%} | {model:.3f} | "
                     f"{(model - median) / median:+.0%} | "
                     + ("- | - |" if aware is None else
                        f"{aware:.3f} | {errors[-1]:+.0%} |"))
    lines += ["", f"Cells: {len(spreads)}; median spread {np.median(spreads):.0%}, largest "
              f"{max(spreads):.0%}."]
    if errors:
        lines[-1] += (f" Host-aware model (measured floor) against the medians: within 25% in "
                      f"{sum(abs(e) <= 0.25 for e in errors)} of {len(errors)} cells, median "
                      f"|error| {np.median(np.abs(errors)):.0%}.")
    return lines


def plot(args: argparse.Namespace, rows: list[dict], alpha: float, betas: dict,
         host: HostModel, host_betas: dict) -> None:
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
            aware = [(r["workers"], host.predicted(r, host_betas.get(scheme))) for r in mine]
            aware = [point for point in aware if point[1] is not None]
            if aware:
                axis.plot(*zip(*aware), color=color, linestyle=":")
            axis.scatter([r["workers"] for r in mine], [r["seconds"] for r in mine],
                         color=color, zorder=3)
        axis.axvline(args.fit_at_most + 0.5, color="grey", linestyle="--", linewidth=1)
        axis.set(xscale="log", yscale="log", xlabel="workers P",
                 ylabel="communication per step (s)",
                 title=f"{gradients} gradients, density {density:g}, {rows[0]['rate']} links\n"
                       f"dots measured, lines fitted on P <= {args.fit_at_most}"
                       + (" (dotted: host-aware)" if host_betas else ""))
        axis.set_xticks(sorted({r["workers"] for r in rows}),
                        [str(p) for p in sorted({r["workers"] for r in rows})])
        axis.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        axis.legend(fontsize=7)
    figure.tight_layout()
    figure.savefig(args.out / "link_scale.png", dpi=120)


def main() -> None:
    args = parse_args()
    {"record": record, "measure": measure, "spread": spread, "report": report}[args.action](args)


if __name__ == "__main__":
    main()
