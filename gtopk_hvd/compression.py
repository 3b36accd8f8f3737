"""Compression choices shared by the framework adapters (`gtopk_hvd.torch`, `.tensorflow`):
plain, immutable data. Names are checked against the registries where a step is built
(`gtopk_hvd.schemes.check_config`), not here.

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
    Compression.scheme(name, density, **options)
                                  any registered scheme (`gtopk_hvd.schemes`), its own options
                                  as keyword arguments

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
                            contribution in an intermediate merge (select-reduce schemes)
    scheme                  the scheme, a name in gtopk_hvd.schemes.SCHEMES ("select-reduce":
                            the sparsifier, then the reduction)
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
from dataclasses import dataclass
from typing import Any

from gtopk_hvd.wire import WIRE_VALUE_TYPES

GRANULARITIES = ("model", "bucket")
NONFINITE_RULES = ("propagate", "raise")


@dataclass(frozen=True)
class DenseCompression:
    """Dense gradients through Horovod's own allreduce (`name`: "none" or "fp16")."""

    name: str

    def horovod_compressor(self, framework: str) -> Any:
        """Horovod's own compressor class of this choice for "torch" or "tensorflow"."""
        module = importlib.import_module(f"horovod.{framework}.compression")
        return getattr(module.Compression, self.name)

    def compress(self, tensor: Any) -> tuple[Any, Any]:
        """Horovod's Compressor.compress for this choice: (tensor to send, context)."""
        return self.horovod_compressor(_framework_of(tensor)).compress(tensor)

    def decompress(self, tensor: Any, ctx: Any) -> Any:
        """Horovod's Compressor.decompress for this choice."""
        return self.horovod_compressor(_framework_of(tensor)).decompress(tensor, ctx)


def _framework_of(tensor: Any) -> str:
    module = type(tensor).__module__.split(".")[0]
    if module == "torch":
        return "torch"
    if module in ("tensorflow", "keras", "tf_keras"):
        return "tensorflow"
    raise TypeError(f"Compression.none / .fp16 compress torch or TensorFlow tensors (Horovod's "
                    f"compressors), not {type(tensor).__name__}")


@dataclass(frozen=True)
class SparseCompression:
    """A sparse choice's hyper-parameters (module docstring); checked for ranges and types
    here, against the registries where the step is built."""

    reduction: str | None
    density: float
    wire_dtype: str = "float32"
    warmup_densities: tuple[float, ...] = ()
    warmup_steps: int = 0
    momentum_correction: bool = False
    momentum: float = 0.9
    granularity: str = "model"
    sparsifier: str = "topk"
    seed: int = 0
    nonfinite: str = "propagate"
    exact: bool = False
    scheme: str = "select-reduce"
    options: tuple[tuple[str, Any], ...] = ()

    def __post_init__(self) -> None:
        for name, density in [("density", self.density)] + [
                ("warmup density", d) for d in self.warmup_densities]:
            if isinstance(density, bool) or not isinstance(density, (int, float)) or not (
                    0.0 < density <= 1.0):
                raise ValueError(f"{name} must be in (0, 1], got {density!r}")
        if self.wire_dtype not in WIRE_VALUE_TYPES:
            raise ValueError(f"wire_dtype must be one of {WIRE_VALUE_TYPES}, "
                             f"got {self.wire_dtype!r}")
        if not isinstance(self.warmup_steps, int) or self.warmup_steps < 0:
            raise ValueError(f"warmup_steps must be an integer >= 0, got {self.warmup_steps!r}")
        if not 0.0 <= self.momentum < 1.0:
            raise ValueError(f"momentum must be in [0, 1), got {self.momentum!r}")
        if self.granularity not in GRANULARITIES:
            raise ValueError(f"granularity (formerly `selection`) must be one of {GRANULARITIES}, "
                             f"got {self.granularity!r}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            raise ValueError(f"seed must be an integer >= 0, got {self.seed!r}")
        if not isinstance(self.exact, bool):
            raise ValueError(f"exact must be True or False, got {self.exact!r}")
        if self.nonfinite not in NONFINITE_RULES:
            raise ValueError(f"nonfinite must be one of {NONFINITE_RULES}, "
                             f"got {self.nonfinite!r}")

    # Horovod's Compressor interface, only to refuse it: a sparse choice handed to Horovod's own
    # wrapper where gtopk_hvd.horovod_swap could not reach fails here with the fix, at the first
    # gradient, instead of with an AttributeError deep inside Horovod. gtopk_hvd never calls it.
    def compress(self, tensor: Any) -> Any:
        """Raises TypeError: Horovod's own wrappers cannot run a sparse compression."""
        raise TypeError(self._not_for_horovod())

    def decompress(self, tensor: Any, ctx: Any = None) -> Any:
        """Raises TypeError: Horovod's own wrappers cannot run a sparse compression."""
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


_FIELDS = frozenset(SparseCompression.__dataclass_fields__) - {"options"}


def sparse_config(reduction: str | None, density: float, *, scheme_options: bool = False,
                  **options: Any) -> SparseCompression:
    """A SparseCompression from keyword options, the one place every adapter makes one:
    `selection=` is taken as `granularity`'s older name; with scheme_options, options that are
    not fields are the scheme's own (checked by the scheme where the step is built), else they
    are refused (TypeError, as for any unknown keyword)."""
    if "selection" in options:
        if "granularity" in options:
            raise ValueError("give granularity= or its older name selection=, not both")
        options["granularity"] = options.pop("selection")
    own = ()
    if scheme_options:
        own = tuple(sorted((name, value) for name, value in options.items()
                           if name not in _FIELDS))
        options = {name: value for name, value in options.items() if name in _FIELDS}
    return SparseCompression(reduction, density, **options, options=own)


class Compression:
    """The namespace users pass as `compression=` (mirrors horovod.*.Compression)."""

    none = DenseCompression("none")
    fp16 = DenseCompression("fp16")

    @staticmethod
    def topk(density: float, **options: Any) -> SparseCompression:
        """Top-k S-SGD (all-gather of local top-k sets). Options: see the module docstring."""
        return sparse_config("allgather", density, **options)

    @staticmethod
    def gtopk(density: float, **options: Any) -> SparseCompression:
        """gTop-k S-SGD (global top-k by recursive doubling). Options: module docstring."""
        return sparse_config("gtopk", density, **options)

    @staticmethod
    def sparse(density: float, sparsifier: str = "topk", reduction: str | None = None,
               **options: Any) -> SparseCompression:
        """A registered selection rule with a registered reduction (default: the one the
        sparsifier names, e.g. "randomk" -> "allreduce"). Options: module docstring."""
        return sparse_config(reduction, density, **options, sparsifier=sparsifier)

    @staticmethod
    def micro(density: float, threshold: float | None = None, controller: str = "histogram",
              **options: Any) -> SparseCompression:
        """MiCRO (`gtopk_hvd.schemes.micro`): threshold = the start (None: measured at the
        first step), controller = "histogram" (ours) or "multiplicative" (the authors').
        Other options: module docstring (momentum correction and warm-up apply)."""
        return Compression.scheme("micro", density, threshold=threshold,
                                  controller=controller, **options)

    @staticmethod
    def exdyna(density: float, threshold: float | None = None, controller: str = "histogram",
               blocks: int = 1024, balance: float = 0.05, **options: Any) -> SparseCompression:
        """ExDyna (`gtopk_hvd.schemes.exdyna`): MiCRO's options, plus `blocks` (the number of
        fine blocks) and `balance` (the count imbalance, as a fraction of the mean, that moves
        a boundary by one block)."""
        return Compression.scheme("exdyna", density, threshold=threshold,
                                  controller=controller, blocks=blocks, balance=balance,
                                  **options)

    @staticmethod
    def sketch(density: float, rows: int = 5, columns: int | None = None,
               second_round: bool = True, **options: Any) -> SparseCompression:
        """Sketched SGD (`gtopk_hvd.schemes.sketch`): a rows x columns count sketch (columns
        None: 10 k), and the second round of exact values (True) or the sketch's estimates."""
        return Compression.scheme("sketch", density, rows=rows, columns=columns,
                                  second_round=second_round, **options)

    @staticmethod
    def scheme(name: str, density: float, **options: Any) -> SparseCompression:
        """A registered scheme (`gtopk_hvd.schemes`) by name; options that are not fields of
        SparseCompression are the scheme's own. Options: module docstring."""
        return sparse_config(None, density, scheme_options=True, **options, scheme=name)


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


DGC_WARMUP = (0.25, 0.0625, 0.015625, 0.004)
"""The density warm-up of Deep Gradient Compression (Lin et al., ICLR 2018)."""
