"""`hvd.join()` for sparse steps: uneven data across workers, framework-neutral.

A worker that runs out of data calls `hvd.join()` (swapped on import of an adapter) or the
adapter's `join()`. While a sparse step holder (the torch optimizer; TensorFlow's `GTopkState`)
lives in this process, that is its join (`gtopk_hvd.core.SparseStep.join`): the worker takes part
in the others' sparse steps with an empty contribution until every worker has joined, and every
worker returns the rank that joined last, as Horovod's join does. Without one it is Horovod's own
join.

Horovod's semantics: the others' update divides by P (the joined worker contributes zeros), the
joined worker's model does not take those steps, so broadcast the weights (and the optimizer's
state) from the returned rank afterwards to make the replicas identical again. While a worker
is joined, the others may run sparse steps only; a Horovod collective of their own (a metric's
allreduce) has no partner on the joined worker until it returns. One holder per process: with
several, join names the problem.
"""

from __future__ import annotations

import importlib
import weakref
from typing import Any, Callable


class JoinRegistry:
    """The live sparse step holders of one adapter (each has `join() -> int`), and its join.

    horovod_module: the Horovod module whose own `join` runs when no holder lives;
    what: what the holders are called in errors."""

    def __init__(self, horovod_module: str, what: str) -> None:
        self.horovod_module = horovod_module
        self.what = what
        self._holders: weakref.WeakSet = weakref.WeakSet()

    def register(self, holder: Any) -> None:
        """Called by each holder once it can take part in sparse steps."""
        self._holders.add(holder)

    def join(self, original: Callable[..., int] | None = None, *args: Any) -> int:
        """The holder's join (module docstring), or Horovod's `original` (default: the Horovod
        module's own, unswapped) when none lives; returns the rank that joined last."""
        holders = list(self._holders)
        if len(holders) > 1:
            raise ValueError(f"gtopk_hvd: join with {len(holders)} {self.what} alive in this "
                             "process; join follows one of them (delete the others first)")
        if holders:
            return holders[0].join()
        if original is None:
            own = importlib.import_module(self.horovod_module).join
            original = getattr(own, "__gtopk_hvd_swap__", own)
        return int(original(*args))
