"""The scale study's runs (results/scale) as the table shipped in the package
(gtopk_hvd/data/convergence_lm.json), which the planner reads by default.

    python scripts/convergence_table.py [--from results/scale] [--to gtopk_hvd/data/...]
"""

from __future__ import annotations

import argparse
import subprocess

from gtopk_hvd import convergence


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--from", dest="source", default=str(convergence.DEFAULT_DIR))
    parser.add_argument("--to", default=str(convergence.TABLE))
    args = parser.parse_args()
    runs = convergence.load_runs(args.source)
    commit = subprocess.run(["git", "log", "-1", "--format=%h", "--", args.source],
                            capture_output=True, text=True).stdout.strip()
    convergence.write_table(runs, args.to, f"{convergence.describe(runs, args.source)} "
                                           f"(results/scale at {commit or 'an unknown commit'})")
    print(f"{len(runs)} runs -> {args.to}")


if __name__ == "__main__":
    main()
