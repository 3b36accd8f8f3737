"""The threshold schemes (MiCRO, ExDyna) on a torch state (a GPU's), checked on the CPU:

- the step's peak temporaries stay within the target when the accumulated magnitudes rise from
  step to step (the same gradient every step, as scripts/gpu/gpu_step.py steps): the accumulation
  pass keeps no candidates there, whose number has no bound (the GPU's first-step peak of
  2.0x the gradient was one such set and its keys);
- the kernel-layer calls of a step: one accumulation pass that selects nothing and leaves its
  histogram on the device (`ops.histogram_on_device`), then one
  `ops.threshold_indices_on_device` with a bound from the worker's histogram (the CUDA side's
  one read, no count pass, the count left on the device), never `ops.keep_at_or_above`;
- `ops.threshold_indices`'s bound and `ops.histogram_count_from` against a count by numpy;
- the torch operations of a build without CUDA kernels, in blocks, equal the C++ kernels.
"""

from __future__ import annotations

import numpy as np
import pytest
from helpers.device_like import device_like, device_like_cpu
from helpers.kernel_calls import kernel_calls
from helpers.thread_transport import ThreadGroup

from gtopk_hvd import ops
from gtopk_hvd.bench.memory import TARGET_SLACK, WARM_UP_D, Meter
from gtopk_hvd.compression import Compression
from gtopk_hvd.core import SparseStep
from gtopk_hvd.schemes import threshold as control
from gtopk_hvd.transports.local import LocalGroup

torch = pytest.importorskip("torch")

SCHEMES = {"micro": lambda: Compression.micro(0.001),
           "exdyna": lambda: Compression.exdyna(0.001)}
THRESHOLD_PATH = ("accumulate_threshold", "threshold_indices", "keep_at_or_above",
                  "magnitude_histogram", "histogram_on_device", "threshold_indices_on_device")


@pytest.mark.parametrize("call", ["update", "step"])
@pytest.mark.parametrize("scheme", list(SCHEMES))
def test_rising_magnitudes_make_no_large_temporary_on_a_torch_state(scheme: str,
                                                                    call: str) -> None:
    rising_steps(scheme, call, WARM_UP_D)  # what one process makes once is not a step's
    for step, temporaries in enumerate(rising_steps(scheme, call, 1 << 20)):
        assert temporaries <= TARGET_SLACK, (step, temporaries)


def rising_steps(scheme: str, call: str, d: int, steps: int = 4) -> list[float]:
    """Each step's peak temporaries (in gradients) on a torch CPU state, the same gradient every
    step, measured as `bench memory` measures (`Meter`)."""
    gradient = torch.from_numpy(np.random.default_rng(1).standard_normal(d).astype(np.float32))
    state = SparseStep(SCHEMES[scheme](), [d], LocalGroup(1).transports[0], device="cpu")
    peaks = []
    for _ in range(steps):
        work = gradient.clone()  # outside the measurement: the same gradient every step
        meter = Meter("torch-cpu")
        with meter.measure():
            if call == "update":
                state.update(work, work, clear_gradient=True)
            else:
                state.update(work)
        peaks.append(meter.peak / (4 * d))
        assert state.last_stats.global_entries <= 2 * state.last_stats.k
    return peaks


@pytest.mark.parametrize("workers", [1, 3])
@pytest.mark.parametrize("scheme", list(SCHEMES))
def test_a_torch_state_reads_the_partition_once_after_the_pass(scheme: str,
                                                               workers: int) -> None:
    d = 50_000

    def work(transport: object) -> list:
        state = SparseStep(SCHEMES[scheme](), [d], transport, device="cpu")
        ks = []
        for step in range(5):
            rng = np.random.default_rng([transport.rank, step])
            values = rng.standard_normal(d).astype(np.float32) * (1 + 3 * step)
            gradient = device_like(torch.from_numpy(values))
            state.update(gradient, gradient, clear_gradient=True)
            ks.append(state.last_stats.k)
        return ks

    with device_like_cpu(), kernel_calls(THRESHOLD_PATH) as calls:
        ks = ThreadGroup(workers).run(work)[0]
    assert not calls.named("keep_at_or_above") and not calls.named("accumulate_threshold")
    assert not calls.named("threshold_indices")
    assert len(calls.named("histogram_on_device")) == 5 * workers  # no candidates kept
    reads = calls.named("threshold_indices_on_device")
    assert len(reads) == 5 * workers  # one read of the partition a step
    for _, args, _, (indices, count) in reads:
        at_most, selected = args[4], int(count.as_subclass(torch.Tensor)[0])
        assert len(indices) == at_most and selected <= at_most <= selected + 2 * max(ks)


def test_numpy_state_keeps_its_candidates() -> None:
    """The host path is unchanged: the pass keeps candidates once a threshold is known."""
    d = 50_000
    state = SparseStep(Compression.micro(0.001), [d], LocalGroup(1).transports[0])
    seen = []
    real = ops.accumulate_threshold
    patch = pytest.MonkeyPatch()
    patch.setattr(ops, "accumulate_threshold",
                  lambda *a, **k: seen.append(a[4]) or real(*a, **k))
    try:
        for step in range(3):
            state.update(np.random.default_rng(step).standard_normal(d).astype(np.float32))
    finally:
        patch.undo()
    assert seen[0] == control.NO_KEY and all(key != control.NO_KEY for key in seen[1:])


@pytest.mark.parametrize("window", [control.window_around(0.7), control.window_under(5.0)],
                         ids=["around", "under"])
def test_histogram_count_from_bounds_the_count(window: control.Window) -> None:
    rng = np.random.default_rng(3)
    x = (rng.standard_t(3, 200_000) * 0.4).astype(np.float32)
    x[::997] = np.nan
    _, histogram = ops.accumulate_threshold(None, x, 100, 190_000, control.NO_KEY,
                                            **window.kernel_arguments())
    keys = np.abs(x[100:190_000]).view(np.uint32).astype(np.int64)
    keys = np.minimum(keys, 0x7F800001)
    for tau in (window.edge(0), window.edge(3), 0.69, 0.7, 0.83, 1.9, 4.9, 30.0, np.inf):
        key = ops.magnitude_key(float(tau))
        bound = window.count_from(histogram, key)
        count = int((keys >= key).sum())
        assert bound is not None and bound >= count
        b = int(ops.histogram_bin(np.int64(key - window.base_key), window.shift, window.n_bins,
                                  window.n_fine, window.coarse_shift))
        assert bound == int((keys >= ops.magnitude_key(window.edge(b))).sum()) or b == 0
        got = ops.threshold_indices(x, 100, 190_000, key, at_most=bound)
        np.testing.assert_array_equal(got, ops.threshold_indices(x, 100, 190_000, key))
    assert window.count_from(histogram, window.base_key - 1) is None or window.base_key == 0


@pytest.mark.parametrize("kind", ["numpy", "torch"])
def test_threshold_indices_refuses_a_bound_below_the_count(kind: str) -> None:
    x = np.arange(1, 101, dtype=np.float32)
    if kind == "torch":
        x = torch.from_numpy(x)
    key = ops.magnitude_key(50.0)
    assert len(ops.threshold_indices(x, 0, 100, key, at_most=51)) == 51
    with pytest.raises(RuntimeError, match="at_most=50"):
        ops.threshold_indices(x, 0, 100, key, at_most=50)


def test_torch_operations_in_blocks_equal_the_kernels(monkeypatch: pytest.MonkeyPatch) -> None:
    """The torch path of a build without CUDA kernels, with blocks smaller than the range."""
    monkeypatch.setattr(ops.threshold, "_TORCH_BLOCK", 1000)
    rng = np.random.default_rng(5)
    g = rng.standard_normal(10_500).astype(np.float32)
    r = rng.standard_normal(10_500).astype(np.float32)
    r[17] = np.nan
    window = control.window_around(1.2)
    key = ops.magnitude_key(1.5)
    want_r = r.copy()
    want = ops.accumulate_threshold(g.copy(), want_r, 333, 9_876, key,
                                    **window.kernel_arguments())
    tg, tr = torch.from_numpy(g.copy()), torch.from_numpy(r.copy())
    got = ops.threshold._torch_accumulate_threshold(tg, tr, 333, 9_876, key, clear_gradient=True,
                                          **window.kernel_arguments())
    np.testing.assert_array_equal(got[0].numpy(), want[0])
    np.testing.assert_array_equal(got[1], want[1])
    np.testing.assert_array_equal(tr.numpy(), want_r)
    assert not tg.any()
    got = ops.threshold._torch_threshold_indices(tr, 5, 10_400, key)
    np.testing.assert_array_equal(got.numpy(), ops.threshold_indices(want_r, 5, 10_400, key))
    assert ops.threshold._torch_threshold_indices(tr, 7, 7, key).numel() == 0


@pytest.mark.skipif(not (torch.cuda.is_available() and ops.cuda_built),
                    reason="needs a CUDA GPU and an extension built with nvcc")
@pytest.mark.parametrize("scheme", list(SCHEMES))
def test_cuda_rising_magnitudes_make_no_large_temporary(scheme: str) -> None:
    """scripts/gpu/gpu_step.py's case: the same gradient every step, the peak over the first
    steps (torch.cuda.max_memory_allocated) within the target beyond the residual, and the
    updates the numpy state's bit for bit."""
    d = 1 << 22
    host = np.random.default_rng(1).standard_normal(d).astype(np.float32)
    gradient = torch.from_numpy(host).cuda()
    on_gpu = SparseStep(SCHEMES[scheme](), [d], LocalGroup(1).transports[0], device="cuda")
    on_host = SparseStep(SCHEMES[scheme](), [d], LocalGroup(1).transports[0])
    for step in range(4):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        start = torch.cuda.memory_allocated()
        indices, values = on_gpu.update(gradient)
        torch.cuda.synchronize()
        assert (torch.cuda.max_memory_allocated() - start) / (4 * d) <= TARGET_SLACK, step
        want_indices, want_values = on_host.update(host)
        np.testing.assert_array_equal(indices, want_indices)
        np.testing.assert_array_equal(values, want_values)


def test_bench_select_micro_row_on_a_torch_state_selects_what_the_host_does() -> None:
    """`bench select`'s MiCRO row takes the torch state's path (no candidates, one bounded
    read) on tensors: the same indices as the host path."""
    from gtopk_hvd.bench.selection import micro_pass

    residual = np.random.default_rng(0).standard_normal(200_000).astype(np.float32)
    gradient = np.zeros_like(residual)
    k = 200
    tau = float(np.partition(np.abs(residual), residual.size - k)[residual.size - k])
    want = micro_pass(gradient, residual, 50_000, tau, k)
    got = micro_pass(torch.from_numpy(gradient), torch.from_numpy(residual.copy()), 50_000,
                     tau, k)
    assert want.size > 0
    np.testing.assert_array_equal(got.numpy(), want)
