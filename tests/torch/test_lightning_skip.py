"""GTopkHookCallback under bf16 or float32 (no GradScaler): an iteration the hook skipped for a
NaN is not applied by the optimizer's step (no weight, moment or step count changes), an
iteration it did not skip is; with a GradScaler the callback leaves the step to the scaler.
The hook runs for real on a one-worker Gloo group; the precision plugin is a real Trainer's."""

from __future__ import annotations

import pytest
import torch
from test_ddp import Bucket, run_hook
from test_ddp_hook_costs import one_worker  # noqa: F401 (fixture)

from gtopk_hvd.torch.ddp import GTopkHookState

pytest.importorskip("lightning")
from lightning.pytorch import Trainer  # noqa: E402

from gtopk_hvd.torch.lightning import GTopkHookCallback  # noqa: E402


def iteration(state: GTopkHookState, model: torch.nn.Linear, step: int, bad: bool) -> None:
    """One hook iteration over the model's gradient (one bucket), written back as DDP does."""
    generator = torch.Generator().manual_seed(step)
    gradient = torch.randn(sum(p.numel() for p in model.parameters()), generator=generator)
    if bad:
        gradient[3] = float("nan")
    parameters = list(model.parameters())
    (reduced,) = run_hook(state, [Bucket(0, parameters, gradient, last=True)])
    offset = 0
    for p in parameters:
        p.grad = reduced[offset:offset + p.numel()].view_as(p).clone()
        offset += p.numel()


@pytest.mark.usefixtures("one_worker")
@pytest.mark.parametrize("precision", ["bf16-mixed", "32-true"])
def test_a_skipped_iteration_is_not_applied_without_a_scaler(precision: str) -> None:
    trainer = Trainer(accelerator="cpu", devices=1, precision=precision, logger=False,
                      enable_checkpointing=False, enable_progress_bar=False)
    assert getattr(trainer.precision_plugin, "scaler", None) is None
    torch.manual_seed(0)
    model = torch.nn.Linear(20, 10)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01, weight_decay=0.1)
    state = GTopkHookState(density=0.2, start_iter=2)
    callback = GTopkHookCallback(state)
    for step in range(6):
        before = [p.detach().clone() for p in model.parameters()]
        steps_before = [optimizer.state[p].get("step", 0) for p in model.parameters()]
        iteration(state, model, step, bad=step == 4)
        callback.on_before_optimizer_step(trainer, None, optimizer)
        optimizer.step()
        after = list(model.parameters())
        assert state.last_iteration_skipped == (step == 4)
        if step == 4:
            assert all(torch.equal(a, b) for a, b in zip(before, after))
            assert [optimizer.state[p].get("step", 0) for p in after] == steps_before
        else:
            assert all(torch.isfinite(p).all() for p in after)
            assert not any(torch.equal(a, b) for a, b in zip(before, after))


@pytest.mark.usefixtures("one_worker")
def test_with_a_scaler_the_step_is_left_to_it() -> None:
    """The gradients stay (all NaN): GradScaler's unscale_ found them and its step skips."""
    trainer = Trainer(accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                      enable_progress_bar=False)
    trainer.strategy.precision_plugin.scaler = torch.amp.GradScaler("cpu")
    model = torch.nn.Linear(4, 3)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    state = GTopkHookState(density=0.5, start_iter=2)
    for step in range(3):
        iteration(state, model, step, bad=step == 2)
    GTopkHookCallback(state).on_before_optimizer_step(trainer, None, optimizer)
    assert state.last_iteration_skipped
    assert all(p.grad is not None and torch.isnan(p.grad).all() for p in model.parameters())
