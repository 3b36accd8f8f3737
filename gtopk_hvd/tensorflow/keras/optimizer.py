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
update happen at every N-th call only; the other calls change no model variable, but count in
`optimizer.iterations`, as with Horovod's wrapper. The residual lives in
the optimizer's `gtopk_state` (a `GTopkState`), which tf.train.Checkpoint saves with the
optimizer (`tf.train.Checkpoint(model=model, optimizer=optimizer)`); Keras' own
`model.save_weights` / `.keras` files do not hold it. Each worker saves its own.

Horovod's API besides: `register_local_var(var)` (that variable's gradient is not reduced, but
divided by the number of workers, as Horovod's scale_local_gradients does); on tf-keras
`_compute_gradients`, which returns this worker's gradients (Horovod's returns them reduced;
here the reduction happens once, in apply_gradients); with backward_passes_per_step > 1,
`_agg_helper.counter` (calls accumulated in the current cycle).

Loss scaling: wrap the LossScaleOptimizer, `DistributedOptimizer(LossScaleOptimizer(opt))`
(Keras 3's keras.optimizers.LossScaleOptimizer, tf-keras' mixed_precision one): the result is a
subclass of it, so the gradients are reduced first and the scaler then checks the reduced ones,
the same on every worker; a step skipped for a NaN/Inf on any worker (the compression's
nonfinite="propagate") reaches it as all-NaN gradients, it skips the update and lowers its scale
everywhere. Without a loss scaler (bfloat16, float32) such a step is not applied: no variable of
the model or of the wrapped optimizer changes but `iterations` (it counts calls, as above), on
every worker alike, and `last_stats.skipped` says so. Under the mixed_float16 policy a plain
optimizer is put in a LossScaleOptimizer here
(Keras' compile would otherwise wrap ours the other way round, checking each worker's own
gradients before the reduction).

Dense choices (Compression.none / fp16): on tf-keras, Horovod's own
horovod.tensorflow.keras.DistributedOptimizer, unchanged. Horovod 0.28 does not support Keras 3,
so there the same subclass runs the allreduce function Horovod's own wrappers run
(`gradients.dense_allreduce`: every argument, groups, Adasum and process sets included, with the
variables handed to it as tf.Variables); backward_passes_per_step > 1 is then not supported (use
the Keras 3 optimizer's own `gradient_accumulation_steps`).

`model.compile(jit_compile=True)` cannot compile the host step: compile with jit_compile=False
(Keras 3 picks False on CPU-only machines anyway).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import tensorflow as tf

from gtopk_hvd.arguments import Arguments, parse_arguments
from gtopk_hvd.compression import Compression
from gtopk_hvd.core import StepStats
from gtopk_hvd.core.passes import PassAccumulator
from gtopk_hvd.tensorflow.gradients import (
    LocalSources,
    dense_allreduce,
    fused_host_call,
    sparse_allreduce,
)
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
                 transport: Transport | str | None, groups: Any = None,
                 loss_scaled: bool = False) -> None:
        self.arguments = arguments
        self.average_passes = average_passes
        self.sparse_as_dense = sparse_as_dense
        self.transport = transport
        self.groups = groups
        self.loss_scaled = loss_scaled  # a skipped step goes to the scaler, else is not applied

        self.local = _LocalGradients(arguments.passes, average_passes)

    def __call__(self, state: GTopkState, gradients: list[Any], variables: list[Any]
                 ) -> tuple[list[Any], Any]:
        """(reduced gradients, applied): `applied` says whether to apply them now. Gradients of
        variables registered as local are not reduced (`_LocalGradients`)."""
        local = [self.local.holds(v) for v in variables]
        if not any(local):
            return self._reduce(state, gradients, variables)
        shared = [i for i, is_local in enumerate(local) if not is_local]
        mine = [i for i, is_local in enumerate(local) if is_local]
        result: list[Any] = [None] * len(gradients)
        own, applied = self.local([gradients[i] for i in mine], [variables[i] for i in mine])
        if shared:  # its `applied` equals the local one: both count the same calls
            reduced, applied = self._reduce(state, [gradients[i] for i in shared],
                                            [variables[i] for i in shared])
            for i, gradient in zip(shared, reduced):
                result[i] = gradient
        for i, gradient in zip(mine, own):
            result[i] = gradient
        return result, applied

    def _reduce(self, state: GTopkState, gradients: list[Any], variables: list[Any]
                ) -> tuple[list[Any], Any]:
        if self.arguments.sparse:
            return sparse_allreduce(state, gradients, variables, self.arguments,
                                    self.average_passes, self.transport,
                                    apply_skipped=self.loss_scaled)
        return dense_allreduce(gradients, variables, self.arguments, self.sparse_as_dense,
                               self.groups), True


class _LocalGradients:
    """Gradients of the variables registered with `register_local_var`, as Horovod treats them
    (its scale_local_gradients=True): not reduced, summed over backward_passes_per_step calls
    like the others (averaged if average_aggregated_gradients) and divided by the number of
    workers. None counts as zeros. Kept in numpy (in tf.py_function inside a tf.function), the
    same way as the sparse step's accumulation, so both count the same calls."""

    def __init__(self, passes: int, average_passes: bool) -> None:
        self.passes = passes
        self._registered = LocalSources()
        self._accumulated = PassAccumulator(passes, average_passes)

    def add(self, variable: Any) -> None:
        self._registered.add(variable)

    def holds(self, variable: Any) -> bool:
        return self._registered.holds(variable)

    def _step(self, flat: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        import horovod.tensorflow as hvd

        total = self._accumulated.add(flat)
        if total is None:
            return np.zeros_like(flat), np.array(False)
        return (total / np.float32(hvd.size())).astype(np.float32), np.array(True)

    def __call__(self, gradients: list[Any], variables: list[Any]) -> tuple[list[Any], Any]:
        shapes = [tf.TensorShape(v.shape) for v in variables]
        return fused_host_call(self._step, gradients, shapes,
                               [tf.as_dtype(v.dtype) for v in variables], self.passes,
                               "gtopk_local_grads")


def _when_applied(applied: Any, apply: Any, otherwise: Any) -> None:
    """Runs apply() if `applied` (a bool, or a bool tensor inside a tf.function), else
    otherwise()."""
    if isinstance(applied, bool):
        if applied:
            apply()
        else:
            otherwise()
        return

    def run() -> tf.Tensor:
        apply()
        return tf.constant(True)

    def skip() -> tf.Tensor:
        otherwise()
        return tf.constant(False)

    tf.cond(applied, run, skip)


class _AggregationProgress:
    """`optimizer._agg_helper` of Horovod's Keras wrapper as far as its `counter` goes: how many
    calls of the current cycle of backward_passes_per_step have been accumulated (Horovod's
    tests read it; with backward_passes_per_step == 1 Horovod has no helper, nor do we)."""

    def __init__(self, state: GTopkState) -> None:
        self._state = state

    @property
    def counter(self) -> tf.Tensor:
        return tf.constant(self._state.passes_accumulated, dtype=tf.int32)


class _Common:
    """Methods of both subclasses."""

    def register_local_var(self, var: Any) -> None:
        """Horovod's: `var`'s gradient is not reduced; this worker's own is applied, divided
        by the number of workers (Horovod's scale_local_gradients). Register before the first
        step: the sparse layout is fixed then."""
        self._gtopk_reduction.local.add(var)

    def _count_skipped_call(self) -> None:
        """A call of apply that only accumulated still counts in `iterations`, as with
        Horovod's wrapper (its iterations count calls, not applied steps)."""
        self.iterations.assign_add(1)


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
        _when_applied(applied, lambda: base.apply(reduced, variables), self._count_skipped_call)

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
                                                   **kwargs),
                      self._count_skipped_call)
        return self.iterations

    def _compute_gradients(self, loss: Any, var_list: Any, grad_loss: Any = None,
                           tape: Any = None) -> list[tuple[Any, Any]]:
        """This worker's gradients as (gradient, variable) pairs, for Horovod's private API
        (its tests and PartialDistributedOptimizer call it). Horovod's wrapper reduces them
        here; gtopk_hvd reduces once, in apply_gradients, which every path goes through, so
        these are the local gradients."""
        base = super(self.__class__, self)
        tape = tf.GradientTape() if tape is None else tape
        if hasattr(base, "_compute_gradients"):  # OptimizerV2 (legacy)
            return base._compute_gradients(loss, var_list, grad_loss, tape=tape)
        return list(base.compute_gradients(loss, var_list, tape=tape))

    @property
    def last_stats(self) -> StepStats | None:
        """What the last sparse step did on this worker (None if dense or before the first)."""
        return self.gtopk_state.last_stats


def _loss_scale_optimizer_class(keras3: bool) -> type:
    if keras3:
        import keras

        return keras.optimizers.LossScaleOptimizer
    import tf_keras

    return tf_keras.mixed_precision.LossScaleOptimizer


def _loss_scaled_under_mixed_float16(optimizer: Any, keras3: bool) -> Any:
    """`optimizer` in a LossScaleOptimizer when the global policy is mixed_float16 and it is not
    one already. Keras' compile would otherwise wrap the distributed optimizer in one, whose
    finiteness check runs on each worker's own gradients before the reduction: a worker that
    overflowed alone would skip the reduction the others run. Wrapped here, the reduction comes
    first and the check sees the reduced gradients, the same on every worker; compile then finds
    a LossScaleOptimizer (ours is a subclass of it) and leaves it."""
    if keras3:
        import keras

        policy = keras.mixed_precision.global_policy()
    else:
        import tf_keras

        policy = tf_keras.mixed_precision.global_policy()
    loss_scale_optimizer = _loss_scale_optimizer_class(keras3)
    if policy.name == "mixed_float16" and not isinstance(optimizer, loss_scale_optimizer):
        return loss_scale_optimizer(optimizer)
    return optimizer


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

    Args:
        optimizer: the Keras optimizer to wrap (Keras 3 or tf-keras; a LossScaleOptimizer for
            loss scaling); the result is made from its config, its variables are not carried
            over: wrap it before training. Under the mixed_float16 policy a plain one is put in
            a LossScaleOptimizer first (sparse compression, or any on Keras 3: module
            docstring).
        name, device_dense, device_sparse: Horovod's, accepted and not used (the sparse step
            runs on the host; the result's name is the optimizer's).
        compression: a sparse choice (`Compression.gtopk(density)`, `.topk`, `.micro`, ...:
            the module docstring's sparse choices), or Compression.none / .fp16 (gtopk_hvd's or
            Horovod's): Horovod's dense allreduce (module docstring, "Dense choices").
        sparse_as_dense: Horovod's, for a dense compression (a sparse one always densifies
            IndexedSlices).
        gradient_predivide_factor: Horovod's, > 0; other than 1.0 with Average only.
        op: Horovod's Average (None: the default) or Sum; a dense compression takes Horovod's
            other ops too (Adasum).
        backward_passes_per_step: calls of apply_gradients whose gradients are summed locally
            before each step, >= 1; the other calls change no model variable but count in
            `iterations`. With a dense compression on Keras 3: 1 only.
        average_aggregated_gradients: with backward_passes_per_step > 1, the summed gradients
            are divided by backward_passes_per_step (False: summed).
        num_groups, groups: Horovod's; with a sparse compression 0 and None only (every
            gradient is fused into one selection).
        process_set: Horovod's; with a sparse compression the global one only.
        transport: how the sparse reduction communicates, resolved at the first step
            (`gtopk_hvd.transports`: a registered name or a Transport; None: MPI under an MPI
            launcher, else Horovod's collectives).

    Returns:
        A new instance of a subclass of the optimizer's class (of the LossScaleOptimizer, where
        one was added), whose apply_gradients (Keras 3: apply) reduces the gradients first
        (module docstring), with the residual in its `gtopk_state`, `last_stats` and
        `register_local_var`; on tf-keras with a dense compression, Horovod's own
        horovod.tensorflow.keras.DistributedOptimizer.

    Raises:
        NotImplementedError: with a sparse compression, num_groups / groups, a process set
            other than the global one, or an op other than Average or Sum; on Keras 3, a dense
            compression with backward_passes_per_step > 1.
        ValueError: an argument out of range or of the wrong type (`gtopk_hvd.options`: a
            compression that is not one of the choices, backward_passes_per_step < 1,
            gradient_predivide_factor <= 0), gradient_predivide_factor other than 1.0 with an
            op other than Average.
    """
    import horovod.tensorflow as hvd

    del name, device_dense, device_sparse  # the step runs on the host; the name is the class's
    keras3 = is_keras3_optimizer(optimizer)
    arguments = parse_arguments(hvd, compression, op, gradient_predivide_factor, num_groups,
                                groups, process_set, backward_passes_per_step,
                                dense_by_horovod=True)
    if arguments.sparse or keras3:
        optimizer = _loss_scaled_under_mixed_float16(optimizer, keras3)
    if not arguments.sparse:
        if not keras3:
            import horovod.tensorflow.keras as hvd_keras

            return hvd_keras.DistributedOptimizer(
                optimizer, compression=hvd.Compression.fp16
                if arguments.compression.name == "fp16"
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
        key: value for source in (_Common, methods) for key, value in source.__dict__.items()
        if key not in ("__dict__", "__weakref__")})
    distributed = cls.from_config(optimizer.get_config())
    distributed._gtopk_reduction = _Reduction(
        arguments, average_aggregated_gradients, sparse_as_dense, transport,
        groups if groups is not None else num_groups or None,
        loss_scaled=isinstance(optimizer, _loss_scale_optimizer_class(keras3)))
    distributed.gtopk_state = GTopkState()
    if arguments.sparse and backward_passes_per_step > 1:
        distributed._agg_helper = _AggregationProgress(distributed.gtopk_state)
    if hasattr(distributed, "_track_trackable"):  # tf-keras' OptimizerV2 does not auto-track
        distributed._track_trackable(distributed.gtopk_state, name="gtopk_state",
                                     overwrite=True)
    return distributed
