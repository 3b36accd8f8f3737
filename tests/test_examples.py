"""The examples run end to end under mpirun."""

from __future__ import annotations

import re

import pytest
from mpi_launcher import run_mpi


@pytest.mark.parametrize("workers", [1, 3, 4])
def test_extension_smoke_agrees_on_every_worker(workers: int) -> None:
    output = run_mpi("examples/extension_smoke.py", workers, "--size", "300000")
    match = re.search(r"workers=(\d+) d=300,000 k=300 .* merged=300 entries, identical", output)
    assert match and int(match.group(1)) == workers, output
