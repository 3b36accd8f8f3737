"""Under mpirun or horovodrun --gloo: gtopk_hvd.torch.DistributedOptimizer with real Horovod. Any
failure on any rank ends the job (harness.run_on_all_ranks)."""

from __future__ import annotations

import copy
import math
import sys

import horovod.torch as hvd
import torch
from harness import run_on_all_ranks
from torch_replicas import (
    assert_same_on_all_ranks,
    average_gradients_with_horovod,
    parameter_bytes,
)

import gtopk_hvd.torch as gtopk
from gtopk_hvd.transports import launched_by_mpi, resolve_transport

STEPS = 200


def make_model(seed: int = 0, extra_layer: bool = False) -> torch.nn.Module:
    torch.manual_seed(seed)
    layers = [torch.nn.Linear(20, 64), torch.nn.Tanh(), torch.nn.Linear(64, 10)]
    if extra_layer:
        layers.append(torch.nn.Linear(10, 10))
    return torch.nn.Sequential(*layers)


def batch(step: int, rank: int, size: int = 32) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(10_000 * rank + step)
    x = torch.randn(size, 20, generator=generator)
    return x, (x[:, :10].sum(1) > 0).long() + 2 * (x[:, 10:].sum(1) > 0).long()


def train(model: torch.nn.Module, optimizer: torch.optim.Optimizer, steps: range,
          passes: int = 1) -> None:
    for step in steps:
        x, y = batch(step, hvd.rank())
        optimizer.zero_grad()
        for part_x, part_y in zip(x.chunk(passes), y.chunk(passes)):
            (torch.nn.functional.cross_entropy(model(part_x), part_y) / passes).backward()
        optimizer.step()


def check_replicas_stay_identical() -> None:
    for name, make_optimizer in (
            ("sgd+momentum", lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9)),
            ("adam", lambda p: torch.optim.Adam(p, lr=1e-3))):
        model = make_model()
        initial = copy.deepcopy(model)
        optimizer = gtopk.DistributedOptimizer(
            make_optimizer(model.parameters()), named_parameters=model.named_parameters(),
            compression=gtopk.Compression.gtopk(density=0.01))
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        hvd.broadcast_optimizer_state(optimizer, root_rank=0)
        train(model, optimizer, range(STEPS))
        assert_same_on_all_ranks(model, f"gtopk {name}")
        assert parameter_bytes(model) != parameter_bytes(initial), "training changed nothing"
        d = sum(p.numel() for p in model.parameters())
        stats = optimizer.last_stats
        # broadcast_optimizer_state creates the state with the wrapped optimizer's own step:
        # no sparse step, so the last of STEPS sparse steps has index STEPS - 1.
        assert stats.k == math.ceil(0.01 * d) and stats.step == STEPS - 1, stats
        if hvd.size() in (2, 4, 8):  # log2(P) rounds of k entries, 8 bytes each
            assert stats.bytes_sent == int(math.log2(hvd.size())) * 8 * stats.k, stats


def check_density_one_equals_dense_average() -> None:
    for scheme in ("gtopk", "topk"):
        ours, reference = make_model(), make_model()
        optimizer = gtopk.DistributedOptimizer(
            torch.optim.SGD(ours.parameters(), lr=0.1), named_parameters=ours.named_parameters(),
            compression=getattr(gtopk.Compression, scheme)(density=1.0))
        plain = torch.optim.SGD(reference.parameters(), lr=0.1)
        for step in range(20):
            train(ours, optimizer, range(step, step + 1))
            x, y = batch(step, hvd.rank())
            plain.zero_grad()
            torch.nn.functional.cross_entropy(reference(x), y).backward()
            average_gradients_with_horovod(reference.parameters())
            plain.step()
        for a, b in zip(ours.parameters(), reference.parameters()):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def check_checkpoint_resume_is_exact() -> None:
    compression = gtopk.Compression.gtopk(density=0.02, momentum_correction=True,
                                          warmup_densities=(0.25, 0.1), warmup_steps=5)

    def fresh() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
        model = make_model()
        return model, gtopk.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05),
                                                 named_parameters=model.named_parameters(),
                                                 compression=compression)

    model, optimizer = fresh()
    train(model, optimizer, range(0, 8))
    saved_model = copy.deepcopy(model.state_dict())
    saved_optimizer = copy.deepcopy(optimizer.state_dict())  # this worker's residual included
    train(model, optimizer, range(8, 20))

    resumed_model, resumed_optimizer = fresh()
    resumed_model.load_state_dict(saved_model)
    resumed_optimizer.load_state_dict(saved_optimizer)
    train(resumed_model, resumed_optimizer, range(8, 20))
    assert parameter_bytes(resumed_model) == parameter_bytes(model), "resume differs"
    assert resumed_optimizer.last_stats.density == 0.02


def check_backward_passes_per_step() -> None:
    results = []
    for passes in (1, 2):
        model = make_model()
        optimizer = gtopk.DistributedOptimizer(
            torch.optim.SGD(model.parameters(), lr=0.1), named_parameters=model.named_parameters(),
            compression=gtopk.Compression.gtopk(density=0.05), backward_passes_per_step=passes)
        train(model, optimizer, range(10), passes=passes)
        results.append(model)
    for a, b in zip(results[0].parameters(), results[1].parameters()):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


def check_disagreeing_ranks_fail_everywhere() -> None:
    model = make_model(extra_layer=hvd.rank() == hvd.size() - 1)
    optimizer = gtopk.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1), named_parameters=model.named_parameters(),
        compression=gtopk.Compression.gtopk(density=0.1))
    if hvd.size() == 1:
        return
    x, _ = batch(0, hvd.rank())
    model(x).sum().backward()
    try:
        optimizer.step()
    except ValueError as error:
        assert "disagree on parameter names" in str(error), error
    else:
        raise AssertionError("ranks with different models were not detected")


def check_nan_on_one_rank_raises_on_all() -> None:
    """nonfinite="raise": every worker raises at the step, no parameter changes."""
    model = make_model()
    optimizer = gtopk.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1), named_parameters=model.named_parameters(),
        compression=gtopk.Compression.gtopk(density=0.01, nonfinite="raise"))
    train(model, optimizer, range(3))
    x, y = batch(3, hvd.rank())
    optimizer.zero_grad()
    torch.nn.functional.cross_entropy(model(x), y).backward()
    if hvd.rank() == hvd.size() - 1:
        next(model.parameters()).grad[0, 0] = float("nan")
    before = parameter_bytes(model)
    try:
        optimizer.step()
    except FloatingPointError as error:
        assert "non-finite" in str(error) and "step 3" in str(error), error
    else:
        raise AssertionError("a NaN gradient on one worker did not raise on every worker")
    assert parameter_bytes(model) == before, "a step with a NaN gradient changed parameters"
    assert_same_on_all_ranks(model, "after the NaN step")


def check_nan_on_one_rank_is_skipped_on_all() -> None:
    """nonfinite="propagate" (the default): every worker's update is all NaN, the residual and
    step count stay, and the next step goes on as if the bad one never came."""
    model = make_model()
    optimizer = gtopk.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1), named_parameters=model.named_parameters(),
        compression=gtopk.Compression.gtopk(density=0.01))
    train(model, optimizer, range(3))
    residual = optimizer._sparse.residual.copy()
    x, y = batch(3, hvd.rank())
    optimizer.zero_grad()
    torch.nn.functional.cross_entropy(model(x), y).backward()
    if hvd.rank() == hvd.size() - 1:
        next(model.parameters()).grad[0, 0] = float("inf")
    optimizer.synchronize()
    assert all(torch.isnan(p.grad).all() for p in model.parameters()), "update not all NaN"
    assert optimizer.last_stats.skipped and optimizer._sparse.step_count == 3
    assert optimizer._sparse.residual.tobytes() == residual.tobytes(), "residual changed"
    train(model, optimizer, range(3, 6))  # zero_grad: the NaN update is not accumulated on
    assert all(torch.isfinite(p).all() for p in model.parameters())
    assert optimizer._sparse.step_count == 6
    assert_same_on_all_ranks(model, "after the skipped step")


def check_bad_arguments() -> None:
    for bad in (0.0, 1.5, -0.1, "0.1"):
        try:
            gtopk.Compression.gtopk(density=bad)
        except ValueError as error:
            assert "density" in str(error)
        else:
            raise AssertionError(f"density {bad!r} accepted")
    model = make_model()
    try:
        gtopk.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   compression="gtopk")
    except ValueError as error:
        assert "compression must be one of" in str(error)
    else:
        raise AssertionError("a string compression was accepted")


def main() -> None:
    hvd.init()
    torch.set_num_threads(1)
    check_bad_arguments()
    check_replicas_stay_identical()
    check_density_one_equals_dense_average()
    check_checkpoint_resume_is_exact()
    check_backward_passes_per_step()
    check_nan_on_one_rank_raises_on_all()
    check_nan_on_one_rank_is_skipped_on_all()
    check_disagreeing_ranks_fail_everywhere()
    if not launched_by_mpi():  # horovodrun --gloo: nothing loaded MPI
        assert "mpi4py" not in sys.modules, "mpi4py was imported without an MPI launcher"
    if hvd.rank() == 0:
        transport = type(resolve_transport(None, hvd)).__name__  # what the optimizers used
        print(f"torch optimizer ok on {hvd.size()} workers over {transport}", flush=True)


if __name__ == "__main__":
    run_on_all_ranks(main)
