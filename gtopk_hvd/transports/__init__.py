"""Transports by name: `resolve_transport` turns what a user passes as `transport=` into one.

    None             the default: MPI over mpi4py on a duplicate of COMM_WORLD ("mpi")
    "mpi"            the same
    a Transport      itself (e.g. MPITransport(comm) for another mpi4py communicator)

A transport module registers a factory (no arguments, returns the process-wide instance) with
`@TRANSPORTS.register(name)`; only that module imports its communication library.
"""

from __future__ import annotations

from collections.abc import Callable

from gtopk_hvd.registry import Registry
from gtopk_hvd.transports.base import Transport, check_matches_horovod

TRANSPORTS: Registry[Callable[[], Transport]] = Registry("transport")


@TRANSPORTS.register("mpi")
def _mpi() -> Transport:
    from gtopk_hvd.transports.mpi import default_transport

    return default_transport()


def resolve_transport(transport: Transport | str | None) -> Transport:
    """None -> the default ("mpi"); a registered name -> its process-wide transport; a
    Transport -> itself."""
    if transport is None:
        transport = "mpi"
    if isinstance(transport, str):
        return TRANSPORTS.get(transport)()
    if isinstance(transport, Transport):
        return transport
    raise TypeError(f"transport must be a gtopk_hvd Transport, one of the names "
                    f"{TRANSPORTS.names()} or None, got {type(transport).__name__}; wrap an "
                    "mpi4py communicator as gtopk_hvd.transports.mpi.MPITransport(comm)")


__all__ = ["TRANSPORTS", "Transport", "check_matches_horovod", "resolve_transport"]
