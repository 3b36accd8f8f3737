"""Under torchrun (Gloo, any P): gtopk_hvd.torch.ddp's hook on a real DDP model.

The model has float32 and float64 parameters and a small bucket cap, so DDP makes several
buckets of both dtypes. Checks, on every rank:

  parity     density 1.0 (gTop-k and Top-k): the first start_iter iterations equal DDP's
             default all-reduce (bit for bit when P is a power of two, where x / P and
             x * (1 / P) agree), and every later one up to float rounding
  replay     density 0.01: every sparse step of every bucket equals an independent numpy
             replay built from every rank's gradient and residual (local top-k by
             tests/helpers/reference.py, the gTop-k schedule replayed, or Top-k's union summed
             in rank order): the update bit for bit, the residuals, the update's support
  replicas   after the steps every rank's parameters are bitwise identical
  restore    a state pickled (torch.save) or saved as tensors (state_dict, weights_only=True)
             mid-training, restored into a new model under a new DDP (whose first iteration
             has DDP's construction-time buckets), continues exactly as the uninterrupted run
  no_sync    gradient accumulation with DDP's no_sync(): the hook sees each bucket once an
             iteration, holding the gradient summed over the iteration's micro-batches (equal to
             a model without DDP that ran the same micro-batches), and counts iterations only
  transport  transport="torch" (the process-wide transport over the default group) trains
             bit for bit as the default (a TorchDistributedTransport over DDP's group), every
             bucket's step on the transport resolved; with a process group of other workers
             than the transport's, the state refuses it
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import math
import pickle

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from helpers.reference import gtopk_schedule_reference, topk_reference
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from gtopk_hvd.compression import Compression
from gtopk_hvd.torch.ddp import GTopkHookState, end_process_group, gtopk_hook
from gtopk_hvd.transports.torch_distributed import default_transport

BUCKET_CAP_MB = 0.002  # about 500 float32 values: 3 buckets (2 at construction, by dtype)


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(12, 48)
        self.b = nn.Linear(48, 32, dtype=torch.float64)
        self.c = nn.Linear(32, 24)
        self.d = nn.Linear(24, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.a(x))
        h = torch.tanh(self.b(h.double())).float()
        return self.d(torch.tanh(self.c(h)))


def make_model(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return Net()


def batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(1000 * step + dist.get_rank())
    return (torch.randn(16, 12, generator=generator),
            torch.randint(0, 5, (16,), generator=generator))


def train(model: nn.Module, optimizer: torch.optim.Optimizer, steps: range) -> None:
    for step in steps:
        optimizer.zero_grad()
        images, labels = batch(step)
        F.cross_entropy(model(images), labels).backward()
        optimizer.step()


def digest(model: nn.Module) -> str:
    sha = hashlib.sha256()
    for p in model.parameters():
        sha.update(p.detach().numpy().tobytes())
    return sha.hexdigest()


def gather(item: object) -> list:
    everyone: list = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, item)
    return everyone


def check_same_everywhere(model: nn.Module, what: str) -> None:
    digests = gather(digest(model))
    assert len(set(digests)) == 1, f"{what}: replicas differ: {digests}"


def ddp(model: nn.Module) -> DDP:
    return DDP(model, bucket_cap_mb=BUCKET_CAP_MB)


# -- parity at density 1.0 ----------------------------------------------------------------

def check_parity(reduction: str) -> None:
    size = dist.get_world_size()
    plain, hooked = ddp(make_model()), ddp(make_model())
    state = GTopkHookState(density=1.0, reduction=reduction)
    hooked.register_comm_hook(state, gtopk_hook)
    plain_opt = torch.optim.SGD(plain.parameters(), lr=0.1, momentum=0.9)
    hooked_opt = torch.optim.SGD(hooked.parameters(), lr=0.1, momentum=0.9)
    for step in range(6):
        train(plain, plain_opt, range(step, step + 1))
        train(hooked, hooked_opt, range(step, step + 1))
        for p, q in zip(plain.parameters(), hooked.parameters()):
            if step < state.start_iter and size & (size - 1) == 0:
                assert torch.equal(p, q), f"{reduction} step {step}: warm-up differs from DDP"
            torch.testing.assert_close(q, p, rtol=1e-5, atol=1e-6,
                                       msg=f"{reduction} step {step}: differs from DDP")
        if step < state.start_iter:
            assert not state.last_stats, "sparse steps during the warm-up"
    assert state.iter == 6
    stats = state.last_stats
    assert len(stats) >= 3, f"expected several buckets, got {len(stats)}"
    dtypes = {dtype for bucket in state.buckets.values() for _, dtype in bucket.layout}
    assert dtypes == {"float32", "float64"}, dtypes
    assert all(s.density == 1.0 and s.step == 5 for s in stats.values()), stats
    check_same_everywhere(hooked, f"{reduction} density 1")


# -- a replay of every sparse step ----------------------------------------------------------

def check_replay(reduction: str, steps: int = 4) -> None:
    rank, size = dist.get_rank(), dist.get_world_size()
    model = ddp(make_model(1))
    state = GTopkHookState(density=0.01, reduction=reduction)
    seen: dict[int, dict] = {}

    def recording_hook(hook_state, bucket):  # no annotations: DDP checks them as objects
        index = bucket.index()
        known = hook_state.buckets.get(index)
        residual = (np.array(known.step.residual) if known is not None
                    else np.zeros(bucket.buffer().numel(), np.float32))
        gradient = bucket.buffer().to(torch.float32).numpy().copy()
        dtype = bucket.buffer().dtype
        future = gtopk_hook(hook_state, bucket)

        def record(done: torch.futures.Future) -> torch.Tensor:
            # When the bucket's step has run: at the iteration's last bucket (the hook holds
            # the buckets to decide on non-finite gradients once for all of them).
            known = hook_state.buckets.get(index)
            if known is not None:
                seen[index] = {"gradient": gradient, "residual": residual, "dtype": str(dtype),
                               "new_residual": np.array(known.step.residual),
                               "update": done.value().to(torch.float64).numpy().copy()}
            return done.value()

        return future.then(record)

    model.register_comm_hook(state, recording_hook)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(steps):
        seen.clear()
        before = [p.detach().clone() for p in model.parameters()]
        train(model, optimizer, range(step, step + 1))
        if step < state.start_iter:
            assert not seen
            continue
        everyone = gather(seen)
        assert all(set(other) == set(seen) for other in everyone) and len(seen) >= 3
        total_k = 0
        for index in sorted(seen):
            parts = [other[index] for other in everyone]
            d = parts[0]["gradient"].size
            k = max(1, math.ceil(0.01 * d))
            total_k += k
            accs = [part["residual"] + part["gradient"] for part in parts]  # float32
            local = [topk_reference(acc, k) for acc in accs]
            sets = [(idx.astype(np.int32), acc[idx]) for idx, acc in zip(local, accs)]
            if reduction == "gtopk":
                expected, _, _ = gtopk_schedule_reference(sets, k, 8, lambda v: v)
                global_index, global_value = expected[0]
            else:
                totals: dict[int, np.float32] = {}
                for idx, value in sets:  # rank order
                    for i, v in zip(idx.tolist(), value):
                        totals[i] = totals[i] + v if i in totals else v
                global_index = np.array(sorted(totals), dtype=np.int32)
                global_value = np.array([totals[i] for i in global_index.tolist()], np.float32)
            update = np.zeros(d, np.float32)
            update[global_index] = global_value * np.float32(1.0 / size)
            where = f"{reduction} P={size} step {step} bucket {index} ({parts[0]['dtype']})"
            mine = parts[rank]  # its update, float32 or float64, as float64
            assert mine["update"].tobytes() == update.astype(np.float64).tobytes(), (
                f"{where}: update")
            residual = accs[rank].copy()
            survived = np.isin(local[rank], global_index)
            residual[local[rank][survived]] = 0.0
            assert mine["new_residual"].tobytes() == residual.tobytes(), f"{where}: residual"
            assert np.count_nonzero(update) <= (k if reduction == "gtopk" else size * k)
        changed = sum(int((p.detach() != b).sum()) for p, b in zip(model.parameters(), before))
        bound = total_k if reduction == "gtopk" else size * total_k
        assert 0 < changed <= bound, f"{reduction} step {step}: {changed} entries changed"
    check_same_everywhere(model, f"{reduction} density 0.01")


# -- checkpoint and restore into a new DDP model ------------------------------------------

def check_restore(route: str) -> None:
    if route == "pickle":  # momentum correction and a warm-up: velocity and step counts
        compression = Compression.gtopk(0.02, momentum_correction=True,
                                        warmup_densities=(0.25, 0.05), warmup_steps=3)
        make_optimizer = lambda params: torch.optim.SGD(params, lr=0.1)  # noqa: E731
    else:  # Top-k and an optimizer with state of its own
        compression = Compression.topk(0.02)
        make_optimizer = lambda params: torch.optim.SGD(params, lr=0.1, momentum=0.9)  # noqa
    first, more = 5, 4
    model = ddp(make_model(2))
    state = GTopkHookState(compression=compression)
    model.register_comm_hook(state, gtopk_hook)
    optimizer = make_optimizer(model.parameters())
    train(model, optimizer, range(first))
    assert state.buckets and state.book.remap.record() is not None
    snapshot = io.BytesIO()
    if route == "pickle":
        torch.save({"model": model.module.state_dict(), "optimizer": optimizer.state_dict(),
                    "hook": state}, snapshot)
    else:
        torch.save({"model": model.module.state_dict(), "optimizer": optimizer.state_dict(),
                    "hook": state.state_dict()}, snapshot)
    saved_layouts = [bucket.layout for bucket in state.buckets.values()]
    train(model, optimizer, range(first, first + more))
    expected = digest(model)

    snapshot.seek(0)
    checkpoint = torch.load(snapshot, weights_only=route != "pickle")
    fresh = make_model(99)  # other initial values: all must come from the checkpoint
    fresh.load_state_dict(checkpoint["model"])
    restored_model = ddp(fresh)
    if route == "pickle":
        restored = checkpoint["hook"]
        assert restored.process_group is None and restored.iter == first
    else:
        restored = GTopkHookState(compression=compression)
        restored.load_state_dict(checkpoint["hook"])
    construction = restored.book.remap.saved_record
    assert construction is not None
    assert [list(layout) for layout in construction["layouts"]] != [
        list(layout) for layout in saved_layouts], "the new DDP's first buckets were the same"
    restored_model.register_comm_hook(restored, gtopk_hook)
    restored_optimizer = make_optimizer(restored_model.parameters())
    restored_optimizer.load_state_dict(checkpoint["optimizer"])
    train(restored_model, restored_optimizer, range(first, first + more))
    assert digest(restored_model) == expected, f"{route}: the restored run differs"
    assert restored.iter == first + more
    check_same_everywhere(restored_model, f"restore {route}")
    pickle.loads(pickle.dumps(restored))  # a restored state saves again


# -- gradient accumulation with no_sync ------------------------------------------------------

def check_no_sync(micro: int = 3, steps: int = 5) -> None:
    model = ddp(make_model(4))
    plain = make_model(4)  # the same parameters without DDP: the micro-batches' summed gradient
    expected = dict(zip((id(p) for p in model.module.parameters()), plain.parameters()))
    state = GTopkHookState(density=0.01)
    calls: list[int] = []

    def checking_hook(hook_state, bucket):  # no annotations: DDP checks them as objects
        for parameter, gradient in zip(bucket.parameters(), bucket.gradients()):
            assert torch.equal(gradient, expected[id(parameter)].grad), (
                f"no_sync iteration {len(calls) - 1}: a bucket's gradient is not the "
                "micro-batches' sum")
        calls[-1] += 1
        return gtopk_hook(hook_state, bucket)

    model.register_comm_hook(state, checking_hook)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(steps):
        calls.append(0)
        optimizer.zero_grad()
        plain.load_state_dict(model.module.state_dict())
        plain.zero_grad()
        for m in range(micro):
            images, labels = batch(100 + micro * step + m)
            F.cross_entropy(plain(images), labels).backward()
            syncing = m == micro - 1
            with contextlib.nullcontext() if syncing else model.no_sync():
                F.cross_entropy(model(images), labels).backward()
        optimizer.step()
    assert state.iter == steps, f"no_sync: {state.iter} iterations counted, {steps} ran"
    assert len(state.buckets) >= 3 and all(
        count == len(state.buckets) for count in calls[state.start_iter:]), calls
    check_same_everywhere(model, "no_sync")


# -- transport= ---------------------------------------------------------------------------

def check_transport() -> None:
    digests = {}
    for transport in (None, "torch"):
        model = ddp(make_model(3))
        state = GTopkHookState(density=0.01, transport=transport)
        model.register_comm_hook(state, gtopk_hook)
        train(model, torch.optim.SGD(model.parameters(), lr=0.1), range(5))
        resolved = state.get_transport()
        assert (resolved is default_transport()) == (transport == "torch"), transport
        assert len(state.buckets) >= 3 and all(bucket.step.transport is resolved
                                               for bucket in state.buckets.values())
        digests[transport] = digest(model)
    assert digests[None] == digests["torch"], "transport='torch' trains otherwise"
    others = dist.new_group(ranks=list(range(dist.get_world_size() - 1)))  # all but the last
    state = GTopkHookState(others, density=0.01, transport="torch")
    try:
        state.get_transport()
    except RuntimeError as error:
        assert "process group's" in str(error), error
    else:
        raise AssertionError("a transport of other workers than the process group's was used")


def main() -> None:
    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    for reduction in ("gtopk", "allgather"):
        check_parity(reduction)
        check_replay(reduction)
    check_restore("pickle")
    check_restore("state_dict")
    check_no_sync()
    check_transport()
    dist.barrier()
    if dist.get_rank() == 0:
        print(f"ddp hook ok on {dist.get_world_size()} workers", flush=True)
    end_process_group()


if __name__ == "__main__":
    main()
