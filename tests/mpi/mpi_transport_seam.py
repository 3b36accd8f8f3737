"""Under mpirun (P = 3: gTop-k's fold in, one round and fold out): the adapters' sparse step sends
its reduction through the transport it is given, and only through it.

Each adapter (torch: `--framework torch`, the DistributedOptimizer; TensorFlow:
`--framework tensorflow`, the DistributedGradientTape) gets `transport=` a CountingTransport
(tests/helpers/counting_transport.py) around MPI's or Horovod's transport, and every step checks,
on every rank:

  bytes     gTop-k: the messages that moved data through the wrapper are the schedule's
            (tests/helpers/counting_transport.gtopk_messages: which worker sends and receives
            how many, 8 bytes per entry), and their sum is the step's last_stats; Top-k: two
            all-gathers of this worker's k indices and k values, the others' coming back
  result    the applied gradient against numpy, from every rank's own gradient gathered with
            mpi4py's COMM_WORLD (not through gtopk_hvd): density 1.0: their mean; density 0.5,
            first step: the reduction of their local top-k sets (tests/helpers/reference.py),
            divided by P; later steps (residuals then matter: tests/core/test_numpy_replays.py
            replays those): the size of the update's support

Any failure on any rank ends the job (harness.run_on_all_ranks).
"""

from __future__ import annotations

import argparse
import math

import numpy as np
from harness import run_on_all_ranks
from helpers.counting_transport import ENTRY_BYTES, CountingTransport, check_reduction_calls
from helpers.reference import gtopk_schedule_reference, topk_reference
from mpi4py import MPI

STEPS = 3


def reference_mean(local: np.ndarray) -> np.ndarray:
    """The mean over ranks of every rank's `local`, by mpi4py and numpy only."""
    gathered = MPI.COMM_WORLD.allgather(np.asarray(local, dtype=np.float64))
    return np.mean(gathered, axis=0)


def check_result(local: np.ndarray, applied: np.ndarray, reduction: str, density: float, k: int,
                 step: int, what: str) -> None:
    """The update against numpy: density 1.0, every step: the mean of every rank's gradient;
    density < 1, the first step (residuals still zero): the reduction of every rank's local
    top-k (Top-k: union, summed; gTop-k: the schedule replayed), divided by P; later steps: the
    size of its support."""
    size = MPI.COMM_WORLD.size
    if density == 1.0:
        np.testing.assert_allclose(applied, reference_mean(local), rtol=1e-5, atol=1e-7,
                                   err_msg=what)
    elif step == 0:
        sets = []
        for gradient in MPI.COMM_WORLD.allgather(np.asarray(local, np.float32)):
            chosen = topk_reference(gradient, k).astype(np.int32)
            sets.append((chosen, gradient[chosen]))
        if reduction == "gtopk":
            finals, _, _ = gtopk_schedule_reference(sets, k, ENTRY_BYTES, lambda v: v)
            indices, values = finals[MPI.COMM_WORLD.rank]
        else:
            indices = np.unique(np.concatenate([i for i, _ in sets]))
            values = np.zeros(indices.size, np.float32)
            for chosen, chosen_values in sets:
                values[np.searchsorted(indices, chosen)] += chosen_values
        expected = np.zeros_like(applied)
        expected[indices] = values / np.float32(size)
        np.testing.assert_allclose(applied, expected, rtol=1e-5, atol=1e-7, err_msg=what)
    else:
        support = np.count_nonzero(applied)
        if reduction == "gtopk":
            assert k - 1 <= support <= k, (what, support)  # a sum may be exactly zero
        else:
            assert k - 1 <= support <= min(applied.size, size * k), (what, support)


def torch_adapter(inner_name: str, reduction: str, density: float) -> None:
    import horovod.torch as hvd
    import torch

    import gtopk_hvd.torch as gtopk
    from gtopk_hvd.transports import resolve_transport

    rank = hvd.rank()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))
    d = sum(p.numel() for p in model.parameters())
    k = math.ceil(density * d)
    transport = CountingTransport(resolve_transport(inner_name, hvd))
    factory = gtopk.Compression.gtopk if reduction == "gtopk" else gtopk.Compression.topk
    optimizer = gtopk.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1), named_parameters=model.named_parameters(),
        compression=factory(density=density), transport=transport)
    generator = torch.Generator().manual_seed(100 + rank)  # each rank its own data
    for step in range(STEPS):
        what = f"torch {inner_name} {reduction} density {density} step {step} rank {rank}"
        optimizer.zero_grad()
        x = torch.randn(16, 6, generator=generator)
        model(x).square().mean().backward()
        local = torch.cat([p.grad.reshape(-1) for p in model.parameters()]).numpy().copy()
        transport.take()  # nothing of the step before synchronize
        optimizer.synchronize()
        check_reduction_calls(transport.take(), optimizer.last_stats, reduction, k, rank,
                              hvd.size(), what)
        applied = torch.cat([p.grad.reshape(-1) for p in model.parameters()]).numpy()
        check_result(local, applied, reduction, density, k, step, what)
        with optimizer.skip_synchronize():
            optimizer.step()


def tensorflow_adapter(inner_name: str, reduction: str, density: float) -> None:
    import horovod.tensorflow as hvd
    import tensorflow as tf

    import gtopk_hvd.tensorflow as gtopk
    from gtopk_hvd.transports import resolve_transport

    rank = hvd.rank()
    variables = [tf.Variable(tf.zeros([5, 4])), tf.Variable(tf.zeros([7]))]
    d = 27
    k = math.ceil(density * d)
    transport = CountingTransport(resolve_transport(inner_name, hvd))
    factory = gtopk.Compression.gtopk if reduction == "gtopk" else gtopk.Compression.topk
    compression = factory(density=density)
    generator = np.random.default_rng(200 + rank)  # each rank its own data
    for step in range(STEPS):
        what = f"tensorflow {inner_name} {reduction} density {density} step {step} rank {rank}"
        a = tf.constant(generator.standard_normal([5, 4]).astype(np.float32))
        b = tf.constant(generator.standard_normal([7]).astype(np.float32))
        with tf.GradientTape(persistent=True) as tape:
            loss = tf.reduce_sum(a * variables[0] ** 2 + a * variables[0]) + tf.reduce_sum(
                b * variables[1])
        local = np.concatenate([g.numpy().reshape(-1) for g in tape.gradient(loss, variables)])
        transport.take()
        distributed = gtopk.DistributedGradientTape(tape, compression=compression,
                                                    transport=transport)
        gradients = distributed.gradient(loss, variables)
        applied = np.concatenate([g.numpy().reshape(-1) for g in gradients])
        check_reduction_calls(transport.take(), distributed.last_stats, reduction, k, rank,
                              hvd.size(), what)
        check_result(local, applied, reduction, density, k, step, what)
        for variable, gradient in zip(variables, gradients):
            variable.assign_sub(0.1 * gradient)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--framework", choices=("torch", "tensorflow"), required=True)
    args = parser.parse_args()
    if args.framework == "torch":
        import horovod.torch as hvd

        import gtopk_hvd.torch  # noqa: F401  (before hvd.init(): loads mpi4py first)

        adapter = torch_adapter
    else:
        import horovod.tensorflow as hvd

        import gtopk_hvd.tensorflow  # noqa: F401

        adapter = tensorflow_adapter
    hvd.init()
    assert hvd.size() == MPI.COMM_WORLD.size >= 2
    for inner_name in ("mpi", "horovod"):
        for reduction in ("gtopk", "allgather"):
            for density in (1.0, 0.5):
                adapter(inner_name, reduction, density)
    MPI.COMM_WORLD.Barrier()
    if hvd.rank() == 0:
        print(f"transport seam ok: {args.framework} on {hvd.size()} workers", flush=True)


if __name__ == "__main__":
    run_on_all_ranks(main)
