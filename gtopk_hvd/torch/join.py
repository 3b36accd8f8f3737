"""`hvd.join()` for the sparse torch optimizer (`gtopk_hvd.core.join` states the semantics):
`join()` here, or `hvd.join()` itself once gtopk_hvd.torch is imported."""

from __future__ import annotations

from typing import Callable

from gtopk_hvd.core.join import JoinRegistry

_registry = JoinRegistry("horovod.torch", "sparse DistributedOptimizers")
register = _registry.register


def join(device: int = -1) -> int:
    """Horovod's `hvd.join(device)`, for the sparse optimizer of this process; returns the rank
    that joined last."""
    return _registry.join(None, device)


def swapped_join(original: Callable[..., int], device: int = -1) -> int:
    """What `horovod.torch.join` becomes (gtopk_hvd.horovod_swap.install_around)."""
    return _registry.join(original, device)
