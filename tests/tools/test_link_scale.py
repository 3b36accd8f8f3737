"""The committed link studies are what `scripts/studies/link_scale.py report` makes of the committed
measurements: the report runs on a copy of each results folder (the measurements, and the
repeats of `spread` where there are any) and its summary is compared with the committed one,
line by line. The report only reads and fits: no clock is involved."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("folder", ["links_scale", "links_scale_eager"])
def test_committed_link_summary_is_the_reports(folder: str, tmp_path: Path) -> None:
    results = REPO_ROOT / "results" / folder
    out = tmp_path / folder
    shutil.copytree(results, out, ignore=shutil.ignore_patterns("summary.md", "model.json",
                                                                "*.png"))
    done = subprocess.run([sys.executable, str(REPO_ROOT / "scripts" / "studies" / "link_scale.py"),
                           "report", "--out", str(out)], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    made = (out / "summary.md").read_text().splitlines()
    committed = (results / "summary.md").read_text().splitlines()
    assert made == committed
    made_model = json.loads((out / "model.json").read_text())
    committed_model = json.loads((results / "model.json").read_text())
    assert made_model.keys() == committed_model.keys()
    for key, value in committed_model.items():  # floats to their last bits: BLAS, SIMD
        expected = pytest.approx(value, rel=1e-9) if isinstance(value, (float, dict)) else value
        assert made_model[key] == expected, key
