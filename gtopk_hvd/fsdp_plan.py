"""When the sparse reduce-scatter pays under FSDP: FSDP's step with its own reduce-scatter and
with `gtopk_hvd.torch.fsdp`'s, predicted from FSDP's traffic.

    python -m gtopk_hvd.fsdp_plan --params gpt2-350m --workers 8 16 32 64 --link 1gbit \\
        --compute-ms 300 [--strategy full-shard|shard-grad-op] [--units 24] [--density 0.01]

A model, not a measurement. Per worker and step, P workers, d parameters in U equal units of
d / U, shards of S = d / (U P), alpha = --latency-us, beta = 8 / --link, ring collectives:

    all-gather of a unit        (P-1) messages, (P-1) S b_param bytes
    FSDP's reduce-scatter       (P-1) messages, (P-1) S b_reduce bytes
    the sparse reduce-scatter   (P-1) + 2 (P-1) messages, 8 k (P-1) + 4 bytes,
                                k = min(S, max(1, ceil(density S)))   (one all-to-all of index
                                and value pairs, the non-finite flag's all-reduce)
    selection                   a unit's: the device's time at d / U values (--device), or
                                --select-ms for the whole model shared by the U units

FULL_SHARD all-gathers every unit twice (forward, and again for backward), SHARD_GRAD_OP once,
so the reduce-scatter is at most a third, or a half, of FSDP's bytes: the most the sparse one
can save. The step is simulated on two resources, the compute stream and the link, each doing
one thing at a time: forward of unit i after its all-gather, all-gathers issued ahead (FSDP's
prefetch); backward in reverse, unit i's backward after its all-gather (FULL_SHARD) and its
reduce-scatter once its backward ends (the sparse one after its selection, on the compute
stream); the link takes transfers in the order they become ready, at its full rate while
compute runs (FSDP overlaps both ways; contention is not modelled). Forward is (1 - b) of
--compute-ms, backward b (--backward-share). The optimizer's step and the remedy's dense start
are not counted. Time to a target is the step times the steps it takes (--steps-ratio: the
sparse run's over FSDP's, measured on your model).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import dataclass

from gtopk_hvd.bench import devices, pipeline
from gtopk_hvd.density import shard_budget
from gtopk_hvd.plan import parse_count, parse_rate

STRATEGIES = {"full-shard": 2, "shard-grad-op": 1}
"""FSDP's sharding strategies by the all-gathers of each unit a step."""


def sparse_bytes(shard: int, workers: int, density: float) -> int:
    """Bytes one worker sends in one unit's sparse reduce-scatter (the all-to-all and the
    flag), as `SparseReduceScatter.bytes_sent` counts them."""
    if workers <= 1:
        return 0
    return 8 * shard_budget(shard, density) * (workers - 1) + 4


@dataclass(frozen=True)
class FSDPStep:
    """One configuration's predicted step."""

    reduction: str  # "FSDP's" or "sparse"
    workers: int
    bytes_sent: float  # per worker: the all-gathers and the reduce-scatters
    reduce_bytes: float  # of which the reduce-scatters'
    link_s: float  # every transfer at the link's full rate
    step_s: float


def predict(reduction: str, workers: int, d: int, units: int, strategy: str,
            rate_bps: float, latency_s: float, compute_s: float, unit_select_s: float,
            density: float, param_bytes: int = 4, reduce_bytes: int = 4,
            backward_share: float = pipeline.BACKWARD_SHARE) -> FSDPStep:
    """FSDP's step with its reduce-scatter ("dense") or the sparse one ("sparse"): the module
    docstring's simulation."""
    if reduction not in ("dense", "sparse"):
        raise ValueError(f"reduction: 'dense' or 'sparse', got {reduction!r}")
    p, shard = workers, -(-d // (units * workers))
    ring = 0 if p <= 1 else p - 1
    gather = (ring * latency_s + ring * shard * param_bytes * 8.0 / rate_bps) if ring else 0.0
    if reduction == "dense":
        sent_rs = ring * shard * reduce_bytes
        reduce = ring * latency_s + sent_rs * 8.0 / rate_bps if ring else 0.0
        select = 0.0
    else:
        sent_rs = sparse_bytes(shard, p, density)
        reduce = 3 * ring * latency_s + sent_rs * 8.0 / rate_bps if ring else 0.0
        select = unit_select_s if ring else 0.0
    forward, backward = ((1.0 - backward_share) * compute_s / units,
                         backward_share * compute_s / units)
    compute = link = 0.0

    def send(ready: float, seconds: float) -> float:
        nonlocal link
        link = max(link, ready) + seconds
        return link

    gathered = [send(0.0, gather) for _ in range(units)]  # forward's, prefetched
    for unit in range(units):
        compute = max(compute, gathered[unit]) + forward
    regather = STRATEGIES[strategy] == 2
    ready = send(compute, gather) if regather else compute  # the last unit's, for backward
    for unit in reversed(range(units)):
        began = max(compute, ready)
        if regather and unit > 0:
            ready = send(began, gather)  # the next unit's, prefetched as this one starts
        compute = began + backward + select
        send(compute, reduce)
    passes = STRATEGIES[strategy]
    total = units * (passes * ring * shard * param_bytes + sent_rs)
    link_s = units * (passes * gather + reduce)
    return FSDPStep("FSDP's" if reduction == "dense" else "sparse", workers, total,
                    units * sent_rs, link_s, max(compute, link))


def table(steps: Sequence[FSDPStep]) -> str:
    """Each P's two rows, the sparse one against FSDP's step."""
    lines = [f"{'P':>4} {'reduce-scatter':<15} {'MB sent':>9} {'of which RS':>11} "
             f"{'link ms':>9} {'step ms':>9} {'vs FSDP':>8}"]
    for workers in sorted({s.workers for s in steps}):
        rows = [s for s in steps if s.workers == workers]
        dense = next(s for s in rows if s.reduction == "FSDP's")
        for s in rows:
            lines.append(f"{s.workers:>4} {s.reduction:<15} {s.bytes_sent / 1e6:>9.2f} "
                         f"{s.reduce_bytes / 1e6:>11.2f} {s.link_s * 1e3:>9.2f} "
                         f"{s.step_s * 1e3:>9.2f} {dense.step_s / s.step_s:>7.2f}x")
    return "\n".join(lines)


MEASURED_STEPS_RATIO = 900 / 507
"""The sparse reduce-scatter's steps to FSDP's one-epoch perplexity over FSDP's own: the
transformer with AdamW's remedy at density 0.01, P = 4 (docs/fsdp.md, Quality)."""


def verdict(steps: Sequence[FSDPStep], strategy: str, steps_ratio: float | None) -> str:
    """Where the sparse reduce-scatter pays, per step and in time to a target, in one
    paragraph. steps_ratio: its steps to the target over FSDP's, or None (then the break-even
    ratio is said, against the measured one)."""
    share = 1.0 / (STRATEGIES[strategy] + 1)
    ratios = {s.workers: next(d.step_s for d in steps if d.workers == s.workers
                              and d.reduction == "FSDP's") / s.step_s
              for s in steps if s.reduction == "sparse"}
    lines = [f"Under {strategy} the reduce-scatter is about {share:.0%} of FSDP's bytes at "
             f"equal dtypes: the sparse one can save at most that share of the link's time. "
             f"Per step it is {', '.join(f'{r:.2f}x' for r in ratios.values())} FSDP's speed "
             f"at P = {', '.join(map(str, ratios))}."]
    if steps_ratio is None:
        lines.append(f"In time to a target it pays only where it needs fewer than that many "
                     f"times FSDP's steps; measured on the transformer with AdamW at density "
                     f"0.01, P = 4: {MEASURED_STEPS_RATIO:.2f}x (--steps-ratio to price it).")
    else:
        pays = [p for p, r in ratios.items() if r > steps_ratio]
        lines.append(f"At {steps_ratio:g}x FSDP's steps, time to the target: "
                     + ", ".join(f"P = {p} {r / steps_ratio:.2f}x FSDP's speed"
                                 for p, r in ratios.items())
                     + (f": it pays at P = {', '.join(map(str, pays))}." if pays
                        else ": it pays at no P given."))
    lines.append("A model, not a measurement: the all-gathers stay dense.")
    return " ".join(lines)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m gtopk_hvd.fsdp_plan",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--params", type=parse_count, required=True,
                        help="parameter count (350M) or a known model's name")
    parser.add_argument("--workers", type=int, nargs="+", default=[8, 16, 32, 64])
    parser.add_argument("--link", type=parse_rate, default=parse_rate("1gbit"))
    parser.add_argument("--latency-us", type=float, default=50.0)
    parser.add_argument("--compute-ms", type=float, required=True,
                        help="forward and backward of one worker's batch")
    parser.add_argument("--strategy", choices=sorted(STRATEGIES), default="full-shard")
    parser.add_argument("--units", type=int, default=24, help="FSDP units (fully_shard calls)")
    parser.add_argument("--density", type=float, default=0.01)
    parser.add_argument("--param-bytes", type=int, choices=(2, 4), default=4,
                        help="the all-gathers' dtype (2: MixedPrecisionPolicy param_dtype bf16)")
    parser.add_argument("--reduce-bytes", type=int, choices=(2, 4), default=4,
                        help="FSDP's reduce dtype (2: reduce_dtype bf16)")
    parser.add_argument("--device", choices=devices.CHOICES, default="h200",
                        help="whose selection time: a GPU's measured figures, or cpu")
    parser.add_argument("--select-ms", type=float, default=None,
                        help="the selection's time for the whole model (overrides --device)")
    parser.add_argument("--backward-share", type=float, default=pipeline.BACKWARD_SHARE)
    parser.add_argument("--steps-ratio", type=float, default=None,
                        help="the sparse run's steps to your target over FSDP's own (time to "
                             "target = this x its step)")
    args = parser.parse_args(argv)
    if not 0.0 < args.density <= 1.0 or args.units < 1 or min(args.workers) < 1:
        parser.error("--density in (0, 1], --units and --workers >= 1")
    if args.steps_ratio is not None and args.steps_ratio <= 0:
        parser.error("--steps-ratio must be > 0")
    return args


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    if args.select_ms is not None:
        unit_select_s, source = args.select_ms * 1e-3 / args.units, "given"
    else:
        unit_select_s = devices.select_s(args.device, args.params // args.units, args.density)
        source = devices.describe(args.device)
    steps = [predict(reduction, p, args.params, args.units, args.strategy, args.link,
                     args.latency_us * 1e-6, args.compute_ms * 1e-3, unit_select_s,
                     args.density, args.param_bytes, args.reduce_bytes, args.backward_share)
             for p in args.workers for reduction in ("dense", "sparse")]
    print(f"FSDP {args.strategy}, d = {args.params:,} in {args.units} units, "
          f"{args.link / 1e9:g} Gbit/s, compute {args.compute_ms:g} ms, density "
          f"{args.density:g}, selection {unit_select_s * 1e3:.3f} ms a unit ({source})")
    print(table(steps))
    print(verdict(steps, args.strategy, args.steps_ratio))


if __name__ == "__main__":
    main()
