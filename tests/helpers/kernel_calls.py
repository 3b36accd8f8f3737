"""A spy on the kernel layer: the calls of named `gtopk_hvd.ops` functions made from outside it,
with their arguments and results. The real functions are called (a spy, not a stand-in); calls
that the kernel layer makes of its own functions are not recorded. The patch is the module's,
seen by every thread."""

from __future__ import annotations

import sys
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from gtopk_hvd import ops
from helpers.device_like import in_kernel_layer


class KernelCalls:
    """(name, args, kwargs, result) of each call, in order."""

    def __init__(self) -> None:
        self.made: list[tuple[str, tuple, dict, Any]] = []

    def named(self, name: str) -> list:
        return [made for made in self.made if made[0] == name]

    def counts(self) -> Counter:
        return Counter(made[0] for made in self.made)

    def spy(self, name: str, real: Any) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            result = real(*args, **kwargs)
            if not in_kernel_layer(sys._getframe(1).f_globals.get("__name__", "")):
                self.made.append((name, args, kwargs, result))
            return result
        return call


@contextmanager
def kernel_calls(names: tuple[str, ...]) -> Iterator[KernelCalls]:
    """While open, the calls of `gtopk_hvd.ops.<name>` for each name, made from outside it."""
    calls, patch = KernelCalls(), pytest.MonkeyPatch()
    for name in names:
        patch.setattr(ops, name, calls.spy(name, getattr(ops, name)))
    try:
        yield calls
    finally:
        patch.undo()
