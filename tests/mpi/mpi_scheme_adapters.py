"""A scheme registered by the test (tests/schemes/test_scheme_seam.py's PartitionUnion) runs through
the torch DistributedOptimizer and the TF DistributedGradientTape with no adapter change: each
worker's update equals the numpy replay of the scheme on every worker's gathered gradients,
and the replicas stay bitwise identical. Run under mpirun (3 workers)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
from harness import run_on_all_ranks

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "schemes"))  # the test's folder
from test_scheme_seam import replay  # noqa: E402

import gtopk_hvd.torch as gtopk_torch  # noqa: E402, F401  (before horovod: loads mpi4py first)

STEPS, D, DENSITY, SHARE = 4, 60, 0.2, 0.5


def gradients_of_all(hvd_size: int) -> np.ndarray:
    return np.random.default_rng(3).standard_normal((hvd_size, STEPS, D)).astype(np.float32)


def torch_updates() -> list[np.ndarray]:
    import horovod.torch as hvd
    import torch

    hvd.init()
    everyone = gradients_of_all(hvd.size())
    parameter = torch.nn.Parameter(torch.zeros(D))
    optimizer = gtopk_torch.DistributedOptimizer(
        torch.optim.SGD([parameter], lr=1.0),
        compression=gtopk_torch.Compression.scheme("test-partition-union", DENSITY,
                                                   share=SHARE))
    updates = []
    for step in range(STEPS):
        optimizer.zero_grad()
        parameter.grad = torch.from_numpy(everyone[hvd.rank(), step].copy())
        optimizer.synchronize()
        updates.append(parameter.grad.numpy().copy())
        with optimizer.skip_synchronize():
            optimizer.step()
    return updates


def tensorflow_updates() -> list[np.ndarray]:
    import horovod.tensorflow as hvd
    import tensorflow as tf

    import gtopk_hvd.tensorflow as gtopk_tf

    hvd.init()
    everyone = gradients_of_all(hvd.size())
    variable = tf.Variable(tf.zeros([D]))
    state = gtopk_tf.GTopkState()
    updates = []
    for step in range(STEPS):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(variable * everyone[hvd.rank(), step])
        tape = gtopk_tf.DistributedGradientTape(
            tape, compression=gtopk_tf.Compression.scheme("test-partition-union", DENSITY,
                                                          share=SHARE), gtopk_state=state)
        (gradient,) = tape.gradient(loss, [variable])
        updates.append(gradient.numpy().copy())
    return updates


def main() -> None:
    framework = sys.argv[1]
    updates = torch_updates() if framework == "torch" else tensorflow_updates()
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    expected = replay(gradients_of_all(comm.size), DENSITY, SHARE, None)
    for step, (union, update, _) in enumerate(expected):
        want = np.zeros(D, np.float32)
        want[union] = update
        np.testing.assert_allclose(updates[step], want, rtol=1e-6, atol=1e-6,
                                   err_msg=f"{framework} step {step}")
        everyone = comm.allgather(updates[step].tobytes())
        assert all(other == everyone[0] for other in everyone), "replicas differ"
    if comm.rank == 0:
        print(f"SCHEME THROUGH {framework} OK", flush=True)


if __name__ == "__main__":
    run_on_all_ranks(main)
