"""gtopk_hvd: gTop-k sparsified synchronous SGD as a plugin for Horovod.

Subpackages: `gtopk_hvd.ops` (C++/CUDA kernels: exact top-k by magnitude, sparse merge,
error-feedback residual steps); `gtopk_hvd.threads` sizes their CPU threads.
"""

from gtopk_hvd import threads as _threads

_threads.configure_environment()  # before the extension starts OpenMP

__version__ = "0.1.0"
