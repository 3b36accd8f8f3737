"""The in-process Horovod libraries end in a safe order.

Tests in the pytest process initialise Horovod's PyTorch and TensorFlow libraries (size 1). Each
is a separate Horovod with its own background thread; the first one initialised owns MPI and
finalises it when it shuts down. Horovod 0.28.1 registers a library's shutdown with atexit at
every `hvd.init()`, so a later re-init of the owner makes it shut down first, finalising MPI
under the other library's running thread: the process then dies at exit (an MPI error or a
segfault, exit code 1 or 139) after every test passed. Plain Horovod does it too
(`hvd_torch.init(); hvd_tf.init(); hvd_torch.init()`, then exit). So the session shuts each
library down itself, last initialised first, the owner of MPI last, where more than one was
initialised.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from types import ModuleType

import pytest

HOROVOD_LIBRARIES = ("horovod.torch", "horovod.tensorflow")
initialised: list[ModuleType] = []  # in the order this process initialised them


def imported_libraries() -> Iterator[ModuleType]:
    """The Horovod libraries a test has imported (importing one here would cost seconds)."""
    for name in HOROVOD_LIBRARIES:
        if (module := sys.modules.get(name)) is not None:
            yield module


@pytest.fixture(autouse=True)
def record_horovod_initialisation() -> Iterator[None]:
    yield
    for module in imported_libraries():
        if module not in initialised and module.is_initialized():
            initialised.append(module)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if len(initialised) < 2:  # one library (every session that mpirun starts): atexit's order
        return
    for module in reversed(initialised):
        module.shutdown()
