"""Shared by the test programs: any exception on any rank ends the whole job at once, under
mpirun (MPI_Abort), horovodrun or torchrun (a non-zero exit, which ends the other workers)."""

from __future__ import annotations

import gc
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


def end_torch_distributed() -> None:
    """The normal end of a torchrun program, on every rank: frees what still holds the process
    group (DDP models and hook states in reference cycles) while the interpreter is fully alive,
    waits for every rank (no rank takes its Gloo pairs down while a peer still talks on them),
    then destroys the group. A Gloo group whose last reference dies during the interpreter's
    exit can abort the process ("terminate called without an active exception") after the
    program has succeeded."""
    import torch.distributed as dist

    gc.collect()
    dist.barrier()
    dist.destroy_process_group()
    gc.collect()
