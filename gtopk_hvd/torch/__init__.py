"""gtopk_hvd.torch: drop-in `DistributedOptimizer` and `Compression` for Horovod PyTorch scripts.

    import gtopk_hvd.torch as gtopk          # before hvd.init() (under mpirun it loads mpi4py)
    import horovod.torch as hvd
    hvd.init()
    ...
    optimizer = gtopk.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                           compression=gtopk.Compression.gtopk(density=0.001))

Importing this module also swaps horovod.torch.DistributedOptimizer: given a gtopk_hvd sparse
compression, Horovod's own `hvd.DistributedOptimizer(...)` builds this one with the same arguments
(anything else: Horovod's, unchanged), and `hvd.join()` follows the sparse optimizer's steps
(`gtopk_hvd.torch.join`). `gtopk_hvd.horovod_swap` says how, and how to undo it.
"""

from gtopk_hvd import horovod_swap
from gtopk_hvd.compression import DGC_WARMUP, compression_for
from gtopk_hvd.torch.join import join, swapped_join
from gtopk_hvd.torch.optimizer import DistributedOptimizer
from gtopk_hvd.transports import load_mpi_if_launched

load_mpi_if_launched()  # under mpirun: mpi4py initialises MPI before hvd.init()
Compression = compression_for("torch")
horovod_swap.install("horovod.torch", "DistributedOptimizer", DistributedOptimizer)
horovod_swap.install_around("horovod.torch", "join", swapped_join)

__all__ = ["DGC_WARMUP", "Compression", "DistributedOptimizer", "join"]
