"""AdamW's frozen second moment (`freeze_variance_after`) on FSDP2's sparse reduce-scatter.

    sparse = gtopk_hvd.torch.fsdp.register(model, density=0.01, freeze_variance_after=100,
                                           optimizer=optimizer)

The rule is `gtopk_hvd.torch.frozen_variance`'s, with N = `freeze_variance_after` and t the
optimizer's step count, applied where FSDP reduces:

1. t < N (the dense start): each unit's reduce-scatter is dense
   (`sparse_reduce_scatter.dense_reduce_scatter`, sums in rank order); AdamW steps as always on
   the sharded gradients, unless some worker's gradient held a NaN or an Inf: then no worker
   applies the step (the units' flags, agreed by all-reduce, OR-ed over the iteration). The
   phase is read once an iteration, at its first unit.
2. t >= N: each worker multiplies its unit's flat gradient (clipped, below) by
   s = 1 / (sqrt(v_hat) + eps) of the unit's parameters before the sparse steps. v_hat is
   Adam's exp_avg_sq / (1 - beta2^N), of which each worker holds its own shards: worker q
   computes s on them, padded as FSDP pads its shard of the flat gradient, and one all-gather
   makes the unit's whole s on every worker, in FSDP's layout (row q of the flat gradient is
   worker q's shard). s is made once per unit and kept (n float32 values, as many as the
   residual).
3. `optimizer.step()`: the step pre-hook applies the frozen rule to the sharded update u (first
   moment, decoupled weight decay, step count: `FrozenVariance.step`, on each worker's shards)
   and hides the gradients from AdamW's own step; an iteration any worker flagged is not
   applied at all, on every worker alike, and what its finite units sent goes back into their
   residuals (as does an iteration the caller ends without `optimizer.step()`).

With `max_grad_norm` = M each worker clips its own gradient in the sparse phase before s, as
the DDP hook does, by the norm of its whole gradient. FSDP reduces a unit as soon as its
backward is done, before the later units' gradients exist, so that norm is taken over this
iteration's gradients of the units reduced so far and the last iteration's of the others (the
dense start's, at the first sparse step):

    |g| = sqrt(sum over units of |g_u|^2, |g_u| this iteration's where known, else the last's)
    g_u := g_u min(1, M / (|g| + 1e-6))

Norms change little from one step to the next, so this is the whole-gradient clip but for the
units still to come; an iteration skipped for a NaN or an Inf keeps the last norms. Clip as
dense training does in the dense start only (`SparseFSDP.preconditioned` is False): after it the
gradients are the reduced update, not a gradient.

The state to checkpoint is the optimizer's (exp_avg, exp_avg_sq, step) and each worker's
residuals and, with the clip, its last norms (`SparseFSDP.state_dict`); s is made again from
the first after `optimizer.load_state_dict`.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from gtopk_hvd.torch.hook_optimizer import CLIP_EPSILON, HookOptimizer
from gtopk_hvd.torch.sparse_reduce_scatter import SparseReduceScatter


class ShardedFrozenVariance(HookOptimizer):
    """The module docstring's rule for the comms of one FSDP2 model: `HookOptimizer`'s step hooks
    over the sharded optimizer, the phase and s asked for by each unit's comm.

    Fields beyond `HookOptimizer`'s: units (the comms it serves, in their order of
    registration), and of the iteration under way: seen (the units reduced so far), dense_now
    (its phase, decided at its first unit), flagged (the OR of its units' agreed non-finite
    flags, an int32 tensor, or None), sent (what each sparse unit sent, to put back into the
    residuals if the iteration is not applied), unit_norms (this worker's gradient norm per
    unit); last_unit_norms (those of the last applied iteration, for the clip).
    """

    __slots__ = ("dense_now", "flagged", "last_unit_norms", "seen", "sent", "unit_norms",
                 "units")

    def __init__(self, after: int, max_grad_norm: float | None = None) -> None:
        super().__init__(after, max_grad_norm, None, raise_nonfinite=False)
        self.units: list[SparseReduceScatter] = []
        self.last_unit_norms: dict[SparseReduceScatter, torch.Tensor] = {}
        self._new_iteration()

    def _new_iteration(self) -> None:
        self.seen: set[SparseReduceScatter] = set()
        self.dense_now = False
        self.flagged: torch.Tensor | None = None
        self.sent: dict[SparseReduceScatter, tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}
        self.unit_norms: dict[SparseReduceScatter, torch.Tensor] = {}

    def begin(self, comm: SparseReduceScatter) -> bool:
        """A unit is about to be reduced: a unit seen already means the last iteration ended
        without the optimizer's step (a caller's skip), which is then closed as not applied.
        Returns whether this iteration is one of the dense start's (read once, at its first
        unit)."""
        if comm in self.seen:
            self.pending = None
            self._close(applied=False)
        if not self.seen:
            self.check_ready()
            self.dense_now = self.rule.dense
        self.seen.add(comm)
        return self.dense_now

    def note(self, comm: SparseReduceScatter, flag: torch.Tensor,
             sent: tuple[torch.Tensor, torch.Tensor] | None) -> None:
        """One unit's reduction is done: its flag joins the iteration's; a sparse one keeps what
        it sent and leaves the frozen rule's step pending."""
        self.flagged = flag.clone() if self.flagged is None else torch.maximum(self.flagged, flag)
        if sent is not None:
            self.sent[comm] = (*sent, flag)
            self.end_iteration(True, self._iteration_flagged)

    def _iteration_flagged(self) -> bool:
        return self.flagged is not None and bool(self.flagged.item())

    def _gradients_finite(self) -> bool:
        return not self._iteration_flagged()

    def apply(self) -> bool:
        """`HookOptimizer.apply`, then the iteration is closed: applied, or skipped for a NaN or
        an Inf on some worker."""
        applied = not self._iteration_flagged()
        try:
            return super().apply()
        finally:
            self._close(applied)

    def _close(self, applied: bool) -> None:
        """An applied iteration's norms become the clip's last; a skipped one's sent values go
        back into the residuals of the units that were finite (a non-finite unit kept its
        residual as it was), so nothing sent in it is lost."""
        if applied:
            self.last_unit_norms.update(self.unit_norms)
        else:
            for comm, (indices, values, flag) in self.sent.items():
                kept = values * (1 - flag).to(values.dtype)
                comm.residual.index_add_(0, indices.long(), kept.to(comm.residual.dtype))
        self._new_iteration()

    def observe(self, comm: SparseReduceScatter, gradient: torch.Tensor) -> None:
        """A dense start's unit gradient: its norm kept for the first sparse step's clip."""
        if self.max_grad_norm is not None:
            self.unit_norms[comm] = torch.linalg.vector_norm(gradient, dtype=torch.float32)

    def precondition_(self, comm: SparseReduceScatter, group: dist.ProcessGroup | None,
                      values: torch.Tensor) -> None:
        """values := c values s for `comm`'s unit, in place (module docstring, step 2): c the
        unit's clip coefficient (1 without max_grad_norm), s made at the unit's first sparse
        step and kept."""
        scale = self.rule.scales.get(comm)
        if scale is None:
            scale = self.rule.scales[comm] = self._gathered_scale(comm.parameters, group,
                                                                  values.device)
        if scale.numel() != values.numel():
            raise RuntimeError(
                f"gtopk_hvd: freeze_variance_after: a unit's flat gradient of {values.numel()} "
                f"values against its parameters' {scale.numel()}: FSDP left out a parameter "
                "that got no gradient this iteration; under the remedy every parameter of a "
                "unit must get a gradient in every step")
        if self.max_grad_norm is not None:
            self.unit_norms[comm] = torch.linalg.vector_norm(values)
            zero = values.new_zeros(())
            total = torch.linalg.vector_norm(torch.stack([
                self.unit_norms.get(unit, self.last_unit_norms.get(unit, zero)).to(zero.device)
                for unit in self.units]))
            values.mul_(torch.clamp(self.max_grad_norm / (total + CLIP_EPSILON), max=1.0))
        values.mul_(scale)

    def _gathered_scale(self, parameters: list[tuple[torch.nn.Parameter, int]],
                        group: dist.ProcessGroup | None, device: torch.device) -> torch.Tensor:
        """`parameters`: each sharded parameter of the unit with the numel of its padded shard,
        in FSDP's order."""
        pieces = []
        groups = self.rule._with_groups([parameter for parameter, _ in parameters])
        for (parameter, padded), (_, options) in zip(parameters, groups):
            state = self.optimizer.state.get(parameter)
            if not state or "exp_avg_sq" not in state:
                raise RuntimeError(
                    "gtopk_hvd: freeze_variance_after: a parameter of an FSDP unit has no "
                    "second moment at the freeze (it got no gradient in the dense steps)")
            beta2, eps = options["betas"][1], options["eps"]
            variance = state["exp_avg_sq"]
            if hasattr(variance, "to_local"):  # a DTensor: this worker's shard
                variance = variance.to_local()
            variance = variance.detach().float()
            piece = torch.zeros(padded, dtype=torch.float32, device=device)
            local = (1.0 / ((variance / (1.0 - beta2 ** self.after)).sqrt() + eps)).reshape(-1)
            piece[:local.numel()] = local.to(device)
            pieces.append(piece)
        mine = torch.cat(pieces)
        size = 1 if group is None else dist.get_world_size(group)
        if size == 1:
            return mine
        whole = torch.empty(size * mine.numel(), dtype=torch.float32, device=device)
        gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
        gather(whole, mine, group=group)
        return whole


def unit_parameters(param_group: Any) -> list[tuple[torch.nn.Parameter, int]]:
    """Each sharded parameter of an FSDP2 parameter group with the numel of its padded shard,
    in the order FSDP lays out the group's flat gradient."""
    return [(fsdp_param.sharded_param, fsdp_param.padded_sharded_param_size.numel())
            for fsdp_param in param_group.fsdp_params]


__all__ = ["ShardedFrozenVariance", "unit_parameters"]
