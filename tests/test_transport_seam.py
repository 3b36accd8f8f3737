"""A transport passed in is the one every adapter uses (one process, Horovod of size 1).

The transport here wraps a one-worker thread group and counts its calls; with density 1.0 and
one worker the update equals the local gradient, computed independently by plain autograd.
"""

from __future__ import annotations

import numpy as np
import pytest
from helpers.thread_transport import ThreadGroup

from gtopk_hvd.transports import Transport


class CountingTransport(Transport):
    """One worker; counts the calls that reach it."""

    def __init__(self) -> None:
        self.inner = ThreadGroup(1).run(lambda t: t)[0]
        self.rank, self.size = 0, 1
        self.calls: list[str] = []

    def sendrecv(self, send: np.ndarray, send_bytes: int, dest: int | None, receive: np.ndarray,
                 source: int | None, tag: int) -> int:
        self.calls.append("sendrecv")
        return self.inner.sendrecv(send, send_bytes, dest, receive, source, tag)

    def allgather(self, local: np.ndarray) -> np.ndarray:
        self.calls.append("allgather")
        return self.inner.allgather(local)

    def allgatherv(self, local: np.ndarray, counts: np.ndarray) -> np.ndarray:
        self.calls.append("allgatherv")
        return self.inner.allgatherv(local, counts)

    def allreduce_sum(self, array: np.ndarray) -> None:
        self.calls.append("allreduce_sum")
        self.inner.allreduce_sum(array)

    def abort(self, message: str) -> None:
        raise RuntimeError(message)


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
    transport = CountingTransport()
    optimizer = gtopk.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.5), named_parameters=model.named_parameters(),
        compression=getattr(gtopk.Compression, scheme)(density=1.0), transport=transport)
    plain = torch.optim.SGD(reference.parameters(), lr=0.5)
    x = torch.randn(8, 5)
    for net, opt in ((model, optimizer), (reference, plain)):
        for _ in range(2):
            opt.zero_grad()
            net(x).square().mean().backward()
            opt.step()
    assert "allgather" in transport.calls  # the agreement check at the first step, at least
    for ours, theirs in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-6)


def test_tensorflow_tape_uses_the_transport_it_is_given() -> None:
    tf = pytest.importorskip("tensorflow")
    import horovod.tensorflow as hvd

    import gtopk_hvd.tensorflow as gtopk

    hvd.init()
    variable = tf.Variable(tf.range(6, dtype=tf.float32))
    transport = CountingTransport()
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(variable ** 2)
    tape = gtopk.DistributedGradientTape(tape, compression=gtopk.Compression.gtopk(density=1.0),
                                         transport=transport)
    (gradient,) = tape.gradient(loss, [variable])
    np.testing.assert_allclose(gradient.numpy(), 2 * np.arange(6, dtype=np.float32))
    assert "allgather" in transport.calls


def test_a_transport_without_horovods_workers_is_refused() -> None:
    torch = pytest.importorskip("torch")
    import horovod.torch as hvd

    import gtopk_hvd.torch as gtopk

    hvd.init()
    transport = CountingTransport()
    transport.size = 2  # claims a second worker Horovod does not have
    model = torch.nn.Linear(2, 2)
    with pytest.raises(RuntimeError, match="CountingTransport sees rank 0 of 2, Horovod rank 0 "
                                           "of 1"):
        gtopk.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters(),
                                   compression=gtopk.Compression.gtopk(density=0.5),
                                   transport=transport)
