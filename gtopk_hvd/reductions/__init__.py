"""Reductions of sparse sets across workers, registered by name (`REDUCTIONS`):

    "gtopk"      gTop-k: the global top-k by recursive doubling, O(k log P) bytes (gtopk.py;
                 on the device: gtopk_device.py; the registered reduction: gtopk_reduction.py)
    "allgather"  Top-k S-SGD: every worker's set gathered and summed, O(k P) (allgather.py)
    "allreduce"  sets whose indices every worker shares: a dense all-reduce of k values
                 (shared_indices.py)

`dense_allreduce` (dense.py) is the dense S-SGD baseline. Each returns `ReductionStats`
(result.py), whose comm_seconds splits into wait_seconds and transfer_seconds (wait_probe.py).
"""

from gtopk_hvd.reductions import allgather, gtopk_reduction, shared_indices  # noqa: F401
from gtopk_hvd.reductions.allgather import topk_allgather
from gtopk_hvd.reductions.base import REDUCTIONS, Reduction
from gtopk_hvd.reductions.dense import dense_allreduce
from gtopk_hvd.reductions.gtopk import GTopkReducer, gtopk_allreduce
from gtopk_hvd.reductions.result import ReductionStats, SparseResult

__all__ = ["REDUCTIONS", "GTopkReducer", "Reduction", "ReductionStats", "SparseResult",
           "dense_allreduce", "gtopk_allreduce", "topk_allgather"]
