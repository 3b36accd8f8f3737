"""Elastic Horovod with a sparse optimizer: training goes on when a worker dies or comes back.

    horovodrun --gloo -np 4 --min-np 3 --max-np 4 --host-discovery-script ./hosts.sh \\
        python examples/elastic_torch.py --compression gtopk --density 0.05 --steps 60

`hosts.sh` prints one `host:slots` line per host (Horovod reruns it every second). A regression
MLP on data generated here, every worker a shard of each step's batch (the shard follows the
current rank and size, so it stays a partition after a reset). The script is Horovod's elastic
recipe with one changed line (the compression): `hvd.elastic.TorchState(model, optimizer,
step=0)` commits the weights, the optimizer's state and this worker's residual (gtopk_hvd keeps
it in `optimizer.state_dict()`) after every step; on a reset Horovod restores the last commit
on the survivors, syncs the weights and the optimizer's state from rank 0 (a new worker's
residual starts at zero), and gtopk_hvd rebuilds the sparse step for the new number of workers
at the next step.

--kill-rank R --kill-at S (fault injection): the worker started as rank R kills itself with SIGKILL
at step S, once (a marker file, --marker, remembers it): with --kill-phase reduction (the default)
after its backward pass, so the others are inside the sparse step when it dies; with commit instead
of its state.commit(), so the others are inside theirs. Rank 0 prints a line per step (size, loss)
and at the end: the seconds from the kill to the first step completed after it, and a RESULT line
with the final loss and the parameters' checksum, which every worker checks is the same.
"""

from __future__ import annotations

import argparse
import os
import time

import horovod.torch as hvd
import torch
from elastic_common import (
    FEATURES,
    RecoveryClock,
    add_kill_options,
    add_training_options,
    checksum,
    dataset,
    die,
    step_rows,
)

import gtopk_hvd.torch as gtopk


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_training_options(parser, steps=60, marker="/tmp/gtopk_elastic_killed")
    add_kill_options(parser)
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    hvd.init()
    started_as = int(os.environ.get("HOROVOD_RANK", hvd.rank()))  # the spawn rank, kept
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(FEATURES, 64), torch.nn.Tanh(),
                                torch.nn.Linear(64, 1))
    compression = (gtopk.Compression.none if args.compression == "none"
                   else getattr(gtopk.Compression, args.compression)(args.density))
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=args.lr),
                                         named_parameters=model.named_parameters(),
                                         compression=compression)
    x, y = dataset()
    state = hvd.elastic.TorchState(model, optimizer, step=0)
    clock = RecoveryClock(args.marker)

    @hvd.elastic.run
    def train(state: hvd.elastic.TorchState) -> None:
        while state.step < args.steps:
            rank, size = hvd.rank(), hvd.size()
            mine = torch.from_numpy(step_rows(state.step, args.batch, rank, size))
            optimizer.zero_grad()
            loss = torch.nn.functional.mse_loss(model(x[mine]), y[mine])
            loss.backward()
            time.sleep(args.compute_ms / 1e3)
            dying = (started_as == args.kill_rank and state.step == args.kill_at
                     and not args.marker.exists())
            if dying and args.kill_phase == "reduction":
                die(args.marker)
            optimizer.step()
            state.step += 1
            clock.step_done(size)
            if rank == 0:
                print(f"step {state.step} size {size} loss {loss.item():.5f}", flush=True)
            if dying:
                die(args.marker)
            state.commit()

    train(state)
    with torch.no_grad():
        final = torch.nn.functional.mse_loss(model(x), y).item()
    sums = hvd.allgather_object(checksum(model))
    assert len(set(sums)) == 1, f"replicas differ: {sums}"
    if clock.seconds is not None:
        print(f"RECOVERY rank={hvd.rank()} seconds={clock.seconds:.2f}", flush=True)
    if hvd.rank() == 0:
        print(f"RESULT elastic compression={args.compression} workers={hvd.size()} "
              f"steps={args.steps} loss={final:.6f} checksum={sums[0]}", flush=True)


if __name__ == "__main__":
    main()
