"""gtopk_hvd: gTop-k sparsified synchronous SGD as a plugin for Horovod, PyTorch and TensorFlow.

Each step exchanges only the k largest-magnitude gradient entries (with error feedback) instead
of the whole gradient. Training scripts use it through the framework adapters, the subpackages
named after the framework they serve (`gtopk_hvd.torch`, `gtopk_hvd.tensorflow`), which mirror
Horovod's wrappers; the compiled kernels and the communication parts beneath them are
framework-neutral subpackages of their own. docs/README.md indexes the API and the install.

Importing this package loads no framework, no Horovod and no MPI: an adapter loads its
framework and Horovod, and mpi4py is loaded only for the MPI transport (under an MPI launcher,
or when asked for by name).
"""

from gtopk_hvd import threads as _threads

_threads.configure_environment()  # before the extension starts OpenMP

# The one place the version is written: pyproject.toml reads it; CHANGELOG.md has an entry for it.
__version__ = "0.1.0"
