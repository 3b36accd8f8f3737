"""The table of scripts/adamw_study.sh: one row per run (results/adamw/<name>.json, or the folder
given), the validation perplexity at every evaluation, the test perplexity and the bytes each
worker sent per step, dense first.

    .venv/bin/python scripts/adamw_table.py [results/adamw]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def main(folder: str = "results/adamw") -> None:
    runs = sorted(Path(folder).glob("*.json"), key=lambda p: (p.stem != "dense", p.stem))
    if not runs:
        raise SystemExit(f"no runs in {folder}: run scripts/adamw_study.sh first")
    histories = {path.stem: json.loads(path.read_text()) for path in runs}
    steps = [e["step"] for e in histories[runs[0].stem]["evaluations"]]
    print("| run | bytes / step | " + " | ".join(f"step {s}" for s in steps) + " | test |")
    print("|---" * (len(steps) + 3) + "|")
    for name, history in histories.items():
        by_step = {e["step"]: e["valid_perplexity"] for e in history["evaluations"]}
        cells = [f"{by_step[s]:.1f}" if s in by_step else "-" for s in steps]
        sent = history["evaluations"][-1]["bytes_per_step"]
        print(f"| {name} | {sent:,} | " + " | ".join(cells)
              + f" | {history['test_perplexity']:.1f} |")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", nargs="?", default="results/adamw",
                        help="the runs' history JSONs (scripts/adamw_study.sh's folder)")
    main(parser.parse_args().folder)
