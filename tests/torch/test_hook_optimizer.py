"""The DDP hook's optimizer link (`gtopk_hvd.torch.hook_optimizer`) on a real torch AdamW, in
one process: after the dense start the pre-hook takes the optimizer's step over with the frozen
rule (`FrozenVariance.step`) and AdamW's own step changes nothing; a skipped iteration changes
nothing at all; and the scale a GradScaler leaves to a fused optimizer (`grad_scale`,
`found_inf`) is honoured, so a scaled update steps as the unscaled one."""

from __future__ import annotations

import torch

from gtopk_hvd.torch.frozen_variance import FrozenVariance
from gtopk_hvd.torch.hook_optimizer import HookOptimizer

AFTER = 2


def dense_started(fused: bool) -> tuple[torch.nn.Parameter, torch.optim.AdamW, HookOptimizer]:
    """A parameter, its AdamW and the link, after AFTER dense steps through the link."""
    parameter = torch.nn.Parameter(torch.linspace(-1.0, 1.0, 6))
    optimizer = torch.optim.AdamW([parameter], lr=0.1, weight_decay=0.1, fused=fused)
    link = HookOptimizer(AFTER, None, None, raise_nonfinite=False)
    link.attach(optimizer)
    for step in range(AFTER):
        parameter.grad = torch.linspace(0.5, -0.5, 6) * (step + 1)
        optimizer.step()
    assert link.preconditioned
    return parameter, optimizer, link


def sparse_step(optimizer: torch.optim.AdamW, link: HookOptimizer, parameter: torch.Tensor,
                update: torch.Tensor, skipped: bool = False) -> None:
    parameter.grad = update.clone()
    link.end_iteration(True, lambda: skipped)
    optimizer.step()


def test_the_rule_takes_the_step_over_and_a_skip_changes_nothing() -> None:
    parameter, optimizer, link = dense_started(fused=False)
    reference = parameter.detach().clone()
    rule_optimizer = torch.optim.AdamW([torch.nn.Parameter(reference)], lr=0.1,
                                       weight_decay=0.1)
    rule_optimizer.state[rule_optimizer.param_groups[0]["params"][0]] = {
        key: value.clone() for key, value in optimizer.state[parameter].items()}
    update = torch.tensor([0.0, 2.0, 0.0, -1.0, 0.0, 0.5])
    rule_parameter = rule_optimizer.param_groups[0]["params"][0]
    rule_parameter.grad = update.clone()
    FrozenVariance(rule_optimizer, [rule_parameter], AFTER).step()
    sparse_step(optimizer, link, parameter, update)
    assert torch.equal(parameter.detach(), rule_parameter.detach())
    assert torch.equal(parameter.grad, update)  # given back after the step
    state = {key: value.clone() for key, value in optimizer.state[parameter].items()}
    before = parameter.detach().clone()
    sparse_step(optimizer, link, parameter, torch.full((6,), float("nan")), skipped=True)
    assert torch.equal(parameter.detach(), before) and link.skipped_steps == 1
    assert all(torch.equal(state[key], optimizer.state[parameter][key]) for key in state)


def test_a_fused_optimizer_left_the_scale_steps_as_unscaled() -> None:
    plain, plain_optimizer, plain_link = dense_started(fused=True)
    scaled, scaled_optimizer, scaled_link = dense_started(fused=True)
    update = torch.tensor([0.0, 2.0, 0.0, -1.0, 0.0, 0.5])
    sparse_step(plain_optimizer, plain_link, plain, update)
    scaled_optimizer.grad_scale = torch.tensor(1024.0)
    scaled_optimizer.found_inf = torch.tensor(0.0)
    sparse_step(scaled_optimizer, scaled_link, scaled, update * 1024.0)
    assert torch.allclose(scaled.detach(), plain.detach(), rtol=0, atol=1e-6)
    assert torch.allclose(scaled_optimizer.state[scaled]["exp_avg"],
                          plain_optimizer.state[plain]["exp_avg"], rtol=1e-6, atol=0)
    before = scaled.detach().clone()
    scaled_optimizer.found_inf = torch.tensor(1.0)
    sparse_step(scaled_optimizer, scaled_link, scaled, update * 1024.0)
    assert torch.equal(scaled.detach(), before) and scaled_link.skipped_steps == 1
