"""The Horovod in the virtual env is the one we built: frameworks, controller, allreduce."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.mpi_launcher import run_mpi

pytestmark = pytest.mark.mpi  # launches mpirun / horovodrun: `pytest -m "not mpi"` skips it


def test_check_build_lists_tensorflow_pytorch_and_mpi() -> None:
    horovodrun = Path(sys.executable).with_name("horovodrun")
    result = subprocess.run([str(horovodrun), "--check-build"], capture_output=True, text=True,
                            timeout=300, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
    assert result.returncode == 0, result.stderr[-3000:]
    lines = {line.strip() for line in result.stdout.splitlines()}
    for feature in ("[X] TensorFlow", "[X] PyTorch", "[X] MPI"):
        assert feature in lines, f"{feature!r} missing from:\n{result.stdout}"


def test_horovod_allreduce_torch_and_tensorflow_on_4_workers() -> None:
    output = run_mpi("mpi_horovod_allreduce.py", 4)
    assert "horovod allreduce ok on 4 workers" in output


def test_horovodrun_asks_the_torch_extension_about_the_build_first() -> None:
    """scripts/ci/patch_horovod.py's fifth fix: horovodrun's "built with Gloo / MPI?" checks import
    the first framework extension that loads, in a forked process before any worker starts;
    torch's import is the cheaper one."""
    from horovod.common import util

    assert util.EXTENSIONS[:2] == ["torch", "tensorflow"], util.EXTENSIONS
    assert util.gloo_built() and util.mpi_built()
