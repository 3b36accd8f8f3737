"""gtopk_hvd.tensorflow.keras: drop-in `DistributedOptimizer`, `Compression` and Horovod's Keras
callbacks (broadcast with a replica check, metric average, learning-rate schedule and warmup;
also as `gtopk.callbacks`) for Horovod Keras scripts, on Keras 3 (TensorFlow's default) and
tf-keras.

    import gtopk_hvd.tensorflow.keras as gtopk   # before hvd.init() (under mpirun it loads mpi4py)
    import horovod.tensorflow as hvd
    hvd.init()
    ...
    optimizer = gtopk.DistributedOptimizer(keras.optimizers.SGD(0.01 * hvd.size()),
                                           compression=gtopk.Compression.gtopk(0.001))
    model.compile(optimizer=optimizer, loss=...)
    model.fit(x_shard, y_shard, callbacks=[gtopk.BroadcastGlobalVariablesCallback(0),
                                           gtopk.MetricAverageCallback()])
"""

from gtopk_hvd import horovod_swap
from gtopk_hvd.compression import compression_for
from gtopk_hvd.tensorflow.keras import callbacks
from gtopk_hvd.tensorflow.keras.callbacks import (
    BroadcastGlobalVariablesCallback,
    LearningRateScheduleCallback,
    LearningRateWarmupCallback,
    MetricAverageCallback,
    broadcast_variables,
    check_replicas_agree,
)
from gtopk_hvd.tensorflow.keras.optimizer import DistributedOptimizer
from gtopk_hvd.tensorflow.state import GTopkState
from gtopk_hvd.transports import load_mpi_if_launched

load_mpi_if_launched()  # under mpirun: mpi4py initialises MPI before hvd.init()
Compression = compression_for("tensorflow")

__all__ = ["BroadcastGlobalVariablesCallback", "Compression", "DistributedOptimizer",
           "GTopkState", "LearningRateScheduleCallback", "LearningRateWarmupCallback",
           "MetricAverageCallback", "broadcast_variables", "callbacks", "check_replicas_agree"]

# Horovod's own Keras wrappers hand a gtopk_hvd sparse compression to this DistributedOptimizer
# (explicit behaviour; gtopk_hvd.horovod_swap says how, and how to undo it).
horovod_swap.install("horovod.tensorflow.keras", "DistributedOptimizer", DistributedOptimizer)
horovod_swap.install("horovod.keras", "DistributedOptimizer", DistributedOptimizer)
