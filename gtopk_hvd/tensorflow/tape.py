"""DistributedGradientTape for TensorFlow 2: Horovod's arguments, gTop-k or Top-k gradients.

Like horovod.tensorflow.DistributedGradientTape, the returned tape is an instance of a subclass
of the wrapped tape's class that shares its recording. Dense choices (Compression.none / fp16)
are Horovod's own DistributedGradientTape, built by Horovod with every argument (groups,
process sets, Adasum, scale_local_gradients, ...) and running Horovod's code; the only change is
that Keras 3 variables, which Horovod 0.28 cannot key (they have no `ref()`), are handed to it as
the tf.Variable each one holds, in sources, groups and `register_local_source`.

Model-parallel sources (Horovod >= 0.27): `tape.register_local_source(var)` keeps `var`'s
gradient out of every reduction, this worker's own returned instead, divided by the number of
workers if scale_local_gradients (Horovod's default); `get_local_and_global_gradients` splits
the result as Horovod's does. With a sparse compression the local sources are left out of the
fused vector, so a variable that exists on one worker only takes no part in the layout check.

Sparse choices: `gradient(target, sources)` computes this worker's gradients with the wrapped
tape, fuses them into one float32 vector in source order (None gradients as zeros, IndexedSlices
densified), runs one sparse step (selection with error feedback, the sparse all-reduce, the
residual fix: `gtopk_hvd.core.step`) and returns dense tensors shaped and typed like the
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
from gtopk_hvd.core import StepStats
from gtopk_hvd.tensorflow.gradients import (
    LocalSources,
    sparse_allreduce,
    tf_variable,
    tf_variables,
)
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
                 transport: Transport | str | None, scale_local_gradients: bool,
                 persistent: bool = False, watch_accessed_variables: bool = True) -> None:
        super(self.__class__, self).__init__(persistent, watch_accessed_variables)
        self._tape = tape
        self._gtopk_arguments = arguments
        self._gtopk_transport = transport
        self.gtopk_state = gtopk_state
        self.process_set = arguments.process_set
        self.scale_local_gradients = scale_local_gradients
        self._local_sources = LocalSources()

    def register_local_source(self, source: Any) -> None:
        """Horovod's: `source`'s gradient is not reduced (module docstring)."""
        self._local_sources.add(source)

    def gradient(self, target: Any, sources: Any, output_gradients: Any = None,
                 unconnected_gradients: Any = tf.UnconnectedGradients.NONE) -> Any:
        """This worker's gradients (the wrapped tape's), then one sparse step of those of the
        sources not registered as local: module docstring.

        `sources` may be nested like the wrapped tape allows; the result has its structure.
        """
        flat_sources = tf.nest.flatten(sources)
        gradients = super(self.__class__, self).gradient(
            target, flat_sources, output_gradients, unconnected_gradients)
        local = self._local_sources
        shared = [i for i, s in enumerate(flat_sources) if not local.holds(s)]
        result = [self._local_gradient(g) if local.holds(s) else None
                  for s, g in zip(flat_sources, gradients)]
        if shared:
            shared_sources = [flat_sources[i] for i in shared]
            if self.gtopk_state is None:
                arguments = self._gtopk_arguments
                self.gtopk_state = state_for_sources(shared_sources, (
                    arguments.compression, arguments.average, arguments.predivide))
            reduced, _ = sparse_allreduce(self.gtopk_state, [gradients[i] for i in shared],
                                          shared_sources, self._gtopk_arguments,
                                          transport=self._gtopk_transport)
            for i, gradient in zip(shared, reduced):
                result[i] = gradient
        return tf.nest.pack_sequence_as(sources, result)

    def _local_gradient(self, gradient: Any) -> Any:
        """A local source's gradient as Horovod returns it: / size if scale_local_gradients."""
        if gradient is None or not self.scale_local_gradients:
            return gradient
        size = self.process_set.size()
        if isinstance(gradient, tf.IndexedSlices):
            return tf.IndexedSlices(gradient.values / size, gradient.indices,
                                    gradient.dense_shape)
        return gradient / size

    def get_local_and_global_gradients(self, target: Any, sources: Any,
                                       output_gradients: Any = None) -> tuple[list, list]:
        """Horovod's: ([(local source, gradient)], [(other source, gradient)])."""
        gradients = self.gradient(target, sources, output_gradients)
        pairs = list(zip(sources, gradients))
        return ([(s, g) for s, g in pairs if self._local_sources.holds(s)],
                [(s, g) for s, g in pairs if not self._local_sources.holds(s)])

    @property
    def last_stats(self) -> StepStats | None:
        """What the last sparse step of this tape's state did on this worker."""
        return None if self.gtopk_state is None else self.gtopk_state.last_stats


class _KerasVariablesForHorovod:
    """Methods that replace Horovod's tape's on the dense tape: Keras 3 variables are handed to
    Horovod's code as the tf.Variable each holds (module docstring); the rest is Horovod's."""

    def register_local_source(self, source: Any) -> None:
        _HorovodTape().register_local_source(self, tf_variable(source))

    def gradient(self, target: Any, sources: Any, output_gradients: Any = None,
                 use_generic_names: bool = False) -> Any:
        flat_sources = tf.nest.flatten(sources)
        gradients = _HorovodTape().gradient(self, target, [tf_variable(s) for s in flat_sources],
                                            output_gradients, use_generic_names)
        return tf.nest.pack_sequence_as(sources, gradients)

    def get_local_and_global_gradients(self, target: Any, sources: Any,
                                       output_gradients: Any = None,
                                       use_generic_names: bool = False) -> tuple[list, list]:
        gradients = self.gradient(target, sources, output_gradients, use_generic_names)
        local = self._local_sources
        pairs = list(zip(sources, gradients))
        return ([(s, g) for s, g in pairs if tf_variable(s).ref() in local],
                [(s, g) for s, g in pairs if tf_variable(s).ref() not in local])


def _HorovodTape() -> type:  # noqa: N802 - a class
    from horovod.tensorflow import _DistributedGradientTape

    return _DistributedGradientTape


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
    scale_local_gradients: bool = True,
    *,
    gtopk_state: GTopkState | None = None,
    transport: Transport | str | None = None,
) -> tf.GradientTape:
    """horovod.tensorflow.DistributedGradientTape with gtopk_hvd's Compression choices.

    Args:
        gradtape: the tf.GradientTape that recorded the forward pass; the result shares its
            recording (persistent, watch_accessed_variables).
        device_dense, device_sparse: Horovod's, for a dense compression; unused with a sparse
            one (the step runs on the host).
        compression: a sparse choice (`Compression.gtopk(density)`, `.topk`, `.micro`, ...:
            the module docstring's sparse choices), or Compression.none / .fp16 (gtopk_hvd's or
            Horovod's): Horovod's own tape with every argument, also on Keras 3 variables.
        sparse_as_dense: Horovod's, for a dense compression (a sparse one always densifies
            IndexedSlices).
        op: Horovod's Average (None: the default) or Sum; a dense compression takes Horovod's
            other ops too (Adasum).
        gradient_predivide_factor: Horovod's, > 0; other than 1.0 with Average only.
        num_groups, groups: Horovod's; with a sparse compression 0 and None only (every
            gradient is fused into one selection).
        process_set: Horovod's; with a sparse compression the global one only.
        scale_local_gradients: Horovod's: the gradients of sources registered with
            `register_local_source` are divided by the number of workers (module docstring).
        gtopk_state: where the residual lives, a `GTopkState` (sparse compression only; module
            docstring); None: one kept per list of sources, compression and op.
        transport: how the sparse reduction communicates, resolved at the first step
            (`gtopk_hvd.transports`: a registered name or a Transport; None: MPI under an MPI
            launcher, else Horovod's collectives).

    Returns:
        An instance of a subclass of the tape's class, sharing its recording, whose
        `gradient(target, sources)` returns the reduced gradients (module docstring), with
        `gtopk_state`, `last_stats`, `register_local_source` and
        `get_local_and_global_gradients`; for a dense compression, Horovod's own
        DistributedGradientTape (also a subclass of the tape's class).

    Raises:
        NotImplementedError: with a sparse compression, num_groups / groups, a process set
            other than the global one, or an op other than Average or Sum.
        ValueError: an argument out of range or of the wrong type (`gtopk_hvd.options`),
            gradient_predivide_factor other than 1.0 with an op other than Average, a
            gtopk_state that is not a GTopkState, or one given with a dense compression.
    """
    import horovod.tensorflow as hvd

    arguments = parse_arguments(hvd, compression, op, gradient_predivide_factor, num_groups,
                                groups, process_set, dense_by_horovod=True)
    recording = (gradtape._persistent, gradtape._watch_accessed_variables)
    if not arguments.sparse:
        if gtopk_state is not None:
            raise ValueError("gtopk_state is only used with a sparse compression")
        tape = hvd.DistributedGradientTape(
            gradtape, device_dense, device_sparse,
            arguments.compression.horovod_compressor("tensorflow"), sparse_as_dense,
            arguments.op, gradient_predivide_factor, num_groups, tf_variables(groups),
            arguments.process_set, scale_local_gradients)
        tape.__class__ = type(tape.__class__.__name__, (gradtape.__class__,), {
            **_HorovodTape().__dict__, **{key: value for key, value in
                                          _KerasVariablesForHorovod.__dict__.items()
                                          if key not in ("__dict__", "__weakref__")}})
        return tape
    if gtopk_state is not None and not isinstance(gtopk_state, GTopkState):
        raise ValueError(f"gtopk_state must be a gtopk_hvd.tensorflow.GTopkState, "
                         f"got {gtopk_state!r}")
    cls = type(gradtape.__class__.__name__, (gradtape.__class__,),
               dict(_SparseDistributedGradientTape.__dict__))
    return cls(gradtape._tape, arguments, gtopk_state, transport, scale_local_gradients,
               *recording)
