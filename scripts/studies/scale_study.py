"""Convergence at scale: a model with P simulated workers per scheme, at one global batch.

    .venv/bin/python scripts/studies/scale_study.py run --workers 4 16 64 --jobs 2
    .venv/bin/python scripts/studies/scale_study.py report
    .venv/bin/python scripts/studies/scale_study.py sweep --model digits --sweep-lrs 0.04 0.08 0.16
    .venv/bin/python scripts/studies/scale_study.py run --model digits --lr 0.08 --jobs 1
    .venv/bin/python scripts/studies/scale_study.py report --model digits
    .venv/bin/python scripts/studies/scale_study.py run --model digits --momentum-correction \
        --jobs 1
    .venv/bin/python scripts/studies/scale_study.py run --workers 32 --schemes dense topk_0.01 \
        --seed 7
    .venv/bin/python scripts/studies/scale_study.py seeds
    .venv/bin/python scripts/studies/scale_study.py run --workers 32 --lr 4 --momentum 0.9 \
        --momentum-correction --warmup-epochs 0.1
    .venv/bin/python scripts/studies/scale_study.py run --per-worker-batch 8 --workers 32 --lr 80 \
        --lr-warmup-steps 30 --schemes dense oktopk_0.01 topk_0.01

--model picks what is trained (MODELS below: the example, its metric and the defaults): lm
(default) is the LSTM language model of examples/simulated_cluster.py lm, scored by validation
perplexity (lower is better) every --eval-every of --steps steps; digits is the CNN of
examples/simulated_cluster.py digits (examples/pytorch_digits.py), scored by test accuracy
(higher is better) after each of --epochs epochs. --lr is the total learning rate of the step
over the global batch: the digits example scales its --lr by P (Horovod's convention), so it is
handed --lr / P, and the total rate, the epochs and the parameter count are written into the
history afterwards.

`run` trains every (scheme, P) whose history is not yet in --out (so an interrupted study
resumes), --jobs runs at a time, every run with the same global batch, length, learning rate and
schedule; `sweep` runs dense at several learning rates (the rate is picked on dense first;
--sweep-schemes sweeps every --schemes entry). `report` writes the model's summary (lm:
--out/summary.md, digits: --out/digits_summary.md: the final metric per scheme and P, and the
steps each scheme needed to reach dense's final metric at the same P and to come --near it) and
figure (--out/lm_scale.png, --out/digits_scale.png: the final metric against P). Only the LM has
the modelled time to accuracy (time_lines): the table and the figure's second panel.

--per-worker-batch B keeps B sequences on every worker (the global batch B x P grows with P, as
users run data-parallel training) instead of the fixed global batch, into
results/scale/per_worker<B>/; --lr-warmup-steps N warms the learning rate up linearly over the
first N steps (Goyal et al., 2017). Pick the rate on dense at each P (`sweep --per-worker-batch
8 --sweep-workers 32 --sweep-lrs 40 80 160 --lr-warmup-steps 30`), then `run` at that rate.

--seed N gives the example its seed (the runs above use its default, 42) and the history a
name ending in _seed<N>; `seeds` tables every (scheme, P) run at several seeds against dense at
the same seed (--out/lm_seeds.md).

--momentum-correction trains every sparse scheme with DGC's momentum correction, into
results/scale/momentum_correction/ unless --out says otherwise. The digits CNN trains with SGD
momentum 0.9 (dense is the same run as without it); the LM trains with plain SGD, so for the LM
it needs --momentum M (SGD momentum, dense included: --lr 4 at 0.9 takes steps of lr 40's size);
--momentum without the correction goes into results/scale/momentum/. --warmup-epochs N gives
the sparse schemes DGC's density warm-up over the first N epochs (the example's stages above
the density).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import matplotlib
import matplotlib.ticker

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from gtopk_hvd import convergence, model_shapes, plan  # noqa: E402
from gtopk_hvd.bench import devices  # noqa: E402

LINKS = ROOT / "results" / "links_scale" / "model.json"  # scripts/studies/link_scale.py's fit


def link_model() -> tuple[float, dict[str, float], str]:
    """(latency s, each scheme's achieved link share, where from): the emulated links' fit
    when scripts/studies/link_scale.py has written one, else 50 us and the full rate."""
    if LINKS.exists():
        fit = json.loads(LINKS.read_text())
        return (fit["alpha_s"], plan.link_shares(str(LINKS)),
                f"latency {fit['alpha_s'] * 1e6:.0f} us and each scheme's achieved share of "
                f"the link rate as measured on emulated links ({LINKS.relative_to(ROOT)}: "
                + ", ".join(f"{s} {v:.0%}" for s, v in fit["link_share"].items()) + ")")
    return 50e-6, plan.link_shares(None), "latency 50 us, links at their full rate"


SCHEMES = {  # name -> (--compression, --density)
    "dense": ("none", 1.0),
    "topk_0.01": ("topk", 0.01),
    "gtopk_0.01": ("gtopk", 0.01),
    "topk_0.001": ("topk", 0.001),
    "gtopk_0.001": ("gtopk", 0.001),
    "gtopk-exact_0.001": ("gtopk-exact", 0.001),
    "micro_0.001": ("micro", 0.001),
    "exdyna_0.001": ("exdyna", 0.001),
    "sketch_0.001": ("sketch", 0.001),
    "oktopk_0.01": ("oktopk", 0.01),
    "oktopk_0.001": ("oktopk", 0.001),
    # Exact gTop-k at Top-k's bytes (the equal-bytes cells): it sends log2(P) 8k + 8k (P-1)/P
    # bytes, Top-k (P-1) 8k, so at P = 32 density 0.0052 sends Top-k 0.001's and 0.052 Top-k
    # 0.01's; at P = 8, 0.0018 and 0.018.
    "gtopk-exact_0.0052": ("gtopk-exact", 0.0052),
    "gtopk-exact_0.052": ("gtopk-exact", 0.052),
    "gtopk-exact_0.0018": ("gtopk-exact", 0.0018),
    "gtopk-exact_0.018": ("gtopk-exact", 0.018),
    # Plain gTop-k at Top-k's bytes: log2(P) 8k against (P - 1) 8k, so at P = 32 density 0.0062
    # sends Top-k 0.001's and 0.062 Top-k 0.01's; at P = 8, 0.0023 and 0.023.
    "gtopk_0.0062": ("gtopk", 0.0062),
    "gtopk_0.062": ("gtopk", 0.062),
    "gtopk_0.0023": ("gtopk", 0.0023),
    "gtopk_0.023": ("gtopk", 0.023),
}
# DDP's own compressions, in place of dense's all-reduce (the simulated cluster runs torch's
# bf16_compress_hook and powerSGD_hook arithmetic: gtopk_hvd/torch/ddp_baselines.py)
BASELINES = {  # name -> the simulated cluster's options for a DDP baseline
    "bf16": ("--baseline", "bf16"),
    **{f"powersgd-r{rank}": ("--baseline", "powersgd", "--powersgd-rank", str(rank))
       for rank in (1, 2, 4)},
}
SCHEMES.update(dict.fromkeys(BASELINES, ("none", 1.0)))


@dataclass(frozen=True)
class Model:
    """What --model trains (examples/simulated_cluster.py <name>) and how a run is scored."""

    name: str  # the example's model argument and the prefix of every file
    heading: str  # the summary's title
    metric: str  # the key of an evaluation in the history
    quantity: str  # the metric in words, e.g. "validation perplexity"
    short: str  # the metric in one word, e.g. "perplexity"
    lower_is_better: bool
    scale: float  # the metric is shown x scale (accuracy in %)
    near_ratio: bool  # --near: a ratio of dense's final (else a distance in the metric)
    lr_per_worker: bool  # the example multiplies --lr by P: it is handed lr / P
    same: str  # what every run shares besides the global batch, in words
    figure: str
    summary: str
    defaults: dict = field(default_factory=dict)  # parse_args' defaults
    options: tuple[str, ...] = ()  # further options of the example

    def show(self, value: float) -> str:
        return f"{value * self.scale:.1f}"

    def better(self, value: float, target: float) -> bool:
        """value is at target or better."""
        return value <= target if self.lower_is_better else value >= target

    def near_target(self, target: float, near: float) -> float:
        if self.near_ratio:
            return target * near if self.lower_is_better else target / near
        return target + near if self.lower_is_better else target - near

    def near_text(self, near: float) -> str:
        if self.near_ratio:
            return f"{(near - 1) * 100:g}%"
        return f"{near * self.scale:g} point{'' if near * self.scale == 1 else 's'}"

    def best(self, finals: dict[float, float]) -> float:
        return (min if self.lower_is_better else max)(finals, key=finals.get)

    def length(self, args: argparse.Namespace) -> list[str]:
        """The example's options for how long it trains and how often it evaluates."""
        if self.name == "lm":  # --epochs: enough that --steps decides (an epoch is >= 1 step)
            return ["--max-steps", str(args.steps), "--eval-every", str(args.eval_every),
                    "--epochs", str(args.steps)]
        return ["--epochs", str(args.epochs)]

    def setup(self, run: dict, corrected: bool, runs: dict) -> str:
        """The summary's line on how every run was trained, read from `run` (corrected: the
        sparse schemes with momentum correction; runs: every (scheme, P) -> history or None)."""
        if self.name == "lm":
            lengths = {f"{s} at P = {p}": r["steps"] for (s, p), r in runs.items() if r}
            steps = f"{run['steps']} steps"
            if len(set(lengths.values())) > 1:  # e.g. a sparse run longer than dense's
                steps = ("steps " + ", ".join(f"{name} {n}" for name, n in lengths.items())
                         + " (each with the schedule over its own)")
            momentum = run.get("momentum", 0.0)
            optimizer = f"SGD momentum {momentum:g}" if momentum else "plain SGD"
            if corrected:
                optimizer += ", the sparse schemes with DGC's momentum correction"
            if warmup := run.get("warmup_epochs", 0.0):
                optimizer += (f" and density warm-up over {warmup:g} epochs "
                              f"({round(warmup * run['steps_per_epoch'])} steps)")
            per_worker = {r["global_batch"] / r["workers"] for r in runs.values() if r}
            batch = (f"{run['global_batch'] // run['workers']} sequences a worker (the global "
                     "batch grows with P)" if len(per_worker) == 1 and len(
                         {r["global_batch"] for r in runs.values() if r}) > 1
                     else f"Global batch {run['global_batch']} sequences")
            return (f"{batch}, {steps}, "
                    f"lr {run['lr']:g} (x0.25 at 50% and 75%), {optimizer}, "
                    f"{run['params']} parameters.")
        correction = (", the sparse schemes with DGC's momentum correction and no" if corrected
                      else " without momentum correction or")
        return (f"Global batch {run['global_batch']} images, {run['epochs']} epochs of "
                f"{run['evaluations'][0]['step']} steps, total lr {run['lr']:g} (constant; the "
                f"example is handed lr / P, which it scales by P), SGD momentum 0.9"
                f"{correction} density warm-up, {run['params']} parameters; the test "
                "set is 360 images (one image = 0.28 points). No modelled time: that table is "
                "the LM's only.")

    def evaluated(self, args: argparse.Namespace) -> str:
        if self.name == "lm":
            return f"evaluated every {args.eval_every} steps"
        return "evaluated after every epoch"


MODELS = {model.name: model for model in (
    Model("lm", "LM at scale", "valid_perplexity", "validation perplexity", "perplexity",
          lower_is_better=True, scale=1.0, near_ratio=True, lr_per_worker=False,
          same="steps and schedule", figure="lm_scale.png", summary="summary.md",
          defaults={"global_batch": 64, "lr": 40.0,
                    "sweep_lrs": [5.0, 10.0, 20.0, 40.0, 80.0, 120.0],
                    "near": 1.1},
          options=("--size", "128", "--vocab-size", "10000")),
    Model("digits", "The digits CNN at scale", "test_accuracy", "test accuracy", "accuracy",
          lower_is_better=False, scale=100.0, near_ratio=False, lr_per_worker=True,
          same="epochs", figure="digits_scale.png", summary="digits_summary.md",
          defaults={"global_batch": 128, "lr": 0.08,
                    "sweep_lrs": [0.02, 0.04, 0.08, 0.16, 0.32], "near": 0.01}),
)}


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("action", choices=["run", "sweep", "report", "seeds"])
    parser.add_argument("--model", choices=list(MODELS), default="lm",
                        help="lm: the LSTM language model; digits: the digits CNN")
    parser.add_argument("--workers", type=int, nargs="+", default=[4, 8, 16, 32, 64])
    parser.add_argument("--schemes", nargs="+", choices=list(SCHEMES), default=None,
                        help="default: all (digits: all but DDP's baselines)")
    parser.add_argument("--global-batch", type=int, default=None,
                        help="lm: 64 sequences; digits: 128 images")
    parser.add_argument("--per-worker-batch", type=int, default=None,
                        help="lm: this many sequences a worker at every P (the global batch "
                             "grows with P) instead of --global-batch; default --out: "
                             "results/scale/per_worker<B>")
    parser.add_argument("--lr-warmup-steps", type=int, default=0,
                        help="lm: the learning rate's linear warm-up over the first N steps")
    parser.add_argument("--steps", type=int, default=300, help="lm: steps")
    parser.add_argument("--eval-every", type=int, default=25, help="lm: steps between evaluations")
    parser.add_argument("--epochs", type=int, default=30, help="digits: epochs")
    parser.add_argument("--lr", type=float, default=None,
                        help="total learning rate (default: the rate sweep picked, lm: 40, "
                        "digits: 0.08)")
    parser.add_argument("--sweep-lrs", type=float, nargs="+", default=None)
    parser.add_argument("--sweep-workers", type=int, default=16)
    parser.add_argument("--sweep-schemes", action="store_true",
                        help="sweep: every --schemes entry (default: dense only)")
    parser.add_argument("--jobs", type=int, default=2, help="runs at a time")
    parser.add_argument("--seed", type=int, default=None,
                        help="run: the example's --seed (default: its own, 42); the history's "
                             "name ends in _seed<N>")
    parser.add_argument("--near", type=float, default=None,
                        help="report: also the steps to come near dense's final metric (lm: "
                             "this x its perplexity, 1.1; digits: this below its accuracy, 0.01)")
    parser.add_argument("--momentum-correction", action="store_true",
                        help="the sparse schemes with DGC's momentum correction (default --out: "
                             "results/scale/momentum_correction; lm: needs --momentum)")
    parser.add_argument("--momentum", type=float, default=0.0,
                        help="lm: SGD momentum (default 0, plain SGD; digits trains with 0.9)")
    parser.add_argument("--warmup-epochs", type=float, default=0.0,
                        help="the sparse schemes' DGC density warm-up over the first N epochs")
    parser.add_argument("--out", type=Path, default=None,
                        help="where the histories, the summary and the figure go (default: "
                             "results/scale)")
    args = parser.parse_args()
    if args.momentum and args.model == "digits":
        parser.error("--momentum: the digits example trains with its own SGD momentum, 0.9")
    if not 0.0 <= args.momentum < 1.0:
        parser.error(f"--momentum {args.momentum:g}: SGD momentum is in [0, 1)")
    if (args.momentum_correction and args.model == "lm" and not args.momentum
            and args.action in ("run", "sweep")):
        parser.error("--momentum-correction: the LM trains with plain SGD (momentum 0), so it "
                     "would change nothing: give --momentum too")
    if args.warmup_epochs < 0:
        parser.error(f"--warmup-epochs {args.warmup_epochs:g}: must be at least 0")
    if args.schemes is None:
        args.schemes = [name for name in SCHEMES
                        if args.model == "lm" or name not in BASELINES]
    if args.model != "lm" and set(args.schemes) & set(BASELINES):
        parser.error(f"--schemes {' '.join(sorted(set(args.schemes) & set(BASELINES)))}: DDP's "
                     "baselines replace a language model's all-reduce (--model lm)")
    if args.per_worker_batch is not None and (args.model != "lm" or args.global_batch):
        parser.error("--per-worker-batch: the LM's, in place of --global-batch")
    if args.lr_warmup_steps and args.model != "lm":
        parser.error("--lr-warmup-steps: the LM's (the digits example has its own schedule)")
    if args.out is None:
        args.out = ROOT / "results" / "scale" / (
            "momentum_correction" if args.momentum_correction
            else "momentum" if args.momentum else "")
        if args.per_worker_batch is not None:
            args.out = args.out / f"per_worker{args.per_worker_batch}"
    args.model = MODELS[args.model]
    for name, value in args.model.defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    return args


def history_path(args: argparse.Namespace, scheme: str, workers: int,
                 lr: float | None = None) -> Path:
    suffix = f"_lr{lr:g}" if lr is not None else ""
    suffix += f"_seed{args.seed}" if args.seed is not None else ""
    return args.out / f"{args.model.name}_{scheme}_p{workers}{suffix}.json"


def train(args: argparse.Namespace, scheme: str, workers: int, lr: float, path: Path) -> str:
    if path.exists():
        return f"{path.name}: kept"
    model = args.model
    compression, density = SCHEMES[scheme]
    partial = path.with_suffix(".partial")
    command = [sys.executable, "-W", "ignore", str(ROOT / "examples/simulated_cluster.py"),
               model.name, "--workers", str(workers), "--global-batch",
               str(args.global_batch if args.per_worker_batch is None
                   else args.per_worker_batch * workers),
               "--compression", compression, "--density", str(density),
               "--lr", str(lr / workers if model.lr_per_worker else lr), *model.length(args),
               "--quiet", "--history", str(partial), *model.options,
               *BASELINES.get(scheme, ()),
               *(["--seed", str(args.seed)] if args.seed is not None else []),
               *(["--momentum-correction"] if args.momentum_correction else []),
               *(["--momentum", str(args.momentum)] if args.momentum else []),
               *(["--warmup-epochs", str(args.warmup_epochs)] if args.warmup_epochs else []),
               *(["--lr-warmup-steps", str(args.lr_warmup_steps)] if args.lr_warmup_steps
                 else [])]
    done = subprocess.run(command, capture_output=True, text=True,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    if done.returncode != 0:
        return f"{path.name}: FAILED\n{done.stderr[-2000:]}"
    result = next(line for line in done.stdout.splitlines() if line.startswith("RESULT"))
    history = json.loads(partial.read_text())
    if "lr" not in history:  # digits: the total rate, the epochs and params from RESULT
        fields = dict(item.split("=", 1) for item in result.split()[2:])
        history.update(lr=lr, epochs=int(fields["epochs"]), params=int(fields["params"]))
    sparse = compression != "none"  # dense has neither a correction nor a warm-up
    history.update(momentum_correction=args.momentum_correction and sparse,
                   warmup_epochs=args.warmup_epochs if sparse else 0.0)
    if model.name == "lm":
        history.update(momentum=args.momentum, lr_warmup_steps=args.lr_warmup_steps)
    partial.write_text(json.dumps(history, indent=1))
    partial.rename(path)
    return result


def run_all(args: argparse.Namespace, jobs: list[tuple[str, int, float, Path]]) -> None:
    args.out.mkdir(parents=True, exist_ok=True)
    with ThreadPoolExecutor(args.jobs) as pool:
        for line in pool.map(lambda job: train(args, *job), jobs):
            print(line, flush=True)


def load(path: Path) -> dict | None:
    return json.loads(path.read_text()) if path.exists() else None


def steps_to(model: Model, history: dict, target: float) -> int | None:
    """The first evaluated step whose metric is at target or better."""
    return next((e["step"] for e in history["evaluations"] if model.better(e[model.metric],
                                                                            target)), None)


def sweep_lines(args: argparse.Namespace) -> list[str]:
    """The dense sweep that picked the learning rate, then each scheme swept at its own P."""
    model, name = args.model, args.model.name
    found = sorted((float(path.stem.split("_lr")[1]), load(path)) for path in
                   args.out.glob(f"{name}_dense_p{args.sweep_workers}_lr*.json"))
    lines = [] if not found else [
        "", f"Learning rate picked on dense at P = {args.sweep_workers} (same {model.same}): "
        + ", ".join(f"lr {lr:g}: {model.show(final(model, run))}" for lr, run in found) + "."]
    swept: dict[tuple[str, int], dict[float, float]] = {}
    pattern = re.compile(rf"^{name}_(.+)_p(\d+)_lr([\d.]+)$")
    for path in args.out.glob(f"{name}_*_p*_lr*.json"):
        scheme, workers, lr = pattern.match(path.stem).groups()
        if scheme in SCHEMES and (scheme, int(workers)) != ("dense", args.sweep_workers):
            swept.setdefault((scheme, int(workers)), {})[float(lr)] = final(model, load(path))
    for (scheme, workers), finals in swept.items():
        if (main_run := load(history_path(args, scheme, workers))) is not None:
            finals[float(main_run["lr"])] = final(model, main_run)
    if swept:
        rates = sorted({lr for finals in swept.values() for lr in finals})
        lines += ["", f"Each scheme at its own learning rate (final {model.quantity}; same "
                  f"{model.same}):", "",
                  "| scheme | P | " + " | ".join(f"lr {lr:g}" for lr in rates) + " | best |",
                  "|---|---|" + "---|" * (len(rates) + 1)]
        for (scheme, workers), finals in sorted(swept.items(), key=lambda item: (
                item[0][1], list(SCHEMES).index(item[0][0]))):
            best = model.best(finals)
            lines.append(f"| {scheme} | {workers} | " + " | ".join(
                model.show(finals[lr]) if lr in finals else "" for lr in rates)
                + f" | lr {best:g}: {model.show(finals[best])} |")
    return lines


def final(model: Model, run: dict) -> float:
    return run["evaluations"][-1][model.metric]


GPU = ("an H100", 2.8e-3, "h200")
"""(card, the LSTM's forward and backward per step on it, the device whose measured selection
the planner takes): the compute and selection of the modelled time (time_lines)."""


RATES = (("1 Gbit/s", 1e9), ("10 Gbit/s", 1e10))
"""The link rates of the modelled time (time_lines); the figure shows the first."""


def time_lines(args: argparse.Namespace, times_by_rate: dict[float, dict]) -> list[str]:
    """Time to target at a GPU's compute, per configuration and P, at each of RATES
    (`gpu_times`: the planner's `times_to_target`, steps measured to --near x dense's final
    perplexity x the step modelled at GPU's compute, with the selection measured on its device,
    dense and DDP's baselines in DDP's buckets overlapped with backward)."""
    lines = []
    for rate_name, rate in RATES:
        times = times_by_rate[rate]
        configs = sorted({config for config, _ in times}, key=lambda c: (c != "dense", c))
        lines += ["", f"Modelled seconds to come within {(args.near - 1) * 100:g}% of dense's "
                  f"final perplexity at {rate_name} and {GPU[0]}'s compute, and the speed-up "
                  "over dense with overlap (steps measured x step modelled; - : not within the "
                  "run):", "",
                  "| configuration | " + " | ".join(f"P = {p}" for p in args.workers) + " |",
                  "|---|" + "---|" * len(args.workers)]
        for config in configs:
            cells = []
            for p in args.workers:
                if (config, p) not in times:
                    cells.append("")
                    continue
                seconds, dense = times[(config, p)], times.get(("dense", p))
                cells.append("-" if seconds is None else f"{seconds:.1f}" + (
                    f" ({dense / seconds:.1f}x)" if dense else ""))
            lines.append(f"| {config} | " + " | ".join(cells) + " |")
    lines += ["", f"Links: {link_model()[2]}; compute {GPU[1] * 1e3:g} ms a step (the LSTM's "
              f"forward and backward measured on {GPU[0]}); selection "
              f"{devices.describe(GPU[2])}; dense, bf16 and PowerSGD in DDP's buckets "
              "overlapped with backward at overlap 1 (`python -m gtopk_hvd.plan`). A model "
              "built from measurements, not a measured time."]
    return lines


def gpu_times(args: argparse.Namespace, d: int, rate: float
              ) -> dict[tuple[str, int], float | None]:
    """(configuration, P) -> modelled seconds to --near x dense's final at `rate` (time_lines),
    None where the run did not get there; every P with a dense run."""
    runs = [run for run in convergence.load_runs(args.out) if run.workers in args.workers]
    shapes = model_shapes.MODELS["lstm-lm-128"]()
    model = plan.Model(d, shapes if model_shapes.count(shapes) == d else None)
    latency, shares, _ = link_model()
    selects = {run.density: devices.select_s(GPU[2], d, run.density) for run in runs}
    times = {}
    for workers in convergence.measured_workers(runs):
        _, rows = plan.times_to_target(runs, workers, args.near, d, rate, latency, GPU[1],
                                       selects, shares, model, overlap=1.0)
        times.update({(row.config, workers): row.seconds for row in rows})
    return times


def report(args: argparse.Namespace) -> None:
    model = args.model
    runs = {(s, p): load(history_path(args, s, p)) for s in args.schemes for p in args.workers}
    present = [s for s in args.schemes if any(runs[(s, p)] for p in args.workers)]
    if not present:
        raise SystemExit(f"no {model.name} histories under {args.out}: run `scale_study.py run "
                         f"--model {model.name}` first")
    mixed = sorted(history_path(args, s, p).name for (s, p), run in runs.items()
                   if run and s != "dense"  # the same run with or without the correction
                   and run.get("momentum_correction", False) != args.momentum_correction)
    if mixed:
        trained = "without" if args.momentum_correction else "with"
        raise SystemExit(f"{', '.join(mixed)}: trained {trained} momentum correction, unlike "
                         "this report's runs (give each its own --out)")
    near = model.near_text(args.near)
    lines = [f"# {model.heading} (simulated workers, `scripts/studies/scale_study.py`)", "",
             f"Final {model.quantity}{' in %' if model.scale == 100 else ''} ("
             f"{'lower' if model.lower_is_better else 'higher'} is better); in brackets the "
             f"steps to reach dense's final {model.short} at the same P / to come within {near} "
             f"of it (- : not within the run; {model.evaluated(args)}).", "",
             "| scheme | " + " | ".join(f"P = {p}" for p in args.workers) + " |",
             "|---|" + "---|" * len(args.workers)]
    worst = math.inf if model.lower_is_better else -math.inf
    for scheme in present:
        cells = []
        for p in args.workers:
            run, dense = runs[(scheme, p)], runs.get(("dense", p))
            if run is None:
                cells.append("")
                continue
            target = final(model, dense) if dense else worst
            reached = [steps_to(model, run, goal)
                       for goal in (target, model.near_target(target, args.near))]
            cells.append(f"{model.show(final(model, run))} (" + " / ".join(
                "-" if r is None else str(r) for r in reached) + ")")
        lines.append(f"| {scheme} | " + " | ".join(cells) + " |")
    any_run = next(r for r in runs.values() if r)
    sparse_run = next((r for (s, _), r in runs.items() if r and s != "dense"), any_run)
    timed = model.name == "lm"  # the modelled time to accuracy: the LM's only
    times_by_rate = ({rate: gpu_times(args, any_run["params"], rate) for _, rate in RATES}
                     if timed else {})
    lines += ["", model.setup(sparse_run, args.momentum_correction, runs), *sweep_lines(args),
              *(time_lines(args, times_by_rate) if timed else [])]
    (args.out / model.summary).write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    figure, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    modelled = times_by_rate.get(RATES[0][1], {})
    largest = max(p for p in args.workers if any(runs[(s, p)] for s in present))
    for scheme in present:
        points = [(p, final(model, runs[(scheme, p)]) * model.scale)
                  for p in args.workers if runs[(scheme, p)]]
        left.plot(*zip(*points), marker="o", label=scheme)
        if not timed:
            if (run := runs[(scheme, largest)]) is not None:
                right.plot([e["step"] for e in run["evaluations"]],
                           [e[model.metric] * model.scale for e in run["evaluations"]],
                           label=scheme)
            continue
        times = [(p, seconds) for p in args.workers
                 if (seconds := modelled.get((scheme, p))) is not None]
        if times:
            right.plot(*zip(*times), marker="o", label=scheme)
    if timed:
        left.set(ylabel="final validation perplexity",
                 title="LSTM LM, simulated workers (measured)")
        right.set(yscale="log", ylabel=f"seconds to within {near} of dense's "
                  "final perplexity",
                  title=f"at 1 Gbit/s, {GPU[0]}'s compute (model built from measurements)")
    else:
        left.set(ylabel=f"final {model.quantity} (%)",
                 title="digits CNN, simulated workers (measured)")
        right.set(xlabel="step", ylabel=f"{model.quantity} (%)",
                  title=f"P = {largest}: {model.quantity} after each epoch (measured)")
    for axis in (left, right) if timed else (left,):
        axis.set(xscale="log", xlabel="workers P (" + (
            "global batch fixed)" if args.per_worker_batch is None
            else f"{args.per_worker_batch} a worker)"))
        axis.set_xticks(args.workers, [str(p) for p in args.workers])
        axis.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    for axis in (left, right):
        axis.legend(fontsize=7)
    figure.tight_layout()
    figure.savefig(args.out / model.figure, dpi=120)


def seeds_report(args: argparse.Namespace) -> None:
    """--out/<model>_seeds.md: each (scheme, P) run at more than one seed, its final metric at
    each seed (the main run is the example's seed, 42) and the steps to reach dense's final at
    the same P and seed (- : not within the run)."""
    model = args.model
    pattern = re.compile(rf"^{model.name}_(.+)_p(\d+)_seed(\d+)$")
    runs: dict[tuple[str, int], dict[int, dict]] = {}
    for path in args.out.glob(f"{model.name}_*_p*_seed*.json"):
        if (match := pattern.match(path.stem)) and match.group(1) in SCHEMES:
            scheme, workers, seed = match.group(1), int(match.group(2)), int(match.group(3))
            runs.setdefault((scheme, workers), {})[seed] = load(path)
    if not runs:
        raise SystemExit(f"no histories with a seed under {args.out}: `run --seed N` first")
    for (scheme, workers), by_seed in runs.items():
        if (main_run := load(args.out / f"{model.name}_{scheme}_p{workers}.json")) is not None:
            by_seed[42] = main_run
    seeds = sorted({seed for by_seed in runs.values() for seed in by_seed})
    lines = [f"# {model.heading}: seeds (`scripts/studies/scale_study.py seeds`)", "",
             f"Final {model.quantity} at each seed; in brackets the steps to reach dense's final "
             f"{model.short} at the same P and seed (- : not within the run). Seed 42 is the "
             "main study's run.", "",
             "| scheme | P | " + " | ".join(f"seed {seed}" for seed in seeds) + " | mean |",
             "|---|---|" + "---|" * (len(seeds) + 1)]
    for (scheme, workers), by_seed in sorted(runs.items(), key=lambda item: (
            item[0][1], list(SCHEMES).index(item[0][0]))):
        cells, finals = [], []
        for seed in seeds:
            if (run := by_seed.get(seed)) is None:
                cells.append("")
                continue
            dense = runs.get(("dense", workers), {}).get(seed)
            reached = steps_to(model, run, final(model, dense)) if dense else None
            cells.append(f"{model.show(final(model, run))} ({reached or '-'})")
            finals.append(final(model, run))
        mean = model.show(sum(finals) / len(finals))
        lines.append(f"| {scheme} | {workers} | " + " | ".join(cells) + f" | {mean} |")
    (args.out / f"{model.name}_seeds.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def main() -> None:
    args = parse_args()
    if args.action == "sweep":
        schemes = args.schemes if args.sweep_schemes else ["dense"]
        run_all(args, [(s, args.sweep_workers, lr, history_path(args, s, args.sweep_workers, lr))
                       for s in schemes for lr in args.sweep_lrs])
        for scheme in schemes:
            for lr in args.sweep_lrs:
                run = load(history_path(args, scheme, args.sweep_workers, lr))
                print(f"{scheme} P={args.sweep_workers} lr={lr:g}: final {args.model.quantity} "
                      f"{final(args.model, run) * args.model.scale:.2f}")
    elif args.action == "run":
        run_all(args, [(s, p, args.lr, history_path(args, s, p))
                       for p in args.workers for s in args.schemes])
    elif args.action == "seeds":
        seeds_report(args)
    else:
        report(args)


if __name__ == "__main__":
    main()
