"""A late worker under a real launcher: its partners' wait_seconds hold the delay, every
worker's transfer_seconds stays small (gtopk_hvd/reductions/wait_probe.py).

    mpirun -np P python mpi_wait_split.py [--transport mpi|horovod]
    horovodrun --gloo -np P python mpi_wait_split.py --transport horovod
    torchrun --nproc_per_node P mpi_wait_split.py --transport torch

For gTop-k (fold phases included when P is not a power of two), Top-k's all-gather and the
dense all-reduce, with the probe on whatever the transport's default: after a barrier the last
rank sleeps LATE_S, then every rank reduces. Rank 0 gathers every rank's stats and checks them.
"""

from __future__ import annotations

import time

import numpy as np
from helpers.worlds import World, run_on_all_ranks, world_from_arguments

from gtopk_hvd.reductions import dense_allreduce, gtopk_allreduce, topk_allgather

LATE_S = 1.0
TOLERANCE_S = 0.1  # scheduling on a loaded machine, the barrier's own skew

WORLD = world_from_arguments()


def late_stats(world: World, reduce: object) -> list[tuple[float, float, float]]:
    """(comm, wait, transfer) of every rank for a second reduce() before which the last rank
    arrives LATE_S late (the first call does the agreement checks)."""
    reduce()
    world.transport.allgather(np.zeros(1))
    if world.rank == world.size - 1:
        time.sleep(LATE_S)
    stats = reduce()
    return world.allgather_objects((stats.comm_seconds, stats.wait_seconds,
                                    stats.transfer_seconds))


def check(name: str, everyone: list[tuple[float, float, float]], late: int) -> None:
    for rank, (comm, wait, transfer) in enumerate(everyone):
        where = f"{name}, rank {rank} (late: {late}): comm {comm:.4f} wait {wait:.4f} " \
                f"transfer {transfer:.4f}"
        assert abs(comm - (wait + transfer)) < 1e-6, where
        assert transfer < LATE_S / 4, where
        if rank == late:
            assert wait < LATE_S / 4, where
        else:
            assert wait >= LATE_S - TOLERANCE_S, where


def main(world: World) -> None:
    rng = np.random.default_rng(world.rank)
    d, k = 100_000, 1000
    indices = np.sort(rng.choice(d, size=k, replace=False)).astype(np.int32)
    values = rng.standard_normal(k).astype(np.float32)
    dense = rng.standard_normal(d).astype(np.float32)
    runs = {
        "gtopk": lambda: gtopk_allreduce(indices, values, k, world.transport,
                                         wait_probe=True).stats,
        "allgather": lambda: topk_allgather(indices, values, world.transport).stats,
        "dense": lambda: dense_allreduce(dense.copy(), world.transport, wait_probe=True),
    }
    for name, reduce in runs.items():
        everyone = late_stats(world, reduce)
        if world.rank == 0:
            check(name, everyone, world.size - 1)
            print(name, [tuple(round(x, 4) for x in row) for row in everyone], flush=True)
    if world.rank == 0:
        print(f"wait split ok on {world.size} workers over {world.name}", flush=True)


if __name__ == "__main__":
    run_on_all_ranks(main, WORLD)
