"""What every worker must agree on before the first step, and the check that they do.

A signature is one string, `layout|key=value|...` with the keys sorted: the layout (each
source's name, shape and dtype, in the fused order, as the adapter describes it) and every option
that changes what the workers exchange (sizes, the compression, average, predivide, the wait
probe, the adapter's own options such as backward passes). Workers whose signatures differ would
exchange sets that do not line up, or a different number of messages: the check turns that into
one error on every worker instead of a hang or a silent divergence.
"""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np

from gtopk_hvd.transports.base import Transport


def signature(layout: str, **options: Any) -> str:
    """The one format: `layout|key=value|...`, keys sorted."""
    return "|".join([layout, *(f"{key}={options[key]}" for key in sorted(options))])


def check_same_on_all_workers(transport: Transport, description: str, text: str,
                              carry: int = 0) -> list[int]:
    """Raises on every worker if `text` is not the same on all of them; returns every worker's
    `carry` (an integer that may differ, e.g. the step count), in rank order. One small
    all-gather of an 8-byte digest and the carry."""
    digest = np.frombuffer(hashlib.sha256(text.encode()).digest()[:8], dtype=np.int64)
    everyone = transport.allgather(np.array([digest[0], carry], dtype=np.int64))
    digests = everyone[:, 0]
    differing = [rank for rank, value in enumerate(digests.tolist()) if value != digests[0]]
    if differing:
        raise ValueError(
            f"gtopk_hvd: workers disagree on {description}: ranks {differing} differ from rank 0 "
            f"(this worker's is: {text[:500]})")
    return everyone[:, 1].tolist()
