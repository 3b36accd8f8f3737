"""The group of workers a test program runs in, opened by transport name.

    mpi      mpirun: MPI over mpi4py (COMM_WORLD)
    horovod  horovodrun --gloo, horovodrun --mpi or mpirun: Horovod's collectives (horovod.torch)
    torch    torchrun: torch.distributed with Gloo

A World gives the rank, the size, the Transport the reductions are handed, and an all-gather of
Python objects through that same transport, so one program checks its results the same way
whatever carries them, and a failure on any worker ends the job (`run_on_all_ranks`).
"""

from __future__ import annotations

import pickle
import sys
import traceback
from collections.abc import Callable
from typing import Any

import numpy as np

from gtopk_hvd.transports import Transport
from gtopk_hvd.transports.launch import close_transports, open_transport


class World:
    def __init__(self, name: str, transport: Transport) -> None:
        self.name, self.transport = name, transport
        self.rank, self.size = transport.rank, transport.size

    def allgather_objects(self, item: Any) -> list:
        """Every worker's picklable item, in rank order."""
        payload = np.frombuffer(pickle.dumps(item), dtype=np.uint8).copy()
        counts = self.transport.allgather(np.array([payload.size], dtype=np.int64))[:, 0]
        gathered = self.transport.allgatherv(payload, counts)
        bounds = np.concatenate([[0], np.cumsum(counts)])
        return [pickle.loads(gathered[begin:end].tobytes())
                for begin, end in zip(bounds[:-1], bounds[1:])]


def open_world(name: str) -> World:
    """Initialises the named world (hvd.init(), init_process_group) and returns it."""
    return World(name, open_transport(name))


def world_from_arguments(default: str = "mpi") -> World:
    """The world named by `--transport NAME` on the command line (default: mpi)."""
    name = default
    if "--transport" in sys.argv:
        name = sys.argv[sys.argv.index("--transport") + 1]
    return open_world(name)


def run_on_all_ranks(main: Callable[[World], None], world: World) -> None:
    """main(world); any exception on any worker prints it and ends every worker of the job."""
    try:
        main(world)
    except BaseException:  # noqa: BLE001 - every failure must end every rank, not hang them
        world.transport.abort(f"FAILED:\n{traceback.format_exc()}")
    close_transports()
