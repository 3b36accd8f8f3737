"""Reading and setting an optimizer's learning rate and momentum while `model.fit` runs, on
Keras 3 optimizers, tf-keras ones (Keras 2's `keras.optimizers` and `.legacy`) and the
distributed wrappers made from them (gtopk_hvd's and Horovod's are subclasses of the wrapped
class, so the same attributes apply).

The learning rate is a variable on all of them (Keras 3, tf-keras) or a hyperparameter variable
(tf-keras legacy): setting it takes effect in the compiled train step. The momentum is not
always: Keras 3's and tf-keras' optimizers keep it as a Python float, which the traced step has
already baked in. `MomentumCorrection` therefore works on what the step does read (see there).
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np


def to_float(value: Any) -> float:
    """A scalar variable, tensor or number as a Python float."""
    if hasattr(value, "numpy"):
        value = value.numpy()
    return float(np.asarray(value))


def get_learning_rate(optimizer: Any) -> float:
    """The optimizer's current learning rate."""
    return to_float(optimizer.learning_rate)


def set_learning_rate(optimizer: Any, value: float) -> None:
    """Sets the optimizer's learning rate (assigns its variable). Keras raises TypeError if the
    optimizer was made with a LearningRateSchedule."""
    optimizer.learning_rate = float(value)


def _has_momentum_hyper(optimizer: Any) -> bool:
    """tf-keras legacy OptimizerV2: `momentum` is a hyperparameter the step reads each time."""
    hyper = getattr(optimizer, "_hyper", None)
    return isinstance(hyper, dict) and "momentum" in hyper


def _momentum_buffers(optimizer: Any) -> list[Any] | None:
    """The velocity slots of SGD (`momentums`) and RMSprop (`_momentums`), Keras 3 and tf-keras:
    both keep the learning rate inside them (m = momentum * m - lr * g, resp. + lr * g / ...).
    [] before the optimizer is built; None for an optimizer without such slots."""
    for name in ("momentums", "_momentums"):
        buffers = getattr(optimizer, name, None)
        if isinstance(buffers, (list, tuple)):
            return list(buffers)
    return None


def _is_built(optimizer: Any) -> bool:
    """Whether the optimizer has made its slots (Keras 3: `built`, tf-keras: `_built`)."""
    return bool(getattr(optimizer, "built", False) or getattr(optimizer, "_built", False))


class MomentumCorrection:
    """Horovod's momentum correction (Goyal et al. 2017): in the step where the learning rate
    changes from old_lr to new_lr, the momentum is multiplied by new_lr / old_lr, so that the
    velocity accumulated with the old learning rate is rescaled.

    On a tf-keras legacy optimizer (momentum a hyperparameter variable) this is Horovod's way:
    the momentum is set for the step and restored after it (`restore`). On Keras 3 and tf-keras
    SGD / RMSprop (momentum a float baked into the traced step), the velocity slots are scaled by
    new_lr / old_lr before the step instead: for SGD and RMSprop the same update as Horovod's
    (m' = momentum * (r m) - lr' g = (r momentum) m - lr' g), except for Nesterov SGD, whose
    look-ahead term then uses the unscaled momentum. On other optimizers with a `momentum` it is
    not applied (warned once). Optimizers without `momentum` (Adam, ...) are left alone, as in
    Horovod.
    """

    def __init__(self) -> None:
        self._restore: float | None = None
        self._warned = False

    def apply(self, optimizer: Any, old_lr: float, new_lr: float) -> None:
        """Corrects for a change of learning rate from old_lr to new_lr before a step."""
        if not hasattr(optimizer, "momentum"):
            return
        if _has_momentum_hyper(optimizer):
            self._restore = to_float(optimizer.momentum)
            if old_lr != 0:
                optimizer.momentum = self._restore * new_lr / old_lr
            return
        if to_float(optimizer.momentum) == 0 or old_lr == 0 or new_lr == old_lr:
            return
        buffers = _momentum_buffers(optimizer)
        if buffers is None:
            if not self._warned and _is_built(optimizer):  # unbuilt: no velocity to correct
                warnings.warn(f"momentum correction is not applied to {type(optimizer).__name__}"
                              f": its momentum is a constant of the compiled step", stacklevel=2)
                self._warned = True
            return
        for buffer in buffers:
            value = np.asarray(buffer.numpy())
            buffer.assign((value * (new_lr / old_lr)).astype(value.dtype))

    def restore(self, optimizer: Any) -> None:
        """After the step: puts back the momentum changed by `apply` (legacy optimizers)."""
        if self._restore:
            optimizer.momentum = self._restore
        self._restore = None
