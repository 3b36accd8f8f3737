"""Adam or AdamW with its second moment frozen after a dense start, so that what the sparse
scheme reduces is the preconditioned gradient (docs/adamw.md says why and what it measured).

Adam's step is m_hat / (sqrt(v_hat) + eps). Fed a sparse update with error feedback, its second
moment v sees a coordinate's delayed sum G (about g / rho at density rho) once per selection and
zeros between: v grows to about g^2 / rho and the step shrinks to about sqrt(rho) of the dense
one. 1-bit Adam (Tang et al., ICML 2021) observed that v settles early in training and froze it;
with v frozen each step is linear in what is reduced, so error feedback delivers the
preconditioned gradient's sum as it delivers SGD's. With N = `after` and t the wrapped
optimizer's step count:

    t < N   the workers' gradients are all-reduced densely (`SparseStep.update(dense=True)`) and the
            wrapped optimizer steps as it always does;
    t >= N  s = 1 / (sqrt(v / (1 - beta2^N)) + eps) from its exp_avg_sq, which is not updated
            again; each worker hands the scheme g * s (so the selection ranks coordinates by the
            step they would take), the scheme returns u, the average of the sparsified g * s,
            and
                m <- beta1 m + (1 - beta1) u
                w <- w (1 - lr wd) - lr m / (1 - beta1^(t+1))
            (AdamW's decoupled weight decay; Adam's coupled L2 would feed w into the moments,
            and is refused).

With the compression's momentum correction (`momentum_in_exchange`; its momentum must be
beta1), the first moment moves into the exchange instead, as 1-bit Adam compresses its
momentum and DGC its velocity: each worker's velocity u <- beta1 u + g * s is what accumulates
into its residual and is sparsified (cleared where sent unless the compression's
momentum_masking is False, `gtopk_hvd.core.step`), the scheme returns U, the average of the
sparsified sums, and

                w <- w (1 - lr wd) - lr (1 - beta1) U

(u is m / (1 - beta1) in these units, so a dense exchange without masking gives Adam's step;
with masking a coordinate sent at every step moves by (1 - beta1) of it). The
momentum of the dense start carries over: the first sparse step hands the scheme
g * s + beta1 / (1 - beta1) * m_hat * s, m_hat = m / (1 - beta1^N), so every worker's velocity
starts as if it had held m_hat * s / (1 - beta1); exp_avg is not updated afterwards.

The state is the wrapped optimizer's own (exp_avg, exp_avg_sq, step), so the phase and s come
back from its checkpoint (the velocity, with momentum correction, from the sparse step's); s
costs d float32 values where the gradients live, made at the first sparse step.
"""

from __future__ import annotations

from typing import Any

import torch


class FrozenVariance:
    """The rule above over `optimizer`'s groups, for `parameters` (the fused order of a caller
    that preconditions them as one flat gradient; the DDP hook preconditions each bucket's own
    parameters, `gtopk_hvd.torch.hook_optimizer`)."""

    __slots__ = ("after", "momentum_in_exchange", "optimizer", "parameters", "scales")

    def __init__(self, optimizer: torch.optim.Optimizer, parameters: list[torch.Tensor],
                 after: int, momentum_in_exchange: float | None = None) -> None:
        """momentum_in_exchange: None, or the momentum correction's momentum (module
        docstring), which must be every group's beta1."""
        if isinstance(after, bool) or not isinstance(after, int) or after < 1:
            raise ValueError(f"freeze_variance_after must be an integer >= 1 (the dense steps "
                             f"that estimate Adam's second moment), got {after!r}")
        for group in optimizer.param_groups:
            check_adam_group(group, type(optimizer).__name__)
            if momentum_in_exchange is not None and group["betas"][0] != momentum_in_exchange:
                raise ValueError(
                    f"freeze_variance_after with momentum_correction: the compression's "
                    f"momentum ({momentum_in_exchange}) must be Adam's beta1 "
                    f"({group['betas'][0]}); the velocity then carries Adam's first moment")
        self.after = after
        self.momentum_in_exchange = momentum_in_exchange is not None
        self.optimizer = optimizer
        self.parameters = parameters
        self.scales: dict[object, torch.Tensor] = {}  # s of each flat gradient, by its key

    def steps_taken(self) -> int:
        """The wrapped optimizer's step count (0 before its first step): the largest of its
        parameters' (a parameter without a gradient in some steps counts fewer)."""
        return max((int(state["step"]) for p in self.parameters
                    if (state := self.optimizer.state.get(p)) and "step" in state), default=0)

    @property
    def dense(self) -> bool:
        """Whether the next step is one of the dense start's."""
        return self.steps_taken() < self.after

    def forget_scales(self) -> None:
        """Drops every s made (after the optimizer's state was loaded: made again from it)."""
        self.scales.clear()

    def precondition_(self, flat_gradient: torch.Tensor,
                      parameters: list[torch.Tensor] | None = None, key: object = None) -> None:
        """flat_gradient *= s, in place, for the flat gradient of `parameters` (default: all,
        in the fused order), its s made once and kept under `key`; at the first sparse step
        with the momentum in the exchange, plus beta1 / (1 - beta1) m_hat first (module
        docstring)."""
        parameters = self.parameters if parameters is None else parameters
        scale = self.scales.get(key)
        if scale is None:
            scale = self.scales[key] = self._frozen_scale(parameters, flat_gradient.device)
        if scale.numel() != flat_gradient.numel():
            raise RuntimeError(f"gtopk_hvd: freeze_variance_after: a flat gradient of "
                               f"{flat_gradient.numel()} values for parameters of "
                               f"{scale.numel()}")
        if self.momentum_in_exchange and self.steps_taken() == self.after:
            self._add_first_moment_(flat_gradient, parameters)
        flat_gradient.mul_(scale)

    def _add_first_moment_(self, flat_gradient: torch.Tensor,
                           parameters: list[torch.Tensor]) -> None:
        """flat_gradient += beta1 / (1 - beta1) * exp_avg / (1 - beta1^N), one parameter's
        slice at a time (no temporary of d values)."""
        offset = 0
        for p, group in self._with_groups(parameters):
            beta1 = group["betas"][0]
            weight = beta1 / ((1.0 - beta1) * (1.0 - beta1 ** self.after))
            part = flat_gradient[offset:offset + p.numel()]
            part.add_(self.optimizer.state[p]["exp_avg"].reshape(-1).to(part), alpha=weight)
            offset += p.numel()

    def _frozen_scale(self, parameters: list[torch.Tensor],
                      device: torch.device) -> torch.Tensor:
        parts = []
        for p, group in self._with_groups(parameters):
            state = self.optimizer.state.get(p)
            if not state or "exp_avg_sq" not in state:
                raise RuntimeError(
                    "gtopk_hvd: freeze_variance_after: a parameter has no second moment at the "
                    "freeze (it got no gradient in the dense steps); it would never move")
            beta2, eps = group["betas"][1], group["eps"]
            v_hat = state["exp_avg_sq"].detach().float() / (1.0 - beta2 ** self.after)
            parts.append((1.0 / (v_hat.sqrt() + eps)).reshape(-1).to(device))
        return torch.cat(parts)

    def _with_groups(self, parameters: list[torch.Tensor]
                     ) -> list[tuple[torch.Tensor, dict[str, Any]]]:
        """(parameter, its optimizer group) in the given order."""
        group_of = {id(p): group for group in self.optimizer.param_groups
                    for p in group["params"]}
        missing = [tuple(p.shape) for p in parameters if id(p) not in group_of]
        if missing:
            raise RuntimeError(
                f"gtopk_hvd: freeze_variance_after: parameters of shapes {missing[:5]} get "
                "gradients but are not in the optimizer given, so they have no second moment: "
                "give the optimizer every parameter that trains (or set requires_grad=False "
                "on the others before DDP is built)")
        return [(p, group_of[id(p)]) for p in parameters]

    @torch.no_grad()
    def step(self) -> None:
        """The sparse phase's step on p.grad (u, or U with the momentum in the exchange: the
        reduced preconditioned update)."""
        for group in self.optimizer.param_groups:
            beta1 = group["betas"][0]
            lr, decay = float(group["lr"]), float(group["weight_decay"])
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.optimizer.state[p]
                state["step"] += 1
                if decay:
                    p.mul_(1.0 - lr * decay)
                if self.momentum_in_exchange:
                    p.add_(p.grad, alpha=-lr * (1.0 - beta1))
                    continue
                state["exp_avg"].mul_(beta1).add_(p.grad, alpha=1.0 - beta1)
                p.add_(state["exp_avg"], alpha=-lr / (1.0 - beta1 ** float(state["step"])))


def check_adam_group(group: dict[str, Any], name: str) -> None:
    """Raises ValueError unless `group` is one of Adam's or AdamW's that the rule covers."""
    if "betas" not in group or "eps" not in group:
        raise ValueError(f"freeze_variance_after needs Adam or AdamW; got {name} (the rule "
                         "freezes Adam's second moment: leave freeze_variance_after out with "
                         "another optimizer)")
    if group.get("amsgrad") or group.get("maximize"):
        raise ValueError("freeze_variance_after: amsgrad and maximize are not supported")
    decoupled = name == "AdamW" or group.get("decoupled_weight_decay", False)
    if group.get("weight_decay", 0.0) and not decoupled:
        raise ValueError(
            "freeze_variance_after: Adam's weight_decay is an L2 term added to the gradient "
            "before the moments; use AdamW (decoupled weight decay) or weight_decay=0")
