"""Runs a script under real OpenMPI (`mpirun -np N`) with a hard time limit, for the tests
(`run_with_time_limit` runs any other command, e.g. `horovodrun`, the same way).

Each MPI program in tests/mpi/ checks its own results on every rank and exits non-zero on any
failure; mpirun then exits non-zero too. On timeout the whole process group (mpirun and every
rank) is killed and the test fails with the output so far.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from gtopk_hvd._mpirun import stop_mpirun

TESTS_DIR = Path(__file__).resolve().parent.parent
REPO_ROOT = TESTS_DIR.parent
MPI_PROGRAMS = TESTS_DIR / "mpi"


def mpirun_command(n_workers: int, program: list[str]) -> list[str]:
    return [
        "mpirun", "--allow-run-as-root", "--oversubscribe", "-np", str(n_workers),
        # More ranks than cores here: one OpenMP thread per rank, or ranks wait on each other.
        "-x", "OMP_NUM_THREADS=1", "-x", "TF_CPP_MIN_LOG_LEVEL=3", "-x", "PYTHONPATH",
        # A rank that crashes (SIGSEGV, SIGABRT) prints every thread's Python stack.
        "-x", "PYTHONFAULTHANDLER=1",
        *program,
    ]


# What mpirun's -x passes (mpirun_command), for the launchers that pass their environment on.
QUIET_THREADS = ["env", "OMP_NUM_THREADS=1", "TF_CPP_MIN_LOG_LEVEL=3", "PYTHONFAULTHANDLER=1"]


def horovodrun_command(n_workers: int, program: list[str]) -> list[str]:
    """`horovodrun --gloo` on this host (no MPI world: Horovod's own Gloo rendezvous)."""
    horovodrun = Path(sys.executable).with_name("horovodrun")  # the venv's, next to python
    return [*QUIET_THREADS, str(horovodrun), "--gloo", "-np", str(n_workers),
            "-H", f"localhost:{n_workers}", *program]


def torchrun_command(n_workers: int, program: list[str]) -> list[str]:
    """`torchrun` on this host (Gloo; the rendezvous on a free local port)."""
    torchrun = Path(sys.executable).with_name("torchrun")
    return [*QUIET_THREADS, str(torchrun), "--standalone", "--nproc_per_node", str(n_workers),
            *program]


LAUNCHERS = {"mpirun": mpirun_command, "horovodrun": horovodrun_command,
             "torchrun": torchrun_command}


def run_with_time_limit(command: list[str], timeout_s: float, what: str) -> tuple[int, str]:
    """Runs `command` in its own session with tests/ on PYTHONPATH; returns (exit status,
    stdout and stderr together). Past timeout_s, kills its whole process group and fails."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(TESTS_DIR), env.get("PYTHONPATH", "")])
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True, env=env, start_new_session=True)
    try:
        output, _ = process.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        stop_mpirun(process)  # mpirun ends the ranks, which have process groups of their own
        output, _ = process.communicate()
        raise AssertionError(f"{what} did not finish in {timeout_s} s; killed. "
                             f"Output:\n{output[-12000:]}") from None
    return process.returncode, output


def run_mpi(script: str, n_workers: int, *args: str, timeout_s: float = 300,
            launcher: str = "mpirun") -> str:
    """Runs tests/mpi/<script> (or <script> relative to the repository root) on n_workers
    ranks started by `launcher` (mpirun, horovodrun --gloo or torchrun); returns its output,
    or fails the test."""
    path = MPI_PROGRAMS / script if (MPI_PROGRAMS / script).exists() else REPO_ROOT / script
    program = [str(path), *args] if launcher == "torchrun" else [sys.executable, str(path), *args]
    command = LAUNCHERS[launcher](n_workers, program)
    what = f"{script} on {n_workers} workers ({launcher})"
    returncode, output = run_with_time_limit(command, timeout_s, what)
    if returncode != 0:
        raise AssertionError(f"{what} exited with {returncode}. Output:\n{output[-12000:]}")
    return output
