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
equals every worker's gradients summed, to the float32 rounding of the sums: nothing is lost, a
value not yet selected waits in its sender's residual. A step with a non-finite gradient on any
worker leaves every residual as it was, still sends messages of the usual size (the sets of the
residual as it is), and hands FSDP a NaN shard on every worker: what a loss scaler's skip
expects, the same decision everywhere.

Bytes sent per worker and step: 8 k (P - 1), and the flag's all-reduce. FSDP's ring
reduce-scatter sends b S (P - 1) (b: the reduce dtype's bytes), so the ratio is 8 k / (b S),
about 2 density at float32 and 4 density at bfloat16.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.distributed as dist

from gtopk_hvd import ops
from gtopk_hvd.options import check_number, refuse


def shard_budget(shard_size: int, density: float) -> int:
    """k, the entries each worker sends to each shard's owner: min(S, max(1, ceil(density S)))."""
    return min(shard_size, max(1, math.ceil(density * shard_size)))


class SparseReduceScatter:
    """FSDP2's reduce-scatter comm (`FSDPModule.set_custom_reduce_scatter`) for one parameter
    group: the module docstring's steps, with its residual.

    Args:
        density: k / S per shard, in (0, 1].

    Attributes:
        residual: the n float32 values not yet sent (None before the first call).
        steps: the calls so far (one a backward for the group).
        skips: the calls that found a non-finite gradient on some worker (an int32 tensor
            where the residual is, read by `skipped`; None before the first call).
        bytes_sent: the bytes this worker sent (the all-to-all's and the flag's).
        dense_bytes: what FSDP's ring reduce-scatter would have sent, at the reduce dtype.
    """

    __slots__ = ("density", "residual", "steps", "skips", "bytes_sent", "dense_bytes")

    def __init__(self, density: float) -> None:
        check_number("density", density, 0.0, 1.0, low_open=True,
                     fix="the share of each shard's entries sent a step, e.g. 0.01")
        self.density = float(density)
        self.residual: torch.Tensor | None = None
        self.steps = 0
        self.skips: torch.Tensor | None = None
        self.bytes_sent = 0
        self.dense_bytes = 0

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
        reduce_scatter(output_tensor, input_tensor, self, group)

    def state_dict(self) -> dict[str, Any]:
        """The residual and the counters (this worker's; each worker saves its own)."""
        return {"density": self.density, "residual": self.residual, "steps": self.steps,
                "skips": self.skips}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restores what `state_dict` returned, checking the density."""
        if float(state["density"]) != self.density:
            refuse("density", f"the saved state's ({state['density']})", self.density,
                   "restore into a model registered with the density it was saved with")
        self.residual, self.skips = (None if state[name] is None else state[name].detach().clone()
                                     for name in ("residual", "skips"))
        self.steps = int(state["steps"])


def reduce_scatter(output: torch.Tensor, gradient: torch.Tensor, comm: SparseReduceScatter,
                   group: dist.ProcessGroup | None) -> None:
    """The module docstring's steps 1-5 for one call: `gradient` (n values, FSDP's layout) into
    `output` (this worker's S values), `comm.residual` updated in place."""
    size = 1 if group is None else dist.get_world_size(group)
    n, shard = gradient.numel(), output.numel()
    if n != size * shard:
        raise ValueError(f"gtopk_hvd: the flat gradient has {n} values, not {size} shards of "
                         f"{shard}")
    if shard >= 2**31:
        raise ValueError(f"gtopk_hvd: a shard of {shard} values; the sparse reduce-scatter sends "
                         "int32 indices within a shard (at most 2**31 - 1): shard the model "
                         "into smaller units")
    if comm.residual is None:
        comm.residual = torch.zeros(n, dtype=torch.float32, device=gradient.device)
        comm.skips = torch.zeros(1, dtype=torch.int32, device=gradient.device)
    residual = comm.residual
    if residual.numel() != n or residual.device != gradient.device:
        raise ValueError(f"gtopk_hvd: this parameter group's residual holds {residual.numel()} "
                         f"values on {residual.device}, its gradient {n} on {gradient.device}: "
                         "one SparseReduceScatter serves one parameter group")
    values = gradient.reshape(-1)
    if values.dtype != torch.float32:
        values = values.to(torch.float32)  # the reduce dtype's gradient, summed in float32

    flag = ops.nonfinite_flag(residual)
    ops.mark_nonfinite(values, flag)
    if size > 1:
        dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=group)
    k = shard_budget(shard, comm.density)
    offsets = [q * shard for q in range(size + 1)]
    indices, selected = ops.segmented_accumulate_select(values, residual, offsets, [k] * size,
                                                        skip=flag)

    message = torch.empty(size, 2 * k, dtype=torch.int32, device=gradient.device)
    starts = torch.arange(0, n, shard, device=gradient.device).reshape(size, 1)
    message[:, :k] = indices.reshape(size, k) - starts
    message[:, k:] = selected.reshape(size, k).view(torch.int32)
    received = message
    if size > 1:
        received = torch.empty_like(message)
        dist.all_to_all_single(received, message, group=group)

    summed = output if output.dtype == torch.float32 else torch.empty(
        shard, dtype=torch.float32, device=output.device)
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
