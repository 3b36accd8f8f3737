"""DistributedGradientTape for TensorFlow 2: Horovod's arguments, gTop-k or Top-k gradients.

Like horovod.tensorflow.DistributedGradientTape, the returned tape is an instance of a subclass
of the wrapped tape's class that shares its recording. Dense choices (Compression.none / fp16)
are handed to Horovod's own DistributedGradientTape unchanged.

Sparse choices: `gradient(target, sources)` computes this worker's gradients with the wrapped
tape, fuses them into one float32 vector in source order (None gradients as zeros, IndexedSlices
densified), runs one sparse step (selection with error feedback, the sparse all-reduce, the
residual fix: `gtopk_hvd.sparse_state`) and returns dense tensors shaped and typed like the
sources holding the global update, zeros elsewhere, averaged over workers (op=Average) or summed
(op=Sum); a tensor also where the local gradient was None (that worker contributed zeros), as
horovod.torch does for parameters without gradients. Every worker gets the same values for every
source, so identical optimizers make identical updates. Inside a tf.function the numpy step runs
in tf.py_function (see `gtopk_hvd.tensorflow.gradients`: one host round trip and a graph break
per step; no XLA).

The residual lives in a `GTopkState`. Horovod scripts make a new tape every step, so the state
cannot live in the tape: pass one with `gtopk_state=` (and add it to your tf.train.Checkpoint to
resume exactly), or leave it out and the tape uses one kept per list of sources (the same
variable objects in the same order, compression and op), readable as `tape.gtopk_state` after
`gradient()`. Each `gradient()` call is one optimizer step (warm-up and momentum correction count
it): call it once per step, with the same sources.
"""

from __future__ import annotations

import weakref
from typing import Any

import tensorflow as tf

from gtopk_hvd.arguments import Arguments, parse_arguments
from gtopk_hvd.compression import Compression
from gtopk_hvd.sparse_state import StepStats
from gtopk_hvd.tensorflow.gradients import dense_allreduce, sparse_allreduce
from gtopk_hvd.tensorflow.state import GTopkState
from gtopk_hvd.transports import Transport

_states: dict[tuple, tuple[list[Any], GTopkState]] = {}


def state_for_sources(sources: list[Any], config: tuple) -> GTopkState:
    """The GTopkState kept for these source objects (in this order) and config; made on first
    use. Entries whose sources were garbage-collected are replaced."""
    key = (config, tuple(id(source) for source in sources))
    entry = _states.get(key)
    if entry is not None and all(_deref(ref) is source for ref, source in zip(entry[0], sources)):
        return entry[1]
    state = GTopkState()
    _states[key] = ([_weak(source) for source in sources], state)
    return state


def _weak(source: Any) -> Any:
    try:
        return weakref.ref(source)
    except TypeError:  # not weak-referenceable: keep it alive instead
        return lambda: source


def _deref(ref: Any) -> Any:
    return ref()


class _SparseDistributedGradientTape(tf.GradientTape):
    def __init__(self, tape: Any, arguments: Arguments, gtopk_state: GTopkState | None,
                 transport: Transport | str | None, persistent: bool = False,
                 watch_accessed_variables: bool = True) -> None:
        super(self.__class__, self).__init__(persistent, watch_accessed_variables)
        self._tape = tape
        self._gtopk_arguments = arguments
        self._gtopk_transport = transport
        self.gtopk_state = gtopk_state

    def gradient(self, target: Any, sources: Any, output_gradients: Any = None,
                 unconnected_gradients: Any = tf.UnconnectedGradients.NONE) -> Any:
        """This worker's gradients (the wrapped tape's), then one sparse step: module docstring.

        `sources` may be nested like the wrapped tape allows; the result has its structure.
        """
        flat_sources = tf.nest.flatten(sources)
        gradients = super(self.__class__, self).gradient(
            target, flat_sources, output_gradients, unconnected_gradients)
        if self.gtopk_state is None:
            arguments = self._gtopk_arguments
            self.gtopk_state = state_for_sources(
                flat_sources, (arguments.compression, arguments.average, arguments.predivide))
        reduced, _ = sparse_allreduce(self.gtopk_state, gradients, flat_sources,
                                      self._gtopk_arguments, transport=self._gtopk_transport)
        return tf.nest.pack_sequence_as(sources, reduced)

    @property
    def last_stats(self) -> StepStats | None:
        """What the last sparse step of this tape's state did on this worker."""
        return None if self.gtopk_state is None else self.gtopk_state.last_stats


class _DenseDistributedGradientTape(tf.GradientTape):
    """Dense gradients through Horovod's allreduce, one per gradient (gradients.dense_allreduce):
    unlike horovod.tensorflow.DistributedGradientTape, it works with Keras 3 variables."""

    def __init__(self, tape: Any, arguments: Arguments, sparse_as_dense: bool,
                 persistent: bool = False, watch_accessed_variables: bool = True) -> None:
        super(self.__class__, self).__init__(persistent, watch_accessed_variables)
        self._tape = tape
        self._gtopk_dense = (arguments, sparse_as_dense)

    def gradient(self, target: Any, sources: Any, output_gradients: Any = None,
                 unconnected_gradients: Any = tf.UnconnectedGradients.NONE) -> Any:
        flat_sources = tf.nest.flatten(sources)
        gradients = super(self.__class__, self).gradient(
            target, flat_sources, output_gradients, unconnected_gradients)
        return tf.nest.pack_sequence_as(sources, dense_allreduce(gradients, *self._gtopk_dense))


def DistributedGradientTape(  # noqa: N802 - Horovod's name
    gradtape: tf.GradientTape,
    device_dense: str = "",
    device_sparse: str = "",
    compression: Any = Compression.none,
    sparse_as_dense: bool = False,
    op: Any = None,
    gradient_predivide_factor: float = 1.0,
    num_groups: int = 0,
    groups: Any = None,
    process_set: Any = None,
    *,
    gtopk_state: GTopkState | None = None,
    transport: Transport | str | None = None,
) -> tf.GradientTape:
    """horovod.tensorflow.DistributedGradientTape with gtopk_hvd's Compression choices.

    compression=Compression.gtopk(density) or .topk(density): sparsified gradients (module
    docstring); Compression.none / .fp16: Horovod's allreduce of each gradient, with Horovod's
    scaling (Horovod's own tape fails on Keras 3 variables); num_groups / groups raise
    NotImplementedError there. With a sparse compression: device_dense / device_sparse are
    unused (the step runs on the host), sparse_as_dense is implied (IndexedSlices are
    densified), op may be Average or Sum, num_groups / groups and process sets other than the
    global one raise NotImplementedError (all gradients are fused into one selection).
    gtopk_state: where the residual lives (module docstring); None: one kept per list of
    sources. transport: how the sparse reduction communicates (`gtopk_hvd.transports`; default
    MPI under an MPI launcher, else Horovod's collectives).
    """
    import horovod.tensorflow as hvd

    arguments = parse_arguments(hvd, compression, op, gradient_predivide_factor, num_groups,
                                groups, process_set)
    recording = (gradtape._persistent, gradtape._watch_accessed_variables)
    if not arguments.sparse:
        if gtopk_state is not None:
            raise ValueError("gtopk_state is only used with a sparse compression")
        cls = type(gradtape.__class__.__name__, (gradtape.__class__,),
                   dict(_DenseDistributedGradientTape.__dict__))
        return cls(gradtape._tape, arguments, sparse_as_dense, *recording)
    if gtopk_state is not None and not isinstance(gtopk_state, GTopkState):
        raise ValueError(f"gtopk_state must be a gtopk_hvd.tensorflow.GTopkState, "
                         f"got {gtopk_state!r}")
    cls = type(gradtape.__class__.__name__, (gradtape.__class__,),
               dict(_SparseDistributedGradientTape.__dict__))
    return cls(gradtape._tape, arguments, gtopk_state, transport, *recording)
