"""A step skipped on the device (`gtopk_hvd.core.skip`), tested without a GPU.

With nonfinite="propagate", the DDP hook on a GPU can leave the skip decision in a device flag
that the step's kernels read, instead of reading it on the host (which waits for the whole
backward). Here the torch state lives on CPU tensors that refuse what a CUDA tensor refuses
(tests/helpers/device_like.py), and every check compares with the host-decided skip:

- each kernel with a set flag leaves its state bit-equal and returns a valid set (the sketch's
  table: that of the residual as it is); with a clear flag it equals the call without one;
- `SparseStep.update` with device flags (`Skip.on_device`) equals the host-decided steps bit for
  bit (updates, residual, velocity) for Top-k, gTop-k, exact gTop-k, momentum correction,
  granularity "bucket", a warm-up whose k follows the step count (corrected one step later) and the
  sketch (with and without its second round), on one worker and on 2, 3 and 5 thread workers
  (the flag summed over them as tensors);
- the hook with skip_on_device=True equals skip_on_device=False, iteration by iteration, and
  reads no flag of the iteration it is stepping: the decision reaches the host only when
  `last_iteration_skipped` (or iter) is read, or at a later step.
"""

from __future__ import annotations

import numpy as np
import pytest
from helpers.device_like import device_like, device_like_cpu
from helpers.host_syncs import count_host_syncs, count_kernel_host_reads
from helpers.thread_transport import ThreadGroup
from test_ddp_hook_costs import device_like_buckets, one_worker  # noqa: F401 (fixtures)

from gtopk_hvd import ops
from gtopk_hvd.compression import Compression
from gtopk_hvd.core import SparseStep
from gtopk_hvd.core.skip import Skip
from gtopk_hvd.schemes.sketch import sketch_keys

torch = pytest.importorskip("torch")

SIZES = [400, 1, 350, 249]
D = sum(SIZES)


def flag(value: int) -> torch.Tensor:
    return device_like(torch.tensor([value], dtype=torch.int32))


def gradient_of(rank: int, step: int, bad: bool) -> np.ndarray:
    gradient = np.random.default_rng([rank, step]).standard_normal(D).astype(np.float32)
    if bad:
        gradient[17] = np.inf if step % 2 else np.nan
    return gradient


# -- the kernels ---------------------------------------------------------------------------

@pytest.mark.parametrize("segmented", [False, True])
@pytest.mark.parametrize("clear", [False, True])
def test_a_set_flag_leaves_the_residual_and_selects_from_it(segmented: bool,
                                                            clear: bool) -> None:
    rng = np.random.default_rng(3)
    residual = device_like(torch.from_numpy(rng.standard_normal(D).astype(np.float32)))
    gradient = device_like(torch.from_numpy(rng.standard_normal(D).astype(np.float32)))
    before, gradient_before = residual.clone(), gradient.clone()
    offsets, ks = [0, 400, 401, 751, D], [8, 1, 7, 5]

    def select(g: torch.Tensor, r: torch.Tensor, skip: torch.Tensor | None) -> tuple:
        if segmented:
            return ops.segmented_accumulate_select(g, r, offsets, ks, clear, skip)
        return ops.accumulate_select(g, r, 21, clear_gradient=clear, skip=skip)

    indices, values = select(gradient, residual, flag(1))
    assert torch.equal(residual, before)
    assert bool((gradient == 0).all()) if clear else torch.equal(gradient, gradient_before)
    want_indices, want_values = select(None, before.clone(), None)  # the residual's own sets
    assert torch.equal(indices.long(), want_indices.long())
    assert torch.equal(values, want_values)

    gradient.copy_(gradient_before)
    got = select(gradient, residual, flag(0))
    plain_residual, plain_gradient = before.clone(), gradient_before.clone()
    want = select(plain_gradient, plain_residual, None)
    assert all(torch.equal(a, b) for a, b in zip(got, want))
    assert torch.equal(residual, plain_residual) and torch.equal(gradient, plain_gradient)


@pytest.mark.parametrize("clear", [False, True])
def test_a_set_flag_leaves_the_residual_and_sketches_it(clear: bool) -> None:
    rng = np.random.default_rng(5)
    residual = device_like(torch.from_numpy(rng.standard_normal(D).astype(np.float32)))
    gradient = device_like(torch.from_numpy(rng.standard_normal(D).astype(np.float32)))
    before, gradient_before = residual.clone(), gradient.clone()
    keys, columns = sketch_keys(3, 7), 64

    table = ops.sketch_table(gradient, residual, keys, columns, clear, skip=flag(1))
    assert torch.equal(residual, before)
    assert bool((gradient == 0).all()) if clear else torch.equal(gradient, gradient_before)
    assert torch.equal(table, ops.sketch_table(None, before.clone(), keys, columns))

    gradient.copy_(gradient_before)
    got = ops.sketch_table(gradient, residual, keys, columns, clear, skip=flag(0))
    plain_residual, plain_gradient = before.clone(), gradient_before.clone()
    assert torch.equal(got, ops.sketch_table(plain_gradient, plain_residual, keys, columns,
                                             clear))
    assert torch.equal(residual, plain_residual) and torch.equal(gradient, plain_gradient)


def test_the_other_writes_follow_the_flag() -> None:
    rng = np.random.default_rng(4)
    x = device_like(torch.from_numpy(rng.standard_normal(50).astype(np.float32)))
    g = device_like(torch.from_numpy(rng.standard_normal(50).astype(np.float32)))
    indices = device_like(torch.tensor([3, 9, 9, 40]))
    values = device_like(torch.tensor([1.0, 2.0, 3.0, 4.0]))
    restore = device_like(torch.tensor([True, False, True, True]))
    for value in (1, 0):
        for write in (lambda t, s: ops.momentum_update(t, g, 0.9, 2.0, s),
                      lambda t, s: ops.zero_at(t, indices, s),
                      lambda t, s: ops.restore_residual(t, indices[[0, 1, 3]],
                                                        values[[0, 1, 3]],
                                                        restore[[0, 1, 3]], s)):
            got, want = x.clone(), x.clone()
            write(got, flag(value))
            if value == 0:
                write(want, None)
            assert torch.equal(got, want)
    out = device_like(torch.empty(50))
    ops.write_sparse(out, indices[[0, 1, 3]], values[[0, 1, 3]], flag(1))
    assert bool(torch.isnan(out).all())
    ops.write_sparse(out, indices[[0, 1, 3]], values[[0, 1, 3]], flag(0))
    want = torch.zeros(50)
    want[[3, 9, 40]] = torch.tensor([1.0, 2.0, 4.0])
    assert torch.equal(out, want)


# -- the step ------------------------------------------------------------------------------

CONFIGS = {
    "gtopk": Compression.gtopk(0.02),
    "topk": Compression.topk(0.02),
    "exact": Compression.gtopk(0.02, exact=True),
    "momentum": Compression.gtopk(0.02, momentum_correction=True),
    "bucket": Compression.gtopk(0.02, granularity="bucket"),
    "warmup": Compression.topk(0.01, warmup_densities=(0.2, 0.1, 0.05), warmup_steps=3),
    "sketch": Compression.sketch(0.02),
    "sketch-estimates": Compression.sketch(0.02, second_round=False),
}
BAD = {1: (0,), 3: (0,), 4: (1,)}  # step -> ranks whose gradient holds a NaN / Inf


def run_steps(compression: object, transport: object, on_device: bool,
              steps: int = 7) -> tuple[list[np.ndarray], np.ndarray, np.ndarray | None, list]:
    """One worker's updates, residual, velocity and (step count, skipped) after each step."""
    state = SparseStep(compression, SIZES, transport, device="cpu")
    updates, counts = [], []
    for step in range(steps):
        bad = transport.rank in BAD.get(step, ())
        gradient = device_like(torch.from_numpy(gradient_of(transport.rank, step, bad)))
        out = device_like(torch.empty(D))
        if on_device:
            assert state.skips_on_device
            mark = ops.nonfinite_flag(gradient)
            ops.mark_nonfinite(gradient, mark)
            if transport.size > 1:
                transport.allreduce_sum_tensors([mark])
            skip = Skip.on_device(mark)
            if transport.size == 1:  # the counters patch the module: one thread at a time
                with count_host_syncs() as outside, count_kernel_host_reads() as kernels:
                    state.update(gradient, out, clear_gradient=True, skip=skip)
                assert outside.total + kernels.total == 0, (dict(outside), dict(kernels))
            else:
                state.update(gradient, out, clear_gradient=True, skip=skip)
            assert not skip._later.read  # decided on the device: not read by the step
        else:
            state.update(gradient, out, clear_gradient=True)
        updates.append(out.cpu().numpy())
        counts.append((state.step_count, state.skipped_steps, state.last_stats.skipped,
                       state.last_stats.k))
    velocity = None if state.velocity is None else state.velocity.cpu().numpy()
    return updates, state.residual.cpu().numpy(), velocity, counts


@pytest.mark.parametrize("name", sorted(CONFIGS))
@pytest.mark.parametrize("workers", [1, 2, 3, 5])
def test_steps_skipped_on_the_device_equal_those_skipped_on_the_host(name: str,
                                                                     workers: int) -> None:
    if name in ("momentum", "warmup", "bucket", "sketch-estimates") and workers in (2, 5):
        pytest.skip("covered at 1 and 3 workers")
    compression = CONFIGS[name]

    def both(transport: object) -> tuple:
        return (run_steps(compression, transport, False),
                run_steps(compression, transport, True))

    with device_like_cpu():
        results = ThreadGroup(workers).run(both)
    for rank, (host, device) in enumerate(results):
        (h_updates, h_residual, h_velocity, h_counts) = host
        (d_updates, d_residual, d_velocity, d_counts) = device
        for step, (want, got) in enumerate(zip(h_updates, d_updates, strict=True)):
            skipped = any(r < workers for r in BAD.get(step, ()))
            assert bool(np.isnan(got).all()) == skipped, (rank, step)
            assert got.tobytes() == want.tobytes(), (rank, step)
        assert d_residual.tobytes() == h_residual.tobytes(), rank
        if h_velocity is not None:
            assert d_velocity.tobytes() == h_velocity.tobytes(), rank
        assert d_counts == h_counts, rank


def test_a_scheme_that_cannot_reads_the_flag_first() -> None:
    """MiCRO keeps thresholds on the host: given a device flag it reads the flag and skips as
    before (the same updates and state as a host decision)."""
    compression = Compression.micro(0.02)
    with device_like_cpu():
        host, device = ThreadGroup(1).run(
            lambda t: (run_steps(compression, t, False, 3), _micro_on_device(compression, t)))[0]
    assert [u.tobytes() for u in host[0]] == [u.tobytes() for u in device[0]]
    assert host[1].tobytes() == device[1].tobytes()


def _micro_on_device(compression: object, transport: object) -> tuple:
    state = SparseStep(compression, SIZES, transport, device="cpu")
    assert not state.skips_on_device
    updates = []
    for step in range(3):
        gradient = device_like(torch.from_numpy(gradient_of(0, step, 0 in BAD.get(step, ()))))
        mark = ops.nonfinite_flag(gradient)
        ops.mark_nonfinite(gradient, mark)
        out = device_like(torch.empty(D))
        state.update(gradient, out, clear_gradient=True, skip=Skip.on_device(mark))
        updates.append(out.cpu().numpy())
    return updates, state.residual.cpu().numpy()


# -- the DDP hook ----------------------------------------------------------------------------

@pytest.mark.parametrize("compression", [Compression.gtopk(0.02),
                                         Compression.topk(0.01, momentum_correction=True,
                                                          warmup_densities=(0.2, 0.1),
                                                          warmup_steps=2),
                                         Compression.sketch(0.02)],
                         ids=["gtopk", "topk-momentum-warmup", "sketch"])
@pytest.mark.usefixtures("one_worker", "device_like_buckets")
def test_the_hook_decides_on_the_device_as_on_the_host(compression: object) -> None:
    """skip_on_device=True against False on the same buckets (a NaN in iterations 5 and 6):
    equal gradients bit for bit, equal iter and last_iteration_skipped once read; the device
    path reads no flag of the iteration it steps (an earlier one at most)."""
    from test_ddp import run_hook
    from test_ddp_hook_costs import SIZES as BUCKET_SIZES
    from test_ddp_hook_costs import make_buckets, split

    from gtopk_hvd.torch.ddp import GTopkHookState

    states = {way: GTopkHookState(compression=compression, start_iter=2, skip_on_device=way)
              for way in (False, True)}
    parameters = [split(n, 4, torch.float32) for n in BUCKET_SIZES]
    for step in range(9):
        got = {}
        for way, state in states.items():
            buckets = make_buckets(step, parameters, torch.float32, bad=step in (5, 6))
            with count_host_syncs() as outside, count_kernel_host_reads() as kernels:
                gradients = run_hook(state, buckets)
            got[way] = [g.cpu() for g in gradients]
            unresolved = state._unresolved
            if way and step >= 3:  # a sparse iteration decided on the device
                assert outside.total + kernels.total == 0, (dict(outside), dict(kernels))
                assert unresolved is not None and not unresolved._later.read
        for want, have in zip(got[False], got[True], strict=True):
            assert have.numpy().tobytes() == want.numpy().tobytes(), step
        if step in (4, 6, 8):  # read now and then: the device path's counts catch up
            assert states[True].last_iteration_skipped == states[False].last_iteration_skipped
            assert states[True].iter == states[False].iter
    for index, bucket in states[False].buckets.items():
        other = states[True].buckets[index].step
        assert other.residual.cpu().numpy().tobytes() == (
            bucket.step.residual.cpu().numpy().tobytes())
        assert other.step_count == bucket.step.step_count
        assert other.skipped_steps == bucket.step.skipped_steps == 2
