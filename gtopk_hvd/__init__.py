"""gtopk_hvd: gTop-k sparsified synchronous SGD as a plugin for Horovod.

Subpackages: `gtopk_hvd.ops` (C++/CUDA kernels: exact top-k by magnitude, sparse merge,
error-feedback residual steps).
"""

__version__ = "0.1.0"
