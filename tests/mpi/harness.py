"""Shared by the MPI test programs: any exception on any rank ends the whole job at once."""

from __future__ import annotations

import sys
import traceback
from typing import Callable

from mpi4py import MPI


def run_on_all_ranks(main: Callable[[], None]) -> None:
    try:
        main()
    except BaseException:  # noqa: BLE001 - every failure must end every rank, not hang them
        rank = MPI.COMM_WORLD.Get_rank()
        print(f"[rank {rank}] FAILED:\n{traceback.format_exc()}", file=sys.stderr, flush=True)
        MPI.COMM_WORLD.Abort(1)
