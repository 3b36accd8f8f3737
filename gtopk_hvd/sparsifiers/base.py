"""The `Sparsifier` interface and its registry (`SPARSIFIERS`).

A sparsifier is the selection rule of error-feedback sparsification. On worker p, with gradient
g and residual r (flat float32, d values) and a budget of k entries:

    acc = r + g;   I_p = choose(acc, k);   V_p = acc[I_p];   r = acc with the entries at I_p = 0

`select` does all of it in place (one pass where the rule allows) and returns (I_p, V_p), I_p
strictly increasing, of any integer dtype (the step converts it). A new rule is a subclass in
its own module, registered with `@SPARSIFIERS.register(name)` and imported by
`gtopk_hvd.sparsifiers`; `Compression.sparse(density, sparsifier=name)` then uses it (through
the "select-reduce" scheme, `gtopk_hvd.schemes.select_reduce`).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any, ClassVar

from gtopk_hvd.backend import NUMPY, ArrayBackend
from gtopk_hvd.registry import Registry


class Sparsifier(ABC):
    shared_indices: ClassVar[bool] = False
    """True when every worker chooses the same I_p without communicating (then the "allreduce"
    reduction applies: no indices are sent)."""
    default_reduction: ClassVar[str] = "gtopk"
    """The reduction `Compression.sparse` pairs it with unless told otherwise."""
    takes_skip_flag: ClassVar[bool] = False
    """True when `select` and `select_parts` also take skip=flag, a device skip flag
    (`gtopk_hvd.core.skip`): when set, the residual is left as it is and the set is
    chosen from it as it is (k entries still, so every message keeps its size)."""

    def __init__(self, seed: int = 0, backend: ArrayBackend = NUMPY) -> None:
        self.seed = seed  # for rules that draw at random: the same on every worker
        self.backend = backend  # where the step's arrays live (`gtopk_hvd.backend`)

    @abstractmethod
    def select(self, gradient: Any, residual: Any, k: int, clear_gradient: bool, step: int,
               part: int) -> tuple[Any, Any]:
        """(I_p, V_p) as above, updating `residual` in place; `gradient` is read only unless
        clear_gradient (then it is all zeros on return). gradient and residual are numpy
        arrays, or torch tensors on one device (the result is then on that device too).
        step: the optimizer step; part: which bucket (0 for a model-wide selection).
        gradient None: the residual already holds acc (nothing to add, nothing to clear)."""

    def select_parts(self, gradient: Any, residual: Any, parts: Sequence[tuple[int, int, int, int]],
                     clear_gradient: bool, step: int, index_dtype: Any) -> tuple[Any, Any]:
        """`select` over each part (part, begin, end, k) of the fused gradient (granularity
        "bucket": `gtopk_hvd.density.Budget.parts`, contiguous, in increasing begin), joined:
        (begin + I_p of each part, V_p of each part) concatenated in the parts' order, so
        index-sorted, indices into the fused gradient of `index_dtype`. This default calls
        `select` on each part's slices; a rule with a segmented kernel overrides it with one
        call for all the parts, giving the same result."""
        backend = self.backend
        indices, values = [], []
        for part, begin, end, k in parts:
            part_gradient = None if gradient is None else gradient[begin:end]
            part_indices, part_values = self.select(part_gradient, residual[begin:end], k,
                                                    clear_gradient, step, part)
            indices.append(backend.as_index_dtype(part_indices, index_dtype) + begin)
            values.append(part_values)
        return backend.concatenate(indices), backend.concatenate(values)


SPARSIFIERS: Registry[type[Sparsifier]] = Registry("sparsifier")
