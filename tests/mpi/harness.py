"""Shared by the test programs: any exception on any rank ends the whole job at once, under
mpirun (MPI_Abort), horovodrun or torchrun (a non-zero exit, which ends the other workers)."""

from __future__ import annotations

import os
import sys
import traceback
from typing import Callable

from gtopk_hvd.transports import launched_by_mpi


def run_on_all_ranks(main: Callable[[], None]) -> None:
    try:
        main()
    except BaseException:  # noqa: BLE001 - every failure must end every rank, not hang them
        rank = next((os.environ[name] for name in ("OMPI_COMM_WORLD_RANK", "HOROVOD_RANK", "RANK")
                     if name in os.environ), "?")
        print(f"[rank {rank}] FAILED:\n{traceback.format_exc()}", file=sys.stderr, flush=True)
        if launched_by_mpi():
            from mpi4py import MPI

            MPI.COMM_WORLD.Abort(1)
        os._exit(1)

