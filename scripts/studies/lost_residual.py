"""What a worker's lost residual costs: the LM of the scale study with one worker's residual
(and velocity) set to zero mid-run, as for a worker that died and was replaced by a new one,
against the same run without the loss (results/scale/, the scale study's histories).

    .venv/bin/python scripts/studies/lost_residual.py --at 150

A simulation (`examples/simulated_cluster.py lm --lose-residual-at`; the simulated cluster ends
bitwise where the mpirun job does at P <= 8: tests/tools/test_simulate.py). Each run is the scale
study's (global batch 64, lr 40, 300 steps, the LM of size 128 over 10,000 words) up to the
loss, which the script checks: every evaluation before it equals the scale study's. Writes
results/lost_residual/<run>.json and summary.md: the residual lost (L2, entries, against the
update of that step) and the final validation perplexity with and without the loss.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RUNS = [("gtopk", 0.001, 4), ("gtopk", 0.01, 4), ("gtopk", 0.001, 32)]
MODEL = ["--size", "128", "--vocab-size", "10000", "--global-batch", "64", "--lr", "40",
         "--max-steps", "300", "--eval-every", "25", "--quiet"]


def train(scheme: str, density: float, workers: int, at: int, out: Path) -> Path:
    path = out / f"lm_{scheme}_{density:g}_p{workers}_lost{at}.json"
    if not path.exists():
        command = [sys.executable, "-W", "ignore", str(ROOT / "examples/simulated_cluster.py"),
                   "lm", "--workers", str(workers), "--compression", scheme, "--density",
                   str(density), "--lose-residual-at", str(at), "--history", str(path), *MODEL]
        subprocess.run(command, check=True, capture_output=True,
                       env={**os.environ, "OMP_NUM_THREADS": "1"})
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--at", type=int, default=150, help="the step whose residual is lost")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--out", type=Path, default=ROOT / "results" / "lost_residual")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    with ThreadPoolExecutor(args.jobs) as pool:
        paths = list(pool.map(lambda run: train(*run, args.at, args.out), RUNS))
    lines = [f"# A worker's residual lost at step {args.at} "
             f"(`python scripts/studies/lost_residual.py --at {args.at}`; simulated workers)", "",
             "| scheme | density | P | residual lost: L2 (entries) | update L2 that step | "
             "final perplexity, lost / not lost | change |", "|---|---|---|---|---|---|---|"]
    for (scheme, density, workers), path in zip(RUNS, paths):
        lost_run = json.loads(path.read_text())
        calm = json.loads((ROOT / "results" / "scale" /
                           f"lm_{scheme}_{density:g}_p{workers}.json").read_text())
        before = [e["valid_perplexity"] for e in lost_run["evaluations"] if e["step"] <= args.at]
        calm_before = [e["valid_perplexity"] for e in calm["evaluations"]
                       if e["step"] <= args.at]
        if before != calm_before:
            raise SystemExit(f"{path.name}: not the scale study's run before step {args.at}")
        lost, end = lost_run["lost_residual"], lost_run["evaluations"][-1]["valid_perplexity"]
        calm_end = calm["evaluations"][-1]["valid_perplexity"]
        lines.append(f"| {scheme} | {density:g} | {workers} | {lost['l2']:.3g} "
                     f"({lost['nonzero']:,}) | {lost['update_l2']:.3g} | {end:.2f} / "
                     f"{calm_end:.2f} | {100 * (end / calm_end - 1):+.2f}% |")
    (args.out / "summary.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
