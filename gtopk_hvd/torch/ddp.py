"""A DDP communication hook: gTop-k (or Top-k) sparsified gradients with error feedback.

    state = GTopkHookState(compression=Compression.gtopk(0.01))   # one per DDP model
    model = DistributedDataParallel(model)                         # under torchrun
    model.register_comm_hook(state, gtopk_hook)

Shaped like PyTorch's PowerSGD hook: one slotted state (`GTopkHookState`), one hook function
(`gtopk_hook`). For each DDP bucket b, a flat gradient g_b of d_b values on worker p of P, with
its residual r_b and k_b = ceil(density * d_b), the hook runs the core step
(`gtopk_hvd.core.step`, which adds the momentum correction and the warm-up's k; another
scheme's exchange, `gtopk_hvd.schemes`, replaces steps 2 to 4):

    1. acc = r_b + g_b
    2. (I_p, V_p) = top-k(acc, k_b);  r_b = acc, set to 0 at I_p
    3. (I, V) = the reduction of every worker's (I_p, V_p) on the state's transport: gTop-k's
       global top-k (or Top-k's all-gather); V: the sums over the workers at I
    4. r_b[j] += V_p[j] for j in I_p, not in I             (selected here, not sent: kept)
    5. g_b := V / P at I, 0 elsewhere                       (the same on every worker)

The step runs on the bucket's GPU when gtopk_hvd's CUDA kernels are built, else on the host
(the bucket copied there and back); float16, bfloat16 and float64 buckets are cast to float32
for it and back. With `overlap=True` a host bucket's step starts on the state's thread as the
bucket arrives (docs/ddp.md, "Overlap with backward").

Dense start. DDP builds its final buckets after its first iteration, so the first `start_iter`
iterations (default 2, at least 2), and with `freeze_variance_after` the optimizer's dense
start, are DDP's plain all-reduce average; the sparse steps start after. A bucket whose layout
changes after that raises (each keeps its own residual). The warm-up's densities count DDP
iterations (`state.iter`), the dense ones included. More: docs/ddp.md.

Non-finite gradients. nonfinite="propagate" (the default): each bucket is read for NaN/Inf as
it arrives and its future completes at the iteration's last bucket, where one count of the
workers that saw one decides the whole iteration: if any did, every bucket of every worker
becomes all NaN, no residual, velocity or step count changes, and `state.iter` does not count
the iteration. A GradScaler then skips the step; without one, give the state `optimizer=` (or
step only `if not state.last_iteration_skipped`). nonfinite="raise": each bucket steps as it
arrives, and every worker raises FloatingPointError at the first NaN/Inf. More: docs/ddp.md.

Checkpoints. `state_dict()` / `load_state_dict()` hold `iter`, `start_iter`, each bucket's
layout, residual, velocity and step count, and where each parameter lies in DDP's buckets;
pickling the state (`torch.save`; `torch.load(..., weights_only=False)`) adds the compression
and the settings, and drops the process group, the optimizer and a Transport object (None
after loading; a registered transport name is kept): set them again before the next iteration.
Each worker saves its own (residuals differ between workers). A restored state continues as
the saved one would have, on a new DDP model too (`gtopk_hvd.torch.bucket_remap`); a rank the
saved job did not have loads another's with `keep_residuals=False`. More: docs/ddp.md.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import time
from typing import Any

import torch
import torch.distributed as dist

from gtopk_hvd import ops
from gtopk_hvd.compression import SCHEME_NAMES, SparseCompression, sparse_config
from gtopk_hvd.core import SparseStep, StepStats, count_workers
from gtopk_hvd.core.skip import Skip
from gtopk_hvd.lockstep import Phases, drive, run_in_lockstep
from gtopk_hvd.options import OptionError, OptionTypeError, check_integer, message, refuse
from gtopk_hvd.scheme_names import call_for
from gtopk_hvd.schemes import check_config
from gtopk_hvd.torch.bucket_remap import Layout, gather, scatter
from gtopk_hvd.torch.early_steps import starts_early, steps_on_thread
from gtopk_hvd.torch.hook_buckets import (
    HookBucket,
    HookBuckets,
    layout_of_saved,
    without_residuals,
)
from gtopk_hvd.torch.hook_optimizer import HookOptimizer
from gtopk_hvd.transports import TRANSPORTS, Transport, resolve_transport
from gtopk_hvd.transports.base import check_same_workers
from gtopk_hvd.transports.torch_distributed import TorchDistributedTransport, end_process_group

logger = logging.getLogger(__name__)


class GTopkHookState:
    """What `gtopk_hook` keeps between iterations (one per DDP model, like `PowerSGDState`).

    Args:
        process_group: the group whose workers reduce: DDP's (None: the default group).
        density: k / d of each bucket (None: 0.01), with `reduction` and `**options`; leave
            the three out when giving `compression`.
        compression: a ready sparse choice (`Compression.gtopk(...)`, `.topk`, `.micro`, ...:
            `gtopk_hvd.compression`) instead of density, reduction and options.
        reduction: the reduction of gTop-k's select-and-reduce step: "gtopk" (None: the
            default) or "allgather" (Top-k S-SGD); a scheme's name is refused here.
        start_iter: DDP iterations of plain all-reduce before the sparse steps, >= 2 (module
            docstring, "Dense start").
        transport: what the sparse reductions run on: None (torch.distributed over
            `process_group`; for NCCL, a group made with backend="nccl"), a registered name
            ("torch", "mpi", "horovod": `gtopk_hvd.transports`) or a gtopk_hvd Transport. Its
            workers must be the process group's, the same rank and size.
        skip_on_device: where nonfinite="propagate" decides a skipped iteration
            (`gtopk_hvd.core.skip`). None: on the device for CUDA buckets whose scheme
            can (Top-k and gTop-k, plain or exact, with their reduction on the device; the
            sketch on tensors); True: on any device where the steps keep torch state and the
            scheme can (CPU buckets keep numpy state: no change there); False: on the host.
        optimizer: the optimizer the updates go to, or a client's wrapper of it (also
            `attach_optimizer`): an iteration skipped for a NaN/Inf is then not applied.
        freeze_variance_after: N >= start_iter (Adam or AdamW, with `optimizer`): N dense
            steps, then Adam's second moment frozen and the preconditioned gradient reduced,
            the optimizer's step taken over by the rule (`gtopk_hvd.torch.hook_optimizer`);
            None: off.
        max_grad_norm: with freeze_variance_after, each worker's clip of its own gradient in
            the sparse phase (nonfinite="propagate" only); None: no clip.
        overlap: at P > 1, a host bucket's step runs on the state's thread as the bucket
            arrives, while backward goes on (`gtopk_hvd.torch.early_steps`); False: inside
            the hook. May be changed between iterations, alike on every worker.
        **options: the other fields of `gtopk_hvd.compression.SparseCompression`
            (wire_dtype, warmup_densities, warmup_steps, momentum_correction, momentum,
            momentum_masking, granularity, sparsifier, seed, nonfinite). granularity "model"
            selects over each bucket as a whole, "bucket" over each parameter's share.

    Raises:
        OptionError, OptionTypeError (`gtopk_hvd.options`; ValueError, TypeError): an option
            out of range or of the wrong type, `compression` given together with density,
            reduction or options, a scheme's name as `reduction`, an unknown transport name.
        ValueError: max_grad_norm without freeze_variance_after or with nonfinite="raise";
            freeze_variance_after with an optimizer the rule does not cover
            (`attach_optimizer`).
        RuntimeError: a Transport object whose workers are not the process group's, when
            torch.distributed is initialised already (otherwise at the first hook call).

    Fields (public; set process_group and transport before the first iteration):

    process_group   the torch.distributed group of the dense warm-up, and of the default
                    transport (None: the default group)
    transport       the transport as given: a Transport, a registered name or None
    compression     the sparse configuration (`SparseCompression`)
    start_iter      DDP iterations of plain all-reduce before the sparse steps
    iter            DDP iterations so far (one skipped for a NaN/Inf does not count)
    last_iteration_skipped  (property) whether the last complete iteration was skipped for a
                    NaN/Inf (its gradients all NaN: do not step the optimizer without a
                    scaler); after an iteration decided on the device, reading it (or iter)
                    brings the flag to the host: a wait for that iteration's backward
    skip_on_device  the constructor's choice (above)
    book            `HookBuckets` (`gtopk_hvd.torch.hook_buckets`): the buckets' bookkeeping
                    in this process (each bucket's step, the buckets seen, a restored state's,
                    the remap, this iteration's held buckets, non-finite reads and early steps)
    buckets         (property) DDP bucket index -> `HookBucket` (layout, SparseStep) of each
                    bucket that has stepped: `book.stepped`
    overlap         the constructor's choice (above); may be changed between iterations,
                    alike on every worker
    active_transport  the Transport resolved from `transport` at the first hook call
                    (`get_transport`), None before
    last_stats      (property) each bucket's last sparse step
    optimizer_link  `HookOptimizer`: the optimizer attached, freeze_variance_after's rule and
                    clip, the step hooks
    preconditioned  (property) whether this iteration reduces the preconditioned gradient

    What a checkpoint keeps: module docstring, "Checkpoints"; the rest lives in this process
    only.
    """

    __slots__ = ("_iter", "_last_skipped", "_registration", "_unresolved", "active_transport",
                 "book", "compression", "optimizer_link", "overlap", "process_group",
                 "skip_on_device", "start_iter", "transport")

    def __init__(self, process_group: Any = None, density: float | None = None, *,
                 compression: SparseCompression | None = None, reduction: str | None = None,
                 start_iter: int = 2, transport: Transport | str | None = None,
                 skip_on_device: bool | None = None, optimizer: Any = None,
                 freeze_variance_after: int | None = None, max_grad_norm: float | None = None,
                 overlap: bool = True, **options: Any) -> None:
        if compression is None:
            _check_reduction_is_not_a_scheme(reduction, density)
            compression = sparse_config(reduction or "gtopk",
                                        0.01 if density is None else density,
                                        choice="GTopkHookState", **options)
        elif not isinstance(compression, SparseCompression):
            raise OptionTypeError(message(
                "compression", "a sparse choice: Compression.gtopk, .topk, .sparse, .micro, "
                ".exdyna, .sketch or .scheme(name, density) (names: "
                f"{', '.join(SCHEME_NAMES)})", compression,
                "for dense gradients register no hook (DDP's own all-reduce)"))
        elif density is not None or reduction is not None or options:
            given = [name for name, value in (("density", density), ("reduction", reduction))
                     if value is not None] + sorted(options)
            raise OptionError(f"gtopk_hvd: give either compression= or density / reduction / "
                              f"options, not both (got compression={compression!r} and "
                              f"{', '.join(given)}); put the options into the compression, "
                              "e.g. Compression.gtopk(0.01, momentum_correction=True)")
        check_config(compression)
        check_integer("start_iter", start_iter, 2,
                      fix="DDP rebuilds its buckets after the first iteration, so the sparse "
                          "steps start at iteration 2 at the earliest")
        _check_transport_argument(transport)
        if skip_on_device not in (None, True, False):
            refuse("skip_on_device", "None (on CUDA buckets), True or False", skip_on_device,
                   wrong_type=True)
        if not isinstance(overlap, bool):
            refuse("overlap", "True or False", overlap, wrong_type=True)
        self.skip_on_device = skip_on_device
        self.overlap = overlap
        self.process_group = process_group
        self.transport = transport
        self.compression = compression
        self.start_iter = start_iter
        self.optimizer_link = _optimizer_link(compression, freeze_variance_after, max_grad_norm,
                                              start_iter)
        if optimizer is not None:
            self.attach_optimizer(optimizer)
        self._iter = 0
        self.reset_process_state()
        if isinstance(transport, Transport) and dist.is_available() and dist.is_initialized():
            check_matches_process_group(transport, process_group)

    def reset_process_state(self, book: HookBuckets | None = None) -> None:
        """Starts afresh all but the settings and iter: the buckets' bookkeeping, the resolved
        transport, last_iteration_skipped (`load_state_dict` then sets what a checkpoint holds).

        Args:
            book: the buckets' bookkeeping to start from (a restored state's); None: empty.
        """
        self.active_transport: Transport | None = None
        self._last_skipped = False
        self._unresolved: Skip | None = None
        self._registration: WorkerCount | None = None  # the workers whose hook has run
        self.book = book if book is not None else HookBuckets()

    @property
    def buckets(self) -> dict[int, HookBucket]:
        """DDP bucket index -> the `HookBucket` of each bucket that has stepped."""
        return self.book.stepped

    # -- iterations (one decided on the device is corrected when its flag is read) -----------

    @property
    def iter(self) -> int:
        self._resolve()
        return self._iter

    @iter.setter
    def iter(self, value: int) -> None:
        self._resolve()
        self._iter = int(value)

    @property
    def last_iteration_skipped(self) -> bool:
        self._resolve()
        return self._last_skipped

    def _resolve(self) -> None:
        """Reads the last iteration's device flag, if it has not been read: a skipped
        iteration, counted in iter as applied, is taken back."""
        unresolved, self._unresolved = self._unresolved, None
        if unresolved is not None:
            self._last_skipped = unresolved.skipped()
            self._iter -= int(self._last_skipped)

    def in_dense_start(self) -> bool:
        """Whether this iteration is dense. Needs no flag read: an iteration skipped on the
        device was a sparse one, so taking it back cannot bring iter below start_iter.

        Returns:
            True in the first start_iter iterations (DDP's all-reduce) and in
            freeze_variance_after's dense start (the optimizer's steps).
        """
        return self._iter < self.start_iter or self.optimizer_link.dense

    def attach_optimizer(self, optimizer: Any) -> None:
        """Attaches the optimizer the hook's updates go to, before the first backward: an
        iteration skipped for a NaN/Inf is then not applied, and freeze_variance_after's rule
        takes over its step (`gtopk_hvd.torch.hook_optimizer`).

        Args:
            optimizer: a torch optimizer, or a client's wrapper of one (accelerate's,
                Lightning's, the Trainer's: the innermost torch optimizer is taken).
                Attaching the same one again does nothing.

        Raises:
            RuntimeError: the state has another optimizer already.
            ValueError: with freeze_variance_after, an optimizer the rule does not cover
                (not Adam or AdamW; amsgrad, maximize, or Adam's L2 weight_decay).
        """
        self.optimizer_link.attach(optimizer)

    @property
    def preconditioned(self) -> bool:
        """Whether this iteration reduces Adam's preconditioned gradient
        (freeze_variance_after's sparse phase): then do not clip after backward (the
        gradients are the reduced update; `max_grad_norm` clips each worker's own)."""
        return self.optimizer_link.preconditioned

    def end_iteration(self, skipped: Skip) -> None:
        """Counts the iteration whose last bucket has just been stepped: in iter unless it was
        skipped; a device decision counts as applied until its flag is read.

        Args:
            skipped: the iteration's skip decision (`gtopk_hvd.core.Skip`), decided on the host
                or held on the device.
        """
        self._resolve()
        if skipped.flag is not None:
            self._iter += 1
            self._last_skipped = False
            self._unresolved = skipped
        else:
            self._iter += int(not skipped.skipped())
            self._last_skipped = skipped.skipped()

    # -- checkpoint -----------------------------------------------------------------------

    def state_dict(self) -> dict:
        """This worker's hook state as plain values and tensors, for `load_state_dict`.

        Returns:
            {"iter", "start_iter", "buckets": {DDP bucket index: its layout, parameter sizes,
            the number of workers it stepped with, residual (and velocity) as tensors, step
            count, the scheme's own state; only the layout and sizes for a bucket not yet
            stepped}, "construction": the remap's record (`BucketRemap.record`),
            "compression_fields": the compression's fields, which `load_state_dict` checks}.
            Each worker saves its own: residuals differ between workers.
        """
        buckets, construction = self.book.saved()
        return {"iter": self.iter, "start_iter": self.start_iter, "buckets": buckets,
                "construction": construction, "compression_fields": _fields(self.compression)}

    def load_state_dict(self, state: dict, *, keep_residuals: bool = True) -> None:
        """Restores what `state_dict()` returned; what lives in this process only starts
        afresh (`reset_process_state`).

        A bucket saved with another number of workers keeps its residual, velocity and step
        count; its scheme's own state (MiCRO's partition and threshold, ExDyna's boundaries)
        was for the old P and starts again.

        Args:
            state: what `state_dict()` returned, on this worker (or, with keep_residuals=False,
                on another).
            keep_residuals: False for a worker the saved job did not have (a restart on more
                workers): its residuals and velocities start at zero, the rest (iter, step
                counts, buckets) is the job's, so that every worker issues the same
                collectives.

        Raises:
            ValueError: the state was saved with another compression.
        """
        saved, mine = state.get("compression_fields") or {}, _fields(self.compression)
        differ = ", ".join(f"{name}={saved[name]!r} (this state: {mine[name]!r})"
                           for name in sorted(set(saved) & set(mine))
                           if saved[name] != mine[name])  # fields both versions have
        if differ:
            raise ValueError(
                f"gtopk_hook: the saved state was made with another compression: {differ}. "
                "Build the GTopkHookState with the saved configuration (its residuals, "
                "velocities and scheme state are that configuration's) before loading it")
        self.reset_process_state(HookBuckets(
            {int(index): dict(bucket) if keep_residuals else without_residuals(bucket)
             for index, bucket in state["buckets"].items()}, state.get("construction")))
        self.iter = int(state["iter"])
        self.start_iter = int(state["start_iter"])

    def __getstate__(self) -> dict:
        """What pickling (torch.save) saves: {"compression", "transport": the registered name
        if one was given (else None), **state_dict(), "dropped": what was left out}.

        Left out: the process group (not picklable; None, the default group, after loading)
        and a Transport object (it holds live communicators; `transport` is None after
        loading, torch.distributed over the process group), with a logged warning when either
        was set: set them again after loading, before the next iteration. The buckets' steps,
        the remap's bookkeeping and the resolved transport are rebuilt in the loading process.
        """
        dropped = [name for name, value in (("process_group", self.process_group),
                                            ("transport", self.transport),
                                            ("optimizer", self.optimizer_link.optimizer))
                   if value is not None and not isinstance(value, str)]
        if dropped:
            logger.warning("NOTE: GTopkHookState's %s cannot be pickled and is excluded from "
                           "the saved state", " and ".join(dropped))
        link = self.optimizer_link
        return {"compression": self.compression, "skip_on_device": self.skip_on_device,
                "overlap": self.overlap,
                "freeze_variance_after": link.after, "max_grad_norm": link.max_grad_norm,
                "transport": self.transport if isinstance(self.transport, str) else None,
                **self.state_dict(), "dropped": dropped}

    def __setstate__(self, state: dict) -> None:
        """Restores what `__getstate__` saved: process_group becomes None (the default group)
        and transport the saved name or None; a logged warning names what was dropped at
        saving (set `state.process_group` / `state.transport` again before the next
        iteration)."""
        self.process_group = None
        self.skip_on_device = state.get("skip_on_device")
        self.overlap = state.get("overlap", True)
        self.transport = state.get("transport")
        self.compression = state["compression"]
        self.optimizer_link = _optimizer_link(self.compression,
                                              state.get("freeze_variance_after"),
                                              state.get("max_grad_norm"),
                                              int(state["start_iter"]))
        self.load_state_dict(state)
        if state.get("dropped"):
            logger.warning("NOTE: GTopkHookState's %s was not saved: None after loading (the "
                           "default group, torch.distributed over it); set it before the next "
                           "iteration if another is wanted", " and ".join(state["dropped"]))

    @property
    def last_stats(self) -> dict[int, StepStats]:
        """Each bucket's last sparse step (bytes sent and received, k, times)."""
        return self.book.last_stats

    # -- the transport --------------------------------------------------------------------

    def get_transport(self) -> Transport:
        """The transport of the sparse steps, resolved from `transport` on the first call and
        checked against the process group.

        Returns:
            `active_transport`: torch.distributed over `process_group` when `transport` is
            None, else the registered or given Transport.

        Raises:
            RuntimeError: its workers are not the process group's (rank or size).
        """
        if self.active_transport is None:
            transport = (TorchDistributedTransport(self.process_group) if self.transport is None
                         else resolve_transport(self.transport))
            check_matches_process_group(transport, self.process_group)
            self.active_transport = transport
        return self.active_transport

    # -- per bucket -----------------------------------------------------------------------

    def new_sparse_step(self, index: int, layout: Layout, sizes: list[int],
                        device: torch.device, saved: dict | None) -> SparseStep:
        """A SparseStep for one DDP bucket (`book`'s `MakeStep`).

        Args:
            index: the bucket's index in DDP's reducer.
            layout: the (shape, dtype) of each of the bucket's parameters, which the step's
                messages name.
            sizes: the parts the selection is split into: each parameter's number of
                elements (granularity "bucket"), or the bucket's as one part.
            device: the bucket's device; the step runs there when gtopk_hvd's kernels are
                built for it, else on the host.
            saved: the bucket's entry of a checkpoint (`state_dict()["buckets"][index]`), or
                None. A saved residual is loaded (the scheme's own state only when it was saved
                with the same number of workers); without one the step count starts at iter,
                so that the warm-up counts DDP iterations.

        Returns:
            The bucket's SparseStep.
        """
        sparse = SparseStep(self.compression, sizes, self.get_transport(),
                            device=_step_device(device),
                            layout=f"DDP bucket {index}: {layout}", what="DDP parameter")
        if saved is None or "residual" not in saved:
            sparse.step_count = self.iter  # the warm-up counts DDP iterations
        else:
            if saved.get("workers", sparse.transport.size) != sparse.transport.size:
                saved = {key: value for key, value in saved.items() if key != "scheme"}
            sparse.load_state_dict(saved)
        return sparse


def check_matches_process_group(transport: Transport, process_group: Any = None) -> None:
    """Raises if the transport's workers are not the process group's (same rank, same size)."""
    check_same_workers(transport, dist.get_rank(process_group),
                       dist.get_world_size(process_group), "gtopk_hook",
                       "the DDP process group's", "the process group",
                       "Pass transport=None (torch.distributed over the process group) or one "
                       "over the same workers.")


def gtopk_hook(state: GTopkHookState, bucket: dist.GradBucket
               ) -> torch.futures.Future[torch.Tensor]:
    """DDP communication hook: the bucket's gradient becomes the sparse update averaged over
    the workers (module docstring, steps 1 to 5); DDP's plain all-reduce average in the dense
    start.

    Args:
        state: the `GTopkHookState` given to `register_comm_hook` (one per DDP model).
        bucket: the DDP bucket whose flat gradient is reduced.

    Returns:
        A future of the bucket's buffer holding the averaged update, the same on every worker;
        under nonfinite="propagate" it completes at the iteration's last bucket (all NaN in
        an iteration skipped for a NaN/Inf).

    Raises:
        TypeError: `state` is not a GTopkHookState.
        NotImplementedError: DDP hands the hook one parameter's gradient, not a bucket
            (compiled autograd with optimize_ddp="python_reducer").
        RuntimeError: a bucket whose layout changed after the dense start, a second DDP model
            on the same state, a rank of the process group without the hook, a transport whose
            workers are not the process group's, freeze_variance_after without an optimizer.
        FloatingPointError: nonfinite="raise" and a NaN/Inf on some worker.

    Whatever it raises, every bucket future it still holds fails first with the same error,
    so neither DDP nor the next iteration waits on a future that never completes.
    """
    if not isinstance(state, GTopkHookState):
        raise TypeError(
            f"gtopk_hook's state must be a GTopkHookState, got {type(state).__name__}: "
            "model.register_comm_hook(GTopkHookState(compression=...), gtopk_hook)"
            + (" (the compression goes into the state)"
               if isinstance(state, SparseCompression) else ""))
    if isinstance(bucket, tuple):
        raise NotImplementedError(
            "gtopk_hook: DDP called the hook with one parameter's gradient, not a bucket "
            "(torch._dynamo.config.optimize_ddp = \"python_reducer\" with compiled autograd); "
            "the hook keeps a residual per DDP bucket: compile with the default optimize_ddp")
    try:
        return _hook(state, bucket)
    except BaseException as error:
        state.book.fail_held(error)
        raise


def _hook(state: GTopkHookState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """gtopk_hook's work."""
    buffer = bucket.buffer()
    layout = _layout(bucket)
    state.get_transport()  # resolved and checked at the first call
    link = state.optimizer_link
    link.check_ready()
    book = state.book
    book.check_same_model(bucket, layout)
    if state._registration is None:
        state._registration = WorkerCount.start(state.process_group)
    remap = book.remap
    first_iteration_here = not remap.first_iteration_done
    remap.observe(bucket, layout)
    dense = state.in_dense_start()
    if not first_iteration_here and dense:
        book.note_final(bucket, layout)
    skipped = Skip.decided(False)  # the iteration's decision, once its last bucket is in
    if dense:
        future = _allreduce_average(state.process_group, buffer,
                                    divide_after=link.rule is not None)
    elif remap.applies(bucket.index(), layout, book.restored):
        state._registration.check_every_worker(first_iteration_here)
        future = _future(buffer)
        remap.hold(bucket, buffer, future)
        if bucket.is_last():
            skipped = _step_remapped(state)
    elif remap.holding:
        raise RuntimeError(f"gtopk_hook: DDP bucket {bucket.index()} of the first iteration is "
                           "not one of the construction-time buckets the restored state "
                           "recorded")
    else:
        state._registration.check_every_worker(first_iteration_here)  # before any sparse one
        sparse = book.step_for(bucket, layout, state.new_sparse_step)
        if link.preconditioned:
            link.arrive(buffer, list(bucket.parameters()), bucket.index())
        if state.compression.nonfinite == "propagate":
            future, skipped = _hold_for_check(state, sparse, buffer, bucket.is_last())
        elif state.overlap and steps_on_thread(sparse, buffer, state.get_transport().size):
            future = book.early.later(lambda: drive(_step_in_place(sparse, buffer)), buffer)
        else:
            book.early.wait()
            drive(_step_in_place(sparse, buffer))
            future = _done(buffer)
    if bucket.is_last():
        state.end_iteration(skipped)  # a skipped iteration does not count (module docstring)
        remap.end_iteration()
        link.end_iteration(not dense, lambda: state.last_iteration_skipped)
    return future


# DDP's register_comm_hook compares these annotations with the objects themselves, which
# `from __future__ import annotations` would have left as strings.
gtopk_hook.__annotations__.update(bucket=dist.GradBucket,
                                  **{"return": torch.futures.Future[torch.Tensor]})


def _hold_for_check(state: GTopkHookState, sparse: SparseStep, buffer: torch.Tensor,
                    last: bool) -> tuple[torch.futures.Future, Skip]:
    """nonfinite="propagate": keeps the bucket in `state.book.pending` until the iteration's
    last one. A bucket that can (`state.overlap`, `early_steps.starts_early`, no clip to wait
    for) starts its step now, tentatively, on the state's thread (`book.early`); the others
    enqueue their non-finite read now (`book.nonfinite`). At the last bucket one count of the
    workers decides the iteration for all of them (after the early exchanges, or
    `_step_together`'s: on the device, or one host read of the flag), the early steps are
    committed or discarded, the others stepped with the same decision, and every future
    completes. Returns the bucket's future and whether the iteration was skipped (not until
    the last bucket; a device flag if decided there)."""
    future = _future(buffer)
    book = state.book
    book.pending.append((sparse, buffer, future))
    link = state.optimizer_link
    if (not last and state.overlap and link.max_grad_norm is None
            and starts_early(sparse, buffer, state.get_transport().size)):
        book.early.start(sparse, buffer)
    else:
        book.nonfinite.check(buffer)  # enqueued now: on a GPU it overlaps the rest of backward
    if not last:
        return future, Skip.decided(False)
    held = [(step, held_buffer) for step, held_buffer, _ in book.pending
            if not book.early.holds(step)]
    if book.early.jobs:
        skipped = Skip.decided(book.early.decide(state.get_transport(),
                                                 book.nonfinite.read()))
        book.early.finish(skipped.skipped())
        _step_together(state, held, skip=skipped)
    else:
        link.clip_([held_buffer for _, held_buffer in held])
        skipped = _step_together(state, held, checked=True)
    pending, book.pending = book.pending, []
    for _, held_buffer, held_future in pending:
        held_future.set_result(held_buffer)
    return future, skipped


def _step_remapped(state: GTopkHookState) -> Skip:
    """The restored state's first iteration on a new model, at its last bucket: the saved
    buckets' steps on their parameters' gradients, cut from the held construction-time buckets
    (`BucketRemap`), run together; then every held future completes. Returns whether the
    iteration was skipped (`_step_together`)."""
    steps = []
    link = state.optimizer_link
    book = state.book
    gradients = book.remap.gradients()  # checks the held buckets against the record first
    parameters = book.remap.parameters() if link.preconditioned else {}
    for index, views in gradients.items():
        saved = book.restored.pop(index)
        layout = layout_of_saved(saved)
        sparse = book.add(index, layout, state.new_sparse_step(
            index, layout, list(saved["sizes"]), views[0].device, saved))
        flat = gather(views)
        if link.preconditioned:
            link.arrive(flat, parameters[index], index)
        steps.append((sparse, flat, views))
    link.clip_([flat for _, flat, _ in steps])
    skipped = _step_together(state, [(sparse, flat) for sparse, flat, _ in steps])
    for _, flat, views in steps:
        scatter(flat, views)
    book.remap.release()
    return skipped


# -- the step ---------------------------------------------------------------------------

def _step_together(state: GTopkHookState, steps: list[tuple[SparseStep, torch.Tensor]],
                   checked: bool = False, skip: Skip = Skip.COUNT) -> Skip:
    """Runs the steps of one iteration's buckets in place; returns whether they were skipped
    (decided on the host, or a flag on the device).

    1. nonfinite="propagate" (unless `skip`, the decision, was counted already:
       `EarlySteps.decide`): each bucket read for NaN/Inf on its device into
       `state.book.nonfinite` (already as it arrived if `checked`), then one count of the
       workers that saw one: on the device (`_skip_device`: the flag summed over the workers
       there, read by the steps' kernels), or on the host (one read of the flag, one all-reduce
       of one integer at P > 1). "raise": no count.
    2. The steps, in lockstep (one wait a phase) where each works in its bucket's own buffer;
       a bucket cast to float32 for its step alone, so that one cast copy at a time is alive.
       With a skip every step leaves its state and makes its bucket all NaN.
    """
    book = state.book
    if skip.counted_by_step and state.compression.nonfinite == "propagate":
        if not checked:
            for _, buffer in steps:
                book.nonfinite.check(buffer)
        device = _skip_device(state, steps)
        if device is not None:
            flag = book.nonfinite.take(device)
            if state.get_transport().size > 1:
                state.get_transport().allreduce_sum_tensors([flag])
            skip = Skip.on_device(flag)
        else:
            skip = Skip.decided(count_workers(state.get_transport(), book.nonfinite.read()) > 0)
    in_place = [_in_own_buffer(buffer) for _, buffer in steps]
    run_in_lockstep([_step_in_place(sparse, buffer, skip)
                     for (sparse, buffer), own in zip(steps, in_place) if own])
    for (sparse, buffer), own in zip(steps, in_place):
        if not own:
            drive(_step_in_place(sparse, buffer, skip))
    return Skip.decided(False) if skip.counted_by_step else skip  # "raise": none skipped


def _skip_device(state: GTopkHookState, steps: list[tuple[SparseStep, torch.Tensor]]
                 ) -> torch.device | None:
    """The device on which this iteration's skip is decided (`skip_on_device`), or None for
    the host: every bucket on that device, every step able to, and the transport summing
    tensors there (or one worker). The same answer on every worker (the same configuration,
    devices of the same kind)."""
    if state.skip_on_device is False or not steps:
        return None
    devices = {buffer.device for _, buffer in steps}
    if len(devices) != 1:
        return None
    device = devices.pop()
    if state.skip_on_device is None and device.type != "cuda":
        return None
    transport = state.get_transport()
    if transport.size > 1 and not transport.takes_tensors_on(device):
        return None
    if not all(sparse.skips_on_device for sparse, _ in steps):
        return None
    return device


def _step_device(device: torch.device) -> torch.device | None:
    """Where a bucket's step keeps its residual and velocity: the bucket's GPU, in torch
    tensors, when gtopk_hvd's CUDA kernels are built; else None: numpy on the host."""
    return device if device.type == "cuda" and ops.cuda_built else None


def _step_in_place(sparse: SparseStep, buffer: torch.Tensor,
                   skip: Skip = Skip.COUNT) -> Phases:
    """buffer := the averaged sparse update of the gradient it holds (any float dtype); all NaN
    if skipped (`SparseStep.phases`' skip). A generator of the step's host reads
    (`gtopk_hvd.lockstep`): `drive` it alone, or `run_in_lockstep` with the iteration's other
    buckets, whose steps then share their waits (MiCRO's and ExDyna's two a step on a device)."""
    work = buffer if _in_own_buffer(buffer) else buffer.to(torch.float32).contiguous()
    if sparse.backend.name == "torch":  # the state is on the bucket's device
        yield from sparse.phases(work, work, clear_gradient=True, skip=skip)
    elif not work.is_cuda:
        array = work.detach().numpy()
        yield from sparse.phases(array, array, clear_gradient=True, skip=skip)
    else:  # a GPU without gtopk_hvd's CUDA kernels: the step on the host
        array = work.detach().cpu().numpy()
        yield from sparse.phases(array, array, clear_gradient=True, skip=skip)
        work.copy_(torch.from_numpy(array))
    if work is not buffer:
        buffer.copy_(work)


def _in_own_buffer(buffer: torch.Tensor) -> bool:
    """Whether a bucket's step works in its buffer itself (float32, contiguous), with no cast
    copy."""
    return buffer.dtype == torch.float32 and buffer.is_contiguous()


def _allreduce_average(process_group: Any, buffer: torch.Tensor,
                       divide_after: bool = False) -> torch.futures.Future:
    """DDP's default: the bucket averaged over the workers by one all-reduce, divided by P
    before it (DDP's order) or, divide_after, after it (the optimizer path's dense start)."""
    size = dist.get_world_size(process_group)
    if not divide_after:
        buffer.div_(size)
    work = dist.all_reduce(buffer, group=process_group, async_op=True)
    return work.get_future().then(
        lambda future: future.value()[0].div_(size) if divide_after else future.value()[0])


def register_once(model: Any, state: GTopkHookState, fix: str) -> None:
    """Registers gtopk_hook with `state` on the DDP `model` unless it has them already (a
    client's own registration); another hook or state there is refused, `fix` saying what to
    give instead."""
    hooks = getattr(model, "_comm_hooks", [])
    if not hooks:
        model.register_comm_hook(state, gtopk_hook)
    elif any(hook is not gtopk_hook or held is not state for hook, held in hooks):
        raise RuntimeError(f"gtopk_hvd: the DDP model already has another communication hook "
                           f"or state than the one given: {fix}")


class WorkerCount:
    """Whether every worker of the process group runs the hook: each worker counts itself in
    the group's store at its first hook call, and before the first sparse collective the count
    must be the group's size. A worker without the hook runs DDP's all-reduce, which matches
    the hook's dense start but not its sparse steps; so the workers with the hook raise there,
    naming the fix, instead of a backend's size mismatch. By the first sparse iteration after
    a dense start every worker's first call is long done (the dense all-reduces needed them);
    a restored state's first iteration is sparse, and waits up to WAIT_S for the count."""

    WAIT_S = 300.0
    _made = itertools.count()  # the same sequence on every worker (states made alike)

    __slots__ = ("checked", "key", "size", "store")

    def __init__(self, store: Any, key: str, size: int) -> None:
        self.store, self.key, self.size, self.checked = store, key, size, store is None

    @classmethod
    def start(cls, process_group: Any) -> WorkerCount:
        number = next(cls._made)
        size = dist.get_world_size(process_group)
        try:
            store = dist.distributed_c10d._get_default_store()
            ranks = dist.get_process_group_ranks(process_group or dist.group.WORLD)
        except (AttributeError, RuntimeError, ValueError):  # no store to count in
            return cls(None, "", size)
        key = f"gtopk_hvd/hook/{number}/{'-'.join(map(str, ranks))}"
        store.add(key, 1)
        return cls(store, key, size)

    def check_every_worker(self, wait: bool) -> None:
        """Raises unless every worker has counted itself; wait: up to WAIT_S for them (this
        process's first iteration, where the others may not have reached their first call)."""
        if self.checked:
            return
        deadline = time.monotonic() + (self.WAIT_S if wait else 0.0)
        count = self.store.add(self.key, 0)
        while count < self.size and time.monotonic() < deadline:
            time.sleep(0.05)
            count = self.store.add(self.key, 0)
        if count != self.size:
            raise RuntimeError(
                f"gtopk_hook runs on {count} of the process group's {self.size} workers: "
                "register it (model.register_comm_hook(state, gtopk_hook), with a state of "
                "its own) on every rank, before the first backward; the others run DDP's "
                "all-reduce, which does not match the hook's sparse steps")
        self.checked = True


def _check_reduction_is_not_a_scheme(reduction: Any, density: float | None) -> None:
    """reduction= names the gTop-k / Top-k step's reduction; a scheme's name there (e.g.
    "micro") is told to use compression=."""
    if isinstance(reduction, str) and reduction in SCHEME_NAMES and reduction != "gtopk":
        arguments = f"{0.01 if density is None else density}"
        raise OptionError(
            f"gtopk_hvd: reduction={reduction!r} is a scheme, not a reduction: "
            f"GTopkHookState(compression={call_for(reduction, arguments)}); reduction= picks "
            "the reduction of gTop-k's select-and-reduce step: \"gtopk\" (the default) or "
            "\"allgather\" (Top-k)")


def _optimizer_link(compression: SparseCompression, freeze_variance_after: int | None,
                    max_grad_norm: float | None, start_iter: int) -> HookOptimizer:
    """The state's `HookOptimizer`, its settings checked (freeze_variance_after >= start_iter:
    DDP's first iterations are dense anyway, and the optimizer path counts N dense steps)."""
    if freeze_variance_after is not None:
        check_integer("freeze_variance_after", freeze_variance_after, start_iter,
                      fix=f"the dense start must cover DDP's first start_iter={start_iter} "
                          "iterations, which the hook all-reduces densely anyway")
    return HookOptimizer(freeze_variance_after, max_grad_norm,
                         compression.momentum if compression.momentum_correction else None,
                         compression.nonfinite == "raise")


def _future(buffer: torch.Tensor) -> torch.futures.Future:
    return torch.futures.Future(devices=[buffer.device]) if buffer.is_cuda else (
        torch.futures.Future())


def _done(buffer: torch.Tensor) -> torch.futures.Future:
    future = _future(buffer)
    future.set_result(buffer)
    return future


HOOK_TRANSPORTS = ("torch", "mpi", "horovod")
"""The registered transport names that can serve the DDP hook ("local" is the simulated
cluster's threads, not a process group's workers)."""

TORCH_BACKENDS = ("nccl", "gloo", "ucc", "mpi", "cuda", "cpu")


def _check_transport_argument(transport: Any) -> None:
    """None, a Transport, or a name in HOOK_TRANSPORTS; a torch.distributed backend's name
    (e.g. "nccl") is told to use "torch" over a process group of that backend."""
    if transport is None or isinstance(transport, Transport):
        return
    allowed = ("None (the default: torch.distributed over the process group), "
               f"{', '.join(map(repr, HOOK_TRANSPORTS))} or a gtopk_hvd Transport")
    if not isinstance(transport, str):
        refuse("transport", allowed, transport, wrong_type=True)
    if transport in HOOK_TRANSPORTS:
        TRANSPORTS.get(transport)
        return
    fix = "unknown transport name"
    if transport.lower() in TORCH_BACKENDS and transport != "mpi":
        fix = (f"{transport!r} is a torch.distributed backend, not a transport: NCCL (or Gloo) "
               "is transport=\"torch\" (or None, the default) over a process group made with "
               f"dist.init_process_group(backend={transport.lower()!r})")
    elif transport == "local":
        fix = ("'local' is the simulated cluster's threads (gtopk_hvd.transports.local), which "
               "cannot serve a DDP process group's workers")
    refuse("transport", allowed, transport, fix)


def _layout(bucket: Any) -> Layout:
    return tuple((tuple(p.shape), str(p.dtype).replace("torch.", ""))
                 for p in bucket.parameters())


def _fields(compression: SparseCompression) -> dict[str, Any]:
    """The compression's fields as plain values (what a checkpoint records and compares)."""
    return {field.name: getattr(compression, field.name)
            for field in dataclasses.fields(compression)}




__all__ = ["GTopkHookState", "HookBucket", "check_matches_process_group", "end_process_group",
           "gtopk_hook", "register_once"]
