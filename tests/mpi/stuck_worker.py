"""One worker never reaches the next step (stuck elsewhere, not dead): the others, waiting for
it inside the sparse reduction, must end the job within the wait bound (GTOPK_HVD_WAIT_TIMEOUT,
5 s here) with an error that names the wait, instead of hanging. Launched by
tests/transports/test_failures.py under mpirun (MPI transport) and horovodrun --gloo (Horovod's);
the job is expected to exit non-zero."""

from __future__ import annotations

import os
import time

os.environ["GTOPK_HVD_WAIT_TIMEOUT"] = "5"

import horovod.torch as hvd  # noqa: E402
import torch  # noqa: E402

import gtopk_hvd.torch as gtopk  # noqa: E402

hvd.init()
torch.manual_seed(0)
model = torch.nn.Linear(50, 5)
optimizer = gtopk.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                       named_parameters=model.named_parameters(),
                                       compression=gtopk.Compression.gtopk(density=0.1))
for step in range(20):
    if step == 3 and hvd.rank() == 1:
        print("worker 1 is stuck outside the training loop", flush=True)
        time.sleep(600)
    optimizer.zero_grad()
    model(torch.randn(8, 50)).square().mean().backward()
    optimizer.step()
print("unreachable: every worker finished", flush=True)
