"""Following Elastic Horovod's workers: a sparse step rebuilt when a reset changed them.

After a reset (a worker lost or added) Horovod's rank and size are new. The adapters call
`follow_horovod` before each sparse step: while Horovod's workers are the step's, it returns the
step itself; after a reset, the step moved to a transport over the new workers
(`SparseStep.moved_to`: k, buffers and the agreement check for the new P; this worker's residual,
velocity and step count kept; a threshold scheme's own state started again). A worker new to the
job starts from zero residual (or what the state object's sync gave it). Every worker calls it
at the same step (the first after the reset), so the agreement check's all-gather is issued
everywhere alike.
"""

from __future__ import annotations

from typing import Any

from gtopk_hvd.core.step import SparseStep
from gtopk_hvd.transports import Transport, resolve_for_horovod


def follow_horovod(step: SparseStep, choice: Transport | str | None, horovod: Any
                   ) -> SparseStep:
    """`step`, or `step` moved to Horovod's current workers (module docstring). `choice` is
    the transport the adapter was given: None or a name is resolved again; a Transport object
    cannot follow (it holds its old workers), so that is an error naming the fix."""
    rank, size = horovod.rank(), horovod.size()
    if (rank, size) == (step.transport.rank, step.transport.size):
        return step
    if isinstance(choice, Transport):
        raise RuntimeError(
            f"gtopk_hvd: Horovod now has {size} workers (rank {rank}), the transport given to "
            f"the optimizer has {step.transport.size}: under Elastic Horovod pass "
            "transport=None or \"horovod\" so that the optimizer can follow the workers")
    return step.moved_to(resolve_for_horovod(choice, horovod))
