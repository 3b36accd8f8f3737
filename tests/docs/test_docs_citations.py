"""Recommendations cite the measurements they rest on.

A claim in the docs that rests on a measured figure carries, right after it, an invisible
`<!-- cites results.md: "ROW" -->`, where ROW is text of docs/results.md (a table row, or part of
one) that holds the figure. Checked here: every cited ROW is still in docs/results.md (a figure
re-measured or removed makes its recommendations fail until they are revised), and every bullet
of docs/schemes.md's "Which to pick" cites at least one row.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RESULTS = (ROOT / "docs" / "results.md").read_text()
CITATION = re.compile(r'<!-- cites results\.md: "(.+?)" -->', re.S)
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def citations(page: Path) -> list[str]:
    return [" ".join(row.split()) for row in CITATION.findall(page.read_text())]


@pytest.mark.parametrize("page", PAGES, ids=lambda page: page.name)
def test_every_cited_row_is_in_the_results(page: Path) -> None:
    results = " ".join(RESULTS.split())
    missing = [row for row in citations(page) if row not in results]
    assert not missing, f"{page.name} cites rows no longer in docs/results.md: {missing}"


def test_every_recommendation_of_schemes_md_cites_a_measurement() -> None:
    text = (ROOT / "docs" / "schemes.md").read_text()
    section = text[text.index("Which to pick"):text.index("## Options")]
    bullets = re.split(r"\n- ", section)[1:]
    assert len(bullets) >= 5, "the recommendations moved: update this test"
    uncited = [bullet.split("\n")[0] for bullet in bullets
               if "<!-- cites results.md:" not in bullet]
    assert not uncited, f"recommendations without a cited measurement: {uncited}"
    assert sum(len(citations(page)) for page in PAGES) >= 12
