"""The sparse reduce-scatter under FSDP: one call per model, FSDP2 or FSDP1.

    model = build()                                   # FSDP2: fully_shard each unit, the root
    for block in model.blocks:
        fully_shard(block)
    fully_shard(model)
    sparse = gtopk_hvd.torch.fsdp.register(model, density=0.01)

    model = FullyShardedDataParallel(build(), auto_wrap_policy=...)       # or FSDP1
    sparse = gtopk_hvd.torch.fsdp.register(model, density=0.01)

`register` gives every FSDP unit of the model that holds parameters its own
`SparseReduceScatter` (`gtopk_hvd.torch.sparse_reduce_scatter`: the algorithm, its bytes, its
non-finite rule). FSDP2: the unit's custom reduce-scatter comm, FSDP set to reduce by a sum and
divide afterwards by its usual factor (the world size, or `set_gradient_divide_factor`'s).
FSDP1 (FULL_SHARD, SHARD_GRAD_OP): FSDP's communication hook with each unit's comm as its
state, the sum divided by the world size, as FSDP's default reduce-scatter does. FSDP's
parameter all-gathers stay dense; only the gradients' reduce-scatter is sparse. Gradient
accumulation (FSDP2's `set_requires_gradient_sync(False)`, FSDP1's `no_sync()`) needs nothing
more: FSDP reduces once, the accumulated gradient.

The rules:

1. Call it after sharding, before the first backward, once, with the same arguments on every
   worker.
2. A data-parallel mesh of one dimension: hybrid sharding (HSDP, FSDP1's HYBRID_SHARD) and
   replicate meshes all-reduce the shards densely afterwards and are refused, as are FSDP1's
   NO_SHARD (that is DDP: `gtopk_hvd.torch.ddp`), and units that already have a reduce-scatter
   comm or hook of their own or allocate from the process group.
3. Each worker keeps a residual of its units' unsharded gradients: `state_dict()` holds this
   worker's, to be saved and restored by each worker (a restart on the same number of workers
   continues bit for bit). `residual_dtype=torch.bfloat16` halves it.
4. AdamW: `freeze_variance_after=N, optimizer=optimizer` (FSDP2) freezes Adam's second moment
   after N dense steps and reduces the preconditioned gradient (`gtopk_hvd.torch.fsdp_adamw`).
"""

from __future__ import annotations

import warnings
from typing import Any

import torch
from torch import nn

from gtopk_hvd.options import refuse
from gtopk_hvd.torch.fsdp_adamw import ShardedFrozenVariance, unit_parameters
from gtopk_hvd.torch.sparse_reduce_scatter import SparseReduceScatter

__all__ = ["SparseFSDP", "full_state", "register"]


class SparseFSDP:
    """The sparse reduce-scatters of one model, by the FSDP unit's name in the model ("" for
    the root), and the AdamW rule they serve.

    Attributes:
        comms: name -> SparseReduceScatter.
        remedy: the `ShardedFrozenVariance` of `freeze_variance_after`, or None.
    """

    __slots__ = ("comms", "remedy")

    def __init__(self, comms: dict[str, SparseReduceScatter],
                 remedy: ShardedFrozenVariance | None = None) -> None:
        self.comms = comms
        self.remedy = remedy

    @property
    def preconditioned(self) -> bool:
        """Whether this iteration reduces the preconditioned gradient (after the remedy's dense
        start): clip as dense training does only while it is False."""
        return self.remedy is not None and self.remedy.preconditioned

    @property
    def bytes_sent(self) -> int:
        """The bytes this worker sent in every unit's reduce-scatter so far."""
        return sum(comm.bytes_sent for comm in self.comms.values())

    @property
    def dense_bytes(self) -> int:
        """What FSDP's own ring reduce-scatters would have sent, at the reduce dtype."""
        return sum(comm.dense_bytes for comm in self.comms.values())

    def residual_bytes(self) -> int:
        """The memory of this worker's residuals.

        Returns:
            The bytes they hold, every unit's together.
        """
        return sum(comm.residual.numel() * comm.residual.element_size()
                   for comm in self.comms.values() if comm.residual is not None)

    def state_dict(self) -> dict[str, Any]:
        """This worker's state of every unit, for `load_state_dict`.

        Returns:
            {unit name: {"density", "residual", "steps", "skips"}, and with the remedy's clip
            "clip_norm", the unit's last gradient norm, which the next step's clip reads}.
            Each worker saves its own: residuals differ between workers.
        """
        state = {name: comm.state_dict() for name, comm in self.comms.items()}
        if self.remedy is not None:
            for name, comm in self.comms.items():
                state[name]["clip_norm"] = self.remedy.last_unit_norms.get(comm)
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restores what `state_dict` returned on this worker.

        Args:
            state: the saved state, from the same model sharded the same way, registered
                with the same density and residual_dtype.

        Raises:
            OptionError (a ValueError): the saved units, density or residual dtype are not
                this model's.
        """
        if sorted(state) != sorted(self.comms):
            refuse("state", f"the units {sorted(self.comms)}", sorted(state),
                   "restore the state saved from this model, sharded the same way")
        for name, comm in self.comms.items():
            comm.load_state_dict(state[name])
            norm = state[name].get("clip_norm")
            if self.remedy is not None and norm is not None:
                self.remedy.last_unit_norms[comm] = norm.detach().clone()


def register(model: nn.Module, density: float, *, residual_dtype: torch.dtype = torch.float32,
             freeze_variance_after: int | None = None,
             optimizer: torch.optim.Optimizer | None = None,
             max_grad_norm: float | None = None) -> SparseFSDP:
    """Makes every FSDP unit of `model` reduce-scatter its gradients sparsely.

    Args:
        model: an FSDP2 model (its units and root through `fully_shard`) or an FSDP1 root
            (`FullyShardedDataParallel`, FULL_SHARD or SHARD_GRAD_OP); rules in the module
            docstring.
        density: k / S for each shard of each unit, in (0, 1] (`gtopk_hvd.density.shard_budget`).
        residual_dtype: torch.float32, or torch.bfloat16 to halve the residuals.
        freeze_variance_after: N dense AdamW steps before Adam's second moment is frozen
            (`gtopk_hvd.torch.fsdp_adamw`), or None. FSDP2 only.
        optimizer: the Adam or AdamW optimizer over the sharded parameters, with
            freeze_variance_after.
        max_grad_norm: each worker's clip of its own gradient in the remedy's sparse phase,
            unit by unit (`gtopk_hvd.torch.fsdp_adamw`), or None.

    Returns:
        The `SparseFSDP` holding each unit's comm (its residual, bytes and checkpoint); an
        empty one, with a warning, when the model is sharded over one worker (FSDP reduces
        nothing there).

    Raises:
        ValueError: an argument out of range (`OptionError`), or a model or unit the sparse
            reduce-scatter does not serve (module docstring, rule 2; no FSDP unit; an FSDP1
            model registered below its root; a float16 reduce dtype; more than one parameter
            group in a unit; a unit registered already), or max_grad_norm,
            freeze_variance_after and optimizer given other than together (with an Adam or
            AdamW that holds the sharded parameters, on FSDP2).
        TypeError: a model that holds FSDP1 units but is not their root.
        RuntimeError: FSDP2 without `set_custom_reduce_scatter` (torch < 2.9).
    """
    from torch.distributed.fsdp import FullyShardedDataParallel

    comm = SparseReduceScatter(density, residual_dtype)  # checks both before anything changes
    remedy = None
    if max_grad_norm is not None and freeze_variance_after is None:
        raise ValueError("gtopk_hvd.torch.fsdp.register: max_grad_norm is each worker's clip in "
                         "freeze_variance_after's sparse phase; without the remedy clip as "
                         "FSDP training does")
    if freeze_variance_after is not None or optimizer is not None:
        if freeze_variance_after is None or optimizer is None:
            raise ValueError("gtopk_hvd.torch.fsdp.register: freeze_variance_after=N and "
                             "optimizer=<the AdamW over the sharded model> go together")
        if isinstance(model, FullyShardedDataParallel):
            raise ValueError("gtopk_hvd.torch.fsdp.register: freeze_variance_after is offered "
                             "on FSDP2 (fully_shard); with FSDP1 leave it out, or move the "
                             "model to fully_shard")
        remedy = ShardedFrozenVariance(freeze_variance_after, max_grad_norm)
        remedy.attach(optimizer)  # checks the optimizer before the model changes
    try:
        if isinstance(model, FullyShardedDataParallel):
            comms = _register_fsdp1(model, comm)
        elif any(isinstance(module, FullyShardedDataParallel) for module in model.modules()):
            raise TypeError("gtopk_hvd.torch.fsdp.register: the model holds FSDP1 units "
                            "(FullyShardedDataParallel) but is not their root: register the "
                            "root")
        else:
            comms = _register_fsdp2(model, comm, optimizer)
    except Exception:
        if remedy is not None:
            remedy.detach()
        raise
    if not comms:  # one worker: FSDP reduces nothing, so nothing is made sparse
        warnings.warn("gtopk_hvd.torch.fsdp.register: the model is sharded over one worker, "
                      "where FSDP reduces no gradient: the sparse reduce-scatter (and "
                      "freeze_variance_after) stay off and training is FSDP's own", stacklevel=2)
        if remedy is not None:
            remedy.detach()
        return SparseFSDP({}, None)
    for unit in comms.values():
        unit.remedy = remedy
    if remedy is not None:
        remedy.units = list(comms.values())
    return SparseFSDP(comms, remedy)


def _copy(comm: SparseReduceScatter) -> SparseReduceScatter:
    return SparseReduceScatter(comm.density, comm.residual_dtype)


def _register_fsdp2(model: nn.Module, like: SparseReduceScatter,
                    optimizer: torch.optim.Optimizer | None
                    ) -> dict[str, SparseReduceScatter]:
    from torch.distributed.fsdp import FSDPModule

    if not hasattr(FSDPModule, "set_custom_reduce_scatter"):
        raise RuntimeError(f"gtopk_hvd.torch.fsdp.register needs FSDP2's custom reduce-scatter "
                           f"(FSDPModule.set_custom_reduce_scatter, torch >= 2.9); this is "
                           f"torch {torch.__version__}: upgrade torch")
    from torch.distributed.fsdp._fully_shard._fsdp_collectives import DefaultReduceScatter
    from torch.distributed.fsdp._fully_shard._fsdp_common import DDPMeshInfo

    units = [(name, module) for name, module in model.named_modules()
             if isinstance(module, FSDPModule)]
    if not units:
        raise ValueError("gtopk_hvd.torch.fsdp.register: the model has no FSDP module; call "
                         "torch.distributed.fsdp.fully_shard on its units and its root first")
    chosen: list[tuple[str, FSDPModule, Any]] = []
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
            if group.mp_policy.reduce_dtype == torch.float16:
                raise ValueError(
                    f"gtopk_hvd.torch.fsdp.register: unit {name or '<root>'} reduces in "
                    "float16, which FSDP pre-divides and whose sums can overflow after the "
                    "non-finite check: use MixedPrecisionPolicy(reduce_dtype=torch.bfloat16) "
                    "or float32")
        if len(groups) > 1:
            raise ValueError(f"gtopk_hvd.torch.fsdp.register: unit {name or '<root>'} has "
                             f"{len(groups)} parameter groups; one a unit is supported")
        if groups and groups[0].mesh_info.shard_mesh_size > 1:
            chosen.append((name, module, groups[0]))
    if optimizer is not None:
        held = {id(p) for group in optimizer.param_groups for p in group["params"]}
        missing = [name or "<root>" for name, _, group in chosen
                   if any(id(p) not in held for p, _ in unit_parameters(group))]
        if missing:
            raise ValueError(
                f"gtopk_hvd.torch.fsdp.register: the optimizer does not hold the sharded "
                f"parameters of units {missing[:5]}: build it from model.parameters() after "
                "fully_shard, whose parameters are the shards the remedy freezes")
    comms: dict[str, SparseReduceScatter] = {}
    for name, module, group in chosen:  # every check passed: nothing changed on a refusal
        comms[name] = _copy(like)
        comms[name].parameters = unit_parameters(group)
        module.set_custom_reduce_scatter(comms[name])
        module.set_force_sum_reduction_for_comms(True)
        module.set_reduce_scatter_unused_params(True, recurse=False)  # a fixed layout
    return comms


def _register_fsdp1(model: nn.Module, like: SparseReduceScatter
                    ) -> dict[str, SparseReduceScatter]:
    from torch.distributed.fsdp import FullyShardedDataParallel, ShardingStrategy

    units = [(name, module) for name, module in model.named_modules()
             if isinstance(module, FullyShardedDataParallel)]
    if not model.check_is_root():
        raise ValueError("gtopk_hvd.torch.fsdp.register: an FSDP1 model is registered at its "
                         "root FullyShardedDataParallel")
    if model.world_size == 1:
        return {}
    for name, unit in units:
        if unit.mixed_precision.reduce_dtype == torch.float16:
            raise ValueError(
                f"gtopk_hvd.torch.fsdp.register: unit {name or '<root>'} reduces in float16, "
                "whose sums can overflow after the non-finite check: use "
                "MixedPrecision(reduce_dtype=torch.bfloat16) or float32")
        strategy = unit.sharding_strategy
        if strategy not in (ShardingStrategy.FULL_SHARD, ShardingStrategy.SHARD_GRAD_OP):
            raise ValueError(
                f"gtopk_hvd.torch.fsdp.register: unit {name or '<root>'} uses {strategy.name}; "
                "the sparse reduce-scatter serves FULL_SHARD and SHARD_GRAD_OP (hybrid "
                "strategies all-reduce the shards densely across replicas; NO_SHARD is "
                "data parallel: use gtopk_hvd.torch.ddp's hook)")
        if unit._comm_hook is not None:
            raise ValueError(f"gtopk_hvd.torch.fsdp.register: unit {name or '<root>'} has a "
                             "communication hook already; register a model once")
    model.register_comm_hook((_copy(like), model.process_group), fsdp1_hook)
    comms: dict[str, SparseReduceScatter] = {}
    for name, unit in units:  # one comm (one residual) a unit, in the hook's state
        if unit._handle is None:
            continue
        comms[name] = _copy(like)
        unit._comm_hook_state = (comms[name], unit.process_group)
    return comms


def fsdp1_hook(state: tuple[SparseReduceScatter, Any], gradient: torch.Tensor,
               output: torch.Tensor) -> None:
    """FSDP1's communication hook for a sharded strategy: the unit's padded flat gradient into
    this worker's shard, summed sparsely, then divided by the world size.

    Args:
        state: (the unit's `SparseReduceScatter`, the unit's process group).
        gradient: the unit's padded flat gradient.
        output: this worker's shard, written in place.
    """
    comm, group = state
    comm.reduce(output, gradient, group)
    output.div_(group.size())


def full_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter of an FSDP2 model whole, its shards gathered (a collective: call it on
    every worker).

    Args:
        model: an FSDP2 model (`fully_shard`).

    Returns:
        {parameter name: a detached copy of the whole parameter}, the same on every worker.
    """
    return {name: (parameter.full_tensor() if hasattr(parameter, "full_tensor")
                   else parameter).detach().clone()
            for name, parameter in model.named_parameters()}
