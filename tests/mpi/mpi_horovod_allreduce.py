"""Under mpirun: Horovod's allreduce for torch and TensorFlow equals the independently known sum,
and the MPI world that mpi4py sees is Horovod's. Exits non-zero on any rank's failure."""

import horovod.tensorflow as hvd_tf
import horovod.torch as hvd_torch
import numpy as np
import tensorflow as tf
import torch
from mpi4py import MPI  # before hvd.init(): the other order can crash (see the build notes)

hvd_torch.init()
hvd_tf.init()
rank, size = hvd_torch.rank(), hvd_torch.size()
assert MPI.COMM_WORLD.Get_size() == size == hvd_tf.size(), "MPI world differs from Horovod's"
assert MPI.COMM_WORLD.Get_rank() == rank == hvd_tf.rank()

# Rank r contributes (r + 1) * base, so the sum is size * (size + 1) / 2 * base.
base = np.arange(1000, dtype=np.float32) - 500.0
expected = size * (size + 1) / 2 * base

summed = hvd_torch.allreduce(torch.from_numpy((rank + 1) * base), op=hvd_torch.Sum).numpy()
np.testing.assert_allclose(summed, expected, rtol=1e-6)
averaged = hvd_torch.allreduce(torch.from_numpy((rank + 1) * base)).numpy()  # default: Average
np.testing.assert_allclose(averaged, expected / size, rtol=1e-6)

summed_tf = hvd_tf.allreduce(tf.constant((rank + 1) * base), op=hvd_tf.Sum).numpy()
np.testing.assert_allclose(summed_tf, expected, rtol=1e-6)

if rank == 0:
    print(f"horovod allreduce ok on {size} workers (torch and tensorflow)", flush=True)
