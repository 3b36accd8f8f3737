"""Convergence on digits with 4 workers: dense vs Top-k vs gTop-k, same epochs and seed.

    .venv/bin/python scripts/studies/convergence.py            # 9 runs, then the table and the plot
    .venv/bin/python scripts/studies/convergence.py --skip-train

Each run is `mpirun -np <workers> examples/pytorch_digits.py --compression C --density D
--history <out>/<name>.json` (real Horovod and MPI): dense, then Top-k and gTop-k at densities
0.01 and 0.001, each plain (error feedback only, as in the gTop-k paper) and with DGC's
momentum correction and density warm-up (`--momentum-correction --warmup-epochs 3`). The
script then prints a table (final and best test accuracy, final test loss, bytes each worker
sent per step) and draws test accuracy and training / test loss per epoch into
<out>/convergence.png (top row plain, bottom row with DGC's options, dense in both).
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import time
from pathlib import Path

from gtopk_hvd._mpirun import stop_mpirun

REPO = Path(__file__).resolve().parents[2]
DGC_OPTIONS = ("--momentum-correction", "--warmup-epochs", "3")
RUNS = (("none", 1.0, False),
        *((scheme, density, dgc) for dgc in (False, True) for density in (0.01, 0.001)
          for scheme in ("topk", "gtopk")))
LABELS = {"none": "dense", "topk": "Top-k", "gtopk": "gTop-k"}


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--timeout", type=float, default=1200, help="seconds per run")
    parser.add_argument("--out", type=Path, default=Path("results/convergence"))
    parser.add_argument("--skip-train", action="store_true", help="table and plot of saved runs")
    return parser.parse_args()


def run_name(compression: str, density: float, dgc: bool) -> str:
    if compression == "none":
        return "dense"
    return f"{compression}_{density:g}" + ("_dgc" if dgc else "")


def train(args: argparse.Namespace, compression: str, density: float, dgc: bool) -> None:
    name = run_name(compression, density, dgc)
    command = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", str(args.workers),
               "-x", "OMP_NUM_THREADS=1", sys.executable, str(REPO / "examples/pytorch_digits.py"),
               "--compression", compression, "--density", str(density), "--epochs",
               str(args.epochs), "--seed", str(args.seed), "--quiet",
               "--history", str(args.out / f"{name}.json"), *(DGC_OPTIONS if dgc else ())]
    start = time.monotonic()
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True, start_new_session=True)
    try:
        output, _ = process.communicate(timeout=args.timeout)
    except subprocess.TimeoutExpired:
        stop_mpirun(process)
        output, _ = process.communicate()
        raise SystemExit(f"convergence: run {name} ran past {args.timeout} s; killed:\n"
                         f"{output[-3000:]}") from None
    if process.returncode != 0:
        raise SystemExit(f"convergence: run {name} failed (exit {process.returncode}):\n"
                         f"{output[-3000:]}")
    result = re.search(r"^RESULT .*$", output, re.MULTILINE)
    (args.out / f"{name}.result").write_text(result.group(0) + "\n")
    print(f"convergence: {name} in {time.monotonic() - start:.0f} s: {result.group(0)}",
          flush=True)


def load(args: argparse.Namespace) -> dict[str, tuple[list[dict], dict[str, str]]]:
    runs = {}
    for run in RUNS:
        name = run_name(*run)
        history_path, result_path = args.out / f"{name}.json", args.out / f"{name}.result"
        if not history_path.exists() or not result_path.exists():
            raise SystemExit(f"convergence: no saved run {name} in {args.out}")
        result = dict(re.findall(r"(\w+)=(\S+)", result_path.read_text()))
        runs[name] = (json.loads(history_path.read_text()), result)
    return runs


def report(runs: dict[str, tuple[list[dict], dict[str, str]]]) -> None:
    dense_accuracy = float(runs["dense"][1]["test_accuracy"])
    print("\n| run | density | final test accuracy | vs dense (points) | best | final test loss "
          "| bytes sent per worker per step |")
    print("|---|---|---|---|---|---|---|")
    for name, (history, result) in runs.items():
        accuracy = float(result["test_accuracy"])
        best = max(epoch["test_accuracy"] for epoch in history)
        print(f"| {name} | {result['density']} | {accuracy:.4f} | "
              f"{100 * (accuracy - dense_accuracy):+.1f} | {best:.4f} | {result['test_loss']} | "
              f"{int(result['bytes_per_step']):,} |")


def plot(runs: dict[str, tuple[list[dict], dict[str, str]]], args: argparse.Namespace) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(2, 2, figsize=(12, 9), sharex=True)
    for row, dgc in enumerate((False, True)):
        accuracy, loss = axes[row]
        for name, (history, result) in runs.items():
            if name != "dense" and name.endswith("_dgc") != dgc:
                continue
            epochs = [epoch["epoch"] for epoch in history]
            label = LABELS[result["compression"]] + (
                "" if name == "dense" else f" {result['density']}")
            line, = accuracy.plot(epochs, [epoch["test_accuracy"] for epoch in history],
                                  label=label)
            loss.plot(epochs, [epoch["train_loss"] for epoch in history],
                      color=line.get_color(), label=f"{label} train")
            loss.plot(epochs, [epoch["test_loss"] for epoch in history],
                      color=line.get_color(), linestyle="--", label=f"{label} test")
        accuracy.set_ylabel("test accuracy")
        accuracy.set_ylim(0.5, 1.0)
        accuracy.set_title("error feedback only" if not dgc
                           else "with DGC momentum correction and warm-up")
        loss.set_ylabel("cross-entropy")
        loss.set_yscale("log")
        for axis in (accuracy, loss):
            axis.set_xlabel("epoch")
            axis.grid(True, alpha=0.3)
            axis.legend(fontsize=7)
    figure.suptitle(f"digits, small CNN, {args.workers} workers, seed {args.seed}, "
                    "SGD momentum 0.9 (examples/pytorch_digits.py)")
    figure.tight_layout()
    path = args.out / "convergence.png"
    figure.savefig(path, dpi=120)
    return path


def main() -> None:
    args = parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    if not args.skip_train:
        for run in RUNS:
            train(args, *run)
    runs = load(args)
    report(runs)
    print(f"\nplot: {plot(runs, args)}")


if __name__ == "__main__":
    main()
