"""`hvd.join()` for the sparse torch optimizer (`gtopk_hvd.core.join` states the semantics):
`join()` here, or `hvd.join()` itself once gtopk_hvd.torch is imported."""

from __future__ import annotations

from typing import Callable

from gtopk_hvd.core.join import JoinRegistry

_registry = JoinRegistry("horovod.torch", "sparse DistributedOptimizers")
register = _registry.register


def join(device: int = -1) -> int:
    """Horovod's `hvd.join(device)` for the sparse optimizer of this process: this worker takes
    part in the others' sparse steps with an empty contribution until every worker has joined
    (`gtopk_hvd.core.join`). With no sparse optimizer alive, Horovod's own join runs.

    Args:
        device: Horovod's, for its own join: the GPU of its collectives, -1 for the host.

    Returns:
        The rank that joined last (broadcast the weights from it afterwards).

    Raises:
        ValueError: more than one sparse optimizer is alive in this process.
    """
    return _registry.join(None, device)


def swapped_join(original: Callable[..., int], device: int = -1) -> int:
    """What `horovod.torch.join` becomes (gtopk_hvd.horovod_swap.install_around)."""
    return _registry.join(original, device)
