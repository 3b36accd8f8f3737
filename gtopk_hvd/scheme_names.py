"""The named schemes of the select-reduce family, and the calls that make a scheme, for the
messages. Imports nothing: the configuration (`gtopk_hvd.compression`) and the checks
(`gtopk_hvd.schemes.check_config`) both read it. The names themselves come from the registry
(`gtopk_hvd.schemes.known_scheme_names`: these presets, then every other registered scheme)."""

from __future__ import annotations

from typing import Any

PRESETS: dict[str, dict[str, Any]] = {
    "gtopk": {"sparsifier": "topk", "reduction": "gtopk", "exact": False},
    "gtopk-exact": {"sparsifier": "topk", "reduction": "gtopk", "exact": True},
    "topk": {"sparsifier": "topk", "reduction": "allgather", "exact": False},
    "randomk": {"sparsifier": "randomk", "reduction": "allreduce", "exact": False},
}
"""The named schemes that run the "select-reduce" family (a registered sparsifier, then a
registered reduction): the fields each fixes."""

SELECT_REDUCE = "select-reduce"
"""The registered name of that family. As a name for `Compression.scheme` it is an alias of
`Compression.sparse` (the sparsifier and reduction as options); a configuration that matches
one of PRESETS is named, and printed, by that scheme's name."""

PRESET_METHODS = ("gtopk", "topk")
"""The presets with a method of their own in `Compression`; every other registered scheme named
by an identifier has one too (`Compression`'s type)."""


def has_method(name: str) -> bool:
    """Whether `Compression.<name>` makes scheme `name` (a registered scheme's name, or one of
    PRESETS)."""
    if name in PRESETS:
        return name in PRESET_METHODS
    return name.isidentifier()


def choice_for(name: str) -> str:
    """What makes scheme `name`, for the messages (e.g. "Compression.micro")."""
    return f"Compression.{name}" if has_method(name) else f"Compression.scheme({name!r}, ...)"


def call_for(name: str, arguments: str) -> str:
    """The call that makes scheme `name` with `arguments` (e.g. "Compression.micro(0.01)")."""
    if has_method(name):
        return f"Compression.{name}({arguments})"
    return f"Compression.scheme({name!r}, {arguments})"
