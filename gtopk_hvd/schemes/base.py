"""The `Scheme` interface and its registry (`SCHEMES`): how one sparse step exchanges.

The step (`gtopk_hvd.core.SparseStep`) owns everything schemes share: the agreement check, the
non-finite rule, predivision, DGC momentum correction, the density schedule and the budget k,
the array backend, the scaling of the result and the stats. A scheme owns the rest, on worker p
with gradient g and residual r (flat float32, d values, in the backend's arrays):

    acc = r + g, in place in r (fused with the selection where it can be)
    take from r what this worker contributes (r = 0 there), exchange with the other workers
    give back to r what was taken but is not applied
    return (I, V): the global set, identical on every worker, V summed over workers (unscaled)

so that, for every index, what is applied plus every worker's residual equals the sum of the
accumulated gradients (up to the wire's rounding, and except where a scheme documents a loss:
gTop-k's intermediate merges). `Exchange.taken` names the entries of this worker that were
taken (the step clears the momentum-correction velocity there).

What a scheme does in between is its own: select k then reduce (`select_reduce`: any
registered sparsifier with any registered reduction), or rank-dependent selection with a union
all-reduce, or a sketch all-reduced densely and a second round.

A scheme's class is the one place for its facts: its name (`@SCHEMES.register(name)` sets
`name`), its own options (`Options`: a frozen dataclass with their defaults, which checks them
when made), its wire cost (`wire`: the messages and bytes one worker sends in a step, which the
planner and `bench schemes` read) and the state it keeps (`state_values`, which `bench memory`
reads). A new scheme is one module with such a subclass, imported before it is chosen; then
`Compression.scheme(name, density, **options)` runs it under every adapter and transport, and
the planner and the benchmarks price it (docs/extending.md).
"""

from __future__ import annotations

import dataclasses
import functools
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, NamedTuple

import numpy as np

from gtopk_hvd.backend import ArrayBackend
from gtopk_hvd.density import Budget
from gtopk_hvd.reductions.result import ReductionStats
from gtopk_hvd.registry import Registry
from gtopk_hvd.transports.base import Transport

if TYPE_CHECKING:
    from gtopk_hvd.lockstep import Phases


@dataclass
class Exchange:
    """What one scheme step returns to the step."""

    indices: np.ndarray  # the global set's indices (host), identical on every worker
    values: np.ndarray  # float32 sums over workers (host), not yet scaled
    taken: Any  # this worker's indices whose residual was taken (backend array; an index
    # may appear more than once), or None
    stats: ReductionStats = field(default_factory=ReductionStats)
    select_seconds: float = 0.0  # the local work before the first exchange


class Wire(NamedTuple):
    """What one worker sends in one step: messages (each costs the link's latency) and bytes."""

    messages: float
    bytes: float


@dataclass(frozen=True)
class NoOptions:
    """The options of a scheme that has none of its own."""


class Scheme(ABC):
    """One worker's scheme for one fused layout.

    Made once per step object with the configuration (`config`: a SparseCompression, whose
    `options` hold the scheme's own, by name, among `option_names`), the resolved transport, the
    array backend, the layout's sizes and the index dtype of d; `self.options` is the scheme's
    `Options` made from them.
    """

    name: ClassVar[str] = ""
    """The registered name (`Compression.scheme(name, ...)`, the planner's, bench's), which
    `SCHEMES.register` sets."""
    Options: ClassVar[type] = NoOptions
    """The scheme's own options (`Compression.scheme(name, density, **options)`): a frozen
    dataclass whose fields carry the defaults and whose `__post_init__` checks the values (an
    OptionError naming the option, the value and the fix: `gtopk_hvd.options`)."""
    option_names: ClassVar[tuple[str, ...]] = ()
    """The names of Options' fields (set for every subclass)."""
    takes_accumulated: ClassVar[bool] = False
    """True when `exchange` also takes gradient=None: the residual already holds r + g (the
    step then divides a predivided gradient into it in blocks instead of making g / f)."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls.option_names = tuple(f.name for f in dataclasses.fields(cls.Options))

    def __init__(self, config: Any, transport: Transport, backend: ArrayBackend,
                 sizes: list[int], index_dtype: np.dtype) -> None:
        self.config = config
        self.options = self.options_of(config)
        self.transport = transport
        self.backend = backend
        self.sizes = sizes
        self.index_dtype = np.dtype(index_dtype)

    @classmethod
    def options_of(cls, config: Any) -> Any:
        """`config`'s own options as `Options`: the defaults filled in, every value checked."""
        return cls.Options(**dict(config.options))

    @classmethod
    def defaults(cls) -> dict[str, Any]:
        """Each own option's default, by name."""
        return {f.name: f.default for f in dataclasses.fields(cls.Options)}

    @classmethod
    def check(cls, config: Any) -> None:
        """Raises ValueError naming what `config` asks that this scheme cannot do (its own
        options first: `options_of`). Called where a step is built (and by adapters that build
        it late, when they are made); a subclass adds its own rules and calls this one."""
        cls.options_of(config)

    @classmethod
    def wire(cls, config: Any, workers: int, d: int, k: int, union: float | None = None
             ) -> Wire:
        """What one worker sends in one step at P = workers, for the planner and `bench
        schemes`: a step with k entries selected and a global set of `union` entries (None: k).
        Rings for the collectives; the leading terms, not a count of every header."""
        raise NotImplementedError(f"scheme {cls.name!r} states no wire cost; give its class a "
                                  "wire() (docs/extending.md)")

    @classmethod
    def state_values(cls, config: Any, d: int) -> float:
        """Values each worker keeps between steps for d gradient entries: the residual, and
        with momentum correction its velocity (a scheme with more state adds it)."""
        return float(d) * (2 if config.momentum_correction else 1)

    @abstractmethod
    def exchange(self, gradient: Any, residual: Any, budget: Budget, step: int,
                 clear_gradient: bool) -> Phases:
        """The module docstring's step, as a generator of its host reads
        (`gtopk_hvd.lockstep`): it yields a `HostRead` where it needs values of the device on
        the host, is sent them (a `Reply`), and returns the `Exchange`, so that several
        buckets' steps can share their waits. Its reads must not depend on local data (the
        lockstep's rule); its select_seconds leaves out its time at them beyond its share of
        their waits (`OwnTime`). A scheme that reads nothing, or reads as it goes, writes a
        plain method under `@reads_nothing`.

        Args:
            gradient: read only unless clear_gradient (then all zeros on return), or None where
                `takes_accumulated`.
            residual: updated in place.
            budget: this step's k (and its parts).
            step: the optimizer step (0-based), the same on every worker.
            skip: (only a scheme whose `skips_on_device()`) a device skip flag
                (`gtopk_hvd.core.skip`): when it is set, the residual (and the scheme's state)
                stay as they were, and the exchange still runs with every message of its usual
                size.

        Returns:
            The Exchange (as the generator's value).
        """

    def skips_on_device(self) -> bool:
        """Whether `exchange` takes skip=flag (above) for this configuration: a step decided on
        the device without a host read. Asked once, when the step is built. False unless a
        scheme says so."""
        return False

    def state_dict(self) -> dict:
        """What the scheme keeps between steps besides the residual (thresholds, partition
        boundaries, ...), as host numpy values; saved and restored with the step's."""
        return {}

    def load_state_dict(self, state: dict) -> None:
        """Restores what `state_dict` returned."""
        return None


def reads_nothing(method: Callable[..., Any]) -> Callable[..., Phases]:
    """A scheme's `exchange` written as a plain method (no host read of its own) as the
    generator the step runs: it returns the method's result at once, with no yield."""

    @functools.wraps(method)
    def phases(*args: Any, **kwargs: Any) -> Phases:
        return method(*args, **kwargs)
        yield  # unreachable: makes this a generator

    return phases


class SchemeRegistry(Registry[type[Scheme]]):
    """The schemes by name; registering one sets its class's `name`."""

    def register(self, name: str) -> Any:
        add = super().register(name)

        def named(scheme: type[Scheme]) -> type[Scheme]:
            scheme.name = name
            return add(scheme)

        return named

    def in_order(self) -> list[str]:
        """The names in the order registered."""
        return list(self._entries)

    def unregister(self, name: str) -> None:
        """Removes a scheme (a test's own, registered for the length of the test)."""
        del self._entries[name]


SCHEMES = SchemeRegistry("scheme")
