"""Under mpirun: p.grad as views of the fused buffer changes no result.

Each scenario trains the same model twice, for the same data, on every rank: once with
gtopk_hvd.torch.DistributedOptimizer (views, fused clearing pass, one-pass write-back) and once
with a reference made of the framework-neutral core and plain copies: gradients fused with
torch.cat, `sparse_step`, the update built with np.zeros and a scatter, and split back into
p.grad, then the plain optimizer. Parameters must be bitwise equal after every scenario, and the
same on every rank. Scenarios: what users do between steps (zero_grad variants, a replaced
gradient, no zero_grad, clipping between synchronize() and step(), several backward passes),
mixed dtypes, a parameter without a gradient, predivide with momentum correction.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import horovod.torch as hvd
import numpy as np
import torch
from harness import run_on_all_ranks
from torch_replicas import assert_same_on_all_ranks, parameter_bytes

import gtopk_hvd.torch as gtopk
from gtopk_hvd.core import SparseStep
from gtopk_hvd.transports.mpi import default_transport

STEPS = 12


class Net(torch.nn.Module):
    def __init__(self, mixed: bool) -> None:
        super().__init__()
        torch.manual_seed(3)
        self.first = torch.nn.Linear(12, 32)
        self.second = torch.nn.Linear(32, 6)
        self.unused = torch.nn.Linear(4, 4)  # never gets a gradient
        if mixed:
            self.second.double()
            self.scale = torch.nn.Parameter(torch.ones(32, dtype=torch.bfloat16))
        else:
            self.scale = torch.nn.Parameter(torch.ones(32))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = torch.tanh(self.first(x)) * self.scale.float()
        return self.second(hidden.to(self.second.weight.dtype)).float()


def batch(step: int, part: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(1000 * hvd.rank() + 10 * step + part)
    x = torch.randn(16, 12, generator=generator)
    return x, (x[:, :6].sum(1) > 0).long() + 2 * (x[:, 6:].sum(1) > 0).long()


def backward(model: torch.nn.Module, step: int, passes: int) -> None:
    for part in range(passes):
        x, y = batch(step, part)
        (torch.nn.functional.cross_entropy(model(x), y) / passes).backward()


class Reference:
    """The sparse step through copies, on the same core (the pre-view adapter's semantics)."""

    def __init__(self, model: torch.nn.Module, compression: object, predivide: float) -> None:
        self.parameters = [p for p in model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        self.state = SparseStep(compression, [p.numel() for p in self.parameters],
                                 default_transport(), predivide=predivide)

    def zero_grad(self) -> None:
        self.optimizer.zero_grad()

    def synchronize(self) -> None:
        flat = torch.cat([torch.zeros(p.numel()) if p.grad is None
                          else p.grad.detach().reshape(-1).float() for p in self.parameters])
        indices, values = self.state.update(flat.numpy())
        update = np.zeros(self.state.d, dtype=np.float32)
        update[indices] = values
        for p, begin, end in zip(self.parameters, self.state.offsets[:-1],
                                 self.state.offsets[1:]):
            p.grad = torch.from_numpy(update[begin:end]).view(p.shape).to(p.dtype).clone()

    def step(self) -> None:
        self.optimizer.step()


def clip(model: torch.nn.Module) -> None:
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=0.05)


Between = Callable[[torch.nn.Module, object, int], None]


def zero_with_optimizer(model: torch.nn.Module, optimizer: object, step: int) -> None:
    optimizer.zero_grad()


def zero_with_model(model: torch.nn.Module, optimizer: object, step: int) -> None:
    model.zero_grad()  # sets None behind the optimizer's back: the fallback copy, then views


def zero_keeping_tensors(model: torch.nn.Module, optimizer: object, step: int) -> None:
    if isinstance(optimizer, Reference):
        optimizer.optimizer.zero_grad(set_to_none=False)
    else:
        optimizer.zero_grad(set_to_none=False)


def zero_every_other_step(model: torch.nn.Module, optimizer: object, step: int) -> None:
    if step % 2 == 0:  # odd steps accumulate onto the last update, as plain torch does
        optimizer.zero_grad()


def run(compression: object, between: Between, *, mixed: bool = False, passes: int = 1,
        replace_grad: bool = False, clip_between: bool = False,
        predivide: float = 1.0) -> tuple[bytes, torch.nn.Module]:
    results = []
    for ours in (True, False):
        model = Net(mixed)
        if ours:
            optimizer = gtopk.DistributedOptimizer(
                torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                named_parameters=model.named_parameters(), compression=compression,
                backward_passes_per_step=passes, gradient_predivide_factor=predivide)
        else:
            optimizer = Reference(model, compression, predivide)
        for step in range(STEPS):
            between(model, optimizer, step)
            backward(model, step, passes)
            if replace_grad and step % 3 == 1:
                model.first.weight.grad = model.first.weight.grad * 1.0  # a new tensor
            optimizer.synchronize()
            if clip_between:
                clip(model)
            if ours:
                with optimizer.skip_synchronize():
                    optimizer.step()
            else:
                optimizer.step()
        results.append((parameter_bytes(model), model))
    (ours_bytes, ours_model), (reference_bytes, _) = results
    assert ours_bytes == reference_bytes, "the view path differs from the copy reference"
    return ours_bytes, ours_model


def check_grads_are_views() -> None:
    model = Net(mixed=True)
    optimizer = gtopk.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1), named_parameters=model.named_parameters(),
        compression=gtopk.Compression.gtopk(density=0.1))
    for step in range(3):
        optimizer.zero_grad()
        backward(model, step, 1)
        optimizer.step()
    buffers = optimizer._fused.buffers
    ranges = [(b.data_ptr(), b.data_ptr() + 4 * b.numel()) for b in buffers]

    def in_a_buffer(tensor: torch.Tensor) -> bool:
        return any(low <= tensor.data_ptr() < high for low, high in ranges)

    optimizer.zero_grad()
    assert model.first.weight.grad is not None and in_a_buffer(model.first.weight.grad)
    assert float(model.first.weight.grad.abs().sum()) == 0.0, "zero_grad left values"
    assert model.second.weight.grad is None  # float64: its own gradient, set to None as torch
    backward(model, 3, 1)
    assert in_a_buffer(model.first.weight.grad), "backward replaced the view"
    assert not in_a_buffer(model.second.weight.grad)
    optimizer.step()
    assert in_a_buffer(model.first.weight.grad) and in_a_buffer(model.unused.weight.grad)


def main() -> None:
    hvd.init()
    torch.set_num_threads(1)
    check_grads_are_views()
    gtopk_c = gtopk.Compression.gtopk(density=0.05)
    scenarios = {
        "optimizer.zero_grad()": dict(between=zero_with_optimizer),
        "model.zero_grad()": dict(between=zero_with_model),
        "zero_grad(set_to_none=False)": dict(between=zero_keeping_tensors),
        "no zero_grad on odd steps": dict(between=zero_every_other_step),
        "gradient replaced by the user": dict(between=zero_with_optimizer, replace_grad=True),
        "mixed dtypes (float64, bfloat16)": dict(between=zero_with_optimizer, mixed=True),
        "2 backward passes per step": dict(between=zero_with_optimizer, passes=2),
        "clipping between synchronize and step": dict(between=zero_with_optimizer,
                                                      clip_between=True),
    }
    for name, options in scenarios.items():
        _, model = run(gtopk_c, **options)
        assert_same_on_all_ranks(model, name)
    randomk = functools.partial(gtopk.Compression.sparse, sparsifier="randomk")
    for scheme, make in (("gtopk", gtopk.Compression.gtopk), ("topk", gtopk.Compression.topk),
                         ("randomk", randomk)):
        compression = make(
            density=0.05, momentum_correction=True, warmup_densities=(0.3,), warmup_steps=3)
        _, model = run(compression, zero_with_optimizer, predivide=2.0)
        assert_same_on_all_ranks(model, f"{scheme} with momentum correction and predivide")
    bucket = gtopk.Compression.gtopk(density=0.05, granularity="bucket")
    _, model = run(bucket, zero_with_optimizer, mixed=True)
    assert_same_on_all_ranks(model, "bucket selection")
    if hvd.rank() == 0:
        print(f"torch views ok on {hvd.size()} workers: {len(scenarios) + 4} scenarios",
              flush=True)


if __name__ == "__main__":
    run_on_all_ranks(main)
