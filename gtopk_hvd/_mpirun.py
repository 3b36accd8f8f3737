"""Stopping an mpirun job that ran past its time limit, ranks included.

OpenMPI's mpirun puts every rank it starts in a process group of its own, so killing mpirun's
group leaves the ranks running. mpirun ends its ranks when it gets SIGTERM; only if it does not
exit within `grace_s` is its group killed (ranks may then be left over, and are named).
"""

from __future__ import annotations

import os
import signal
import subprocess


def stop_mpirun(process: subprocess.Popen, grace_s: float = 15.0) -> None:
    """SIGTERM to mpirun (it ends the ranks), then SIGKILL to its group if it is still there."""
    if process.poll() is not None:
        return
    try:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
    except ProcessLookupError:
        pass
