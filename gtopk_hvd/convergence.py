"""Measured convergence runs, for the planner's time to target: steps each configuration took to
reach a quality target, read from the scale study's runs (`scripts/studies/scale_study.py run`) or
the transformer's (`scripts/studies/adamw_study.sh`).

A run is one JSON history of the simulated cluster at a fixed global batch, whose "evaluations"
hold the validation perplexity every few steps: the scale study's LSTM language model,
`lm_<scheme>[_<density>]_p<P>.json` (its other files, sweeps and seeds, are left out), or any
other history in the folder, such as the transformer's
`<scheme>-<density>-<mode>[-...][-p<P>].json`, named by its file name less `-p<P>` (the mode
and options that configuration was run with; a dense or DDP-baseline run named by more than its
scheme, such as `powersgd-r4-epochs4-p8.json`, likewise). A run with a dense start
(`freeze_variance_after`) counts its dense steps: the steps that reduced all d entries. For the
runs at one P:

    target        = near x dense's final perplexity at that P     (near >= 1; 1.1: within 10%)
    steps(config) = the first evaluated step whose perplexity is <= target; None when the run
                    ended above it (not reached in its `steps`)

The package ships the scale study's runs as tables (`SHIPPED`, written by
scripts/studies/convergence_table.py), one per regime: at 8 sequences a worker (the global batch
grows with P, as users scale; the default) and at a global batch of 64 sequences whatever P. A table
measured on one model at the study's sizes; the planner says so, and which regime, beside every use.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

RUN_NAME = re.compile(r"lm_(?P<config>[a-z0-9-]+(?:_[0-9.]+)?)_p(?P<workers>\d+)\.json")
OTHER_STUDIES = re.compile(r"(lm|digits)_.*")  # the scale study's files that RUN_NAME leaves out
CHECKOUT = Path(__file__).resolve().parents[1]
"""A source checkout's root, when the package runs from one."""
DEFAULT_DIR = CHECKOUT / "results" / "scale"
"""The scale study's runs in a source checkout."""
DATA = Path(__file__).resolve().parent / "data"


@dataclass(frozen=True)
class ShippedTable:
    """A table of the scale study's runs shipped in the package (`write_table`), and the
    folders of a source checkout it is written from: (folder under CHECKOUT, the P values
    taken from it or None for all)."""

    name: str
    regime: str  # the batch and learning rate the runs trained at, in words
    sources: tuple[tuple[str, tuple[int, ...] | None], ...]

    @property
    def path(self) -> Path:
        return DATA / f"convergence_lm_{self.name}.json"


SHIPPED = {table.name: table for table in (
    ShippedTable("per-worker-8", "8 sequences a worker (global batch 8 P), SGD without momentum "
                 "at lr 40 (picked on dense at P = 32 from 40 and 80 without warm-up and 20 to 160 "
                 "with one; at P = 8 the global-64 sweep's), no warm-up; every configuration "
                 "at a P the same budget: 300 steps at "
                 "P = 8 (0.65 epochs), 450 at P = 32 (3.9 epochs)",
                 (("results/scale", (8,)), ("results/scale/per_worker8_nowarmup", (8,)),
                  ("results/scale/per_worker8_long", (32,)))),
    ShippedTable("global-64", "a global batch of 64 sequences at every P (64 / P a worker), "
                 "SGD without momentum at lr 40 (picked on dense at P = 16)",
                 (("results/scale", None),)),
)}
DEFAULT_TABLE = "per-worker-8"
"""The regime users run: the per-worker batch kept as P grows."""
TABLE = SHIPPED[DEFAULT_TABLE].path


@dataclass(frozen=True)
class Run:
    """One measured configuration at one P."""

    scheme: str  # Compression.scheme's name, "dense", or a DDP baseline ("bf16", "powersgd-r2")
    density: float
    workers: int
    params: int
    steps: int  # steps the run took
    final: float  # its last evaluated perplexity
    bytes_per_step: float  # one worker's bytes per step once sparse, as the run recorded them
    evaluations: tuple[tuple[int, float], ...]  # (step, perplexity)
    label: str = ""  # the configuration's name when not the scheme and density alone
    dense_steps: int = 0  # a sparse run's steps that reduced all d entries (a dense start)
    global_batch: int = 0  # sequences a step over all workers (0: not recorded)

    @property
    def name(self) -> str:
        if self.label:
            return self.label
        return self.scheme if is_reference(self.scheme) else f"{self.scheme}_{self.density:g}"

    def steps_to(self, target: float) -> int | None:
        """The first evaluated step at or below target; None if the run never got there."""
        return next((step for step, value in self.evaluations if value <= target), None)


def load_runs(folder: Path | str = DEFAULT_DIR) -> list[Run]:
    """Every run in folder (module docstring): the scale study's main grid, or the histories of
    another study; the scale study's sweeps (a learning rate in the name), seeds and digits runs
    are left out."""
    runs = []
    for path in sorted(Path(folder).glob("*.json")):
        scale_run = RUN_NAME.fullmatch(path.name) is not None
        if not scale_run and OTHER_STUDIES.fullmatch(path.stem):
            continue
        history = json.loads(path.read_text())
        if "compression" not in history or "evaluations" not in history:
            continue
        evaluations = tuple((int(e["step"]), float(e["valid_perplexity"]))
                            for e in history["evaluations"] if "valid_perplexity" in e)
        if not evaluations:
            continue
        scheme = "dense" if history["compression"] == "none" else history["compression"]
        params = int(history["params"])
        reference = is_reference(scheme)
        runs.append(Run(
            scheme=scheme, density=1.0 if reference else float(history["density_asked"]),
            workers=int(history["workers"]), params=params,
            steps=int(history["steps"]), final=evaluations[-1][1],
            bytes_per_step=float(history["evaluations"][-1].get("bytes_per_step", 0.0)),
            evaluations=evaluations,
            label="" if scale_run or configuration(path.stem) == scheme
            else configuration(path.stem),
            dense_steps=0 if reference else dense_start(history),
            global_batch=int(history.get("global_batch", 0))))
    return runs


def load_shipped_sources(table: ShippedTable, root: Path | str = CHECKOUT) -> list[Run]:
    """The runs a shipped table is written from, read from a source checkout's folders; a
    configuration run again at the same P in a later folder (a longer run) replaces the
    earlier."""
    runs: dict[tuple[str, int], Run] = {}
    for folder, workers in table.sources:
        for run in load_runs(Path(root) / folder):
            if workers is None or run.workers in workers:
                runs[(run.name, run.workers)] = run
    return list(runs.values())


def load(source: Path | str = TABLE) -> list[Run]:
    """The runs of a folder of histories (`load_runs`), of a table (`write_table`), or of a
    shipped table named in SHIPPED."""
    source = SHIPPED[source].path if source in SHIPPED else Path(source)
    if source.is_dir():
        return load_runs(source)
    rows = json.loads(source.read_text())["runs"]
    return [Run(**{**row, "evaluations": tuple(tuple(e) for e in row["evaluations"])})
            for row in rows]


def write_table(runs: list[Run], path: Path | str, source: str) -> None:
    """The runs as one JSON table (what `load` reads), naming where they came from."""
    rows = ",\n".join(json.dumps(dict(vars(run), evaluations=[list(e) for e in run.evaluations]))
                      for run in runs)
    Path(path).write_text(f'{{"source": {json.dumps(source)}, "runs": [\n{rows}\n]}}\n')


def is_reference(scheme: str) -> bool:
    """Dense and DDP's own compressions (bf16, powersgd-r<rank>): every entry reduced."""
    return scheme in ("dense", "bf16") or re.fullmatch(r"powersgd-r\d+", scheme) is not None


def configuration(stem: str) -> str:
    """Another study's configuration: its history's file name less `-p<P>`."""
    return re.sub(r"-p\d+$", "", stem)


def dense_start(history: dict) -> int:
    """A sparse run's steps that reduced all d entries (k = d: a dense start)."""
    return sum(1 for step in history.get("sparse_steps", ()) if step["k"] == history["params"])


def describe(runs: list[Run], folder: Path | str) -> str:
    """What the runs measured, in words, for the planner's output: the model, and the regime of
    a shipped table or each P's global batch."""
    if str(folder) in SHIPPED:
        return (f"the LSTM language model of the scale study at {SHIPPED[str(folder)].regime}"
                f" (table {folder!r})")
    batches = ", ".join(f"{batch} at P = {p}" for p, batch in sorted(
        {(run.workers, run.global_batch) for run in runs if run.global_batch}))
    model = "the runs in" if any(run.label for run in runs) else "the LSTM language model, runs in"
    return f"{model} {folder}" + (f" (global batch {batches})" if batches else "")


def measured_workers(runs: list[Run]) -> list[int]:
    """The P values at which a dense run (the target's reference) was measured."""
    return sorted({run.workers for run in runs if run.scheme == "dense"})


def steps_to_target(runs: list[Run], workers: int, near: float
                    ) -> tuple[float, dict[str, int | None]]:
    """(the target perplexity, steps to it per configuration) at P = workers (module
    docstring). Raises ValueError when no dense run was measured at that P."""
    if near < 1.0:
        raise ValueError(f"near must be >= 1 (a multiple of dense's final perplexity), got {near}")
    at_p = [run for run in runs if run.workers == workers]
    dense = [run for run in at_p if run.scheme == "dense"]
    if not dense:
        raise ValueError(f"no dense run measured at P = {workers}; measured: "
                         f"{measured_workers(runs)}")
    target = near * dense[0].final
    return target, {run.name: run.steps_to(target) for run in at_p}
