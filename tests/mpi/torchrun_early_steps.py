"""Under torchrun (Gloo, CPU): the DDP hook's early steps (`gtopk_hvd.torch.early_steps`) against
every bucket held to the last, per scheme.

A DDP model of LAYERS Linear layers in several buckets trains ITERATIONS iterations twice from
the same weights on the same batches: overlap=True (each bucket that can starts its tentative
step as it arrives, on the hook's thread) and overlap=False (every bucket held to the
iteration's last). Rank 1's gradient gets a NaN at NAN_EARLY (in the first bucket to arrive,
an early one) and at NAN_LAST (in the last bucket): every worker must skip those iterations
alike, in both runs. Printed per scheme on rank 0:

  EARLY scheme=S started=N buckets=B same=True|False skipped=[...] held_skipped=[...]
        replicas=identical|differ

started: the steps that started early (0 where the scheme cannot: Ok-Topk, momentum
correction); skipped: the iterations skipped, or raised:N where backward raised
(nonfinite="raise" with the NaN: every worker at NAN_EARLY, the thread's later steps not run);
buckets: DDP's buckets (the NaNs' parameters are in the first and the last); same: the
weights, every bucket's residual (and velocity), step count and scheme state bitwise equal in
the two runs, and the same iterations skipped.
"""

from __future__ import annotations

import hashlib

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from gtopk_hvd.compression import Compression
from gtopk_hvd.torch.ddp import GTopkHookState, end_process_group, gtopk_hook

SCHEMES = {
    "gtopk": Compression.gtopk(0.05),
    "topk": Compression.topk(0.05),
    "randomk": Compression.sparse(0.05, sparsifier="randomk"),
    "gtopk-exact": Compression.gtopk(0.05, exact=True),
    "micro": Compression.micro(0.05),
    "exdyna": Compression.exdyna(0.05, blocks=32),
    "sketch": Compression.sketch(0.05, columns=400),
    "oktopk": Compression.oktopk(0.05, reestimate_every=2),
    "topk-momentum": Compression.topk(0.05, momentum_correction=True),
    "gtopk-raise": Compression.gtopk(0.05, nonfinite="raise"),
}
RAISE_NAN = "gtopk-raise-nan"  # nonfinite="raise" with the NaN: every worker raises at NAN_EARLY
LAYERS, WIDTH, ITERATIONS = 4, 48, 10
NAN_EARLY, NAN_LAST = 4, 7


def make(config: object, overlap: bool) -> tuple[DDP, torch.optim.Optimizer, GTopkHookState]:
    torch.manual_seed(0)
    model = DDP(nn.Sequential(*[nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.Tanh())
                                for _ in range(LAYERS)]), bucket_cap_mb=0.01)
    state = GTopkHookState(compression=config, overlap=overlap)
    model.register_comm_hook(state, gtopk_hook)
    return model, torch.optim.SGD(model.parameters(), lr=0.1), state


def poison(model: DDP, when: dict) -> None:
    """A NaN into rank 1's gradient of the last layer's bias (the first bucket to arrive) at
    NAN_EARLY and of the first layer's weight (the last bucket) at NAN_LAST."""
    first, last = model.module[0][0].weight, model.module[-1][0].bias

    def hook(iteration: int):
        def put_nan(grad: torch.Tensor) -> torch.Tensor:
            if dist.get_rank() == 1 and when["iteration"] == iteration:
                grad = grad.clone()
                grad.view(-1)[0] = float("nan")
            return grad
        return put_nan

    last.register_hook(hook(NAN_EARLY))
    first.register_hook(hook(NAN_LAST))


def train(config: object, overlap: bool, nan: bool) -> tuple[bytes, list[int], int, str]:
    model, optimizer, state = make(config, overlap)
    when = {"iteration": -1}
    if nan:
        poison(model, when)
    skipped = []
    for iteration in range(ITERATIONS):
        when["iteration"] = iteration
        generator = torch.Generator().manual_seed(100 * dist.get_rank() + iteration)
        x = torch.randn(16, WIDTH, generator=generator)
        optimizer.zero_grad()
        try:
            F.mse_loss(model(x), x.sin()).backward()
        except (FloatingPointError, RuntimeError) as error:  # DDP may wrap the hook's error
            if "non-finite" not in str(error):
                raise
            skipped.append(f"raised:{iteration}")
            break
        if state.last_iteration_skipped:
            skipped.append(iteration)
        else:
            optimizer.step()
    weights = [p.detach().numpy().tobytes() for p in model.parameters()]
    counts = state.book.early.started, len(state.buckets)
    return (flat(weights) + flat(state.state_dict()), skipped, counts,
            hashlib.sha256(b"".join(weights)).hexdigest())


def flat(value: object) -> bytes:
    """Every number in `value` (dicts, lists, tensors, arrays), as bytes in a fixed order."""
    if isinstance(value, dict):
        return b"".join(repr(key).encode() + flat(value[key]) for key in sorted(value, key=str))
    if isinstance(value, (list, tuple)):
        return b"".join(flat(item) for item in value)
    if isinstance(value, torch.Tensor):
        return value.detach().numpy().tobytes()
    if hasattr(value, "tobytes"):
        return value.tobytes()
    return repr(value).encode()


def main() -> None:
    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    for name, config in [*SCHEMES.items(), (RAISE_NAN, SCHEMES["gtopk-raise"])]:
        nan = config.nonfinite == "propagate" or name == RAISE_NAN
        held = train(config, overlap=False, nan=nan)
        early = train(config, overlap=True, nan=nan)
        everyone: list = [None] * dist.get_world_size()
        dist.all_gather_object(everyone, (early[3], held[:2] == early[:2]))
        same = all(equal for _, equal in everyone)
        if dist.get_rank() == 0:
            print(f"EARLY scheme={name} started={early[2][0]} buckets={early[2][1]} same={same} "
                  f"skipped={early[1]} held_skipped={held[1]} "
                  f"replicas={'identical' if len({w for w, _ in everyone}) == 1 else 'differ'}",
                  flush=True)
    if dist.get_rank() == 0:
        print(f"early steps ok on {dist.get_world_size()} workers", flush=True)
    end_process_group()


if __name__ == "__main__":
    main()
