"""A transport passed in is the one every adapter uses, its reduction included.

In this process (Horovod of size 1): the transport wraps a one-worker thread group and records
its calls (tests/helpers/counting_transport.py); with density 1.0 and one worker the update equals
the local gradient, computed independently by plain autograd. At P = 1 neither reduction sends
its set (gTop-k has no partner; Top-k's all-gather of one worker's set is the set itself), and
the step's agreement check still goes through the transport given.

Under mpirun (P = 3, tests/mpi/mpi_transport_seam.py): the torch optimizer and the TensorFlow
tape, given a recording wrapper around MPI's or Horovod's transport, send every step's
reduction through it (gTop-k's messages, fold in, round and fold out, of 8 bytes per entry, as
the step's stats count them; Top-k's all-gathers), and the update equals numpy's reduction of
every rank's own gradient gathered with mpi4py.
"""

from __future__ import annotations

import numpy as np
import pytest
from helpers.counting_transport import CountingTransport, data_messages
from helpers.mpi_launcher import run_mpi
from helpers.thread_transport import ThreadGroup


def one_worker() -> CountingTransport:
    return CountingTransport(ThreadGroup(1).run(lambda t: t)[0])


def check_step_calls(transport: CountingTransport) -> None:
    """One worker, density 1.0: no reduction sent a set through the transport (gTop-k has no
    partner; Top-k's one-worker all-gather returns the set it holds, whose d entries reach the
    update the caller compares); the callers check that the first step's agreement check went
    through it."""
    calls = transport.take()
    assert not [c for c in calls if c.operation == "allgatherv"], calls
    assert not data_messages(calls), calls


@pytest.mark.parametrize("scheme", ["gtopk", "topk"])
def test_torch_optimizer_uses_the_transport_it_is_given(scheme: str) -> None:
    torch = pytest.importorskip("torch")
    import horovod.torch as hvd

    import gtopk_hvd.torch as gtopk

    hvd.init()
    torch.manual_seed(0)
    model = torch.nn.Linear(5, 3)
    reference = torch.nn.Linear(5, 3)
    reference.load_state_dict(model.state_dict())
    transport = one_worker()
    optimizer = gtopk.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.5), named_parameters=model.named_parameters(),
        compression=getattr(gtopk.Compression, scheme)(density=1.0), transport=transport)
    plain = torch.optim.SGD(reference.parameters(), lr=0.5)
    x = torch.randn(8, 5)
    for net, opt in ((model, optimizer), (reference, plain)):
        for step in range(2):
            opt.zero_grad()
            net(x).square().mean().backward()
            opt.step()
            if opt is optimizer:
                if step == 0:  # the agreement check at the first step
                    assert [c.operation for c in transport.calls][0] == "allgather"
                check_step_calls(transport)
    for ours, theirs in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-6)


@pytest.mark.parametrize("scheme", ["gtopk", "topk"])
def test_tensorflow_tape_uses_the_transport_it_is_given(scheme: str) -> None:
    tf = pytest.importorskip("tensorflow")
    import horovod.tensorflow as hvd

    import gtopk_hvd.tensorflow as gtopk

    hvd.init()
    variable = tf.Variable(tf.range(6, dtype=tf.float32))
    transport = one_worker()
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(variable ** 2)
    compression = getattr(gtopk.Compression, scheme)(density=1.0)
    tape = gtopk.DistributedGradientTape(tape, compression=compression, transport=transport)
    (gradient,) = tape.gradient(loss, [variable])
    np.testing.assert_allclose(gradient.numpy(), 2 * np.arange(6, dtype=np.float32))
    assert [c.operation for c in transport.calls][0] == "allgather"  # the agreement check
    check_step_calls(transport)


def test_a_transport_without_horovods_workers_is_refused() -> None:
    torch = pytest.importorskip("torch")
    import horovod.torch as hvd

    import gtopk_hvd.torch as gtopk

    hvd.init()
    transport = one_worker()
    transport.size = 2  # claims a second worker Horovod does not have
    model = torch.nn.Linear(2, 2)
    with pytest.raises(RuntimeError, match="CountingTransport sees rank 0 of 2, Horovod rank 0 "
                                           "of 1"):
        gtopk.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters(),
                                   compression=gtopk.Compression.gtopk(density=0.5),
                                   transport=transport)


@pytest.mark.mpi  # launches mpirun: `pytest -m "not mpi"` skips it
@pytest.mark.parametrize("framework", ["torch", "tensorflow"])
def test_the_step_reduces_through_the_transport_it_is_given(framework: str) -> None:
    output = run_mpi("mpi_transport_seam.py", 3, "--framework", framework, timeout_s=600)
    assert f"transport seam ok: {framework} on 3 workers" in output, output[-3000:]
