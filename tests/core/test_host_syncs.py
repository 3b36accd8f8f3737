"""Host synchronisations of a step on a device state, counted without a GPU
(tests/helpers/host_syncs.py): what the core and the schemes do outside the kernel layer. Every
scheme keeps its sets and sums in tensors from selection to the update at P = 1 and with a
transport that sends tensors (the selection-and-merge schemes' merges on the device; the union
schemes' all-gather of indices and sums by all-reduces of tensors:
`gtopk_hvd.schemes.union`), so none makes one outside the kernel layer (whose data-dependent
counts, e.g. a threshold's selected count, the GPU check counts: scripts/gpu/gpu_e2e.py --syncs),
and none, in the kernel layer either, copies a host number into a tensor at indices (the
residual's clears: `ops.zero_at` makes its zero on the device)."""

from __future__ import annotations

import types

import numpy as np
import pytest
from helpers.device_like import device_like, device_like_cpu
from helpers.host_syncs import count_host_syncs
from helpers.thread_transport import ThreadGroup

from gtopk_hvd import ops
from gtopk_hvd.compression import Compression
from gtopk_hvd.core import SparseStep

torch = pytest.importorskip("torch")
D = 20_000
SCHEMES = {
    "gtopk": (lambda: Compression.gtopk(0.01), 0),
    "gtopk-momentum": (lambda: Compression.gtopk(0.01, momentum_correction=True), 0),
    "topk": (lambda: Compression.topk(0.01), 0),
    "micro": (lambda: Compression.micro(0.01), 0),
    "exdyna": (lambda: Compression.exdyna(0.01), 0),
    "gtopk-exact": (lambda: Compression.gtopk(0.01, exact=True), 0),
    "sketch": (lambda: Compression.sketch(0.01), 0),
    "sketch-estimates": (lambda: Compression.sketch(0.01, second_round=False), 0),
}


def syncs_per_step(compression: object, sizes: list[int], workers: int) -> list:
    """Every worker's host synchronisations in each of 3 steps on a device-like state."""

    def work(transport: object) -> list:
        state = SparseStep(compression, sizes, transport, device="cpu")
        counts = []
        for step in range(3):
            rng = np.random.default_rng([transport.rank, step])
            gradient = device_like(torch.from_numpy(
                rng.standard_normal(sum(sizes)).astype(np.float32)))
            out = device_like(torch.empty(sum(sizes)))
            with count_host_syncs() as syncs:
                state.update(gradient, out, clear_gradient=True)
            counts.append(syncs)
        return counts

    with device_like_cpu():
        return [syncs for counts in ThreadGroup(workers).run(work) for syncs in counts]


@pytest.mark.parametrize("workers", [1, 4])
@pytest.mark.parametrize("scheme", list(SCHEMES))
def test_host_synchronisations_per_step(scheme: str, workers: int) -> None:
    make, allowed = SCHEMES[scheme]
    for syncs in syncs_per_step(make(), [D], workers):
        assert syncs.total <= allowed, dict(syncs)


def test_the_counter_sees_a_synchronisation() -> None:
    x = device_like(torch.arange(6.0))
    with count_host_syncs() as syncs:
        x[x > 2] = 0  # a boolean mask: nonzero on the device, a wait
        _ = x.sum().item()
    assert syncs.total == 2, dict(syncs)


def test_the_counter_sees_a_host_number_copied_to_the_device() -> None:
    """A Python number put at tensor indices or at one integer index is copied from the host
    (on a GPU the copy waits), also inside the kernel layer; a slice (a fill) and a value made
    on the device are not."""
    x = device_like(torch.arange(6.0))
    indices = device_like(torch.tensor([1, 4]))
    with count_host_syncs() as syncs:
        x[indices] = 0.0
        x[2] = 1
        x[:] = 0.0
        x[indices] = torch.zeros((), dtype=x.dtype, device=x.device)
        ops.zero_at(x, indices)
    assert dict(syncs) == {("__setitem__", "outside gtopk_hvd"): 2}, dict(syncs)
    ops_module = types.ModuleType("gtopk_hvd.ops")  # a kernel-layer frame: counted all the same
    exec("def put(x, i):\n    x[i] = 0.0", ops_module.__dict__)
    with count_host_syncs() as syncs:
        ops_module.put(x, indices)
    assert syncs.total == 1, dict(syncs)


@pytest.mark.parametrize("workers", [1, 4])
def test_bucket_granularity_makes_no_host_synchronisation(workers: int) -> None:
    """Granularity "bucket" selects every part in one segmented kernel call: no copy of the
    parts' sets or of the segments to the host, and no wait."""
    sizes = [9_000, 64, 0, 10_936]
    for syncs in syncs_per_step(Compression.gtopk(0.01, granularity="bucket"), sizes, workers):
        assert syncs.total == 0, dict(syncs)
