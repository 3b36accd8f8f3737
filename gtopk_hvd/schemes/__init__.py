"""Sparse schemes by name (`SCHEMES`), and the one place a configuration meets the registries.

    "select-reduce"  a registered sparsifier selects k, a registered reduction reduces
                     (select_reduce.py): the schemes named gtopk, gtopk-exact, topk and
                     randomk (`gtopk_hvd.scheme_names.PRESETS`; users pick them by those names)
    "micro"          MiCRO: rotating partitions, threshold selection, exact union sum (micro.py)
    "exdyna"         ExDyna: MiCRO with block boundaries that balance the counts (exdyna.py)
    "sketch"         sketched SGD: count sketch all-reduced, heavy hitters, second round
                     (sketch.py)
    "oktopk"         Ok-Topk: local thresholds, a balanced sparse reduce-scatter, a global
                     threshold over the summed regions, an all-gather (oktopk.py)

`check_config` validates a sparse configuration against the registries (names, each scheme's
own options, and what the chosen parts can do together); `SparseCompression` calls it when it
is made. `build_scheme` makes the scheme a `SparseStep` runs (checking again).
"""

from __future__ import annotations

import importlib
from typing import Any

import numpy as np

from gtopk_hvd.backend import ArrayBackend
from gtopk_hvd.options import OptionTypeError, check_choice, one_of, refuse
from gtopk_hvd.reductions.base import REDUCTIONS
from gtopk_hvd.scheme_names import PRESETS, SELECT_REDUCE, call_for, choice_for
from gtopk_hvd.schemes.base import SCHEMES, Exchange, Scheme, Wire, reads_nothing
from gtopk_hvd.schemes.select_reduce import SelectReduce, reduction_name
from gtopk_hvd.sparsifiers.base import SPARSIFIERS
from gtopk_hvd.transports.base import Transport

for _module in ("micro", "exdyna", "sketch", "oktopk", "select_reduce"):
    importlib.import_module(f"gtopk_hvd.schemes.{_module}")  # registered in this order: the
    # order of their names (known_scheme_names)

EXACT_REDUCTIONS = ("allgather", "allreduce")
"""Reductions that already sum every worker's values at the global set: `exact` adds nothing."""


def check_config(config: Any) -> type[Scheme]:
    """Raises OptionError (a ValueError; `gtopk_hvd.options`) naming the option, the value,
    what is allowed and the fix if `config` names an unknown scheme, sparsifier or reduction,
    gives a scheme an option it does not have, or asks a combination the chosen parts cannot
    run or that means nothing; returns the scheme's class. `SparseCompression` calls it when
    it is made, the step again where it is built."""
    scheme = _scheme_of(config)
    _check_own_options(config, scheme)
    if issubclass(scheme, SelectReduce):
        _check_select_reduce(config)
    else:
        _check_unused_fields(config)
    scheme.check(config)
    return scheme


def known_scheme_names() -> list[str]:
    """Every scheme name `Compression.scheme` takes: the select-reduce family's named presets
    (`gtopk_hvd.scheme_names.PRESETS`), then every other registered scheme in the order
    registered ("select-reduce", the presets' family, is an alias of Compression.sparse)."""
    return list(PRESETS) + [name for name in SCHEMES.in_order()
                            if name not in PRESETS and name != SELECT_REDUCE]


def options_owners(option: str) -> list[str]:
    """The registered schemes that have an own option named `option`."""
    return [name for name in known_scheme_names() if name in SCHEMES.names()
            and option in SCHEMES.get(name).option_names]


def _scheme_of(config: Any) -> type[Scheme]:
    if config.scheme not in SCHEMES.names():
        refuse("scheme", one_of(known_scheme_names()), config.scheme,
               "Compression.scheme(name, density, **options) takes these names (and "
               "'select-reduce': Compression.sparse's sparsifier and reduction); a new scheme "
               "registers with @SCHEMES.register(name) (docs/extending.md)")
    return SCHEMES.get(config.scheme)


def _check_own_options(config: Any, scheme: type[Scheme]) -> None:
    for name, value in config.options:
        if name in scheme.option_names:
            continue
        owners = [owner for owner in options_owners(name) if owner != config.scheme]
        fix = (f"{name} is an option of {', '.join(owners)}: "
               f"{call_for(owners[0], f'density, {name}={value!r}')}"
               if owners else "check its spelling")
        own = ", ".join(scheme.option_names) or "none"
        raise OptionTypeError(
            f"gtopk_hvd: {choice_for(config.scheme)} has no option {name} (got "
            f"{name}={value!r}); the options of scheme {config.scheme!r} are: {own}, and the "
            "common ones (wire_dtype, warmup_densities, warmup_steps, momentum_correction, "
            f"momentum, momentum_masking, granularity, seed, nonfinite); {fix}")


def _check_unused_fields(config: Any) -> None:
    """A scheme outside the select-reduce family selects by its own rule: sparsifier,
    reduction and exact mean nothing there and are refused unless left at their defaults."""
    for option, value, default in (("sparsifier", config.sparsifier, "topk"),
                                   ("reduction", config.reduction, None),
                                   ("exact", config.exact, False)):
        if value != default:
            refuse(option, f"left at its default ({default!r}) for scheme {config.scheme!r}, "
                   "which selects and reduces by its own rule", value,
                   "a sparsifier and a reduction of your choice run with Compression.sparse"
                   "(density, sparsifier=..., reduction=...); exact=True is gTop-k's")


def _check_select_reduce(config: Any) -> None:
    """The sparsifier and reduction are registered names; exact only where it adds something."""
    check_choice("sparsifier", config.sparsifier, SPARSIFIERS.names(),
                 "a new rule registers with @SPARSIFIERS.register(name) (docs/extending.md)")
    if config.reduction is not None:
        check_choice("reduction", config.reduction, REDUCTIONS.names(),
                     "or None: the sparsifier's default reduction")
    reduction = reduction_name(config)
    if config.exact and reduction in EXACT_REDUCTIONS:
        refuse("exact", f"False with the {reduction!r} reduction, which already sums every "
               "worker's values at the global set", config.exact,
               "exact=True is for gTop-k's merges: Compression.gtopk(density, exact=True)")


def scheme_of(config: Any) -> type[Scheme]:
    """The class of a configuration already checked when it was made (a SparseCompression):
    its wire cost and state, without checking it again."""
    return SCHEMES.get(config.scheme)


def build_scheme(config: Any, transport: Transport, backend: ArrayBackend, sizes: list[int],
                 index_dtype: np.dtype) -> Scheme:
    """The scheme of `config` for one layout (checked first: `check_config`)."""
    return check_config(config)(config, transport, backend, sizes, index_dtype)


__all__ = ["SCHEMES", "Exchange", "Scheme", "Wire", "build_scheme", "check_config",
           "known_scheme_names", "options_owners", "reads_nothing", "scheme_of"]
