"""The optimizer that the DDP hook's updates go to: a skipped iteration not applied, and Adam's
frozen second moment (`freeze_variance_after`) on the hook's path.

    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-3, weight_decay=0.1)
    state = GTopkHookState(density=0.01, freeze_variance_after=100, optimizer=optimizer)
    model.register_comm_hook(state, gtopk_hook)       # then the training loop as it was

The hook reduces inside backward, before the optimizer sees anything, so it cannot hand the
optimizer's step a different rule the way gtopk_hvd's torch DistributedOptimizer does (it owns
`step()`). Instead `HookOptimizer` registers a step pre-hook and a step post-hook on the
optimizer (the innermost torch optimizer: accelerate's, Lightning's and Trainer's wrappers all
end in its `step()`), and the DDP hook tells it what the iteration was. The rule is
`gtopk_hvd.torch.frozen_variance`'s, with N = `freeze_variance_after` and t the optimizer's
step count:

1. t < N (the dense start): each bucket is all-reduced and divided by P afterwards (the
   arithmetic of the optimizer path's dense start, `SparseStep.update(dense=True)`); the optimizer
   steps as it always does, unless the reduced gradients hold a NaN/Inf (the same on every
   worker after the all-reduce): then its step is not applied (nonfinite="propagate") or raises
   FloatingPointError ("raise"), as the optimizer path's dense start.
2. t >= N: each bucket's gradient is multiplied, as it arrives, by s = 1 / (sqrt(v_hat) + eps)
   of its own parameters (in the bucket's order; s made once per bucket from the frozen
   exp_avg_sq). With `max_grad_norm` each worker first clips its own gradient, as the optimizer
   path's recipe does: the norm of the bucket norms of the raw gradient, and at the last bucket
   every held bucket times min(1, max_grad_norm / (norm + 1e-6)) (torch's clip_grad_norm_
   coefficient; the clip commutes with s). The sparse steps then make each bucket u, the average
   of the sparsified g * s.
3. `optimizer.step()`: the pre-hook applies the frozen rule to u (`FrozenVariance.step`: the
   first moment, the decoupled weight decay, the step count) and hides every gradient from the
   optimizer's own step, which then changes nothing (torch's optimizers pass over a parameter
   without a gradient); the post-hook gives the gradients back. An iteration the hook skipped
   for a NaN/Inf is not applied at all (no weight, moment or step count changes), in either
   phase, on every worker alike: without the remedy too, once the state knows its optimizer.

With a GradScaler (float16) the hook sees the scaled gradient: the scaler's `unscale_` and
`step` work as always (the pre-hook runs inside the scaler's step; for a fused optimizer, which
the scaler leaves `grad_scale` and `found_inf` to, the rule divides by the first and skips on
the second), but `max_grad_norm` would clip the scaled gradient: the clients take their clip
over only without a scaler; leave it None with one.

Clip the client's way only in the dense start (`GTopkHookState.preconditioned` is False): after
it the gradients are no gradients but the reduced update. Lightning and Trainer do this for
you (`gtopk_hvd.torch.lightning`, `gtopk_hvd.torch.hf`). The state to checkpoint is the
optimizer's own (exp_avg, exp_avg_sq, step) and the hook's (residuals): s comes back from the
first. A loaded optimizer state makes s again (`forget_scales`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from gtopk_hvd.options import check_number
from gtopk_hvd.torch.frozen_variance import FrozenVariance

CLIP_EPSILON = 1e-6
"""What torch.nn.utils.clip_grad_norm_ adds to the norm before dividing."""


def innermost_optimizer(optimizer: Any) -> torch.optim.Optimizer:
    """The torch optimizer inside a client's wrapper (accelerate's AcceleratedOptimizer,
    Lightning's LightningOptimizer), whose `step()` runs the step hooks."""
    seen = 0
    while seen < 8:
        inner = getattr(optimizer, "optimizer", None) or getattr(optimizer, "_optimizer", None)
        if not isinstance(inner, torch.optim.Optimizer) or inner is optimizer:
            break
        optimizer, seen = inner, seen + 1
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(f"gtopk_hook: optimizer= takes a torch.optim.Optimizer (or a client's "
                        f"wrapper of one), got {type(optimizer).__name__}")
    return optimizer


class HookOptimizer:
    """What the DDP hook's state knows of the optimizer its updates go to (module docstring).

    Fields: after (N, or None without the remedy), max_grad_norm (each worker's clip in the
    sparse phase, or None), momentum (the compression's momentum correction's momentum, or
    None), rule (`FrozenVariance` over the optimizer, or None), optimizer (the innermost torch
    optimizer, or None before `attach`), pending (after a sparse iteration, until the step: a
    function that tells whether the hook skipped it), norms (this iteration's bucket norms for
    the clip), hidden (the gradients hidden from the optimizer's own step), skipped_steps.
    """

    __slots__ = ("after", "handles", "hidden", "max_grad_norm", "momentum", "norms",
                 "optimizer", "pending", "raise_nonfinite", "rule", "skipped_steps")

    def __init__(self, after: int | None, max_grad_norm: float | None,
                 momentum: float | None, raise_nonfinite: bool) -> None:
        """after: freeze_variance_after (checked by the state against its start_iter, and by
        `FrozenVariance` at `attach`), or None."""
        self.after = after
        self.raise_nonfinite = raise_nonfinite
        self.set_clip(max_grad_norm)
        self.momentum = momentum
        self.rule: FrozenVariance | None = None
        self.optimizer: torch.optim.Optimizer | None = None
        self.handles: tuple = ()
        self.pending: Callable[[], bool] | None = None
        self.norms: list[torch.Tensor] = []
        self.hidden: list[tuple[torch.Tensor, torch.Tensor]] = []
        self.skipped_steps = 0

    def attach(self, optimizer: Any) -> None:
        """Takes the optimizer (or a client's wrapper of it): checks it for the remedy and
        registers the step hooks. Attaching the same one again does nothing; another raises."""
        inner = innermost_optimizer(optimizer)
        if self.optimizer is inner:
            return
        if self.optimizer is not None:
            raise RuntimeError("gtopk_hook: this GTopkHookState already has an optimizer; one "
                               "state serves one DDP model and its optimizer")
        parameters = [p for group in inner.param_groups for p in group["params"]]
        if self.after is not None:
            self.rule = FrozenVariance(inner, parameters, self.after, self.momentum)
        self.optimizer = inner
        self.handles = (inner.register_step_pre_hook(self._before_step),
                        inner.register_step_post_hook(self._after_step),
                        inner.register_load_state_dict_post_hook(
                            lambda _: self.forget_scales()))

    def detach(self) -> None:
        """Removes the step hooks (the state is done with this optimizer)."""
        for handle in self.handles:
            handle.remove()
        self.handles, self.optimizer, self.rule = (), None, None

    # -- what the DDP hook asks ------------------------------------------------------------

    def check_ready(self) -> None:
        """Raises, at the hook's first call on every worker, if the remedy has no optimizer."""
        if self.after is not None and self.rule is None:
            raise RuntimeError(
                "gtopk_hook: freeze_variance_after needs the optimizer, whose Adam state it "
                "freezes and whose step it takes over: GTopkHookState(..., "
                "freeze_variance_after=N, optimizer=optimizer) or state.attach_optimizer("
                "optimizer) before the first backward (Lightning's GTopkHookCallback and "
                "gtopk_hvd.torch.hf's register_hook attach it for you)")

    @property
    def dense(self) -> bool:
        """Whether this iteration is one of the remedy's dense start (False without it)."""
        return self.rule is not None and self.rule.dense

    @property
    def preconditioned(self) -> bool:
        """Whether this iteration reduces the preconditioned gradient (the sparse phase)."""
        return self.rule is not None and not self.rule.dense

    def arrive(self, buffer: torch.Tensor, parameters: list[torch.Tensor], key: object) -> None:
        """A bucket of a preconditioned iteration: its raw norm kept for the clip, then the
        gradient times s of its parameters, in place."""
        if self.max_grad_norm is not None:
            self.norms.append(torch.linalg.vector_norm(buffer, dtype=torch.float32))
        self.rule.precondition_(buffer, parameters, key)

    def clip_(self, buffers: list[torch.Tensor]) -> None:
        """At the iteration's last bucket: every held bucket times the clip coefficient of this
        worker's gradient (module docstring, step 2); nothing without max_grad_norm."""
        norms, self.norms = self.norms, []
        if self.max_grad_norm is None or not norms:
            return
        total = torch.linalg.vector_norm(torch.stack([n.to(norms[0].device) for n in norms]))
        coefficient = torch.clamp(self.max_grad_norm / (total + CLIP_EPSILON), max=1.0)
        for buffer in buffers:
            buffer.mul_(coefficient.to(buffer.device, buffer.dtype))

    def end_iteration(self, sparse: bool, skipped: Callable[[], bool]) -> None:
        """The hook's iteration is over: a sparse one waits for the optimizer's step."""
        self.norms = []
        self.pending = skipped if sparse else None

    # -- the optimizer's step ------------------------------------------------------------

    def apply(self) -> bool:
        """Runs before the optimizer's own step (its pre-hook; Lightning's callback, whose
        closure runs the backward inside `step()`, calls it after backward): after a sparse
        iteration the frozen rule's step, or nothing if the iteration was skipped; in the
        dense start nothing if the reduced gradients are not finite. Then hides the gradients
        from the optimizer's own step. Returns whether it took the step over."""
        pending, self.pending = self.pending, None
        if pending is not None:
            if pending() or self._scaler_found_inf():
                self.skipped_steps += 1
            elif self.rule is not None:
                self._unscale_for_fused_step()
                self.rule.step()
            else:
                return False
            self._hide_gradients()
            return True
        if self.rule is not None and self.rule.dense and not self._gradients_finite():
            if self.raise_nonfinite:
                raise FloatingPointError("gtopk_hook: a NaN/Inf in the reduced gradient of "
                                         "freeze_variance_after's dense start "
                                         "(nonfinite=\"raise\")")
            self.skipped_steps += 1
            self._hide_gradients()
            return True
        return False

    def _scaler_found_inf(self) -> bool:
        """A GradScaler that lets a fused optimizer unscale (`grad_scale`, `found_inf` set on
        the optimizer for its step) found a NaN/Inf: the step is skipped."""
        found = getattr(self.optimizer, "found_inf", None)
        return found is not None and bool(found.item() > 0)

    def _unscale_for_fused_step(self) -> None:
        """Divides the reduced update by the scale a GradScaler left to a fused optimizer's
        kernel (the rule's step does not read it)."""
        scale = getattr(self.optimizer, "grad_scale", None)
        if scale is None:
            return
        for parameter in self._parameters():
            if parameter.grad is not None:
                parameter.grad.div_(scale.to(parameter.grad.device))

    def set_clip(self, max_grad_norm: float | None) -> None:
        """max_grad_norm, checked: each worker's clip in the sparse phase (or None)."""
        if max_grad_norm is not None:
            if self.after is None:
                raise ValueError("max_grad_norm is the clip of each worker's own gradient in "
                                 "freeze_variance_after's sparse phase; without "
                                 "freeze_variance_after clip as dense training does (the "
                                 "hook's update is an averaged gradient)")
            check_number("max_grad_norm", max_grad_norm, 0.0, float("inf"), low_open=True)
            if self.raise_nonfinite:
                raise ValueError("max_grad_norm needs nonfinite=\"propagate\" (the default): "
                                 "the clip needs every bucket of the iteration, which the "
                                 "hook holds only then")
        self.max_grad_norm = None if max_grad_norm is None else float(max_grad_norm)

    def serves(self, optimizer: Any) -> bool:
        """Whether `optimizer` (or a client's wrapper) is the one attached."""
        return self.optimizer is not None and innermost_optimizer(optimizer) is self.optimizer

    def _before_step(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        # A closure runs the backward inside step(), after this hook: its caller applies
        # (Lightning's callback); and once applied, the gradients are already hidden.
        closure = kwargs.get("closure", args[1] if len(args) > 1 else None)  # args[0]: self
        if not self.hidden and closure is None:
            self.apply()

    def _after_step(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        hidden, self.hidden = self.hidden, []
        for parameter, gradient in hidden:
            parameter.grad = gradient

    def _parameters(self) -> list[torch.Tensor]:
        return [p for group in self.optimizer.param_groups for p in group["params"]]

    def _hide_gradients(self) -> None:
        self.hidden = [(p, p.grad) for p in self._parameters() if p.grad is not None]
        for parameter, _ in self.hidden:
            parameter.grad = None

    def _gradients_finite(self) -> bool:
        gradients = [p.grad for p in self._parameters() if p.grad is not None]
        if not gradients:
            return True
        return bool(torch.stack([torch.isfinite(g).all() for g in gradients]).all())

    def forget_scales(self) -> None:
        """After the optimizer's state was loaded: s is made again from its exp_avg_sq."""
        if self.rule is not None:
            self.rule.forget_scales()


__all__ = ["HookOptimizer", "innermost_optimizer"]
