"""Selection passes per worker: MiCRO/ExDyna's threshold selection and sketched SGD's sketch
against our exact top-k and a read pass.

Every pass reads the residual r (Gaussian float32, as gradients nearly are) with an all-zero
gradient, so r stays the data between runs. `--device cuda`: the same rows on a GPU (torch
tensors, every call synchronised before the clock stops). Rows, on one worker's vector of d
values:

    read         one multi-threaded read of r (the floor of any pass; on a GPU torch.amax)
    accumulate   r += g alone (`ops.accumulate_threshold` over an empty partition): the pass every
                 error-feedback scheme makes, the "shared accumulate pass"
    topk fused   r += g fused with the exact top-k (`ops.accumulate_select`), Top-k / gTop-k's
    topk alone   the exact top-k of r (`ops.topk_abs`)
    micro P=n    the threshold schemes' selection as worker 0 of n runs it at a step whose
                 threshold moved by less than half an octave: the accumulation over d with the
                 histogram and (host) the candidates of its partition (d/n values), the
                 threshold, the candidates kept; on a GPU one read of the partition instead of
                 the candidates (the all-reduce of the histogram is communication, not timed)
    1-pass P=n   the authors' selection (controller="multiplicative"): the compare against the
                 carried threshold fused into the accumulation, no histogram, no second read
    sketch       (with --sketch) sketched SGD's step but the all-reduce: r += g with the 5 x 10k
                 count sketch of r (`ops.sketch_table`), then the estimates of all d entries
                 and their top-k (`ops.sketch_select`)

"selection" = the row minus the accumulate row: what each scheme adds to the pass they share;
"/ read" = the row over the read row: its cost in read passes of d.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

import numpy as np

import gtopk_hvd.schemes.threshold as control
from gtopk_hvd import ops
from gtopk_hvd.bench.timing import median_seconds, read_floor
from gtopk_hvd.schemes.sketch import CountSketch


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--sizes", type=float, nargs="+", default=[25.6e6, 1e8],
                        help="numbers of values d")
    parser.add_argument("--density", type=float, default=0.001, help="k / d")
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 16],
                        help="P of the MiCRO rows (worker 0's partition is d / P values)")
    parser.add_argument("--repeats", type=int, default=5, help="timed runs of each pass")
    parser.add_argument("--sketch", action="store_true",
                        help="also time sketched SGD's sketch and recovery")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                        help="where the vectors live (cuda: a GPU and the CUDA kernels)")
    parser.add_argument("--json", metavar="PATH", default=None,
                        help="also write the rows (d, pass, seconds, selected) to PATH")


def micro_pass(gradient: Any, residual: Any, end: int, tau: float, k: int) -> Any:
    """Worker 0's selection at P = d / end, as `Micro._measured` makes it at a step whose
    threshold moved little: the fused pass with the histogram and (host) the candidates, the
    threshold from that histogram (as after the all-reduce), then the candidates at or above
    it (host), or (a torch state: no candidates) one read of the partition into room for the
    histogram's count from the threshold's bin."""
    window = control.window_around(tau)
    host = isinstance(residual, np.ndarray)
    candidate_key = ops.magnitude_key(tau * control.CANDIDATE_MARGIN) if host else control.NO_KEY
    candidates, histogram = ops.accumulate_threshold(gradient, residual, 0, end, candidate_key,
                                                     **window.kernel_arguments())
    threshold = control.from_histogram(histogram, window, max(1, k * end // len(residual)))
    key = ops.magnitude_key(threshold)
    if host:
        return ops.keep_at_or_above(residual, candidates, key)
    return ops.threshold_indices(residual, 0, end, key, at_most=window.count_from(histogram, key))


def rows_for(d: int, density: float, workers: list[int], repeats: int, sketch: bool,
             device: str = "cpu") -> list[tuple[str, float, int]]:
    residual = np.random.default_rng(0).standard_normal(d, dtype=np.float32)
    gradient = np.zeros(d, np.float32)
    k = max(1, int(density * d))
    tau = float(np.partition(np.abs(residual), d - k)[d - k])
    read = lambda: read_floor(residual)  # noqa: E731
    synchronize = lambda: None  # noqa: E731
    if device == "cuda":
        import torch

        residual, gradient = torch.from_numpy(residual).cuda(), torch.from_numpy(gradient).cuda()
        read, synchronize = lambda: torch.amax(residual), torch.cuda.synchronize
    time = lambda fn: median_seconds(fn, repeats, synchronize=synchronize)  # noqa: E731
    rows = [("read", time(read), 0),
            ("accumulate", time(lambda: ops.accumulate_threshold(
                gradient, residual, 0, 0, control.NO_KEY, control.NO_KEY, 0, 1)), 0)]
    cut = residual.clone() if device == "cuda" else residual.copy()  # top-k clears its picks
    rows.append(("topk fused", time(lambda: ops.accumulate_select(gradient, cut, k)), k))
    rows.append(("topk alone", time(lambda: ops.topk_abs(residual, k)), k))
    for p in workers:
        end = d // p
        selected = len(micro_pass(gradient, residual, end, tau, k))
        rows.append((f"micro P={p}", time(lambda end=end: micro_pass(gradient, residual, end,
                                                                     tau, k)), selected))
        key = ops.magnitude_key(tau)
        one_pass = lambda end=end, key=key: ops.accumulate_threshold(  # noqa: E731
            gradient, residual, 0, end, key, key, 0, 1)
        rows.append((f"1-pass P={p}", time(one_pass), len(one_pass()[0])))
    if sketch:
        rows.append(("sketch 5x10k", time(sketch_step(gradient, residual, k)), k))
    return rows


def sketch_step(gradient: Any, residual: Any, k: int) -> Any:
    """Sketched SGD's work on one worker at a step but the all-reduce: the accumulation with
    the 5 x 10k table, and the top-k of its estimates (as the scheme runs them: none stored)."""
    table = CountSketch(5, 10 * k, seed=0)
    d = int(residual.shape[0])

    def step() -> None:
        table.select(table.table(gradient, residual), k, d)

    return step


def run(args: argparse.Namespace) -> None:
    where = f"kernel threads: {ops.get_num_threads()}"
    if args.device == "cuda":
        import torch

        if not (torch.cuda.is_available() and ops.cuda_built):
            raise SystemExit("bench select --device cuda needs a CUDA GPU and the CUDA kernels "
                             f"(built: {ops.cuda_built}, GPU: {torch.cuda.is_available()})")
        where = f"GPU: {torch.cuda.get_device_name()}"
    print(f"{where}; density {args.density}; median of {args.repeats}; "
          "selection = row - accumulate")
    header = (f"{'d':>12} {'pass':14} {'ms':>9} {'selection ms':>13} {'/ topk fused':>13} "
              f"{'/ read':>8} {'selected':>10}")
    print(header)
    print("-" * len(header))
    records = []
    for size in args.sizes:
        d = int(size)
        rows = rows_for(d, args.density, args.workers, args.repeats, args.sketch, args.device)
        times = {name: seconds for name, seconds, _ in rows}
        accumulate, read = times["accumulate"], times["read"]
        topk = times["topk fused"] - accumulate
        for name, seconds, selected in rows:
            extra = seconds - accumulate
            ratio = f"{extra / topk:13.2f}" if name not in ("read", "accumulate") else " " * 13
            print(f"{d:>12,} {name:14} {seconds * 1e3:9.2f} {extra * 1e3:13.2f} {ratio} "
                  f"{seconds / read:8.1f} {selected:>10,}", flush=True)
            records.append({"device": args.device, "d": d, "pass": name, "seconds": seconds,
                            "selected": int(selected)})
    if args.json:
        with open(args.json, "w") as file:
            json.dump(records, file, indent=1)
