"""Elastic Horovod with the sparse optimizer (examples/elastic_torch.py under `horovodrun --gloo
--min-np --max-np --host-discovery-script`): a worker killed with SIGKILL inside a step, the
others go on from the last commit with one worker fewer, the killed host comes back after its
blacklist cooldown and a new worker joins from the committed state; the replicas end bitwise
identical (the example checks it on every worker) and the loss near the run without a fault.

Horovod blacklists a failed worker's whole host, so each worker gets a host name of its own
that resolves to this machine (localhost, 127.0.0.1, the host name, its first address), as
Horovod's own elastic tests do with localhost and 127.0.0.1."""

from __future__ import annotations

import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.mpi_launcher import QUIET_THREADS, REPO_ROOT, run_with_time_limit

EXAMPLE = REPO_ROOT / "examples" / "elastic_torch.py"
HOROVODRUN = Path(sys.executable).with_name("horovodrun")


def local_host_names() -> list[str]:
    """Distinct names of this machine that Horovod starts workers on without ssh."""
    names = ["localhost", "127.0.0.1", socket.gethostname()]
    addresses = subprocess.run(["hostname", "-I"], capture_output=True, text=True).stdout
    names += [a for a in addresses.split() if ":" not in a][:1]
    return list(dict.fromkeys(names))


def elastic_run(tmp_path: Path, *options: str) -> str:
    hosts = local_host_names()[:4]
    if len(hosts) < 4:
        pytest.skip(f"needs 4 local host names, this machine has {hosts}")
    discovery = tmp_path / "hosts.sh"
    discovery.write_text("#!/bin/sh\n" + "".join(f"echo {host}:1\n" for host in hosts))
    discovery.chmod(0o755)
    command = [*QUIET_THREADS, str(HOROVODRUN), "--gloo", "-np", "4", "--min-np", "3",
               "--max-np", "4", "--host-discovery-script", str(discovery),
               "--blacklist-cooldown-range", "1", "2",
               sys.executable, str(EXAMPLE), "--steps", "120", "--compute-ms", "50",
               "--marker", str(tmp_path / "killed"), *options]
    status, output = run_with_time_limit(command, 400, "elastic_torch.py under horovodrun")
    assert status == 0, output[-8000:]
    return output


def final_loss(output: str) -> float:
    return float(re.search(r"RESULT elastic .* loss=([\d.]+)", output).group(1))


@pytest.mark.mpi
def test_a_killed_worker_is_survived_and_replaced(tmp_path: Path) -> None:
    (tmp_path / "calm").mkdir()
    calm = elastic_run(tmp_path / "calm", "--compression", "gtopk")
    faulty = elastic_run(tmp_path, "--compression", "gtopk", "--kill-rank", "3", "--kill-at",
                         "10")
    sizes = [int(s) for s in re.findall(r"step \d+ size (\d+) loss", faulty)]
    assert sizes[0] == 4 and 3 in sizes, sizes  # went on with 3
    assert "workers=4" in faulty, faulty[-3000:]  # and ended with the worker back
    recovery = [float(s) for s in re.findall(r"RECOVERY rank=\d+ seconds=([\d.]+)", faulty)]
    assert recovery and max(recovery) < 60, recovery
    assert final_loss(faulty) <= 1.25 * final_loss(calm), (final_loss(faulty), final_loss(calm))
