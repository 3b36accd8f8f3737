"""Which scheme to pick: predicted step time, bytes and scaling efficiency per scheme.

    python -m gtopk_hvd.plan --params resnet50 --workers 8 16 32 64 --link 1gbit \\
        --compute-ms 250 [--density 0.001] [--latency-us 50] [--select-ms 12]

The model (an alpha-beta model of each scheme's messages and bytes per worker per step, as the
schemes send them; rates and latency are the link's, not fitted; share = 1, or with --links each
scheme's share of the rate its transfers achieved on emulated links, fitted on P <= 8 and checked
at P = 16 and 32 by scripts/link_scale.py):

    T_comm(P) = messages * alpha + bytes * beta          alpha = --latency-us,
                                                          beta = 8 / (rate * share)
    step(P)   = t_compute + t_select + T_comm(P)         (no overlap of communication and
                                                          computation; dense has no t_select)
    e(P)      = t_compute / step(P)                      (scaling efficiency)
    speed-up  = P e(P)                                   (over one worker)

with k = density d, |I| = k for the schemes that send a global set (MiCRO's threshold keeps
|I| near k) and ring collectives:

    dense         2 (P-1) messages, 2 (P-1)/P 4 d bytes          ring all-reduce
    topk          (P-1),            (P-1) 8 k                     all-gather of every set
    gtopk         R,                R 8 k                         R = recursive doubling rounds
    gtopk-exact   R + 2 (P-1),      R 8 k + 2 (P-1)/P 4 k         + all-reduce of the values
    micro/exdyna  6 (P-1),          (P-1)/P (4 k + 2 4 k + 2 4 NB) + 16 (P-1)
                                   indices all-gathered, values and the NB-bin histogram
                                   all-reduced, the counts all-gathered
    sketch        4 (P-1),          2 (P-1)/P 4 (rows columns + k)   table, then exact values
    oktopk        4 (P-1),          2 (P-1)/P 8 k + 8 (P-1)       sparse reduce-scatter of k
                                   entries, all-gather of the k survivors and their counts
                                   (a step with the thresholds reused and |S_p| = |I| = k;
                                   the estimates every reestimate_every steps not included)

t_select defaults to this machine's time for gtopk_hvd's error-feedback selection
(`ops.accumulate_select`) at the given d and density, measured here on up to 2^25 values and
scaled linearly (pass --select-ms for your own hardware). The pick is the scheme with the
shortest predicted step.

Time to target (`--near`, from measured runs, `gtopk_hvd.convergence`): for each configuration
(scheme, density) the scale study ran at one of the given P,

    time(config) = steps(config) x step(config, P)

steps(config): the steps its run took to reach near x dense's final perplexity at that P
(measured: the LSTM language model of the scale study, simulated workers); step: the model
above at the configuration's own density, for the --params, --compute-ms and link given, with
the bytes the run itself sent per step (its last evaluation's) scaled by --params / the run's d
in place of the formula's (bytes grow with k = density d; a threshold scheme's reused
thresholds send more than the formula's k). The
fastest configuration that reached the target is marked; "-" marks one that did not within
its run. The steps transfer to another model only as far as it converges like the measured one:
the output names what was measured.
"""

from __future__ import annotations

import argparse
import json
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from gtopk_hvd import convergence
from gtopk_hvd.bench import cost_model
from gtopk_hvd.schemes.threshold import N_BINS

MODELS = {  # parameters of well-known models, for --params
    "resnet20": 269_722,
    "resnet50": 25_557_032,
    "vgg16": 138_357_544,
    "lstm-lm": 3_623_186,  # examples/pytorch_lm.py at its defaults
}
SCHEMES = ("dense", "topk", "gtopk", "gtopk-exact", "micro", "exdyna", "sketch", "oktopk")
"""The schemes modelled, by their names (`gtopk_hvd.compression.SCHEME_NAMES`, and "dense";
random-k is not modelled)."""
SKETCH_ROWS, SKETCH_COLUMNS_PER_K = 5, 10  # Compression.sketch's defaults
MEASURE_AT_MOST = 1 << 25


def messages_and_bytes(scheme: str, workers: int, d: int, k: int) -> tuple[float, float]:
    """(messages, bytes) one worker sends in one step (module docstring); dense, Top-k and
    gTop-k are the link-fitting model's own terms (`gtopk_hvd.bench.cost_model.terms`)."""
    p = workers
    if p <= 1:
        return 0.0, 0.0
    if scheme in cost_model.SCHEMES:
        return cost_model.terms(scheme, p, d, k)
    ring = (p - 1) / p
    rounds = cost_model.gtopk_rounds(p)
    if scheme == "gtopk-exact":
        return rounds + 2.0 * (p - 1), rounds * 8.0 * k + 2 * ring * 4 * k
    if scheme in ("micro", "exdyna"):
        return 6.0 * (p - 1), ring * (4 * k + 2 * 4 * k + 2 * 4 * N_BINS) + 16 * (p - 1)
    if scheme == "sketch":
        return 4.0 * (p - 1), 2 * ring * 4 * (SKETCH_ROWS * SKETCH_COLUMNS_PER_K * k + k)
    if scheme == "oktopk":
        return 4.0 * (p - 1), 2 * ring * 8 * k + 8 * (p - 1)
    raise ValueError(f"unknown scheme {scheme!r}; one of {SCHEMES}")


@dataclass(frozen=True)
class Prediction:
    scheme: str
    workers: int
    bytes_sent: float
    comm_s: float
    step_s: float
    efficiency: float

    @property
    def speedup(self) -> float:
        return self.workers * self.efficiency


def predict(scheme: str, workers: int, d: int, density: float, rate_bps: float,
            latency_s: float, compute_s: float, select_s: float,
            link_share: float = 1.0) -> Prediction:
    """One scheme's predicted step at P workers (module docstring); link_share: the share of
    the link's rate the scheme's transfers achieve (1: all of it)."""
    k = max(1, int(density * d))
    messages, sent = messages_and_bytes(scheme, workers, d, k)
    comm = messages * latency_s + sent * 8.0 / (rate_bps * link_share)
    step = compute_s + (0.0 if scheme == "dense" or workers == 1 else select_s) + comm
    return Prediction(scheme, workers, sent, comm, step, compute_s / step)


def measure_select_s(d: int, density: float, repeats: int = 3) -> float:
    """Median seconds of ops.accumulate_select here at d values (measured on at most 2^25,
    scaled linearly beyond)."""
    from gtopk_hvd import ops

    n = min(d, MEASURE_AT_MOST)
    rng = np.random.default_rng(0)
    gradient = rng.standard_normal(n, dtype=np.float32)
    residual = np.zeros(n, dtype=np.float32)
    k = max(1, int(density * n))
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        ops.accumulate_select(gradient, residual, k)
        times.append(time.perf_counter() - start)
    return float(np.median(times)) * d / n


def link_shares(path: str | None) -> dict[str, float]:
    """Each scheme's achieved share of the link rate from a link fit (scripts/link_scale.py's
    model.json); every scheme 1.0 without one."""
    if path is None:
        return dict.fromkeys(SCHEMES, 1.0)
    with open(path) as file:
        shares = json.load(file)["link_share"]
    return {scheme: float(shares.get(scheme, 1.0)) for scheme in SCHEMES}


def parse_count(text: str) -> int:
    """'25.6M', '1.2e6', '300k' or a name in MODELS -> a parameter count."""
    if text in MODELS:
        return MODELS[text]
    match = re.fullmatch(r"([0-9.e+]+)\s*([kKmMgG]?)", text.strip())
    if not match:
        raise argparse.ArgumentTypeError(f"--params: a count (25.6M, 300k) or one of "
                                         f"{sorted(MODELS)}, got {text!r}")
    scale = {"": 1, "k": 1e3, "m": 1e6, "g": 1e9}[match.group(2).lower()]
    return int(float(match.group(1)) * scale)


def parse_rate(text: str) -> float:
    """'1gbit', '10gbit', '100mbit', '25e9' (bits per second) -> bits per second."""
    match = re.fullmatch(r"([0-9.e+]+)\s*([kmg]?)(bit|bps)?", text.strip().lower())
    if not match:
        raise argparse.ArgumentTypeError(f"--link: a rate such as 1gbit, 10gbit or 100mbit, "
                                         f"got {text!r}")
    return float(match.group(1)) * {"": 1, "k": 1e3, "m": 1e6, "g": 1e9}[match.group(2)]


def table(predictions: Sequence[Prediction]) -> str:
    """The predictions as an aligned text table, the fastest step of each P marked."""
    lines = [f"{'P':>4} {'scheme':<12} {'MB sent':>9} {'comm ms':>9} {'step ms':>9} "
             f"{'efficiency':>10} {'speed-up':>8}"]
    for workers in sorted({p.workers for p in predictions}):
        rows = [p for p in predictions if p.workers == workers]
        best = min(rows, key=lambda p: p.step_s)
        for p in rows:
            lines.append(f"{p.workers:>4} {p.scheme:<12} {p.bytes_sent / 1e6:>9.3f} "
                         f"{p.comm_s * 1e3:>9.2f} {p.step_s * 1e3:>9.2f} {p.efficiency:>10.3f} "
                         f"{p.speedup:>7.1f}x" + ("  <- pick" if p is best else ""))
    return "\n".join(lines)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m gtopk_hvd.plan",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--params", type=parse_count, required=True,
                        help=f"d: a count (25.6M) or one of {sorted(MODELS)}")
    parser.add_argument("--workers", type=int, nargs="+", default=[8, 16, 32, 64])
    parser.add_argument("--link", type=parse_rate, default=parse_rate("1gbit"),
                        help="per-worker link rate, e.g. 1gbit, 10gbit (default 1gbit)")
    parser.add_argument("--latency-us", type=float, default=50.0,
                        help="seconds per message, in microseconds (default 50: TCP over "
                             "Ethernet)")
    parser.add_argument("--compute-ms", type=float, required=True,
                        help="forward + backward per step on one worker")
    parser.add_argument("--density", type=float, default=0.001)
    parser.add_argument("--select-ms", type=float, default=None,
                        help="selection per step (default: measured here, module docstring)")
    parser.add_argument("--links", metavar="MODEL_JSON", default=None,
                        help="each scheme's achieved share of the link rate, fitted on emulated "
                             "links (results/links_scale/model.json; default: the full rate)")
    parser.add_argument("--near", type=float, default=1.1,
                        help="time to target: reach this x dense's final perplexity (1.1: "
                             "within 10%%; 1: dense's final)")
    parser.add_argument("--convergence", metavar="FOLDER", default=str(convergence.DEFAULT_DIR),
                        help="the scale study's runs (default: results/scale of this "
                             "checkout); an empty or missing folder: no time to target")
    parser.add_argument("--schemes", nargs="+", choices=SCHEMES,
                        default=["dense", "topk", "gtopk", "micro"],
                        help="the schemes to predict, by the names Compression.scheme takes "
                             "(and dense)")
    args = parser.parse_args(argv)
    if not 0.0 < args.density <= 1.0:
        parser.error("--density must be in (0, 1]")
    if min(args.workers) < 1 or args.compute_ms <= 0 or args.latency_us < 0:
        parser.error("--workers must be >= 1, --compute-ms > 0 and --latency-us >= 0")
    if args.near < 1.0:
        parser.error("--near must be >= 1 (a multiple of dense's final perplexity)")
    return args


@dataclass(frozen=True)
class TimeToTarget:
    config: str
    workers: int
    steps: int | None  # measured steps to the target; None: not reached in the run
    step_s: float  # the model's step for the user's d, compute and link
    run_steps: int
    dense_steps: int = 0  # the run's dense start: these steps take dense's step
    dense_step_s: float = 0.0

    @property
    def seconds(self) -> float | None:
        if self.steps is None:
            return None
        start = min(self.steps, self.dense_steps)
        return start * self.dense_step_s + (self.steps - start) * self.step_s


def times_to_target(runs: Sequence[convergence.Run], workers: int, near: float, d: int,
                    rate_bps: float, latency_s: float, compute_s: float,
                    select_s: dict[float, float], shares: dict[str, float]
                    ) -> tuple[float, list[TimeToTarget]]:
    """(target perplexity, each measured configuration's time to it at P = workers); select_s:
    the selection time per density (module docstring)."""
    target, steps = convergence.steps_to_target(list(runs), workers, near)
    dense_step = predict("dense", workers, d, 1.0, rate_bps, latency_s, compute_s, 0.0,
                         shares["dense"]).step_s
    rows = []
    for run in runs:
        if run.workers != workers or run.scheme not in SCHEMES:
            continue
        modelled = predict(run.scheme, workers, d, run.density, rate_bps, latency_s,
                           compute_s, select_s.get(run.density, 0.0), shares[run.scheme])
        step = modelled.step_s
        if run.bytes_per_step > 0:  # what the run sent, at the user's d
            sent = run.bytes_per_step * d / run.params
            step += (sent - modelled.bytes_sent) * 8.0 / (rate_bps * shares[run.scheme])
        rows.append(TimeToTarget(run.name, workers, steps[run.name], step, run.steps,
                                 run.dense_steps, dense_step))
    return target, rows


def target_table(target: float, rows: Sequence[TimeToTarget]) -> str:
    """Time to target per configuration, the fastest marked, each against dense's."""
    reached = [row for row in rows if row.seconds is not None]
    best = min(reached, key=lambda row: row.seconds, default=None)
    dense = next((row for row in reached if row.config == "dense"), None)
    width = max([18, *(len(row.config) for row in rows)])
    lines = [f"{'P':>4} {'configuration':<{width}} {'steps':>6} {'step ms':>9} {'time s':>9} "
             f"{'vs dense':>8}   (target: perplexity {target:.1f})"]
    for row in sorted(rows, key=lambda r: (r.seconds is None, r.seconds or 0.0)):
        steps = f"{row.steps}" if row.steps is not None else f"-({row.run_steps})"
        time_s = f"{row.seconds:.1f}" if row.seconds is not None else "-"
        versus = (f"{dense.seconds / row.seconds:.2f}x" if dense and row.seconds else "")
        lines.append(f"{row.workers:>4} {row.config:<{width}} {steps:>6} {row.step_s * 1e3:>9.2f} "
                     f"{time_s:>9} {versus:>8}" + ("  <- pick" if row is best else ""))
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    measured = args.select_ms is None
    select_s = measure_select_s(args.params, args.density) if measured else args.select_ms / 1e3
    shares = link_shares(args.links)
    predictions = [predict(scheme, p, args.params, args.density, args.link,
                           args.latency_us * 1e-6, args.compute_ms / 1e3, select_s,
                           shares[scheme])
                   for p in args.workers for scheme in args.schemes]
    print(f"d = {args.params:,} parameters, density {args.density:g} "
          f"(k = {max(1, int(args.density * args.params)):,}), link {args.link / 1e9:g} Gbit/s, "
          f"{args.latency_us:g} us per message, compute {args.compute_ms:g} ms, selection "
          f"{select_s * 1e3:.2f} ms ({'measured on this machine' if measured else 'given'}); "
          + ("links at their full rate" if args.links is None else "achieved link shares "
             + ", ".join(f"{s} {shares[s]:.0%}" for s in args.schemes) + f" ({args.links})"))
    print(table(predictions))
    print("A model, not a measurement: docs/results.md says how far it was validated.")
    runs = convergence.load_runs(args.convergence) if Path(args.convergence).is_dir() else []
    if not runs:
        print(f"Time to target: no convergence runs in {args.convergence} "
              "(scripts/scale_study.py run writes them).")
        return
    densities = sorted({run.density for run in runs if run.scheme != "dense"})
    selects = {density: (measure_select_s(args.params, density)
                         if measured and density != args.density else select_s)
               for density in densities}
    measured_p = convergence.measured_workers(runs)
    print(f"\nTime to target: steps to {args.near:g} x dense's final perplexity, measured on "
          f"{convergence.describe(runs, args.convergence)} (d = {runs[0].params:,}, simulated "
          f"workers, up to {max(run.steps for run in runs)} steps) at P = {measured_p}, times "
          "the step predicted above for each configuration's density (a dense start's steps: "
          "dense's step):")
    for workers in args.workers:
        if workers not in measured_p:
            print(f"  P = {workers}: no measured run (measured: P = {measured_p})")
            continue
        target, rows = times_to_target(runs, workers, args.near, args.params, args.link,
                                       args.latency_us * 1e-6, args.compute_ms / 1e3, selects,
                                       shares)
        print(target_table(target, rows))


if __name__ == "__main__":
    main()
