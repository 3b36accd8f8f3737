"""How many threads the CPU kernels use, so that ranks sharing a machine do not fight.

With L ranks of a job on one machine (mpirun, horovodrun, torchrun: the launcher says how many)
and C cores this process may run on, each rank's kernels use

    threads = C                  if the launcher pinned the process (its affinity mask is
                                 smaller than the machine: the cores are its own)
    threads = max(1, C // L)     otherwise (the cores are shared by the L ranks)

and, when L > 1, OpenMP's idle threads sleep instead of spinning (OMP_WAIT_POLICY=passive),
since a spinning thread takes a core another rank needs. A user's OMP_NUM_THREADS (or
OMP_WAIT_POLICY) wins: it is left as it is. `set_num_threads(n)` overrides at run time.

`configure_environment()` must run before the extension loads OpenMP: gtopk_hvd/__init__.py
calls it.
"""

from __future__ import annotations

import os

# Variables through which launchers tell a process how many ranks share its machine.
LOCAL_SIZE_VARIABLES = (
    "OMPI_COMM_WORLD_LOCAL_SIZE",  # OpenMPI's mpirun
    "MPI_LOCALNRANKS",  # MPICH / Intel MPI (hydra)
    "HOROVOD_LOCAL_SIZE",  # horovodrun (Gloo)
    "LOCAL_WORLD_SIZE",  # torchrun
    "SLURM_NTASKS_PER_NODE",  # srun
)


def local_ranks(environ: dict[str, str] | None = None) -> int:
    """Ranks of this job on this machine, as the launcher says (1 if it says nothing)."""
    environ = os.environ if environ is None else environ
    for name in LOCAL_SIZE_VARIABLES:
        value = environ.get(name, "")
        if value.isdigit() and int(value) > 0:
            return int(value)
    return 1


def usable_cores() -> tuple[int, bool]:
    """(cores this process may run on, whether its affinity mask pins it to fewer than all)."""
    machine = os.cpu_count() or 1
    try:
        allowed = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        return machine, False
    return allowed, allowed < machine


def default_threads(environ: dict[str, str] | None = None) -> int:
    """The thread count of the module docstring (ignores OMP_NUM_THREADS)."""
    cores, pinned = usable_cores()
    return cores if pinned else max(1, cores // local_ranks(environ))


def configure_environment() -> None:
    """Passive waiting for OpenMP's idle threads when ranks share the machine (module
    docstring). Only effective before OpenMP starts; a value the user set is kept."""
    if local_ranks() > 1:
        os.environ.setdefault("OMP_WAIT_POLICY", "passive")


def configure_kernels(kernels: object) -> None:
    """Sets the kernels' thread count (the extension module `gtopk_hvd._C`) unless the user
    chose one with OMP_NUM_THREADS."""
    if not os.environ.get("OMP_NUM_THREADS"):
        kernels.set_num_threads(default_threads())
