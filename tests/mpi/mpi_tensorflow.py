"""Under mpirun: gtopk_hvd.tensorflow (DistributedGradientTape, GTopkState, keras) with real
Horovod. Any failure on any rank ends the job (harness.run_on_all_ranks).

    mpi_tensorflow.py              the tape (eager and tf.function), checkpoints, Keras 3 fit
    mpi_tensorflow.py --tf-keras   the keras DistributedOptimizer on tf-keras (Keras 2): sets
                                   TF_USE_LEGACY_KERAS=1 before TensorFlow is imported
"""

from __future__ import annotations

import os
import sys

if __name__ == "__main__" and "--tf-keras" in sys.argv:
    os.environ["TF_USE_LEGACY_KERAS"] = "1"

import hashlib  # noqa: E402
import math  # noqa: E402
import shutil  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402

import horovod.tensorflow as hvd  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from harness import run_on_all_ranks  # noqa: E402

import gtopk_hvd.tensorflow as gtopk  # noqa: E402
import gtopk_hvd.tensorflow.keras as gtopk_keras  # noqa: E402
from gtopk_hvd.compression import SparseCompression  # noqa: E402
from gtopk_hvd.transports import resolve_transport  # noqa: E402

keras = tf.keras  # Keras 3, or tf-keras under TF_USE_LEGACY_KERAS=1
STEPS = 20


# -- models, data, digests ----------------------------------------------------------------------

def make_model(seed: int = 0, extra_layer: bool = False) -> keras.Model:
    keras.utils.set_random_seed(seed)
    layers = [keras.Input((20,)), keras.layers.Dense(64, activation="tanh"),
              keras.layers.Dense(4)]
    if extra_layer:
        layers.append(keras.layers.Dense(4))
    return keras.Sequential(layers)


def make_embedding_model(seed: int = 0) -> keras.Model:
    keras.utils.set_random_seed(seed)
    return keras.Sequential([keras.Input((6,), dtype="int32"), keras.layers.Embedding(50, 8),
                             keras.layers.GlobalAveragePooling1D(), keras.layers.Dense(4)])


def batch(step: int, rank: int, size: int = 32) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(10_000 * rank + step)
    x = rng.normal(size=(size, 20)).astype(np.float32)
    return x, ((x[:, :10].sum(1) > 0).astype(np.int64) + 2 * (x[:, 10:].sum(1) > 0))


def token_batch(step: int, rank: int, size: int = 16) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(20_000 * rank + step)
    tokens = rng.integers(0, 50, size=(size, 6)).astype(np.int32)
    return tokens, (tokens[:, 0] % 4).astype(np.int64)


def loss_of(model: keras.Model, x: np.ndarray, y: np.ndarray) -> tf.Tensor:
    logits = model(x, training=True)
    return tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(y, logits))


def variable_bytes(variables: list) -> bytes:
    return b"".join(np.asarray(v.numpy()).tobytes() for v in variables)


def assert_same_on_all_ranks(variables: list, what: str) -> None:
    digest = hashlib.sha256(variable_bytes(variables)).hexdigest()
    everyone = hvd.allgather_object(digest)
    assert len(set(everyone)) == 1, f"{what}: replicas differ: {everyone}"


def sgd(learning_rate: float = 0.05, momentum: float = 0.0) -> keras.optimizers.Optimizer:
    return keras.optimizers.SGD(learning_rate, momentum=momentum)


def make_train_step(model: keras.Model, optimizer: keras.optimizers.Optimizer,
                    compression: object, graph: bool, state: object = None) -> object:
    """One step with the DistributedGradientTape, eager or as a tf.function."""

    def train_step(x: tf.Tensor, y: tf.Tensor) -> tf.Tensor:
        with tf.GradientTape() as tape:
            loss = loss_of(model, x, y)
        tape = gtopk.DistributedGradientTape(tape, compression=compression, gtopk_state=state)
        gradients = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(gradients, model.trainable_variables))
        return loss

    return tf.function(train_step) if graph else train_step


def train(step_fn: object, steps: range) -> None:
    for step in steps:
        step_fn(*batch(step, hvd.rank()))


# -- the tape -----------------------------------------------------------------------------------

def check_bad_arguments() -> None:
    model = make_model()
    x, y = batch(0, hvd.rank())
    counter = tf.Variable(3, dtype=tf.int32)
    for compression, kwargs, error, text in (
            ("gtopk", {}, ValueError, "compression must be one of"),
            (gtopk.Compression.gtopk(0.1), {"groups": 2}, NotImplementedError, "groups"),
            (gtopk.Compression.gtopk(0.1), {"op": hvd.Adasum}, NotImplementedError, "op="),
            (gtopk.Compression.gtopk(0.1), {"op": hvd.Sum, "gradient_predivide_factor": 2.0},
             ValueError, "predivide")):
        with tf.GradientTape() as tape:
            loss_of(model, x, y)
        try:
            gtopk.DistributedGradientTape(tape, compression=compression, **kwargs)
        except error as caught:
            assert text in str(caught), caught
        else:
            raise AssertionError(f"{compression!r} {kwargs} accepted")
    with tf.GradientTape() as tape:
        loss = loss_of(model, x, y) + tf.cast(counter, tf.float32)
    tape = gtopk.DistributedGradientTape(tape, compression=gtopk.Compression.gtopk(0.1))
    try:
        tape.gradient(loss, [*model.trainable_variables, counter])
    except ValueError as caught:
        assert "floating-point" in str(caught), caught
    else:
        raise AssertionError("an int32 source was accepted")


def check_tape_replicas_stay_identical() -> None:
    for graph in (False, True):
        model = make_model()
        initial = variable_bytes(model.variables)
        state = gtopk.GTopkState()
        step = make_train_step(model, sgd(momentum=0.9), gtopk.Compression.gtopk(0.01), graph,
                               state)
        train(step, range(STEPS))
        what = "tf.function" if graph else "eager"
        assert_same_on_all_ranks(model.variables, f"tape {what}")
        assert variable_bytes(model.variables) != initial, f"{what}: training changed nothing"
        d = sum(int(np.prod(v.shape)) for v in model.trainable_variables)
        stats = state.last_stats
        assert stats.k == math.ceil(0.01 * d) and stats.step == STEPS - 1, stats
        if hvd.size() in (2, 4, 8):  # log2(P) rounds of k entries, 8 bytes each
            assert stats.bytes_sent == int(math.log2(hvd.size())) * 8 * stats.k, stats


def check_implicit_state_persists_across_tapes() -> None:
    """Without gtopk_state, a new tape each step still continues the same residual."""
    model = make_model()
    step = make_train_step(model, sgd(), gtopk.Compression.gtopk(0.05), graph=False)
    train(step, range(3))
    x, y = batch(3, hvd.rank())
    with tf.GradientTape() as tape:
        loss = loss_of(model, x, y)
    tape = gtopk.DistributedGradientTape(tape, compression=gtopk.Compression.gtopk(0.05))
    tape.gradient(loss, model.trainable_variables)
    assert tape.last_stats.step == 3, tape.last_stats


def check_density_one_equals_dense_average() -> None:
    for scheme, graph in (("gtopk", False), ("gtopk", True), ("topk", True)):
        ours, reference = make_model(), make_model()
        step = make_train_step(ours, sgd(0.1), getattr(gtopk.Compression, scheme)(1.0),
                               graph)
        plain = sgd(0.1)
        for i in range(5):
            step(*batch(i, hvd.rank()))
            x, y = batch(i, hvd.rank())
            with tf.GradientTape() as tape:
                loss = loss_of(reference, x, y)
            gradients = tape.gradient(loss, reference.trainable_variables)
            gradients = [hvd.allreduce(g, op=hvd.Average) for g in gradients]  # Horovod's
            plain.apply_gradients(zip(gradients, reference.trainable_variables))
        for a, b in zip(ours.variables, reference.variables):
            np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-5, atol=1e-6,
                                       err_msg=f"{scheme} graph={graph}")


def check_embedding_and_unused_gradients() -> None:
    """IndexedSlices (Embedding) are densified; an unused source contributes zeros and gets a
    zero update back (not None: every worker returns a tensor for every source). Density 1:
    Horovod's dense result."""
    unused = tf.Variable(tf.zeros([3]), name="unused")
    for op, predivide, graph in ((hvd.Average, 1.0, False), (hvd.Average, 1.0, True),
                                 (hvd.Sum, 1.0, True), (hvd.Average, 2.0, False)):
        model = make_embedding_model()
        sources = [*model.trainable_variables, unused]
        ours, local = embedding_gradients(model, sources, op, predivide)
        x, y = token_batch(0, hvd.rank())
        local_gradients = local(x, y)
        assert isinstance(local_gradients[0], tf.IndexedSlices), type(local_gradients[0])
        assert local_gradients[-1] is None
        reduced = (tf.function(ours) if graph else ours)(x, y)
        local_gradients[-1] = tf.zeros_like(unused)
        for got, gradient, source in zip(reduced, local_gradients, sources):
            assert isinstance(got, tf.Tensor) and got.shape == source.shape, (got, graph)
            assert got.dtype == source.dtype, (got.dtype, source.dtype)
            expected = hvd.allreduce(tf.convert_to_tensor(gradient), op=op)
            np.testing.assert_allclose(got.numpy(), expected.numpy(), rtol=1e-5, atol=1e-6)
        assert not np.any(reduced[-1].numpy()), reduced[-1]


def check_source_used_on_one_rank_only() -> None:
    """A source with a gradient on rank 0 only (a branch on hvd.rank()): the other workers
    contribute zeros and apply the same update, so replicas stay bitwise identical, through the
    tape (eager and tf.function) and the keras optimizer. Density 1: Horovod's dense average
    with zeros from the workers without a gradient."""
    for path, graph, density in (("tape", False, 1.0), ("tape", False, 0.05),
                                 ("tape", True, 0.05), ("keras", True, 0.05)):
        train_with_a_rank0_only_source(path, graph, density)


def train_with_a_rank0_only_source(path: str, graph: bool, density: float) -> None:
    model = make_model()
    side = keras.layers.Dense(4, use_bias=False)
    side.build((None, 20))
    side.kernel.assign(np.full((20, 4), 0.01, dtype=np.float32))
    sources = [*model.trainable_variables, side.kernel]
    compression = gtopk.Compression.gtopk(density)
    optimizer = sgd(0.05, momentum=0.9)
    if path == "keras":
        optimizer = gtopk_keras.DistributedOptimizer(optimizer, compression=compression)
    state = gtopk.GTopkState()

    def gradients_of(x: tf.Tensor, y: tf.Tensor, distributed: bool = True) -> list:
        with tf.GradientTape() as tape:
            logits = model(x, training=True)
            if hvd.rank() == 0:  # traced per rank: the others never touch side.kernel
                logits += side(x)
            loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(y, logits))
        if distributed and path == "tape":
            tape = gtopk.DistributedGradientTape(tape, compression=compression,
                                                 gtopk_state=state)
        return tape.gradient(loss, sources)

    def step(x: tf.Tensor, y: tf.Tensor) -> None:
        optimizer.apply_gradients(zip(gradients_of(x, y), sources))

    what = f"{path} graph={graph} density={density}"
    if density == 1.0:
        x, y = batch(0, hvd.rank())
        local = gradients_of(x, y, distributed=False)
        assert (local[-1] is None) == (hvd.rank() != 0), local[-1]
        expected = hvd.allreduce(tf.zeros_like(side.kernel) if local[-1] is None
                                 else local[-1], op=hvd.Average)
        got = gradients_of(x, y)[-1]
        np.testing.assert_allclose(got.numpy(), expected.numpy(), rtol=1e-5, atol=1e-7,
                                   err_msg=what)
        assert np.any(got.numpy()), what
    initial = variable_bytes([side.kernel])
    train(tf.function(step) if graph else step, range(6))
    assert_same_on_all_ranks([*model.variables, side.kernel], what)
    assert variable_bytes([side.kernel]) != initial, f"{what}: side.kernel never changed"


def embedding_gradients(model: keras.Model, sources: list, op: object,
                        predivide: float) -> tuple:
    """(the reduced gradients through DistributedGradientTape, this worker's own)."""

    def ours(x: tf.Tensor, y: tf.Tensor) -> list:
        with tf.GradientTape() as tape:
            loss = loss_of(model, x, y)
        tape = gtopk.DistributedGradientTape(tape, compression=gtopk.Compression.gtopk(1.0),
                                             op=op, gradient_predivide_factor=predivide)
        return tape.gradient(loss, sources)

    def local(x: tf.Tensor, y: tf.Tensor) -> list:
        with tf.GradientTape() as tape:
            loss = loss_of(model, x, y)
        return tape.gradient(loss, sources)

    return ours, local


def check_checkpoint_resume_is_exact() -> None:
    """tf.train.Checkpoint of model, optimizer and GTopkState: the resumed run is bitwise the
    uninterrupted one (momentum correction and a warm-up crossing the save point)."""
    compression = gtopk.Compression.gtopk(0.02, momentum_correction=True,
                                          warmup_densities=(0.25, 0.1), warmup_steps=5)
    directory = tempfile.mkdtemp(prefix=f"gtopk_tf_rank{hvd.rank()}_")
    try:
        def fresh() -> tuple[keras.Model, object, gtopk.GTopkState, tf.train.Checkpoint]:
            model, optimizer, state = make_model(), sgd(0.05, momentum=0.5), gtopk.GTopkState()
            optimizer.build(model.trainable_variables)
            step = make_train_step(model, optimizer, compression, graph=True, state=state)
            return model, step, state, tf.train.Checkpoint(model=model, optimizer=optimizer,
                                                            gtopk=state)

        model, step, state, checkpoint = fresh()
        train(step, range(0, 8))
        path = checkpoint.write(os.path.join(directory, "ckpt"))
        saved = tf.train.load_variable(path, "gtopk/.ATTRIBUTES/residual")
        np.testing.assert_array_equal(saved, state.sparse.residual)
        assert np.abs(saved).sum() > 0 and tf.train.load_variable(
            path, "gtopk/.ATTRIBUTES/step") == 8
        train(step, range(8, 20))

        resumed_model, resumed_step, resumed_state, resumed = fresh()
        resumed.read(path).assert_consumed()
        train(resumed_step, range(8, 20))
        assert variable_bytes(resumed_model.variables) == variable_bytes(model.variables), \
            "resume differs"
        np.testing.assert_array_equal(resumed_state.sparse.residual, state.sparse.residual)
        assert resumed_state.last_stats.density == 0.02
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def check_nan_on_one_rank_raises_on_all() -> None:
    for graph in (False, True):
        model = make_model()
        step = make_train_step(model, sgd(), gtopk.Compression.gtopk(0.01, nonfinite="raise"),
                               graph)
        train(step, range(3))
        before = variable_bytes(model.variables)
        x, y = batch(3, hvd.rank())
        if hvd.rank() == hvd.size() - 1:
            x[0, 0] = np.nan
        try:
            step(x, y)
        except (FloatingPointError, tf.errors.OpError) as error:
            assert "non-finite" in str(error) and "step 3" in str(error), error
        else:
            raise AssertionError("a NaN gradient on one worker did not raise on every worker")
        assert variable_bytes(model.variables) == before, "a NaN step changed variables"
        assert_same_on_all_ranks(model.variables, "after the NaN step")


def check_nan_on_one_rank_is_skipped_on_all(graph: bool) -> None:
    """nonfinite="propagate" (the default): every worker gets all-NaN gradients, the residual
    and step count stay bit-equal, and the next step goes on."""
    model = make_model()
    state = gtopk.GTopkState()
    compression = gtopk.Compression.gtopk(0.01)

    def gradients(x: tf.Tensor, y: tf.Tensor) -> list:
        with tf.GradientTape() as tape:
            loss = loss_of(model, x, y)
        tape = gtopk.DistributedGradientTape(tape, compression=compression, gtopk_state=state)
        return tape.gradient(loss, model.trainable_variables)

    run = tf.function(gradients) if graph else gradients
    optimizer = sgd()
    for step in range(3):
        optimizer.apply_gradients(zip(run(*batch(step, hvd.rank())), model.trainable_variables))
    residual = state.sparse.residual.copy()
    x, y = batch(3, hvd.rank())
    if hvd.rank() == hvd.size() - 1:
        x[0, 0] = np.inf
    grads = run(x, y)
    assert all(np.isnan(g.numpy()).all() for g in grads), "update not all NaN"
    assert state.last_stats.skipped and state.sparse.step_count == 3
    assert state.sparse.residual.tobytes() == residual.tobytes(), "residual changed"
    grads = run(*batch(4, hvd.rank()))
    assert all(np.isfinite(g.numpy()).all() for g in grads)
    assert state.sparse.step_count == 4
    assert_same_on_all_ranks(model.variables, "after the skipped step")


def check_disagreeing_ranks_fail_everywhere() -> None:
    if hvd.size() == 1:
        return
    model = make_model(extra_layer=hvd.rank() == hvd.size() - 1)
    step = make_train_step(model, sgd(), gtopk.Compression.gtopk(0.1), graph=False)
    try:
        train(step, range(1))
    except ValueError as error:
        assert "disagree on source names" in str(error), error
    else:
        raise AssertionError("ranks with different models were not detected")


# -- keras ----------------------------------------------------------------------------------------

def check_keras_fit(passes: int = 1, compression: object = None, epochs: int = 2,
                    run_eagerly: bool = False) -> None:
    """model.fit with the keras DistributedOptimizer and the broadcast callback, from different
    initial weights on every rank: replicas end bitwise identical."""
    compression = compression or gtopk.Compression.gtopk(0.02)
    model = make_model(seed=hvd.rank())
    optimizer = gtopk_keras.DistributedOptimizer(sgd(0.05, momentum=0.9), compression=compression,
                                                 backward_passes_per_step=passes)
    model.compile(optimizer=optimizer, run_eagerly=run_eagerly,
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    x, y = batch(0, hvd.rank(), size=256)
    model.fit(x, y, batch_size=32, epochs=epochs, verbose=0,
              callbacks=[gtopk_keras.BroadcastGlobalVariablesCallback(root_rank=0)])
    what = f"keras fit {compression} passes={passes} eager={run_eagerly}"
    assert_same_on_all_ranks(model.variables, what)
    assert_same_on_all_ranks(optimizer.variables if not callable(optimizer.variables)
                             else optimizer.variables(), f"{what} optimizer")
    if isinstance(compression, SparseCompression):
        assert optimizer.last_stats.step == 8 * epochs // passes - 1, optimizer.last_stats


def check_keras_optimizer_checkpoint() -> None:
    """The optimizer's gtopk_state is saved with it: a custom loop with the keras optimizer,
    checkpointed through tf.train.Checkpoint(optimizer=...), resumes bitwise."""
    directory = tempfile.mkdtemp(prefix=f"gtopk_keras_rank{hvd.rank()}_")
    try:
        def fresh() -> tuple[keras.Model, object, tf.train.Checkpoint]:
            model = make_model()
            optimizer = gtopk_keras.DistributedOptimizer(
                sgd(0.05, momentum=0.9), compression=gtopk.Compression.topk(0.02))
            optimizer.build(model.trainable_variables)

            @tf.function
            def step(x: tf.Tensor, y: tf.Tensor) -> None:
                with tf.GradientTape() as tape:
                    loss = loss_of(model, x, y)
                gradients = tape.gradient(loss, model.trainable_variables)
                optimizer.apply_gradients(zip(gradients, model.trainable_variables))

            return model, step, tf.train.Checkpoint(model=model, optimizer=optimizer)

        model, step, checkpoint = fresh()
        train(step, range(0, 6))
        path = checkpoint.write(os.path.join(directory, "ckpt"))
        train(step, range(6, 12))
        resumed_model, resumed_step, resumed = fresh()
        resumed.read(path).assert_consumed()
        train(resumed_step, range(6, 12))
        assert variable_bytes(resumed_model.variables) == variable_bytes(model.variables), \
            "keras optimizer resume differs"
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def timed(check: object, *args: object, **kwargs: object) -> None:
    start = time.perf_counter()
    check(*args, **kwargs)
    if hvd.rank() == 0:
        print(f"{check.__name__}{args or ''}{kwargs or ''}: {time.perf_counter() - start:.1f} s",
              flush=True)


def main() -> None:
    hvd.init()
    tf.config.threading.set_inter_op_parallelism_threads(1)
    tf.config.threading.set_intra_op_parallelism_threads(1)
    if "--tf-keras" in sys.argv:
        assert not keras.__name__.startswith("keras"), keras.__name__
        timed(check_keras_fit)
        timed(check_keras_fit, passes=2)
        timed(check_keras_fit, compression=gtopk.Compression.none, epochs=1)  # Horovod's
        timed(check_keras_optimizer_checkpoint)
        if hvd.rank() == 0:
            print(f"tf-keras ok on {hvd.size()} workers", flush=True)
        return
    if "--transport-checks" in sys.argv:  # e.g. under horovodrun --gloo: Horovod's transport
        timed(check_tape_replicas_stay_identical)
        timed(check_density_one_equals_dense_average)
        timed(check_nan_on_one_rank_raises_on_all)
        timed(check_keras_fit)
        if hvd.rank() == 0:
            transport = type(resolve_transport(None, hvd)).__name__  # what the wrappers used
            print(f"tensorflow ok on {hvd.size()} workers over {transport}", flush=True)
        return
    timed(check_bad_arguments)
    timed(check_tape_replicas_stay_identical)
    timed(check_implicit_state_persists_across_tapes)
    timed(check_density_one_equals_dense_average)
    timed(check_embedding_and_unused_gradients)
    timed(check_source_used_on_one_rank_only)
    timed(check_checkpoint_resume_is_exact)
    timed(check_nan_on_one_rank_raises_on_all)
    timed(check_nan_on_one_rank_is_skipped_on_all, False)
    timed(check_nan_on_one_rank_is_skipped_on_all, True)
    timed(check_disagreeing_ranks_fail_everywhere)
    timed(check_keras_fit)
    timed(check_keras_fit, passes=2, run_eagerly=True)
    timed(check_keras_fit, compression=gtopk.Compression.fp16)
    timed(check_keras_optimizer_checkpoint)
    if hvd.rank() == 0:
        print(f"tensorflow ok on {hvd.size()} workers", flush=True)


if __name__ == "__main__":
    run_on_all_ranks(main)
