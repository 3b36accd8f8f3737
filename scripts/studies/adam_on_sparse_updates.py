"""What Adam does with error-feedback sparse updates: a one-coordinate model (not training).

One coordinate sees the same gradient g every step. Dense: Adam gets g each step. Sparse with
error feedback at density rho: the residual sums g, and every 1/rho steps the coordinate is
selected and Adam gets the sum G = g / rho, zeros in between (SGD would then move the coordinate
exactly as far as dense: the sum is kept). Printed: how far Adam moves the coordinate per step,
in units of the learning rate, at each density; dense is 1. In the steady state m averages g
and v averages G^2 rho = g^2 / rho, so the ratio tends to sqrt(rho): Adam's scale invariance
turns the spikes into a smaller effective learning rate, while AdamW's decoupled weight decay
still acts at the full rate every step.

    python scripts/studies/adam_on_sparse_updates.py [--steps 40000]
"""

from __future__ import annotations

import argparse
import math


def displacement_per_step(period: int, steps: int, beta1: float = 0.9, beta2: float = 0.999,
                          eps: float = 1e-8) -> float:
    """Adam's mean step (in learning rates) on g = 1 delivered every `period` steps as a sum."""
    m = v = position = residual = 0.0
    for t in range(1, steps + 1):
        residual += 1.0
        update = 0.0
        if t % period == 0:
            update, residual = residual, 0.0
        m = beta1 * m + (1 - beta1) * update
        v = beta2 * v + (1 - beta2) * update * update
        m_hat, v_hat = m / (1 - beta1 ** t), v / (1 - beta2 ** t)
        position += m_hat / (math.sqrt(v_hat) + eps)
    return position / steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40000, help="steps simulated (default 40000)")
    steps = parser.parse_args().steps
    print("| density | Adam's step / lr | sqrt(density) |")
    print("|---|---|---|")
    for period in (1, 10, 100, 1000):
        density = 1 / period
        print(f"| {density:g} | {displacement_per_step(period, steps):.3f} | "
              f"{math.sqrt(density):.3f} |")


if __name__ == "__main__":
    main()
