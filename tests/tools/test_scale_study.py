"""The committed scale study is what `scripts/studies/scale_study.py report` makes of the committed
histories: the report runs on a copy of results/scale/ (and of results/scale/momentum_correction/
with --momentum-correction, results/scale/momentum/: the LM with SGD momentum, the sparse schemes
without the correction, results/scale/long/: a run longer than dense's) and its summaries are
compared with the committed ones, line by line.
The LM's modelled-time tables re-time the selection on this machine, so there only which cells
are within the run ("-" or a number) must agree."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
SCRIPT = REPO_ROOT / "scripts" / "studies" / "scale_study.py"
RESULTS = REPO_ROOT / "results" / "scale"
MODELLED = "Modelled seconds"


def report(model: str, results: Path, out: Path, *options: str) -> None:
    for history in results.glob(f"{model}_*.json"):
        shutil.copy(history, out)
    done = subprocess.run([sys.executable, str(SCRIPT),
                           "report", "--model", model, "--out", str(out), *options],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]


def shape(line: str) -> str:
    """A modelled-time row with each number replaced by N: what the run decides, not the clock."""
    return re.sub(r"\d+\.\d+", "N", line)


@pytest.mark.parametrize("model, variant, summary, options", [
    ("digits", "", "digits_summary.md", ()),
    ("digits", "momentum_correction", "digits_summary.md", ("--momentum-correction",)),
    ("lm", "", "summary.md", ()),
    ("lm", "momentum_correction", "summary.md", ("--momentum-correction", "--workers", "32")),
    ("lm", "momentum", "summary.md", ("--workers", "32")),
    ("lm", "long", "summary.md", ("--momentum-correction", "--workers", "32")),
])
def test_the_committed_summary_is_the_report_of_the_committed_histories(
        model: str, variant: str, summary: str, options: tuple[str, ...], tmp_path: Path) -> None:
    results = RESULTS / variant
    report(model, results, tmp_path, *options)
    made = (tmp_path / summary).read_text().splitlines()
    committed = (results / summary).read_text().splitlines()
    assert len(made) == len(committed)
    timed = next((n for n, line in enumerate(committed) if line.startswith(MODELLED)),
                 len(committed))
    assert model == "digits" or timed < len(committed), "the LM summary lost its time tables"
    assert made[:timed] == committed[:timed]
    assert [shape(line) for line in made[timed:]] == [shape(line) for line in committed[timed:]]
    assert (tmp_path / ("digits_scale.png" if model == "digits" else "lm_scale.png")).stat(
    ).st_size > 10_000


@pytest.mark.parametrize("options, message", [
    (("run", "--momentum-correction"), "give --momentum too"),
    (("run", "--model", "digits", "--momentum", "0.9"), "its own SGD momentum, 0.9"),
    (("run", "--momentum", "1"), "--momentum 1: SGD momentum is in [0, 1)"),
    (("run", "--warmup-epochs", "-1"), "--warmup-epochs -1: must be at least 0"),
])
def test_the_study_refuses_options_that_would_change_nothing_or_diverge(
        options: tuple[str, ...], message: str, tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, str(SCRIPT),
                           *options, "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and message in done.stderr, done.stderr
    assert list(tmp_path.iterdir()) == []  # nothing trained
