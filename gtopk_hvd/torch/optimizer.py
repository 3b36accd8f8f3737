"""DistributedOptimizer for PyTorch: Horovod's arguments, gTop-k or Top-k sparsified gradients.

Like horovod.torch.DistributedOptimizer, the returned object is an instance of a subclass of the
wrapped optimizer's class that shares its param_groups. Dense choices (Compression.none / fp16)
are handed to Horovod's own DistributedOptimizer unchanged.

Sparse choices: gradients accumulate in `p.grad` over `backward_passes_per_step` backward passes;
`synchronize()` (called by `step()` unless inside `skip_synchronize()`) runs the sparse step
(selection with error feedback, the sparse all-reduce, the residual fix) on every parameter's
gradient fused into one flat float32 buffer in parameter order, and makes every `p.grad` the
resulting sparse update (zeros outside the selected entries), on every worker alike, so the
wrapped optimizer then makes identical updates everywhere.

No copies on the way: each float32 parameter's `p.grad` is a view of the fused buffer, so
backward accumulates into it in place, and the update is written into a second buffer that
`p.grad` then views (`gtopk_hvd/torch/fused.py`, which also says when a gradient is copied
instead: other dtypes or devices, a gradient the user replaced). `zero_grad()` keeps the views
and costs no pass over the gradients.

Loss scaling (torch.amp.GradScaler), Horovod's recipe: `scaler.scale(loss).backward();
optimizer.synchronize(); scaler.unscale_(optimizer); with optimizer.skip_synchronize():
scaler.step(optimizer); scaler.update()`. With the compression's default nonfinite="propagate", a
NaN/Inf on any worker makes every p.grad all NaN on every worker and leaves the residual as it
was (`gtopk_hvd.core.step`), so the scaler skips the step everywhere. Without a scaler (bfloat16
autocast, or float32): `step()` does not apply a step that the sparse step skipped: the wrapped
optimizer's step is not called (no parameter, moment or step count of it changes), `step()`
returns None, `last_stats.skipped` is True and `skipped_steps` counts it, on every worker alike.

Where the gradients live: when every parameter is on one CUDA device and gtopk_hvd was built
with its CUDA kernels, the fused buffer, the residual and the velocity live on that device; the
selection and the residual updates run there (`gtopk_hvd.ops` on the current stream), and only
the k selected (index, value) pairs go to the host for the reduction and the global set
comes back. Otherwise (CPU parameters; parameters on several devices; an extension built
without nvcc) everything lives in host memory, gradients copied there.

`transport=` chooses how the workers communicate (`gtopk_hvd.transports`; default: MPI over
mpi4py under an MPI launcher, else Horovod's own collectives; the workers must be Horovod's).

`hvd.broadcast_optimizer_state` creates the state of an optimizer whose state is empty by one
step with zero gradients, on the ranks where it is empty only (a rank that loaded a checkpoint
skips it). It recognises Horovod's own wrapper by its class's module and then calls the wrapped
optimizer's step, with no collective; our class declares that module too, so the same happens
here: no sparse step, no collective on some ranks only (which would hang), no warm-up step counted.

Adam and AdamW: `freeze_variance_after=N` runs N dense steps, then freezes Adam's second moment
and reduces the preconditioned gradient (`gtopk_hvd.torch.frozen_variance`); `synchronize()`
then leaves that reduced update in p.grad, and `step()` applies Adam's first moment and weight
decay to it itself (the wrapped optimizer's step is not called; its state is the one updated).
With the compression's `momentum_correction` (momentum = beta1) the first moment moves into the
exchange instead: each worker's velocity of the preconditioned gradient is what is sparsified,
as 1-bit Adam compresses its momentum.
Clip before `synchronize()` there (`optimizer.preconditioned` says when): after it p.grad is no
longer a gradient.

Horovod's other behaviours kept: `optimizer._parameter_names` ({parameter: name}, unnamed ones
`allreduce.noname.<group>.<index>`); `step()` after `synchronize()` outside
`skip_synchronize()` warns as Horovod does (Horovod then reduces the reduced gradients again;
here the update stands, since a second sparse step would feed it back as a gradient); a
parameter that stops requiring grad contributes zeros and still gets the reduced update.
Parameters that did not require grad when the optimizer was built are not in the fused layout:
if one requires grad later, `step()` raises NotImplementedError on every rank (Horovod leaves
its gradient unreduced, so replicas would diverge silently).
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import torch

from gtopk_hvd import ops
from gtopk_hvd.arguments import Arguments, parse_arguments
from gtopk_hvd.compression import Compression
from gtopk_hvd.core import SparseStep
from gtopk_hvd.core.elastic import follow_horovod
from gtopk_hvd.layout import FusedLayout, Source
from gtopk_hvd.torch.frozen_variance import FrozenVariance
from gtopk_hvd.torch.fused import FusedGradients
from gtopk_hvd.torch.join import register as register_for_join
from gtopk_hvd.transports import Transport, resolve_for_horovod


class _SparseDistributedOptimizer(torch.optim.Optimizer):
    def __init__(self, params: Any, named_parameters: Iterable[tuple[str, torch.Tensor]] | None,
                 arguments: Arguments, transport: Transport | str | None,
                 freeze_variance_after: int | None = None) -> None:
        super(self.__class__, self).__init__(params)
        import horovod.torch as hvd

        names = _parameter_names(self.param_groups, named_parameters)
        self._parameter_names = names
        parameters = [p for group in self.param_groups for p in group["params"]]
        self._parameters = [p for p in parameters if p.requires_grad]
        self._left_out = [p for p in parameters if not p.requires_grad]
        layout = FusedLayout([Source(names[p], tuple(p.shape), str(p.dtype),
                                     p.is_floating_point()) for p in self._parameters])
        self.backward_passes_per_step = arguments.passes
        self._device = _state_device(self._parameters)
        self._step_device = _step_device(self._device)
        self._hvd, self._transport_choice = hvd, transport
        options: dict = {"passes": arguments.passes}
        self._frozen = None
        if freeze_variance_after is not None:
            compression = arguments.compression
            self._frozen = FrozenVariance(
                self, self._parameters, freeze_variance_after,
                compression.momentum if compression.momentum_correction else None)
            options["freeze_variance_after"] = freeze_variance_after
        self._dense_step = False  # the last synchronize() was a dense start's step
        self._sparse = SparseStep(
            arguments.compression, layout.sizes, resolve_for_horovod(transport, hvd),
            average=arguments.average, predivide=arguments.predivide, device=self._step_device,
            layout=layout.signature, options=options)
        self._fused = FusedGradients(self._parameters, layout.offsets, self._device)
        self._synchronized = False
        self._should_synchronize = True
        self._skipped = False  # the last synchronize() was skipped for a NaN/Inf
        self.last_stats = None
        register_for_join(self)

    def synchronize(self) -> None:
        """Sparse all-reduce of the accumulated gradients; writes the update into p.grad."""
        self._check_no_parameter_joined()
        # Elastic Horovod: after a reset, the step over the new workers (core/elastic.py).
        self._sparse = follow_horovod(self._sparse, self._transport_choice, self._hvd)
        gradient = self._fused.gather()
        update = self._fused.update_buffer(gradient)
        self._dense_step = self._frozen is not None and self._frozen.dense
        if self._frozen is not None and not self._dense_step:
            self._frozen.precondition_(gradient)
        self._sparse.update(_step_array(gradient, self._step_device),
                            _step_array(update, self._step_device), clear_gradient=True,
                            dense=self._dense_step)
        self._fused.cleared(gradient)
        self._fused.expose_update(update)
        self.last_stats = self._sparse.last_stats
        self._skipped = self.last_stats.skipped
        self._synchronized = True

    def join(self) -> int:
        """Uneven data: takes part in the other workers' sparse steps with an empty
        contribution until every worker has joined; returns the rank that joined last
        (`gtopk_hvd.torch.join`, which `hvd.join()` calls). Gradients accumulated here and not
        yet synchronized are dropped; the model does not move (broadcast from the returned
        rank afterwards)."""
        self._fused.zero_grad(True)
        self._synchronized = self._skipped = False
        return self._sparse.join()

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Zero gradients; float32 ones stay views of the fused buffer (module docstring). Also
        ends the iteration: an update from a synchronize() whose step() never came (a loss
        scaler skipped it) is dropped, and the next step() synchronizes the new gradients."""
        self._fused.zero_grad(set_to_none)
        self._synchronized = self._skipped = False

    @contextmanager
    def skip_synchronize(self) -> Iterator[None]:
        """For `synchronize(); clip gradients; with skip_synchronize(): step()`."""
        self._should_synchronize = False
        try:
            yield
        finally:
            self._should_synchronize = True

    def _check_no_parameter_joined(self) -> None:
        """Raises before any collective if a parameter left out of the fused layout (it did not
        require grad at construction) requires grad now. requires_grad is set by the same code
        on every rank, so every rank raises at the same step."""
        joined = [self._parameter_names[p] for p in self._left_out if p.requires_grad]
        if joined:
            raise NotImplementedError(
                f"gtopk_hvd: parameters {joined[:10]} did not require grad when the "
                "DistributedOptimizer was built and do now; the fused layout is fixed at "
                "construction (Horovod would leave their gradients unreduced). Build the "
                "optimizer after setting requires_grad=True on every parameter that will train "
                "(one may stop requiring grad later), or build a new one.")

    @property
    def preconditioned(self) -> bool:
        """Whether the next synchronize() reduces Adam's preconditioned gradient
        (freeze_variance_after reached; module docstring): clip each worker's own gradient
        before it then, not p.grad after it."""
        return self._frozen is not None and not self._frozen.dense

    @property
    def skipped_steps(self) -> int:
        """Sparse steps skipped for a NaN/Inf on some worker (module docstring), in this
        process."""
        return self._sparse.skipped_steps

    def step(self, closure: Any = None) -> Any:
        """synchronize() unless already done or inside skip_synchronize(), then the wrapped
        optimizer's step on the update (or, after freeze_variance_after, the frozen rule's).

        Args:
            closure: as torch's `Optimizer.step`: reevaluates the model, returns the loss.

        Returns:
            The wrapped step's result (the closure's loss, or None); None, and no step, when
            the sparse step was skipped for a NaN/Inf (module docstring).
        """
        if self._should_synchronize:
            if self._synchronized:
                warnings.warn(
                    "optimizer.step() called without optimizer.skip_synchronize() context "
                    "after optimizer.synchronize(). Horovod would synchronize again (a "
                    "slowdown); gtopk_hvd applies the update of that synchronize() as it is. "
                    "Use the optimizer.skip_synchronize() context if you use "
                    "optimizer.synchronize() in your code.", stacklevel=2)
            else:
                self.synchronize()
        self._synchronized = False
        if self._skipped:
            self._skipped = False
            return None
        if self._frozen is not None and not self._dense_step:
            loss = None
            if closure is not None:
                with torch.enable_grad():
                    loss = closure()
            self._frozen.step()
            return loss
        return super(self.__class__, self).step(closure)

    def state_dict(self) -> dict:
        """The checkpoint: each worker saves its own, since residuals differ between workers.

        Returns:
            The wrapped optimizer's state dict, plus "gtopk": this worker's residual (and
            velocity) as tensors, the step count and the scheme's own state.
        """
        state = super(self.__class__, self).state_dict()
        state["gtopk"] = {key: torch.from_numpy(value) if isinstance(value, np.ndarray) else value
                          for key, value in self._sparse.state_dict().items()}
        return state

    def load_state_dict(self, state_dict: dict) -> None:
        """Restores what `state_dict` returned on this worker.

        Args:
            state_dict: the saved state; without "gtopk" (a plain optimizer's), only the
                wrapped optimizer's state is restored.
        """
        state_dict = dict(state_dict)
        sparse = state_dict.pop("gtopk", None)
        super(self.__class__, self).load_state_dict(state_dict)
        if self._frozen is not None:
            self._frozen.forget_scales()  # made again from the loaded second moment
        if sparse is not None:
            self._sparse.load_state_dict(sparse)  # tensors on any device, or numpy arrays


def _step_device(device: torch.device) -> torch.device | None:
    """Where the sparse step keeps the residual and velocity: on the parameters' GPU in torch
    tensors, or None: in numpy arrays on the host, where the step then runs on numpy views of
    the CPU buffers (one array type inside it)."""
    return device if device.type == "cuda" else None


def _step_array(buffer: torch.Tensor, step_device: torch.device | None) -> Any:
    """A fused buffer as the step takes it: the tensor itself for a step on a device, else a
    numpy array sharing its memory."""
    return buffer if step_device is not None else buffer.numpy()


def _state_device(parameters: list[torch.Tensor]) -> torch.device:
    """The parameters' CUDA device when all share one and the CUDA kernels are built; else the
    CPU."""
    devices = {p.device for p in parameters}
    if len(devices) == 1:
        (device,) = devices
        if device.type == "cuda" and ops.cuda_built:
            return device
    return torch.device("cpu")


def _parameter_names(param_groups: list[dict],
                     named_parameters: Iterable[tuple[str, torch.Tensor]] | None
                     ) -> dict[torch.Tensor, str]:
    """{parameter: name} as Horovod's `_parameter_names`: the given names, checked, or
    `allreduce.noname.<group>.<index>`."""
    if named_parameters is None:
        return {p: f"allreduce.noname.{i}.{j}" for i, group in enumerate(param_groups)
                for j, p in enumerate(group["params"])}
    parameters = [p for group in param_groups for p in group["params"]]
    named = list(named_parameters)
    if any(not isinstance(item, tuple) or len(item) != 2 for item in named):
        raise ValueError("named_parameters should be a sequence of (name, parameter) tuples, "
                         "usually model.named_parameters()")
    names = [name for name, _ in named]
    duplicates = sorted({name for name in names if names.count(name) > 1})
    if duplicates:
        raise ValueError(f"parameter names in named_parameters must be unique: {duplicates}")
    by_parameter = {p: name for name, p in named}
    unnamed = [i for i, p in enumerate(parameters) if p not in by_parameter]
    if unnamed:
        raise ValueError(f"named_parameters was given but the optimizer's parameters at "
                         f"positions {unnamed} are not in it")
    return by_parameter


def DistributedOptimizer(  # noqa: N802 - Horovod's name
    optimizer: torch.optim.Optimizer,
    named_parameters: Iterable[tuple[str, torch.Tensor]] | None = None,
    compression: Any = Compression.none,
    backward_passes_per_step: int = 1,
    op: Any = None,
    gradient_predivide_factor: float = 1.0,
    num_groups: int = 0,
    groups: Any = None,
    sparse_as_dense: bool = False,
    process_set: Any = None,
    *,
    transport: Transport | str | None = None,
    freeze_variance_after: int | None = None,
) -> torch.optim.Optimizer:
    """horovod.torch.DistributedOptimizer with gtopk_hvd's Compression choices.

    Args:
        optimizer: the torch optimizer to wrap; the result shares its param_groups.
        named_parameters: (name, parameter) pairs, usually `model.named_parameters()`, each
            of the optimizer's parameters once; None: `allreduce.noname.<group>.<index>`.
        compression: a sparse choice (`Compression.gtopk(density)`, `.topk`, `.micro`, ...:
            the module docstring's sparse step), or Compression.none / .fp16 (gtopk_hvd's or
            Horovod's): Horovod's own DistributedOptimizer, dense.
        backward_passes_per_step: backward passes accumulated in `p.grad` before each
            reduction, >= 1.
        op: Horovod's Average (None: the default) or Sum.
        gradient_predivide_factor: Horovod's; other than 1.0 with Average only.
        num_groups: Horovod's; with a sparse compression 0 only (every gradient is fused into
            one selection).
        groups: Horovod's; with a sparse compression None only.
        sparse_as_dense: Horovod's, for a dense compression.
        process_set: Horovod's; with a sparse compression the global one only.
        transport: how the sparse reduction communicates (module docstring;
            `gtopk_hvd.transports`).
        freeze_variance_after: N (Adam or AdamW, a sparse compression): N dense steps, then
            Adam's second moment frozen and the preconditioned gradient reduced
            (`gtopk_hvd.torch.frozen_variance`; docs/adamw.md); with the compression's
            momentum_correction (its momentum Adam's beta1) Adam's first moment moves into the
            exchange. None: off.

    Returns:
        An instance of a subclass of the optimizer's class, sharing its param_groups, whose
        `step()` reduces the gradients first (module docstring); for a dense compression,
        Horovod's own DistributedOptimizer.

    Raises:
        NotImplementedError: with a sparse compression, num_groups / groups, a process set
            other than the global one, or an op other than Average or Sum.
        ValueError: an argument out of range or of the wrong type (`gtopk_hvd.options`), bad
            named_parameters, gradient_predivide_factor with op Sum, freeze_variance_after
            with a dense compression or an optimizer the rule does not cover.
    """
    import horovod.torch as hvd

    arguments = parse_arguments(hvd, compression, op, gradient_predivide_factor, num_groups,
                                groups, process_set, backward_passes_per_step,
                                dense_by_horovod=True)
    if not arguments.sparse:
        if freeze_variance_after is not None:
            raise ValueError("freeze_variance_after is for sparse compressions; a dense one "
                             "reduces the whole gradient anyway")
        return hvd.DistributedOptimizer(
            optimizer, named_parameters=named_parameters,
            compression=hvd.Compression.fp16 if arguments.compression.name == "fp16"
            else hvd.Compression.none,
            backward_passes_per_step=backward_passes_per_step, op=arguments.op,
            gradient_predivide_factor=gradient_predivide_factor, num_groups=num_groups,
            groups=groups, sparse_as_dense=sparse_as_dense, process_set=arguments.process_set)
    from horovod.torch.optimizer import DistributedOptimizer as HorovodDistributedOptimizer

    namespace = dict(_SparseDistributedOptimizer.__dict__)
    # hvd.broadcast_optimizer_state tells Horovod's wrapper by this (module docstring).
    namespace["__module__"] = HorovodDistributedOptimizer.__module__
    cls = type(optimizer.__class__.__name__, (optimizer.__class__,), namespace)
    return cls(optimizer.param_groups, named_parameters, arguments, transport,
               freeze_variance_after)
