"""A DDP communication hook: gTop-k (or Top-k) sparsified gradients with error feedback.

    from torch.nn.parallel import DistributedDataParallel as DDP
    from gtopk_hvd.torch.ddp import GTopkHookState, gtopk_hook

    model = DDP(model)                                   # under torchrun, any backend
    state = GTopkHookState(process_group=None, density=0.01)              # gTop-k
    # or GTopkHookState(compression=Compression.topk(0.01, momentum_correction=True))
    model.register_comm_hook(state, gtopk_hook)

Shaped like PyTorch's PowerSGD hook: one state object, one hook function. For every DDP bucket
b (a flat gradient g_b of d_b values, on worker p of P) the hook runs the core step of
`gtopk_hvd.sparse_state` (its module docstring has the whole step, momentum correction and
warm-up included), with a residual r_b per bucket and k_b = ceil(density * d_b):

    acc = r_b + g_b;  (I_p, V_p) = top-k(acc, k_b);  r_b = acc with I_p set to 0
    (I, V) = gTop-k (or Top-k all-gather) of every worker's (I_p, V_p)      V: sums
    r_b[j] += V_p[j] for j in I_p not in I
    bucket gradient := V / P at I, 0 elsewhere          (the same on every worker)

The reduction runs on torch.distributed (`TorchDistributedTransport(process_group)`) and blocks
inside the hook; the returned future is already complete. Buckets of float16, bfloat16 or
float64 gradients are cast to float32 for the step and back. On a GPU with gtopk_hvd's CUDA
kernels, the selection and the residual stay on the device; without them, the bucket is copied
to the host and back.

Non-finite gradients (GradScaler with DDP): with the compression's default nonfinite="propagate"
the hook holds each bucket (its future completes later) until the iteration's last one, reads
every held bucket once for NaN/Inf, counts the workers that saw one with one all-reduce of one
integer, and only then runs the buckets' steps. If any worker's bucket was not finite, every
bucket of every worker becomes all NaN and no residual, velocity or step count changes, so the
scaler skips the whole step on every worker and nothing is lost: deciding per bucket could not
undo the buckets already stepped when a later one overflows. `state.iter` does not count such
an iteration (the warm-up goes on where it was). The steps run at the last bucket instead of as
each bucket arrives: they block inside the hook either way. nonfinite="raise": each bucket steps
as it arrives and every worker raises FloatingPointError at the first NaN/Inf.

DDP builds its final buckets only after its first iteration, so (as PowerSGD does) the first
`start_iter` iterations (default 2, at least 2) run DDP's plain all-reduce average; the sparse
steps start after. A bucket whose layout changes later raises an error: each keeps its own
residual. The warm-up densities of the compression count DDP iterations (`state.iter`),
the dense ones included.

Checkpointing: pickling the state (torch.save, weights_only=False to load) keeps the
compression, `iter` and every bucket's residual, velocity and step count, and drops the process
group (`process_group` is None, the default group, after loading: set it before the next
iteration for another one); `state_dict()` / `load_state_dict()` give the same as plain tensors.
Each worker saves its own (residuals differ between workers). A restored state registered on a
new DDP model continues exactly as the saved one would have: in the new model's first
iteration, whose buckets are DDP's construction-time ones, the hook splits the gradients into
the saved buckets (it recorded where each parameter lies in both layouts) and runs their steps.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.distributed as dist

from gtopk_hvd import ops
from gtopk_hvd.compression import SparseCompression
from gtopk_hvd.sparse_state import SparseState, StepStats, nonfinite_workers, sparse_update
from gtopk_hvd.transports.torch_distributed import TorchDistributedTransport

Layout = tuple[tuple[tuple[int, ...], str], ...]  # (shape, dtype) of each parameter of a bucket


class GTopkHookState:
    """What `gtopk_hook` keeps between iterations.

    process_group: the group whose workers reduce (None: the default group; use DDP's).
    density: k / d of each bucket (default 0.01), with `reduction` ("gtopk", or "allgather" for
    Top-k S-SGD) and `options`, the other fields of `gtopk_hvd.compression.SparseCompression`
    (wire_dtype, warmup_densities, warmup_steps, momentum_correction, momentum, granularity,
    sparsifier, seed); or, instead of these, a ready `compression=` (e.g. Compression.gtopk(..)).
    granularity "model" selects over each bucket as a whole, "bucket" each parameter's share.
    start_iter: DDP iterations of plain all-reduce before the sparse steps (>= 2).
    """

    def __init__(self, process_group: Any = None, density: float | None = None, *,
                 compression: SparseCompression | None = None, reduction: str | None = None,
                 start_iter: int = 2, **options: Any) -> None:
        if compression is None:
            if "selection" in options:
                options["granularity"] = options.pop("selection")
            compression = SparseCompression(reduction or "gtopk",
                                            0.01 if density is None else density, **options)
        elif not isinstance(compression, SparseCompression):
            raise TypeError(f"compression must be a sparse one (Compression.gtopk, .topk or "
                            f".sparse), got {compression!r}; for dense gradients register no "
                            "hook (DDP's own all-reduce)")
        elif density is not None or reduction is not None or options:
            raise ValueError("give either compression= or density / reduction / options, "
                             "not both")
        if isinstance(start_iter, bool) or not isinstance(start_iter, int) or start_iter < 2:
            raise ValueError(f"start_iter must be an integer >= 2 (DDP rebuilds its buckets "
                             f"after the first iteration), got {start_iter!r}")
        self.process_group = process_group
        self.compression = compression
        self.start_iter = start_iter
        self.iter = 0
        self._reset_process_state()

    def _reset_process_state(self) -> None:
        """What lives in this process only (not checkpointed)."""
        self._transport: TorchDistributedTransport | None = None
        self._buckets: dict[int, tuple[Layout, SparseState]] = {}
        self._saved: dict[int, dict] = {}  # restored bucket states not yet used
        self._restored: set[int] = set()  # the restored state's bucket indices
        self._construction: dict | None = None  # restored: where parameters lie (docstring)
        self._first: list[tuple[int, list[int], Layout]] = []  # this process's 1st iteration
        self._first_done = False
        self._param_ids: dict[int, list[int]] = {}  # bucket -> id() of its parameters
        self._seen: dict[int, tuple[Layout, list[int]]] = {}  # bucket -> layout, sizes
        self._held: list[tuple[Any, torch.Tensor, torch.futures.Future]] = []
        # nonfinite="propagate": this iteration's buckets, stepped together at the last one.
        self._pending: list[tuple[SparseState, torch.Tensor, torch.futures.Future]] = []

    # -- checkpoint -----------------------------------------------------------------------

    def state_dict(self) -> dict:
        """iter, and per bucket its layout, residual (velocity) and step count, as tensors
        (only the layout for a bucket not yet stepped)."""
        buckets = dict(self._saved)
        for index, (layout, sizes) in self._seen.items():
            buckets.setdefault(index, {"layout": layout, "sizes": sizes})
        for index, (layout, sparse) in self._buckets.items():
            saved = sparse.state_dict()
            buckets[index] = {"layout": layout, "sizes": list(sparse.sizes),
                              **{key: torch.from_numpy(value) if hasattr(value, "dtype")
                                 else value for key, value in saved.items()}}
        return {"iter": self.iter, "start_iter": self.start_iter, "buckets": buckets,
                "construction": self._construction_now()}

    def load_state_dict(self, state: dict) -> None:
        """Restores what state_dict() returned (the compression must be the saved one's)."""
        self._reset_process_state()
        self.iter = int(state["iter"])
        self.start_iter = int(state["start_iter"])
        self._saved = {int(index): dict(bucket) for index, bucket in state["buckets"].items()}
        self._restored = set(self._saved)
        self._construction = state.get("construction")

    def __getstate__(self) -> dict:
        """The compression and state_dict(); the process group is left out."""
        return {"compression": self.compression, **self.state_dict()}

    def __setstate__(self, state: dict) -> None:
        """The process group becomes None (the default group): set it after loading for
        another one."""
        self.process_group = None
        self.compression = state["compression"]
        self.load_state_dict(state)

    @property
    def last_stats(self) -> dict[int, StepStats]:
        """Each bucket's last sparse step (bytes sent and received, k, times)."""
        return {index: sparse.last_stats for index, (_, sparse) in self._buckets.items()
                if sparse.last_stats is not None}

    def _construction_now(self) -> dict | None:
        """Where each parameter of the sparse buckets lay in DDP's construction-time buckets
        (this process's first iteration): {"layouts": [layout per bucket], "places":
        {bucket: [(construction bucket, position)]}}; the restored one if unknown here."""
        if not self._first_done or self._saved or not self._param_ids:
            return self._construction
        where = {pid: (c, q) for c, ids, _ in self._first for q, pid in enumerate(ids)}
        places = {}
        for index, ids in self._param_ids.items():
            if any(pid not in where for pid in ids):
                return self._construction
            places[index] = [where[pid] for pid in ids]
        return {"layouts": [layout for _, _, layout in self._first], "places": places}

    # -- per bucket -----------------------------------------------------------------------

    def _remember(self, bucket: Any, layout: Layout) -> None:
        """Records a bucket of DDP's final layout (any iteration after this process's first):
        its parameters, for the record of where they lie, and its layout, for checkpoints
        taken before its first sparse step."""
        index = bucket.index()
        if index not in self._param_ids:
            self._param_ids[index] = [id(p) for p in bucket.parameters()]
            self._seen[index] = (layout, _sizes(bucket))

    def _transport_now(self) -> TorchDistributedTransport:
        if self._transport is None:
            self._transport = TorchDistributedTransport(self.process_group)
        return self._transport

    def _new_sparse(self, index: int, layout: Layout, sizes: list[int], device: torch.device,
                    saved: dict | None) -> SparseState:
        on_gpu = device.type == "cuda" and ops.cuda_built

        def zeros_on_gpu(n: int) -> torch.Tensor:
            return torch.zeros(n, dtype=torch.float32, device=device)

        sparse = SparseState(self.compression, sizes, self._transport_now(),
                             zeros=zeros_on_gpu if on_gpu else None,
                             signature=f"DDP bucket {index}: {layout}", what="DDP parameter")
        if saved is None or "residual" not in saved:
            sparse.step_count = self.iter  # the warm-up counts DDP iterations
        else:
            sparse.load_state_dict(saved)
        self._buckets[index] = (layout, sparse)
        return sparse

    def _sparse_for(self, bucket: Any, layout: Layout) -> SparseState:
        index = bucket.index()
        self._remember(bucket, layout)
        if index in self._buckets:
            known, sparse = self._buckets[index]
            if known != layout:
                raise RuntimeError(
                    f"gtopk_hook: DDP bucket {index} changed from {_describe(known)} to "
                    f"{_describe(layout)}; the hook keeps a residual per bucket, so DDP's "
                    "buckets must stay fixed once the sparse steps start (start_iter >= 2 lets "
                    "DDP rebuild them first)")
            return sparse
        if self._restored and index not in self._restored:
            raise RuntimeError(f"gtopk_hook: DDP bucket {index} is not in the restored state, "
                               f"whose buckets are {sorted(self._restored)}")
        saved = self._saved.pop(index, None)
        if saved is not None and _layout_of_saved(saved) != layout:
            raise RuntimeError(
                f"gtopk_hook: DDP bucket {index} is {_describe(layout)}, the restored state's "
                f"was {_describe(_layout_of_saved(saved))}: restore into the same model with "
                "the same DDP bucket settings")
        sizes = list(saved["sizes"]) if saved is not None else _sizes(bucket)
        return self._new_sparse(index, layout, sizes, bucket.buffer().device, saved)


def gtopk_hook(state: GTopkHookState, bucket: dist.GradBucket
               ) -> torch.futures.Future[torch.Tensor]:
    """DDP communication hook: the bucket's gradient becomes the sparse update averaged over
    the workers (module docstring); plain all-reduce for the first state.start_iter
    iterations."""
    buffer = bucket.buffer()
    layout = _layout(bucket)
    first_iteration_here = not state._first_done
    if first_iteration_here:
        state._first.append((bucket.index(), [id(p) for p in bucket.parameters()], layout))
    elif state.iter < state.start_iter:
        state._remember(bucket, layout)
    applied = True  # whether the iteration, once its last bucket is in, counts in state.iter
    if state.iter < state.start_iter:
        future = _allreduce_average(state.process_group, buffer)
    elif first_iteration_here and _is_construction_bucket(state, bucket.index(), layout):
        future, applied = _hold_for_remap(state, bucket, buffer)
    elif state._held:
        raise RuntimeError(f"gtopk_hook: DDP bucket {bucket.index()} of the first iteration is "
                           "not one of the construction-time buckets the restored state "
                           "recorded")
    elif state.compression.nonfinite == "propagate":
        future, applied = _hold_for_check(state, state._sparse_for(bucket, layout), buffer,
                                          bucket.is_last())
    else:
        _step_in_place(state._sparse_for(bucket, layout), buffer)
        future = _done(buffer)
    if bucket.is_last():
        state.iter += int(applied)  # a skipped iteration does not count (module docstring)
        state._first_done = True
    return future


# DDP's register_comm_hook compares these annotations with the objects themselves, which
# `from __future__ import annotations` would have left as strings.
gtopk_hook.__annotations__.update(bucket=dist.GradBucket,
                                  **{"return": torch.futures.Future[torch.Tensor]})


# -- the restored state's first iteration on a new DDP model ------------------------------

def _is_construction_bucket(state: GTopkHookState, index: int, layout: Layout) -> bool:
    """Whether this bucket is one of DDP's construction-time buckets that the restored state
    must split into its saved ones (module docstring)."""
    construction = state._construction
    if not state._saved or construction is None:
        return False
    layouts = [tuple((tuple(shape), dtype) for shape, dtype in bucket)
               for bucket in construction["layouts"]]
    if index >= len(layouts) or layouts[index] != layout:
        return False
    return set(construction["places"]) == set(state._saved)


def _hold_for_check(state: GTopkHookState, sparse: SparseState, buffer: torch.Tensor,
                    last: bool) -> tuple[torch.futures.Future, bool]:
    """nonfinite="propagate": keeps the bucket until the iteration's last one, then runs every
    held bucket's step together (`_step_together`) and completes their futures. Returns the
    bucket's future and whether the iteration was applied (True until the last bucket)."""
    future = _future(buffer)
    state._pending.append((sparse, buffer, future))
    if not last:
        return future, True
    pending, state._pending = state._pending, []
    applied = _step_together(state, [(held, held_buffer) for held, held_buffer, _ in pending])
    for _, held_buffer, held_future in pending:
        held_future.set_result(held_buffer)
    return future, applied


def _hold_for_remap(state: GTopkHookState, bucket: Any,
                    buffer: torch.Tensor) -> tuple[torch.futures.Future, bool]:
    """Keeps the construction-time bucket until the last one, then runs the saved buckets'
    steps on their parameters' gradients (together: `_step_together`) and completes every held
    future. Returns the future and whether the iteration was applied."""
    future = _future(buffer)
    state._held.append((bucket, buffer, future))
    if not bucket.is_last():
        return future, True
    held, state._held = state._held, []
    construction = state._construction
    if [b.index() for b, _, _ in held] != list(range(len(construction["layouts"]))):
        raise RuntimeError("gtopk_hook: DDP's first buckets differ from the restored state's "
                           "record of them")
    pieces = [_parameter_views(b, buf) for b, buf, _ in held]
    steps = []
    for index in sorted(construction["places"]):
        saved = state._saved.pop(index)
        views = [pieces[c][q] for c, q in construction["places"][index]]
        flat = torch.cat([v.reshape(-1).to(torch.float32) for v in views])
        steps.append((state._new_sparse(index, _layout_of_saved(saved), list(saved["sizes"]),
                                        views[0].device, saved), flat, views))
    applied = _step_together(state, [(sparse, flat) for sparse, flat, _ in steps])
    for _, flat, views in steps:
        offset = 0
        for view in views:
            view.copy_(flat[offset:offset + view.numel()].view_as(view))
            offset += view.numel()
    for _, buf, held_future in held:
        held_future.set_result(buf)
    return future, applied


def _parameter_views(bucket: Any, buffer: torch.Tensor) -> list[torch.Tensor]:
    """Each parameter's gradient as a view of the bucket's flat buffer."""
    views, offset = [], 0
    for parameter in bucket.parameters():
        views.append(buffer[offset:offset + parameter.numel()])
        offset += parameter.numel()
    if offset != buffer.numel():
        raise RuntimeError(f"gtopk_hook: DDP bucket {bucket.index()} holds {buffer.numel()} "
                           f"values, its parameters {offset}")
    return views


# -- the step ---------------------------------------------------------------------------

def _step_together(state: GTopkHookState, steps: list[tuple[SparseState, torch.Tensor]]
                   ) -> bool:
    """Runs the steps of one iteration's buckets; returns whether they were applied.
    nonfinite="propagate": one count of the workers with a NaN/Inf in any bucket first, and
    every step skipped (all NaN) if there is one; "raise": each step as it is."""
    skip = None
    if state.compression.nonfinite == "propagate":
        skip = nonfinite_workers(state._transport_now(), [buffer for _, buffer in steps]) > 0
    for sparse, buffer in steps:
        _step_in_place(sparse, buffer, skip)
    return not skip


def _step_in_place(sparse: SparseState, buffer: torch.Tensor, skip: bool | None = None) -> None:
    """buffer := the averaged sparse update of the gradient it holds (any float dtype); all NaN
    if skip (`sparse_step`'s skip)."""
    work = buffer if buffer.dtype == torch.float32 and buffer.is_contiguous() else (
        buffer.to(torch.float32).contiguous())
    if not work.is_cuda:
        array = work.detach().numpy()
        sparse_update(sparse, array, array, clear_gradient=True, skip=skip)
    elif ops.cuda_built:
        sparse_update(sparse, work, work, clear_gradient=True, skip=skip)
    else:  # a GPU without gtopk_hvd's CUDA kernels: the step on the host
        array = work.detach().cpu().numpy()
        sparse_update(sparse, array, array, clear_gradient=True, skip=skip)
        work.copy_(torch.from_numpy(array))
    if work is not buffer:
        buffer.copy_(work)


def _allreduce_average(process_group: Any, buffer: torch.Tensor) -> torch.futures.Future:
    """DDP's default: the bucket averaged over the workers by one all-reduce."""
    buffer.div_(dist.get_world_size(process_group))
    work = dist.all_reduce(buffer, group=process_group, async_op=True)
    return work.get_future().then(lambda future: future.value()[0])


def _future(buffer: torch.Tensor) -> torch.futures.Future:
    return torch.futures.Future(devices=[buffer.device]) if buffer.is_cuda else (
        torch.futures.Future())


def _done(buffer: torch.Tensor) -> torch.futures.Future:
    future = _future(buffer)
    future.set_result(buffer)
    return future


def _layout(bucket: Any) -> Layout:
    return tuple((tuple(p.shape), str(p.dtype).replace("torch.", ""))
                 for p in bucket.parameters())


def _layout_of_saved(saved: dict) -> Layout:
    return tuple((tuple(shape), dtype) for shape, dtype in saved["layout"])


def _sizes(bucket: Any) -> list[int]:
    """The bucket's parameter sizes (for granularity "bucket"), or its size as one part."""
    sizes = [p.numel() for p in bucket.parameters()]
    return sizes if sum(sizes) == bucket.buffer().numel() else [bucket.buffer().numel()]


def _describe(layout: Layout) -> str:
    values = sum(math.prod(shape) for shape, _ in layout)
    return f"{len(layout)} parameters ({values} values: {[list(s) for s, _ in layout]})"


__all__ = ["GTopkHookState", "gtopk_hook"]
