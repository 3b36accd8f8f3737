"""The scale study's runs as the tables shipped in the package
(gtopk_hvd/data/convergence_lm_<name>.json, `gtopk_hvd.convergence.SHIPPED`), which the planner
reads: the default, at 8 sequences a worker, and the global batch of 64.

    python scripts/studies/convergence_table.py [--only NAME]
"""

from __future__ import annotations

import argparse
import subprocess

from gtopk_hvd import convergence


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=list(convergence.SHIPPED), default=None)
    args = parser.parse_args()
    for table in convergence.SHIPPED.values():
        if args.only not in (None, table.name):
            continue
        runs = convergence.load_shipped_sources(table)
        folders = [folder for folder, _ in table.sources]
        commit = subprocess.run(["git", "log", "-1", "--format=%h", "--", *folders],
                                capture_output=True, text=True).stdout.strip()
        convergence.write_table(runs, table.path, f"the LSTM language model of the scale "
                                f"study at {table.regime} ({', '.join(folders)} at "
                                f"{commit or 'an unknown commit'})")
        print(f"{table.name}: {len(runs)} runs -> {table.path}")


if __name__ == "__main__":
    main()
