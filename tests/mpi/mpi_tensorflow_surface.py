"""Under mpirun (2 workers): Horovod's TensorFlow surface beyond the plain step.

    mpi_tensorflow_surface.py              Keras 3
    mpi_tensorflow_surface.py --tf-keras   tf-keras (Keras 2): TF_USE_LEGACY_KERAS=1

  loss scaling   DistributedOptimizer(LossScaleOptimizer(SGD)) under mixed_float16 on
                 scikit-learn's digits, gTop-k and Top-k: starting at scale 2^24 the first steps
                 overflow and are skipped on every worker alike (the scale drops, the sparse
                 step count does not move), against a start that never overflows: accuracy
                 within 1 point, replicas bitwise identical. Keras 3 also: a plain optimizer
                 under mixed_float16 is given its LossScaleOptimizer by our wrapper.
  local sources  (Keras 3 run only) tape.register_local_source on a variable that exists on
                 rank 0 only, dense and sparse: its gradient is this worker's own / size, the
                 others are reduced and the same everywhere.
  dense parity   (Keras 3 run only) with Compression.none / fp16 our tape returns bitwise what
                 Horovod's own tape returns, argument by argument (groups, num_groups, op=Sum,
                 Adasum, gradient_predivide_factor, process_set, fp16, sparse_as_dense,
                 scale_local_gradients), on tf.Variables and on a Keras 3 model's variables;
                 the Keras 3 DistributedOptimizer applies what Horovod's tape reduces.
"""

from __future__ import annotations

import os
import sys

if __name__ == "__main__" and "--tf-keras" in sys.argv:
    os.environ["TF_USE_LEGACY_KERAS"] = "1"

import hashlib  # noqa: E402

import horovod.tensorflow as hvd  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from harness import run_on_all_ranks  # noqa: E402
from helpers import margins  # noqa: E402
from helpers.digits import digits_split, model_seed  # noqa: E402

import gtopk_hvd.tensorflow as gtopk  # noqa: E402
import gtopk_hvd.tensorflow.keras as gtopk_keras  # noqa: E402
from gtopk_hvd import horovod_swap  # noqa: E402
from gtopk_hvd.tensorflow.gradients import tf_variable  # noqa: E402

keras = tf.keras
KERAS3 = not keras.__name__.startswith("tf_keras")
EPOCHS = 6


def digest(variables: list) -> str:
    return hashlib.sha256(b"".join(np.asarray(v.numpy()).tobytes() for v in variables)
                          ).hexdigest()


def same_everywhere(item: object, what: str) -> None:
    everyone = hvd.allgather_object(item)
    assert len(set(everyone)) == 1, f"{what} differ between ranks: {everyone}"


# -- loss scaling -----------------------------------------------------------------------------

def loss_scale_optimizer(initial_scale: float) -> object:
    inner = keras.optimizers.SGD(0.1, momentum=0.9)
    if KERAS3:
        return keras.optimizers.LossScaleOptimizer(inner, initial_scale=initial_scale,
                                                   dynamic_growth_steps=10**6)
    return keras.mixed_precision.LossScaleOptimizer(inner, initial_scale=initial_scale,
                                                    dynamic_growth_steps=10**6)


def scale_of(optimizer: object) -> float:
    return float(optimizer.dynamic_scale if KERAS3 else optimizer.loss_scale)


def digits_run(compression: object, initial_scale: float | None) -> dict:
    """initial_scale None: a plain SGD, which our wrapper puts in a LossScaleOptimizer."""
    x_train, y_train, x_test, y_test = digits_split()
    mine = np.arange(hvd.rank(), len(x_train) // 64 * 64, hvd.size())
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        keras.utils.set_random_seed(model_seed())
        model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(128, activation="relu"),
                                  keras.layers.Dense(10),
                                  keras.layers.Activation("linear", dtype="float32")])
        base = (keras.optimizers.SGD(0.1, momentum=0.9) if initial_scale is None
                else loss_scale_optimizer(initial_scale))
        optimizer = gtopk_keras.DistributedOptimizer(base, compression=compression)
        model.compile(optimizer=optimizer, jit_compile=False,
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        assert model.optimizer is optimizer, "compile wrapped the distributed optimizer"
        model.fit(x_train[mine], y_train[mine], batch_size=32, epochs=EPOCHS, verbose=0,
                  shuffle=False)
    finally:
        keras.mixed_precision.set_global_policy("float32")
    sparse = optimizer.gtopk_state.sparse
    accuracy = float(np.mean(np.argmax(model.predict(x_test, verbose=0), 1) == y_test))
    result = {"accuracy": accuracy, "skipped": sparse.skipped_steps, "steps": sparse.step_count,
              "scale": (initial_scale or 2.0**15, scale_of(optimizer))}
    same_everywhere((digest(model.variables), result["skipped"], result["steps"]),
                    "replicas or skipped steps")
    return result


def check_loss_scaling() -> None:
    for name in ("gtopk", "topk"):
        compression = getattr(gtopk.Compression, name)(0.05)
        overflow = digits_run(compression, 2.0**24)
        clean = digits_run(compression, 2.0**4)
        if hvd.rank() == 0:
            print(f"RESULT keras3={KERAS3} {name} overflow={overflow} no_overflow={clean}",
                  flush=True)
        assert overflow["skipped"] >= 3, overflow
        assert overflow["scale"][1] < overflow["scale"][0], overflow
        assert clean["skipped"] == 0, clean
        case = f"keras_amp_{'keras3' if KERAS3 else 'tf_keras'}"
        gap = overflow["accuracy"] - clean["accuracy"]
        assert gap >= margins.floor(case, f"{name}_gap"), (overflow, clean)
        assert clean["accuracy"] >= margins.floor(case, f"{name}_clean"), clean
    if KERAS3:  # a plain SGD under mixed_float16: the wrapper supplies the LossScaleOptimizer
        wrapped = digits_run(gtopk.Compression.topk(0.05), None)
        if hvd.rank() == 0:
            print(f"RESULT keras3={KERAS3} wrapped={wrapped}", flush=True)
        assert wrapped["accuracy"] >= margins.floor("keras_amp_keras3", "wrapped"), wrapped


# -- local sources ----------------------------------------------------------------------------

def check_local_sources() -> None:
    rng = np.random.default_rng(hvd.rank())
    shared = [tf.Variable(np.full((4, 3), 0.5, np.float32), name="shared_w"),
              tf.Variable(np.zeros(3, np.float32), name="shared_b")]
    own = [tf.Variable(rng.normal(size=(3,)).astype(np.float32), name="own")] if (
        hvd.rank() == 0) else []
    x = tf.constant(rng.normal(size=(8, 4)).astype(np.float32))

    def loss() -> tf.Tensor:
        h = x @ shared[0] + shared[1]
        return tf.reduce_sum(h * own[0]) if own else tf.reduce_sum(h * h)

    for compression in (gtopk.Compression.none, gtopk.Compression.gtopk(1.0),
                        gtopk.Compression.topk(0.5)):
        with tf.GradientTape() as plain:
            value = loss()
        local = plain.gradient(value, shared + own)
        with tf.GradientTape() as tape:
            value = loss()
        tape = gtopk.DistributedGradientTape(tape, compression=compression)
        for variable in own:
            tape.register_local_source(variable)
        grads = tape.gradient(value, shared + own)
        for got, mine in zip(grads[len(shared):], local[len(shared):]):
            np.testing.assert_array_equal(got.numpy(), mine.numpy() / hvd.size())
        same_everywhere(hashlib.sha256(b"".join(g.numpy().tobytes() for g in grads[:2])
                                       ).hexdigest(), f"reduced gradients ({compression})")
        if compression is gtopk.Compression.none:
            expected = [hvd.allreduce(g, op=hvd.Average) for g in local[:len(shared)]]
            for got, want in zip(grads, expected):
                np.testing.assert_array_equal(got.numpy(), want.numpy())


# -- dense parity with Horovod's own tape ----------------------------------------------------

def horovod_tape() -> object:
    """Horovod's original DistributedGradientTape (the swap keeps it)."""
    return getattr(hvd.DistributedGradientTape, horovod_swap.MARKER)


def parity_cases(variables: list, local_set: object) -> list[tuple[str, dict]]:
    cases = [("defaults", {}), ("fp16", {"compression": gtopk.Compression.fp16}),
             ("op=Sum", {"op": hvd.Sum}), ("Adasum", {"op": hvd.Adasum, "sparse_as_dense": True}),
             ("predivide", {"gradient_predivide_factor": 2.0}), ("groups=2", {"groups": 2}),
             ("num_groups=2", {"num_groups": 2}),
             ("groups=lists", {"groups": [[variables[0], variables[2]]]}),
             ("sparse_as_dense", {"sparse_as_dense": True}),
             ("scale_local_gradients=False", {"scale_local_gradients": False}),
             ("hvd.Compression.fp16", {"compression": hvd.Compression.fp16}),
             ("process_set", {"process_set": local_set})]
    return cases


def compare_tapes(variables: list, loss: object, local_set: object, what: str
                  ) -> dict[str, str]:
    """Each case through our tape and Horovod's: the same gradients bit for bit, or the same
    error (Horovod refuses some combinations, e.g. pre/post-scaling of IndexedSlices)."""
    outcomes: dict[str, str] = {}
    for name, kwargs in parity_cases(variables, local_set):
        results = []
        for make in (gtopk.DistributedGradientTape, horovod_tape()):
            with tf.GradientTape() as tape:
                value = loss()
            theirs = kwargs.get("compression", hvd.Compression.none)
            arguments = dict(kwargs, compression=theirs if make is horovod_tape() else
                             kwargs.get("compression", gtopk.Compression.none))
            sources = variables if make is gtopk.DistributedGradientTape else [
                tf_variable(v) for v in variables]
            if "groups" in kwargs and isinstance(kwargs["groups"], list) and (
                    make is horovod_tape()):
                arguments["groups"] = [[tf_variable(v) for v in g]
                                       for g in kwargs["groups"]]
            try:
                wrapped = make(tape, **arguments)
                wrapped.register_local_source(sources[-1])
                grads = wrapped.gradient(value, sources)
            except Exception as error:  # noqa: BLE001 - Horovod's refusals must be ours too
                results.append(f"{type(error).__name__}: {str(error).splitlines()[-1]}")
            else:
                results.append(b"".join(tf.convert_to_tensor(g).numpy().tobytes()
                                        for g in grads))
        # A barrier: a rank done with its own process set waits for the other's.
        hvd.allreduce(tf.zeros(1), name="parity.case.done")
        assert results[0] == results[1], f"{what} {name}: differs from Horovod: {results}"
        outcomes[name] = results[0][:90] if isinstance(results[0], str) else "bitwise equal"
    if hvd.rank() == 0:
        print(f"dense parity on {what}: {outcomes}", flush=True)
    return outcomes


def check_dense_parity(local_set: object) -> None:
    rng = np.random.default_rng(hvd.rank())
    x = tf.constant(rng.normal(size=(8, 4)).astype(np.float32))
    table = tf.Variable(rng.normal(size=(10, 3)).astype(np.float32), name="table")
    plain = [tf.Variable(np.full((4, 3), 0.25, np.float32), name="w"),
             tf.Variable(np.zeros(3, np.float32), name="b"), table,
             tf.Variable(np.ones(3, np.float32), name="mine")]

    def plain_loss() -> tf.Tensor:
        h = x @ plain[0] + plain[1] + tf.gather(table, [1, 4, 4, 7, 0, 2, 9, 3])
        return tf.reduce_sum(h * h * plain[3])

    on_plain = compare_tapes(plain, plain_loss, local_set, "tf.Variables")
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(5), keras.layers.Dense(3)])

    def model_loss() -> tf.Tensor:
        return tf.reduce_sum(model(x) ** 2)

    on_keras = compare_tapes(list(model.trainable_variables), model_loss, local_set,
                             "Keras 3 variables")
    # Every argument is compared bit for bit at least once (Horovod refuses some combinations
    # on one of the two models: e.g. pre/post-scaling the embedding's IndexedSlices).
    for name in on_plain:
        assert "bitwise equal" in (on_plain[name], on_keras[name]), (name, on_plain, on_keras)


def check_keras3_dense_parity() -> None:
    """Keras 3's dense DistributedOptimizer (Horovod's own has no Keras 3 support) applies
    bitwise what Horovod's tape reduces, argument by argument."""
    x = tf.constant(np.random.default_rng(hvd.rank()).normal(size=(8, 4)).astype(np.float32))
    outcomes = {}
    for name, kwargs in (("defaults", {}), ("fp16", {"compression": gtopk.Compression.fp16}),
                         ("op=Sum", {"op": hvd.Sum}), ("Adasum", {"op": hvd.Adasum}),
                         ("predivide", {"gradient_predivide_factor": 2.0}),
                         ("groups=2", {"groups": 2}), ("num_groups=2", {"num_groups": 2})):
        weights = []
        for ours in (True, False):
            keras.utils.set_random_seed(0)
            model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(5),
                                      keras.layers.Dense(3)])
            variables = list(model.trainable_variables)
            with tf.GradientTape() as tape:
                loss = tf.reduce_sum(model(x) ** 2)
            if ours:
                grads = tape.gradient(loss, variables)
                optimizer = gtopk_keras.DistributedOptimizer(keras.optimizers.SGD(1.0), **kwargs)
            else:
                tape = horovod_tape()(tape, **dict(kwargs, compression=kwargs.get(
                    "compression", hvd.Compression.none)))
                grads = tape.gradient(loss, [tf_variable(v) for v in variables])
                optimizer = keras.optimizers.SGD(1.0)
            optimizer.apply(grads, variables)
            weights.append(digest(variables))
        assert weights[0] == weights[1], f"Keras 3 dense {name}: differs from Horovod's tape"
        outcomes[name] = "bitwise equal"
    if hvd.rank() == 0:
        print(f"keras 3 dense parity: {outcomes}", flush=True)


def main() -> None:
    os.environ["HOROVOD_DYNAMIC_PROCESS_SETS"] = "1"  # as Horovod's process set tests
    hvd.init()
    local_set = [hvd.add_process_set([rank]) for rank in range(hvd.size())][hvd.rank()]
    tf.config.threading.set_inter_op_parallelism_threads(1)
    tf.config.threading.set_intra_op_parallelism_threads(1)
    check_loss_scaling()
    if KERAS3:
        check_local_sources()
        check_dense_parity(local_set)
        check_keras3_dense_parity()
    if hvd.rank() == 0:
        print(f"tensorflow surface ok (keras3={KERAS3}) on {hvd.size()} workers", flush=True)


if __name__ == "__main__":
    run_on_all_ranks(main)
