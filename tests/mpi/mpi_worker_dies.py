"""Under mpirun or horovodrun --gloo: one worker raises in the middle of training while the
others go on into the next step's reduction. The job must end promptly, with that worker's error
printed (gtopk_hvd aborts the MPI job on an uncaught exception; horovodrun ends the others when
one exits non-zero). Deliberately not wrapped in harness.py."""

from __future__ import annotations

import horovod.torch as hvd
import torch

import gtopk_hvd.torch as gtopk

hvd.init()
torch.manual_seed(0)
model = torch.nn.Linear(50, 5)
optimizer = gtopk.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                       named_parameters=model.named_parameters(),
                                       compression=gtopk.Compression.gtopk(density=0.1))
for step in range(20):
    if step == 5 and hvd.rank() == 1:
        raise RuntimeError("worker 1 failed while loading its next batch")
    optimizer.zero_grad()
    model(torch.randn(8, 50)).square().mean().backward()
    optimizer.step()
print("unreachable: every worker finished", flush=True)
