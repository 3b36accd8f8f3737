"""`hvd.join()` for the TensorFlow adapters' sparse steps (`gtopk_hvd.core.join` states the
semantics): `join()` here, or `hvd.join()` itself once gtopk_hvd.tensorflow (or .keras) is
imported. The sparse step followed is the one `GTopkState` of this process that has made a step
(the Keras optimizer's `gtopk_state`, or the tape's)."""

from __future__ import annotations

from typing import Callable

from gtopk_hvd.core.join import JoinRegistry

_registry = JoinRegistry("horovod.tensorflow", "GTopkStates that have made sparse steps")
register = _registry.register


def join() -> int:
    """Horovod's `hvd.join()` for the sparse step of this process: this worker takes part in
    the others' sparse steps with an empty contribution until every worker has joined
    (`GTopkState.join`, `gtopk_hvd.core.join`). With no GTopkState that has made a step alive,
    Horovod's own join runs.

    Returns:
        The rank that joined last (broadcast the weights from it afterwards).

    Raises:
        ValueError: more than one GTopkState that has made a sparse step is alive in this
            process.
    """
    return _registry.join(None)


def swapped_join(original: Callable[..., int]) -> int:
    """What `horovod.tensorflow.join` becomes (gtopk_hvd.horovod_swap.install_around)."""
    return _registry.join(original)
