"""Exact gTop-k's step time against plain gTop-k's, on P workers as threads of one process.

    python scripts/studies/exact_step_ratio.py [--parameters 25600000] [--density 0.001]
        [--workers 1 4] [--steps 7]

Each of P workers (`gtopk_hvd.transports.local`) runs `SparseStep.update` as the adapters call
it (clear_gradient=True, the update written over the gradient) on its own Student-t gradient,
refilled between steps (not timed); printed: the median over the steps after the first of the
slowest worker's step, plain and exact, and their ratio.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from gtopk_hvd.compression import Compression
from gtopk_hvd.core import SparseStep
from gtopk_hvd.transports.local import LocalGroup


def step_seconds(config: object, d: int, workers: int, steps: int) -> float:
    """Median over steps 2.. of the slowest worker's step."""
    group = LocalGroup(workers)
    try:
        rngs = [np.random.default_rng(rank) for rank in range(workers)]
        made = group.run(lambda rank: (SparseStep(config, [d], group.transports[rank]),
                                       np.empty(d, np.float32)))
        times = []
        for _ in range(steps):
            for (_, gradient), rng in zip(made, rngs):
                gradient[:] = rng.standard_t(3, d)

            def one(rank: int) -> float:
                step, gradient = made[rank]
                start = time.perf_counter()
                step.update(gradient, gradient, clear_gradient=True)
                return time.perf_counter() - start

            times.append(max(group.run(one)))
    finally:
        group.close()
    return float(np.median(times[1:]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parameters", type=int, default=25_600_000)
    parser.add_argument("--density", type=float, default=0.001)
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--steps", type=int, default=7)
    args = parser.parse_args()
    print(f"d = {args.parameters:,}, density {args.density}; median step of the slowest "
          f"worker, steps 2..{args.steps}")
    for workers in args.workers:
        plain = step_seconds(Compression.gtopk(args.density, momentum_correction=True),
                             args.parameters, workers, args.steps)
        exact = step_seconds(Compression.gtopk(args.density, exact=True,
                                               momentum_correction=True),
                             args.parameters, workers, args.steps)
        print(f"P = {workers}: plain {plain * 1e3:.1f} ms, exact {exact * 1e3:.1f} ms, "
              f"ratio {exact / plain:.2f}", flush=True)


if __name__ == "__main__":
    main()
