"""Horovod's learning-rate callbacks (`LearningRateScheduleCallback`,
`LearningRateWarmupCallback`) with Horovod 0.28.1's arguments and schedule, for Keras 3 and
tf-keras optimizers and the distributed wrappers made from them. Horovod's own read and set
`optimizer.lr` through `keras.backend.get_value` / `set_value`, which Keras 3 no longer has.
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Union

import tensorflow as tf

from gtopk_hvd.tensorflow.keras.hyperparameters import (
    MomentumCorrection,
    get_learning_rate,
    set_learning_rate,
)


class LearningRateScheduleCallback(tf.keras.callbacks.Callback):
    """Sets the learning rate to `initial_lr * multiplier(epoch)` from epoch `start_epoch` up to
    (not including) `end_epoch`.

    Outside [start_epoch, end_epoch) the rate is left as it is. The learning rate is logged as
    `lr` at the end of each epoch.

    Args:
        initial_lr: the learning rate that the multiplier scales; required (None raises).
        multiplier: a function of the epoch (a float with staircase=False), or a constant m,
            which means `m ** (epoch - start_epoch)`.
        start_epoch: the first epoch the schedule sets the rate in.
        end_epoch: the first epoch it no longer does; None: no end.
        staircase: True: set at the first batch of each epoch, with the integer epoch; False:
            set before every batch, with `epoch + batch / steps_per_epoch`.
        momentum_correction: in the steps where the rate changes, the momentum is scaled by
            new / old rate (`hyperparameters.MomentumCorrection` says how on each optimizer).
        steps_per_epoch: batches per epoch, for staircase=False; None: detected at the start
            of training from fit's `steps` (or `samples` // `batch_size`).

    Raises:
        ValueError: initial_lr None; at the start of training, staircase=False with no
            steps_per_epoch given and none detectable.
    """

    def __init__(self, initial_lr: float, multiplier: Union[float, Callable[[float], float]],
                 start_epoch: int = 0, end_epoch: Optional[int] = None, staircase: bool = True,
                 momentum_correction: bool = True, steps_per_epoch: Optional[int] = None) -> None:
        super().__init__()
        if initial_lr is None:
            raise ValueError("Parameter `initial_lr` is required")
        self.initial_lr = initial_lr
        self.start_epoch = start_epoch
        self.end_epoch = end_epoch
        self.staircase = staircase
        self.momentum_correction = momentum_correction
        self.steps_per_epoch = steps_per_epoch
        self.current_epoch: Optional[int] = None
        if callable(multiplier):
            self.multiplier = multiplier
        else:
            self.multiplier = lambda epoch: multiplier ** (epoch - start_epoch)
        self._momentum = MomentumCorrection()

    def _autodetect_steps_per_epoch(self) -> int:
        params = self.params or {}
        if params.get("steps"):
            return int(params["steps"])
        if params.get("samples") and params.get("batch_size"):
            return int(params["samples"]) // int(params["batch_size"])
        raise ValueError("Could not autodetect the number of steps per epoch. Please specify "
                         f"the steps_per_epoch parameter to the {type(self).__name__}().")

    def _adjust_learning_rate(self, epoch: float) -> None:
        optimizer = self.model.optimizer
        old_lr = get_learning_rate(optimizer)
        new_lr = self.initial_lr * self.multiplier(epoch)
        set_learning_rate(optimizer, new_lr)
        if self.momentum_correction:
            self._momentum.apply(optimizer, old_lr, new_lr)

    def on_train_begin(self, logs: Any = None) -> None:
        if not self.staircase and not self.steps_per_epoch:
            self.steps_per_epoch = self._autodetect_steps_per_epoch()

    def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
        self.current_epoch = epoch

    def on_train_batch_begin(self, batch: int, logs: Any = None) -> None:
        if self.current_epoch < self.start_epoch or (
                self.end_epoch is not None and self.current_epoch >= self.end_epoch):
            return
        if self.staircase and batch == 0:
            self._adjust_learning_rate(self.current_epoch)
        elif not self.staircase:
            self._adjust_learning_rate(self.current_epoch + float(batch) / self.steps_per_epoch)

    def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
        self._momentum.restore(self.model.optimizer)

    def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
        if logs is not None:
            logs["lr"] = get_learning_rate(self.model.optimizer)


class LearningRateWarmupCallback(LearningRateScheduleCallback):
    """Gradual warmup (Goyal et al. 2017) as Horovod's: from `initial_lr / size` at the start to
    `initial_lr` after `warmup_epochs`, linear in `epoch' = epoch + (batch + 1) / steps_per_epoch`:

        lr = initial_lr / size * (epoch' * (size - 1) / warmup_epochs + 1)

    set before every batch of the first `warmup_epochs` epochs; later epochs keep the rate.

    Args:
        initial_lr: the learning rate reached at the end of the warmup (usually the base rate
            times the number of workers); required (None raises).
        warmup_epochs: the epochs the warmup lasts.
        momentum_correction: in the steps where the rate changes, the momentum is scaled by
            new / old rate (`hyperparameters.MomentumCorrection`).
        steps_per_epoch: batches per epoch; None: detected at the start of training from fit's
            `steps` (or `samples` // `batch_size`).
        verbose: > 0: rank 0 prints the rate when the warmup ends.

    Raises:
        ValueError: initial_lr None; at the start of training, no steps_per_epoch given and
            none detectable.
    """

    def __init__(self, initial_lr: float, warmup_epochs: int = 5,
                 momentum_correction: bool = True, steps_per_epoch: Optional[int] = None,
                 verbose: int = 0) -> None:
        def multiplier(epoch: float) -> float:
            import horovod.tensorflow as hvd

            epoch += 1.0 / self.steps_per_epoch  # round numbers at the end of each epoch
            return 1.0 / hvd.size() * (epoch * (hvd.size() - 1) / warmup_epochs + 1)

        super().__init__(initial_lr, multiplier, start_epoch=0, end_epoch=warmup_epochs,
                         staircase=False, momentum_correction=momentum_correction,
                         steps_per_epoch=steps_per_epoch)
        self.verbose = verbose

    def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
        super().on_epoch_end(epoch, logs)
        import horovod.tensorflow as hvd

        if epoch == self.end_epoch - 1 and self.verbose > 0 and hvd.rank() == 0:
            print(f"\nEpoch {epoch + 1}: finished gradual learning rate warmup to "
                  f"{get_learning_rate(self.model.optimizer):g}.")
