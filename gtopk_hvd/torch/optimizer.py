"""DistributedOptimizer for PyTorch: Horovod's arguments, gTop-k or Top-k sparsified gradients.

Like horovod.torch.DistributedOptimizer, the returned object is an instance of a subclass of the
wrapped optimizer's class that shares its param_groups. Dense choices (Compression.none / fp16)
are handed to Horovod's own DistributedOptimizer unchanged.

Sparse choices: gradients accumulate in `p.grad` over `backward_passes_per_step` backward passes;
`synchronize()` (called by `step()` unless inside `skip_synchronize()`) runs `sparse_step`
(selection with error feedback, the sparse all-reduce, the residual fix) on every parameter's
gradient fused into one flat float32 buffer in parameter order, and makes every `p.grad` the
resulting sparse update (zeros outside the selected entries), on every worker alike, so the
wrapped optimizer then makes identical updates everywhere.

No copies on the way: each float32 parameter's `p.grad` is a view of the fused buffer, so
backward accumulates into it in place, and the update is written into a second buffer that
`p.grad` then views (`gtopk_hvd/torch/fused.py`, which also says when a gradient is copied
instead: other dtypes or devices, a gradient the user replaced). `zero_grad()` keeps the views
and costs no pass over the gradients.

Where the gradients live: when every parameter is on one CUDA device and gtopk_hvd was built
with its CUDA kernels, the fused buffer, the residual and the velocity live on that device; the
selection and the residual updates run there (`gtopk_hvd.ops` on the current stream), and only
the k selected (index, value) pairs go to the host for the MPI reduction and the global set
comes back. Otherwise (CPU parameters; parameters on several devices; an extension built
without nvcc) everything lives in host memory, gradients copied there.

`hvd.broadcast_optimizer_state` creates a new optimizer's state by calling `step()` once with
zero gradients; here that is one sparse step with zero gradients: it changes no parameter and no
residual, and counts as a step of the density warm-up.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import torch

from gtopk_hvd import ops
from gtopk_hvd.compression import (
    Compression,
    DenseCompression,
    SparseCompression,
    check_sparse_arguments,
)
from gtopk_hvd.sparse_state import SparseState, check_same_on_all_workers, sparse_step
from gtopk_hvd.torch.fused import FusedGradients
from gtopk_hvd.transport import check_matches_horovod, default_transport


class _SparseDistributedOptimizer(torch.optim.Optimizer):
    def __init__(self, params: Any, named_parameters: Iterable[tuple[str, torch.Tensor]] | None,
                 compression: SparseCompression, backward_passes_per_step: int, average: bool,
                 gradient_predivide_factor: float) -> None:
        super(self.__class__, self).__init__(params)
        import horovod.torch as hvd

        parameters = [p for group in self.param_groups for p in group["params"]]
        names = _parameter_names(parameters, named_parameters)
        self._parameters = [p for p in parameters if p.requires_grad]
        self._names = [names[p] for p in self._parameters]
        for parameter, name in zip(self._parameters, self._names):
            if not parameter.is_floating_point():
                raise ValueError(f"parameter {name!r} has dtype {parameter.dtype}; gradients "
                                 "can only be compressed for floating-point parameters")
        transport = default_transport()
        check_matches_horovod(transport, hvd.rank(), hvd.size())
        self.backward_passes_per_step = backward_passes_per_step
        self._device = _state_device(self._parameters)

        def zeros_on_gpu(n: int) -> torch.Tensor:
            return torch.zeros(n, dtype=torch.float32, device=self._device)

        # Residual and velocity: numpy on the CPU (as the step's buffers are there), else torch.
        self._sparse = SparseState(compression, [p.numel() for p in self._parameters], transport,
                                   average=average, predivide=gradient_predivide_factor,
                                   zeros=zeros_on_gpu if self._device.type == "cuda" else None)
        self._fused = FusedGradients(self._parameters, self._sparse.offsets.tolist(),
                                     self._device)
        self._signature = ";".join(
            f"{name}:{tuple(p.shape)}:{p.dtype}" for name, p in zip(self._names, self._parameters)
        ) + f"|{compression}|bpps={backward_passes_per_step}|average={average}"
        self._checked_workers_agree = False
        self._synchronized = False
        self._should_synchronize = True
        self.last_stats = None

    def synchronize(self) -> None:
        """Sparse all-reduce of the accumulated gradients; writes the update into p.grad."""
        if not self._checked_workers_agree:
            check_same_on_all_workers(self._sparse.transport,
                                      "parameter names, shapes, dtypes and compression",
                                      self._signature)
            self._checked_workers_agree = True
        gradient = self._fused.gather()
        # On the CPU the step runs on numpy views of the buffers: one array type inside it.
        indices, values = sparse_step(self._sparse, _host_view(gradient), clear_gradient=True)
        self._fused.cleared(gradient)
        start = time.perf_counter()
        update = self._fused.update_buffer(gradient)
        ops.write_sparse(_host_view(update), indices, values)
        self._fused.expose_update(update)
        self.last_stats = self._sparse.last_stats
        self.last_stats.write_seconds = time.perf_counter() - start
        self._synchronized = True

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Zero gradients; float32 ones stay views of the fused buffer (module docstring)."""
        self._fused.zero_grad(set_to_none)

    @contextmanager
    def skip_synchronize(self) -> Iterator[None]:
        """For `synchronize(); clip gradients; with skip_synchronize(): step()`."""
        self._should_synchronize = False
        try:
            yield
        finally:
            self._should_synchronize = True

    def step(self, closure: Any = None) -> Any:
        if self._should_synchronize and not self._synchronized:
            self.synchronize()
        self._synchronized = False
        return super(self.__class__, self).step(closure)

    def state_dict(self) -> dict:
        """The wrapped optimizer's state plus this worker's residual (and velocity): each worker
        saves its own, since residuals differ between workers."""
        state = super(self.__class__, self).state_dict()
        state["gtopk"] = {key: torch.from_numpy(value) if isinstance(value, np.ndarray) else value
                          for key, value in self._sparse.state_dict().items()}
        return state

    def load_state_dict(self, state_dict: dict) -> None:
        state_dict = dict(state_dict)
        sparse = state_dict.pop("gtopk", None)
        super(self.__class__, self).load_state_dict(state_dict)
        if sparse is not None:
            self._sparse.load_state_dict(sparse)  # tensors on any device, or numpy arrays


def _host_view(buffer: torch.Tensor) -> Any:
    """A CPU buffer as a numpy array sharing its memory; a GPU buffer as it is."""
    return buffer if buffer.is_cuda else buffer.numpy()


def _state_device(parameters: list[torch.Tensor]) -> torch.device:
    """The parameters' CUDA device when all share one and the CUDA kernels are built; else the
    CPU."""
    devices = {p.device for p in parameters}
    if len(devices) == 1:
        (device,) = devices
        if device.type == "cuda" and ops.cuda_built:
            return device
    return torch.device("cpu")


def _parameter_names(parameters: list[torch.Tensor],
                     named_parameters: Iterable[tuple[str, torch.Tensor]] | None
                     ) -> dict[torch.Tensor, str]:
    if named_parameters is None:
        return {p: f"allreduce.noname.{i}" for i, p in enumerate(parameters)}
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
) -> torch.optim.Optimizer:
    """horovod.torch.DistributedOptimizer with gtopk_hvd's Compression choices.

    compression=Compression.gtopk(density) or .topk(density): sparsified gradients (module
    docstring); Compression.none / .fp16: Horovod's own dense allreduce. The other arguments are
    Horovod's. With a sparse compression, num_groups / groups and process sets other than the
    global one raise NotImplementedError (all gradients are fused into one selection); op may be
    Average or Sum.
    """
    import horovod.torch as hvd

    if op is None:
        op = hvd.Average
    if process_set is None:
        process_set = hvd.global_process_set
    if isinstance(compression, DenseCompression):
        return hvd.DistributedOptimizer(
            optimizer, named_parameters=named_parameters,
            compression=hvd.Compression.fp16 if compression.name == "fp16"
            else hvd.Compression.none,
            backward_passes_per_step=backward_passes_per_step, op=op,
            gradient_predivide_factor=gradient_predivide_factor, num_groups=num_groups,
            groups=groups, sparse_as_dense=sparse_as_dense, process_set=process_set)
    average = check_sparse_arguments(hvd, compression, op, gradient_predivide_factor,
                                     num_groups, groups, process_set)
    if not isinstance(backward_passes_per_step, int) or backward_passes_per_step < 1:
        raise ValueError(f"backward_passes_per_step must be an integer >= 1, "
                         f"got {backward_passes_per_step!r}")
    cls = type(optimizer.__class__.__name__, (optimizer.__class__,),
               dict(_SparseDistributedOptimizer.__dict__))
    return cls(optimizer.param_groups, named_parameters, compression, backward_passes_per_step,
               average, gradient_predivide_factor)
