"""scripts/studies/emulated_cluster.py: ranks in their own namespaces, links shaped, everything
removed.

Needs root, `ip`, `tc` and mpirun (as on this project's machines); skipped otherwise.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time

import pytest
from helpers.mpi_launcher import MPI_PROGRAMS, REPO_ROOT

SCRIPT = REPO_ROOT / "scripts" / "studies" / "emulated_cluster.py"

pytestmark = [pytest.mark.mpi, pytest.mark.skipif(
    os.geteuid() != 0 or not all(shutil.which(tool) for tool in ("ip", "tc", "mpirun")),
    reason="the emulated cluster needs root, ip, tc and mpirun")]


def run_cluster(*arguments: str, timeout_s: float = 120) -> tuple[int, str, str]:
    """Runs the script; returns (exit status, output, the prefix of what it created)."""
    done = subprocess.run([sys.executable, str(SCRIPT), *arguments], capture_output=True,
                          text=True, timeout=timeout_s, cwd=REPO_ROOT)
    output = done.stdout + done.stderr
    prefix = re.search(r"namespaces (gk\d+)-\*", output)
    return done.returncode, output, prefix.group(1) if prefix else ""


def ranks_still_running(marker: str) -> str:
    return subprocess.run(["pgrep", "-af", marker], capture_output=True, text=True).stdout


def leftovers(prefix: str) -> list[str]:
    namespaces = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
    return [line for line in (namespaces + links).splitlines() if prefix and prefix in line]


def test_each_rank_runs_in_its_own_shaped_namespace_and_all_is_removed() -> None:
    status, output, prefix = run_cluster(
        "--workers", "3", "--rate", "200mbit", "--timeout", "90", "--",
        sys.executable, str(MPI_PROGRAMS / "mpi_cluster_probe.py"))
    assert status == 0, output
    probes = dict(re.findall(r"PROBE rank=(\d) (.*)", output))
    assert sorted(probes) == ["0", "1", "2"], output
    own_namespace = os.readlink("/proc/self/ns/net")
    namespaces = {re.search(r"netns=(\S+)", line).group(1) for line in probes.values()}
    assert len(namespaces) == 3 and own_namespace not in namespaces, probes
    for rank, line in probes.items():
        assert re.search(rf"address=10\.213\.\d+\.{int(rank) + 1}/24", line), line
        assert "tbf" in line and "rate 200Mbit" in line, line
    sent = [int(value.replace(",", "")) for value in re.findall(r"link sent ([\d,]+) B", output)]
    assert len(sent) == 3 and min(sent) >= 4_000_000, output  # the probe's message went by TCP
    assert leftovers(prefix) == []


def test_queue_puts_small_packets_first_and_buffers_the_rest() -> None:
    """--queue: an htb at the rate, a FIFO of that many bytes for the bulk, and the probe's
    4 MB ring exchange gets through (the acknowledgements are not stuck behind it)."""
    status, output, prefix = run_cluster(
        "--workers", "2", "--rate", "100mbit", "--queue", "2mb", "--timeout", "90", "--",
        sys.executable, str(MPI_PROGRAMS / "mpi_cluster_probe.py"))
    assert status == 0, output
    probes = dict(re.findall(r"PROBE rank=(\d) (.*)", output))
    assert sorted(probes) == ["0", "1"], output
    for line in probes.values():
        assert "htb" in line and "bfifo" in line and "limit 2Mb" in line, line
    assert "queue 2mb" in output and leftovers(prefix) == []


def test_a_failing_command_still_removes_everything() -> None:
    status, output, prefix = run_cluster("--workers", "2", "--", sys.executable, "-c",
                                         "import sys; sys.exit(3)")
    assert status != 0 and prefix, output
    assert leftovers(prefix) == []


def test_a_command_past_its_time_limit_is_killed_and_everything_removed() -> None:
    start = time.monotonic()
    marker = f"gtopk-cluster-timeout-{os.getpid()}"  # no regex characters: pgrep -f reads one
    status, output, prefix = run_cluster("--workers", "2", "--timeout", "5", "--", sys.executable,
                                         "-c", f"import time; time.sleep(300)  # {marker}")
    assert status == 124, output
    assert "ran past 5.0 s" in output and time.monotonic() - start < 60
    assert leftovers(prefix) == []
    assert ranks_still_running(marker) == ""


def test_bad_options_are_named() -> None:
    for arguments, message in ((["--rate", "fast"], "--rate 'fast'"),
                               (["--workers", "0"], "--workers must be >= 1"),
                               (["--delay", "soon"], "--delay 'soon'"),
                               (["--queue", "big"], "--queue 'big'")):
        status, output, _ = run_cluster(*arguments, "--", "true")
        assert status == 2 and message in output, output


def test_added_delay_works_or_names_the_missing_kernel_module() -> None:
    status, output, prefix = run_cluster("--workers", "2", "--delay", "1ms", "--", "true")
    assert status == 0 or (status == 2 and "sch_netem" in output), output
    assert leftovers(prefix) == []
