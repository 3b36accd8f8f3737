"""The spread of every accuracy the test suite asserts a threshold on, over seeds and CPU paths.

A training run on this project's test data (digits: 360 test images, one image = 0.28 points)
is deterministic on one machine but moves by several images with the rounding of another CPU:
torch's, oneDNN's and MKL's kernels dispatch on the instruction set, and our own kernels are
compiled with -march=native (FMA contraction). A threshold set from one run on one machine is
then a coin toss on the next. This script measures, for each thresholded run of the suite, the
figure the test asserts on, over several seeds (a seed moves the trajectory at least as much
as rounding does) and under a baseline instruction set (torch's `ATEN_CPU_CAPABILITY=default`,
oneDNN at SSE4.1, MKL at SSE4.2: what a machine without AVX2 runs), so that each test's margin
is set from a measured spread (docs/testing.md, "Thresholds and their margins").

    python scripts/studies/accuracy_spread.py [--cases NAME ...] [--seeds -1 1 2] [--variants ...]
    python scripts/studies/accuracy_spread.py --report

A run appends one JSON line per run to results/accuracy_spread/runs.jsonl (a case, seed and
variant already there with its figures is skipped); --report prints, per floor of
tests/helpers/margins.py, the measured range, the margin the rule asks for and the floor it
allows.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO_ROOT / "tests"))

from helpers import margins  # noqa: E402
from helpers.mpi_launcher import LAUNCHERS, MPI_PROGRAMS, run_with_time_limit  # noqa: E402

SUITE_SEED = -1  # no seed given: the example's default, GTOPK_TEST_SEED unset (0)
RUNS = margins.RUNS

# What a CPU without AVX2 runs: torch's default kernels, oneDNN (TensorFlow) at SSE4.1 and MKL
# at SSE4.2. Our own kernels' rounding differs only through FMA contraction, which the
# "native" variant has and the seeds cover.
VARIANTS = {
    "native": {},
    "baseline": {"ATEN_CPU_CAPABILITY": "default", "ONEDNN_MAX_CPU_ISA": "SSE41",
                 "MKL_ENABLE_INSTRUCTIONS": "SSE4_2"},
}


def result_fields(output: str) -> dict[str, float]:
    """test_accuracy of digits_common's RESULT line (horovodrun puts "[0]<stdout>:" before it)."""
    match = re.search(r"RESULT (compression=.*)$", output, re.MULTILINE)
    fields = dict(item.split("=", 1) for item in match.group(1).split()) if match else {}
    return {key: float(fields[key]) for key in ("test_accuracy",) if key in fields}


def perplexity_drop(output: str) -> dict[str, float]:
    """pytorch_lm.py's RESULT: 1 - valid perplexity / the vocabulary (10,002 tokens, about an
    untrained model's perplexity), the fraction of it that training removed."""
    match = re.search(r"^RESULT .*valid_perplexity=([0-9.]+)", output, re.MULTILINE)
    return {"perplexity_drop": round(1 - float(match.group(1)) / 10_002, 4)} if match else {}


def test_accuracy_line(output: str) -> dict[str, float]:
    match = re.search(r"TEST_ACCURACY ([0-9.]+)", output)
    return {"test_accuracy": float(match.group(1))} if match else {}


def amp_runs(output: str) -> dict[str, float]:
    """The loss-scaling programs: per mode, the accuracy of the run that overflows, of the one
    that does not, and their gap (overflow - clean), which the programs assert on."""
    runs: dict[str, dict[str, float]] = {}
    for mode, run, value in re.findall(r"RESULT mode=(\w+) run=(overflow|no overflow) "
                                       r"accuracy=([0-9.]+)", output):
        runs.setdefault(mode, {})["clean" if run == "no overflow" else "overflow"] = float(value)
    for label, overflow, clean in re.findall(
            r"RESULT (.*?) overflow=\{'accuracy': ([0-9.]+).*?no_overflow=\{'accuracy': "
            r"([0-9.]+)", output):
        runs[label.split()[-1]] = {"overflow": float(overflow), "clean": float(clean)}
    figures: dict[str, float] = {}
    wrapped = re.search(r"RESULT .*? wrapped=\{'accuracy': ([0-9.]+)", output)
    if wrapped:
        figures["wrapped"] = float(wrapped.group(1))
    for mode, run in runs.items():
        figures[f"{mode}_clean"] = run["clean"]
        figures[f"{mode}_gap"] = round(run["overflow"] - run["clean"], 4)
    return figures


@dataclass(frozen=True)
class Case:
    """One run of the suite whose figure a test asserts a threshold on."""

    name: str
    launcher: str
    script: str
    workers: int
    arguments: tuple[str, ...]
    parse: Callable[[str], dict[str, float]]
    seed_arguments: tuple[str, ...] = ("--seed", "{seed}")  # () : seeded by GTOPK_TEST_SEED
    timeout_s: float = 3600  # a hang guard: the study may run niced beside other work
    environment: dict[str, str] = field(default_factory=dict)


def digits(name: str, launcher: str, script: str, *arguments: str, workers: int = 4) -> Case:
    quiet = ("--quiet",) if "torch" in script or "ddp" in script else ()
    return Case(name, launcher, f"examples/{script}", workers, (*arguments, *quiet),
                result_fields)


# Each case runs exactly what its test runs (tests/*/test_*.py), plus the seed.
CASES = {case.name: case for case in [
    digits("ddp_digits_gtopk", "torchrun", "ddp_digits.py", "--compression", "gtopk",
           "--density", "0.01"),
    digits("ddp_digits_dense", "torchrun", "ddp_digits.py", "--compression", "none",
           "--density", "0.01"),
    digits("pytorch_digits_gtopk", "mpirun", "pytorch_digits.py", "--compression", "gtopk",
           "--density", "0.01"),
    digits("pytorch_digits_gtopk_3", "mpirun", "pytorch_digits.py", "--compression", "gtopk",
           "--density", "0.01", workers=3),
    digits("pytorch_digits_gtopk_horovodrun", "horovodrun", "pytorch_digits.py", "--compression",
           "gtopk", "--density", "0.01"),
    *(digits(f"{script.split('_')[0]}_{scheme}_10", launcher, script, "--compression", scheme,
             "--density", "0.01", "--epochs", "10")
      for script, scheme, launcher in margins.OTHER_SCHEMES),
    digits("tensorflow2_digits_gtopk", "mpirun", "tensorflow2_digits.py", "--epochs", "10"),
    digits("tensorflow2_digits_dense", "mpirun", "tensorflow2_digits.py", "--compression",
           "none", "--epochs", "10"),
    digits("keras_digits_keras3", "mpirun", "keras_digits.py", "--epochs", "10"),
    Case("keras_digits_tf_keras", "mpirun", "examples/keras_digits.py", 4, ("--epochs", "10"),
         result_fields, environment={"TF_USE_LEGACY_KERAS": "1"}),
    *(Case(f"lm_{compression}", "mpirun", "examples/pytorch_lm.py", 2,
           ("--compression", compression, "--density", "0.01", "--size", "32", "--max-steps",
            "8", "--eval-every", "4", "--quiet"), perplexity_drop)
      for compression in ("none", "gtopk")),
    Case("lightning", "python", "examples/lightning_ddp.py", 2,
         ("--devices", "2", "--epochs", "4"), test_accuracy_line),
    Case("hvd_pytorch_mnist_dense", "mpirun", "examples/horovod/pytorch_mnist.py", 2,
         ("--gtopk-density", "0"), test_accuracy_line),
    Case("hvd_pytorch_mnist_gtopk", "mpirun", "examples/horovod/pytorch_mnist.py", 2,
         ("--gtopk-density", "0.01"), test_accuracy_line),
    Case("hvd_tensorflow2_mnist", "mpirun", "examples/horovod/tensorflow2_mnist.py", 2,
         ("--gtopk-density", "0.01"), test_accuracy_line, seed_arguments=()),
    Case("hvd_tensorflow2_keras_mnist", "mpirun", "examples/horovod/tensorflow2_keras_mnist.py",
         2, ("--gtopk-density", "0.01"), test_accuracy_line, seed_arguments=()),
    Case("hvd_tensorflow2_keras_mnist_tf_keras", "mpirun",
         "examples/horovod/tensorflow2_keras_mnist.py", 2, ("--gtopk-density", "0.01"),
         test_accuracy_line, seed_arguments=(), environment={"TF_USE_LEGACY_KERAS": "1"}),
    Case("hvd_keras_mnist_dense", "mpirun", "examples/horovod/keras_mnist.py", 2,
         ("--gtopk-density", "0"), test_accuracy_line, seed_arguments=()),
    Case("hvd_keras_mnist_gtopk_tf_keras", "mpirun", "examples/horovod/keras_mnist.py", 2,
         ("--gtopk-density", "0.01"), test_accuracy_line, seed_arguments=(),
         environment={"TF_USE_LEGACY_KERAS": "1"}),
    *(Case(f"torch_amp_{mode}", "mpirun", "mpi_torch_amp.py", 2, (mode,), amp_runs,
           seed_arguments=()) for mode in ("gtopk", "topk", "dense")),
    Case("ddp_amp", "torchrun", "torchrun_ddp_amp.py", 2, (), amp_runs, seed_arguments=()),
    *(Case(f"keras_amp_{flavour}", "mpirun", "mpi_tensorflow_surface.py", 2, arguments,
           amp_runs, seed_arguments=()) for flavour, arguments in (("keras3", ()),
                                                                   ("tf_keras", ("--tf-keras",)))),
]}


def command_of(case: Case, seed: int) -> list[str]:
    """The case's command; seed SUITE_SEED: exactly as the suite runs it (its own seed)."""
    seeded = [] if seed == SUITE_SEED else [argument.format(seed=seed)
                                            for argument in case.seed_arguments]
    path = MPI_PROGRAMS / case.script if (MPI_PROGRAMS / case.script).exists() else (
        REPO_ROOT / case.script)
    if case.launcher == "python":
        return [sys.executable, str(path), *case.arguments, *seeded]
    program = [str(path)] if case.launcher == "torchrun" else [sys.executable, str(path)]
    return LAUNCHERS[case.launcher](case.workers, [*program, *case.arguments, *seeded])


def done_runs() -> list[dict]:
    if not RUNS.exists():
        return []
    return [json.loads(line) for line in RUNS.read_text().splitlines() if line.strip()]


def run(cases: list[str], seeds: list[int], variants: list[str]) -> None:

    done = {(r["case"], r["seed"], r["variant"]) for r in done_runs()
            if set(r) - {"case", "seed", "variant", "status", "seconds", "tail"}}  # with figures
    RUNS.parent.mkdir(parents=True, exist_ok=True)
    for variant in variants:
        for seed in seeds:
            for name in cases:
                case = CASES[name]
                if (name, seed, variant) in done:
                    continue
                saved = dict(os.environ)
                os.environ.update(case.environment)
                os.environ.update(VARIANTS[variant])
                os.environ.update({"OMP_NUM_THREADS": "1", "TF_CPP_MIN_LOG_LEVEL": "3"})
                if seed != SUITE_SEED:
                    os.environ["GTOPK_TEST_SEED"] = str(seed)
                start = time.monotonic()
                try:
                    status, output = run_with_time_limit(command_of(case, seed), case.timeout_s,
                                                         name)
                except AssertionError as error:
                    status, output = -1, str(error)
                finally:
                    os.environ.clear()
                    os.environ.update(saved)
                figures = case.parse(output)  # a failed run's figures count too
                record = {"case": name, "seed": seed, "variant": variant, "status": status,
                          "seconds": round(time.monotonic() - start, 1), **figures}
                if status != 0 or not figures:
                    record["tail"] = output[-1500:]
                print(json.dumps({k: v for k, v in record.items() if k != "tail"}), flush=True)
                with RUNS.open("a") as out:
                    out.write(json.dumps(record) + "\n")


def report() -> None:
    """Per floor of tests/helpers/margins.py: the runs measured, their range, the margin the
    rule asks for and the floor it allows (a Markdown table, as docs/testing.md has it)."""
    print("| case | figure | runs | min (native) | median | max | baseline ISA | margin | "
          "allowed | floor |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for floor in margins.FLOORS.values():
        found = margins.measured(floor.case, floor.figure)
        if not found:
            print(f"| {floor.case} | {floor.figure} | 0 | | | | | | | {floor.value} |")
            continue
        values = [value for value, _ in found]
        native = [value for value, variant in found if variant == "native"] or values
        baseline = " ".join(f"{value:.4f}" for value, variant in found if variant == "baseline")
        margin = margins.margin_of(values)
        print(f"| {floor.case} | {floor.figure} | {len(values)} | {min(native):.4f} | "
              f"{statistics.median(native):.4f} | {max(native):.4f} | {baseline or '-'} | "
              f"{margin:.4f} | {min(values) - margin:.4f} | {floor.value} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--report", action="store_true",
                        help="print each floor against its measured spread (Markdown) and stop")
    parser.add_argument("--cases", nargs="+", default=list(CASES), choices=list(CASES),
                        metavar="CASE", help="the cases to run (default: all)")
    parser.add_argument("--seeds", nargs="+", type=int, default=[SUITE_SEED, 1, 2],
                        help=f"seeds to run ({SUITE_SEED}: the suite's own)")
    parser.add_argument("--variants", nargs="+", default=["native"], choices=list(VARIANTS),
                        help="native: as built; baseline: the instruction set of a CPU "
                             "without AVX2")
    args = parser.parse_args()
    if args.report:
        report()
    else:
        run(args.cases, args.seeds, args.variants)


if __name__ == "__main__":
    main()
