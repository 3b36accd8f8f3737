"""The step of a reduction pipelined with backward, as DDP and Horovod run their buckets.

Forward takes (1 - b) t_c and backward b t_c of the step's compute t_c (b = backward_share;
2/3 by default: a backward pass costs about two forwards). Bucket i, in the order backward makes
them ready, holds n_i of the d values and is ready once backward has produced every value up to
it, backward producing values at a constant rate:

    ready_i = (1 - b) t_c + b t_c (n_1 + ... + n_i) / d

The buckets cross the link one at a time in that order, bucket i needing T_i seconds of the link
at its full rate (messages_i alpha + bytes_i beta). While compute runs the link makes progress at
`overlap` times its rate (compute and communication contend for the same cores, memory or SMs:
0, nothing is sent before backward ends; 1, no contention), after it at its full rate:

    start_i = max(ready_i, end_{i-1})
    end_i   = the time T_i of work at those rates is done from start_i
    step    = max(t_c, end_last)

The exposed communication, step - t_c, is at least the last bucket's T_last (it is ready only
when backward ends). With overlap = 0 the step is t_c + sum_i T_i, the model without overlap.
The optimizer's update after the reduction and the hooks' own compute (bf16 casts, PowerSGD's
matrix products) are not modelled.
"""

from __future__ import annotations

from collections.abc import Sequence

BACKWARD_SHARE = 2.0 / 3.0


def pipelined_step(compute_s: float, bucket_seconds: Sequence[float],
                   bucket_values: Sequence[int], overlap: float = 1.0,
                   backward_share: float = BACKWARD_SHARE) -> float:
    """Seconds of one step (module docstring); bucket_seconds[i] and bucket_values[i]: bucket
    i's link time at the full rate and its number of values, in ready order."""
    if len(bucket_seconds) != len(bucket_values):
        raise ValueError("one link time per bucket")
    if not 0.0 <= overlap <= 1.0 or not 0.0 <= backward_share <= 1.0:
        raise ValueError(f"overlap and backward_share must be in [0, 1], got {overlap}, "
                         f"{backward_share}")
    total = sum(bucket_values)
    forward = (1.0 - backward_share) * compute_s
    produced, link_free = 0, 0.0
    for seconds, values in zip(bucket_seconds, bucket_values):
        produced += values
        ready = forward + backward_share * compute_s * (produced / total if total else 1.0)
        start = max(ready, link_free)
        link_free = _finish(start, seconds, compute_s, overlap)
    return max(compute_s, link_free)


def _finish(start: float, seconds: float, compute_s: float, overlap: float) -> float:
    """When `seconds` of link work begun at `start` ends: at `overlap` of the rate until
    compute_s, at the full rate after."""
    if start >= compute_s:
        return start + seconds
    during = (compute_s - start) * overlap  # the work the link can do before compute ends
    if overlap > 0.0 and seconds <= during:
        return start + seconds / overlap
    return compute_s + seconds - during
