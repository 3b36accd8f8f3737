"""gtopk_hvd's elastic KerasState in one process (Horovod initialised for one worker, Keras 3):
commit saves the weights, the optimizer's variables and the sparse state; restore brings all back
bitwise, including to a commit made before the first sparse step (zero residual, step 0); sync
on one worker leaves them as they are. The multi-worker behaviour (kill, reset, a new worker) is
tests/horovod/test_elastic.py's."""

from __future__ import annotations

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")


def test_commit_and_restore_hold_the_sparse_state() -> None:
    import horovod.tensorflow as hvd

    import gtopk_hvd.tensorflow.keras as gtopk
    from gtopk_hvd.tensorflow.keras import elastic

    hvd.init()
    tf.keras.utils.set_random_seed(1)
    model = tf.keras.Sequential([tf.keras.Input((6,)), tf.keras.layers.Dense(40)])
    optimizer = gtopk.DistributedOptimizer(tf.keras.optimizers.SGD(0.1, momentum=0.9),
                                           compression=gtopk.Compression.gtopk(0.05))
    model.compile(optimizer=optimizer, loss="mse")
    x, y = np.random.default_rng(0).standard_normal((2, 16, 6)).astype(np.float32)
    y = np.tile(y, (1, 7))[:, :40]
    state = elastic.KerasState(model, step=0)  # committed before any sparse step
    state.sync()  # one worker: builds the optimizer's slots, changes nothing else

    def train(steps: int) -> None:
        for _ in range(steps):
            model.train_on_batch(x, y)

    def snapshot() -> tuple[list[np.ndarray], dict]:
        return ([w.numpy().copy() for w in model.weights + optimizer.variables],
                optimizer.gtopk_state.state_dict())

    initial = snapshot()
    train(2)  # a failure before the first commit: back to the state as made
    state.restore()
    assert all(np.array_equal(a, b) for a, b in zip(snapshot()[0], initial[0]))
    assert optimizer.gtopk_state.state_dict()["step"] == 0
    assert not np.any(optimizer.gtopk_state.state_dict()["residual"])

    train(3)
    state.commit()
    committed = snapshot()
    assert committed[1]["step"] == 3 and np.any(committed[1]["residual"])
    train(2)
    assert snapshot()[1]["step"] == 5
    state.restore()
    restored = snapshot()
    assert all(np.array_equal(a, b) for a, b in zip(restored[0], committed[0]))
    assert restored[1]["step"] == 3
    assert np.array_equal(restored[1]["residual"], committed[1]["residual"])
    train(1)  # and the step goes on from there
    assert optimizer.gtopk_state.state_dict()["step"] == 4
