"""Under torchrun (Gloo): the DDP hook with non-finite gradients (nonfinite="propagate").

  injected  an Inf put into one gradient of rank 1 only, in the bucket DDP reduces last: every
            bucket of every rank comes back all NaN, every bucket's residual is bit-equal to
            its value before the iteration, state.iter does not advance; the step is skipped
            and training goes on with replicas identical.
  amp       torch.amp GradScaler under float16 autocast on scikit-learn's digits, starting at
            scale 2^24 (the first iterations overflow) against a start that never overflows:
            the scaler skips the overflowing iterations on every rank, the scale drops, the
            final accuracy is within 1 point, the replicas are bitwise identical.
"""

from __future__ import annotations

import hashlib

import torch
import torch.distributed as dist
from harness import run_on_all_ranks
from helpers import margins
from helpers.digits import digits_split, model_seed, worker_batches
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from gtopk_hvd.compression import Compression
from gtopk_hvd.torch.ddp import GTopkHookState, end_process_group, gtopk_hook

EPOCHS = 12
BATCH = 32


def data() -> tuple[torch.Tensor, ...]:
    return tuple(torch.from_numpy(array) for array in digits_split())


def make_ddp(compression: object) -> tuple[DDP, GTopkHookState]:
    torch.manual_seed(model_seed())
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 64), nn.ReLU(),
                          nn.Linear(64, 10))
    ddp = DDP(model, bucket_cap_mb=0.02)  # about 5k values a bucket: several buckets
    state = GTopkHookState(compression=compression)
    ddp.register_comm_hook(state, gtopk_hook)
    return ddp, state


def digest(model: nn.Module) -> str:
    return hashlib.sha256(b"".join(p.detach().numpy().tobytes()
                                   for p in model.parameters())).hexdigest()


def check_same_everywhere(item: object, what: str) -> None:
    everyone = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, item)
    assert len(set(everyone)) == 1, f"{what} differ between ranks: {everyone}"


def injected() -> None:
    x_train, y_train, _, _ = data()
    ddp, state = make_ddp(Compression.gtopk(0.05))
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.05)
    first = ddp.module[0].weight  # its gradient is ready last: DDP's last bucket
    poison = {"on": False}
    first.register_hook(lambda grad: grad.index_fill(1, torch.tensor([3]), float("inf"))
                        if poison["on"] else grad)
    bad_iteration = 6
    for iteration in range(10):
        index = torch.arange(BATCH) + BATCH * (2 * iteration + dist.get_rank())
        poison["on"] = iteration == bad_iteration and dist.get_rank() == 1
        residuals = {i: b.step.residual.copy() for i, b in state.buckets.items()}
        iter_before = state.iter
        optimizer.zero_grad()
        nn.functional.cross_entropy(ddp(x_train[index]), y_train[index]).backward()
        grads = [p.grad for p in ddp.parameters()]
        if iteration == bad_iteration:
            assert len(state.buckets) >= 2, f"only {len(state.buckets)} bucket(s)"
            assert all(torch.isnan(g).all() for g in grads), "a gradient is not all NaN"
            for i, bucket in state.buckets.items():
                assert bucket.step.residual.tobytes() == residuals[i].tobytes(), f"bucket {i}"
                assert bucket.step.last_stats.skipped
            assert state.iter == iter_before, "a skipped iteration was counted"
            continue  # as a loss scaler would: no optimizer step
        assert all(torch.isfinite(g).all() for g in grads), iteration
        assert state.iter == iter_before + 1
        optimizer.step()
    check_same_everywhere(digest(ddp.module), "replicas")


def amp_run(init_scale: float) -> dict:
    x_train, y_train, x_test, y_test = data()
    ddp, state = make_ddp(Compression.topk(0.05))
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9)
    scaler = torch.amp.GradScaler("cpu", init_scale=init_scale, growth_interval=10**9)
    skipped, first_scale = 0, scaler.get_scale()
    for index in worker_batches(len(x_train), EPOCHS, dist.get_rank(), dist.get_world_size(),
                                BATCH):
        optimizer.zero_grad()
        with torch.autocast("cpu", dtype=torch.float16):
            loss = nn.functional.cross_entropy(ddp(x_train[index]), y_train[index])
        scaler.scale(loss).backward()
        scale = scaler.get_scale()
        scaler.step(optimizer)
        scaler.update()
        skipped += scaler.get_scale() < scale
    with torch.no_grad():
        accuracy = float((ddp.module(x_test).argmax(1) == y_test).float().mean())
    check_same_everywhere((digest(ddp.module), skipped), "replicas or skipped counts")
    return {"accuracy": accuracy, "skipped": skipped, "scale": (first_scale,
                                                                scaler.get_scale())}


def amp() -> None:
    overflow, clean = amp_run(2.0**24), amp_run(2.0**8)
    if dist.get_rank() == 0:
        print(f"RESULT ddp amp overflow={overflow} no_overflow={clean}", flush=True)
    assert overflow["skipped"] >= 3 and overflow["scale"][1] < overflow["scale"][0], overflow
    assert clean["skipped"] == 0, clean
    gap = overflow["accuracy"] - clean["accuracy"]
    assert gap >= margins.floor("ddp_amp", "amp_gap"), (overflow, clean)
    assert clean["accuracy"] >= margins.floor("ddp_amp", "amp_clean"), clean


def main() -> None:
    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    injected()
    amp()
    end_process_group()


if __name__ == "__main__":
    run_on_all_ranks(main)
