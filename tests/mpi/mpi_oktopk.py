"""Under mpirun: Ok-Topk's core step over the "mpi" and "horovod" transports, and as a one-line
choice of the torch DistributedOptimizer (over "mpi"), against the same steps run in this
process on every rank's gradient with threads (tests/schemes/test_oktopk.py checks those against a
numpy replay). Indices, values and residuals are bitwise equal to the thread run's on every rank,
with thresholds re-estimated every 2 steps and reused in between; the update through the optimizer
equals the core's update bitwise.

    mpirun -np 3 python tests/mpi/mpi_oktopk.py
"""

from __future__ import annotations

import numpy as np
from harness import run_on_all_ranks
from helpers.thread_transport import ThreadGroup

import gtopk_hvd.torch as gtopk_torch  # noqa: F401  (before horovod: loads mpi4py first)
from gtopk_hvd.compression import Compression
from gtopk_hvd.core import SparseStep
from gtopk_hvd.transports import resolve_transport

STEPS, D = 6, 3000
CONFIG = Compression.oktopk(0.02, reestimate_every=2)


def gradients_of_all(size: int) -> np.ndarray:
    rng = np.random.default_rng(11)
    scale = np.repeat(rng.uniform(0.05, 2.0, 16), D // 16 + 1)[:D]
    return (rng.standard_t(3, (size, STEPS, D)) * scale).astype(np.float32)


def core_steps(transport: object, everyone: np.ndarray) -> list[tuple]:
    """Each step's indices, values, residual and update on this rank."""
    step = SparseStep(CONFIG, [D], transport)
    out = []
    for t in range(STEPS):
        indices, values = step.update(everyone[transport.rank, t].copy())
        update = np.zeros(D, np.float32)
        update[indices] = values
        out.append((indices.copy(), values.copy(), step.residual.copy(), update))
    return out


def torch_updates(everyone: np.ndarray) -> list[np.ndarray]:
    import horovod.torch as hvd
    import torch

    hvd.init()
    parameter = torch.nn.Parameter(torch.zeros(D))
    optimizer = gtopk_torch.DistributedOptimizer(torch.optim.SGD([parameter], lr=1.0),
                                                 compression=CONFIG, transport="mpi")
    updates = []
    for t in range(STEPS):
        optimizer.zero_grad()
        parameter.grad = torch.from_numpy(everyone[hvd.rank(), t].copy())
        optimizer.synchronize()
        updates.append(parameter.grad.numpy().copy())
        with optimizer.skip_synchronize():
            optimizer.step()
    return updates


def main() -> None:
    import horovod.torch as hvd
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    hvd.init()
    everyone = gradients_of_all(comm.size)
    threads = ThreadGroup(comm.size).run(lambda transport: core_steps(transport, everyone))
    mine = threads[comm.rank]
    runs = {"mpi": core_steps(resolve_transport("mpi"), everyone),
            "horovod": core_steps(resolve_transport("horovod", hvd), everyone)}
    for name, steps in runs.items():
        for t in range(STEPS):
            for got, want, what in zip(steps[t], mine[t], ("indices", "values", "residual",
                                                              "update")):
                np.testing.assert_array_equal(got, want, err_msg=f"{name} {what} step {t}")
    for t, update in enumerate(torch_updates(everyone)):
        np.testing.assert_array_equal(update, mine[t][3], err_msg=f"torch optimizer step {t}")
        assert np.count_nonzero(update) > 0
        assert all(other == update.tobytes() for other in comm.allgather(update.tobytes()))
    if comm.rank == 0:
        sizes = [mine[t][0].size for t in range(STEPS)]
        print(f"global set sizes per step: {sizes}", flush=True)
        print("OKTOPK UNDER MPIRUN OK", flush=True)


if __name__ == "__main__":
    run_on_all_ranks(main)
