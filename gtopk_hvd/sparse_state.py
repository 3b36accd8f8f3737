"""Sparsified S-SGD with error feedback: one state object, one step function (framework-neutral).

One step on worker p, gradient g (flat float32, d values), k = ceil(density * d):

    [momentum correction: u = m u + g; g := u]
    acc = r + g                                        (r: this worker's residual)
    (I_p, V_p) = select(acc, k);  r = acc with the entries at I_p set to 0
    (I, V) = reduce((I_p, V_p)) over workers           (V: sums over workers)
    r[j] += V_p[j] for j in I_p not in I               (sent but not kept globally: back to r)
    [momentum correction: u[I_p] = 0]
    update = zero except V * scale at I                (scale = 1/P for Average, 1 for Sum)

`select` is the compression's sparsifier (`gtopk_hvd.sparsifiers`: top-k by |value|, random-k,
...) and `reduce` its reduction (`gtopk_hvd.reductions`: gTop-k, Top-k's all-gather, ...), both
chosen by name. The first step also checks, with one small all-gather, that every worker has the
same layout and compression (`signature`): an error on every worker otherwise.

For top-k the first three lines are one fused pass over d (`ops.accumulate_select`), which
also clears the gradient buffer when the caller asks (`clear_gradient`: the adapter's fused
buffer is then ready for the next backward without another pass). The gradient, the
residual and the velocity are numpy arrays, or torch tensors where the adapter keeps them (on
the gradients' GPU: then selection and residual updates run there, and only the k-entry sets
cross to the host for the reduction); `SparseState(zeros=...)` makes them.

Non-finite gradients (a NaN or Inf on any worker), by the compression's `nonfinite` rule:

- "propagate" (the default): before anything else, each worker reads its gradient once
  (`ops.all_finite`, the read-only floor pass) and one all-reduce of one integer counts the
  workers whose gradient is not finite (`nonfinite_workers`). If any is, the step is skipped on
  every worker alike: the update is all NaN (so a loss scaler, torch.amp's GradScaler or Keras'
  LossScaleOptimizer, sees a non-finite gradient everywhere, skips the optimizer step and lowers
  its scale), the residual, the velocity and the step count (so the warm-up) stay bit-equal to
  what they were before the step, the gradient is cleared if the caller asked for it, and
  `last_stats.skipped` is True. Nothing is poisoned and nothing is lost: the next step starts
  from the same residual. The default because loss scaling overflows by design (the first steps,
  and whenever the scale grows), and it is what Horovod's dense allreduce does as far as a
  scaler can tell. Cost: one read of the gradient (`last_stats.check_seconds`) and one
  all-reduce of one integer, which waits for the last worker to arrive and so counts in
  `wait_seconds` (the reductions' own probes then find everyone ready). A worker cannot skip on
  its own: the others have already changed their residuals by the time the reduction would tell
  them, hence the count first.
- "raise": no check before the step. NaN and +-Inf rank above every number in the selection
  order, so a worker with one always selects it, and it survives every merge (NaN + x = NaN,
  Inf + x = Inf or NaN): the global set, identical on all workers, holds a non-finite value iff
  some worker had one, and every worker raises the same FloatingPointError at the same step (no
  extra message, no hang, no divergence). The residual then holds the non-finite values: restore
  it from a checkpoint. A sparsifier that ignores magnitude (random-k) keeps a non-finite value in
  the residual until it draws its index; the sum then carries it to every worker alike, and all
  raise at that step.

Under loss scaling the residual holds gradients in the scale of the step that made them; a scale
change (x0.5 after an overflow, x2 after a run of good steps) applies the residual's older mass
at most 2x off once, which error feedback then absorbs like any other delay.
"""

from __future__ import annotations

import hashlib
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from gtopk_hvd import ops
from gtopk_hvd._arrays import as_index_dtype, concatenate, to_host_numpy
from gtopk_hvd.arguments import warn_if_density_needs_warmup
from gtopk_hvd.compression import SparseCompression
from gtopk_hvd.reductions import REDUCTIONS, ReductionStats
from gtopk_hvd.reductions.wait_probe import resolve_wait_probe
from gtopk_hvd.sparsifiers import SPARSIFIERS
from gtopk_hvd.transports import Transport, check_matches_horovod, resolve_transport


@dataclass
class StepStats:
    """What the last step did on this worker (readable as `optimizer.last_stats`).

    How to read the communication time: communicate_seconds = wait_seconds + transfer_seconds.
    Before each data exchange of the reduction the workers swap an empty message with the same
    partner(s) (`gtopk_hvd.reductions.wait_probe`):

    - wait_seconds: time until the partners were ready. gTop-k: each round's partner (who may
      itself have waited for its own partner in an earlier round); Top-k's all-gather and the
      dense / shared-index all-reduce: the slowest worker. It includes one small-message latency
      per exchange (tens of microseconds on one host). Large on some workers, small on one: that
      one is the straggler (a slower worker, a late step, a data loader), not the network.
    - transfer_seconds: time of the data exchanges, started with every partner ready: the link's
      share (bandwidth, latency). Large on every worker: the network (or k) is the cost.

    The probe is on by default over MPI and off over Horovod's collectives and torch.distributed
    (there each probe is one more negotiated operation, +10-40% at k = 25k);
    GTOPK_HVD_WAIT_PROBE=1 / 0 forces it on / off on every worker. Without it wait_seconds is 0
    and transfer_seconds holds the whole communication, waits included (Top-k's all-gather
    splits either way: its all-gather of set sizes is the probe). A registered reduction that
    does not fill the split reports both as 0. merge_seconds (gTop-k's merges) is in neither.
    """

    step: int
    density: float
    k: int
    global_entries: int
    bytes_sent: int
    bytes_received: int
    select_seconds: float
    communicate_seconds: float  # = wait_seconds + transfer_seconds
    merge_seconds: float
    write_seconds: float = 0.0  # the adapter's write-back of the update (zero + scatter)
    wait_seconds: float = 0.0  # until the partners (or the slowest worker) were ready
    transfer_seconds: float = 0.0  # the data exchanges themselves
    check_seconds: float = 0.0  # nonfinite="propagate": the finiteness read (its count: a wait)
    skipped: bool = False  # a worker's gradient was not finite: no reduction, update all NaN


class SparseState:
    """Residuals, momentum and step count of one distributed optimizer.

    sizes: the number of values of each parameter, in the fused order (the same on every worker).
    transport: a Transport, a registered name, or None (`gtopk_hvd.transports`: MPI when an
    MPI launcher started the job, else Horovod's collectives when `horovod` is given).
    zeros: zeros(n) makes a float32 array of n zeros where the residual and velocity live
    (default: numpy on the host; e.g. torch.zeros on the gradients' device).
    signature: what else every worker must agree on (the layout's names, shapes and dtypes, the
    adapter's options); checked with the sizes and compression at the first step.
    horovod: the adapter's Horovod module, if any: the transport must then have its workers.
    what: what the sources are called in errors ("parameter", "source").
    A density below `arguments.WARMUP_DENSITY_THRESHOLD` without a warm-up or momentum
    correction warns once per process (`arguments.warn_if_density_needs_warmup`).
    """

    def __init__(self, compression: SparseCompression, sizes: Sequence[int],
                 transport: Transport | str | None = None, average: bool = True,
                 predivide: float = 1.0, zeros: Callable[[int], Any] | None = None,
                 signature: str = "", horovod: Any = None, what: str = "parameter") -> None:
        if not sizes or sum(sizes) == 0:
            raise ValueError("the model has no parameters with gradients to compress")
        if predivide <= 0:
            raise ValueError(f"gradient_predivide_factor must be > 0, got {predivide}")
        warn_if_density_needs_warmup(compression)
        self.compression = compression
        self.sizes = list(sizes)
        self.offsets = np.concatenate([[0], np.cumsum(self.sizes)]).astype(np.int64)
        self.d = int(self.offsets[-1])
        self.transport = resolve_transport(transport, horovod)
        if horovod is not None:
            check_matches_horovod(self.transport, horovod.rank(), horovod.size())
        self.average = average
        self.predivide = float(predivide)
        self.index_dtype = np.dtype(ops.index_dtype_for(self.d))
        zeros = zeros or (lambda n: np.zeros(n, dtype=np.float32))
        self.residual = zeros(self.d)
        self.velocity = zeros(self.d) if compression.momentum_correction else None
        self.sparsifier = SPARSIFIERS.get(compression.sparsifier)(compression)
        self.reduction = REDUCTIONS.get(compression.reduction)(
            self.transport, self.index_dtype, compression.wire_dtype)
        self.what = what
        self.signature = (f"{signature}|sizes={self.sizes}|{compression}|average={average}"
                          f"|predivide={self.predivide}"
                          f"|wait_probe={resolve_wait_probe(None, self.transport)}")
        self.step_count = 0
        self.skipped_steps = 0  # steps skipped for a non-finite gradient (not checkpointed)
        self.last_stats: StepStats | None = None
        self._workers_agree = False

    # -- the k of a step ----------------------------------------------------------------------

    def k_at(self, step: int) -> int:
        density = self.compression.density_at(step)
        if self.compression.granularity == "bucket":
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


def nonfinite_workers(transport: Transport, gradients: Sequence[Any]) -> int:
    """How many workers hold a NaN or Inf in any of `gradients` (numpy arrays or torch tensors):
    one read of each and one all-reduce of one integer, so the same count on every worker. Every
    worker must call it at the same point, with any number of gradients."""
    return count_workers(transport, any(not ops.all_finite(g) for g in gradients))


def count_workers(transport: Transport, flag: bool) -> int:
    """How many workers pass flag=True: one all-reduce of one integer (none at P = 1)."""
    count = np.array([int(flag)], dtype=np.int32)
    if transport.size > 1:
        transport.allreduce_sum(count)
    return int(count[0])


def sparse_step(state: SparseState, gradient: Any, clear_gradient: bool = False,
                skip: bool | None = None) -> tuple[np.ndarray, np.ndarray] | None:
    """One step (module docstring): the global (indices, values) to apply, values scaled; None
    for a step skipped for a non-finite gradient (nonfinite="propagate").

    gradient: flat float32, d values, of the residual's type and device; read only, unless
    clear_gradient: then it is all zeros on return (cleared within the selection pass where
    possible). Updates the state's residual and velocity. Returns host numpy arrays (k entries
    at most): the indices may be a view of the reduction's buffers, valid until the next step.
    skip: None: the compression's rule decides (the check costs one all-reduce); True / False:
    the caller has already counted the non-finite workers for several steps at once (the DDP
    hook, one count per iteration over all buckets) and says whether to skip this one.
    """
    if not state._workers_agree:
        check_same_on_all_workers(
            state.transport, f"{state.what} names, shapes, dtypes and compression",
            state.signature)
        state._workers_agree = True
    compression = state.compression
    check_seconds = check_wait_seconds = 0.0
    if skip is None and compression.nonfinite == "propagate":
        start = time.perf_counter()
        local = not ops.all_finite(gradient)
        read = time.perf_counter()
        skip = count_workers(state.transport, local) > 0
        # The count waits for the last worker to arrive: a wait, as the reductions' probes.
        check_seconds, check_wait_seconds = read - start, time.perf_counter() - read
    if skip:
        return _skip(state, gradient, clear_gradient, check_seconds, check_wait_seconds)
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

    result = state.reduction.reduce(to_host_numpy(local_indices), to_host_numpy(local_values),
                                    state.k_at(state.step_count))
    if compression.nonfinite == "raise" and not np.isfinite(result.values).all():
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
        select_seconds=select_seconds,
        communicate_seconds=stats.comm_seconds + check_wait_seconds,
        merge_seconds=stats.merge_seconds, wait_seconds=stats.wait_seconds + check_wait_seconds,
        transfer_seconds=stats.transfer_seconds, check_seconds=check_seconds)
    state.step_count += 1
    return result.indices, values


def _skip(state: SparseState, gradient: Any, clear_gradient: bool, check_seconds: float,
          check_wait_seconds: float) -> None:
    """A step skipped for a non-finite gradient: nothing of the state changes but the count of
    skipped steps; the gradient is cleared if asked."""
    if clear_gradient:
        gradient[:] = 0
    state.skipped_steps += 1
    state.last_stats = StepStats(
        step=state.step_count, density=state.compression.density_at(state.step_count),
        k=state.k_at(state.step_count), global_entries=0, bytes_sent=0, bytes_received=0,
        select_seconds=0.0, communicate_seconds=check_wait_seconds, merge_seconds=0.0,
        wait_seconds=check_wait_seconds, check_seconds=check_seconds, skipped=True)
    return None


def sparse_update(state: SparseState, gradient: Any, out: Any,
                  clear_gradient: bool = False, skip: bool | None = None) -> Any:
    """One step (`sparse_step`), its global set written into `out` as the dense update:
    out = zeros(d), out[I] = scaled V; all NaN for a skipped step. out: d float32 values of the
    gradient's type and device (a host numpy array for a CPU state). Times the write as
    last_stats.write_seconds. skip: as `sparse_step`'s."""
    result = sparse_step(state, gradient, clear_gradient, skip)
    start = time.perf_counter()
    if result is None:
        out[:] = np.float32(np.nan)
    else:
        ops.write_sparse(out, *result)
    state.last_stats.write_seconds = time.perf_counter() - start
    return out


def _select(state: SparseState, gradient: Any, clear_gradient: bool) -> tuple[Any, Any]:
    """Error-feedback selection by the sparsifier: model-wide, or each parameter's own share."""
    step = state.step_count
    if state.compression.granularity == "model":
        indices, values = state.sparsifier.select(gradient, state.residual, state.k_at(step),
                                                  clear_gradient, step, 0)
        return as_index_dtype(indices, state.index_dtype), values
    density = state.compression.density_at(step)
    indices, values = [], []
    for part, (begin, end) in enumerate(zip(state.offsets[:-1], state.offsets[1:])):
        if end == begin:
            continue
        k = max(1, math.ceil(density * (end - begin)))
        part_indices, part_values = state.sparsifier.select(
            gradient[begin:end], state.residual[begin:end], k, clear_gradient, step, part)
        indices.append(as_index_dtype(part_indices, state.index_dtype) + int(begin))
        values.append(part_values)
    return concatenate(indices), concatenate(values)
