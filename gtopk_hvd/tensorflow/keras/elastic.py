"""Elastic Horovod for Keras (3 and tf-keras) and the TensorFlow tape: `KerasState`.

Horovod's recipe, with this module in place of `hvd.elastic`:

    import gtopk_hvd.tensorflow.keras as gtopk
    from gtopk_hvd.tensorflow.keras import elastic
    optimizer = gtopk.DistributedOptimizer(keras.optimizers.SGD(0.1),
                                           compression=gtopk.Compression.gtopk(0.01))
    model.compile(optimizer=optimizer, loss=...)
    state = elastic.KerasState(model, epoch=0, batch=0)

    @elastic.run
    def train(state):
        model.fit(..., initial_epoch=state.epoch,
                  callbacks=[elastic.UpdateEpochStateCallback(state),
                             elastic.UpdateBatchStateCallback(state),
                             elastic.CommitStateCallback(state)])

What Horovod 0.28's `hvd.elastic.KerasState` cannot do and this one does:

- Keras 3: Horovod calls `optimizer.variables()`, a list there (TypeError when the state is
  made).
- This worker's sparse state: `commit()` saves the model's weights, the optimizer's variables
  and the `GTopkState` (residual, velocity, step count, a scheme's own state) of the optimizer
  (its `gtopk_state`) or the one given (`gtopk_state=`, for `DistributedGradientTape` users);
  `restore()` (after a worker failed) brings all three back to the last commit.
- `sync()` (after every reset, on every worker): builds the optimizer's variables where they
  do not exist yet (a worker new to the job has no slots until its first step, and the variable
  lists must match for the broadcast) and broadcasts the weights and the optimizer's variables
  from rank 0. Residuals are per worker and are not broadcast: a survivor keeps its own (what
  `restore()` gave it), a new worker starts from zero. At the next step the sparse step moves to
  the new workers (`gtopk_hvd.core.elastic`: k, buffers, the agreement check for the new P, in
  which a new worker takes the job's step count, so the density warm-up agrees).

Every collective here (the broadcasts of variables, Horovod's object broadcast) is issued by
every worker in the same order. With backward_passes_per_step > 1, commit at the end of a cycle
(a restore drops gradients summed since the last step). `run` is Horovod's with failures of the
sparse step recognised (below); the callbacks are Horovod's (`horovod.tensorflow.keras.elastic`),
which work on both Keras versions.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import horovod.tensorflow as hvd
import tensorflow as tf
from horovod.common.elastic import ObjectState, run_fn
from horovod.common.exceptions import HorovodInternalError
from horovod.tensorflow.elastic import _reset
from horovod.tensorflow.keras.elastic import (
    CommitStateCallback,
    UpdateBatchStateCallback,
    UpdateEpochStateCallback,
)

from gtopk_hvd.tensorflow.keras.replicas import (
    broadcast_variables,
    model_weights,
    optimizer_variables,
)
from gtopk_hvd.tensorflow.state import GTopkState


def run(func: Callable[..., Any]) -> Callable[..., Any]:
    """Horovod's `hvd.elastic.run`, with failures told apart as they reach Keras.

    `func(state, ...)` runs again after each reset, the state restored and synced first. An
    error of a Horovod operation that found Horovod shut down by a failure, or of an allreduce,
    allgather or broadcast as Horovod's own `run` counts them (tf.errors.UnknownError; those of
    the sparse step inside `model.fit`'s traced step included) is a worker failure
    (HorovodInternalError: restore, reset, go on); any other error propagates. Horovod 0.28's
    TensorFlow `run` returns None, as if training had finished, on any other UnknownError (e.g.
    a failed alltoall, which gTop-k's phases use).

    Args:
        func: the training function, `func(state, *args, **kwargs)`, `state` a `KerasState`
            (or another Horovod elastic state).

    Returns:
        The wrapped function, called as `func` is: it syncs the state, runs `func`, and after a
        worker failure or a change of hosts resets and runs it again; it returns what `func`
        returns once a run completes.
    """

    def attempt(state: ObjectState, *args: Any, **kwargs: Any) -> Any:
        try:
            return func(state, *args, **kwargs)
        except tf.errors.UnknownError as error:  # what a failed op raises (not bad arguments)
            if _HOROVOD_FAILURE.search(error.message or ""):
                raise HorovodInternalError(error) from error
            raise

    return run_fn(attempt, _reset)


# An op that found Horovod shut down (its background loop lost a peer), or one of the ops that
# Horovod's own run counts as failures.
_HOROVOD_FAILURE = re.compile(r"Horovod has been shut down|Horovod(Allreduce|Allgather|Broadcast)")


class KerasState(ObjectState):
    """The state Elastic Horovod commits, restores and syncs (module docstring).

    It holds the model's weights, the optimizer's variables, this worker's `GTopkState` and the
    keyword attributes; every worker makes one, which saves what it holds when made.

    Args:
        model: a Keras model already built (model.build(shape) or an Input layer), the same
            on every worker.
        optimizer: the optimizer whose variables are saved and synced; None:
            `model.optimizer`.
        gtopk_state: this worker's sparse state, saved and restored, not synced; None: the
            optimizer's own `gtopk_state` (`gtopk_hvd.tensorflow.keras.DistributedOptimizer`),
            or none for an optimizer without one (dense). Give the tape's `GTopkState` with a
            `DistributedGradientTape`.
        **kwargs: Horovod's keyword attributes (`epoch=0, batch=0`), readable as attributes
            and synced from rank 0, as Horovod's.

    Raises:
        ValueError: a model not built yet, or no optimizer (model not compiled and none given).
    """

    def __init__(self, model: Any, optimizer: Any = None, gtopk_state: GTopkState | None = None,
                 **kwargs: Any) -> None:
        if not getattr(model, "built", True):
            raise ValueError("KerasState: the model must be built first (model.build(shape) or "
                             "an Input layer), so that every worker holds its weights")
        self.model = model
        self.optimizer = optimizer if optimizer is not None else model.optimizer
        if self.optimizer is None:
            raise ValueError("KerasState: no optimizer (compile the model or pass optimizer=)")
        self.gtopk_state = (gtopk_state if gtopk_state is not None
                            else getattr(self.optimizer, "gtopk_state", None))
        self._save_model()
        super().__init__(bcast_object=hvd.broadcast_object, get_rank=hvd.rank, **kwargs)

    def save(self) -> None:
        self._save_model()
        super().save()

    def restore(self) -> None:
        self._load_model()
        super().restore()

    def sync(self) -> None:
        _build_optimizer(self.optimizer, self.model)
        broadcast_variables(model_weights(self.model), root_rank=0)
        broadcast_variables(optimizer_variables(self.optimizer), root_rank=0)
        self._save_model()
        super().sync()

    def _save_model(self) -> None:
        self._saved_weights = [variable.numpy() for variable in model_weights(self.model)]
        self._saved_optimizer = [v.numpy() for v in optimizer_variables(self.optimizer)]
        self._saved_sparse = ({} if self.gtopk_state is None
                              else self.gtopk_state.state_dict())

    def _load_model(self) -> None:
        for variable, value in zip(model_weights(self.model), self._saved_weights):
            variable.assign(value)
        # A commit made before the optimizer was built holds the variables that come first
        # (the iteration count; Keras 3 also the learning rate), not the slots built since.
        for variable, value in zip(optimizer_variables(self.optimizer), self._saved_optimizer):
            variable.assign(value)
        if self.gtopk_state is not None:
            if "residual" in self._saved_sparse:
                self.gtopk_state.load_state_dict(self._saved_sparse)
            else:  # committed before its first sparse step
                self.gtopk_state.restart_at(self._saved_sparse.get("step", 0))


def _build_optimizer(optimizer: Any, model: Any) -> None:
    """Creates the optimizer's slot variables if it has none yet (Keras 3 `built`, tf-keras
    `_built`; legacy tf-keras optimizers `_create_all_weights`)."""
    if getattr(optimizer, "built", False) or getattr(optimizer, "_built", False):
        return
    variables = model.trainable_variables
    if hasattr(optimizer, "build"):
        optimizer.build(variables)
    elif hasattr(optimizer, "_create_all_weights"):
        optimizer._create_all_weights(variables)


__all__ = ["CommitStateCallback", "KerasState", "UpdateBatchStateCallback",
           "UpdateEpochStateCallback", "run"]
