"""One recommendation, from one source: README.md, docs/schemes.md and docs/adamw.md quote
gtopk_hvd.recommendation verbatim, the planner prints it, and it is what the planner itself picks
on the measured runs at the case it was picked at (recommendation.CANONICAL)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from gtopk_hvd import convergence, recommendation

ROOT = Path(__file__).resolve().parents[2]
QUOTED_IN = {"SGD": ["README.md", "docs/schemes.md", "docs/scale.md"],
             "AdamW": ["README.md", "docs/adamw.md", "docs/schemes.md"]}


def plan(*arguments: str) -> str:
    done = subprocess.run([sys.executable, "-m", "gtopk_hvd.plan", *arguments],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_the_docs_quote_the_recommendation() -> None:
    for chosen in recommendation.ALL:
        for doc in QUOTED_IN[chosen.optimizer]:
            text = " ".join((ROOT / doc).read_text().split())  # line breaks as spaces
            assert chosen.text() in text, f"{doc} does not quote {chosen.text()!r}"


@pytest.mark.parametrize("chosen", recommendation.ALL, ids=lambda r: r.optimizer)
def test_the_planner_picks_what_is_recommended(chosen: recommendation.Recommendation) -> None:
    source = chosen.convergence
    if source not in convergence.SHIPPED and not (ROOT / source).is_dir():
        pytest.skip(f"{source} is not in this checkout")
    out = plan(*recommendation.CANONICAL[chosen.optimizer], "--convergence",
               source if source in convergence.SHIPPED else str(ROOT / source))
    picks = [line.strip() for line in out.split("Recommendation:")[1].splitlines()
             if line.strip().startswith("P = ")]
    assert len(picks) == 1, out
    assert picks[0].split(" use ", 1)[1].startswith(
        f"{recommendation.call(chosen.config)} ({chosen.config}, "), picks[0]
    assert chosen.text() in out


def test_a_configuration_name_reads_as_its_code() -> None:
    call = recommendation.call
    assert call("oktopk_0.01") == "compression=Compression.oktopk(0.01)"
    assert call("gtopk-exact_0.0052") == "compression=Compression.scheme('gtopk-exact', 0.0052)"
    assert call("topk-0.01-preconditioned-dense100-epochs2") == (
        "compression=Compression.topk(0.01), freeze_variance_after=100")
    assert call("powersgd-r2") == "DDP's powerSGD_hook, matrix_approximation_rank=2"
    assert call("powersgd-r4-epochs4") == (
        "DDP's powerSGD_hook, matrix_approximation_rank=4, 4 epochs")
    assert call("bf16") == "DDP's bf16_compress_hook"
