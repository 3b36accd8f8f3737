"""The in-process Horovod libraries end in a safe order.

Tests in the pytest process initialise Horovod's PyTorch and TensorFlow libraries (size 1). Each
is a separate Horovod with its own background thread; the first one initialised owns MPI and
finalises it when it shuts down. Horovod 0.28.1 registers a library's shutdown with atexit at
every `hvd.init()`, so a later re-init of the owner makes it shut down first, finalising MPI
under the other library's running thread: the process then dies at exit (an MPI error or a
segfault, exit code 1 or 139) after every test passed. Plain Horovod does it too
(`hvd_torch.init(); hvd_tf.init(); hvd_torch.init()`, then exit). So where more than one was
initialised, the session shuts them down itself, in the reverse order of their first
initialisation: the owner of MPI last.

The order is seen at each test's teardown, so a single test that initialised both libraries
would leave it undecided (they are then taken in HOROVOD_LIBRARIES order); no test does that.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from types import ModuleType

import pytest

HOROVOD_LIBRARIES = ("horovod.torch", "horovod.tensorflow")
first_initialised: list[ModuleType] = []  # in the order the tests first left them initialised


def initialised_libraries() -> Iterator[ModuleType]:
    """The Horovod libraries a test has imported (importing one here would cost seconds) and
    initialised; one whose native library failed to load has no is_initialized."""
    for name in HOROVOD_LIBRARIES:
        module = sys.modules.get(name)
        is_initialized = getattr(module, "is_initialized", None)
        if is_initialized is not None and is_initialized():
            yield module


@pytest.fixture(autouse=True)
def record_horovod_initialisation() -> Iterator[None]:
    """After each test: the libraries it left initialised for the first time, in order."""
    yield
    first_initialised.extend(module for module in initialised_libraries()
                             if module not in first_initialised)


def pytest_unconfigure(config: pytest.Config) -> None:
    """After the summary: the libraries shut down, last first, where more than one was
    initialised (one library, as in every session that mpirun starts: atexit's order holds)."""
    if len(first_initialised) < 2:
        return
    for module in reversed(first_initialised):
        module.shutdown()
