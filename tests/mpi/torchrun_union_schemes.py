"""Under torchrun (Gloo): MiCRO, ExDyna, sketched SGD, exact gTop-k and Ok-Topk through the DDP
hook (gtopk_hvd.torch.ddp) on the "torch" transport. For each: a small model trains (the loss
falls), the replicas stay bitwise identical, and a hook state saved mid-training (its
state_dict, with the schemes' thresholds and boundaries) and restored into a fresh model and
hook continues bit for bit as the uninterrupted run."""

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
    "micro": Compression.micro(0.05),
    "exdyna": Compression.exdyna(0.05, blocks=32),
    "sketch": Compression.sketch(0.05, columns=400),
    "gtopk-exact": Compression.gtopk(0.05, exact=True),
    "oktopk": Compression.oktopk(0.05, reestimate_every=2),
}
STEPS, SAVE_AT = 12, 6


def make(config: object) -> tuple[DDP, torch.optim.Optimizer, GTopkHookState]:
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(16, 64), nn.Tanh(), nn.Linear(64, 4)),
                bucket_cap_mb=0.004)
    state = GTopkHookState(compression=config, transport="torch")
    model.register_comm_hook(state, gtopk_hook)
    return model, torch.optim.SGD(model.parameters(), lr=0.1), state


def batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(1000 * dist.get_rank() + step)
    x = torch.randn(32, 16, generator=generator)
    return x, (x[:, :4] * 2.0).sin()


def train(model: DDP, optimizer: torch.optim.Optimizer, steps: range) -> list[float]:
    losses = []
    for step in steps:
        x, y = batch(step)
        optimizer.zero_grad()
        loss = F.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


def digest(model: DDP) -> str:
    return hashlib.sha256(b"".join(p.detach().numpy().tobytes()
                                   for p in model.parameters())).hexdigest()


def check(name: str, config: object) -> None:
    model, optimizer, state = make(config)
    losses = train(model, optimizer, range(STEPS))
    assert losses[-1] < losses[0], (name, losses)
    everyone = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, digest(model))
    assert len(set(everyone)) == 1, f"{name}: replicas differ"

    first, first_optimizer, first_state = make(config)
    train(first, first_optimizer, range(SAVE_AT))
    saved = (first.module.state_dict(), first_optimizer.state_dict(), first_state.state_dict())
    resumed, resumed_optimizer, resumed_state = make(config)
    resumed.module.load_state_dict(saved[0])
    resumed_optimizer.load_state_dict(saved[1])
    resumed_state.load_state_dict(saved[2])
    train(resumed, resumed_optimizer, range(SAVE_AT, STEPS))
    assert digest(resumed) == digest(model), f"{name}: the resumed run differs"


def main() -> None:
    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    for name, config in SCHEMES.items():
        check(name, config)
    dist.barrier()
    if dist.get_rank() == 0:
        print(f"union schemes through the ddp hook ok on {dist.get_world_size()} workers",
              flush=True)
    end_process_group()


if __name__ == "__main__":
    main()
