"""Compression choices shared by the framework adapters (`gtopk_hvd.torch`, `.tensorflow`):
plain, immutable data, every option checked when the choice is made (types and ranges here,
names and what the scheme can do against the registries: `gtopk_hvd.schemes.check_config`;
the errors: `gtopk_hvd.options`).

    Compression.none              dense, through Horovod's allreduce
    Compression.fp16              dense in float16, through Horovod's allreduce
    Compression.topk(density)     Top-k S-SGD: all-gather of every worker's local top-k
    Compression.gtopk(density)    gTop-k S-SGD: the global top-k by recursive doubling
    Compression.sparse(density, sparsifier=..., reduction=...)
                                  any registered selection rule and reduction, e.g.
                                  sparsifier="randomk" (with the "allreduce" reduction)
    Compression.micro(density)    MiCRO: rotating partitions, threshold selection, exact sums
    Compression.exdyna(density)   ExDyna: MiCRO with count-balancing block boundaries
    Compression.sketch(density)   sketched SGD: count sketch, heavy hitters, second round
    Compression.oktopk(density)   Ok-Topk: thresholds, balanced sparse reduce-scatter, all-gather
    Compression.scheme(name, density, **options)
                                  a scheme by its name (SCHEME_NAMES: gtopk, gtopk-exact,
                                  topk, randomk, micro, exdyna, sketch, oktopk) or any other
                                  registered scheme (`gtopk_hvd.schemes`), its own options as
                                  keyword arguments

Each scheme has one name (SCHEME_NAMES), the one its configuration prints (`repr`,
`SparseCompression.name`) and the planner and `bench schemes` take.

Sparse choices carry their hyper-parameters:
    density                 k / d, in (0, 1]
    wire_dtype              value dtype on the wire: "float32", "float16" or "bfloat16"
                            (what the reduction supports: gTop-k all three, the others float32)
    warmup_densities        densities of the warm-up stages, e.g. (0.25, 0.0625, 0.015625, 0.004)
    warmup_steps            optimizer steps per warm-up stage (0: no warm-up)
    momentum_correction     DGC momentum correction: u = m u + g accumulates into the residual
                            instead of g, and u is cleared where entries are sent; use it with
                            an optimizer without momentum of its own
    momentum                m of the momentum correction
    momentum_masking        DGC's momentum factor masking (True, the default): u is cleared
                            where entries are sent. False keeps u (an unbroken momentum whose
                            sum error feedback delivers, as 1-bit Adam compresses its momentum:
                            what Adam's frozen second moment uses, `freeze_variance_after`)
    granularity             "model": one selection over all parameters fused (as in the paper);
                            "bucket": each parameter keeps its own share ceil(density * size)
                            (`selection=` is accepted as its older name)
    sparsifier              the selection rule, a name in gtopk_hvd.sparsifiers.SPARSIFIERS
    reduction               the reduction, a name in gtopk_hvd.reductions.REDUCTIONS (None:
                            the sparsifier's default_reduction)
    exact                   after the reduction found the global index set I, one more sum
                            all-reduce of every worker's accumulated values at I (k float32
                            values), applied instead of the reduction's sums, the residual
                            cleared at I on every worker: gTop-k's values lose no worker's
                            contribution in an intermediate merge (gTop-k only: Top-k's and
                            random-k's reductions already sum every worker's values)
    scheme                  the registered implementation, a name in gtopk_hvd.schemes.SCHEMES
                            ("select-reduce": the sparsifier, then the reduction, which
                            gtopk, gtopk-exact, topk and randomk are; `name` says which)
    options                 the scheme's own options, as sorted (name, value) pairs
    seed                    seeds sparsifiers that draw at random (the same on every worker)
    nonfinite               what a NaN or Inf gradient on any worker does (`NONFINITE_RULES`):
                            "propagate" (the default): the step is skipped, as loss scaling
                            expects: every worker's update is all NaN, residuals, velocities
                            and the step count stay as they were; "raise": every worker raises
                            FloatingPointError at that step (no check before the step, the
                            residual keeps the non-finite values). `gtopk_hvd.core.step`
                            says how and what each costs.

The dense choices are Horovod's: `compress(tensor)` / `decompress(tensor, ctx)` run Horovod's own
NoneCompressor / FP16Compressor of the tensor's framework. A sparse choice is not a per-tensor
transform (it selects over all gradients fused, against a residual kept between steps), so its
`compress` raises TypeError naming the wrappers that run it.
"""

from __future__ import annotations

import importlib
import inspect
import sys
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any

from gtopk_hvd.options import (
    OptionError,
    OptionTypeError,
    check_choice,
    check_flag,
    check_integer,
    check_number,
    refuse,
)
from gtopk_hvd.scheme_names import (
    PRESETS,
    SELECT_REDUCE,
    call_for,
    choice_for,
)
from gtopk_hvd.schemes import (
    SCHEMES,
    Scheme,
    check_config,
    known_scheme_names,
    options_owners,
    scheme_of,
)
from gtopk_hvd.wire import WIRE_VALUE_TYPES

GRANULARITIES = ("model", "bucket")
NONFINITE_RULES = ("propagate", "raise")


@dataclass(frozen=True)
class DenseCompression:
    """Dense gradients through Horovod's own allreduce: `Compression.none` and `.fp16`.

    The adapters run it through Horovod (its own wrappers, or an allreduce of each gradient);
    `compress` and `decompress` are those of Horovod's compressor for the tensor's framework,
    so this choice needs Horovod only when it is used.

    Attributes:
        name: "none" (each gradient as it is) or "fp16" (floating-point gradients cast to
            float16 for the allreduce and back to their dtype after it): the name of the
            compressor in Horovod's `Compression` namespace.
    """

    name: str

    def horovod_compressor(self, framework: str) -> Any:
        """Horovod's own compressor class of this choice for one framework.

        Args:
            framework: "torch" or "tensorflow": the Horovod module
                (`horovod.<framework>.compression`) whose compressor is returned.

        Returns:
            `horovod.<framework>.compression.Compression.<name>`: Horovod's NoneCompressor or
            FP16Compressor class, whose static `compress` / `decompress` the methods below call.

        Raises:
            ImportError: Horovod, or its module for that framework, is not installed.
        """
        module = importlib.import_module(f"horovod.{framework}.compression")
        return getattr(module.Compression, self.name)

    def compress(self, tensor: Any) -> tuple[Any, Any]:
        """Horovod's Compressor.compress for this choice, of the tensor's framework.

        Args:
            tensor: a torch or TensorFlow tensor (a Keras variable's value included).

        Returns:
            (tensor to send, context): for "none" the tensor itself and None; for "fp16" the
            tensor cast to float16 if it is floating-point (else as it is) and its original
            dtype.

        Raises:
            TypeError: the tensor is neither torch's nor TensorFlow's.
            ImportError: Horovod for that framework is not installed.
        """
        return self.horovod_compressor(_framework_of(tensor)).compress(tensor)

    def decompress(self, tensor: Any, ctx: Any) -> Any:
        """Horovod's Compressor.decompress for this choice: the inverse of `compress`.

        Args:
            tensor: the reduced tensor, torch or TensorFlow, as `compress` sent it.
            ctx: the context `compress` returned with it (None, or the original dtype).

        Returns:
            The tensor in its original dtype: for "none" itself, for "fp16" cast back to ctx
            if that is a floating-point dtype.

        Raises:
            TypeError: the tensor is neither torch's nor TensorFlow's.
            ImportError: Horovod for that framework is not installed.
        """
        return self.horovod_compressor(_framework_of(tensor)).decompress(tensor, ctx)


def _framework_of(tensor: Any) -> str:
    module = type(tensor).__module__.split(".")[0]
    if module == "torch":
        return "torch"
    if module in ("tensorflow", "keras", "tf_keras"):
        return "tensorflow"
    raise TypeError(f"Compression.none / .fp16 compress torch or TensorFlow tensors (Horovod's "
                    f"compressors), not {type(tensor).__name__}")


_ALREADY_EXACT = {"topk": "Top-k's all-gather already sums every worker's values at the union",
                  "randomk": "random-k's all-reduce already sums every worker's values",
                  "gtopk-exact": "gtopk-exact is gTop-k with exact=True already"}


@dataclass(frozen=True, repr=False)
class SparseCompression:
    """A sparse choice's hyper-parameters, immutable, every one checked when it is made.

    The types and ranges are checked here, the names and what the scheme can do against the
    registries (`gtopk_hvd.schemes.check_config`). Users make one through `Compression`'s
    methods (`Compression.gtopk(density)`, `.scheme(name, density, **options)`, ...), which
    also refuse the options a scheme fixes; the module docstring says what each field does.

    Attributes:
        reduction: the reduction, a name in `gtopk_hvd.reductions.REDUCTIONS`; given as None,
            the sparsifier's `default_reduction` is filled in when it is made (scheme
            "select-reduce"; another scheme keeps None).
        density: k / d, in (0, 1]: k = ceil(density x d) of the d gradient entries are sent
            each step (after the warm-up).
        wire_dtype: the values' dtype on the wire, "float32", "float16" or "bfloat16", one
            the reduction supports (gTop-k all three, the others float32).
        warmup_densities: the densities of the warm-up stages, each in (0, 1] (e.g.
            `DGC_WARMUP`); a list is stored as a tuple.
        warmup_steps: optimizer steps per warm-up stage, an integer >= 0 (0: no warm-up).
        momentum_correction: DGC's momentum correction: u = m u + g is accumulated into the
            residual instead of g; for an optimizer without momentum of its own.
        momentum: m of the momentum correction, in [0, 1).
        momentum_masking: True: u is cleared where entries are sent (DGC's masking); False
            keeps u, and needs momentum_correction=True.
        granularity: "model" (one selection over every parameter fused) or "bucket" (each
            parameter keeps its own share, ceil(density x size)).
        sparsifier: the selection rule, a name in `gtopk_hvd.sparsifiers.SPARSIFIERS`.
        seed: an integer >= 0 seeding the sparsifiers that draw at random; the same on
            every worker.
        nonfinite: what a NaN or Inf gradient on any worker does, one of `NONFINITE_RULES`:
            "propagate" (the step is skipped on every worker, its update all NaN) or "raise"
            (every worker raises FloatingPointError at that step).
        exact: gTop-k only: after the reduction found the global index set, one more sum
            all-reduce of every worker's accumulated values there replaces the reduction's
            sums.
        scheme: the registered implementation, a name in `gtopk_hvd.schemes.SCHEMES`
            ("select-reduce": the sparsifier, then the reduction).
        options: the scheme's own options as sorted (name, value) pairs, each a field of
            the scheme's `Options`; a list of pairs is stored as a tuple of tuples.

    Raises:
        OptionError, OptionTypeError (`gtopk_hvd.options`): when made, a field out of range,
            of the wrong type, an unknown name, or a combination the scheme cannot run.
    """

    reduction: str | None  # None: the sparsifier's default_reduction (filled in when made)
    density: float
    wire_dtype: str = "float32"
    warmup_densities: tuple[float, ...] = ()
    warmup_steps: int = 0
    momentum_correction: bool = False
    momentum: float = 0.9
    momentum_masking: bool = True
    granularity: str = "model"
    sparsifier: str = "topk"
    seed: int = 0
    nonfinite: str = "propagate"
    exact: bool = False
    scheme: str = SELECT_REDUCE
    options: tuple[tuple[str, Any], ...] = ()

    def __post_init__(self) -> None:
        check_fields(self)
        object.__setattr__(self, "warmup_densities", tuple(self.warmup_densities))
        object.__setattr__(self, "options", tuple(tuple(pair) for pair in self.options))
        check_config(self)
        if self.scheme == SELECT_REDUCE and self.reduction is None:  # one configuration, one value
            from gtopk_hvd.sparsifiers import SPARSIFIERS

            default = SPARSIFIERS.get(self.sparsifier).default_reduction
            object.__setattr__(self, "reduction", default)

    @property
    def name(self) -> str:
        """The scheme's one name (`SCHEME_NAMES`; a registered scheme's own name; "select-reduce"
        for a sparsifier and reduction that match no named scheme)."""
        if self.scheme != SELECT_REDUCE:
            return self.scheme
        for name, fixed in PRESETS.items():
            if (self.sparsifier, self.reduction, self.exact) == (
                    fixed["sparsifier"], fixed["reduction"], fixed["exact"]):
                return name
        return SELECT_REDUCE

    def __repr__(self) -> str:
        """How to make it: `Compression.scheme(<name>, <density>, <options not at default>)`."""
        name = self.name
        shown = [f"{name!r}", f"{self.density!r}"]
        for field in fields(self):
            if field.name in ("density", "scheme", "options") or (
                    name in PRESETS and field.name in PRESETS[name]):
                continue
            value = getattr(self, field.name)
            if value != (None if field.name == "reduction" else field.default):
                shown.append(f"{field.name}={value!r}")
        shown += [f"{option}={value!r}" for option, value in self.options]
        return f"Compression.scheme({', '.join(shown)})"

    # Horovod's Compressor interface, only to refuse it: a sparse choice handed to Horovod's own
    # wrapper where gtopk_hvd.horovod_swap could not reach fails here with the fix, at the first
    # gradient, instead of with an AttributeError deep inside Horovod. gtopk_hvd never calls it.
    def compress(self, tensor: Any) -> Any:
        """Horovod's Compressor.compress, only to refuse it: a sparse choice is not a per-tensor
        transform, so Horovod's own wrappers cannot run it.

        Args:
            tensor: the gradient Horovod's wrapper would compress (not read).

        Returns:
            Nothing: it always raises.

        Raises:
            TypeError: always, naming the gtopk_hvd wrappers that run a sparse compression.
        """
        raise TypeError(self._not_for_horovod())

    def decompress(self, tensor: Any, ctx: Any = None) -> Any:
        """Horovod's Compressor.decompress, only to refuse it (as `compress`).

        Args:
            tensor: the tensor Horovod's wrapper would decompress (not read).
            ctx: its context (not read).

        Returns:
            Nothing: it always raises.

        Raises:
            TypeError: always, naming the gtopk_hvd wrappers that run a sparse compression.
        """
        raise TypeError(self._not_for_horovod())

    def _not_for_horovod(self) -> str:
        return (f"{self!r}: a gtopk_hvd sparse compression is not a per-tensor transform (it "
                "selects over every gradient fused, against a residual kept between steps, "
                "and its result is a set of (index, value) pairs, not a tensor), so it has no "
                "Horovod compress/decompress and cannot run inside Horovod's own "
                "DistributedOptimizer / DistributedGradientTape, which call "
                "compression.compress per tensor; import gtopk_hvd.torch (or gtopk_hvd.tensorflow, "
                "gtopk_hvd.tensorflow.keras) before building the optimizer, so that "
                "hvd.DistributedOptimizer hands it to gtopk_hvd, or use "
                "gtopk_hvd.torch.DistributedOptimizer (gtopk_hvd.tensorflow."
                "DistributedGradientTape, gtopk_hvd.tensorflow.keras.DistributedOptimizer) "
                "directly. A name bound before that import (`from horovod.torch import "
                "DistributedOptimizer`) keeps Horovod's original: call hvd.DistributedOptimizer.")


def check_fields(config: SparseCompression) -> None:
    """The types and ranges of the fields every sparse choice has (`gtopk_hvd.options`)."""
    check_number("density", config.density, 0.0, 1.0, low_open=True,
                 fix="k = ceil(density x d) of the d gradient entries are sent each step, "
                     "e.g. density=0.01")
    _check_warmup_densities(config.warmup_densities)
    check_integer("warmup_steps", config.warmup_steps, 0,
                  fix="optimizer steps per warm-up stage (0: no warm-up)")
    check_choice("wire_dtype", config.wire_dtype, WIRE_VALUE_TYPES,
                 fix="the dtype of the values on the wire")
    check_flag("momentum_correction", config.momentum_correction)
    check_number("momentum", config.momentum, 0.0, 1.0, high_open=True,
                 fix="m of the momentum correction, e.g. momentum=0.9")
    check_flag("momentum_masking", config.momentum_masking)
    if not config.momentum_masking and not config.momentum_correction:
        refuse("momentum_masking", "True (its default) without momentum_correction=True",
               config.momentum_masking,
               "momentum_masking=False keeps the momentum correction's velocity where entries "
               "are sent; add momentum_correction=True or leave momentum_masking out")
    check_choice("granularity", config.granularity, GRANULARITIES,
                 fix="selection= is granularity's older name; 'model' selects over every "
                     "parameter fused, 'bucket' gives each parameter its share")
    check_integer("seed", config.seed, 0, fix="the same seed on every worker")
    check_choice("nonfinite", config.nonfinite, NONFINITE_RULES,
                 fix="what a NaN or Inf gradient on any worker does")
    check_flag("exact", config.exact, fix="exact=True is gTop-k's (Compression.gtopk)")
    for option, value in (("scheme", config.scheme), ("sparsifier", config.sparsifier)):
        if not isinstance(value, str):
            refuse(option, "a registered name (a str)", value, wrong_type=True)
    if config.reduction is not None and not isinstance(config.reduction, str):
        refuse("reduction", "a registered name (a str) or None", config.reduction,
               wrong_type=True)
    if not isinstance(config.options, (tuple, list)):
        refuse("options", "(name, value) pairs", config.options, wrong_type=True)


def _check_warmup_densities(stages: Any) -> None:
    """A tuple or list of densities, each in (0, 1]."""
    if not isinstance(stages, (tuple, list)):
        refuse("warmup_densities", "a tuple of densities in (0, 1]", stages,
               "e.g. warmup_densities=gtopk_hvd.compression.DGC_WARMUP", wrong_type=True)
    for stage, density in enumerate(stages):
        check_number(f"warmup_densities[{stage}] (a warm-up density)", density, 0.0, 1.0,
                     low_open=True, fix="each stage's density, e.g. DGC_WARMUP")


_FIELDS = frozenset(SparseCompression.__dataclass_fields__) - {"options"}
_FIXED_BY_CHOICE = ("scheme", "sparsifier", "reduction", "exact")


def sparse_config(reduction: str | None, density: float, *, scheme_options: bool = False,
                  choice: str | None = None, **options: Any) -> SparseCompression:
    """A SparseCompression from keyword options, the one place every adapter makes one:
    `selection=` is taken as `granularity`'s older name; with scheme_options, options that are
    not fields are the scheme's own (checked against the scheme's `option_names`), else they
    are refused (OptionTypeError, a TypeError, as for any unknown keyword). choice: what the
    user called, for the messages (default: the Compression method of `reduction`)."""
    if "selection" in options:
        if "granularity" in options:
            raise OptionError("gtopk_hvd: give granularity= or its older name selection=, "
                              f"not both (got granularity={options['granularity']!r}, "
                              f"selection={options['selection']!r}); keep granularity=")
        options["granularity"] = options.pop("selection")
    own = tuple(sorted((name, value) for name, value in options.items() if name not in _FIELDS))
    if own and not scheme_options:
        _refuse_unknown_option(own[0], choice or _method_of(reduction))
    options = {name: value for name, value in options.items() if name in _FIELDS}
    return SparseCompression(reduction, density, **options, options=own)


def _method_of(reduction: str | None) -> str:
    return {"gtopk": "Compression.gtopk", "allgather": "Compression.topk"}.get(
        reduction, "Compression.sparse")


def _refuse_unknown_option(option: tuple[str, Any], choice: str) -> None:
    """OptionTypeError: `choice` (a select-reduce choice) has no option named option[0]."""
    name, value = option
    owners = options_owners(name)
    fix = (f"{name} is an option of {', '.join(owners)}: "
           f"{call_for(owners[0], f'density, {name}={value!r}')}"
           if owners else "check its spelling")
    fixed = set(_FIXED_BY_CHOICE) - ({"exact"} if choice == "Compression.gtopk" else set())
    if choice == "Compression.sparse":
        fixed = {"scheme"}
    allowed = sorted(_FIELDS - fixed - {"density"})
    raise OptionTypeError(
        f"gtopk_hvd: {choice} has no option {name} (got {name}={value!r}); its options are: "
        f"{', '.join(allowed)}; {fix}")


def _refuse_fixed(option: str, value: Any, choice: str, scheme: str, fix: str) -> None:
    """OptionError: `choice` fixes `option` (it is the scheme `scheme`)."""
    refuse(option, f"left out of {choice} (the scheme {scheme!r} fixes it)", value, fix)


def _preset(name: str, density: float, options: dict[str, Any], choice: str
            ) -> SparseCompression:
    """One of PRESETS, refusing the options it fixes (exact: only gTop-k takes it)."""
    for option in _FIXED_BY_CHOICE:
        if option not in options or (option == "exact" and name == "gtopk"):
            continue
        value = options[option]
        if option == "exact":
            fix = (f"{_ALREADY_EXACT[name]}; exact=True is gTop-k's: "
                   "Compression.gtopk(density, exact=True) or Compression.scheme('gtopk-exact', "
                   "density)") if name != "gtopk-exact" else (
                f"{_ALREADY_EXACT[name]}; plain gTop-k is Compression.gtopk(density)")
        elif option == "scheme":
            fix = f"for {value!r} use {call_for(value, 'density, ...')}"
        else:
            fix = (f"for another {option} use Compression.sparse(density, {option}={value!r}, "
                   "...) (the registered sparsifier, then the registered reduction)")
        _refuse_fixed(option, value, choice, name, fix)
    fixed = dict(PRESETS[name])
    if name == "gtopk":
        fixed["exact"] = options.pop("exact", False)
    return sparse_config(fixed.pop("reduction"), density, choice=choice, **options, **fixed)


class _Registered(type):
    """Compression's own type: a registered scheme's name that is an identifier and no method
    of Compression's is one more method (`_method_for`), read from the registry when asked, so
    that a scheme registered later is there too."""

    def __getattr__(cls, name: str) -> Any:
        if name.isidentifier() and name in SCHEMES.names() and name not in PRESETS:
            return _method_for(SCHEMES.get(name))
        raise AttributeError(f"type object {cls.__name__!r} has no attribute {name!r}")

    def __dir__(cls) -> list[str]:
        return sorted({*super().__dir__(), *(name for name in SCHEMES.names()
                                             if name.isidentifier() and name not in PRESETS)})


class Compression(metaclass=_Registered):
    """The namespace users pass as `compression=` (mirrors horovod.*.Compression). Every
    option is checked when the choice is made (`SparseCompression`). Besides the methods
    below, each registered scheme named by an identifier is a method of its own (e.g.
    `Compression.micro(density, threshold=None, controller="histogram", **options)`: its
    `Options`' fields, positional or by keyword)."""

    none = DenseCompression("none")
    fp16 = DenseCompression("fp16")

    @staticmethod
    def topk(density: float, **options: Any) -> SparseCompression:
        """Top-k S-SGD: the all-gather of every worker's local top-k set, the scheme "topk".

        Args:
            density: k / d, in (0, 1].
            **options: the sparse options of the module docstring, but not exact, sparsifier,
                reduction or scheme (Top-k fixes them).

        Returns:
            The SparseCompression of the scheme "topk".

        Raises:
            OptionError, OptionTypeError (`gtopk_hvd.options`): an option out of range, of the
                wrong type, unknown, or fixed by the scheme.
        """
        return _preset("topk", density, options, "Compression.topk")

    @staticmethod
    def gtopk(density: float, **options: Any) -> SparseCompression:
        """gTop-k S-SGD: the global top-k by recursive doubling, the scheme "gtopk".

        Args:
            density: k / d, in (0, 1].
            **options: the sparse options of the module docstring, exact included, but not
                sparsifier, reduction or scheme (gTop-k fixes them).

        Returns:
            The SparseCompression of the scheme "gtopk" ("gtopk-exact" with exact=True).

        Raises:
            OptionError, OptionTypeError (`gtopk_hvd.options`): an option out of range, of the
                wrong type, unknown, or fixed by the scheme.
        """
        return _preset("gtopk", density, options, "Compression.gtopk")

    @staticmethod
    def sparse(density: float, sparsifier: str = "topk", reduction: str | None = None,
               **options: Any) -> SparseCompression:
        """A registered selection rule with a registered reduction.

        Args:
            density: k / d, in (0, 1].
            sparsifier: the selection rule, a name in `gtopk_hvd.sparsifiers.SPARSIFIERS`.
            reduction: a name in `gtopk_hvd.reductions.REDUCTIONS`; None: the one the
                sparsifier names (e.g. "randomk" -> "allreduce").
            **options: the other sparse options of the module docstring (not scheme).

        Returns:
            The SparseCompression (its `name` the matching scheme's, e.g. "randomk", or
            "select-reduce").

        Raises:
            OptionError, OptionTypeError (`gtopk_hvd.options`): an option out of range, of the
                wrong type, unknown, or fixed by the scheme.
        """
        if "scheme" in options:
            _refuse_fixed("scheme", options["scheme"], "Compression.sparse", SELECT_REDUCE,
                          f"use Compression.scheme({options['scheme']!r}, density, ...)")
        return sparse_config(reduction, density, choice="Compression.sparse", **options,
                             sparsifier=sparsifier)

    @staticmethod
    def scheme(name: str, density: float, **options: Any) -> SparseCompression:
        """A scheme by its name.

        Args:
            name: one of SCHEME_NAMES (the same configuration as its method, e.g.
                Compression.scheme("gtopk-exact", d) is Compression.gtopk(d, exact=True)),
                another registered scheme (`gtopk_hvd.schemes`), or "select-reduce" (an alias
                of `sparse`).
            density: k / d, in (0, 1].
            **options: the sparse options of the module docstring; those that are not fields
                of SparseCompression are the scheme's own.

        Returns:
            The SparseCompression of that scheme.

        Raises:
            OptionError, OptionTypeError (`gtopk_hvd.options`): an option out of range, of the
                wrong type, unknown, or fixed by the scheme.
        """
        if not isinstance(name, str):
            refuse("scheme name", f"{', '.join(map(repr, SCHEME_NAMES))} or another registered "
                   "name", name, wrong_type=True)
        if name in PRESETS:
            return _preset(name, density, options, f"Compression.scheme({name!r}, ...)")
        if name == SELECT_REDUCE:
            return Compression.sparse(density, **options)
        return _registered(name, density, options)


def _registered(name: str, density: float, options: dict[str, Any]) -> SparseCompression:
    """A registered scheme's configuration (`scheme` may not be given again; its own options at
    their defaults, of the default's type, are left out, so that one configuration has one
    value: Compression.micro(d) == Compression.scheme("micro", d, controller="histogram"))."""
    defaults = SCHEMES.get(name).defaults() if name in SCHEMES.names() else {}
    options = {option: value for option, value in options.items()
               if not (option in defaults and type(value) is type(defaults[option])
                       and value == defaults[option])}
    choice = choice_for(name)
    if "scheme" in options:
        _refuse_fixed("scheme", options["scheme"], choice, name,
                      f"use Compression.scheme({options['scheme']!r}, density, ...)")
    return sparse_config(None, density, scheme_options=True, choice=choice, **options,
                         scheme=name)


def _method_for(scheme: type[Scheme]) -> Callable[..., SparseCompression]:
    """`Compression.<name>` of a registered scheme: density, then the scheme's own options
    (its `Options`' fields and defaults, positional or by keyword), then the sparse options of
    the module docstring."""
    own = scheme.option_names

    def make(density: float, *positional: Any, **options: Any) -> SparseCompression:
        if len(positional) > len(own):
            raise TypeError(f"Compression.{scheme.name}() takes at most {1 + len(own)} "
                            f"positional arguments ({len(positional) + 1} given)")
        for option, value in zip(own, positional, strict=False):
            if option in options:
                raise TypeError(f"Compression.{scheme.name}() got multiple values for argument "
                                f"{option!r}")
            options[option] = value
        return _registered(scheme.name, density, options)

    parameter = inspect.Parameter
    make.__name__ = make.__qualname__ = scheme.name
    make.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
        [parameter("density", parameter.POSITIONAL_OR_KEYWORD, annotation=float),
         *(parameter(field.name, parameter.POSITIONAL_OR_KEYWORD, default=field.default)
           for field in fields(scheme.Options)),
         parameter("options", parameter.VAR_KEYWORD)], return_annotation=SparseCompression)
    summary = (inspect.getdoc(sys.modules[scheme.__module__]) or scheme.name).split("\n\n")[0]
    make.__doc__ = (f"{summary}\n\nArgs:\n    density: k / d, in (0, 1].\n    "
                    + "".join(f"{field.name}: its own option (default {field.default!r}; "
                              f"`{scheme.__module__}`).\n    " for field in fields(scheme.Options))
                    + "**options: the sparse options of the module docstring, but not scheme."
                    f"\n\nReturns:\n    The SparseCompression of the scheme {scheme.name!r}."
                    "\n\nRaises:\n    OptionError, OptionTypeError (`gtopk_hvd.options`): an "
                    "option out of range, of the wrong type, unknown, or fixed by the scheme.")
    return make


def compression_for(framework: str) -> type[Compression]:
    """The `Compression` namespace an adapter exports for "torch" or "tensorflow": gtopk_hvd's
    sparse choices, and as `none` / `fp16` Horovod's own compressor classes of that framework
    (so `compress` / `decompress`, identity and `issubclass(..., hvd.Compressor)` checks are
    Horovod's). The adapters take Horovod's classes and gtopk_hvd's DenseCompression alike.
    Without Horovod installed (a torchrun user of the DDP hook only) the namespace is
    gtopk_hvd's own, whose none / fp16 need Horovod only when used."""
    try:
        horovod = importlib.import_module(f"horovod.{framework}.compression").Compression
    except ImportError:
        return Compression
    return type("Compression", (Compression,), {
        "__doc__": f"{Compression.__doc__} none / fp16: horovod.{framework}.Compression's.",
        "__module__": f"gtopk_hvd.{framework}", "none": horovod.none, "fp16": horovod.fp16})


SCHEME_NAMES = tuple(known_scheme_names())
"""The shipped schemes' names (`gtopk_hvd.schemes.known_scheme_names()` when this module was
imported; a scheme registered later is in known_scheme_names(), not here)."""


def wire_cost(name: str, workers: int, d: int, k: int, union: float | None = None,
              **options: Any) -> tuple[float, float]:
    """(messages, bytes) one worker sends in one step of scheme `name` (`Scheme.wire`) at
    P = workers with k of d entries selected and a global set of `union` (None: k), the scheme
    made as `Compression.scheme(name, k / d, **options)`: the planner's and `bench schemes`'
    one source."""
    config = Compression.scheme(name, min(1.0, k / d), **options)
    return tuple(scheme_of(config).wire(config, workers, d, k, union))


DGC_WARMUP = (0.25, 0.0625, 0.015625, 0.004)
"""The density warm-up of Deep Gradient Compression (Lin et al., ICLR 2018)."""
