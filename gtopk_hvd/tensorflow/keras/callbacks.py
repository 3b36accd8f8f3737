"""Broadcast of Keras variables from one worker to all, for Keras 3 and tf-keras alike.

horovod.tensorflow.keras' broadcast helpers fail on Keras 3 variables (Horovod 0.28 predates
Keras 3). These send each variable's value with horovod.tensorflow's `hvd.broadcast` (a plain
tf tensor in, a tensor out) and `assign` the result, which works for Keras 3 variables, tf-keras
variables and tf.Variables. Run them eagerly (callbacks are), with every worker calling them with
the same variables in the same order.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import tensorflow as tf


def broadcast_variables(variables: Iterable[Any], root_rank: int = 0) -> None:
    """Sets every variable on every worker to its value on worker `root_rank`."""
    import horovod.tensorflow as hvd

    for position, variable in enumerate(variables):
        value = hvd.broadcast(tf.convert_to_tensor(variable), root_rank,
                              name=f"gtopk_hvd_broadcast_{position}")
        variable.assign(value)


def optimizer_variables(optimizer: Any) -> list[Any]:
    """The optimizer's variables that exist now (iterations, slots once built)."""
    if optimizer is None:
        return []
    variables = optimizer.variables
    return list(variables() if callable(variables) else variables)


class BroadcastGlobalVariablesCallback(tf.keras.callbacks.Callback):
    """Broadcasts the model's variables (trainable and not) and the optimizer's from
    `root_rank` when training starts, so that every replica starts identical (fresh weights or
    restored on one worker only). Optimizer variables made during the first batch (tf-keras
    builds its slots lazily) are broadcast at the end of that batch.

    The base class is `tf.keras.callbacks.Callback`: Keras 3's by default, tf-keras' under
    TF_USE_LEGACY_KERAS=1.
    """

    def __init__(self, root_rank: int = 0) -> None:
        super().__init__()
        self.root_rank = root_rank
        self._optimizer_count = 0
        self._first_batch_done = False

    def on_train_begin(self, logs: Any = None) -> None:
        optimizer = getattr(self.model, "optimizer", None)
        broadcast_variables(self.model.variables, self.root_rank)
        existing = optimizer_variables(optimizer)
        broadcast_variables(existing, self.root_rank)
        self._optimizer_count = len(existing)

    def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
        if self._first_batch_done:
            return
        self._first_batch_done = True
        variables = optimizer_variables(getattr(self.model, "optimizer", None))
        if len(variables) > self._optimizer_count:
            broadcast_variables(variables, self.root_rank)
