"""Sparsified S-SGD with error feedback: one state object, one step function (framework-neutral).

One step on worker p, gradient g (flat float32, d values), k = ceil(density * d):

    [momentum correction: u = m u + g; g := u]
    acc = r + g                                        (r: this worker's residual)
    (I_p, V_p) = top-k of acc by |value|;  r = acc with the entries at I_p set to 0
    (I, V) = reduce((I_p, V_p)) over workers           (gTop-k or Top-k all-gather; V = sums)
    r[j] += V_p[j] for j in I_p not in I               (sent but not kept globally: back to r)
    [momentum correction: u[I_p] = 0]
    update = zero except V * scale at I                (scale = 1/P for Average, 1 for Sum)

The first three lines are one fused pass over d (`ops.accumulate_select`), which also clears
the gradient buffer when the caller asks (`clear_gradient`: the adapter's fused buffer is then
ready for the next backward without another pass). The gradient, the
residual and the velocity are numpy arrays, or torch tensors where the adapter keeps them (on
the gradients' GPU: then selection and residual updates run there, and only the k-entry sets
cross to the host for the reduction); `SparseState(zeros=...)` makes them.

Non-finite gradients: NaN and +-Inf rank above every number in the selection order, so a worker
with one always selects it, and it survives every merge (NaN + x = NaN, Inf + x = Inf or NaN).
The global set, identical on all workers, thus holds a non-finite value iff some worker had one,
and every worker raises the same FloatingPointError at the same step: no extra message, no hang,
no divergence. The residual then holds the non-finite values too: restore it from a checkpoint.
"""

from __future__ import annotations

import hashlib
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from gtopk_hvd import ops
from gtopk_hvd._arrays import as_index_dtype, concatenate, to_host_numpy
from gtopk_hvd.compression import SparseCompression
from gtopk_hvd.reduction import GTopkReducer, ReductionStats, SparseResult, topk_allgather
from gtopk_hvd.transport import Transport


@dataclass
class StepStats:
    """What the last step did on this worker (readable as `optimizer.last_stats`)."""

    step: int
    density: float
    k: int
    global_entries: int
    bytes_sent: int
    bytes_received: int
    select_seconds: float
    communicate_seconds: float
    merge_seconds: float
    write_seconds: float = 0.0  # the adapter's write-back of the update (zero + scatter)


class SparseState:
    """Residuals, momentum and step count of one distributed optimizer.

    sizes: the number of values of each parameter, in the fused order (the same on every worker).
    zeros: zeros(n) makes a float32 array of n zeros where the residual and velocity live
    (default: numpy on the host; e.g. torch.zeros on the gradients' device).
    """

    def __init__(self, compression: SparseCompression, sizes: list[int], transport: Transport,
                 average: bool = True, predivide: float = 1.0,
                 zeros: Callable[[int], Any] | None = None) -> None:
        if not sizes or sum(sizes) == 0:
            raise ValueError("the model has no parameters with gradients to compress")
        if predivide <= 0:
            raise ValueError(f"gradient_predivide_factor must be > 0, got {predivide}")
        self.compression = compression
        self.sizes = list(sizes)
        self.offsets = np.concatenate([[0], np.cumsum(self.sizes)]).astype(np.int64)
        self.d = int(self.offsets[-1])
        self.transport = transport
        self.average = average
        self.predivide = float(predivide)
        self.index_dtype = np.int32 if self.d < 2**31 else np.int64
        zeros = zeros or (lambda n: np.zeros(n, dtype=np.float32))
        self.residual = zeros(self.d)
        self.velocity = zeros(self.d) if compression.momentum_correction else None
        self.step_count = 0
        self.last_stats: StepStats | None = None
        self._reducers: dict[int, GTopkReducer] = {}

    # -- the k of a step ----------------------------------------------------------------------

    def k_at(self, step: int) -> int:
        density = self.compression.density_at(step)
        if self.compression.selection == "bucket":
            return sum(max(1, math.ceil(density * n)) for n in self.sizes if n)
        return max(1, math.ceil(density * self.d))

    # -- checkpoint ---------------------------------------------------------------------------

    def state_dict(self) -> dict:
        """residual (and velocity) as host numpy copies, and the step count."""
        state = {"residual": to_host_numpy(self.residual).copy(), "step": self.step_count}
        if self.velocity is not None:
            state["velocity"] = to_host_numpy(self.velocity).copy()
        return state

    def load_state_dict(self, state: dict) -> None:
        residual = np.asarray(to_host_numpy(state["residual"]), dtype=np.float32).reshape(-1)
        if residual.size != self.d:
            raise ValueError(f"checkpoint residual has {residual.size} values, model has {self.d}")
        _assign(self.residual, residual)
        if self.velocity is not None:
            if "velocity" not in state:
                raise ValueError("checkpoint has no momentum-correction velocity")
            _assign(self.velocity, np.asarray(to_host_numpy(state["velocity"]),
                                              dtype=np.float32).reshape(-1))
        self.step_count = int(state["step"])


def _assign(target: Any, values: np.ndarray) -> None:
    """target[:] = values, for a numpy target or a torch tensor on any device."""
    if isinstance(target, np.ndarray):
        target[:] = values
    else:
        import torch

        target.copy_(torch.from_numpy(values))


def check_same_on_all_workers(transport: Transport, description: str, signature: str) -> None:
    """Raises on every worker if `signature` (e.g. parameter names, shapes, dtypes and
    hyper-parameters) is not the same on all of them. One small all-gather."""
    digest = np.frombuffer(hashlib.sha256(signature.encode()).digest()[:8], dtype=np.int64)
    everyone = transport.allgather(digest)[:, 0]
    differing = [rank for rank, value in enumerate(everyone.tolist()) if value != everyone[0]]
    if differing:
        raise ValueError(
            f"gtopk_hvd: workers disagree on {description}: ranks {differing} differ from rank 0 "
            f"(this worker's is: {signature[:500]})")


def sparse_step(state: SparseState, gradient: Any,
                clear_gradient: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """One step (module docstring): the global (indices, values) to apply, values scaled.

    gradient: flat float32, d values, of the residual's type and device; read only, unless
    clear_gradient: then it is all zeros on return (cleared within the selection pass where
    possible). Updates the state's residual and velocity. Returns host numpy arrays (k entries
    at most): the indices may be a view of the reduction's buffers, valid until the next step.
    """
    compression = state.compression
    start = time.perf_counter()
    if state.predivide != 1.0:
        if clear_gradient:  # ours to change: divide in place (the same rounding as a / b)
            gradient /= np.float32(state.predivide)
        else:
            gradient = gradient / np.float32(state.predivide)
    clear_in_pass = clear_gradient
    if state.velocity is not None:
        state.velocity *= np.float32(compression.momentum)
        state.velocity += gradient
        if clear_gradient:
            gradient[:] = 0
        gradient, clear_in_pass = state.velocity, False
    local_indices, local_values = _select(state, gradient, clear_in_pass)
    select_seconds = time.perf_counter() - start

    result = _reduce(state, to_host_numpy(local_indices), to_host_numpy(local_values))
    if not np.isfinite(result.values).all():
        raise FloatingPointError(
            f"gtopk_hvd: non-finite gradient values (NaN or Inf) at step {state.step_count} on "
            "at least one worker; every worker raises here")
    ops.restore_residual(state.residual, local_indices, local_values, ~result.survived)
    if state.velocity is not None:
        state.velocity[local_indices] = 0.0

    scale = state.predivide / state.transport.size if state.average else state.predivide
    values = result.values * np.float32(scale) if scale != 1.0 else result.values
    stats: ReductionStats = result.stats
    state.last_stats = StepStats(
        step=state.step_count, density=compression.density_at(state.step_count),
        k=state.k_at(state.step_count), global_entries=int(result.indices.size),
        bytes_sent=stats.bytes_sent, bytes_received=stats.bytes_received,
        select_seconds=select_seconds, communicate_seconds=stats.comm_seconds,
        merge_seconds=stats.merge_seconds)
    state.step_count += 1
    return result.indices, values


def _select(state: SparseState, gradient: Any, clear_gradient: bool) -> tuple[Any, Any]:
    """Error-feedback selection: model-wide, or each parameter's own share."""
    density = state.compression.density_at(state.step_count)
    if state.compression.selection == "model":
        return ops.accumulate_select(gradient, state.residual, state.k_at(state.step_count),
                                     clear_gradient=clear_gradient)
    indices, values = [], []
    for begin, end in zip(state.offsets[:-1], state.offsets[1:]):
        if end == begin:
            continue
        k = max(1, math.ceil(density * (end - begin)))
        part_indices, part_values = ops.accumulate_select(
            gradient[begin:end], state.residual[begin:end], k, clear_gradient=clear_gradient)
        indices.append(as_index_dtype(part_indices, state.index_dtype) + int(begin))
        values.append(part_values)
    return concatenate(indices), concatenate(values)


def _reduce(state: SparseState, indices: np.ndarray, values: np.ndarray) -> SparseResult:
    if state.compression.scheme == "topk":
        return topk_allgather(indices, values, comm=state.transport)
    k = state.k_at(state.step_count)
    reducer = state._reducers.get(k)
    if reducer is None:  # one per k: the warm-up uses a few, then one for the rest
        reducer = state._reducers[k] = GTopkReducer(k, state.index_dtype,
                                                    state.compression.wire_dtype, state.transport)
    return reducer.allreduce(indices.astype(state.index_dtype, copy=False), values)
