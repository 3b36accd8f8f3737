"""`BroadcastGlobalVariablesCallback`: replicas start identical and are checked to be, on Keras 3
and tf-keras, whether or not the model is built when training starts.

When the variables exist (Keras 3 and tf-keras under `model.fit`): a functional model, or one
built before fit, has its weights at `on_train_begin`; a model without
an Input (`Sequential([Conv2D(...), ...])`, a subclassed model whose layers build on first call)
gets them inside the first batch's traced step, so the first hook that sees them is that batch's
`on_train_batch_end`, after its update. Optimizer slots appear in the first step on both. So the
callback broadcasts at `on_train_begin` what exists on every worker then, and at the end of the
first batch what exists by then and was not broadcast yet (for an unbuilt model: the weights
after the first update, computed from different starting points; from there on every replica is
the root's). Each of these two hooks first all-gathers how many variables each worker holds, so
that all workers take the same decision (e.g. a model restored on the root only is built there
and not elsewhere: its broadcast waits until every worker has the weights).

Then, at the end of the first batch, `check_replicas_agree` compares the trainable weights and
the optimizer's variables bit for bit across workers and raises RuntimeError on every worker if
any differs. Non-trainable weights (BatchNorm statistics, updated from each worker's own batches)
are broadcast but not checked; so are variables registered as worker-local, and, when there are
such, the optimizer's non-scalar variables (slots of local variables differ by design).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np
import tensorflow as tf

from gtopk_hvd.tensorflow.keras.replicas import (
    allgather_rows,
    broadcast_variables,
    check_replicas_agree,
    model_weights,
    optimizer_variables,
)


class BroadcastGlobalVariablesCallback(tf.keras.callbacks.Callback):
    """Horovod's callback of that name, for Keras 3 and tf-keras: broadcasts, then checks.

    It broadcasts the model's weights (trainable and not) and the optimizer's variables from
    `root_rank` as soon as they exist on every worker (module docstring), then checks after the
    first batch that every replica holds the same trainable weights and optimizer variables.
    Variables registered as worker-local, here or with the optimizer's `register_local_var`,
    are neither broadcast nor checked. The base class is `tf.keras.callbacks.Callback`: Keras
    3's by default, tf-keras' under TF_USE_LEGACY_KERAS=1.

    Args:
        root_rank: the worker whose values every other one takes.
        device: Horovod's, accepted and not used (the broadcast runs where horovod.tensorflow
            puts it).
        local_variables: a variable or a list, tuple or set of them that are worker-local, as
            `register_local_var` registers them; None: none.
        check: False skips the check after the first batch.

    Raises:
        RuntimeError: at the end of the first batch, on every worker, if the workers hold
            different numbers of weights or optimizer variables, or (check) if any replica's
            trainable weights or optimizer variables differ from the root's.
    """

    def __init__(self, root_rank: int = 0, device: str = "", local_variables: Any = None,
                 check: bool = True) -> None:
        super().__init__()
        del device  # Horovod's: the broadcast runs where horovod.tensorflow puts it
        self.root_rank = root_rank
        self.check = check
        self.broadcast_done = False  # Horovod's name: True once broadcast (and checked)
        self._local: list[Any] = []
        self._weights_sent = 0
        self._optimizer_sent = 0
        if local_variables is not None:
            if not isinstance(local_variables, (list, tuple, set)):
                local_variables = [local_variables]
            for variable in local_variables:
                self.register_local_var(variable)

    def register_local_var(self, var: Any) -> None:
        """Horovod's: `var` is worker-local, neither broadcast nor checked.

        Args:
            var: a model variable (Keras 3, tf-keras or tf.Variable), matched by identity;
                registering one twice is harmless. Register it before fit: the broadcasts
                and the check happen at its start and at the end of its first batch.
        """
        if not any(var is known for known in self._local):
            self._local.append(var)

    def on_train_begin(self, logs: Any = None) -> None:
        if not self.broadcast_done:
            self._broadcast_what_exists(final=False)

    def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
        if self.broadcast_done:
            return
        self._broadcast_what_exists(final=True)
        if self.check:
            check_replicas_agree(self._checked_variables(), "BroadcastGlobalVariablesCallback: "
                                 "trainable weights and optimizer variables after the first "
                                 "batch", self.root_rank)
        self.broadcast_done = True

    # -- what is broadcast and checked ---------------------------------------------------------

    def _is_local(self, variable: Any) -> bool:
        if any(variable is known for known in self._local):
            return True
        optimizer = getattr(self.model, "optimizer", None)
        reduction = getattr(optimizer, "_gtopk_reduction", None)  # ours
        if reduction is not None and reduction.local.holds(variable):
            return True
        horovods = getattr(optimizer, "_local_vars", None)  # Horovod's tf-keras wrapper
        return bool(horovods) and hasattr(variable, "ref") and variable.ref() in horovods

    def _shared(self, variables: Iterable[Any]) -> list[Any]:
        return [variable for variable in variables if not self._is_local(variable)]

    def _checked_variables(self) -> list[Any]:
        weights = model_weights(self.model, trainable_only=True)
        shared = self._shared(weights)
        optimizer = optimizer_variables(getattr(self.model, "optimizer", None))
        if len(shared) < len(weights):  # slots of local variables differ by design
            optimizer = [v for v in optimizer if len(tuple(v.shape)) == 0]
        return shared + optimizer

    # -- the broadcast ------------------------------------------------------------------------

    def _broadcast_what_exists(self, final: bool) -> None:
        """Broadcasts the weights and the optimizer variables that every worker now holds and
        that were not broadcast yet; at the end of the first batch (`final`), raises
        RuntimeError on every worker if the workers hold different numbers of them."""
        weights = self._shared(model_weights(self.model))
        optimizer = optimizer_variables(getattr(self.model, "optimizer", None))
        counts = np.concatenate(allgather_rows(
            np.array([[len(weights), len(optimizer)]]), "gtopk_hvd_broadcast_counts"))
        self._weights_sent = self._broadcast_group(
            weights, counts[:, 0], self._weights_sent, final, "model weights")
        self._optimizer_sent = self._broadcast_group(
            optimizer, counts[:, 1], self._optimizer_sent, final, "optimizer variables")

    def _broadcast_group(self, variables: list[Any], counts: np.ndarray, sent: int,
                         final: bool, what: str) -> int:
        """Broadcasts `variables` if every worker holds as many (counts, by rank) and more than
        the `sent` already broadcast; returns how many are broadcast now."""
        if len(set(counts.tolist())) > 1:
            if final:
                listed = ", ".join(f"rank {rank}: {n}" for rank, n in enumerate(counts))
                raise RuntimeError(
                    f"BroadcastGlobalVariablesCallback: after the first batch the workers hold "
                    f"different numbers of {what} ({listed}): are the models the same?")
            return sent  # e.g. restored on the root only: wait until every worker has them
        if counts[0] > sent:
            broadcast_variables(variables, self.root_rank)
            return int(counts[0])
        return sent
