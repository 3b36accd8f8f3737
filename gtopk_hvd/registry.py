"""Name -> implementation tables, for the parts that can be swapped by name (sparsifiers,
reductions, transports). An unknown name is an error that lists the known ones."""

from __future__ import annotations

from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class Registry(Generic[T]):
    """Implementations of one kind (`kind`, e.g. "sparsifier"), registered by name."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._entries: dict[str, T] = {}

    def register(self, name: str) -> Callable[[T], T]:
        """Decorator: `@REGISTRY.register("name")` on the implementation."""

        def add(entry: T) -> T:
            if name in self._entries:
                raise ValueError(f"a {self.kind} named {name!r} is already registered")
            self._entries[name] = entry
            return entry

        return add

    def get(self, name: str) -> T:
        if name not in self._entries:
            raise ValueError(f"unknown {self.kind} {name!r}; known: {', '.join(self.names())}")
        return self._entries[name]

    def names(self) -> list[str]:
        return sorted(self._entries)
