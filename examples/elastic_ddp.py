"""The DDP hook under torchrun's restarts: a node lost or added, training goes on from the last
checkpoint on the new number of workers.

    # on each node (here: twice on one machine, two "nodes" of 2 workers each)
    TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 torchrun --nnodes 1:2 --nproc_per_node 2 \\
        --max-restarts 3 --rdzv-backend c10d --rdzv-endpoint HOST:29500 --rdzv-id job1 \\
        examples/elastic_ddp.py --checkpoints /shared/ckpt --steps 80

torchrun restarts every worker when one fails; the rendezvous admits between 1 and 2 nodes, so a
job that lost a node continues on the survivors, and a node that comes back is admitted at the
next restart. Any later start, on any number of workers, continues from the checkpoint.
TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1: with the rendezvous' store shared (torch's default), a
restart after a lost node can read a dead worker's address from the round before and fail
(pytorch/pytorch#135712).

What makes the sparse state survive is the checkpoint, written every --commit-every steps into
<checkpoints>/step-<N>/:

- model.pt (rank 0): the weights, the optimizer's state, the step, the number of workers;
- hook-<rank>.pt (every rank): `GTopkHookState.state_dict()`, this worker's residuals;
- COMMITTED (rank 0, after every rank has written): only a directory with it is loaded.

On (re)start each worker loads the newest committed step; rank r takes hook-<r>.pt when the
saved job had a rank r, and otherwise rank 0's with `keep_residuals=False` (a worker new to the
job starts from zero residual, with the job's step counts and buckets). A lost worker's
residual (gradient it had not yet sent) is lost with it; the steps since the last commit are
done again.

--die-at S (fault injection, given to one node's torchrun only): at step S that node dies: its
local rank 0 kills its torchrun agent and itself with SIGKILL (its other workers end when their
peers do), once (--marker remembers it). --die-phase: "step" after the optimizer's step,
"reduction" inside backward as its first gradient is ready (the others are inside the hook's sparse
reductions), "commit" inside the first save() from step S on, after writing its hook state (the
others wait in the commit's barrier). Rank 0 prints a line per step (size, loss), the step each
start resumed from, the seconds from the kill to the first step after it (RECOVERY), and a RESULT
line with the final loss and the parameters' checksum, which every worker checks is the same.
"""

from __future__ import annotations

import argparse
import os
import signal
import time
from pathlib import Path

import torch
import torch.distributed as dist
from elastic_common import FEATURES, checksum, dataset, step_rows
from torch.nn.parallel import DistributedDataParallel as DDP

from gtopk_hvd.compression import Compression
from gtopk_hvd.torch.ddp import GTopkHookState, end_process_group, gtopk_hook


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoints", type=Path, required=True,
                        help="directory every node reads and writes (shared storage)")
    parser.add_argument("--compression", default="gtopk", choices=["gtopk", "topk"])
    parser.add_argument("--density", type=float, default=0.05)
    parser.add_argument("--steps", type=int, default=80)
    parser.add_argument("--commit-every", type=int, default=5, help="steps between checkpoints")
    parser.add_argument("--batch", type=int, default=96, help="global batch per step")
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--compute-ms", type=float, default=0.0,
                        help="sleep this long per step (stands for a bigger model's compute)")
    parser.add_argument("--die-at", type=int, default=None,
                        help="this node dies at this step, once")
    parser.add_argument("--die-phase", choices=["step", "reduction", "commit"], default="step",
                        help="where in the step it dies")
    parser.add_argument("--marker", type=Path, default=Path("/tmp/gtopk_elastic_ddp_killed"),
                        help="written at the kill (its time); no second kill while it exists")
    return parser.parse_args()


def die(marker: Path) -> None:
    """The node dies: its torchrun agent and this worker get SIGKILL, the time written to
    `marker` first."""
    marker.write_text(str(time.time()))
    os.kill(os.getppid(), signal.SIGKILL)
    os.kill(os.getpid(), signal.SIGKILL)


def latest_commit(checkpoints: Path) -> Path | None:
    committed = sorted(checkpoints.glob("step-*/COMMITTED"))
    return committed[-1].parent if committed else None


def save(checkpoints: Path, step: int, model: DDP, optimizer: torch.optim.Optimizer,
         hook: GTopkHookState, die_marker: Path | None = None) -> None:
    """Every rank writes its hook state, rank 0 the rest and, once all have written, COMMITTED;
    older commits are removed after the new one is complete. die_marker: this node dies right
    after writing its hook state (fault injection)."""
    rank = dist.get_rank()
    directory = checkpoints / f"step-{step:06d}"
    directory.mkdir(parents=True, exist_ok=True)
    torch.save(hook.state_dict(), directory / f"hook-{rank}.pt")
    if die_marker is not None:
        die(die_marker)
    if rank == 0:
        torch.save({"model": model.module.state_dict(), "optimizer": optimizer.state_dict(),
                    "step": step, "workers": dist.get_world_size()}, directory / "model.pt")
    dist.barrier()
    if rank == 0:
        (directory / "COMMITTED").write_text(str(step))
        for old in checkpoints.glob("step-*"):
            if old != directory:
                for file in old.iterdir():
                    file.unlink()
                old.rmdir()
    dist.barrier()


def restore(directory: Path, model: DDP, optimizer: torch.optim.Optimizer,
            hook: GTopkHookState) -> int:
    """Loads a committed step (this rank's own hook state, or rank 0's without residuals);
    returns the step."""
    saved = torch.load(directory / "model.pt")
    model.module.load_state_dict(saved["model"])
    optimizer.load_state_dict(saved["optimizer"])
    own = directory / f"hook-{dist.get_rank()}.pt"
    hook.load_state_dict(torch.load(own if own.exists() else directory / "hook-0.pt"),
                         keep_residuals=own.exists())
    return int(saved["step"])


def train(args: argparse.Namespace) -> None:
    rank, size = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = DDP(torch.nn.Sequential(torch.nn.Linear(FEATURES, 64), torch.nn.Tanh(),
                                    torch.nn.Linear(64, 1)), bucket_cap_mb=0.004)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
    hook = GTopkHookState(compression=getattr(Compression, args.compression)(args.density))
    step = 0
    commit = latest_commit(args.checkpoints)
    if commit is not None:
        step = restore(commit, model, optimizer, hook)
    started_at = step
    model.register_comm_hook(hook, gtopk_hook)
    if rank == 0:
        print(f"START size {size} from step {step}", flush=True)
    x, y = dataset()
    last_layer = model.module[-1].weight  # its gradient is the first one ready
    while step < args.steps:
        mine = torch.from_numpy(step_rows(step, args.batch, rank, size))
        dying = (args.die_at is not None and step >= args.die_at  # commit: the next one
                 and int(os.environ.get("LOCAL_RANK", 0)) == 0 and not args.marker.exists())
        handle = (last_layer.register_hook(lambda _: die(args.marker))
                  if dying and args.die_phase == "reduction" else None)
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x[mine]), y[mine])
        loss.backward()
        if handle is not None:
            handle.remove()
        time.sleep(args.compute_ms / 1e3)
        optimizer.step()
        if dying and args.die_phase == "step":
            die(args.marker)
        step += 1
        if rank == 0:
            print(f"step {step} size {size} loss {loss.item():.5f}", flush=True)
            if args.marker.exists() and step == started_at + 1:  # the first after a restart
                since_kill = time.time() - float(args.marker.read_text())
                print(f"RECOVERY size {size} seconds={since_kill:.2f}", flush=True)
        if step % args.commit_every == 0 or step == args.steps:
            save(args.checkpoints, step, model, optimizer, hook,
                 args.marker if dying and args.die_phase == "commit" else None)
    with torch.no_grad():
        final = torch.nn.functional.mse_loss(model(x), y).item()
    sums = [None] * size
    dist.all_gather_object(sums, checksum(model))
    assert len(set(sums)) == 1, f"replicas differ: {sums}"
    if rank == 0:
        print(f"RESULT elastic_ddp compression={args.compression} workers={size} "
              f"steps={args.steps} loss={final:.6f} checksum={sums[0]}", flush=True)


def main() -> None:
    args = parse_args()
    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    train(args)
    end_process_group()


if __name__ == "__main__":
    main()
