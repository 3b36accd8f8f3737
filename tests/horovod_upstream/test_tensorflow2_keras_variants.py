"""Variants of Horovod's Keras optimizer tests (test_tensorflow2_keras.py) for Keras 3: the same
test methods, unchanged, run with the Keras 2 spellings they use mapped onto Keras 3 from outside,
while each runs.

Horovod 0.28.1's tests predate Keras 3 (TensorFlow >= 2.16's default `tf.keras`); on it they fail
in their own Keras 2 code before the distributed optimizer matters. `keras2_spellings` gives each
Keras 2 name its Keras 3 meaning, and nothing else:

- optimizers: `lr=` is `learning_rate=`, `optimizer.lr` is `optimizer.learning_rate`, a
  subclass that passes no learning rate (the tests' TestingOptimizer, which set 0.1 through Keras
  2's `_build_learning_rate`) gets 0.1, its two-argument `update_step(gradient, variable)` is
  called without Keras 3's third (learning_rate) argument, `apply_gradients` accepts (and, as Keras
  2.11+ did, ignores) `experimental_aggregate_gradients`;
- `optimizer._compute_gradients(loss, var_list)`: Keras 2's private method (Keras 3 has none):
  this worker's gradients of loss() as (gradient, variable) pairs (what gtopk_hvd's tf-keras
  wrapper returns: it reduces once, in apply_gradients);
- `tf.keras.losses.mean_squared_error` is Keras 3's `keras.losses.mean_squared_error`;
  `model.compile` accepts (and, as TF 2's Keras did, ignores) `experimental_run_tf_function`.

test_train_model_lr_schedule also uses Horovod's Keras callbacks, which are Keras 2 code of
Horovod's (keras.backend.get_value / set_value, `optimizer.variables()` called): its variant runs
gtopk_hvd's drop-in callbacks (`gtopk_hvd.tensorflow.keras.callbacks`, the same names and
arguments) in their place, under the test's own assertions.

tests/horovod/test_horovod_upstream.py runs these in the Keras 3 flavour only, and says which cannot
run (test_legacy_optimizer: Keras 3 has no legacy optimizers) and what each mode must give.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

import keras
import tensorflow as tf
import test_tensorflow2_keras  # the module, not its TestCase: pytest would collect that here too
from keras.src.optimizers.base_optimizer import BaseOptimizer

LEARNING_RATE_OF_TESTING_OPTIMIZER = 0.1  # what the tests' TestingOptimizer set on Keras 2


@contextmanager
def patched(owner: Any, name: str, value: Any) -> Iterator[None]:
    """owner.name = value while the context lasts (removed again if owner had none)."""
    missing = object()
    original = owner.__dict__.get(name, missing) if isinstance(owner, type) else getattr(
        owner, name, missing)
    setattr(owner, name, value)
    try:
        yield
    finally:
        if original is missing:
            delattr(owner, name)
        else:
            setattr(owner, name, original)


def _optimizer_init(original: Any) -> Any:
    def __init__(self, *args, **kwargs):
        if "lr" in kwargs:
            kwargs["learning_rate"] = kwargs.pop("lr")
        if not args and "learning_rate" not in kwargs:
            kwargs["learning_rate"] = LEARNING_RATE_OF_TESTING_OPTIMIZER
        original(self, *args, **kwargs)

    return __init__


def _init_subclass(cls, **kwargs):
    """A subclass with Keras 2's update_step(gradient, variable) gets Keras 3's third argument
    (the learning rate) dropped on the way in."""
    update_step = cls.__dict__.get("update_step")
    if update_step is not None and len(inspect.signature(update_step).parameters) == 3:
        def keras3_update_step(self, gradient, variable, learning_rate=None):
            return update_step(self, gradient, variable)

        cls.update_step = keras3_update_step


def _apply_gradients(original: Any) -> Any:
    def apply_gradients(self, grads_and_vars, experimental_aggregate_gradients=True, **kwargs):
        return original(self, grads_and_vars, **kwargs)

    return apply_gradients


def _compute_gradients(self, loss, var_list, grad_loss=None, tape=None):
    """Keras 2's Optimizer._compute_gradients: this worker's gradients of loss() (a callable)."""
    with tf.GradientTape() if tape is None else tape as recording:
        value = loss() if callable(loss) else loss
    return list(zip(recording.gradient(value, var_list, grad_loss), var_list))


def _compile(original: Any) -> Any:
    def compile(self, *args, experimental_run_tf_function=None, **kwargs):
        return original(self, *args, **kwargs)

    return compile


@contextmanager
def keras2_spellings() -> Iterator[None]:
    """The Keras 2 names the tests use, with their Keras 3 meaning (module docstring)."""
    learning_rate = property(lambda self: self.learning_rate,
                             lambda self, value: setattr(self, "learning_rate", value))
    with ExitStack() as stack:
        for owner, name, value in [
                (BaseOptimizer, "__init__", _optimizer_init(BaseOptimizer.__init__)),
                (BaseOptimizer, "__init_subclass__", classmethod(_init_subclass)),
                (BaseOptimizer, "lr", learning_rate),
                (BaseOptimizer, "apply_gradients",
                 _apply_gradients(BaseOptimizer.apply_gradients)),
                (BaseOptimizer, "_compute_gradients", _compute_gradients),
                (keras.Model, "compile", _compile(keras.Model.compile)),
                (test_tensorflow2_keras.keras.losses, "mean_squared_error",
                 keras.losses.mean_squared_error)]:
            stack.enter_context(patched(owner, name, value))
        yield


def _run(name: str) -> None:
    assert keras.__version__.split(".")[0] == "3", "the Keras 3 variants run on Keras 3 only"
    with keras2_spellings():
        getattr(test_tensorflow2_keras.Tf2KerasTests(name), name)()


class TestKeras3Spellings:
    def test_train_model_lr_schedule_keras3(self):
        from gtopk_hvd.tensorflow.keras import callbacks

        with patched(test_tensorflow2_keras.hvd, "callbacks", callbacks):
            _run("test_train_model_lr_schedule")

    def test_sparse_as_dense_keras3(self):
        _run("test_sparse_as_dense")

    def test_sparse_as_dense_with_grad_aggregation_keras3(self):
        _run("test_sparse_as_dense_with_grad_aggregation")

    def test_grad_aggregation_with_inf_grad_keras3(self):
        _run("test_grad_aggregation_with_inf_grad")

    def test_gradient_aggregation_0_keras3(self):
        _run("test_gradient_aggregation_0")

    def test_gradient_aggregation_1_keras3(self):
        _run("test_gradient_aggregation_1")

    def test_gradient_aggregation_with_local_vars_0_keras3(self):
        _run("test_gradient_aggregation_with_local_vars_0")

    def test_gradient_aggregation_with_local_vars_1_keras3(self):
        _run("test_gradient_aggregation_with_local_vars_1")
