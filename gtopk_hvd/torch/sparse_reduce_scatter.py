"""A sparse reduce-scatter with error feedback: what FSDP's gradient reduce-scatter becomes under
`gtopk_hvd.torch.fsdp`.

FSDP lays one parameter group's gradients out as P contiguous shards of S values (shard q is
worker q's), n = P S in all. On worker p, with that flat gradient x and a residual r of n float32
values kept between steps:

    1. flag = 1 if any worker's x holds a NaN or an Inf    (one int32 MAX all-reduce)
    2. unless flag: r += x                                 (in place)
    3. for each shard q: I_q = the k largest |r| in shard q (k = min(S, max(1, ceil(density S))),
       ties: the lower index), V_q = r at I_q; unless flag: r[I_q] = 0
    4. send (I_q - q S, V_q) to worker q                   (one all-to-all of P equal messages:
                                                            k int32 indices, k float32 values)
    5. y = the values received, summed at their indices in the senders' rank order (float32;
       0 where no worker sent an index); y = NaN everywhere if flag
    6. FSDP's shard := y in its reduce dtype; FSDP divides it by its factor afterwards

Every worker sends every value it takes, so what the owners apply plus every worker's residual
equals every worker's gradients summed, to the float32 rounding of the sums (and, with a
bfloat16 reduce dtype, of the shard's cast back): nothing is lost, a value not yet selected
waits in its sender's residual. A step the optimizer does not apply loses what was sent in it
unless its values are put back (`gtopk_hvd.torch.fsdp_adamw` does, for the steps it skips).

A unit with a non-finite gradient on any worker leaves every worker's residual of that unit as
it was, still sends messages of the usual size (the sets of the residual as it is; in the
bfloat16 variant, of x + r with the non-finite entries zeroed), and hands FSDP a NaN shard on
every worker: what a loss scaler's skip expects, the same decision everywhere.

Bytes sent per worker and step: 8 k (P - 1), and the flag's all-reduce. FSDP's ring
reduce-scatter sends b S (P - 1) (b: the reduce dtype's bytes), so the ratio is 8 k / (b S),
about 2 density at float32 and 4 density at bfloat16.

Two variants of the same steps:

- A bfloat16 residual (`residual_dtype=torch.bfloat16`) halves what the residual holds. Steps 2
  and 3 then run on the float32 sum x + r in the buffer that already holds x in float32 (FSDP's
  own input at a float32 reduce dtype, else its float32 copy), and r := that sum, with the
  selected entries zeroed, rounded to bfloat16 (kept as it was if flag). What is lost is that
  rounding, at most 2^-9 of each residual value a step: conservation holds to it, not to
  float32's.
- Adam's frozen preconditioner (`gtopk_hvd.torch.fsdp_adamw`) changes x before step 1, in the
  float32 buffer: x := c x s, c a clip coefficient and s n values.

A dense reduce-scatter in the same shape (`dense_reduce_scatter`: the shards sent whole, one
all-to-all of P messages of S values in the reduce dtype, summed in float32 in rank order) is
what the AdamW rule's dense start uses: its sums are the same on every run and every worker.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any, Protocol

import torch
import torch.distributed as dist

from gtopk_hvd import ops
from gtopk_hvd.density import shard_budget
from gtopk_hvd.options import check_number, refuse

RESIDUAL_DTYPES = (torch.float32, torch.bfloat16)
"""What a residual may be kept in (module docstring: the bfloat16 variant)."""


class Remedy(Protocol):
    """What a comm asks of the AdamW rule it serves (`gtopk_hvd.torch.fsdp_adamw`)."""

    def begin(self, comm: SparseReduceScatter) -> bool:
        """The comm's unit is about to be reduced: whether this iteration is one of the dense
        start's (decided at the iteration's first unit)."""

    def observe(self, comm: SparseReduceScatter, gradient: torch.Tensor) -> None:
        """This worker's gradient of the comm's unit in the dense start, before it is reduced."""

    def precondition_(self, comm: SparseReduceScatter, group: dist.ProcessGroup | None,
                      values: torch.Tensor) -> None:
        """This comm's flat gradient (n float32 values, FSDP's layout), clipped and multiplied
        by s in place."""

    def note(self, comm: SparseReduceScatter, flag: torch.Tensor,
             sent: tuple[torch.Tensor, torch.Tensor] | None) -> None:
        """One unit's reduction is done: its agreed non-finite flag and, for a sparse one, what
        this worker sent (indices into the flat gradient, values)."""


class SparseReduceScatter:
    """FSDP's gradient reduce-scatter for one parameter group (FSDP2's
    `set_custom_reduce_scatter` comm; FSDP1's comm hook state): the module docstring's steps,
    with its residual.

    Args:
        density: k / S per shard, in (0, 1].
        residual_dtype: torch.float32, or torch.bfloat16 to halve the residual (module
            docstring).

    Attributes:
        residual: the n values not yet sent (None before the first call).
        steps: the calls so far (one a backward for the group).
        skips: the calls that found a non-finite gradient on some worker (an int32 tensor
            where the residual is, read by `skipped`; None before the first call).
        bytes_sent: the bytes this worker sent (the all-to-all's and the flag's).
        dense_bytes: what FSDP's ring reduce-scatter would have sent, at the reduce dtype.
        remedy: the AdamW rule this comm serves, or None.
        parameters: what the remedy needs to know of the group's parameters (set by the
            adapter that made the comm).
    """

    __slots__ = ("density", "residual_dtype", "residual", "steps", "skips", "bytes_sent",
                 "dense_bytes", "remedy", "parameters")

    def __init__(self, density: float, residual_dtype: torch.dtype = torch.float32) -> None:
        check_number("density", density, 0.0, 1.0, low_open=True,
                     fix="the share of each shard's entries sent a step, e.g. 0.01")
        if residual_dtype not in RESIDUAL_DTYPES:
            refuse("residual_dtype", "torch.float32 or torch.bfloat16", residual_dtype,
                   "torch.bfloat16 halves the residual's memory (docs/fsdp.md says what it "
                   "costs)")
        self.density = float(density)
        self.residual_dtype = residual_dtype
        self.residual: torch.Tensor | None = None
        self.steps = 0
        self.skips: torch.Tensor | None = None
        self.bytes_sent = 0
        self.dense_bytes = 0
        self.remedy: Remedy | None = None
        self.parameters: Any = None

    @property
    def skipped(self) -> int:
        """The calls that found a non-finite gradient on some worker (a host read)."""
        return 0 if self.skips is None else int(self.skips.item())

    def allocate(self, size: Any, *, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        """FSDP's buffers for the flat gradient and the shard: plain tensors."""
        return torch.empty(*size, dtype=dtype, device=device)

    def __call__(self, output_tensor: torch.Tensor, input_tensor: torch.Tensor,
                 group: dist.ProcessGroup, op: Any, async_op: bool = False) -> None:
        """Reduces `input_tensor` (n) into this worker's shard `output_tensor` (S): the module
        docstring's steps. op must be a sum (`gtopk_hvd.torch.fsdp` sets FSDP to sum and divide
        afterwards)."""
        if op not in (dist.ReduceOp.SUM, dist.ReduceOp.RedOpType.SUM):
            refuse("op", "ReduceOp.SUM (FSDP set to sum and divide afterwards)", op,
                   "register through gtopk_hvd.torch.fsdp.register(model, density), which calls "
                   "set_force_sum_reduction_for_comms(True); do not undo it")
        self.reduce(output_tensor, input_tensor, group)

    def reduce(self, output: torch.Tensor, gradient: torch.Tensor,
               group: dist.ProcessGroup | None) -> None:
        """The sum of every worker's `gradient` into this worker's shard `output`: the sparse
        steps, or the dense ones in the remedy's dense start."""
        remedy = self.remedy
        if remedy is not None and remedy.begin(self):
            remedy.observe(self, gradient)
            remedy.note(self, dense_reduce_scatter(output, gradient, self, group), None)
            return
        prepare = None if remedy is None else partial(remedy.precondition_, self, group)
        flag, indices, selected = reduce_scatter(output, gradient, self, group, prepare)
        if remedy is not None:
            remedy.note(self, flag, (indices, selected))

    def state_dict(self) -> dict[str, Any]:
        """The residual and the counters (this worker's; each worker saves its own)."""
        return {"density": self.density, "residual": self.residual, "steps": self.steps,
                "skips": self.skips}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restores what `state_dict` returned, checking the density and the residual's dtype."""
        if float(state["density"]) != self.density:
            refuse("density", f"the saved state's ({state['density']})", self.density,
                   "restore into a model registered with the density it was saved with")
        saved = state["residual"]
        if saved is not None and saved.dtype != self.residual_dtype:
            refuse("residual_dtype", f"the saved residual's ({saved.dtype})",
                   self.residual_dtype, "register with the residual_dtype it was saved with")
        self.residual, self.skips = (None if state[name] is None else state[name].detach().clone()
                                     for name in ("residual", "skips"))
        self.steps = int(state["steps"])


def check_layout(output: torch.Tensor, gradient: torch.Tensor,
                 group: dist.ProcessGroup | None) -> tuple[int, int, int]:
    """(P, n, S) of a call, checked: n = P S."""
    size = 1 if group is None else dist.get_world_size(group)
    n, shard = gradient.numel(), output.numel()
    if n != size * shard:
        raise ValueError(f"gtopk_hvd: the flat gradient has {n} values, not {size} shards of "
                         f"{shard}")
    return size, n, shard


def agreed_flag(values: torch.Tensor, group: dist.ProcessGroup | None, size: int
                ) -> torch.Tensor:
    """Step 1: one int32, 1 if any worker's `values` holds a NaN or an Inf."""
    flag = ops.nonfinite_flag(values)
    ops.mark_nonfinite(values, flag)
    if size > 1:
        dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=group)
    return flag


def reduce_scatter(output: torch.Tensor, gradient: torch.Tensor, comm: SparseReduceScatter,
                   group: dist.ProcessGroup | None,
                   prepare: Callable[[torch.Tensor], None] | None = None
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The module docstring's steps 1-5 for one call: `gradient` (n values, FSDP's layout;
    overwritten when it is float32) into `output` (this worker's S values), `comm.residual`
    updated in place. Returns the agreed non-finite flag and what this worker sent: the
    indices into the flat gradient and their values."""
    size, n, shard = check_layout(output, gradient, group)
    if shard >= 2**31:
        raise ValueError(f"gtopk_hvd: a shard of {shard} values; the sparse reduce-scatter sends "
                         "int32 indices within a shard (at most 2**31 - 1): shard the model "
                         "into smaller units")
    if comm.residual is None:
        comm.residual = torch.zeros(n, dtype=comm.residual_dtype, device=gradient.device)
        comm.skips = torch.zeros(1, dtype=torch.int32, device=gradient.device)
    if comm.residual.device != gradient.device:  # a state loaded elsewhere (map_location)
        comm.residual = comm.residual.to(gradient.device)
        comm.skips = comm.skips.to(gradient.device)
    residual = comm.residual
    if residual.numel() != n:
        raise ValueError(f"gtopk_hvd: this parameter group's residual holds {residual.numel()} "
                         f"values, its flat gradient {n}: one SparseReduceScatter serves one "
                         "parameter group, every parameter in every step (register sets "
                         "FSDP2's set_reduce_scatter_unused_params(True); a state restored "
                         "from another model or sharding does not fit)")
    values = gradient.reshape(-1)
    if values.dtype != torch.float32:
        values = values.to(torch.float32)  # the reduce dtype's gradient, summed in float32
    if prepare is not None:
        prepare(values)

    flag = agreed_flag(values, group, size)
    k = shard_budget(shard, comm.density)
    offsets = [q * shard for q in range(size + 1)]
    if residual.dtype == torch.float32:
        indices, selected = ops.segmented_accumulate_select(values, residual, offsets,
                                                            [k] * size, skip=flag)
    else:  # the bfloat16 residual: the sum in the float32 buffer, then rounded back
        values.add_(residual).nan_to_num_(0.0, 0.0, 0.0)
        indices, selected = ops.segmented_accumulate_select(None, values, offsets, [k] * size)
        kept = (1 - flag).to(torch.float32)
        residual.mul_(flag.to(residual.dtype)).add_(values.mul_(kept))

    message = torch.empty(size, 2 * k, dtype=torch.int32, device=gradient.device)
    starts = torch.arange(0, n, shard, device=gradient.device).reshape(size, 1)
    message[:, :k] = indices.reshape(size, k) - starts
    message[:, k:] = selected.reshape(size, k).view(torch.int32)
    received = message
    if size > 1:
        received = torch.empty_like(message)
        dist.all_to_all_single(received, message, group=group)

    summed = float32_target(output)
    summed.zero_()
    for sender in range(size):  # rank order: the same float32 sums on every worker
        summed.index_add_(0, received[sender, :k], received[sender, k:].view(torch.float32))
    summed.add_(torch.where(flag.bool(), float("nan"), 0.0))
    if summed is not output:
        output.copy_(summed.reshape(output.shape))

    comm.steps += 1
    comm.skips += flag
    comm.bytes_sent += 8 * k * (size - 1) + (4 if size > 1 else 0)
    comm.dense_bytes += gradient.element_size() * shard * (size - 1)
    return flag, indices, selected


def dense_reduce_scatter(output: torch.Tensor, gradient: torch.Tensor,
                         comm: SparseReduceScatter, group: dist.ProcessGroup | None
                         ) -> torch.Tensor:
    """Every shard sent whole to its owner (one all-to-all in the reduce dtype) and summed in
    float32 in rank order; the residual untouched. Returns the agreed non-finite flag (a NaN
    reaches only its shard's owner, the flag every worker)."""
    size, n, shard = check_layout(output, gradient, group)
    flag = agreed_flag(gradient.reshape(-1), group, size)
    message = gradient.reshape(size, shard)
    received = message
    if size > 1:
        received = torch.empty_like(message)
        dist.all_to_all_single(received, message.contiguous(), group=group)
    summed = float32_target(output)
    summed.zero_()
    for sender in range(size):
        summed.add_(received[sender])
    if summed is not output:
        output.copy_(summed.reshape(output.shape))
    comm.steps += 1
    comm.bytes_sent += gradient.element_size() * shard * (size - 1) + (4 if size > 1 else 0)
    comm.dense_bytes += gradient.element_size() * shard * (size - 1)
    return flag


def float32_target(output: torch.Tensor) -> torch.Tensor:
    """Where the float32 sums go: `output` itself, or a float32 buffer of its size."""
    if output.dtype == torch.float32:
        return output.reshape(-1)
    return torch.empty(output.numel(), dtype=torch.float32, device=output.device)
