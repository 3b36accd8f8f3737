"""Under mpirun: MiCRO, ExDyna, sketched SGD, exact gTop-k and Ok-Topk as one-line choices of
the torch DistributedOptimizer (over the "mpi" and "horovod" transports, and as Horovod's own
hvd.DistributedOptimizer after the swap), the TF DistributedGradientTape (ours and Horovod's,
swapped) and the Keras DistributedOptimizer (Keras 3, tf-keras). Each step's update equals that
of the same scheme's core step run in this process on every worker's gradient (threads:
tests/schemes/test_union_schemes.py checks the core against numpy replays), and the replicas are
bitwise identical.

    mpi_union_schemes.py torch | tf-keras | FRAMEWORK [FRAMEWORK ...]

FRAMEWORK: tensorflow or keras (both Keras 3: one launch may run both, one after the other);
tf-keras (TF_USE_LEGACY_KERAS, set before TensorFlow is imported) and torch run alone.
"""

from __future__ import annotations

import os
import sys

if __name__ == "__main__" and sys.argv[1:] == ["tf-keras"]:
    os.environ["TF_USE_LEGACY_KERAS"] = "1"  # before TensorFlow is imported

import numpy as np
from harness import run_on_all_ranks
from helpers.thread_transport import ThreadGroup

import gtopk_hvd.torch as gtopk_torch  # noqa: F401  (before horovod: loads mpi4py first)
from gtopk_hvd.compression import Compression
from gtopk_hvd.core import SparseStep

STEPS, D = 5, 240
SCHEMES = {
    "micro": Compression.micro(0.05),
    "exdyna": Compression.exdyna(0.05, blocks=16),
    "sketch": Compression.sketch(0.05, columns=60),
    "gtopk-exact": Compression.gtopk(0.05, exact=True),
    "oktopk": Compression.oktopk(0.05, reestimate_every=2),
}


def gradients_of_all(size: int) -> np.ndarray:
    rng = np.random.default_rng(5)
    return (rng.standard_t(3, (size, STEPS, D)) * np.linspace(0.1, 2, D)).astype(np.float32)


def in_process(config: object, size: int) -> list[np.ndarray]:
    """The averaged update of each step, the core's steps on threads."""
    everyone = gradients_of_all(size)

    def work(transport: object) -> list[np.ndarray]:
        step = SparseStep(config, [D], transport)
        updates = []
        for t in range(STEPS):
            out = np.zeros(D, np.float32)
            updates.append(step.update(everyone[transport.rank, t].copy(), out).copy())
        return updates

    return ThreadGroup(size).run(work)[0]


def torch_updates(config: object, transport: str) -> list[np.ndarray]:
    """transport "swap": Horovod's own hvd.DistributedOptimizer, which the import of
    gtopk_hvd.torch swapped (default transport)."""
    import horovod.torch as hvd
    import torch

    hvd.init()
    everyone = gradients_of_all(hvd.size())
    parameter = torch.nn.Parameter(torch.zeros(D))
    sgd = torch.optim.SGD([parameter], lr=1.0)
    if transport == "swap":
        optimizer = hvd.DistributedOptimizer(sgd, named_parameters=[("p", parameter)],
                                             compression=config)
    else:
        optimizer = gtopk_torch.DistributedOptimizer(sgd, compression=config,
                                                     transport=transport)
    updates = []
    for t in range(STEPS):
        optimizer.zero_grad()
        parameter.grad = torch.from_numpy(everyone[hvd.rank(), t].copy())
        optimizer.synchronize()
        updates.append(parameter.grad.numpy().copy())
        with optimizer.skip_synchronize():
            optimizer.step()
    return updates


def tensorflow_updates(config: object, swap: bool = False) -> list[np.ndarray]:
    """swap: Horovod's own hvd.DistributedGradientTape, swapped by importing
    gtopk_hvd.tensorflow."""
    import horovod.tensorflow as hvd
    import tensorflow as tf

    import gtopk_hvd.tensorflow as gtopk_tf

    hvd.init()
    everyone = gradients_of_all(hvd.size())
    variable = tf.Variable(tf.zeros([D]))
    state = gtopk_tf.GTopkState()
    wrap = hvd.DistributedGradientTape if swap else gtopk_tf.DistributedGradientTape
    updates = []
    for t in range(STEPS):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(variable * everyone[hvd.rank(), t])
        tape = wrap(tape, compression=config, gtopk_state=state)
        (gradient,) = tape.gradient(loss, [variable])
        updates.append(gradient.numpy().copy())
    return updates


def keras_updates(config: object) -> list[np.ndarray]:
    import horovod.tensorflow as hvd
    import tensorflow as tf

    import gtopk_hvd.tensorflow.keras as gtopk_keras

    hvd.init()
    everyone = gradients_of_all(hvd.size())
    variable = tf.Variable(tf.zeros([D]))
    optimizer = gtopk_keras.DistributedOptimizer(tf.keras.optimizers.SGD(1.0),
                                                 compression=config)
    updates = []
    for t in range(STEPS):
        before = variable.numpy().copy()
        optimizer.apply_gradients([(tf.constant(everyone[hvd.rank(), t]), variable)])
        updates.append(before - variable.numpy())
    return updates


def check(framework: str, comm: object) -> None:
    runs = []
    for name, config in SCHEMES.items():
        if framework == "torch":
            runs += [(name, "mpi", torch_updates(config, "mpi")),
                     (name, "horovod", torch_updates(config, "horovod")),
                     (name, "Horovod's wrapper", torch_updates(config, "swap"))]
        elif framework == "tensorflow":
            runs += [(name, "mpi", tensorflow_updates(config)),
                     (name, "Horovod's wrapper", tensorflow_updates(config, swap=True))]
        else:
            runs.append((name, "mpi", keras_updates(config)))
    for name, transport, updates in runs:
        expected = in_process(SCHEMES[name], comm.size)
        for t in range(STEPS):
            what = f"{framework} {name} over {transport}, step {t}"
            np.testing.assert_allclose(updates[t], expected[t], rtol=1e-5, atol=1e-6,
                                       err_msg=what)
            assert np.count_nonzero(updates[t]) > 0, what
            everyone = comm.allgather(updates[t].tobytes())
            assert all(other == everyone[0] for other in everyone), f"replicas differ: {what}"
    if comm.rank == 0:
        print(f"UNION SCHEMES THROUGH {framework} OK", flush=True)


def main() -> None:
    frameworks = sys.argv[1:]
    alone = ("torch", "tf-keras")
    if not frameworks or not set(frameworks) <= {"torch", "tensorflow", "keras", "tf-keras"} or (
            len(frameworks) > 1 and set(frameworks) & set(alone)):
        raise SystemExit(f"usage: mpi_union_schemes.py torch | tf-keras | tensorflow|keras ...; "
                         f"got {frameworks}")
    from mpi4py import MPI

    for framework in frameworks:
        check(framework, MPI.COMM_WORLD)


if __name__ == "__main__":
    run_on_all_ranks(main)
