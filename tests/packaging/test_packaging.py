"""Packaging as users install it: the metadata (numpy the one dependency, extras, one version,
a changelog entry) and scripts/ci/check_packaging.sh, which builds the sdist and the wheel, installs
the wheel into a fresh env and runs a kernel from outside the repository (about 30 s here: the
extension compiles without its CUDA kernels)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import gtopk_hvd

REPO = Path(__file__).resolve().parents[2]

tomllib = pytest.importorskip("tomllib")  # Python >= 3.11


def pyproject() -> dict:
    return tomllib.loads((REPO / "pyproject.toml").read_text())


def test_dependencies_are_numpy_alone_and_the_rest_extras():
    project = pyproject()["project"]
    assert project["dependencies"] == ["numpy"]
    extras = project["optional-dependencies"]
    assert extras["mpi"] == ["mpi4py"]
    assert {"torch", "tensorflow", "test"} <= set(extras)
    assert not any(r.startswith("horovod") for rs in extras.values() for r in rs), (
        "Horovod needs build flags and source fixes: not installable as an extra")


def test_version_has_one_source_and_a_changelog_entry():
    config = pyproject()
    assert "version" not in config["project"]
    assert "version" in config["project"]["dynamic"]
    assert config["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "gtopk_hvd.__version__"}
    assert re.fullmatch(r"\d+\.\d+\.\d+", gtopk_hvd.__version__)
    changelog = (REPO / "CHANGELOG.md").read_text()
    assert "## [Unreleased]" in changelog
    assert re.search(rf"^## \[{re.escape(gtopk_hvd.__version__)}\]", changelog, re.MULTILINE)


def test_sdist_manifest_carries_the_extension_sources():
    manifest = (REPO / "MANIFEST.in").read_text().split()
    assert "CMakeLists.txt" in manifest and "csrc" in manifest


def test_wheel_builds_installs_and_runs_outside_the_repository():
    try:
        import build  # noqa: F401
    except ImportError:
        pytest.skip("python -m build is not installed (scripts/ci/install.sh installs it)")
    environment = {**os.environ, "GTOPK_HVD_VENV": sys.prefix}
    result = subprocess.run(["bash", str(REPO / "scripts" / "ci" / "check_packaging.sh")], cwd=REPO,
                            env=environment, capture_output=True, text=True, timeout=900)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-6000:]
    assert "== packaging: ok" in result.stdout
