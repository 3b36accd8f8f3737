"""Select k, then reduce (registered as "select-reduce"): Top-k, gTop-k and random-k S-SGD.

    (I_p, V_p) = select(r + g, k)         the sparsifier (`gtopk_hvd.sparsifiers`), r zeroed at I_p
    (I, V) = reduce((I_p, V_p))           the reduction (`gtopk_hvd.reductions`), over workers
    r[j] += V_p[j] for j in I_p not in I  sent but not kept globally: back to the residual

With `exact` (Compression.gtopk(density, exact=True)), after the reduction found I:

    V = sum over workers of acc_p[I]      one sum all-reduce of k values (`union.sum_at`),
                                          acc_p[j] = V_p[j] for j in I_p, r_p[j] otherwise
    r_p[I] = 0 on every worker            then the non-survivors go back as above

so no worker's contribution at I is lost in an intermediate merge (gTop-k's subtlety), for
8k (P-1)/P more bytes per worker.

Where the state is in torch tensors on the device a reduction takes tensors from (gTop-k over
torch.distributed: a GPU under NCCL; any device for one worker), the selected set stays there:
the reduction sends and merges it on the device, the residual is restored there
(`Reduction.takes_tensors_on`), and with `exact` the sum at I is gathered, all-reduced and
cleared there too (`union.sum_at_tensors`), bit for bit the host path's where the all-reduce
sums in the same order; `Exchange.taken` is then both sets one after the other (an index may
appear twice), not their union, whose length would wait for the device.

Granularity "model" selects once over the fused gradient; "bucket" selects each part (parameter)
with its own k_i (`gtopk_hvd.density`) and joins the sets (`Sparsifier.select_parts`: Top-k
does all the parts in one segmented kernel call). The sparsifier and the reduction
are chosen by name (`config.sparsifier`, `config.reduction`; no reduction: the sparsifier's
`default_reduction`).
"""

from __future__ import annotations

import time
from typing import Any

from gtopk_hvd import ops
from gtopk_hvd.density import Budget
from gtopk_hvd.options import one_of, refuse
from gtopk_hvd.reductions.base import REDUCTIONS
from gtopk_hvd.schemes.base import SCHEMES, Exchange, Scheme, Wire, reads_nothing
from gtopk_hvd.schemes.union import sum_at, sum_at_tensors
from gtopk_hvd.sparsifiers.base import SPARSIFIERS
from gtopk_hvd.wire import VALUE_BYTES


def reduction_name(config: Any) -> str:
    """The reduction `config` names, or its sparsifier's default."""
    return config.reduction or SPARSIFIERS.get(config.sparsifier).default_reduction


@SCHEMES.register("select-reduce")
class SelectReduce(Scheme):

    takes_accumulated = True  # every sparsifier takes gradient=None (`Sparsifier.select`)

    @classmethod
    def check(cls, config: Any) -> None:
        sparsifier = SPARSIFIERS.get(config.sparsifier)
        name = reduction_name(config)
        reduction = REDUCTIONS.get(name)
        if reduction.needs_shared_indices and not sparsifier.shared_indices:
            refuse("reduction", f"one that sends indices with sparsifier "
                   f"{config.sparsifier!r}, which does not pick the same ones on every worker",
                   name, f"reduction {name!r} sends no indices, so it needs a sparsifier that "
                   "picks the same ones on every worker (e.g. 'randomk'), or use 'gtopk' / "
                   "'allgather'")
        if config.wire_dtype not in reduction.wire_dtypes:
            refuse("wire_dtype", f"{one_of(reduction.wire_dtypes)} with reduction {name!r}",
                   config.wire_dtype,
                   "leave wire_dtype out, or use gTop-k (reduction 'gtopk'), which sends "
                   "float16 and bfloat16")

    @classmethod
    def wire(cls, config: Any, workers: int, d: int, k: int, union: float | None = None
             ) -> Wire:
        """The reduction's (`Reduction.wire`, entries of a 4-byte index and a wire_dtype value),
        and with `exact` one ring all-reduce of the |I| float32 values at the global set."""
        if workers <= 1:
            return Wire(0.0, 0.0)
        entry = 4 + VALUE_BYTES[config.wire_dtype]
        messages, sent = REDUCTIONS.get(reduction_name(config)).wire(workers, k, entry)
        if config.exact:
            union = k if union is None else union
            messages += 2.0 * (workers - 1)
            sent += 2.0 * (workers - 1) / workers * 4 * union
        return Wire(messages, sent)

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.sparsifier = SPARSIFIERS.get(self.config.sparsifier)(self.config.seed, self.backend)
        self.reduction = REDUCTIONS.get(reduction_name(self.config))(
            self.transport, self.index_dtype, self.config.wire_dtype)
        # Where the sets are reduced, decided once: on the state's device when the reduction
        # takes tensors there (gTop-k, the all-gather; a GPU under NCCL, or one worker).
        self.on_tensors = (self.backend.name == "torch"
                           and self.reduction.takes_tensors_on(self.backend.device))

    def skips_on_device(self) -> bool:
        """A sparsifier that takes a skip flag (Top-k) and a reduction that takes the sets on
        the state's device (gTop-k, the all-gather): every write to the state is then a kernel
        that reads the flag, or a mask cut on the device."""
        return self.on_tensors and type(self.sparsifier).takes_skip_flag

    @reads_nothing
    def exchange(self, gradient: Any, residual: Any, budget: Budget, step: int,
                 clear_gradient: bool, skip: Any = None) -> Exchange:
        start = time.perf_counter()
        local_indices, local_values = self._select(gradient, residual, budget, step,
                                                   clear_gradient, skip)
        select_seconds = time.perf_counter() - start
        if self._reduce_on_device(local_values, budget.k):
            result = self.reduction.reduce(local_indices, local_values, budget.k)
            if not self.config.exact:
                _restore_dropped(residual, local_indices, local_values, result, skip)
                return Exchange(result.indices, result.values, local_indices, result.stats,
                                select_seconds)
            values = sum_at_tensors(self.transport, residual, result.indices, result.stats,
                                    taken=(local_indices, local_values), skip=skip)
            _restore_dropped(residual, local_indices, local_values, result, skip)
            # Both sets, not their union: the step only zeroes the velocity there, and a
            # union's length would wait for the device.
            taken = self.backend.concatenate([local_indices, result.indices])
            return Exchange(result.indices, values, taken, result.stats, select_seconds)
        if skip is not None:
            raise RuntimeError("gtopk_hvd: a step skipped on the device reached the host "
                               "reduction path (a set of other than k entries?); "
                               "skips_on_device() should have been False")
        to_host = self.backend.to_host
        host_indices, host_values = to_host(local_indices), to_host(local_values)
        result = self.reduction.reduce(host_indices, host_values, budget.k)
        if not self.config.exact:
            _restore_dropped(residual, local_indices, local_values, result)
            return Exchange(result.indices, result.values, local_indices, result.stats,
                            select_seconds)
        values = sum_at(self.transport, self.backend, residual, result.indices,
                           result.stats, taken=(host_indices, host_values))
        _restore_dropped(residual, local_indices, local_values, result)
        taken = ops.sorted_union(host_indices.astype(self.index_dtype, copy=False),
                                 result.indices.astype(self.index_dtype, copy=False))
        return Exchange(result.indices, values, self.backend.index(taken), result.stats,
                        select_seconds)

    def _reduce_on_device(self, local_values: Any, k: int) -> bool:
        """Whether the reduction takes the selected set where it lies (`on_tensors`) and the
        set has k entries. The exact sum then runs there too (`union.sum_at_tensors`)."""
        return self.on_tensors and len(local_values) == k

    def _select(self, gradient: Any, residual: Any, budget: Budget, step: int,
                clear_gradient: bool, skip: Any = None) -> tuple[Any, Any]:
        """The sparsifier over each part of the budget; one set, index-sorted."""
        backend, select = self.backend, self.sparsifier.select
        on_device = {} if skip is None else {"skip": skip}
        if self.config.granularity == "model":
            indices, values = select(gradient, residual, budget.k, clear_gradient, step, 0,
                                     **on_device)
            return backend.as_index_dtype(indices, self.index_dtype), values
        return self.sparsifier.select_parts(gradient, residual, budget.parts, clear_gradient,
                                            step, self.index_dtype, **on_device)


def _restore_dropped(residual: Any, local_indices: Any, local_values: Any, result: Any,
                     skip: Any = None) -> None:
    """r[j] += V_p[j] for j in I_p not in I (module docstring): nothing where every local entry
    is in I by construction (the all-gather), by the reduction's mask where it marked one, else
    by a search of each local index in I (`ops.restore_unselected`)."""
    if result.all_survived:
        return
    if result.survived is None:
        ops.restore_unselected(residual, local_indices, local_values, result.indices, skip)
    else:
        ops.restore_residual(residual, local_indices, local_values, ~result.survived, skip)
