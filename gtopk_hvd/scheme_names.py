"""Each sparse scheme's one name, and the calls that make it: what users read and type
(`Compression.scheme(name, density)`, `SparseCompression.name` and its repr, the planner's and
`bench schemes`' --schemes, README and docs). Imports nothing: the configuration
(`gtopk_hvd.compression`) and the checks (`gtopk_hvd.schemes.check_config`) both read it."""

from __future__ import annotations

from typing import Any

SCHEME_NAMES = ("gtopk", "gtopk-exact", "topk", "randomk", "micro", "exdyna", "sketch",
                "oktopk")
"""Each sparse scheme's one name: `Compression.scheme(name, density)`, `SparseCompression.name`
and its repr, the planner's and `bench schemes`' --schemes (with "dense"), README and docs."""

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

CHOICE_OF = {"gtopk": "Compression.gtopk", "topk": "Compression.topk",
             "micro": "Compression.micro", "exdyna": "Compression.exdyna",
             "sketch": "Compression.sketch", "oktopk": "Compression.oktopk"}
"""The scheme names that have a method of their own in `Compression`."""


def choice_for(name: str) -> str:
    """What makes scheme `name`, for the messages (e.g. "Compression.micro")."""
    return CHOICE_OF.get(name, f"Compression.scheme({name!r}, ...)")


def call_for(name: str, arguments: str) -> str:
    """The call that makes scheme `name` with `arguments` (e.g. "Compression.micro(0.01)")."""
    if name in CHOICE_OF:
        return f"{CHOICE_OF[name]}({arguments})"
    return f"Compression.scheme({name!r}, {arguments})"
