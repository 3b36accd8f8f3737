"""Gradients as views of one flat buffer (as DDP's `gradient_as_bucket_view`).

Two flat float32 buffers of d values live on the state's device and swap roles every step:

    gradient buffer  p.grad of every viewable parameter is a view of its slice, so backward
                     accumulates there in place: the step reads it without a fuse copy, and
                     its selection pass (`accumulate_select(clear_gradient=True)`) leaves it
                     all zero, ready for the next backward;
    update buffer    the step writes the sparse update there (zero + scatter, one pass) and
                     points p.grad at its slices for the wrapped optimizer: no split copy.

`zero_grad()` then points p.grad back at the gradient buffer, which is already zero: no pass
over d (whatever `set_to_none` says, viewable gradients stay zero tensors, as DDP's views do).
Without `zero_grad()` the next backward accumulates onto the update, as plain torch accumulates
onto p.grad, and that buffer becomes the gradient buffer.

Viewable: a float32, strided, contiguous parameter on the state's device. The others (float16,
bfloat16, float64, channels-last or other-device parameters) keep gradients of their own, copied
into the buffer at the step and the update copied back, cast: the fallback. A gradient that is
not the view (replaced by the user, or set to None by `model.zero_grad()` and made anew by
backward) is copied in the same way at the step, and the view restored after it.

Sparse gradients (`nn.Embedding(sparse=True)`): a hook on each parameter sees its first
gradient; a sparse one moves the parameter to the fallback for good. Its gradient is densified
into the buffer at the step and its update handed back as a sparse tensor (the update's nonzero
entries), as Horovod's `sparse_as_dense=True` does, so optimizers that need sparse gradients
(`torch.optim.SparseAdam`) work.
"""

from __future__ import annotations

import functools
from typing import Any

import torch


def _is_view(grad: torch.Tensor, view: torch.Tensor) -> bool:
    return grad is view or (grad.data_ptr() == view.data_ptr() and grad.dtype == view.dtype
                            and grad.shape == view.shape and grad.stride() == view.stride())


class FusedGradients:
    """The two buffers, the views of each parameter in each, and which p.grad points at."""

    def __init__(self, parameters: list[torch.Tensor], offsets: list[int],
                 device: torch.device) -> None:
        self.parameters = parameters
        self.bounds = list(zip(offsets[:-1], offsets[1:]))
        d = offsets[-1]
        self.buffers = [torch.zeros(d, dtype=torch.float32, device=device) for _ in range(2)]
        viewable = [p.dtype == torch.float32 and p.layout == torch.strided
                    and p.device == device and p.is_contiguous() for p in parameters]
        self.views = [[buffer[begin:end].view(p.shape) if ok else None
                       for p, (begin, end), ok in zip(parameters, self.bounds, viewable)]
                      for buffer in self.buffers]
        self.exposed: int | None = None  # the buffer p.grad views point at (None: not yet)
        self.zero = [True, True]  # buffer known to be all zeros (never exposed since cleared)
        self.sparse = [False] * len(parameters)  # gets sparse gradients: update made sparse
        # Until a parameter's first gradient is seen: whether it is sparse (module docstring).
        self._watching: dict[int, Any] = {
            i: p.register_hook(functools.partial(self._first_gradient, i))
            for i, p in enumerate(parameters) if p.requires_grad}
        self._seen: list[int] = []

    def _first_gradient(self, i: int, grad: torch.Tensor) -> None:
        """Tensor hook: notes whether parameter i's gradients are sparse (the hook is removed
        at the next step, not here: removing it while autograd runs it is not safe)."""
        if grad.is_sparse and not self.sparse[i]:
            self.sparse[i] = True
            for views in self.views:
                views[i] = None
        self._seen.append(i)

    def _stop_watching_seen(self) -> None:
        for i in self._seen:
            handle = self._watching.pop(i, None)
            if handle is not None:
                handle.remove()
        self._seen.clear()

    def gather(self) -> torch.Tensor:
        """The buffer holding every parameter's accumulated gradient (zeros for None)."""
        self._stop_watching_seen()
        source = 0 if self.exposed is None else self.exposed
        buffer = self.buffers[source]
        for parameter, (begin, end), view in zip(self.parameters, self.bounds,
                                                 self.views[source]):
            grad = parameter.grad
            if grad is None:  # unused or frozen this step: contributes zeros
                buffer[begin:end].zero_()
            elif view is None or not _is_view(grad, view):
                if grad.is_sparse:  # an embedding's sparse gradient: densified
                    grad = grad.to_dense()
                if grad.data_ptr() != buffer[begin:end].data_ptr():  # not already there
                    buffer[begin:end].copy_(grad.detach().reshape(-1))
        self.exposed, self.zero[source] = source, False
        return buffer

    def cleared(self, buffer: torch.Tensor) -> None:
        """The step's selection pass left `buffer` all zeros."""
        self.zero[self._position(buffer)] = True

    def update_buffer(self, gradient_buffer: torch.Tensor) -> torch.Tensor:
        """The other buffer: where the step writes its update."""
        return self.buffers[1 - self._position(gradient_buffer)]

    def expose_update(self, update: torch.Tensor) -> None:
        """Points p.grad at the update (views, or casts copied into own gradients)."""
        position = self._position(update)
        self._point_at(position)
        for i, (parameter, (begin, end), view) in enumerate(
                zip(self.parameters, self.bounds, self.views[0])):
            if view is not None:  # viewable: _point_at did it
                continue
            value = update[begin:end].view(parameter.shape).to(parameter.device, parameter.dtype)
            if self.sparse[i]:
                parameter.grad = value.to_sparse()  # a copy: the buffer is not shared
            elif (parameter.grad is None or parameter.grad.shape != parameter.shape
                  or parameter.grad.is_sparse):
                parameter.grad = value.clone()
            else:
                parameter.grad.copy_(value)

    def zero_grad(self, set_to_none: bool) -> None:
        """Gradients to zero: views of a zero buffer (no pass over d when the step cleared one);
        fallback parameters as torch does."""
        current = self.exposed or 0
        position = next((i for i in (1 - current, current) if self.zero[i]), None)
        if position is None:
            position = current
            self.buffers[position].zero_()
        self._point_at(position)
        for parameter, view in zip(self.parameters, self.views[0]):
            if view is None and parameter.grad is not None:  # the fallback path
                if set_to_none:
                    parameter.grad = None
                else:
                    parameter.grad.detach_().zero_()

    def _point_at(self, position: int) -> None:
        for parameter, view in zip(self.parameters, self.views[position]):
            if view is not None:
                parameter.grad = view
        self.exposed, self.zero[position] = position, False

    def _position(self, buffer: torch.Tensor) -> int:
        return 0 if buffer is self.buffers[0] else 1
