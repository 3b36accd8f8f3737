"""The layering the core refactor promises, checked on the source and on a real import: no import
circle between modules, no framework import at module level in the neutral packages
(scripts/dev/import_graph.py --check), importing the core and its schemes loads no Horovod, torch or
TensorFlow, and docs/architecture.md's import graph is the source's (scripts/dev/import_graph.py
--doc)."""

from __future__ import annotations

import difflib
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_import_graph_has_no_circle_and_a_neutral_core() -> None:
    result = subprocess.run([sys.executable, str(ROOT / "scripts" / "dev" / "import_graph.py"),
                             "--check", "--modules"], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "0 circle(s) between modules" in result.stdout


def test_architecture_doc_import_graph_is_the_sources() -> None:
    result = subprocess.run([sys.executable, str(ROOT / "scripts" / "dev" / "import_graph.py"),
                             "--doc"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    expected = result.stdout.strip()
    begin, end = expected.splitlines()[0], expected.splitlines()[-1]
    doc = (ROOT / "docs" / "architecture.md").read_text()
    fix = "regenerate it with `python scripts/dev/import_graph.py --write-doc`"
    start, stop = doc.find(begin), doc.find(end)
    assert 0 <= start < stop, f"docs/architecture.md lacks the lines {begin!r} ... {end!r}; {fix}"
    shown = doc[start:stop + len(end)]
    assert shown == expected, (
        f"docs/architecture.md's import graph differs from the source's; {fix}\n"
        + "\n".join(difflib.unified_diff(shown.splitlines(), expected.splitlines(),
                                          "docs/architecture.md", "import_graph.py --doc",
                                          lineterm="")))


def test_the_core_loads_no_framework() -> None:
    code = ("import sys, gtopk_hvd.core, gtopk_hvd.schemes, gtopk_hvd.compression; "
            "print(sorted(m for m in ('torch', 'tensorflow', 'keras', 'horovod') "
            "if m in sys.modules))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=120, cwd=ROOT)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip() == "[]", result.stdout
