"""Dense updates in one pass: target += source / divisor (`add_divided`) and momentum correction's
velocity (`momentum_update`)."""

from __future__ import annotations

from typing import Any

import numpy as np

from gtopk_hvd import _C
from gtopk_hvd._arrays import (
    dtype_name,
    framework_of,
    is_cuda,
)
from gtopk_hvd.ops._support import (
    _cuda_check_pair,
    _flag_address,
    _on_device,
    _stream,
    _value_type,
    cuda_built,
)
from gtopk_hvd.ops.flags import flag_set


def add_divided(target: Any, source: Any, divisor: float) -> None:
    """target += source / divisor in place, rounded as the two whole-array operations (a float32
    division, then the sum) would be, bit for bit, without a temporary of source's size: torch:
    one addcdiv_ (target + 1 * source / divisor, one pass); numpy: through a scratch block of
    max(2^12, n / 256) values. 1-D, one length and dtype, one device."""
    if divisor == 1.0:
        target += source
        return
    divisor = np.float32(divisor)
    if framework_of(source) == "torch":
        import torch

        target.addcdiv_(source, torch.tensor(divisor, device=source.device))
        return
    n = len(source)
    block = max(_DIVIDE_BLOCK, -(-n // 256))
    scratch = np.empty(min(block, n), source.dtype)
    for start in range(0, n, block):
        part = scratch[:min(block, n - start)]
        np.divide(source[start:start + block], divisor, out=part)
        target[start:start + block] += part


_DIVIDE_BLOCK = 1 << 12


def momentum_update(velocity: Any, gradient: Any, momentum: float, divisor: float = 1.0,
                    skip: Any = None) -> None:
    """Momentum correction's velocity (DGC), in place:

        velocity = momentum * velocity + gradient / divisor

    rounded as `velocity *= float32(momentum)` then `add_divided(velocity, gradient, divisor)`
    round it (a product, a quotient when divisor != 1, a sum), bit for bit on every device.
    CUDA (float32, contiguous, one device, built kernels): `_C.cuda_momentum_update`, one pass
    (a read of each, a write of the velocity), no host wait. Otherwise those two operations.
    skip: as `accumulate_select`'s (when set, the velocity is left as it is)."""
    if (is_cuda(velocity) and cuda_built and dtype_name(velocity.dtype) == "float32"
            and velocity.is_contiguous() and gradient.is_contiguous()):
        _cuda_check_pair(gradient, velocity)
        with _on_device(velocity.device):
            _C.cuda_momentum_update(_value_type(velocity.dtype), velocity.data_ptr(),
                                    gradient.data_ptr(), velocity.numel(),
                                    float(np.float32(momentum)), float(np.float32(divisor)),
                                    _stream(velocity.device), _flag_address(skip, velocity))
        return
    if skip is not None and flag_set(skip):  # a CUDA tensor here reads its flag: a wait
        return
    velocity *= np.float32(momentum)
    add_divided(velocity, gradient, divisor)
