"""A step skipped for a NaN/Inf with the Keras 3 DistributedOptimizer (one process, Horovod of
size 1, inside the tf.function that train_on_batch traces), every sparse scheme: without a loss
scaler it is not applied (the model's and the wrapped optimizer's variables stay bit for bit, but
`iterations`); with a LossScaleOptimizer the scaler sees it, skips and lowers its scale; the next
finite step trains in both."""

from __future__ import annotations

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
hvd = pytest.importorskip("horovod.tensorflow")

SCHEMES = ["gtopk", "topk", "gtopk-exact", "micro", "exdyna", "sketch"]


def compression(scheme: str) -> object:
    import gtopk_hvd.tensorflow.keras as gtopk

    return {"gtopk": lambda: gtopk.Compression.gtopk(0.05, momentum_correction=True),
            "topk": lambda: gtopk.Compression.topk(0.05),
            "gtopk-exact": lambda: gtopk.Compression.gtopk(0.05, exact=True),
            "micro": lambda: gtopk.Compression.micro(0.05),
            "exdyna": lambda: gtopk.Compression.exdyna(0.05, blocks=8),
            "sketch": lambda: gtopk.Compression.sketch(0.05, columns=64)}[scheme]()


@pytest.mark.parametrize("scaled", [False, True], ids=["no-scaler", "loss-scale-optimizer"])
@pytest.mark.parametrize("scheme", SCHEMES)
def test_a_skipped_step_reaches_the_scaler_or_is_not_applied(scheme: str, scaled: bool) -> None:
    import keras

    import gtopk_hvd.tensorflow.keras as gtopk

    hvd.init()
    keras.utils.set_random_seed(3)
    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(20, activation="relu"),
                              keras.layers.Dense(3)])
    inner = keras.optimizers.AdamW(1e-2)
    if scaled:
        inner = keras.optimizers.LossScaleOptimizer(inner)
    optimizer = gtopk.DistributedOptimizer(inner, compression=compression(scheme))
    model.compile(optimizer=optimizer, loss="mse", jit_compile=False)
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((16, 6)).astype(np.float32), rng.standard_normal((16, 3))
    for _ in range(2):
        model.train_on_batch(x, y)

    def variables() -> list[np.ndarray]:
        kept = [v for v in optimizer.variables if "iteration" not in v.path
                and "loss_scale" not in v.path and "step_counter" not in v.path]
        return [v.numpy().copy() for v in model.weights + kept]

    before = variables()
    scale = float(optimizer.dynamic_scale.numpy()) if scaled else None
    poisoned = x.copy()
    poisoned[2, 4] = np.inf
    model.train_on_batch(poisoned, y)
    assert optimizer.last_stats.skipped
    assert all(np.array_equal(a, b) for a, b in zip(variables(), before, strict=True)), (
        "a variable moved on a skipped step")
    if scaled:
        assert float(optimizer.dynamic_scale.numpy()) < scale
    model.train_on_batch(x, y)
    assert not optimizer.last_stats.skipped
    after = variables()
    assert all(np.isfinite(a).all() for a in after)
    assert any(not np.array_equal(a, b) for a, b in zip(after, before, strict=True))
