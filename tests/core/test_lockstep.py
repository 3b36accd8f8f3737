"""Steps in lockstep (gtopk_hvd.lockstep): several buckets' steps sharing their host reads.

On a torch state whose transport sums and gathers tensors, MiCRO and ExDyna read the device
twice a step (the summed histogram, then every worker's count). Run in lockstep, as the DDP
hook runs an iteration's held buckets, B buckets make those two reads once each, with one wait each,
instead of 2 B times, and end exactly as the same steps run one at a time: the same updates,
residuals, thresholds and counts, bit for bit, with the collectives in the same order on every
worker. Checked here on DeviceLikeTensors (CPU tensors with a CUDA tensor's refusals) with
threads as workers; the CUDA side of the two kernels that leave their counts on the device is
tested in tests/ops/test_ops_cuda.py."""

from __future__ import annotations

import copy
import time

import numpy as np
import pytest
from helpers.device_like import device_like, device_like_cpu
from helpers.kernel_calls import kernel_calls
from helpers.thread_transport import ThreadGroup, ThreadTransport

from gtopk_hvd import ops
from gtopk_hvd.compression import Compression
from gtopk_hvd.core import SparseStep
from gtopk_hvd.lockstep import HostRead, OwnTime, Reply, drive, run_in_lockstep

torch = pytest.importorskip("torch")
SIZES = [30_000, 7_001, 52_000, 64]  # DDP buckets of unequal sizes, one tiny
STEPS = 4
SCHEMES = {
    "micro": lambda: Compression.micro(0.01),
    "exdyna": lambda: Compression.exdyna(0.01),
    "gtopk": lambda: Compression.gtopk(0.01),
    "micro-multiplicative": lambda: Compression.micro(0.01, controller="multiplicative"),
}
WAITING = ("read_to_host", "accumulate_threshold", "threshold_indices", "magnitude_histogram",
           "threshold_histogram", "largest_finite_magnitude", "read_flag")


def gradients(rank: int, step: int) -> list[np.ndarray]:
    rng = np.random.default_rng([rank, step])
    scale = 1.0 + 0.5 * step  # the magnitudes move between steps: the threshold is re-measured
    return [(scale * rng.standard_normal(n) * rng.uniform(0.1, 3.0)).astype(np.float32)
            for n in SIZES]


def run(make: object, workers: int, lockstep: bool) -> list:
    """Every worker's (updates, residuals, thresholds, waiting calls) per step."""

    def work(transport: object) -> list:
        steps = [SparseStep(make(), [n], transport, device="cpu") for n in SIZES]
        record = []
        for step in range(STEPS):
            buffers = [device_like(torch.from_numpy(g)) for g in gradients(transport.rank, step)]
            phases = [sparse.phases(buffer, buffer, clear_gradient=True)
                      for sparse, buffer in zip(steps, buffers)]
            # the patch is the module's, seen by every thread: counted with one worker only
            with kernel_calls(WAITING if transport.size == 1 else ()) as calls:
                if lockstep:
                    run_in_lockstep(phases)
                else:
                    for generator in phases:
                        drive(generator)
            record.append((
                [b.as_subclass(torch.Tensor).numpy().tobytes() for b in buffers],
                [s.residual.as_subclass(torch.Tensor).numpy().tobytes() for s in steps],
                [getattr(s.scheme, "threshold", None) for s in steps],
                [s.last_stats.global_entries for s in steps], calls.counts()))
        return record

    with device_like_cpu():
        return ThreadGroup(workers, check_phases=True).run(work)


@pytest.mark.parametrize("workers", [1, 3])
@pytest.mark.parametrize("scheme", list(SCHEMES))
def test_lockstep_equals_the_steps_one_at_a_time(scheme: str, workers: int) -> None:
    alone = run(SCHEMES[scheme], workers, lockstep=False)
    together = run(SCHEMES[scheme], workers, lockstep=True)
    for rank in range(workers):
        for step in range(STEPS):
            assert together[rank][step][:4] == alone[rank][step][:4], (rank, step)
    selected = [entries for record in together[0] for entries in record[3]]
    assert min(selected) > 0


@pytest.mark.parametrize("scheme", ["micro", "exdyna"])
def test_lockstep_reads_the_device_twice_a_step_whatever_the_buckets(scheme: str) -> None:
    """After the first step (whose window hangs from the largest |acc|, one more read), a
    threshold scheme's step reads the device twice; B buckets in lockstep read twice in all,
    one at a time 2 B times; no kernel that waits inside is called."""
    buckets = len(SIZES)
    for lockstep, reads in ((True, 2), (False, 2 * buckets)):
        record = run(SCHEMES[scheme], 1, lockstep)[0]
        for step in range(1, STEPS):
            calls = record[step][4]
            assert dict(calls) == {"read_to_host": reads}, (lockstep, step, dict(calls))


def test_run_in_lockstep_advances_phase_by_phase_in_list_order() -> None:
    """Each generator is advanced to its next read in list order; one wait a phase; a
    generator with fewer reads (or none) finishes early; results in list order."""
    trace = []

    def steps(name: str, reads: int) -> object:
        seen = []
        for phase in range(reads):
            trace.append((name, phase))
            (value,) = yield HostRead((torch.tensor([10 * phase + len(name)]),))
            seen.append(int(value[0]))
        trace.append((name, "done"))
        return name, seen

    with kernel_calls(("read_to_host",)) as calls:
        results = run_in_lockstep([steps("a", 2), steps("bb", 0), steps("ccc", 1)])
    assert results == [("a", [1, 11]), ("bb", []), ("ccc", [3])]
    assert trace == [("a", 0), ("bb", "done"), ("ccc", 0), ("a", 1), ("ccc", "done"),
                     ("a", "done")]
    assert calls.counts()["read_to_host"] == 2


def test_own_times_in_lockstep_leave_out_the_other_steps_phases() -> None:
    """A step's OwnTime counts its own work and its share of each shared wait, not the time
    it stood at a read while the other steps ran: each at least its own work, and all of them
    together at most the wall time of the run (time at a read counted as the step's would
    count each step's 30 ms of work in the two others' times too)."""
    work, clocks = 0.01, []

    def steps(value: int) -> object:
        clock = OwnTime()
        clocks.append(clock)
        for _ in range(2):
            time.sleep(work)
            (got,) = yield from clock.read((torch.tensor([value]),))
            assert isinstance(got, np.ndarray) and int(got[0]) == value
        time.sleep(work)
        return clock.seconds()

    start = time.perf_counter()
    own = run_in_lockstep([steps(value) for value in range(3)])
    wall = time.perf_counter() - start
    assert min(own) >= 3 * work
    assert sum(own) <= wall, (own, wall)
    reply = Reply((np.arange(2),), 0.5)
    copied = copy.copy(reply)
    assert isinstance(copied, Reply) and copied.wait_seconds == 0.5


def test_the_buckets_select_seconds_in_lockstep_add_up_to_at_most_the_wall_time() -> None:
    """MiCRO's select_seconds per bucket (`last_stats`) in lockstep: the sum over the buckets
    at most the lockstep's wall time, each bucket's positive."""
    with device_like_cpu():
        transport = ThreadTransport(ThreadGroup(1), 0)
        steps = [SparseStep(Compression.micro(0.01), [n], transport, device="cpu")
                 for n in SIZES]
        for step in range(3):
            buffers = [device_like(torch.from_numpy(g)) for g in gradients(0, step)]
            start = time.perf_counter()
            run_in_lockstep([sparse.phases(buffer, buffer, clear_gradient=True)
                             for sparse, buffer in zip(steps, buffers)])
            wall = time.perf_counter() - start
        selects = [sparse.last_stats.select_seconds for sparse in steps]
    assert min(selects) > 0 and sum(selects) <= wall, (selects, wall)


def test_a_step_that_raises_in_lockstep_closes_the_others() -> None:
    """The error comes out of run_in_lockstep as it was raised, and every other step is
    closed where it stood (its cleanup runs), not left suspended."""
    closed = []

    def steps(name: str, fail: bool) -> object:
        try:
            yield HostRead((torch.tensor([1]),))
            if fail:
                raise ValueError(f"{name} failed")
            yield HostRead((torch.tensor([2]),))
        finally:
            closed.append(name)

    # held here, so that Python does not close them itself when the error frees them
    held = [steps("a", False), steps("b", True), steps("c", False)]
    with pytest.raises(ValueError, match="b failed"):
        run_in_lockstep(held)
    assert sorted(closed) == ["a", "b", "c"]

    def cleanup_raises() -> object:
        try:
            yield HostRead((torch.tensor([1]),))
            yield HostRead((torch.tensor([2]),))
        finally:
            raise RuntimeError("a cleanup")

    closed.clear()
    held = [cleanup_raises(), steps("b", True), steps("c", False)]
    with pytest.raises(ValueError, match="b failed"):  # the first error, not the cleanup's
        run_in_lockstep(held)
    assert sorted(closed) == ["b", "c"]


def test_the_device_kernels_equal_the_ones_that_wait() -> None:
    """`histogram_on_device` is accumulate_threshold's histogram and accumulation;
    `threshold_indices_on_device` with a bound is threshold_indices; a bound that is not one
    raises when the indices are taken."""
    rng = np.random.default_rng(5)
    gradient = rng.standard_normal(50_000).astype(np.float32)
    residual = rng.standard_normal(50_000).astype(np.float32)
    window = {"histogram_base_key": ops.magnitude_key(0.5), "histogram_shift": 17,
              "n_bins": 93, "n_fine": 64, "coarse_shift": 20}
    want_residual, want_gradient = residual.copy(), gradient.copy()
    _, want = ops.accumulate_threshold(want_gradient, want_residual, 1_000, 40_000, 0xFFFFFFFF,
                                       window["histogram_base_key"], 17, 93, True, 64, 20)
    with device_like_cpu():
        got_gradient = device_like(torch.from_numpy(gradient.copy()))
        got_residual = device_like(torch.from_numpy(residual.copy()))
        histogram = ops.histogram_on_device(got_gradient, got_residual, 1_000, 40_000,
                                            clear_gradient=True, **window)
        assert isinstance(histogram, torch.Tensor) and histogram.dtype == torch.int64
        (host,) = ops.read_to_host([histogram])
        np.testing.assert_array_equal(host, want)
        assert got_residual.as_subclass(torch.Tensor).numpy().tobytes() == want_residual.tobytes()
        assert not got_gradient.as_subclass(torch.Tensor).any()
        key = ops.magnitude_key(2.0)
        expected = ops.threshold_indices(want_residual, 1_000, 40_000, key)
        bound = int(expected.size) + 17
        indices, count = ops.threshold_indices_on_device(got_residual, 1_000, 40_000, key, bound)
        assert indices.numel() == bound and count.dtype == torch.int64
        (n,) = ops.read_to_host([count])
        taken = ops.selected_indices(indices, int(n[0]))
        np.testing.assert_array_equal(taken.as_subclass(torch.Tensor).numpy(), expected)
        short, count = ops.threshold_indices_on_device(got_residual, 1_000, 40_000, key, 3)
        with pytest.raises(RuntimeError, match="more than the bound at_most=3"):
            ops.selected_indices(short, int(ops.read_to_host([count])[0][0]))


def test_read_to_host_keeps_each_dtype() -> None:
    values = [torch.tensor([3, -(2 ** 40)]), torch.tensor([1.5, -0.25], dtype=torch.float32),
              torch.tensor([7], dtype=torch.int32)]
    got = ops.read_to_host(values)
    assert [a.dtype for a in got] == [np.int64, np.float32, np.int32]
    for a, t in zip(got, values):
        np.testing.assert_array_equal(a, t.numpy())
    arrays = (np.arange(3),)
    assert ops.read_to_host(arrays)[0] is arrays[0]


@pytest.mark.skipif(not (torch.cuda.is_available() and ops.cuda_built),
                    reason="needs a CUDA GPU and an extension built with nvcc")
@pytest.mark.parametrize("scheme", ["micro", "exdyna"])
def test_lockstep_on_a_gpu_equals_the_steps_one_at_a_time(scheme: str) -> None:
    """The CUDA kernels that leave their counts on the device, through the step: B buckets of
    a CUDA state in lockstep end as one at a time, bit for bit (P = 1)."""
    def work(transport: object, lockstep: bool) -> list:
        steps = [SparseStep(SCHEMES[scheme](), [n], transport, device="cuda") for n in SIZES]
        out = []
        for step in range(STEPS):
            buffers = [torch.from_numpy(g).cuda() for g in gradients(0, step)]
            phases = [sparse.phases(buffer, buffer, clear_gradient=True)
                      for sparse, buffer in zip(steps, buffers)]
            if lockstep:
                run_in_lockstep(phases)
            else:
                for generator in phases:
                    drive(generator)
            out.append([b.cpu().numpy().tobytes() for b in buffers]
                       + [s.residual.cpu().numpy().tobytes() for s in steps])
        return out

    alone = ThreadGroup(1).run(lambda transport: work(transport, False))
    together = ThreadGroup(1).run(lambda transport: work(transport, True))
    assert together == alone


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_the_hook_steps_buckets_in_their_own_buffers_in_lockstep_and_cast_ones_alone(
        dtype: str) -> None:
    """The hook's `_step_together` (DDP's held buckets, MiCRO on a torch state): float32
    buckets, stepped in their own buffers, share their reads (two in all); buckets cast to
    float32 for the step are stepped one at a time (two reads each), so that one cast copy is
    alive at a time, not every bucket's."""
    from gtopk_hvd.bench.memory import Meter
    from gtopk_hvd.torch.ddp import GTopkHookState, _step_together

    n, buckets = 400_000, 4
    torch_dtype = getattr(torch, dtype)

    def work(transport: object) -> tuple:
        hook = GTopkHookState(compression=Compression.micro(0.01), start_iter=2)
        hook.active_transport = transport
        steps = [SparseStep(hook.compression, [n], transport, device="cpu")
                 for _ in range(buckets)]
        reads, peak = [], 0.0
        for step in range(3):
            rng = np.random.default_rng(step)
            buffers = [torch.from_numpy(rng.standard_normal(n).astype(np.float32)).to(torch_dtype)
                       for _ in range(buckets)]
            meter = Meter("torch-cpu")
            with kernel_calls(("read_to_host",)) as calls, meter.measure():
                assert not _step_together(hook, list(zip(steps, buffers))).skipped()
            reads.append(calls.counts()["read_to_host"])
            peak = max(peak, meter.peak / (4 * n))
        return reads, peak

    reads, peak = ThreadGroup(1).run(work)[0]
    if dtype == "float32":
        assert reads[1:] == [2, 2], reads
    else:
        assert peak < 1.5, peak  # one float32 copy of one bucket (and small sets), not four
        assert reads[1:] == [2 * buckets] * 2, reads


@pytest.mark.parametrize("workers", [1, 3])
def test_a_threshold_that_falls_below_the_window_looks_lower_as_the_host_path(
        workers: int) -> None:
    """A gradient that cancels the residual makes tau fall by far more than half an octave: the
    window holds fewer than k, and the step on tensors counts the 20 octaves below (a read of
    its own, the same on every worker) with the host path's result bit for bit."""
    sizes = SIZES[:2]

    def work(transport: object) -> list:
        host = [SparseStep(Compression.micro(0.01), [n], transport) for n in sizes]
        device = [SparseStep(Compression.micro(0.01), [n], transport, device="cpu")
                  for n in sizes]
        out = []
        for step in range(5):
            values = gradients(transport.rank, step)[:2]
            if step == 3:  # the residual cancelled, down to a trace
                values = [(-h.residual + 1e-3 * v).astype(np.float32)
                          for h, v in zip(host, values)]
            on_host = [v.copy() for v in values]
            for sparse, buffer in zip(host, on_host):
                sparse.update(buffer, buffer, clear_gradient=True)
            on_device = [device_like(torch.from_numpy(v.copy())) for v in values]
            run_in_lockstep([sparse.phases(buffer, buffer, clear_gradient=True)
                             for sparse, buffer in zip(device, on_device)])
            out.append([h.tobytes() == d.as_subclass(torch.Tensor).numpy().tobytes()
                        for h, d in zip(on_host, on_device)])
        return out

    with device_like_cpu(), kernel_calls(("histogram_on_device",)) as calls:
        results = ThreadGroup(workers, check_phases=True).run(work)
    assert all(all(step) for record in results for step in record), results
    looked_lower = [args for _, args, _, _ in calls.named("histogram_on_device")
                    if args[0] is None]
    assert len(looked_lower) >= workers  # at least one bucket on every worker
