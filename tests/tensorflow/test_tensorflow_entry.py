"""gtopk_hvd.tensorflow.DistributedOptimizer, Horovod's TF entry point (one process)."""

from __future__ import annotations

import pytest


def test_keras_optimizers_are_wrapped_and_v1_optimizers_refused() -> None:
    tf = pytest.importorskip("tensorflow")
    import horovod.tensorflow as hvd

    import gtopk_hvd.tensorflow as gtopk

    hvd.init()
    with pytest.raises(NotImplementedError, match="tf.compat.v1"):
        gtopk.DistributedOptimizer(tf.compat.v1.train.GradientDescentOptimizer(0.1))
    wrapped = gtopk.DistributedOptimizer(tf.keras.optimizers.SGD(0.1),
                                         compression=gtopk.Compression.gtopk(density=0.01))
    assert isinstance(wrapped, tf.keras.optimizers.SGD)
    assert hasattr(wrapped, "gtopk_state")
