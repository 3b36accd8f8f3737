"""Transports by name: `resolve_transport` turns what a user passes as `transport=` into one.

    None             the default: "mpi" when an MPI launcher (mpirun, `horovodrun --mpi`)
                     started this process, else "horovod" when the adapter runs on Horovod
                     (e.g. `horovodrun --gloo`), else "mpi"
    "mpi"            MPI over mpi4py on a duplicate of COMM_WORLD (`transports/mpi.py`)
    "horovod"        Horovod's own collectives: alltoall, allgather, allreduce
                     (`transports/horovod.py`; Gloo, MPI or NCCL, whatever Horovod runs on)
    "torch"          torch.distributed over its default process group
                     (`transports/torch_distributed.py`; after init_process_group, e.g.
                     under torchrun)
    "local"          the worker of a `LocalGroup` (threads of one process, the simulated
                     cluster) whose thread runs the code (`transports/local.py`)
    a Transport      itself (e.g. MPITransport(comm) for another mpi4py communicator)

A transport module registers a factory (no arguments, returns the process-wide instance, or for
"local" the calling thread's) with `@TRANSPORTS.register(name)`; only that module imports its
communication library, so a script that never runs under an MPI launcher never loads mpi4py.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from gtopk_hvd.registry import Registry
from gtopk_hvd.transports.base import Transport, check_matches_horovod

TRANSPORTS: Registry[Callable[[], Transport]] = Registry("transport")

# Set in every process that an MPI launcher starts (OpenMPI, MPICH/Hydra, PMIx, Slurm's PMI).
MPI_LAUNCHER_VARIABLES = ("OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_SIZE", "PMI_RANK")


def launched_by_mpi() -> bool:
    """Whether an MPI launcher started this process (so an MPI world with every worker exists)."""
    return any(name in os.environ for name in MPI_LAUNCHER_VARIABLES)


def load_mpi_if_launched() -> None:
    """Under an MPI launcher, loads mpi4py now: the adapters call it on import, so that mpi4py
    initialises MPI before `hvd.init()` does."""
    if launched_by_mpi():
        import gtopk_hvd.transports.mpi  # noqa: F401


@TRANSPORTS.register("mpi")
def _mpi() -> Transport:
    from gtopk_hvd.transports.mpi import default_transport

    return default_transport()


@TRANSPORTS.register("horovod")
def _horovod() -> Transport:
    from gtopk_hvd.transports.horovod import horovod_transport

    return horovod_transport()


@TRANSPORTS.register("torch")
def _torch_distributed() -> Transport:
    from gtopk_hvd.transports.torch_distributed import default_transport

    return default_transport()


@TRANSPORTS.register("local")
def _local() -> Transport:
    from gtopk_hvd.transports.local import current_transport

    return current_transport()


def resolve_transport(transport: Transport | str | None, horovod: Any = None) -> Transport:
    """The Transport that `transport=` names.

    Args:
        transport: None: the default, "mpi" under an MPI launcher, else "horovod" when
            `horovod` is given, else "mpi" (module docstring); a registered name ("mpi",
            "horovod", "torch", "local", or one added with `@TRANSPORTS.register`); or a
            Transport, returned as it is.
        horovod: the adapter's Horovod module (horovod.torch or horovod.tensorflow), or None
            where there is none; "horovod" (given, or the default) then runs on that module.

    Returns:
        The Transport: for a name, what its registered factory returns (the process-wide
        instance; for "local", the calling thread's worker of its `LocalGroup`).

    Raises:
        ValueError: an unknown name.
        TypeError: neither None, a str nor a Transport (e.g. an mpi4py communicator: wrap it
            as `gtopk_hvd.transports.mpi.MPITransport(comm)`).
        ImportError: "mpi" without mpi4py installed.
        RuntimeError: "horovod" with no module given before `hvd.init()`, or "local" outside
            a `LocalGroup.run` thread.
    """
    if transport is None:
        transport = "horovod" if horovod is not None and not launched_by_mpi() else "mpi"
    if transport == "horovod" and horovod is not None:  # the adapter's own Horovod module
        from gtopk_hvd.transports.horovod import horovod_transport

        return horovod_transport(horovod)
    if isinstance(transport, str):
        return TRANSPORTS.get(transport)()
    if isinstance(transport, Transport):
        return transport
    raise TypeError(f"transport must be a gtopk_hvd Transport, one of the names "
                    f"{TRANSPORTS.names()} or None, got {type(transport).__name__}; wrap an "
                    "mpi4py communicator as gtopk_hvd.transports.mpi.MPITransport(comm)")


def resolve_for_horovod(transport: Transport | str | None, horovod: Any) -> Transport:
    """`resolve_transport` for an adapter built on `horovod` (its Horovod module), checked to
    have Horovod's workers (same rank, same size; `check_matches_horovod`)."""
    resolved = resolve_transport(transport, horovod)
    check_matches_horovod(resolved, horovod.rank(), horovod.size())
    return resolved


__all__ = ["TRANSPORTS", "Transport", "check_matches_horovod", "launched_by_mpi",
           "load_mpi_if_launched", "resolve_for_horovod", "resolve_transport"]
