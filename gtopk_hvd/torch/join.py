"""`hvd.join()` for sparse optimizers: uneven data across workers.

A worker that runs out of data calls `hvd.join()` (swapped on import of gtopk_hvd.torch) or
`gtopk_hvd.torch.join()`. While a gtopk_hvd sparse optimizer lives in this process, that is the
optimizer's join (`gtopk_hvd.core.SparseStep.join`): the worker takes part in the others' sparse
steps with an empty contribution until every worker has joined, and every worker returns the rank
that joined last, as Horovod's join does. Without a sparse optimizer it is Horovod's own join.

Horovod's semantics: the others' update divides by P (the joined worker contributes zeros), the
joined worker's model does not take those steps, so broadcast the weights (and the optimizer's
state) from the returned rank afterwards to make the replicas identical again. While a worker
is joined, the others may run sparse steps only; a Horovod collective of their own (a metric's
allreduce) has no partner on the joined worker until it returns. One sparse optimizer per
process: with several, join names the problem.
"""

from __future__ import annotations

import weakref
from typing import Any, Callable

_sparse_optimizers: weakref.WeakSet = weakref.WeakSet()


def register(optimizer: Any) -> None:
    """Called by each sparse DistributedOptimizer when it is built."""
    _sparse_optimizers.add(optimizer)


def join(device: int = -1) -> int:
    """Horovod's `hvd.join(device)`, for the sparse optimizer of this process (module
    docstring); returns the rank that joined last."""
    return _join(None, device)


def _join(original: Callable[..., int] | None, device: int = -1) -> int:
    optimizers = list(_sparse_optimizers)
    if len(optimizers) > 1:
        raise ValueError(f"gtopk_hvd: join with {len(optimizers)} sparse DistributedOptimizers "
                         "alive in this process; join follows one optimizer's steps (delete the "
                         "others first)")
    if optimizers:
        return optimizers[0].join()
    if original is None:
        import horovod.torch as hvd

        original = getattr(hvd.join, "__gtopk_hvd_swap__", hvd.join)
    return original(device)


def swapped_join(original: Callable[..., int], device: int = -1) -> int:
    """What `horovod.torch.join` becomes (gtopk_hvd.horovod_swap.install_around)."""
    return _join(original, device)
