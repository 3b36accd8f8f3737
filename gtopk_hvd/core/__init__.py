"""The framework-neutral core: one step object and what it is made of.

    step.py            `SparseStep`: the sparse step with error feedback (the maths is there)
    agreement.py       the signature every worker must share, and its check
    passes.py          gradients summed over backward passes (frameworks without .grad)
    skip.py            `Skip`: whether a step is skipped for a non-finite gradient, counted
                       by the step, decided by its caller, or a flag on the device
    stats.py           `StepStats`, what a step did
    tentative.py       `TentativeStep`: a step run before it is known to count, then
                       committed or discarded
    warmup_warning.py  the warning for an aggressive density without protection

Beneath it, shared with the schemes: `gtopk_hvd.density` (the density schedule and the k it
allows) and `gtopk_hvd.backend` (numpy on the host or torch on a device, chosen once per step
object). It imports no Horovod and no framework; adapters (`gtopk_hvd.torch`,
`gtopk_hvd.tensorflow`) fuse, split and convert around it. Schemes plug in through
`gtopk_hvd.schemes`.
"""

from gtopk_hvd.core.skip import Skip
from gtopk_hvd.core.stats import StepStats
from gtopk_hvd.core.step import SparseStep, count_workers
from gtopk_hvd.core.tentative import TentativeStep, can_step_tentatively

__all__ = ["Skip", "SparseStep", "StepStats", "TentativeStep", "can_step_tentatively",
           "count_workers"]
