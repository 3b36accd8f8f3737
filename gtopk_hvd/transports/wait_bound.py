"""A bound on every wait of a transport: past it, the job ends with an error instead of hanging.

A worker that never reaches a collective (a bug, a rank stuck elsewhere, a dead peer the network
layer did not notice) would leave every other worker waiting forever. Each transport call runs
inside `WaitBound.waiting(what)`; one daemon thread per transport checks the deadline about once
a second and, past it, calls the transport's `abort` with what was awaited, which ends every
worker of the job (MPI_Abort, or a non-zero exit that horovodrun, mpirun and torchrun turn into
the end of the job).

The bound is `GTOPK_HVD_WAIT_TIMEOUT` seconds (default 600; 0 disables it). It covers a wait,
not a step: set it above the longest time one worker may spend outside the training loop while
the others are already in a step (e.g. rank 0 evaluating alone).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

DEFAULT_WAIT_TIMEOUT_S = 600.0
ENVIRONMENT_VARIABLE = "GTOPK_HVD_WAIT_TIMEOUT"


def wait_timeout_from_environment() -> float:
    """Seconds from GTOPK_HVD_WAIT_TIMEOUT (default 600; 0 means no bound)."""
    text = os.environ.get(ENVIRONMENT_VARIABLE, "")
    if not text:
        return DEFAULT_WAIT_TIMEOUT_S
    try:
        seconds = float(text)
    except ValueError:
        raise ValueError(f"{ENVIRONMENT_VARIABLE} must be a number of seconds, got {text!r}"
                         ) from None
    if seconds < 0:
        raise ValueError(f"{ENVIRONMENT_VARIABLE} must be >= 0 (0: no bound), got {text!r}")
    return seconds


class WaitBound:
    """Calls on_expiry(message) once when a wait outlasts `seconds` (None: from the environment;
    0: never)."""

    def __init__(self, on_expiry: Callable[[str], None], seconds: float | None = None) -> None:
        self.seconds = wait_timeout_from_environment() if seconds is None else float(seconds)
        self._on_expiry = on_expiry
        self._deadline: float | None = None
        self._what = ""
        self._thread: threading.Thread | None = None

    @contextmanager
    def waiting(self, what: str) -> Iterator[None]:
        if not self.seconds:
            yield
            return
        if self._thread is None:
            self._thread = threading.Thread(target=self._watch, name="gtopk_hvd-wait-bound",
                                            daemon=True)
            self._thread.start()
        self._what = what
        self._deadline = time.monotonic() + self.seconds
        try:
            yield
        finally:
            self._deadline = None

    def _watch(self) -> None:
        while True:
            time.sleep(min(1.0, self.seconds))
            deadline = self._deadline
            if deadline is not None and time.monotonic() > deadline:
                self._on_expiry(
                    f"waited more than {self.seconds:g} s for {self._what}: another worker never "
                    f"joined (set {ENVIRONMENT_VARIABLE} to change the bound); ending the job")
                return
