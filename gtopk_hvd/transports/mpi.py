"""The Transport over MPI (mpi4py): the default, and the only module that imports mpi4py.

`MPITransport` runs on a duplicate of an MPI communicator (default COMM_WORLD), so its messages
never mix with Horovod's or the user's.

mpi4py must be imported before `hvd.init()` (the adapters' `__init__` import this module first).
Under `horovodrun --gloo` there is no MPI world: every process sees a world of size 1 while
Horovod has several workers; `check_matches_horovod` turns that into an error that names the fix.

A worker that dies of an uncaught exception would leave the others waiting in MPI forever. Once
a transport with more than one worker exists, an uncaught exception on any worker prints its
traceback and aborts the whole MPI job (what `python -m mpi4py` does), so the job ends at once
with the error shown.
"""

from __future__ import annotations

import sys
from types import TracebackType
from typing import Any

import numpy as np

try:
    from mpi4py import MPI
except ImportError as error:  # the "mpi" extra is optional (torchrun / Gloo users skip it)
    raise ImportError(
        "gtopk_hvd's MPI transport needs mpi4py: pip install --no-binary mpi4py "
        "\"gtopk_hvd[mpi]\", or choose another transport (transport=\"torch\" under torchrun, "
        "\"horovod\" under horovodrun --gloo)") from error

from gtopk_hvd.transports.base import Transport
from gtopk_hvd.transports.wait_bound import WaitBound


class MPITransport(Transport):
    """Transport over an MPI communicator (default: a duplicate of COMM_WORLD)."""

    mismatch_hint = ("Launch with mpirun (or `horovodrun --mpi`), not `horovodrun --gloo`, and "
                     "make sure Horovod and mpi4py use the same MPI library.")

    def __init__(self, comm: Any = None, wait_timeout_s: float | None = None) -> None:
        self.comm = (comm if comm is not None else MPI.COMM_WORLD).Dup()
        self.rank = self.comm.Get_rank()
        self.size = self.comm.Get_size()
        self._status = MPI.Status()
        self._bound = WaitBound(self.abort, wait_timeout_s)  # mpi4py waits without the GIL

    def sendrecv(self, send: np.ndarray, send_bytes: int, dest: int | None,
                 receive: np.ndarray, source: int | None, tag: int) -> int:
        if dest is None and source is None:
            return 0
        with self._bound.waiting(f"MPI message tag {tag} (to {dest}, from {source})"):
            if dest is None:
                self.comm.Recv([receive, MPI.BYTE], source=source, tag=tag, status=self._status)
            elif source is None:
                self.comm.Send([send, send_bytes, MPI.BYTE], dest=dest, tag=tag)
                return 0
            else:
                self.comm.Sendrecv([send, send_bytes, MPI.BYTE], dest, tag, [receive, MPI.BYTE],
                                   source, tag, status=self._status)
        return self._status.Get_count(MPI.BYTE)

    def allgather(self, local: np.ndarray) -> np.ndarray:
        gathered = np.empty((self.size, *local.shape), dtype=local.dtype)
        with self._bound.waiting("MPI_Allgather"):
            self.comm.Allgather(np.ascontiguousarray(local), gathered)
        return gathered

    def allgatherv(self, local: np.ndarray, counts: np.ndarray) -> np.ndarray:
        gathered = np.empty(int(counts.sum()), dtype=local.dtype)
        displacements = np.concatenate([[0], np.cumsum(counts)[:-1]])
        with self._bound.waiting("MPI_Allgatherv"):
            self.comm.Allgatherv(np.ascontiguousarray(local),
                                 [gathered, counts.tolist(), displacements.tolist(),
                                  MPI._typedict[local.dtype.char]])
        return gathered

    def allreduce_sum(self, array: np.ndarray) -> None:
        with self._bound.waiting("MPI_Allreduce"):
            self.comm.Allreduce(MPI.IN_PLACE, array, op=MPI.SUM)

    def abort(self, message: str) -> None:
        print(f"gtopk_hvd [rank {self.rank}]: {message}", file=sys.stderr, flush=True)
        self.comm.Abort(1)


_default: MPITransport | None = None


def default_transport() -> MPITransport:
    """One MPITransport over COMM_WORLD per process, made on first use."""
    global _default
    if _default is None:
        _default = MPITransport()
        if _default.size > 1:
            abort_job_on_uncaught_exception()
    return _default


def abort_job_on_uncaught_exception() -> None:
    """Chains sys.excepthook: print the traceback, then MPI_Abort the whole job."""
    previous_hook = sys.excepthook
    if getattr(previous_hook, "_gtopk_aborts_job", False):
        return

    def hook(kind: type[BaseException], error: BaseException,
             trace: TracebackType | None) -> None:
        previous_hook(kind, error, trace)
        rank = MPI.COMM_WORLD.Get_rank()
        print(f"gtopk_hvd [rank {rank}]: uncaught {kind.__name__}; aborting the MPI job so the "
              "other workers do not wait forever", file=sys.stderr, flush=True)
        sys.stderr.flush()
        MPI.COMM_WORLD.Abort(1)

    hook._gtopk_aborts_job = True  # type: ignore[attr-defined]
    sys.excepthook = hook
