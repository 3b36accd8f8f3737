"""Which configuration to pick: predicted step time and time to target per configuration, against
the baselines a DDP user has (dense with overlap, bf16, PowerSGD).

    python -m gtopk_hvd.plan --params resnet50 --workers 8 16 32 64 --link 1gbit \\
        --compute-ms 42 [--device h200] [--density 0.01] [--overlap 1] [--latency-us 50]

The model, per worker and step, P workers, d parameters, k = density d (an alpha-beta model of
each configuration's messages and bytes as they are sent; rates and latency are the link's, not
fitted; share = 1, or with --links each scheme's share of the rate its transfers achieved on
emulated links, fitted on P <= 8 and checked at P = 16 and 32 by scripts/studies/link_scale.py):

    T(m, b) = m alpha + b beta           alpha = --latency-us, beta = 8 / (rate share)

The baselines run in DDP's buckets (`gtopk_hvd.ddp_wire`: bucket_cap_mb 25, the first 1 MB),
each bucket's reduction launched when backward makes it ready and overlapped with the rest of
backward (`gtopk_hvd.bench.pipeline`: --overlap, the link's rate while compute runs; --backward-
share of compute):

    dense       per bucket of n values: 2 (P-1) messages, 2 (P-1)/P 4 n bytes
    bf16        2 (P-1) messages, 2 (P-1)/P 2 n bytes (bf16_compress_hook)
    powersgd-rR 3 x 2 (P-1) messages, 2 (P-1)/P 4 (u + sum (rows + cols) r') bytes
                (powerSGD_hook after its dense start; needs the layers' shapes)
    step        = pipelined_step(t_compute, the buckets' T, overlap)

The sparse schemes are not overlapped (the Horovod optimizer's step runs after backward; the
DDP hook's early steps are not modelled), which favours the baselines:

    step(P)     = t_compute + t_select + T(messages, bytes)

with each scheme's messages and bytes its own (`Scheme.wire`, in the scheme's module: a step
with |I| = k, rings for the collectives; `gtopk_hvd.compression.wire_cost`), so a scheme
registered with a wire cost is priced here too.

    efficiency  = t_compute / step(P);   vs dense = dense's step(P) / step(P)

t_select: the device's (`gtopk_hvd.bench.devices`: a GPU's measured figures, or this machine's
measured now with --device cpu) or --select-ms.

Time to target (`--near`, from measured runs, `gtopk_hvd.convergence`; by default the table
shipped in the package): for each configuration the runs measured at one of the given P,

    time(config) = steps(config) x step(config, P)

steps(config): the steps its run took to reach near x dense's final perplexity at that P; step:
the model above at the configuration's own density, with the bytes the run itself sent per step
(its last evaluation's) scaled by --params / the run's d in place of the formula's (bytes grow
with k = density d; a threshold scheme's reused thresholds send more than the formula's k). The
steps transfer to another model only as far as it converges like the measured one: the output
names what was measured. The recommendation at each P is the configuration with the shortest
time to target where runs were measured at that P, else the shortest step, and says which.
"""

from __future__ import annotations

import argparse
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from gtopk_hvd import convergence, ddp_wire, model_shapes, recommendation
from gtopk_hvd.bench import cost_model, devices, pipeline
from gtopk_hvd.schemes import known_scheme_names

MODELS = {name: model_shapes.count(shapes()) for name, shapes in model_shapes.MODELS.items()}
"""Parameter counts of well-known models, for --params (`gtopk_hvd.model_shapes` has their
shapes)."""


def configurations() -> list[str]:
    """The configurations modelled: "dense", then every registered scheme by its name
    (`gtopk_hvd.schemes.known_scheme_names`)."""
    return ["dense", *known_scheme_names()]


VALIDATED = (
    "How far the step model holds (docs/scale.md): checked on emulated 10 Mbit/s links at P = 2 "
    "to 32 on one 2-core host (scripts/studies/link_scale.py): dense within 0.3% at P = 16 and "
    "32, the sparse schemes within 25% in 25 of 28 cells once each scheme's per-message floor is "
    "measured (results/links_scale_eager); DDP's bucket pipeline at overlap 0 within 5% of DDP "
    "under torchrun on CPU, where Gloo overlaps nothing (results/ddp_overlap). Not checked on a "
    "cluster, at 1-100 Gbit/s, or on a GPU, whose overlap is --overlap.")
"""What the step model was checked against, printed beside its table."""


def messages_and_bytes(scheme: str, workers: int, d: int, k: int) -> tuple[float, float]:
    """(messages, bytes) one worker sends in one step (module docstring): dense's ring
    all-reduce, or the scheme's own wire cost."""
    if workers <= 1:
        return 0.0, 0.0
    return cost_model.terms(scheme, workers, d, k)


@dataclass(frozen=True)
class Prediction:
    config: str  # a scheme's name, or a baseline's: "dense", "bf16", "powersgd-r2"
    workers: int
    bytes_sent: float
    comm_s: float  # the link's time at its full rate, every message of the step
    step_s: float
    compute_s: float

    @property
    def efficiency(self) -> float:
        return self.compute_s / self.step_s

    @property
    def exposed_s(self) -> float:
        """The step's time beyond compute: communication not hidden, and selection."""
        return self.step_s - self.compute_s


def predict(scheme: str, workers: int, d: int, density: float, rate_bps: float,
            latency_s: float, compute_s: float, select_s: float,
            link_share: float = 1.0) -> Prediction:
    """One scheme's predicted step at P workers, not overlapped with compute (module
    docstring; "dense" here is the all-reduce after backward); link_share: the share of the
    link's rate the scheme's transfers achieve (1: all of it)."""
    k = max(1, int(density * d))
    messages, sent = messages_and_bytes(scheme, workers, d, k)
    comm = messages * latency_s + sent * 8.0 / (rate_bps * link_share)
    step = compute_s + (0.0 if scheme == "dense" or workers == 1 else select_s) + comm
    return Prediction(scheme, workers, sent, comm, step, compute_s)


@dataclass(frozen=True)
class Model:
    """The model's parameters as the baselines see them: their shapes when known (None: only
    d, in DDP-sized buckets of a flat vector) and DDP's buckets, in ready order."""

    d: int
    shapes: list[tuple[int, ...]] | None = None
    bucket_cap_mb: float = 25.0

    def buckets(self) -> tuple[list[tuple[int, ...]], list[list[int]]]:
        """(shapes, buckets): without shapes, d as 1 MB of values then bucket_cap_mb pieces,
        a bucket each, in ready order."""
        if self.shapes is not None:
            return self.shapes, ddp_wire.ddp_buckets(self.shapes, self.bucket_cap_mb)
        first, cap = 2 ** 18, int(self.bucket_cap_mb * 2 ** 18)  # values in 1 MB, in the cap
        sizes, left = [], self.d
        while left > 0:
            sizes.append(min(left, first if not sizes else cap))
            left -= sizes[-1]
        return [(n,) for n in sizes], [[i] for i in range(len(sizes))]


def predict_baseline(config: str, workers: int, model: Model, rate_bps: float,
                     latency_s: float, compute_s: float, overlap: float,
                     backward_share: float = pipeline.BACKWARD_SHARE,
                     link_share: float = 1.0) -> Prediction:
    """A DDP baseline's step ("dense", "bf16" or "powersgd-r<rank>") in DDP's buckets,
    pipelined with backward (module docstring)."""
    baseline, _, rank = config.partition("-r")
    if baseline == "powersgd" and model.shapes is None:
        raise ValueError("PowerSGD needs the layers' shapes: --params one of "
                         f"{sorted(model_shapes.MODELS)}, or --shapes FILE")
    shapes, buckets = model.buckets()
    seconds, values, sent = [], [], 0.0
    for bucket in buckets:
        messages, size = ddp_wire.bucket_wire(baseline, workers, shapes, bucket,
                                              int(rank or 1))
        seconds.append(messages * latency_s + size * 8.0 / (rate_bps * link_share))
        values.append(model_shapes.count([shapes[i] for i in bucket]))
        sent += size
    step = pipeline.pipelined_step(compute_s, seconds, values, overlap, backward_share)
    return Prediction(config, workers, sent, sum(seconds), step, compute_s)


def link_shares(path: str | None) -> dict[str, float]:
    """Each scheme's achieved share of the link rate from a link fit
    (scripts/studies/link_scale.py's model.json); every scheme 1.0 without one. The baselines take
    dense's."""
    if path is None:
        return dict.fromkeys(configurations(), 1.0)
    with open(path) as file:
        shares = json.load(file)["link_share"]
    return {scheme: float(shares.get(scheme, 1.0)) for scheme in configurations()}


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
    """The predictions as an aligned text table, per P, each against dense's step (with
    overlap where dense's row is a baseline's), the fastest step marked."""
    width = max([16, *(len(p.config) for p in predictions)])
    lines = [f"{'P':>4} {'configuration':<{width}} {'MB sent':>9} {'comm ms':>9} "
             f"{'exposed ms':>10} {'step ms':>9} {'efficiency':>10} {'vs dense':>8}"]
    for workers in sorted({p.workers for p in predictions}):
        rows = [p for p in predictions if p.workers == workers]
        best = min(rows, key=lambda p: p.step_s)
        dense = next((p for p in rows if p.config == "dense"), None)
        for p in rows:
            versus = f"{dense.step_s / p.step_s:.2f}x" if dense else ""
            lines.append(f"{p.workers:>4} {p.config:<{width}} {p.bytes_sent / 1e6:>9.3f} "
                         f"{p.comm_s * 1e3:>9.2f} {p.exposed_s * 1e3:>10.2f} "
                         f"{p.step_s * 1e3:>9.2f} {p.efficiency:>10.3f} {versus:>8}"
                         + ("  <- fastest step" if p is best else ""))
    return "\n".join(lines)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m gtopk_hvd.plan",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--params", type=str, required=True,
                        help=f"d: a count (25.6M) or one of {sorted(MODELS)} (their shapes "
                             "price PowerSGD)")
    parser.add_argument("--shapes", metavar="JSON", default=None,
                        help="the parameters' shapes, a JSON list of lists "
                             "(gtopk_hvd.model_shapes); d is their count")
    parser.add_argument("--workers", type=int, nargs="+", default=[8, 16, 32, 64])
    parser.add_argument("--link", type=parse_rate, default=parse_rate("1gbit"),
                        help="per-worker link rate, e.g. 1gbit, 10gbit (default 1gbit)")
    parser.add_argument("--latency-us", type=float, default=50.0,
                        help="seconds per message, in microseconds (default 50: TCP over "
                             "Ethernet)")
    parser.add_argument("--compute-ms", type=float, required=True,
                        help="forward + backward per step on one worker, on your device")
    parser.add_argument("--device", choices=devices.CHOICES, default="h200",
                        help="where the selection runs: a GPU's measured figures, or cpu "
                             "(measured here now); default h200")
    parser.add_argument("--density", type=float, default=0.01)
    parser.add_argument("--select-ms", type=float, default=None,
                        help="selection per step (default: the --device's)")
    parser.add_argument("--overlap", type=float, default=1.0,
                        help="the baselines' link rate while backward runs, a share of its "
                             "full rate (gtopk_hvd.bench.pipeline; default 1: no contention, "
                             "the strongest baseline)")
    parser.add_argument("--backward-share", type=float, default=pipeline.BACKWARD_SHARE,
                        help="backward's share of --compute-ms (default 2/3)")
    parser.add_argument("--bucket-cap-mb", type=float, default=25.0,
                        help="DDP's bucket_cap_mb (default 25)")
    parser.add_argument("--powersgd-ranks", type=int, nargs="*", default=[1, 2, 4],
                        help="PowerSGD's ranks to price (default 1 2 4; none: leave it out)")
    parser.add_argument("--links", metavar="MODEL_JSON", default=None,
                        help="each scheme's achieved share of the link rate, fitted on emulated "
                             "links (results/links_scale/model.json; default: the full rate)")
    parser.add_argument("--near", type=float, default=1.02,
                        help="time to target: reach this x dense's final perplexity (default "
                             "1.02: within 2%%, where the shipped recommendation is picked; 1: "
                             "dense's final)")
    parser.add_argument("--convergence", metavar="FOLDER_OR_TABLE",
                        default=convergence.DEFAULT_TABLE,
                        help="measured runs: a folder of histories, a table, or one of the "
                             "scale study's shipped in the package "
                             f"({', '.join(convergence.SHIPPED)}; default "
                             f"{convergence.DEFAULT_TABLE}); a missing one: no time to target")
    parser.add_argument("--schemes", nargs="+", choices=configurations()[1:],
                        default=["topk", "gtopk", "oktopk", "micro"],
                        help="the sparse schemes to predict, by the names Compression.scheme "
                             "takes")
    args = parser.parse_args(argv)
    if args.shapes is not None:
        try:
            args.model_shapes = model_shapes.load(args.shapes)
        except (OSError, ValueError) as error:
            parser.error(f"--shapes: {error}")
    else:
        args.model_shapes = (model_shapes.MODELS[args.params]()
                             if args.params in model_shapes.MODELS else None)
    try:
        args.params = (model_shapes.count(args.model_shapes) if args.model_shapes
                       else parse_count(args.params))
    except argparse.ArgumentTypeError as error:
        parser.error(str(error))
    if not 0.0 < args.density <= 1.0:
        parser.error("--density must be in (0, 1]")
    if min(args.workers) < 1 or args.compute_ms <= 0 or args.latency_us < 0:
        parser.error("--workers must be >= 1, --compute-ms > 0 and --latency-us >= 0")
    if not 0.0 <= args.overlap <= 1.0 or not 0.0 <= args.backward_share <= 1.0:
        parser.error("--overlap and --backward-share must be in [0, 1]")
    if any(rank < 1 for rank in args.powersgd_ranks):
        parser.error("--powersgd-ranks must be >= 1")
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
        return None if self.steps is None else self.seconds_at(self.steps)

    def seconds_at(self, steps: int) -> float:
        """The modelled seconds of the run's first `steps` steps (a dense start's at dense's
        step)."""
        start = min(steps, self.dense_steps)
        return start * self.dense_step_s + (steps - start) * self.step_s


def times_to_target(runs: Sequence[convergence.Run], workers: int, near: float, d: int,
                    rate_bps: float, latency_s: float, compute_s: float,
                    select_s: dict[float, float], shares: dict[str, float],
                    model: Model | None = None, overlap: float = 0.0
                    ) -> tuple[float, list[TimeToTarget]]:
    """(target perplexity, each measured configuration's time to it at P = workers); select_s:
    the selection time per density (module docstring). With a model, dense and DDP's
    baselines take their pipelined step (predict_baseline, at overlap); without, dense takes
    the all-reduce after backward (predict). A baseline this model cannot price (PowerSGD
    without shapes) is left out."""
    target, steps = convergence.steps_to_target(list(runs), workers, near)

    def reference_step(config: str) -> float:
        if model is None:
            return predict("dense", workers, d, 1.0, rate_bps, latency_s, compute_s, 0.0,
                           shares["dense"]).step_s
        return predict_baseline(config, workers, model, rate_bps, latency_s, compute_s,
                                overlap, link_share=shares["dense"]).step_s

    dense_step = reference_step("dense")
    rows = []
    for run in runs:
        if run.workers != workers:
            continue
        if convergence.is_reference(run.scheme):
            if model is None:
                priced = run.scheme == "dense"
            else:
                priced = model.shapes is not None or not run.scheme.startswith("powersgd")
            if not priced:
                continue
            rows.append(TimeToTarget(run.name, workers, steps[run.name],
                                     reference_step(run.scheme), run.steps))
            continue
        if run.scheme not in shares:
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


def recommend(workers: int, predictions: Sequence[Prediction],
              rows: Sequence[TimeToTarget] | None) -> str:
    """One line: what to use at P = workers and its runner-up (module docstring), against
    the baselines priced."""
    baselines = [p for p in predictions if p.workers == workers
                 and convergence.is_reference(p.config)]
    if rows:
        reached = sorted((row for row in rows if row.seconds is not None),
                         key=lambda row: row.seconds)
        seconds = {row.config: row.seconds for row in reached}
        measured = {row.config for row in rows}
        ranked = [(row.config, f"{row.seconds:.1f} s to target") for row in reached]
        against = ", ".join(
            f"{p.config} " + (f"{seconds[p.config]:.1f} s" if p.config in seconds
                              else "(not within its run)" if p.config in measured
                              else "(convergence not measured)") for p in baselines)
        basis = "time to target, measured convergence"
    else:
        ranked = [(p.config, f"{p.step_s * 1e3:.1f} ms a step") for p in
                  sorted((p for p in predictions if p.workers == workers),
                         key=lambda p: p.step_s)]
        against = ", ".join(f"{p.config} {p.step_s * 1e3:.1f} ms" for p in baselines)
        basis = "step time only: no convergence measured at this P"
    if not ranked:
        return f"P = {workers}: no configuration reached the target"
    line = (f"P = {workers}: use {recommendation.call(ranked[0][0])} ({ranked[0][0]}, "
            f"{ranked[0][1]}; {basis})")
    if len(ranked) > 1:
        line += f"; runner-up {ranked[1][0]} ({ranked[1][1]})"
    return line + (f"; baselines: {against}" if against else "")


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    given = args.select_ms is not None
    select_s = (args.select_ms / 1e3 if given
                else devices.select_s(args.device, args.params, args.density))
    shares = link_shares(args.links)
    model = Model(args.params, args.model_shapes, args.bucket_cap_mb)
    baselines = ["dense", "bf16"] + ([f"powersgd-r{r}" for r in args.powersgd_ranks]
                                     if model.shapes is not None else [])
    rate, latency, compute = args.link, args.latency_us * 1e-6, args.compute_ms / 1e3
    predictions = []
    for p in args.workers:
        predictions += [predict_baseline(config, p, model, rate, latency, compute,
                                         args.overlap, args.backward_share, shares["dense"])
                        for config in baselines]
        predictions += [predict(scheme, p, args.params, args.density, rate, latency, compute,
                                select_s, shares[scheme]) for scheme in args.schemes]
    shapes = (f"{len(model.shapes)} tensors" if model.shapes is not None
              else "no shapes: PowerSGD not priced (--params NAME or --shapes)")
    print(f"d = {args.params:,} parameters ({shapes}), density {args.density:g} "
          f"(k = {max(1, int(args.density * args.params)):,}), link {args.link / 1e9:g} Gbit/s, "
          f"{args.latency_us:g} us per message, compute {args.compute_ms:g} ms (backward "
          f"{args.backward_share:.2f} of it), selection {select_s * 1e3:.2f} ms "
          f"({'given' if given else devices.describe(args.device)}); "
          + ("links at their full rate" if args.links is None else "achieved link shares "
             + ", ".join(f"{s} {shares[s]:.0%}" for s in ["dense", *args.schemes])
             + f" ({args.links})"))
    print(f"Baselines in DDP's {args.bucket_cap_mb:g} MB buckets overlapped with backward at "
          f"overlap {args.overlap:g}; the sparse schemes after backward, not overlapped.")
    print(table(predictions))
    print(f"A model, not a measurement. {VALIDATED}")
    known = args.convergence in convergence.SHIPPED or Path(args.convergence).exists()
    runs = convergence.load(args.convergence) if known else []
    if not runs:
        print(f"Time to target: no convergence runs in {args.convergence}.")
    measured_p = convergence.measured_workers(runs)
    targets: dict[int, list[TimeToTarget]] = {}
    if runs:
        densities = sorted({run.density for run in runs
                            if not convergence.is_reference(run.scheme)})
        selects = {density: (select_s if given or density == args.density else
                             devices.select_s(args.device, args.params, density))
                   for density in densities}
        print(f"\nTime to target: steps to {args.near:g} x dense's final perplexity, measured "
              f"on {convergence.describe(runs, args.convergence)} (d = {runs[0].params:,}, "
              f"simulated workers, up to {max(run.steps for run in runs)} steps) at P = "
              f"{measured_p}, times the step predicted above for each configuration's "
              "density (a dense start's steps: dense's step). One model, one seed, simulated "
              "workers: the steps carry over to your model only as far as it converges like "
              "this one.")
        for workers in args.workers:
            if workers not in measured_p:
                print(f"  P = {workers}: no measured run (measured: P = {measured_p})")
                continue
            target, rows = times_to_target(runs, workers, args.near, args.params, rate,
                                           latency, compute, selects, shares, model,
                                           args.overlap)
            targets[workers] = rows
            print(target_table(target, rows))
    print("\nRecommendation:")
    for workers in args.workers:
        print("  " + recommend(workers, predictions, targets.get(workers)))
    print("Shipped (gtopk_hvd.recommendation, picked by this planner on the measured runs at 1 "
          "Gbit/s and a GPU's compute): " + "; ".join(r.text() for r in recommendation.ALL))


if __name__ == "__main__":
    main()
