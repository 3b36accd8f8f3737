"""gtopk_hvd.tensorflow: drop-in `DistributedGradientTape` and `Compression` for Horovod
TensorFlow 2 scripts, `DistributedOptimizer` for Keras optimizers (as Horovod's, it hands them
to `gtopk_hvd.tensorflow.keras`).

    import gtopk_hvd.tensorflow as gtopk     # before hvd.init() (under mpirun it loads mpi4py)
    import horovod.tensorflow as hvd
    hvd.init()
    ...
    state = gtopk.GTopkState()               # this worker's residual; checkpoint it to resume
    with tf.GradientTape() as tape:
        loss = ...
    tape = gtopk.DistributedGradientTape(tape, compression=gtopk.Compression.gtopk(0.001),
                                         gtopk_state=state)
    gradients = tape.gradient(loss, model.trainable_variables)

Importing this module also swaps horovod.tensorflow.DistributedGradientTape and
.DistributedOptimizer: given a gtopk_hvd sparse compression, Horovod's own functions build these
with the same arguments (anything else: Horovod's, unchanged); and `hvd.join()` follows the
sparse step of this process (`gtopk_hvd.tensorflow.join`). `gtopk_hvd.horovod_swap` says how,
and how to undo it.
"""

from gtopk_hvd import horovod_swap
from gtopk_hvd.compression import compression_for
from gtopk_hvd.tensorflow.join import join, swapped_join
from gtopk_hvd.tensorflow.optimizer import DistributedOptimizer
from gtopk_hvd.tensorflow.state import GTopkState
from gtopk_hvd.tensorflow.tape import DistributedGradientTape
from gtopk_hvd.transports import load_mpi_if_launched

load_mpi_if_launched()  # under mpirun: mpi4py initialises MPI before hvd.init()
Compression = compression_for("tensorflow")
horovod_swap.install("horovod.tensorflow", "DistributedGradientTape", DistributedGradientTape)
horovod_swap.install("horovod.tensorflow", "DistributedOptimizer", DistributedOptimizer)
horovod_swap.install_around("horovod.tensorflow", "join", swapped_join)

__all__ = ["Compression", "DistributedGradientTape", "DistributedOptimizer", "GTopkState", "join"]
