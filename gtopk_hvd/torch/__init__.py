"""gtopk_hvd.torch: drop-in `DistributedOptimizer` and `Compression` for Horovod PyTorch scripts.

    import gtopk_hvd.torch as gtopk          # before hvd.init(): it loads mpi4py first
    import horovod.torch as hvd
    hvd.init()
    ...
    optimizer = gtopk.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                           compression=gtopk.Compression.gtopk(density=0.001))
"""

import gtopk_hvd.transports.mpi  # noqa: F401  (mpi4py before hvd.init())
from gtopk_hvd.compression import DGC_WARMUP, Compression
from gtopk_hvd.torch.optimizer import DistributedOptimizer

__all__ = ["DGC_WARMUP", "Compression", "DistributedOptimizer"]
