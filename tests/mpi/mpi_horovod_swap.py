"""Under mpirun: Horovod's own wrappers, swapped by importing gtopk_hvd (gtopk_hvd.horovod_swap).
Any failure on any rank ends the job (harness.run_on_all_ranks).

    mpi_horovod_swap.py torch      horovod.torch.DistributedOptimizer (TensorFlow never imported)
    mpi_horovod_swap.py tf         horovod.tensorflow's DistributedGradientTape and
                                   DistributedOptimizer, horovod.tensorflow.keras and
                                   horovod.keras on Keras 3
    mpi_horovod_swap.py tf-keras   the Keras wrappers on tf-keras (TF_USE_LEGACY_KERAS=1)

Dense compressions (hvd.Compression.none / fp16) through the swapped function give weights
bitwise equal to Horovod's original function (the one the swap saved), and Horovod's own
optimizer; a gtopk_hvd sparse compression gives gtopk_hvd's optimizer, bitwise equal to building
it directly, with replicas bitwise identical. A Horovod function bound before gtopk_hvd was
imported keeps the original, and a sparse compression there raises TypeError naming the fix.
"""

from __future__ import annotations

import os
import sys

if __name__ == "__main__" and sys.argv[1:] == ["tf-keras"]:
    os.environ["TF_USE_LEGACY_KERAS"] = "1"  # before TensorFlow is imported

import hashlib  # noqa: E402
from collections.abc import Callable  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402
from harness import run_on_all_ranks  # noqa: E402

STEPS = 4
FIX = "import gtopk_hvd."  # what the TypeError of SparseCompression.compress tells to do


def batch(step: int, rank: int, size: int = 16) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(10_000 * rank + step)
    x = rng.normal(size=(size, 20)).astype(np.float32)
    return x, (x[:, :10].sum(1) > 0).astype(np.int64) + 2 * (x[:, 10:].sum(1) > 0)


def digest(arrays: list[np.ndarray]) -> bytes:
    return b"".join(np.ascontiguousarray(a).tobytes() for a in arrays)


def check_replicas(hvd: Any, arrays: list[np.ndarray], what: str) -> None:
    everyone = hvd.allgather_object(hashlib.sha256(digest(arrays)).hexdigest())
    assert len(set(everyone)) == 1, f"{what}: replicas differ: {everyone}"


def check_same(ours: list[np.ndarray], reference: list[np.ndarray], initial: list[np.ndarray],
               what: str) -> None:
    assert digest(ours) == digest(reference), f"{what}: weights differ from the reference"
    assert digest(ours) != digest(initial), f"{what}: training changed nothing"


def raises_the_fix(run: Callable[[], object], what: str) -> None:
    try:
        run()
    except TypeError as error:
        assert FIX in str(error) and "Horovod's own" in str(error), error
    else:
        raise AssertionError(f"{what}: a sparse compression in Horovod's original did not raise")


# -- torch ---------------------------------------------------------------------------------------

def torch_mode() -> None:
    import horovod.torch as hvd
    import torch
    from horovod.torch import DistributedOptimizer as bound_before  # keeps Horovod's original
    from horovod.torch.optimizer import _DistributedOptimizer as HorovodOptimizer

    import gtopk_hvd.torch as gtopk
    from gtopk_hvd.horovod_swap import MARKER
    from gtopk_hvd.torch.optimizer import _SparseDistributedOptimizer

    hvd.init()
    original = getattr(hvd.DistributedOptimizer, MARKER)
    assert original is bound_before and hvd.DistributedOptimizer is not original

    def build(seed: int = 0) -> torch.nn.Module:
        torch.manual_seed(seed)
        return torch.nn.Sequential(torch.nn.Linear(20, 32), torch.nn.Tanh(),
                                   torch.nn.Linear(32, 4))

    def weights(model: torch.nn.Module) -> list[np.ndarray]:
        return [p.detach().numpy().copy() for p in model.parameters()]

    def train(make: Callable[..., Any], passes: int = 1) -> tuple[list[np.ndarray], Any]:
        model = build()
        optimizer = make(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                         model.named_parameters())
        for step in range(STEPS):
            x, y = (torch.from_numpy(a) for a in batch(step, hvd.rank()))
            optimizer.zero_grad()
            for part_x, part_y in zip(x.chunk(passes), y.chunk(passes)):
                (torch.nn.functional.cross_entropy(model(part_x), part_y) / passes).backward()
            optimizer.step()
        return weights(model), optimizer

    def kind(optimizer: Any) -> type:
        method = type(optimizer).__dict__["synchronize"]
        for cls in (HorovodOptimizer, _SparseDistributedOptimizer):
            if method is cls.__dict__["synchronize"]:
                return cls
        raise AssertionError(f"neither Horovod's nor gtopk_hvd's optimizer: {type(optimizer)}")

    initial = weights(build())
    # (a) dense: Horovod's own optimizer, the same bits as Horovod's original function.
    for compression in (hvd.Compression.none, hvd.Compression.fp16):
        swapped, optimizer = train(lambda o, n, c=compression: hvd.DistributedOptimizer(
            o, named_parameters=n, compression=c))
        reference, _ = train(lambda o, n, c=compression: original(
            o, named_parameters=n, compression=c))
        assert kind(optimizer) is HorovodOptimizer, type(optimizer)
        check_same(swapped, reference, initial, f"torch {compression.__name__}")
        check_replicas(hvd, swapped, f"torch {compression.__name__}")
    swapped, optimizer = train(  # positional: compression, backward_passes_per_step, op
        lambda o, n: hvd.DistributedOptimizer(o, n, hvd.Compression.fp16, 2, hvd.Sum), passes=2)
    reference, _ = train(lambda o, n: original(o, n, hvd.Compression.fp16, 2, hvd.Sum), passes=2)
    assert kind(optimizer) is HorovodOptimizer
    check_same(swapped, reference, initial, "torch fp16 positional")

    # (b) sparse: gtopk_hvd's optimizer, the same bits as gtopk.DistributedOptimizer.
    compression = gtopk.Compression.gtopk(0.01)
    swapped, optimizer = train(lambda o, n: hvd.DistributedOptimizer(
        o, named_parameters=n, compression=compression))
    reference, _ = train(lambda o, n: gtopk.DistributedOptimizer(
        o, named_parameters=n, compression=compression))
    assert kind(optimizer) is _SparseDistributedOptimizer, type(optimizer)
    assert optimizer.last_stats.k == 9 and optimizer.last_stats.step == STEPS - 1
    check_same(swapped, reference, initial, "torch gtopk")
    check_replicas(hvd, swapped, "torch gtopk")
    swapped, optimizer = train(  # positional, and gtopk_hvd's own keyword on Horovod's function
        lambda o, n: hvd.DistributedOptimizer(o, n, compression, 2, hvd.Sum,
                                              transport="horovod"), passes=2)
    reference, _ = train(lambda o, n: gtopk.DistributedOptimizer(
        o, n, compression, 2, hvd.Sum, transport="horovod"), passes=2)
    assert type(optimizer._sparse.transport).__name__ == "HorovodTransport"
    check_same(swapped, reference, initial, "torch gtopk positional")
    check_replicas(hvd, swapped, "torch gtopk positional")

    # Horovod's original, bound before the import: the first backward raises the fix.
    raises_the_fix(lambda: train(lambda o, n: bound_before(
        o, named_parameters=n, compression=compression)), "torch")
    hvd.allreduce(torch.zeros(1), name="still.in.step")  # no rank is left behind
    assert "tensorflow" not in sys.modules, "gtopk_hvd.torch imported TensorFlow"
    print(f"horovod swap torch ok on {hvd.size()} workers", flush=True)


# -- TensorFlow ----------------------------------------------------------------------------------

def tensorflow_mode(legacy: bool) -> None:
    import horovod.tensorflow as hvd
    import horovod.tensorflow.keras as hvd_keras
    import tensorflow as tf
    from horovod.tensorflow import DistributedGradientTape as tape_bound_before
    from horovod.tensorflow.keras import DistributedOptimizer as keras_bound_before

    import gtopk_hvd.tensorflow as gtopk
    import gtopk_hvd.tensorflow.keras as gtopk_keras
    from gtopk_hvd.horovod_swap import MARKER
    from gtopk_hvd.tensorflow.tape import _SparseDistributedGradientTape

    hvd.init()
    keras = tf.keras  # Keras 3, or tf-keras under TF_USE_LEGACY_KERAS=1
    assert getattr(hvd_keras.DistributedOptimizer, MARKER) is keras_bound_before
    compression = gtopk.Compression.gtopk(0.02)

    # -- the tape (plain tf.Variables, which Horovod's own tape handles): Keras 3 run only
    def tape_variables() -> list[tf.Variable]:
        rng = np.random.default_rng(0)
        return [tf.Variable(rng.normal(size=(20, 16)).astype(np.float32)),
                tf.Variable(np.zeros(16, np.float32)),
                tf.Variable(rng.normal(size=(16, 4)).astype(np.float32))]

    def train_tape(wrap: Callable[[tf.GradientTape], Any]) -> tuple[list[np.ndarray], Any]:
        variables = tape_variables()
        for step in range(STEPS):
            x, y = batch(step, hvd.rank())
            with tf.GradientTape() as tape:
                logits = tf.tanh(x @ variables[0] + variables[1]) @ variables[2]
                loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(y, logits))
            tape = wrap(tape)
            for variable, gradient in zip(variables, tape.gradient(loss, variables)):
                variable.assign_sub(0.1 * gradient)
        return [v.numpy() for v in variables], tape

    def tape_kind(tape: Any) -> type:
        method = type(tape).__dict__["gradient"]
        for cls in (hvd._DistributedGradientTape, _SparseDistributedGradientTape):
            if method is cls.__dict__["gradient"]:
                return cls
        raise AssertionError(f"neither Horovod's nor gtopk_hvd's tape: {type(tape)}")

    if not legacy:
        original = getattr(hvd.DistributedGradientTape, MARKER)
        assert original is tape_bound_before
        initial = [v.numpy() for v in tape_variables()]
        for dense in (hvd.Compression.none, hvd.Compression.fp16):
            swapped, tape = train_tape(lambda t, c=dense: hvd.DistributedGradientTape(
                t, compression=c))
            reference, _ = train_tape(lambda t, c=dense: original(t, compression=c))
            assert tape_kind(tape) is hvd._DistributedGradientTape
            check_same(swapped, reference, initial, f"tape {dense.__name__}")
            check_replicas(hvd, swapped, f"tape {dense.__name__}")
        state, reference_state = gtopk.GTopkState(), gtopk.GTopkState()
        swapped, tape = train_tape(lambda t: hvd.DistributedGradientTape(
            t, compression=compression, gtopk_state=state))
        reference, _ = train_tape(lambda t: gtopk.DistributedGradientTape(
            t, compression=compression, gtopk_state=reference_state))
        assert tape_kind(tape) is _SparseDistributedGradientTape and tape.gtopk_state is state
        assert state.last_stats.step == STEPS - 1, state.last_stats
        check_same(swapped, reference, initial, "tape gtopk")
        check_replicas(hvd, swapped, "tape gtopk")
        swapped, tape = train_tape(  # positional: device_dense, device_sparse, compression
            lambda t: hvd.DistributedGradientTape(t, "", "", compression))
        reference, _ = train_tape(lambda t: gtopk.DistributedGradientTape(t, "", "", compression))
        assert tape_kind(tape) is _SparseDistributedGradientTape
        check_same(swapped, reference, initial, "tape gtopk positional")
        with tf.GradientTape() as tape:
            pass
        tape = hvd.DistributedGradientTape(tape, compression=compression,
                                           scale_local_gradients=False)
        assert tape_kind(tape) is _SparseDistributedGradientTape
        assert tape.scale_local_gradients is False  # passed on (register_local_source)
        raises_the_fix(lambda: train_tape(lambda t: tape_bound_before(
            t, compression=compression)), "tape")
        hvd.allreduce(tf.zeros(1), name="still.in.step")

    # -- Keras: model.fit
    def build(seed: int = 0) -> Any:
        keras.utils.set_random_seed(seed)
        return keras.Sequential([keras.Input((20,)), keras.layers.Dense(16, activation="tanh"),
                                 keras.layers.Dense(4)])

    def fit(make: Callable[[Any], Any], sgd: Any = None) -> tuple[list[np.ndarray], Any]:
        model = build()
        optimizer = make((sgd or keras.optimizers.SGD)(0.1))
        model.compile(optimizer=optimizer, jit_compile=False,
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        x, y = batch(0, hvd.rank(), size=8 * STEPS)
        model.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0)
        return [np.asarray(v) for v in model.get_weights()], optimizer

    initial = [np.asarray(v) for v in build().get_weights()]
    original = getattr(hvd_keras.DistributedOptimizer, MARKER)
    for dense in (hvd.Compression.none, hvd.Compression.fp16):
        swapped, optimizer = fit(lambda o, c=dense: hvd_keras.DistributedOptimizer(
            o, compression=c))
        reference, _ = fit(lambda o, c=dense: original(o, compression=c))
        assert type(optimizer).__module__ == "horovod._keras", type(optimizer).__module__
        check_same(swapped, reference, initial, f"keras {dense.__name__}")
        if legacy:  # Horovod 0.28's Keras wrapper reduces nothing on Keras 3
            check_replicas(hvd, swapped, f"keras {dense.__name__}")
    swapped, optimizer = fit(lambda o: hvd_keras.DistributedOptimizer(o, compression=compression))
    reference, _ = fit(lambda o: gtopk_keras.DistributedOptimizer(o, compression=compression))
    assert hasattr(optimizer, "gtopk_state"), type(optimizer)
    assert optimizer.last_stats.step == STEPS - 1, optimizer.last_stats
    check_same(swapped, reference, initial, "keras gtopk")
    check_replicas(hvd, swapped, "keras gtopk")
    # horovod.tensorflow.DistributedOptimizer hands Keras optimizers on, as Horovod's does
    via_tf, optimizer = fit(lambda o: hvd.DistributedOptimizer(o, compression=compression))
    assert hasattr(optimizer, "gtopk_state"), type(optimizer)
    check_same(via_tf, reference, initial, "horovod.tensorflow.DistributedOptimizer gtopk")
    if legacy:
        raises_the_fix(lambda: fit(lambda o: keras_bound_before(o, compression=compression)),
                       "keras")
        hvd.allreduce(tf.zeros(1), name="still.in.step")
    else:  # horovod.keras (standalone Keras, 3 here); num_groups is its 9th positional argument
        import horovod.keras as hvd_standalone
        import keras as standalone

        swapped, optimizer = fit(lambda o: hvd_standalone.DistributedOptimizer(
            o, None, "", "", compression, False, 1.0, hvd.Average, 0),
            sgd=standalone.optimizers.SGD)
        assert hasattr(optimizer, "gtopk_state"), type(optimizer)
        check_same(swapped, reference, initial, "horovod.keras gtopk")
    assert "torch" not in sys.modules, "gtopk_hvd.tensorflow imported torch"
    print(f"horovod swap {'tf-keras' if legacy else 'tf'} ok on {hvd.size()} workers", flush=True)


def main() -> None:
    (mode,) = sys.argv[1:]
    if mode == "torch":
        torch_mode()
    else:
        assert mode in ("tf", "tf-keras"), mode
        tensorflow_mode(legacy=mode == "tf-keras")


if __name__ == "__main__":
    run_on_all_ranks(main)
