"""Sparse schemes by name (`SCHEMES`), and the one place a configuration meets the registries.

    "select-reduce"  a registered sparsifier selects k, a registered reduction reduces
                     (select_reduce.py): Top-k, gTop-k (also exact) and random-k S-SGD
    "micro"          MiCRO: rotating partitions, threshold selection, exact union sum (micro.py)
    "exdyna"         ExDyna: MiCRO with block boundaries that balance the counts (exdyna.py)
    "sketch"         sketched SGD: count sketch all-reduced, heavy hitters, second round
                     (sketch.py)

`check_config` validates a sparse configuration against the registries (names, and what the
chosen parts can do together); `build_scheme` makes the scheme a `SparseStep` runs. Both are
called where a step is built: configurations (`gtopk_hvd.compression`) are plain data.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from gtopk_hvd.backend import ArrayBackend
from gtopk_hvd.schemes import exdyna, micro, select_reduce, sketch  # noqa: F401  (registration)
from gtopk_hvd.schemes.base import SCHEMES, Exchange, Scheme
from gtopk_hvd.transports.base import Transport


def check_config(config: Any) -> type[Scheme]:
    """Raises ValueError naming the problem if `config` names an unknown scheme, sparsifier or
    reduction, or a combination they cannot run; returns the scheme's class."""
    scheme = SCHEMES.get(config.scheme)
    unknown = sorted(name for name, _ in config.options if name not in scheme.option_names)
    if unknown:
        raise ValueError(f"scheme {config.scheme!r} has no options {unknown}; its own are "
                         f"{list(scheme.option_names)} (and every SparseCompression field)")
    scheme.check(config)
    return scheme


def build_scheme(config: Any, transport: Transport, backend: ArrayBackend, sizes: list[int],
                 index_dtype: np.dtype) -> Scheme:
    """The scheme of `config` for one layout (checked first: `check_config`)."""
    return check_config(config)(config, transport, backend, sizes, index_dtype)


__all__ = ["SCHEMES", "Exchange", "Scheme", "build_scheme", "check_config"]
