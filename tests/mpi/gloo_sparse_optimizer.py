"""Launched by `horovodrun --gloo -np 2` (tests/transports/test_launch_errors.py), not by mpirun:
builds gtopk_hvd.torch's DistributedOptimizer with a sparse compression and the MPI transport asked
for explicitly, which must fail on every worker with gtopk_hvd's message naming the fix (there is no
MPI world). The job is expected to exit non-zero."""

from __future__ import annotations

import horovod.torch as hvd
import torch

import gtopk_hvd.torch as gtopk


def main() -> None:
    hvd.init()
    model = torch.nn.Linear(4, 2)
    try:
        gtopk.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters(),
                                   compression=gtopk.Compression.gtopk(density=0.1),
                                   transport="mpi")
    except RuntimeError as error:
        print(f"rank {hvd.rank()} of {hvd.size()} refused: {error}", flush=True)
        # horovodrun kills the other workers as soon as one exits: let every worker print its
        # error before any exits (Horovod's own Gloo allreduce works here).
        hvd.allreduce(torch.zeros(1), name="every_worker_printed")
        raise
    print(f"rank {hvd.rank()} of {hvd.size()} built the optimizer", flush=True)


if __name__ == "__main__":
    main()
