"""The DDP hook's bookkeeping of buckets, in a class of its own (`HookBuckets`), so that the
hook's state (`gtopk_hvd.torch.ddp.GTopkHookState`) holds settings and counters and the hook
function the algorithm.

Per process, for one DDP model:

    stepped            DDP bucket index -> `HookBucket` (layout, SparseStep) of each bucket
                       that has stepped
    seen               index -> (layout, parameter sizes) of each final bucket seen, stepped or
                       not (a checkpoint taken before its first step keeps its layout)
    restored           a restored state's bucket states that no bucket has taken up yet
    restored_indices   the restored state's bucket indices (empty: not restored)
    remap              `BucketRemap`: where parameters lie in DDP's construction-time and final
                       buckets, and a restored state's first iteration on a new model
    model_parameters   the first model's parameters (id -> weak reference), to refuse a second
                       model on the same state
    pending, nonfinite, early
                       this iteration's held buckets (SparseStep, buffer, future), their
                       non-finite reads (`NonfiniteFlags`) and their early steps (`EarlySteps`)

The rules: a bucket keeps its layout once its sparse steps start (a change raises); a restored
state's buckets are taken up by the same indices and layouts; what a checkpoint keeps is
`saved()`'s.
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Callable
from typing import Any, NamedTuple

import torch

from gtopk_hvd.core import SparseStep, StepStats
from gtopk_hvd.nonfinite import NonfiniteFlags
from gtopk_hvd.torch.bucket_remap import BucketRemap, Layout
from gtopk_hvd.torch.early_steps import EarlySteps


class HookBucket(NamedTuple):
    """A DDP bucket that the hook steps: its layout (each parameter's shape and dtype) and its
    sparse step (residual, velocity, step count, last_stats)."""

    layout: Layout
    step: SparseStep


MakeStep = Callable[[int, Layout, list[int], torch.device, "dict | None"], SparseStep]
"""(index, layout, sizes, device, saved state or None) -> the bucket's new SparseStep."""


class HookBuckets:
    """The buckets of one hook state in this process (module docstring)."""

    __slots__ = ("early", "model_parameters", "nonfinite", "pending", "remap", "restored",
                 "restored_indices", "seen", "stepped")

    def __init__(self, restored: dict[int, dict] | None = None,
                 construction: Any = None) -> None:
        self.stepped: dict[int, HookBucket] = {}
        self.seen: dict[int, tuple[Layout, list[int]]] = {}
        self.restored: dict[int, dict] = dict(restored or {})
        self.restored_indices: set[int] = set(self.restored)
        self.remap = BucketRemap(construction)
        self.model_parameters: dict[int, weakref.ref] | None = None
        self.pending: list[tuple[SparseStep, torch.Tensor, torch.futures.Future]] = []
        self.nonfinite = NonfiniteFlags()
        self.early = EarlySteps()

    def check_same_model(self, bucket: Any, layout: Layout) -> None:
        """Raises if the bucket holds a parameter that this process's first iteration did not
        while that iteration's parameters all live (the state registered on a second DDP
        model): one state serves one model."""
        parameters = list(bucket.parameters())
        if self.model_parameters is None:
            self.model_parameters = {}
        known = self.model_parameters
        if not self.remap.first_iteration_done:
            known.update((id(p), weakref.ref(p)) for p in parameters)
            return
        if all(id(p) in known and known[id(p)]() is p for p in parameters):
            return
        if any(reference() is None for reference in known.values()):
            return  # the first model is gone: nothing to confuse the state with
        index = bucket.index()
        was = self.stepped[index].layout if index in self.stepped else layout
        change = (f"DDP bucket {index} changed from {describe(was)} to {describe(layout)} "
                  "and holds" if was != layout else f"DDP bucket {index} holds")
        raise RuntimeError(
            f"gtopk_hook: {change} parameters that this state's first model did not: this "
            "GTopkHookState is registered on a second DDP model; make one GTopkHookState per "
            "DDP model (each keeps its own residuals)")

    def note_final(self, bucket: Any, layout: Layout) -> None:
        """Records a bucket of DDP's final layout (any iteration after this process's first):
        its parameters, for the remap's record, and its layout and sizes, for checkpoints
        taken before its first sparse step."""
        self.remap.note_final(bucket)
        self.seen.setdefault(bucket.index(), (layout, sizes_of(bucket)))

    def step_for(self, bucket: Any, layout: Layout, make: MakeStep) -> SparseStep:
        """The bucket's SparseStep (made by `make` on its first sparse step, from the restored
        state if any); raises if the bucket's layout is not the one it had or was saved
        with."""
        index = bucket.index()
        self.note_final(bucket, layout)
        if index in self.stepped:
            known, sparse = self.stepped[index]
            if known != layout:
                raise RuntimeError(
                    f"gtopk_hook: DDP bucket {index} changed from {describe(known)} to "
                    f"{describe(layout)}; the hook keeps a residual per bucket, so DDP's "
                    "buckets must stay fixed once the sparse steps start (start_iter >= 2 lets "
                    "DDP rebuild them first)")
            return sparse
        if self.restored_indices and index not in self.restored_indices:
            raise RuntimeError(f"gtopk_hook: DDP bucket {index} is not in the restored state, "
                               f"whose buckets are {sorted(self.restored_indices)}")
        saved = self.restored.pop(index, None)
        if saved is not None and layout_of_saved(saved) != layout:
            raise RuntimeError(
                f"gtopk_hook: DDP bucket {index} is {describe(layout)}, the restored state's "
                f"was {describe(layout_of_saved(saved))}: restore into the same model with "
                "the same DDP bucket settings")
        sizes = list(saved["sizes"]) if saved is not None else sizes_of(bucket)
        return self.add(index, layout, make(index, layout, sizes, bucket.buffer().device, saved))

    def add(self, index: int, layout: Layout, sparse: SparseStep) -> SparseStep:
        """Keeps bucket `index`'s step; returns it."""
        self.stepped[index] = HookBucket(layout, sparse)
        return sparse

    def fail_held(self, error: BaseException) -> None:
        """Fails every bucket future held (this iteration's, and a restored state's
        construction-time ones) with `error`; holds nothing after."""
        pending, self.pending = self.pending, []
        self.nonfinite.clear()
        self.early.clear()
        for _, _, future in pending:
            if not future.done():
                future.set_exception(error)
        self.remap.release(error)

    def saved(self) -> tuple[dict[int, dict], Any]:
        """(every bucket's state for a checkpoint: its layout, parameter sizes, the number of
        workers it stepped with, residual (and velocity) as tensors, step count, the scheme's
        own state; only the layout and sizes for a bucket not yet stepped; the remap's
        record)."""
        buckets = dict(self.restored)
        for index, (layout, sizes) in self.seen.items():
            buckets.setdefault(index, {"layout": layout, "sizes": sizes})
        for index, (layout, sparse) in self.stepped.items():
            saved = sparse.state_dict()
            buckets[index] = {"layout": layout, "sizes": list(sparse.sizes),
                              "workers": sparse.transport.size,
                              **{key: torch.from_numpy(value) if hasattr(value, "dtype")
                                 else value for key, value in saved.items()}}
        return buckets, self.remap.record(restoring=bool(self.restored))

    @property
    def last_stats(self) -> dict[int, StepStats]:
        """Each bucket's last sparse step (bytes sent and received, k, times)."""
        return {index: bucket.step.last_stats for index, bucket in self.stepped.items()
                if bucket.step.last_stats is not None}


def without_residuals(saved: dict) -> dict:
    """A saved bucket with its residual and velocity set to zero (a worker new to the job)."""
    return {key: torch.zeros_like(value) if key in ("residual", "velocity") else value
            for key, value in saved.items()}


def layout_of_saved(saved: dict) -> Layout:
    return tuple((tuple(shape), dtype) for shape, dtype in saved["layout"])


def sizes_of(bucket: Any) -> list[int]:
    """The bucket's parameter sizes (for granularity "bucket"), or its size as one part."""
    sizes = [p.numel() for p in bucket.parameters()]
    return sizes if sum(sizes) == bucket.buffer().numel() else [bucket.buffer().numel()]


def describe(layout: Layout) -> str:
    values = sum(math.prod(shape) for shape, _ in layout)
    return f"{len(layout)} parameters ({values} values: {[list(s) for s, _ in layout]})"
