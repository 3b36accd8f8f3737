"""A restored DDP hook state on a new DDP model: its checkpoint onto DDP's first buckets.

The DDP hook (`gtopk_hvd.torch.ddp`) keeps a residual (and a velocity, a step count) per DDP
bucket, and DDP has two bucket layouts in every process:

  construction-time   what `DistributedDataParallel(model)` builds before any backward: the
                      parameters in the reverse of `model.parameters()`'s order, split by dtype
                      and device and cut at `bucket_cap_mb` (the first bucket at 1 MiB by
                      default). It depends only on the model and the bucket settings, so a new
                      DDP over the same model with the same settings builds the same buckets in
                      every process. DDP reduces the first iteration's gradients in them.
  final               DDP rebuilds its buckets once, at the start of the second iteration, in
                      the order the first backward made the gradients ready, and keeps them.

The hook's sparse steps start after DDP's rebuild (`start_iter` >= 2), so a checkpoint holds the
final buckets' residuals, while the first iteration of a new DDP model, the one a restored state
is registered on, hands the hook the construction-time buckets: other parameters per bucket, in
another order. `BucketRemap` bridges the two.

The rule. In a process's first iteration the hook shows `BucketRemap` every bucket (`observe`):
its index, its layout (each parameter's shape and dtype) and its parameters. Once the sparse
steps run it shows it each final bucket's parameters (`note_final`). A parameter is found in
both by its identity in this process (`id()`), and `record` names it by a place that holds in
any process: (construction-time bucket, position in that bucket's `parameters()`). The record
`{"layouts": [construction-time layout per bucket], "places": {final bucket: [(construction
bucket, position) per parameter]}}` goes into the checkpoint. After a restore, the new model's
first iteration is remapped when its buckets are the recorded construction-time layouts and no
saved bucket has been stepped yet (`applies`): the hook holds every bucket (`hold`; their
futures complete later) until the last one, then cuts each held bucket's flat gradient into its
parameters' views (in `parameters()` order, each `numel()` values), joins each saved bucket's
views in its own order (`gradients`), runs the saved buckets' steps on those, writes the
results back into the views (`scatter`) and completes the held futures (`release`). From the
second iteration on, DDP's buckets are the final ones and the saved steps go on as they were.
"""

from __future__ import annotations

from typing import Any

import torch

Layout = tuple[tuple[tuple[int, ...], str], ...]  # (shape, dtype) of each parameter of a bucket


class BucketRemap:
    """Where each parameter lies in DDP's construction-time and final buckets, and a restored
    state's first iteration on a new model (module docstring). Fields:

    saved_record: the record the restored checkpoint holds (what `record()` returned), or None.
    first_iteration: this process's first iteration, DDP's construction-time buckets: per
    bucket, its index, its parameters' id() and its layout.
    first_iteration_done: whether this process's first DDP iteration has ended.
    final_parameters: each final bucket's parameters, by id(), in the bucket's order.
    held: in the restored state's first iteration, the buckets so far, with their buffers and
    futures (`hold`).
    """

    __slots__ = ("final_parameters", "first_iteration", "first_iteration_done", "held",
                 "saved_record")

    def __init__(self, saved_record: dict | None = None) -> None:
        self.saved_record: dict | None = saved_record
        self.first_iteration: list[tuple[int, list[int], Layout]] = []
        self.first_iteration_done = False
        self.final_parameters: dict[int, list[int]] = {}
        self.held: list[tuple[Any, torch.Tensor, torch.futures.Future]] = []

    # -- the record ---------------------------------------------------------------------

    def observe(self, bucket: Any, layout: Layout) -> None:
        """A bucket of this process's first iteration (call before `end_iteration`)."""
        if not self.first_iteration_done:
            self.first_iteration.append((bucket.index(), [id(p) for p in bucket.parameters()],
                                         layout))

    def end_iteration(self) -> None:
        """The iteration's last bucket has been handled."""
        self.first_iteration_done = True

    def note_final(self, bucket: Any) -> None:
        """A bucket of DDP's final layout (any iteration after this process's first)."""
        self.final_parameters.setdefault(bucket.index(), [id(p) for p in bucket.parameters()])

    def record(self, restoring: bool = False) -> dict | None:
        """{"layouts": [layout per construction-time bucket], "places": {final bucket:
        [(construction-time bucket, position) per parameter]}} of this process; the restored
        one while this process cannot tell (its first iteration not over, no final bucket
        seen, or `restoring`: saved buckets not yet stepped)."""
        if not self.first_iteration_done or restoring or not self.final_parameters:
            return self.saved_record
        where = {pid: (c, q) for c, ids, _ in self.first_iteration for q, pid in enumerate(ids)}
        places = {}
        for index, ids in self.final_parameters.items():
            if any(pid not in where for pid in ids):
                return self.saved_record
            places[index] = [where[pid] for pid in ids]
        return {"layouts": [layout for _, _, layout in self.first_iteration], "places": places}

    # -- the restored state's first iteration ----------------------------------------------

    def applies(self, index: int, layout: Layout, saved: set[int] | dict) -> bool:
        """Whether this bucket of the first iteration is one of the recorded construction-time
        buckets, to be split into the saved buckets (whose indices are `saved`, none of them
        stepped yet)."""
        if self.first_iteration_done or not saved or self.saved_record is None:
            return False
        layouts = [tuple((tuple(shape), dtype) for shape, dtype in bucket)
                   for bucket in self.saved_record["layouts"]]
        if index >= len(layouts) or layouts[index] != layout:
            return False
        return set(self.saved_record["places"]) == set(saved)

    @property
    def holding(self) -> bool:
        """Whether buckets of the restored state's first iteration are held."""
        return bool(self.held)

    def hold(self, bucket: Any, buffer: torch.Tensor, future: torch.futures.Future) -> None:
        """Keeps a construction-time bucket, its buffer and its future until the last one."""
        self.held.append((bucket, buffer, future))

    def gradients(self) -> dict[int, list[torch.Tensor]]:
        """Once the last bucket is held: each saved bucket's parameters' gradients, as views
        of the held buffers in the saved bucket's order, by saved bucket index (ascending)."""
        record = self.saved_record
        if [b.index() for b, _, _ in self.held] != list(range(len(record["layouts"]))):
            raise RuntimeError("gtopk_hook: DDP's first buckets differ from the restored "
                               "state's record of them")
        pieces = [parameter_views(b, buffer) for b, buffer, _ in self.held]
        return {int(index): [pieces[c][q] for c, q in record["places"][index]]
                for index in sorted(record["places"])}

    def parameters(self) -> dict[int, list[torch.Tensor]]:
        """Like `gradients`: each saved bucket's parameters, in its order."""
        record = self.saved_record
        held = [list(b.parameters()) for b, _, _ in self.held]
        return {int(index): [held[c][q] for c, q in record["places"][index]]
                for index in sorted(record["places"])}

    def release(self, error: BaseException | None = None) -> None:
        """Completes every held future with its bucket's buffer, or fails it with `error`;
        holds nothing after."""
        held, self.held = self.held, []
        for _, buffer, future in held:
            if error is None:
                future.set_result(buffer)
            elif not future.done():
                future.set_exception(error)


def parameter_views(bucket: Any, buffer: torch.Tensor) -> list[torch.Tensor]:
    """Each parameter's gradient as a view of the bucket's flat buffer."""
    views, offset = [], 0
    for parameter in bucket.parameters():
        views.append(buffer[offset:offset + parameter.numel()])
        offset += parameter.numel()
    if offset != buffer.numel():
        raise RuntimeError(f"gtopk_hook: DDP bucket {bucket.index()} holds {buffer.numel()} "
                           f"values, its parameters {offset}")
    return views


def gather(views: list[torch.Tensor]) -> torch.Tensor:
    """The views joined into one flat float32 tensor (a saved bucket's gradient)."""
    return torch.cat([view.reshape(-1).to(torch.float32) for view in views])


def scatter(flat: torch.Tensor, views: list[torch.Tensor]) -> None:
    """Writes `gather`'s flat tensor (after the step) back into the views."""
    offset = 0
    for view in views:
        view.copy_(flat[offset:offset + view.numel()].view_as(view))
        offset += view.numel()


__all__ = ["BucketRemap", "Layout", "gather", "parameter_views", "scatter"]
