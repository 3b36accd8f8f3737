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
    """What one scheme step returns to the step (`Scheme.exchange`'s result).

    Attributes:
        indices: the global set's indices, identical on every worker (host numpy, or the
            backend's tensors where the exchange ran on the device).
        values: float32, one per index: the sum over workers of what they contributed there,
            not yet scaled (the step scales them: f / P for Average, f for Sum, f the
            predivide factor).
        taken: this worker's indices whose residual was taken (a backend array; an index may
            appear more than once), where the step clears the momentum-correction velocity;
            None: nothing to clear.
        stats: what the exchange cost this worker (`ReductionStats`: bytes, messages, the
            wait / transfer split of the communication, merges).
        select_seconds: seconds of the local work before the first exchange.
    """

    indices: np.ndarray  # the global set's indices (host), identical on every worker
    values: np.ndarray  # float32 sums over workers (host), not yet scaled
    taken: Any  # this worker's indices whose residual was taken (backend array; an index
    # may appear more than once), or None
    stats: ReductionStats = field(default_factory=ReductionStats)
    select_seconds: float = 0.0  # the local work before the first exchange


class Wire(NamedTuple):
    """What one worker sends in one step, as the planner and `bench schemes` price it.

    Attributes:
        messages: the messages sent, each costing the link's latency once (a float: a
            collective's count is its ring's).
        bytes: the bytes sent.
    """

    messages: float
    bytes: float


@dataclass(frozen=True)
class NoOptions:
    """The options of a scheme that has none of its own."""


class Scheme(ABC):
    """One worker's scheme for one fused layout.

    Made once per step object (`gtopk_hvd.schemes.build_scheme`, after `check`); the
    constructor stores its arguments as attributes of the same names, and `self.options` is
    the scheme's `Options` made from `config.options`. A subclass that keeps state of its own
    extends it and calls this one.

    Args:
        config: the sparse configuration (`gtopk_hvd.compression.SparseCompression`), whose
            `options` hold the scheme's own, by name, among `option_names`.
        transport: the resolved transport of this worker (`gtopk_hvd.transports.Transport`).
        backend: the array backend the gradient and the residual are in (numpy on the host,
            or torch tensors on a device: `gtopk_hvd.backend`).
        sizes: the number of values of each source of the fused layout; d = sum(sizes).
        index_dtype: the index dtype of d (int32 where every index fits, else int64:
            `gtopk_hvd.ops.index_dtype_for`), the dtype of the indices the scheme sends.

    Raises:
        OptionError, TypeError: `config.options` has a value its `Options` refuses, or a name
            it has no field for (`options_of`).
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
        """`config`'s own options as this scheme's `Options`.

        Args:
            config: a sparse configuration whose `options` are (name, value) pairs.

        Returns:
            An instance of `Options`: the pairs as fields, the defaults filled in, every value
            checked by its `__post_init__`.

        Raises:
            TypeError: a name that is not a field of `Options`.
            OptionError (a ValueError; `gtopk_hvd.options`): a value `Options` refuses.
        """
        return cls.Options(**dict(config.options))

    @classmethod
    def defaults(cls) -> dict[str, Any]:
        """Each own option's default, by name.

        Returns:
            A dict from each field name of `Options` to its default ({} for `NoOptions`).
        """
        return {f.name: f.default for f in dataclasses.fields(cls.Options)}

    @classmethod
    def check(cls, config: Any) -> None:
        """Refuses what `config` asks that this scheme cannot do.

        Called where a step is built (and by adapters that build it late, when they are
        made), after the registries' checks (`gtopk_hvd.schemes.check_config`); a subclass adds
        its own rules and calls this one, which checks the own options (`options_of`).

        Args:
            config: the sparse configuration that names this scheme.

        Raises:
            ValueError (an OptionError, `gtopk_hvd.options`, naming the option, the value and
                the fix): a value or a combination this scheme cannot run.
            TypeError: an own option that `Options` has no field for.
        """
        cls.options_of(config)

    @classmethod
    def wire(cls, config: Any, workers: int, d: int, k: int, union: float | None = None
             ) -> Wire:
        """What one worker sends in one step, for the planner and `bench schemes`.

        Collectives are counted as rings (an all-reduce of n bytes over P workers: 2 (P - 1)
        messages and 2 n (P - 1) / P bytes sent); the leading terms, not a count of every
        header. A scheme overrides it; this base method raises.

        Args:
            config: the sparse configuration (its wire dtype, its own options).
            workers: P, the number of workers (>= 1).
            d: the number of gradient entries.
            k: the entries each worker selects in the step.
            union: the size of the global set, for schemes whose later messages carry it
                (a union of the workers' sets: at most P k); None: k.

        Returns:
            The `Wire` (messages, bytes) one worker sends in one step.

        Raises:
            NotImplementedError: the scheme states no wire cost (this base method).
        """
        raise NotImplementedError(f"scheme {cls.name!r} states no wire cost; give its class a "
                                  "wire() (docs/extending.md)")

    @classmethod
    def state_values(cls, config: Any, d: int) -> float:
        """Values each worker keeps between steps, for `bench memory`.

        Args:
            config: the sparse configuration (momentum correction, the scheme's own options).
            d: the number of gradient entries.

        Returns:
            The count of float32 values: d for the residual, and d more for the velocity with
            momentum correction (a scheme with more state overrides it and adds its own).
        """
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
        """Whether `exchange` takes skip=flag (above) for this configuration.

        Asked once, when the step is built; a scheme that can leave a step's skip decision on
        the device (no host read) overrides it.

        Returns:
            True when `exchange` honours a device skip flag; this base method: False.
        """
        return False

    def state_dict(self) -> dict:
        """What the scheme keeps between steps besides the residual, for a checkpoint.

        Saved and restored with the step's state (under its "scheme" key; an empty dict is not
        saved).

        Returns:
            A dict of host numpy values (thresholds, partition boundaries, ...); this base
            method: {}, a scheme with no state of its own.
        """
        return {}

    def load_state_dict(self, state: dict) -> None:
        """Restores what `state_dict` returned.

        Args:
            state: a dict `state_dict` returned, its values numpy arrays or scalars; {} where
                the checkpoint holds no scheme state (this base method ignores it).
        """
        return None


def reads_nothing(method: Callable[..., Any]) -> Callable[..., Phases]:
    """Decorator: a scheme's `exchange` written as a plain method, as the generator the step
    runs.

    For a scheme with no host read of its own to share with other buckets (`gtopk_hvd.lockstep`):
    the generator runs the method when first advanced and stops at once, with no yield, its
    value the method's result.

    Args:
        method: the plain `exchange(self, gradient, residual, budget, step, clear_gradient)`
            that returns the `Exchange`.

    Returns:
        A generator function with the method's name, docstring and signature
        (`functools.wraps`).
    """

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
