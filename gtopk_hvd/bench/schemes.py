"""Every sparse scheme's step on P workers: bytes per worker against its formula, and time.

    mpirun -np P python -m gtopk_hvd.bench schemes [--parameters D] [--density 0.001]

Each worker runs each scheme's core step (`gtopk_hvd.core.SparseStep`) for --steps steps on its
own heavy-tailed gradient (Student-t, 3 degrees of freedom, scales varying along the vector:
gradient-like), over the transport. Bytes are the step's count of what this worker sends (each
collective counted as a ring moves it, each message as sent), the mean over the steps after the
first and the largest over workers; the formula is the scheme's leading term, with k = density d
and |I| the union's size where the scheme sends the union:

    Top-k            8 k (P-1)                      all-gather of every worker's k entries
    gTop-k           8 k log2 P                     (P a power of two; + 8k a fold otherwise)
    gTop-k exact     8 k log2 P + 8 |I| (P-1)/P     + the all-reduce of the global set's values
    MiCRO / ExDyna   12 |I| (P-1)/P                 indices all-gathered, values all-reduced
                     + 4 N_BINS 2 (P-1)/P + 16 (P-1)  the density histogram, the counts
    sketch           8 rows columns (P-1)/P + 8 k (P-1)/P

"selected" is |I| / k. Time: the slowest worker's step,
median over steps (selection included). Rank 0 prints.
"""

from __future__ import annotations

import argparse
import math
import time

import numpy as np

import gtopk_hvd.schemes.threshold as control
from gtopk_hvd.bench.timing import barrier, slowest
from gtopk_hvd.compression import Compression
from gtopk_hvd.core import SparseStep
from gtopk_hvd.transports.launch import LAUNCHABLE, close_transports, open_transport

SCHEMES = {
    "topk": lambda density: Compression.topk(density),
    "gtopk": lambda density: Compression.gtopk(density),
    "gtopk-exact": lambda density: Compression.gtopk(density, exact=True),
    "micro": lambda density: Compression.micro(density),
    "exdyna": lambda density: Compression.exdyna(density),
    "sketch": lambda density: Compression.sketch(density),
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--parameters", type=int, default=1_000_000, help="d")
    parser.add_argument("--density", type=float, default=0.001)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--schemes", nargs="+", default=list(SCHEMES), choices=list(SCHEMES))
    parser.add_argument("--transport", default="mpi", choices=LAUNCHABLE,
                        help="how the workers communicate (start them with its launcher)")


def formula(name: str, k: int, union: float, size: int, config: object) -> float:
    """The scheme's leading bytes per worker per step (module docstring)."""
    ring = (size - 1) / size
    rounds = math.log2(size)
    if name == "topk":
        return 8 * k * (size - 1)
    if name == "gtopk":
        return 8 * k * rounds
    if name == "gtopk-exact":
        return 8 * k * rounds + 8 * union * ring
    if name in ("micro", "exdyna"):
        return 12 * union * ring + 8 * control.N_BINS * ring + 16 * (size - 1)
    options = dict(config.options)
    columns = options.get("columns") or 10 * k
    return 8 * options.get("rows", 5) * columns * ring + 8 * k * ring


def gradient(d: int, rank: int, step: int) -> np.ndarray:
    rng = np.random.default_rng([rank, step])
    scale = np.repeat(rng.uniform(0.05, 2.0, 64), -(-d // 64))[:d]
    return (rng.standard_t(3, d) * scale).astype(np.float32)


def run(args: argparse.Namespace) -> None:
    transport = open_transport(args.transport)
    size, d = transport.size, args.parameters
    k = max(1, math.ceil(args.density * d))
    if transport.rank == 0:
        print(f"workers: {size}; transport: {args.transport}; d = {d:,}; density "
              f"{args.density} (k = {k:,}); bytes: sent per worker per step, mean of steps "
              f"2..{args.steps}, largest worker; time: slowest worker, median")
        print(f"{'scheme':12} {'selected':>9} {'bytes':>12} {'formula':>12} {'ratio':>6} "
              f"{'step ms':>8}")
    for name in args.schemes:
        config = SCHEMES[name](args.density)
        step = SparseStep(config, [d], transport)
        sent, unions, seconds = [], [], []
        for t in range(args.steps):
            data = gradient(d, transport.rank, t)
            barrier(transport)
            start = time.perf_counter()
            step.step(data)
            seconds.append(slowest(transport, time.perf_counter() - start))
            if t > 0:
                sent.append(step.last_stats.bytes_sent)
                unions.append(step.last_stats.global_entries)
        measured = float(transport.allgather(np.array([np.mean(sent)]))[:, 0].max())
        union = float(np.mean(unions))
        expected = formula(name, k, union, size, config)
        if transport.rank == 0:
            ratio = f"{measured / expected:6.3f}" if expected else "     -"
            print(f"{name:12} {union / k:9.3f} {measured:12,.0f} {expected:12,.0f} {ratio} "
                  f"{1e3 * float(np.median(seconds)):8.1f}", flush=True)
    close_transports()
