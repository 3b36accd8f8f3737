"""DistributedOptimizer for Keras: Horovod's arguments, gTop-k or Top-k sparsified gradients.

Works with `model.fit` and custom loops on Keras 3 (TensorFlow >= 2.16's default `tf.keras`) and
on tf-keras (Keras 2, `TF_USE_LEGACY_KERAS=1`). Like horovod.tensorflow.keras, the returned
optimizer is a new instance of a subclass of the wrapped optimizer's class, made from its config
(the wrapped optimizer's variables are not carried over: wrap it before training).

Sparse choices: the gradients handed to `apply_gradients` (Keras 3: `apply`, which
`apply_gradients` calls) first go through one sparse step (`gtopk_hvd.tensorflow.gradients`:
fused in variable order, selection with error feedback, sparse all-reduce, residual fix; inside
the tf.function that `fit` traces, through tf.py_function), and the wrapped optimizer then applies
the global update, identical on every worker. `backward_passes_per_step` = N > 1: gradients are
summed locally (averaged if `average_aggregated_gradients`) over N calls and the step and the
update happen at every N-th call only; the other calls change no variable. The residual lives in
the optimizer's `gtopk_state` (a `GTopkState`), which tf.train.Checkpoint saves with the
optimizer (`tf.train.Checkpoint(model=model, optimizer=optimizer)`); Keras' own
`model.save_weights` / `.keras` files do not hold it. Each worker saves its own.

Dense choices (Compression.none / fp16): on tf-keras, Horovod's own
horovod.tensorflow.keras.DistributedOptimizer, unchanged. Horovod 0.28 does not support Keras 3,
so there the same subclass runs Horovod's `hvd.allreduce` (Average or Sum, fp16 compression,
pre/post-scaling as Horovod does) on each gradient instead; backward_passes_per_step > 1 is then
not supported (use the Keras 3 optimizer's own `gradient_accumulation_steps`).

`model.compile(jit_compile=True)` cannot compile the host step: compile with jit_compile=False
(Keras 3 picks False on CPU-only machines anyway).
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from gtopk_hvd.arguments import Arguments, parse_arguments
from gtopk_hvd.compression import Compression
from gtopk_hvd.sparse_state import StepStats
from gtopk_hvd.tensorflow.gradients import dense_allreduce, sparse_allreduce
from gtopk_hvd.tensorflow.state import GTopkState
from gtopk_hvd.transports import Transport


def is_keras3_optimizer(optimizer: Any) -> bool:
    """True for a Keras 3 optimizer, False for tf-keras (Keras 2) ones."""
    try:
        import keras
    except ImportError:
        return False
    if int(keras.__version__.split(".")[0]) < 3:
        return False
    return isinstance(optimizer, keras.optimizers.Optimizer)


class _Reduction:
    """What the optimizer does to a gradient list before applying it."""

    def __init__(self, arguments: Arguments, average_passes: bool, sparse_as_dense: bool,
                 transport: Transport | str | None) -> None:
        self.arguments = arguments
        self.average_passes = average_passes
        self.sparse_as_dense = sparse_as_dense
        self.transport = transport

    def __call__(self, state: GTopkState, gradients: list[Any], variables: list[Any]
                 ) -> tuple[list[Any], Any]:
        """(reduced gradients, applied): `applied` says whether to apply them now."""
        if self.arguments.sparse:
            return sparse_allreduce(state, gradients, variables, self.arguments,
                                    self.average_passes, self.transport)
        return dense_allreduce(gradients, self.arguments, self.sparse_as_dense), True


def _when_applied(applied: Any, apply: Any) -> None:
    """Runs apply() if `applied` (a bool, or a bool tensor inside a tf.function)."""
    if isinstance(applied, bool):
        if applied:
            apply()
        return

    def run() -> tf.Tensor:
        apply()
        return tf.constant(True)

    tf.cond(applied, run, lambda: tf.constant(False))


class _Keras3DistributedOptimizer:
    """Methods of the Keras 3 subclass (the class is made from the wrapped one's)."""

    def apply(self, grads: Any, trainable_variables: Any = None) -> None:
        grads = list(grads)
        if not grads:
            return
        if trainable_variables is None:
            if not self.built:
                raise ValueError("the optimizer must be built (optimizer.build(variables)) "
                                 "before apply() without variables")
            variables = list(self._trainable_variables)
        else:
            variables = list(trainable_variables)
            if not self.built:  # build outside any tf.cond below
                self.build(variables)
        reduced, applied = self._gtopk_reduction(self.gtopk_state, grads, variables)
        base = super(self.__class__, self)
        _when_applied(applied, lambda: base.apply(reduced, variables))

    @property
    def last_stats(self) -> StepStats | None:
        """What the last sparse step did on this worker (None if dense or before the first)."""
        return self.gtopk_state.last_stats


class _KerasDistributedOptimizer:
    """Methods of the tf-keras (Keras 2) subclass."""

    def apply_gradients(self, grads_and_vars: Any, *args: Any, **kwargs: Any) -> Any:
        pairs = list(grads_and_vars)
        gradients, variables = [g for g, _ in pairs], [v for _, v in pairs]
        reduced, applied = self._gtopk_reduction(self.gtopk_state, gradients, variables)
        base = super(self.__class__, self)
        _when_applied(applied,
                      lambda: base.apply_gradients(list(zip(reduced, variables)), *args,
                                                   **kwargs))
        return self.iterations

    @property
    def last_stats(self) -> StepStats | None:
        """What the last sparse step did on this worker (None if dense or before the first)."""
        return self.gtopk_state.last_stats


def DistributedOptimizer(  # noqa: N802 - Horovod's name
    optimizer: Any,
    name: str | None = None,
    device_dense: str = "",
    device_sparse: str = "",
    compression: Any = Compression.none,
    sparse_as_dense: bool = False,
    gradient_predivide_factor: float = 1.0,
    op: Any = None,
    backward_passes_per_step: int = 1,
    average_aggregated_gradients: bool = False,
    num_groups: int = 0,
    groups: Any = None,
    process_set: Any = None,
    *,
    transport: Transport | str | None = None,
) -> Any:
    """horovod.tensorflow.keras.DistributedOptimizer with gtopk_hvd's Compression choices.

    compression=Compression.gtopk(density) or .topk(density): sparsified gradients (module
    docstring); Compression.none / .fp16: Horovod's dense allreduce. With a sparse compression:
    device_dense / device_sparse are unused, IndexedSlices are densified, op may be Average or
    Sum, num_groups / groups and process sets other than the global one raise
    NotImplementedError. `name` is accepted for Horovod compatibility and not used. transport:
    how the sparse reduction communicates (`gtopk_hvd.transports`; default MPI over mpi4py).
    """
    import horovod.tensorflow as hvd

    del name, device_dense, device_sparse  # the step runs on the host; the name is the class's
    keras3 = is_keras3_optimizer(optimizer)
    arguments = parse_arguments(hvd, compression, op, gradient_predivide_factor, num_groups,
                                groups, process_set, backward_passes_per_step,
                                dense_by_horovod=not keras3)
    if not arguments.sparse:
        if not keras3:
            import horovod.tensorflow.keras as hvd_keras

            return hvd_keras.DistributedOptimizer(
                optimizer, compression=hvd.Compression.fp16 if compression.name == "fp16"
                else hvd.Compression.none,
                sparse_as_dense=sparse_as_dense,
                gradient_predivide_factor=gradient_predivide_factor, op=arguments.op,
                backward_passes_per_step=backward_passes_per_step,
                average_aggregated_gradients=average_aggregated_gradients,
                num_groups=num_groups, groups=groups, process_set=arguments.process_set)
        if backward_passes_per_step != 1:
            raise NotImplementedError(
                "backward_passes_per_step > 1 with dense compression is not supported on "
                "Keras 3: use the optimizer's gradient_accumulation_steps")
    methods = _Keras3DistributedOptimizer if keras3 else _KerasDistributedOptimizer
    cls = type(optimizer.__class__.__name__, (optimizer.__class__,), {
        key: value for key, value in methods.__dict__.items()
        if key not in ("__dict__", "__weakref__")})
    distributed = cls.from_config(optimizer.get_config())
    distributed._gtopk_reduction = _Reduction(arguments, average_aggregated_gradients,
                                              sparse_as_dense, transport)
    distributed.gtopk_state = GTopkState()
    if hasattr(distributed, "_track_trackable"):  # tf-keras' OptimizerV2 does not auto-track
        distributed._track_trackable(distributed.gtopk_state, name="gtopk_state",
                                     overwrite=True)
    return distributed
