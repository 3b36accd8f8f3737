"""Sparsified S-SGD with error feedback: one step object (`SparseStep`), framework-neutral.

One step on worker p, gradient g (flat float32, d values), k from the density schedule
(`gtopk_hvd.density`):

    [predivide: g := g / f]
    [momentum correction: u = m u + g; g := u]
    (I, V) = scheme.exchange(g, r, k)            (r: this worker's residual; `gtopk_hvd.schemes`)
    [momentum correction: u = 0 where this worker's residual was taken]
    update = zero except V * scale at I          (scale = f/P for Average, f for Sum)

The scheme is chosen by name (`config.scheme`: "select-reduce", Top-k / gTop-k / random-k by a
registered sparsifier and reduction, by default). The step owns what every scheme shares: the
array backend (chosen once: numpy on the host, or torch tensors on `device`), the agreement
check (the first step checks, with one small all-gather, that every worker has the same layout,
configuration and options, and keeps its state in the same kind of arrays (a reduction on the
device and one on the host exchange different messages), and takes the largest step count of
the workers: `gtopk_hvd.core.agreement`), the non-finite rule, the budget k,
scaling and the stats. It imports no framework and no Horovod: adapters fuse their gradients
into one flat vector, call `update` (or run `phases`), split the result back, and check their own
framework's ranks.

The gradient, the residual and the velocity are of the backend's type; `clear_gradient` lets
the step clear the caller's buffer (within the selection pass where the scheme can), so a fused
buffer is ready for the next backward without another pass.

Non-finite gradients (a NaN or Inf on any worker), by the configuration's `nonfinite` rule:

- "propagate" (the default): before anything else, each worker reads its gradient once
  (`ops.all_finite`, the read-only floor pass) and one all-reduce of one integer counts the
  workers whose gradient is not finite (`count_workers`). If any is, the step is skipped on
  every worker alike: the update is all NaN (so a loss scaler, torch.amp's GradScaler or Keras'
  LossScaleOptimizer, sees a non-finite gradient everywhere, skips the optimizer step and lowers
  its scale), the residual, the velocity and the step count (so the warm-up) stay bit-equal to
  what they were before the step, the gradient is cleared if the caller asked for it, and
  `last_stats.skipped` is True. Nothing is poisoned and nothing is lost. The default because
  loss scaling overflows by design, and it is what Horovod's dense allreduce does as far as a
  scaler can tell. Cost: one read of the gradient (`last_stats.check_seconds`) and one
  all-reduce of one integer, which waits for the last worker to arrive and so counts in
  `wait_seconds`. A worker cannot skip on its own: the others have already changed their
  residuals by the time the exchange would tell them, hence the count first.
- "raise": no check before the step. NaN and +-Inf rank above every number in the selection
  order, so a worker with one always selects it, and it survives every merge (NaN + x = NaN,
  Inf + x = Inf or NaN): the global set, identical on all workers, holds a non-finite value iff
  some worker had one, and every worker raises the same FloatingPointError at the same step (no
  extra message, no hang, no divergence). The residual then holds the non-finite values: restore
  it from a checkpoint. A sparsifier that ignores magnitude (random-k) keeps a non-finite value in
  the residual until it draws its index; the sum then carries it to every worker alike, and all
  raise at that step.

Each step begins with that count (with "raise" it counts no gradient, only the joined workers):
one all-reduce of three integers, the workers whose gradient is not finite, the workers that
have joined, and the workers taking a dense step (`update(dense=True)`: an optimizer's dense start),
which a joined worker then takes part in with zeros. Uneven data (Horovod's `hvd.join()`): a
worker out of data calls `join()`, which takes part in every further step of the others with an
empty contribution (an all-zero gradient: its messages have their usual shape, their values are
zero, its residual is kept for later) until the count says every worker has joined, and returns
the rank that joined last. The others' update is their own contributions' sum / P (Average
divides by P, as Horovod's does with a joined rank's zeros); the joined worker's model does not
take those steps (under Horovod neither), so a script broadcasts the weights from the returned
rank afterwards. A caller that counts for itself (`skip=` given: the DDP hook) gets no join.

Under loss scaling the residual holds gradients in the scale of the step that made them; a scale
change (x0.5 after an overflow, x2 after a run of good steps) applies the residual's older mass
at most 2x off once, which error feedback then absorbs like any other delay.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from gtopk_hvd import ops
from gtopk_hvd.backend import backend_for
from gtopk_hvd.core.agreement import check_same_on_all_workers, signature
from gtopk_hvd.core.skip import Skip
from gtopk_hvd.core.stats import StepStats
from gtopk_hvd.core.warmup_warning import warn_if_density_needs_warmup
from gtopk_hvd.density import Schedule
from gtopk_hvd.lockstep import Phases, drive
from gtopk_hvd.reductions.wait_probe import resolve_wait_probe
from gtopk_hvd.schemes import build_scheme
from gtopk_hvd.transports import Transport, resolve_transport


class SparseStep:
    """Residual, velocity, step count and scheme of one distributed optimizer's sparse steps.

    An adapter fuses its gradients into one flat float32 vector of d = sum(sizes) values, runs
    `update` (or `phases`) once per optimizer step on every worker, and splits the result back
    (module docstring). A density below the warm-up threshold without a warm-up or momentum
    correction warns once per process (`gtopk_hvd.core.warmup_warning`).

    Args:
        config: a sparse configuration (`gtopk_hvd.compression.SparseCompression`, what
            `Compression.gtopk(...)` and the others return); checked against the registries
            here.
        sizes: the number of values of each source, in the fused order, the same on every
            worker; their sum d must be > 0.
        transport: a Transport, a registered name, or None (`gtopk_hvd.transports`: MPI over
            COMM_WORLD); adapters that know Horovod resolve theirs and pass it.
        average: True: the update is the workers' sum / P (Horovod's Average); False: their
            sum (Sum).
        predivide: f > 0: each gradient is divided by f before the exchange and the result
            multiplied by f after (Horovod's gradient_predivide_factor; 1.0: no division).
        device: None for numpy arrays on the host, or a torch device whose tensors the
            residual, the velocity and the gradients are (`gtopk_hvd.backend`).
        layout: what else every worker must agree on (the sources' names, shapes and dtypes),
            as a string that goes into the agreement signature.
        options: the adapter's own options that change the exchange (e.g. backward passes),
            also in the agreement signature; None: none.
        what: what the sources are called in errors ("parameter", "source", ...).

    Raises:
        ValueError: sizes is empty or sums to 0, predivide <= 0, or transport is an unknown
            name.
        TypeError: transport is neither a Transport, a name nor None.
        OptionError (`gtopk_hvd.options`): config names an unregistered part, or asks what
            its scheme cannot do.
    """

    def __init__(self, config: Any, sizes: Sequence[int],
                 transport: Transport | str | None = None, *, average: bool = True,
                 predivide: float = 1.0, device: Any = None, layout: str = "",
                 options: dict[str, Any] | None = None, what: str = "parameter") -> None:
        if not sizes or sum(sizes) == 0:
            raise ValueError("the model has no parameters with gradients to compress")
        if predivide <= 0:
            raise ValueError(f"gradient_predivide_factor must be > 0, got {predivide}")
        warn_if_density_needs_warmup(config)
        self._made_with = dict(config=config, sizes=sizes, average=average, predivide=predivide,
                               device=device, layout=layout, options=options, what=what)
        self.compression = config
        self.sizes = list(sizes)
        self.offsets = np.concatenate([[0], np.cumsum(self.sizes)]).astype(np.int64)
        self.d = int(self.offsets[-1])
        self.transport = resolve_transport(transport)
        self.average = average
        self.predivide = float(predivide)
        self.backend = backend_for(device)
        self.index_dtype = np.dtype(ops.index_dtype_for(self.d))
        self.residual = self.backend.zeros(self.d)
        self.velocity = self.backend.zeros(self.d) if config.momentum_correction else None
        self.schedule = Schedule(config, self.sizes)
        self.scheme = build_scheme(config, self.transport, self.backend, self.sizes,
                                   self.index_dtype)
        # What the step does, decided here once, never while it runs:
        self.skips_on_device = (self.backend.name == "torch" and config.nonfinite == "propagate"
                                and self.scheme.skips_on_device())
        """Whether `phases` honours a `Skip.on_device` flag on the device without reading it:
        torch state, nonfinite="propagate", a scheme that can (`Scheme.skips_on_device`).
        Otherwise a flag given is read on the host first."""
        self._prepare = (self._prepare_momentum if self.velocity is not None
                         else self._prepare_nothing if self.predivide == 1.0
                         else self._prepare_divided)
        self._scale = np.float32(self.predivide / self.transport.size if average
                                 else self.predivide)
        self._raises_on_nonfinite = config.nonfinite == "raise"
        self._masks_velocity = self.velocity is not None and config.momentum_masking
        self.what = what
        self.signature = signature(
            layout, sizes=self.sizes, compression=config, average=average,
            predivide=self.predivide, wait_probe=resolve_wait_probe(None, self.transport),
            state=self.backend.name, **(options or {}))
        self._step_count = 0
        self._skipped_steps = 0
        self._last_stats: StepStats | None = None
        self._unresolved: list[tuple[Skip, StepStats]] = []
        self._workers_agree = False

    # -- the host's counts (a step skipped on the device is corrected when its flag arrives) --

    @property
    def step_count(self) -> int:
        """Steps taken (skipped ones not counted): sets k in the density warm-up."""
        self._resolve_skips()
        return self._step_count

    @step_count.setter
    def step_count(self, value: int) -> None:
        self._resolve_skips()
        self._step_count = int(value)

    @property
    def skipped_steps(self) -> int:
        """Steps skipped for a non-finite gradient (not checkpointed)."""
        self._resolve_skips()
        return self._skipped_steps

    @skipped_steps.setter
    def skipped_steps(self, value: int) -> None:
        self._resolve_skips()
        self._skipped_steps = int(value)

    @property
    def last_stats(self) -> StepStats | None:
        """What the last step did (`StepStats`); reading it after a step decided on the device
        brings that decision to the host (`skipped`)."""
        self._resolve_skips()
        return self._last_stats

    def _resolve_skips(self) -> None:
        """Corrects the counts for the steps skipped on the device (`Skip.on_device`) whose
        flags were not read yet: each such step counted as taken is taken back."""
        unresolved, self._unresolved = self._unresolved, []
        for skip, stats in unresolved:
            if skip.skipped():
                self._step_count -= 1
                self._skipped_steps += 1
                stats.skipped = True

    # -- one step -----------------------------------------------------------------------------

    def update(self, gradient: Any, out: Any = None, clear_gradient: bool = False,
               skip: Skip | bool | None = None, dense: bool = False) -> Any:
        """One step, run to its end here (`phases`, driven by `gtopk_hvd.lockstep.drive`: each
        host read waits as it is asked for).

        Args:
            gradient, out, clear_gradient, skip, dense: as `phases`'.

        Returns:
            out, when given. Without out: the global set as host numpy arrays (indices, values
            scaled; the indices may be a view of the scheme's buffers, valid until the next
            step), or None for a skipped step.
        """
        result = drive(self.phases(gradient, out, clear_gradient, skip, dense))
        if out is not None or result is None:
            return result
        to_host = self.backend.to_host
        return tuple(x if isinstance(x, np.ndarray) else to_host(x) for x in result)

    def phases(self, gradient: Any, out: Any = None, clear_gradient: bool = False,
               skip: Skip | bool | None = None, dense: bool = False) -> Phases:
        """The step (module docstring) as a generator of its scheme's host reads
        (`gtopk_hvd.lockstep`): `update` drives it alone; `run_in_lockstep` runs several
        (the DDP hook's buckets), which then share their waits, with the same results.

        1. The agreement check, at the first step only.
        2. The skip: the non-finite rule's count (`Skip.COUNT`), or the caller's decision; a
           device flag is read on the host first unless the step honours it there
           (`skips_on_device`) and writes into `out`.
        3. Skipped: nothing of the state changes, the gradient is cleared if asked, out is all
           NaN. Dense (`dense`): out = the workers' summed gradients, scaled. Otherwise the
           predivision and momentum correction, the scheme's exchange (its host reads yielded),
           the velocity cleared where the residual was taken, the values scaled.
        4. The global set written into out as the dense update (out = zeros(d), out[I] = V),
           or returned.

        Args:
            gradient: flat float32, d values, of the backend's type; read only, unless
                clear_gradient: then it is all zeros on return.
            out: d float32 values of the backend's type for the dense update, or None for the
                global set itself. It may be the gradient itself, with clear_gradient (every
                scheme having cleared it, the write is the scatter of the set alone,
                `ops.write_sparse`'s `zeroed`); not with dense.
            skip: a `Skip`, or None (`Skip.COUNT`), or a bool (`Skip.decided`).
            dense: one dense step in the sparse step's place (an optimizer's dense start,
                `gtopk_hvd.torch.frozen_variance`): one all-reduce of d values, counted as a
                ring's bytes; the residual, the velocity and the scheme's state untouched, the
                step count advanced (the density schedule counts dense steps too). Only with
                the step's own count (`Skip.COUNT`).

        Returns:
            out, when given (its write timed as last_stats.write_seconds); else (indices,
            values) where the scheme left them (host arrays, or the backend's tensors where the
            reduction ran on the device), or None for a skipped step.
        """
        skip = Skip.of(skip)
        if dense and (out is None or out is gradient or not skip.counted_by_step):
            raise ValueError("a dense step writes the sum into out (another buffer than the "
                             "gradient) and counts its own non-finite workers (skip=None)")
        self._check_agreement()
        check_seconds = check_wait_seconds = 0.0
        if skip.flag is not None and (out is None or not self.skips_on_device):
            skip = skip.on_host()
        if skip.counted_by_step:
            skip, check_seconds, check_wait_seconds = self._check_and_count(gradient, dense)
        self._resolve_skips()
        budget = self.schedule.budget(self._step_count)
        if skip.known:
            self._skip(gradient, clear_gradient, budget, check_seconds, check_wait_seconds)
            result = None
        elif dense:
            self._dense(gradient, out, clear_gradient, check_seconds, check_wait_seconds)
            return out
        else:
            result = yield from self._sparse(gradient, clear_gradient, skip, budget,
                                             check_seconds, check_wait_seconds)
        if out is None:
            return result
        start = time.perf_counter()
        if result is None:
            out[:] = float("nan")  # a Python float: torch tensors refuse numpy scalars
        else:  # a gradient the step cleared needs no second zero fill
            ops.write_sparse(out, *result, skip.flag,
                             zeroed=clear_gradient and out is gradient)
        self._last_stats.write_seconds = time.perf_counter() - start
        return out

    def _sparse(self, gradient: Any, clear_gradient: bool, skip: Skip, budget: Any,
                check_seconds: float, check_wait_seconds: float) -> Phases:
        """The sparse step proper (`phases`' 3.): returns the scaled global set."""
        flag = skip.flag
        start = time.perf_counter()
        gradient, clear_in_pass = self._prepare(gradient, clear_gradient, flag)
        prepare_seconds = time.perf_counter() - start
        on_device = {} if flag is None else {"skip": flag}
        exchange = yield from self.scheme.exchange(
            gradient, self.residual, budget, self._step_count, clear_in_pass, **on_device)
        if self._raises_on_nonfinite and not ops.all_finite(exchange.values):
            self._raise_nonfinite()
        if self._masks_velocity and exchange.taken is not None:
            ops.zero_at(self.velocity, exchange.taken, flag)
        scale = self._scale
        values = exchange.values * scale if scale != 1.0 else exchange.values
        stats = exchange.stats
        self._last_stats = StepStats(
            step=self._step_count, density=budget.density, k=budget.k,
            global_entries=len(exchange.indices), bytes_sent=stats.bytes_sent,
            bytes_received=stats.bytes_received,
            select_seconds=prepare_seconds + exchange.select_seconds,
            communicate_seconds=stats.comm_seconds + check_wait_seconds,
            merge_seconds=stats.merge_seconds, wait_seconds=stats.wait_seconds + check_wait_seconds,
            transfer_seconds=stats.transfer_seconds, check_seconds=check_seconds)
        self._step_count += 1
        if flag is not None:
            self._unresolved.append((skip, self._last_stats))
        return exchange.indices, values

    # Predivision and momentum correction (module docstring) with no temporary of the
    # gradient's size, one of three chosen when the step is built: (what the scheme
    # accumulates, whether it clears it).

    def _prepare_momentum(self, gradient: Any, clear_gradient: bool,
                          flag: Any) -> tuple[Any, bool]:
        """u = m u + g / f, in the velocity (a set device flag: u unchanged)."""
        ops.momentum_update(self.velocity, gradient, self.compression.momentum,
                            self.predivide, flag)
        if clear_gradient:
            gradient[:] = 0
        return self.velocity, False

    def _prepare_nothing(self, gradient: Any, clear_gradient: bool,
                         flag: Any) -> tuple[Any, bool]:
        """No predivision: the gradient as it is."""
        return gradient, clear_gradient

    def _prepare_divided(self, gradient: Any, clear_gradient: bool,
                         flag: Any) -> tuple[Any, bool]:
        """g / f: in place where the gradient is ours to clear (the same rounding as a / b);
        else divided in blocks into the residual (the scheme then gets None:
        `Scheme.takes_accumulated`), unless a device flag is given (the residual must stay as
        it is if it is set: then into a new array)."""
        divisor = np.float32(self.predivide)
        if clear_gradient:
            gradient /= divisor
            return gradient, True
        if self.scheme.takes_accumulated and flag is None:
            ops.add_divided(self.residual, gradient, self.predivide)
            return None, False
        return gradient / divisor, False

    def _dense(self, gradient: Any, out: Any, clear_gradient: bool, check_seconds: float,
               check_wait_seconds: float) -> None:
        """`phases`' dense step: out = the workers' gradients summed, scaled as a sparse
        step's."""
        start = time.perf_counter()
        out[:] = gradient
        if clear_gradient:
            gradient[:] = 0
        self._sum_dense(out)
        if self._raises_on_nonfinite and not ops.all_finite(out):
            self._raise_nonfinite()
        if self.average and self.transport.size > 1:
            out /= float(self.transport.size)
        seconds = time.perf_counter() - start
        size = self.transport.size
        ring = 2 * (size - 1) * 4 * self.d // size
        self._last_stats = StepStats(
            step=self._step_count, density=1.0, k=self.d, global_entries=self.d,
            bytes_sent=ring, bytes_received=ring, select_seconds=0.0,
            communicate_seconds=seconds + check_wait_seconds, merge_seconds=0.0,
            wait_seconds=check_wait_seconds, transfer_seconds=seconds,
            check_seconds=check_seconds)
        self._step_count += 1

    def _check_and_count(self, gradient: Any, dense: bool = False) -> tuple[Skip, float, float]:
        """The non-finite rule's read of this worker's gradient ("propagate") and the count of
        every worker's: (the decision, seconds reading, seconds in the count). The count waits
        for the last worker to arrive: a wait, as the exchanges' probes."""
        start = time.perf_counter()
        local = not self._raises_on_nonfinite and not ops.all_finite(gradient)
        read = time.perf_counter()
        skip = Skip.decided(self._count(local, dense=dense)[0] > 0)
        return skip, read - start, time.perf_counter() - read

    def _raise_nonfinite(self) -> None:
        raise FloatingPointError(
            f"gtopk_hvd: non-finite gradient values (NaN or Inf) at step {self.step_count} on "
            "at least one worker; every worker raises here")

    def _sum_dense(self, array: Any) -> None:
        """array = its sum over workers, in place (host arrays or the backend's tensors)."""
        if self.transport.size == 1:
            return
        if isinstance(array, np.ndarray):
            self.transport.allreduce_sum(array)
        else:
            self.transport.allreduce_sum_tensors([array])

    # -- uneven data: join ------------------------------------------------------------------

    def join(self) -> int:
        """Takes part in the other workers' steps with an empty contribution until every worker
        has called join (Horovod's `hvd.join()` semantics; module docstring).

        Each of the others' steps runs here as theirs does, on an all-zero gradient with a
        scratch residual: this worker sends entries of value zero (so every message has the
        shape the schedule expects), its residual and velocity stay as they were, its step count
        follows the others' (so the density schedule agrees), and the update is dropped: this
        worker's model does not move, as under Horovod. The others' average still divides by
        P. Only for steps that count their workers (`Skip.COUNT`).

        Returns:
            The rank that joined last (the highest rank among those that joined at the same
            step), the same on every worker: the one to broadcast the weights from.
        """
        self._check_agreement()
        joined_at = self.step_count
        zeros = self.backend.zeros(self.d)
        scratch = self.backend.zeros(self.d)
        while True:
            nonfinite, joined, dense = self._count(False, joined=True)
            if joined == self.transport.size:
                break
            if nonfinite:
                self.skipped_steps += 1
                continue
            scratch[:] = 0
            if dense:  # the others' dense step: an all-reduce of zeros
                self._sum_dense(scratch)
            else:
                drive(self.scheme.exchange(zeros, scratch,
                                           self.schedule.budget(self.step_count),
                                           self.step_count, False))
            self.step_count += 1
        if self.transport.size == 1:
            return self.transport.rank
        order = self.transport.allgather(np.array([joined_at, self.transport.rank], np.int64))
        return int(max(map(tuple, order))[1])

    def _count(self, nonfinite: bool, joined: bool = False,
               dense: bool = False) -> tuple[int, int, int]:
        """(workers whose gradient is not finite, workers that have joined, workers taking a
        dense step): one all-reduce of three integers, the same on every worker (none at
        P = 1). A joined worker learns from the third whether the others' step is dense."""
        counts = np.array([int(nonfinite), int(joined), int(dense)], dtype=np.int32)
        if self.transport.size > 1:
            self.transport.allreduce_sum(counts)
        return int(counts[0]), int(counts[1]), int(counts[2])

    def _check_agreement(self) -> None:
        """The first step's check that every worker has the same layout and configuration; in
        the same all-gather the step counts, of which every worker takes the largest: a worker
        new to a running job (Elastic Horovod, a restart onto more workers) takes the job's, so
        the density warm-up gives every worker the same k."""
        if not self._workers_agree:
            counts = check_same_on_all_workers(
                self.transport, f"{self.what} names, shapes, dtypes, compression and where "
                "the state lives (host numpy or torch tensors)",
                self.signature, carry=self.step_count)
            self.step_count = max(counts)
            self._workers_agree = True

    def _skip(self, gradient: Any, clear_gradient: bool, budget: Any, check_seconds: float,
              check_wait_seconds: float) -> None:
        """A step skipped for a non-finite gradient: nothing of the state changes but the count
        of skipped steps; the gradient is cleared if asked."""
        if clear_gradient:
            gradient[:] = 0
        self.skipped_steps += 1
        self._last_stats = StepStats(
            step=self.step_count, density=budget.density, k=budget.k, global_entries=0,
            bytes_sent=0, bytes_received=0, select_seconds=0.0,
            communicate_seconds=check_wait_seconds, merge_seconds=0.0,
            wait_seconds=check_wait_seconds, check_seconds=check_seconds, skipped=True)
        return None

    # -- checkpoint ---------------------------------------------------------------------------

    def state_dict(self) -> dict:
        """This worker's state, for a checkpoint and `load_state_dict`.

        Returns:
            A dict: "residual" (and "velocity", with momentum correction) as host numpy
            float32 copies of d values, "step" the step count (an int), and "scheme" the
            scheme's own state (`Scheme.state_dict`) when it keeps any. The count of skipped
            steps is not saved.
        """
        to_host = self.backend.to_host
        state = {"residual": to_host(self.residual).copy(), "step": self.step_count}
        if self.velocity is not None:
            state["velocity"] = to_host(self.velocity).copy()
        scheme = self.scheme.state_dict()
        if scheme:
            state["scheme"] = scheme
        return state

    def moved_to(self, transport: Transport | str | None) -> SparseStep:
        """This step over other workers (an Elastic Horovod reset changed the rank or the size).

        The scheme's own state (partitions, thresholds) was made for the old workers and starts
        again; the new step checks agreement at its first step, as every step does. This step
        is left as it was.

        Args:
            transport: the new workers' transport: a Transport, a registered name, or None (as
                the constructor's).

        Returns:
            A new SparseStep made as this one was, on `transport`, holding this worker's
            residual, velocity, step count and count of skipped steps.
        """
        moved = SparseStep(**{**self._made_with, "transport": transport})
        state = self.state_dict()
        state.pop("scheme", None)
        moved.load_state_dict(state)
        moved.skipped_steps = self.skipped_steps
        return moved

    def restarted(self, step_count: int = 0) -> SparseStep:
        """A fresh copy of this step, e.g. for Elastic Horovod's restore of a commit made
        before this worker's first step.

        Args:
            step_count: the steps it counts as taken (what sets k in the density warm-up).

        Returns:
            A new SparseStep made as this one was, on the same transport, with zero residual
            and velocity, a fresh scheme state, and `step_count` steps taken.
        """
        fresh = SparseStep(**{**self._made_with, "transport": self.transport})
        fresh.step_count = int(step_count)
        return fresh

    def load_state_dict(self, state: dict) -> None:
        """Restores what `state_dict` returned, into this step's arrays.

        Args:
            state: `state_dict()`'s dict, its arrays numpy arrays or CPU torch tensors:
                "residual" of d values, "step", and "velocity" where this step has momentum
                correction; its "scheme" entry (absent: {}) goes to `Scheme.load_state_dict`.

        Raises:
            ValueError: the residual does not have d values, or the state has no velocity for
                a step with momentum correction.
        """
        residual = _host_float32(state["residual"])
        if residual.size != self.d:
            raise ValueError(f"checkpoint residual has {residual.size} values, model has {self.d}")
        self.backend.assign(self.residual, residual)
        if self.velocity is not None:
            if "velocity" not in state:
                raise ValueError("checkpoint has no momentum-correction velocity")
            self.backend.assign(self.velocity, _host_float32(state["velocity"]))
        self.scheme.load_state_dict(state.get("scheme", {}))
        self.step_count = int(state["step"])


def _host_float32(x: Any) -> np.ndarray:
    """A checkpoint's array (numpy, or a torch tensor) as flat host float32."""
    if not isinstance(x, np.ndarray) and hasattr(x, "detach"):
        x = x.detach().cpu().numpy()
    return np.asarray(x, dtype=np.float32).reshape(-1)


def count_workers(transport: Transport, flag: bool) -> int:
    """How many workers pass flag=True: one all-reduce of one integer (none at P = 1)."""
    count = np.array([int(flag)], dtype=np.int32)
    if transport.size > 1:
        transport.allreduce_sum(count)
    return int(count[0])
