"""SparseStep with the state in torch tensors (CPU, or a GPU when there is one) equals the numpy
state bit for bit: the same kernels, the same reduction, only where the arrays live differs.

"device-like-cpu": CPU tensors that refuse what CUDA tensors refuse (numpy conversions outside
the kernel layer, host copies that are views: tests/helpers/device_like.py), so the torch path
is checked for GPU-only failures on any machine."""

from __future__ import annotations

import numpy as np
import pytest
from helpers.device_like import device_like, device_like_cpu
from helpers.thread_transport import ThreadGroup

from gtopk_hvd import ops
from gtopk_hvd.compression import Compression
from gtopk_hvd.core import SparseStep

torch = pytest.importorskip("torch")

DEVICES = ["cpu", "device-like-cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not (torch.cuda.is_available() and ops.cuda_built),
    reason="needs a CUDA GPU and an extension built with nvcc"))]
SIZES = [300, 1, 57, 2000]


def gradients(rank: int, steps: int) -> list[np.ndarray]:
    rng = np.random.default_rng([rank, 7])
    return [rng.standard_normal(sum(SIZES)).astype(np.float32) * (1 + step)
            for step in range(steps)]


def train(compression: object, device: str | None, workers: int = 3, steps: int = 6,
          wrap: object = lambda tensor: tensor) -> list:
    """Each worker's (updates per step, final residual, final velocity) as numpy."""
    if device == "device-like-cpu":
        with device_like_cpu():
            return train(compression, "cpu", workers, steps, wrap=device_like)

    def work(transport: object) -> tuple:
        state = SparseStep(compression, SIZES, transport, device=device, predivide=2.0)
        updates = []
        for gradient in gradients(transport.rank, steps):
            flat = gradient if device is None else wrap(torch.from_numpy(gradient).to(device))
            indices, values = state.update(flat)
            assert isinstance(indices, np.ndarray) and isinstance(values, np.ndarray)
            updates.append((indices.copy(), values.copy()))
        saved = state.state_dict()
        return updates, saved["residual"], saved.get("velocity")

    return ThreadGroup(workers).run(work)


def assert_same_training(expected: list, got: list) -> None:
    """Every worker's updates, residual and velocity bit for bit; something was selected."""
    for (want_updates, want_residual, want_velocity), (updates, residual, velocity) in zip(
            expected, got, strict=True):
        for (want_indices, want_values), (indices, values) in zip(want_updates, updates,
                                                                  strict=True):
            np.testing.assert_array_equal(indices, want_indices)
            assert values.tobytes() == want_values.tobytes()
        assert residual.tobytes() == want_residual.tobytes()
        assert (velocity is None) == (want_velocity is None)
        if velocity is not None:
            assert velocity.tobytes() == want_velocity.tobytes()
    assert any(values.size for values in (u[1] for u in got[0][0])), "nothing was selected"


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("options", [
    {"density": 0.05},
    {"density": 0.05, "granularity": "bucket"},
    {"density": 0.02, "momentum_correction": True, "warmup_densities": (0.2,), "warmup_steps": 2},
], ids=["model", "bucket", "momentum+warmup"])
@pytest.mark.parametrize("scheme", ["gtopk", "topk"])
def test_torch_state_equals_numpy_state_bit_for_bit(device: str, options: dict,
                                                    scheme: str) -> None:
    compression = getattr(Compression, scheme)(**options)
    assert_same_training(train(compression, None), train(compression, device))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("compression", [
    Compression.micro(0.05),
    Compression.exdyna(0.05, blocks=16),
    Compression.micro(0.02, momentum_correction=True, warmup_densities=(0.2,), warmup_steps=2),
    Compression.micro(0.05, controller="multiplicative", threshold=0.5),
    Compression.sketch(0.05, columns=64),
    Compression.gtopk(0.05, exact=True),
    Compression.oktopk(0.05, reestimate_every=2),
], ids=["micro", "exdyna", "micro-momentum+warmup", "micro-multiplicative", "sketch",
        "gtopk-exact", "oktopk"])
def test_the_other_schemes_on_torch_state_equal_numpy_bit_for_bit(device: str,
                                                                  compression: object) -> None:
    """MiCRO / ExDyna (the threshold pass: the CUDA kernels on a GPU), the sketch and exact
    gTop-k with the state in torch tensors, against the numpy state."""
    assert_same_training(train(compression, None), train(compression, device))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("compression", [
    Compression.micro(0.02, momentum_correction=True, warmup_densities=(0.2,), warmup_steps=2),
    Compression.exdyna(0.05, blocks=16, momentum_correction=True),
    Compression.micro(0.05, controller="multiplicative", threshold=0.5,
                      momentum_correction=True),
], ids=["micro-momentum+warmup", "exdyna-momentum", "micro-multiplicative-momentum"])
def test_threshold_schemes_at_one_worker_equal_numpy_bit_for_bit(device: str,
                                                                 compression: object) -> None:
    """At P = 1 the threshold schemes hand the step the selection where it was made (the
    velocity is cleared there): the same velocity and residual as the numpy state's."""
    assert_same_training(train(compression, None, workers=1),
                         train(compression, device, workers=1))
