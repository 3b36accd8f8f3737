"""The sparse reduce-scatter under FSDP2 (`torch.distributed.fsdp.fully_shard`): one call per
model.

    model = build()                                   # then fully_shard each unit and the root
    for block in model.blocks:
        fully_shard(block)
    fully_shard(model)
    sparse = gtopk_hvd.torch.fsdp.register(model, density=0.01)

`register` gives every FSDP module of the model that holds parameters its own
`SparseReduceScatter` (`gtopk_hvd.torch.sparse_reduce_scatter`: the algorithm, its bytes, its
non-finite rule) and sets FSDP to reduce by a sum and divide afterwards, by its usual factor
(the world size, or `set_gradient_divide_factor`'s). FSDP's parameter all-gathers stay dense;
only the gradients' reduce-scatter is sparse. Gradient accumulation
(`set_requires_gradient_sync(False)`) needs nothing more: FSDP calls the reduce-scatter once, on
the accumulated gradient.

The rules:

1. Call it after `fully_shard`, before the first backward, once, with the same density on every
   worker.
2. A data-parallel mesh of one dimension: hybrid sharding (HSDP) and replicate meshes all-reduce
   the shards densely afterwards and are refused, as are FSDP1 models
   (`FullyShardedDataParallel`) and modules that already have a reduce-scatter comm of their
   own or allocate from the process group.
3. Each worker keeps a residual of its units' unsharded gradients: `state_dict()` holds this
   worker's, to be saved and restored by each worker (a restart on the same number of workers
   continues bit for bit).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from gtopk_hvd.options import refuse
from gtopk_hvd.torch.sparse_reduce_scatter import SparseReduceScatter

__all__ = ["SparseFSDP", "register"]


class SparseFSDP:
    """The sparse reduce-scatters of one model, by the FSDP module's name in the model ("" for
    the root).

    Attributes:
        comms: name -> SparseReduceScatter.
    """

    __slots__ = ("comms",)

    def __init__(self, comms: dict[str, SparseReduceScatter]) -> None:
        self.comms = comms

    @property
    def bytes_sent(self) -> int:
        """The bytes this worker sent in every unit's reduce-scatter so far."""
        return sum(comm.bytes_sent for comm in self.comms.values())

    @property
    def dense_bytes(self) -> int:
        """What FSDP's own ring reduce-scatters would have sent, at the reduce dtype."""
        return sum(comm.dense_bytes for comm in self.comms.values())

    def state_dict(self) -> dict[str, Any]:
        """Every unit's residual and counters, this worker's."""
        return {name: comm.state_dict() for name, comm in self.comms.items()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restores what `state_dict` returned, on the same model."""
        if sorted(state) != sorted(self.comms):
            refuse("state", f"the units {sorted(self.comms)}", sorted(state),
                   "restore the state saved from this model, sharded the same way")
        for name, comm in self.comms.items():
            comm.load_state_dict(state[name])


def register(model: nn.Module, density: float) -> SparseFSDP:
    """Makes every FSDP2 module of `model` reduce-scatter its gradients sparsely.

    Args:
        model: a model whose units and root went through `fully_shard` (rules in the module
            docstring).
        density: k / S for each shard of each unit, in (0, 1] (`shard_budget`).

    Returns:
        The `SparseFSDP` holding each unit's comm (its residual, bytes and checkpoint).
    """
    from torch.distributed.fsdp import FSDPModule, FullyShardedDataParallel
    from torch.distributed.fsdp._fully_shard._fsdp_collectives import DefaultReduceScatter
    from torch.distributed.fsdp._fully_shard._fsdp_common import DDPMeshInfo

    if any(isinstance(module, FullyShardedDataParallel) for module in model.modules()):
        raise TypeError("gtopk_hvd.torch.fsdp.register takes FSDP2 models "
                        "(torch.distributed.fsdp.fully_shard); this one is wrapped in FSDP1's "
                        "FullyShardedDataParallel: shard it with fully_shard instead")
    units = [(name, module) for name, module in model.named_modules()
             if isinstance(module, FSDPModule)]
    if not units:
        raise ValueError("gtopk_hvd.torch.fsdp.register: the model has no FSDP module; call "
                         "torch.distributed.fsdp.fully_shard on its units and its root first")
    comms: dict[str, SparseReduceScatter] = {}
    for name, module in units:
        groups = module._get_fsdp_state()._fsdp_param_groups
        for group in groups:
            if isinstance(group.mesh_info, DDPMeshInfo):
                raise ValueError(
                    f"gtopk_hvd.torch.fsdp.register: unit {name or '<root>'} is sharded over a "
                    "2-D (hybrid, HSDP) or replicate mesh, whose shards FSDP all-reduces densely "
                    "across replicas; the sparse reduce-scatter needs fully_shard over a 1-D "
                    "mesh")
            comm = group._reduce_scatter_comm
            if isinstance(comm, SparseReduceScatter):
                raise ValueError(f"gtopk_hvd.torch.fsdp.register: unit {name or '<root>'} has a "
                                 "sparse reduce-scatter already; register a model once")
            if type(comm) is not DefaultReduceScatter:
                raise ValueError(
                    f"gtopk_hvd.torch.fsdp.register: unit {name or '<root>'} has the "
                    f"reduce-scatter comm {type(comm).__name__} (a custom comm, or memory from "
                    "the process group or symmetric memory); the sparse reduce-scatter replaces "
                    "FSDP's default one only")
        if not groups:
            continue
        comms[name] = SparseReduceScatter(density)
        module.set_custom_reduce_scatter(comms[name])
        module.set_force_sum_reduction_for_comms(True)
    return SparseFSDP(comms)


def full_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter of an FSDP2 model whole (its shards gathered), by name: the same tensors
    on every worker."""
    return {name: (parameter.full_tensor() if hasattr(parameter, "full_tensor")
                   else parameter).detach().clone()
            for name, parameter in model.named_parameters()}
