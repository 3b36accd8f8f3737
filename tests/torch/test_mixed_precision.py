"""Mixed precision with the torch DistributedOptimizer, every sparse scheme (one process,
Horovod of size 1), with the step's state on the host and in CPU tensors that refuse what CUDA
tensors refuse (tests/helpers/device_like.py: the path a GPU's state takes):

- without a loss scaler (bfloat16 autocast, the usual choice on recent GPUs), a step skipped for
  a NaN/Inf (nonfinite="propagate") is not applied: parameters and the wrapped optimizer's state
  stay bit for bit as they were, step() returns None, and the next finite step trains;
- with torch.amp's GradScaler and Horovod's recipe (synchronize, unscale_, skip_synchronize,
  step), overflowing steps are skipped by the scaler, which lowers its scale, and training goes
  on with finite parameters.
"""

from __future__ import annotations

import copy

import pytest
from helpers.device_like import optimizer_state_on  # noqa: F401 - a fixture

torch = pytest.importorskip("torch")
hvd = pytest.importorskip("horovod.torch")

import gtopk_hvd.torch as gtopk  # noqa: E402

SCHEMES = {
    "gtopk": lambda: gtopk.Compression.gtopk(0.05),
    "gtopk-momentum": lambda: gtopk.Compression.gtopk(0.05, momentum_correction=True),
    "topk": lambda: gtopk.Compression.topk(0.05),
    "gtopk-exact": lambda: gtopk.Compression.gtopk(0.05, exact=True),
    "micro": lambda: gtopk.Compression.micro(0.05),
    "exdyna": lambda: gtopk.Compression.exdyna(0.05, blocks=8),
    "sketch": lambda: gtopk.Compression.sketch(0.05, columns=64),
    "oktopk": lambda: gtopk.Compression.oktopk(0.05, reestimate_every=2),
}
OPTIMIZERS = {
    "adamw": lambda parameters: torch.optim.AdamW(parameters, lr=1e-2),
    "sgd-momentum": lambda parameters: torch.optim.SGD(parameters, lr=0.1, momentum=0.9),
}


def model_and_data(seed: int = 0) -> tuple[torch.nn.Module, torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(20, 30), torch.nn.ReLU(), torch.nn.Linear(30, 3))
    inputs = torch.randn(16, 20, generator=generator)
    labels = torch.randint(0, 3, (16,), generator=generator)
    return model, inputs, labels


def distributed(model: torch.nn.Module, scheme: str, optimizer: str) -> torch.optim.Optimizer:
    hvd.init()
    return gtopk.DistributedOptimizer(OPTIMIZERS[optimizer](model.parameters()),
                                      named_parameters=model.named_parameters(),
                                      compression=SCHEMES[scheme]())


def bf16_loss(model: torch.nn.Module, inputs: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    with torch.autocast("cpu", dtype=torch.bfloat16):
        return torch.nn.functional.cross_entropy(model(inputs).float(), labels)


@pytest.mark.parametrize("optimizer", sorted(OPTIMIZERS))
@pytest.mark.parametrize("scheme", sorted(SCHEMES))
@pytest.mark.usefixtures("optimizer_state_on")
def test_a_skipped_step_is_not_applied_without_a_scaler(scheme: str, optimizer: str) -> None:
    model, inputs, labels = model_and_data()
    sparse = distributed(model, scheme, optimizer)
    for _ in range(2):
        sparse.zero_grad()
        bf16_loss(model, inputs, labels).backward()
        sparse.step()
    before = copy.deepcopy(model.state_dict())
    optimizer_state = copy.deepcopy(sparse.state_dict()["state"])
    poisoned = inputs.clone()
    poisoned[3, 7] = float("inf")  # one input: the whole gradient is NaN
    sparse.zero_grad()
    bf16_loss(model, poisoned, labels).backward()
    assert sparse.step() is None
    assert sparse.last_stats.skipped and sparse.skipped_steps == 1
    for name, value in model.state_dict().items():
        assert torch.equal(value, before[name]), f"{name} moved on a skipped step"
    after = sparse.state_dict()["state"]
    for key, state in optimizer_state.items():
        for field, value in state.items():
            assert torch.equal(torch.as_tensor(after[key][field]), torch.as_tensor(value)), (
                f"the wrapped optimizer's {field} changed on a skipped step")
    sparse.zero_grad()
    bf16_loss(model, inputs, labels).backward()
    sparse.step()
    assert not sparse.last_stats.skipped
    moved = [name for name, value in model.state_dict().items()
             if not torch.equal(value, before[name])]
    assert moved, "the finite step after the skip did not train"
    assert all(torch.isfinite(p).all() for p in model.parameters())


@pytest.mark.parametrize("scheme", sorted(SCHEMES))
@pytest.mark.usefixtures("optimizer_state_on")
def test_grad_scaler_with_horovods_recipe_skips_overflows_and_trains(scheme: str) -> None:
    """float16 autocast, GradScaler starting at 2^24 (its first steps overflow), Horovod's AMP
    recipe: the scaler skips the overflowing steps and lowers its scale; the rest train."""
    model, inputs, labels = model_and_data(1)
    sparse = distributed(model, scheme, "sgd-momentum")
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 24, growth_interval=10 ** 9)
    first = copy.deepcopy(model.state_dict())
    losses, skipped = [], 0
    for _ in range(30):
        sparse.zero_grad()
        with torch.autocast("cpu", dtype=torch.float16):
            loss = torch.nn.functional.cross_entropy(model(inputs).float(), labels)
        scaler.scale(loss).backward()
        sparse.synchronize()
        scaler.unscale_(sparse)
        with sparse.skip_synchronize():
            scaler.step(sparse)
        scaler.update()
        skipped += int(sparse.last_stats.skipped)
        losses.append(loss.item())
    assert skipped >= 1 and sparse.skipped_steps == skipped
    assert scaler.get_scale() < 2.0 ** 24
    assert all(torch.isfinite(p).all() for p in model.parameters())
    assert any(not torch.equal(value, first[name]) for name, value in model.state_dict().items())
    assert min(losses[-5:]) < losses[0], losses
