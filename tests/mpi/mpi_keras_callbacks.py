"""Under mpirun: gtopk_hvd.tensorflow.keras' callbacks with real Horovod and `model.fit`. Any
failure on any rank ends the job (harness.run_on_all_ranks).

    mpi_keras_callbacks.py              on Keras 3 (TensorFlow's default)
    mpi_keras_callbacks.py --tf-keras   on tf-keras: sets TF_USE_LEGACY_KERAS=1 before
                                        TensorFlow is imported
    ... --only CHECK                    runs only the check functions of that name

Checked: replicas that start from different weights (a seed per rank) end bitwise identical
after fit with BroadcastGlobalVariablesCallback, for an unbuilt Sequential, an unbuilt subclassed
model and a functional one, with gTop-k and dense compression; the replica check raises on every
rank when replicas differ; MetricAverageCallback gives the mean of per-rank values; the
learning-rate callbacks set Horovod's rates, which the compiled step really uses (the weights
follow a numpy replay of SGD with momentum and Horovod's momentum correction).
"""

from __future__ import annotations

import os
import sys

if __name__ == "__main__" and "--tf-keras" in sys.argv:
    os.environ["TF_USE_LEGACY_KERAS"] = "1"

import time  # noqa: E402
from typing import Any, Callable  # noqa: E402

import horovod.tensorflow as hvd  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from harness import run_on_all_ranks  # noqa: E402

import gtopk_hvd.tensorflow.keras as gtopk  # noqa: E402

keras = tf.keras  # Keras 3, or tf-keras under TF_USE_LEGACY_KERAS=1
LEGACY = "--tf-keras" in sys.argv


# -- helpers --------------------------------------------------------------------------------------

def variable_bytes(variables: list) -> bytes:
    return b"".join(np.ascontiguousarray(np.asarray(v.numpy())).tobytes() for v in variables)


def optimizer_variables(optimizer: Any) -> list:
    variables = optimizer.variables
    return list(variables() if callable(variables) else variables)


def everyones(value: Any) -> list:
    """`value` of every rank, in rank order (Horovod's allgather_object)."""
    return hvd.allgather_object(value)


def raised_everywhere(function: Callable[[], None], expected: list[str]) -> str:
    """Runs function on every rank; asserts it raised RuntimeError on every rank with all of
    `expected` in its message. Returns this rank's message."""
    try:
        function()
    except RuntimeError as error:
        message = str(error)
    else:
        message = ""
    flags = everyones(bool(message) and all(part in message for part in expected))
    assert all(flags), f"not every rank raised RuntimeError with {expected}: {flags} {message!r}"
    return message


def data(rank: int, n: int = 64) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(1000 + rank)
    x = rng.normal(size=(n, 8, 8, 1)).astype(np.float32)
    return x, (x[:, :4].sum(axis=(1, 2, 3)) > 0).astype(np.int64) + 2 * (x[:, 4:, :4].sum(
        axis=(1, 2, 3)) > 0)


# -- models ---------------------------------------------------------------------------------------

class SmallNet(keras.Model):
    """Subclassed, no Input: its layers build on the first call. Its BatchNormalization keeps
    per-worker statistics (non-trainable, from each worker's batches) and its Dropout a
    per-worker random state: neither may trip the replica check."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = keras.layers.Conv2D(4, 3, activation="relu")
        self.norm = keras.layers.BatchNormalization()
        self.flatten = keras.layers.Flatten()
        self.drop = keras.layers.Dropout(0.25)
        self.dense = keras.layers.Dense(4)

    def call(self, x: Any, training: Any = None) -> Any:
        hidden = self.flatten(self.norm(self.conv(x), training=training))
        return self.dense(self.drop(hidden, training=training))


def make_model(kind: str, seed: int) -> keras.Model:
    keras.utils.set_random_seed(seed)
    if kind == "sequential":  # as Horovod's tensorflow2_keras_mnist.py: no Input
        return keras.Sequential([keras.layers.Conv2D(4, 3, activation="relu"),
                                 keras.layers.Flatten(), keras.layers.Dense(4)])
    if kind == "subclassed":
        return SmallNet()
    inputs = keras.Input((8, 8, 1))
    hidden = keras.layers.Flatten()(keras.layers.Conv2D(4, 3, activation="relu")(inputs))
    return keras.Model(inputs, keras.layers.Dense(4)(hidden))


def compile_model(model: keras.Model, compression: Any, learning_rate: float = 0.05) -> Any:
    optimizer = gtopk.DistributedOptimizer(
        keras.optimizers.SGD(learning_rate, momentum=0.9), compression=compression)
    model.compile(optimizer=optimizer, metrics=["accuracy"],
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return optimizer


class InitialWeights(keras.callbacks.Callback):
    """Before the broadcast callback: records whether the ranks' weights differed when first
    seen (train begin if built, else the end of the first batch)."""

    def __init__(self) -> None:
        super().__init__()
        self.differed: bool | None = None

    def _record(self) -> None:
        if self.differed is None and self.model.built and self.model.weights:
            self.differed = len(set(everyones(variable_bytes(self.model.weights)))) > 1

    def on_train_begin(self, logs: Any = None) -> None:
        self._record()

    def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
        self._record()


# -- BroadcastGlobalVariablesCallback -------------------------------------------------------------

def check_fit_leaves_identical_replicas(kind: str, compression: Any) -> None:
    model = make_model(kind, seed=100 + hvd.rank())
    optimizer = compile_model(model, compression)
    initial = InitialWeights()
    x, y = data(hvd.rank())
    model.fit(x, y, batch_size=16, epochs=2, verbose=0,
              callbacks=[initial, gtopk.BroadcastGlobalVariablesCallback(root_rank=0)])
    assert initial.differed, f"{kind}: the ranks' initial weights did not differ: no test"
    assert len(model.trainable_weights) == (6 if kind == "subclassed" else 4), model.weights
    for what, variables in (("weights", model.trainable_weights),
                            ("optimizer variables", optimizer_variables(optimizer))):
        everyone = everyones(variable_bytes(variables))
        assert len(set(everyone)) == 1, f"{kind} {compression}: {what} differ between replicas"
    if kind == "subclassed":  # BatchNorm statistics: broadcast, then each worker's own
        statistics = everyones(variable_bytes(model.non_trainable_weights))
        assert len(model.non_trainable_weights) == 2 and len(set(statistics)) == hvd.size()
    assert int(np.asarray(optimizer.iterations.numpy())) == 8, optimizer.iterations


def check_callback_catches_replicas_that_differ() -> None:
    """A callback before the broadcast callback changes rank 1's weights at the end of the
    first batch: the broadcast callback's check must stop fit on every rank."""

    class Sabotage(keras.callbacks.Callback):
        def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
            if batch == 0 and hvd.rank() == 1:
                kernel = self.model.trainable_weights[0]
                kernel.assign(kernel.numpy() + 1.0)

    model = make_model("functional", seed=0)
    compile_model(model, gtopk.Compression.none)
    x, y = data(hvd.rank())
    name = model.trainable_weights[0]
    name = getattr(name, "path", None) or name.name
    raised_everywhere(lambda: model.fit(
        x, y, batch_size=16, epochs=1, verbose=0,
        callbacks=[Sabotage(), gtopk.BroadcastGlobalVariablesCallback(0)]),
        ["replicas disagree", "1 of", repr(name), "(ranks [1])"])


def check_replicas_agree_directly() -> None:
    model = make_model("functional", seed=0)  # the same weights on every rank
    gtopk.check_replicas_agree(model.weights, "same weights")  # must not raise
    target = model.weights[2]
    name = getattr(target, "path", None) or target.name
    if hvd.rank() == 1:
        value = target.numpy()
        value.flat[5] = np.nextafter(value.flat[5], np.float32(np.inf))  # one ulp
        target.assign(value)
    raised_everywhere(lambda: gtopk.check_replicas_agree(model.weights, "perturbed"),
                      ["perturbed: replicas disagree", "1 of 4 variables", repr(name),
                       "(ranks [1])"])
    fewer = model.weights[:3] if hvd.rank() == 1 else model.weights
    raised_everywhere(lambda: gtopk.check_replicas_agree(fewer, "fewer"),
                      ["fewer: the workers hold different numbers of variables",
                       "rank 0: 4, rank 1: 3"])


# -- MetricAverageCallback ------------------------------------------------------------------------

class RankMetric(keras.callbacks.Callback):
    """Adds a per-rank value to the epoch logs (before MetricAverageCallback)."""

    def __init__(self, extra_on_rank1: bool = False) -> None:
        super().__init__()
        self.extra_on_rank1 = extra_on_rank1

    def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
        logs["rank_value"] = 1.5 * hvd.rank() + epoch
        if self.extra_on_rank1 and hvd.rank() == 1:
            logs["only_on_rank1"] = 1.0


def check_metric_average() -> None:
    """lr 0: weights stay as built (the same on every rank); the data differ per rank, so each
    rank's loss and accuracy differ; fit's logs must be their means."""
    model = make_model("functional", seed=0)
    model.compile(optimizer=keras.optimizers.SGD(0.0), metrics=["accuracy"],
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    x, y = data(hvd.rank())
    mine = model.evaluate(x, y, batch_size=16, verbose=0, return_dict=True)
    everyone = everyones({name: float(value) for name, value in mine.items()})
    assert len({e["loss"] for e in everyone}) == hvd.size(), f"losses do not differ: {everyone}"
    history = model.fit(x, y, batch_size=16, epochs=2, verbose=0,
                        callbacks=[RankMetric(), gtopk.MetricAverageCallback()]).history
    size = hvd.size()
    for epoch in range(2):
        expected = np.mean([1.5 * rank + epoch for rank in range(size)])
        assert abs(history["rank_value"][epoch] - expected) < 1e-12, (history, expected)
        for name in ("loss", "accuracy"):
            mean = np.mean([e[name] for e in everyone])
            assert abs(history[name][epoch] - mean) <= 1e-5 * max(1.0, abs(mean)), \
                (name, history[name], mean, everyone)
    raised_everywhere(lambda: model.fit(
        x, y, batch_size=16, epochs=1, verbose=0,
        callbacks=[RankMetric(extra_on_rank1=True), gtopk.MetricAverageCallback()]),
        ["MetricAverageCallback: the workers' logs differ", "only_on_rank1"])


# -- learning-rate callbacks ----------------------------------------------------------------------

STEPS, INITIAL = 4, 0.1  # steps per epoch; the schedules' initial_lr


class RecordRates(keras.callbacks.Callback):
    """After the learning-rate callback: the rate each batch ran with, and the logged `lr`."""

    def __init__(self) -> None:
        super().__init__()
        self.rates: list[float] = []
        self.logged: list[float] = []

    def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
        self.rates.append(float(np.asarray(self.model.optimizer.learning_rate.numpy())))

    def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
        self.logged.append(float(logs["lr"]))


def fit_with_rates(callback: keras.callbacks.Callback, epochs: int, start_lr: float,
                   optimizer: Any) -> tuple[list[float], list[float], float]:
    """One weight w (from 0) with gradient 1 at every step (loss = mean(x w), x = 1), so that
    w after fit is an exact function of the rates and momenta the compiled step used."""
    keras.utils.set_random_seed(0)
    inputs = keras.Input((1,))
    model = keras.Model(inputs, keras.layers.Dense(1, use_bias=False,
                                                   kernel_initializer="zeros")(inputs))
    model.compile(optimizer=optimizer, loss=lambda y, pred: tf.reduce_mean(pred, axis=-1))
    recorder = RecordRates()
    x = np.ones((8 * STEPS, 1), np.float32)
    model.fit(x, np.zeros(8 * STEPS, np.float32), batch_size=8, epochs=epochs, verbose=0,
              shuffle=False, callbacks=[callback, recorder])
    assert float(np.asarray(optimizer.learning_rate.numpy())) == np.float32(recorder.rates[-1])
    return recorder.rates, recorder.logged, float(model.weights[0].numpy().reshape(-1)[0])


def replay_sgd(rates: list[float], adjusted: list[bool], momentum: float,
               start_lr: float) -> float:
    """w after SGD with momentum (m = mu m - lr g, w += m; g = 1), with Horovod's momentum
    correction (mu * new / old in the steps where the rate was set), in float64."""
    w, m, previous = 0.0, 0.0, start_lr
    for rate, set_now in zip(rates, adjusted):
        mu = momentum * rate / previous if set_now else momentum
        m = mu * m - rate
        w += m
        previous = rate
    return w


def check_rates(name: str, rates: list[float], expected: list[float]) -> None:
    assert len(rates) == len(expected), (name, rates, expected)
    for got, want in zip(rates, expected):
        assert abs(got - want) <= 1e-6 * want, f"{name}: rates {rates} != {expected}"


def check_warmup(make_optimizer: Callable[[float], Any], label: str) -> None:
    size, warmup, epochs, start = hvd.size(), 2, 3, INITIAL
    rates, logged, w = fit_with_rates(
        gtopk.LearningRateWarmupCallback(INITIAL, warmup_epochs=warmup, verbose=1),
        epochs, start, make_optimizer(start))
    expected, adjusted = [], []
    for epoch in range(epochs):
        for batch in range(STEPS):
            if epoch < warmup:
                point = epoch + batch / STEPS + 1 / STEPS
                expected.append(INITIAL / size * (point * (size - 1) / warmup + 1))
            else:
                expected.append(expected[-1])
            adjusted.append(epoch < warmup)
    check_rates(f"warmup {label}", rates, expected)
    assert abs(expected[warmup * STEPS - 1] - INITIAL) < 1e-12  # warmed up to initial_lr
    check_rates(f"warmup {label} logged", logged, [expected[(e + 1) * STEPS - 1]
                                                   for e in range(epochs)])
    want = replay_sgd(rates, adjusted, 0.9, start)
    assert abs(w - want) <= 1e-5 * abs(want), f"warmup {label}: w {w} != replay {want}"


def check_schedule_staircase(make_optimizer: Callable[[float], Any], label: str) -> None:
    """Constant multiplier 0.5 from epoch 1 to 3 (exclusive), set at each epoch's first batch;
    the optimizer starts at 0.2, which epoch 0 keeps."""
    epochs, start = 4, 0.2
    rates, _, w = fit_with_rates(
        gtopk.LearningRateScheduleCallback(INITIAL, 0.5, start_epoch=1, end_epoch=3),
        epochs, start, make_optimizer(start))
    per_epoch = [start, INITIAL, INITIAL * 0.5, INITIAL * 0.5]
    expected = [per_epoch[epoch] for epoch in range(epochs) for _ in range(STEPS)]
    adjusted = [epoch in (1, 2) and batch == 0 for epoch in range(epochs)
                for batch in range(STEPS)]
    check_rates(f"staircase {label}", rates, expected)
    want = replay_sgd(rates, adjusted, 0.9, start)
    assert abs(w - want) <= 1e-5 * abs(want), f"staircase {label}: w {w} != replay {want}"
    without = replay_sgd(rates, [False] * len(rates), 0.9, start)
    assert abs(without - want) > 1e-3 * abs(want), "momentum correction changes nothing here"


def check_schedule_smooth(make_optimizer: Callable[[float], Any], label: str) -> None:
    """multiplier(epoch) = 1 / (1 + epoch), set before every batch, without momentum
    correction; steps per epoch detected from fit."""
    epochs, start = 2, INITIAL
    rates, _, w = fit_with_rates(
        gtopk.LearningRateScheduleCallback(INITIAL, lambda epoch: 1.0 / (1.0 + epoch),
                                           staircase=False, momentum_correction=False),
        epochs, start, make_optimizer(start))
    expected = [INITIAL / (1.0 + epoch + batch / STEPS) for epoch in range(epochs)
                for batch in range(STEPS)]
    check_rates(f"smooth {label}", rates, expected)
    want = replay_sgd(rates, [False] * len(rates), 0.9, start)
    assert abs(w - want) <= 1e-5 * abs(want), f"smooth {label}: w {w} != replay {want}"


def gtopk_sgd(learning_rate: float) -> Any:
    return gtopk.DistributedOptimizer(keras.optimizers.SGD(learning_rate, momentum=0.9),
                                      compression=gtopk.Compression.gtopk(0.01))


def dense_sgd(learning_rate: float) -> Any:
    return gtopk.DistributedOptimizer(keras.optimizers.SGD(learning_rate, momentum=0.9),
                                      compression=gtopk.Compression.none)


def legacy_sgd(learning_rate: float) -> Any:  # tf-keras only: momentum is a hyperparameter
    return gtopk.DistributedOptimizer(keras.optimizers.legacy.SGD(learning_rate, momentum=0.9),
                                      compression=gtopk.Compression.none)


# -- main -----------------------------------------------------------------------------------------

def label(value: Any) -> str:
    return getattr(value, "__name__", None) or getattr(value, "reduction", None) \
        or getattr(value, "name", None) or str(value)


def timed(check: Callable[..., None], *args: Any) -> None:
    """Runs check(*args) unless `--only NAME` names another check; rank 0 prints its time."""
    if "--only" in sys.argv and sys.argv[sys.argv.index("--only") + 1] != check.__name__:
        return
    start = time.perf_counter()
    check(*args)
    if hvd.rank() == 0:
        shown = ", ".join(label(arg) for arg in args)
        print(f"{check.__name__}({shown}): {time.perf_counter() - start:.1f} s", flush=True)


def main() -> None:
    hvd.init()
    assert hvd.size() >= 2, "run on at least 2 ranks"
    tf.config.threading.set_inter_op_parallelism_threads(1)
    tf.config.threading.set_intra_op_parallelism_threads(1)
    assert keras.__name__.startswith("keras") != LEGACY, keras.__name__
    for kind in ("sequential", "subclassed", "functional"):
        timed(check_fit_leaves_identical_replicas, kind, gtopk.Compression.gtopk(0.01))
        timed(check_fit_leaves_identical_replicas, kind, gtopk.Compression.none)
    timed(check_replicas_agree_directly)
    timed(check_callback_catches_replicas_that_differ)
    timed(check_metric_average)
    timed(check_warmup, gtopk_sgd, "gtopk")
    timed(check_schedule_staircase, dense_sgd, "dense")
    timed(check_schedule_smooth, gtopk_sgd, "gtopk")
    if LEGACY:
        timed(check_warmup, legacy_sgd, "legacy")
        timed(check_schedule_staircase, legacy_sgd, "legacy")
    if hvd.rank() == 0:
        print(f"keras callbacks ok on {hvd.size()} workers "
              f"({'tf-keras' if LEGACY else 'Keras 3'})", flush=True)


if __name__ == "__main__":
    run_on_all_ranks(main)
