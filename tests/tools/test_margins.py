"""Every accuracy floor of the suite (tests/helpers/margins.py) keeps its margin below what the
spread study measured (results/accuracy_spread/runs.jsonl, from scripts/studies/accuracy_spread.py):
floor <= lowest measured - max(MIN_MARGIN, SPREADS * standard deviation), over at least
MIN_RUNS runs that include the baseline instruction set. A floor raised without measuring, or a
new thresholded run without a spread, fails here."""

from __future__ import annotations

import pytest
from helpers import margins

MIN_RUNS = 3


@pytest.mark.parametrize("floor", margins.FLOORS.values(), ids=list(margins.FLOORS))
def test_floor_keeps_its_margin_below_the_measured_spread(floor: margins.Floor) -> None:
    found = margins.measured(floor.case, floor.figure)
    values = [value for value, _ in found]
    assert len(values) >= MIN_RUNS, f"{floor}: {len(values)} runs measured, want {MIN_RUNS}"
    assert "baseline" in {variant for _, variant in found}, f"{floor}: no baseline-ISA run"
    margin = margins.margin_of(values)
    assert floor.value <= min(values) - margin + 1e-9, (floor, min(values), margin)
