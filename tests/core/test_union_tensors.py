"""The union schemes' exchanges on tensors (`gtopk_hvd.schemes.union`: gather_indices_tensors,
sum_at_tensors, sum_counted_tensors; `Transport.allreduce_sum_tensors`) against their host twins
on the same data: the same bits (the thread transport sums in rank order both ways), the same
residual, the same bytes and messages, at P = 1, 2, 3, 5; on DeviceLikeTensors (CPU tensors
with a CUDA tensor's refusals) without a host synchronisation, and on a GPU where there is one.
Every union scheme's step with its state in tensors (the exchanges above) against the numpy
state, bit for bit, at the same P. `ops.sorted_union` on CUDA against numpy's union1d."""

from __future__ import annotations

import numpy as np
import pytest
from helpers.device_like import device_like, device_like_cpu
from helpers.host_syncs import count_host_syncs
from helpers.thread_transport import ThreadGroup
from test_sparse_state_devices import assert_same_training, train

from gtopk_hvd import ops
from gtopk_hvd.backend import NUMPY
from gtopk_hvd.compression import Compression
from gtopk_hvd.reductions.result import ReductionStats
from gtopk_hvd.schemes import union
from gtopk_hvd.transports.base import Transport

torch = pytest.importorskip("torch")
D = 3000
WORKERS = [1, 2, 3, 5]
CUDA = pytest.mark.skipif(not (torch.cuda.is_available() and ops.cuda_built),
                          reason="needs a CUDA device and the CUDA kernels")


def stats_of(stats: ReductionStats) -> tuple:
    return stats.bytes_sent, stats.bytes_received, stats.messages_sent, stats.rounds


def taken_set(rank: int) -> np.ndarray:
    """Worker `rank`'s taken indices (as a selection leaves them: sorted, unique)."""
    rng = np.random.default_rng([12, rank])
    return np.sort(rng.choice(D, 60, replace=False)).astype(np.int32)


def worker_data(rank: int) -> tuple:
    """A residual with a -0.0 and this worker's taken set (zeroed in the residual, as a selection
    leaves it), and the global set I: the same on every worker, some of every worker's taken
    entries in it, some not."""
    rng = np.random.default_rng([11, rank])
    residual = rng.standard_normal(D).astype(np.float32)
    residual[7] = -0.0
    taken = taken_set(rank)
    residual[taken] = 0.0
    taken_values = rng.standard_normal(60).astype(np.float32)
    taken_values[0] = -0.0
    shared = np.random.default_rng(3).choice(D, 80, replace=False)
    indices = np.unique(np.concatenate([shared, [7]] + [taken_set(r)[::3] for r in range(5)]))
    return residual, indices.astype(np.int32), taken, taken_values


def as_tensor(x: np.ndarray, device: str | None) -> torch.Tensor:
    tensor = torch.from_numpy(x.copy())
    return device_like(tensor) if device is None else tensor.to(device)


def sum_at_both(transport: Transport, device: str | None) -> tuple:
    residual, indices, taken, taken_values = worker_data(transport.rank)
    host_stats, stats = ReductionStats(), ReductionStats()
    host_residual = residual.copy()
    want = union.sum_at(transport, NUMPY, host_residual, indices, host_stats,
                        taken=(taken, taken_values))
    on = as_tensor(residual, device)
    with count_host_syncs() as syncs:
        got = union.sum_at_tensors(transport, on, as_tensor(indices, device), stats,
                                   taken=(as_tensor(taken, device),
                                          as_tensor(taken_values, device)))
    plain = got.as_subclass(torch.Tensor).cpu().numpy()
    return (want, host_residual, stats_of(host_stats), plain,
            on.as_subclass(torch.Tensor).cpu().numpy(), stats_of(stats), syncs.total)


def check_sum_at(results: list) -> None:
    for want, host_residual, host_stats, got, residual, stats, syncs in results:
        assert got.tobytes() == want.tobytes()
        assert residual.tobytes() == host_residual.tobytes()
        assert stats == host_stats
        assert syncs == 0
    assert results[0][0].tobytes() == results[-1][0].tobytes()  # the same sum everywhere


@pytest.mark.parametrize("workers", WORKERS)
def test_sum_at_tensors_equals_sum_at(workers: int) -> None:
    """The values, the cleared residual and the bytes are the host's bit for bit, including
    taken entries inside and outside I and a -0.0 in the residual; no host synchronisation."""
    with device_like_cpu():
        results = ThreadGroup(workers).run(lambda t: sum_at_both(t, None))
    check_sum_at(results)
    residual, indices, taken, taken_values = worker_data(0)
    if workers == 1:  # V = acc at I, by hand: residual there, the taken value where taken
        expected = residual[indices].copy()
        inside = np.isin(taken, indices)
        expected[np.searchsorted(indices, taken[inside])] += taken_values[inside]
        assert results[0][0].tobytes() == expected.tobytes()


@pytest.mark.parametrize("workers", WORKERS)
def test_gather_indices_tensors_equals_gather_indices(workers: int) -> None:
    """Every worker's indices in rank order and the counts, uneven and empty sets included; the
    bytes and messages the host's."""

    def work(transport: Transport) -> tuple:
        rank = transport.rank
        mine = (np.arange((rank * 7) % 5, dtype=np.int32) * 3 + 100 * rank)
        host_stats, stats = ReductionStats(), ReductionStats()
        want, want_counts = union.gather_indices(transport, mine, host_stats)
        with count_host_syncs() as syncs:
            got, counts = union.gather_indices_tensors(transport, as_tensor(mine, None), stats)
        return (want, want_counts, stats_of(host_stats), got.as_subclass(torch.Tensor).numpy(),
                counts, stats_of(stats), syncs.total)

    with device_like_cpu():
        for want, want_counts, host_stats, got, counts, stats, syncs in (
                ThreadGroup(workers).run(work)):
            assert got.dtype == want.dtype and np.array_equal(got, want)
            assert np.array_equal(counts, want_counts)
            assert stats == host_stats
            assert syncs == 0


@pytest.mark.parametrize("workers", WORKERS)
def test_sum_counted_tensors_equals_sum_counted(workers: int) -> None:
    def work(transport: Transport) -> tuple:
        array = np.random.default_rng([4, transport.rank]).standard_normal(33).astype(
            np.float32)
        host_stats, stats = ReductionStats(), ReductionStats()
        want = union.sum_counted(transport, array.copy(), host_stats)
        tensor = as_tensor(array, None)
        union.sum_counted_tensors(transport, tensor, stats)
        default = as_tensor(array, None)  # the base class's way: through the host
        Transport.allreduce_sum_tensors(transport, [default])
        return (want, stats_of(host_stats), tensor.as_subclass(torch.Tensor).numpy(),
                stats_of(stats), default.as_subclass(torch.Tensor).numpy())

    with device_like_cpu():
        for want, host_stats, got, stats, default in ThreadGroup(workers).run(work):
            assert got.tobytes() == want.tobytes() == default.tobytes()
            assert stats == host_stats


UNION_SCHEMES = {
    "micro": lambda: Compression.micro(0.05),
    "exdyna": lambda: Compression.exdyna(0.05, blocks=16),
    "sketch": lambda: Compression.sketch(0.05, columns=64),
    "sketch-estimates": lambda: Compression.sketch(0.05, columns=64, second_round=False),
    "gtopk-exact": lambda: Compression.gtopk(0.05, exact=True, momentum_correction=True),
}


@pytest.mark.parametrize("workers", WORKERS)
@pytest.mark.parametrize("scheme", list(UNION_SCHEMES))
def test_union_schemes_on_tensors_equal_the_numpy_state(scheme: str, workers: int) -> None:
    """The step with its state in DeviceLikeTensors (the union exchanged as tensors) and in
    numpy (on the host): the same updates, residuals and velocities, bit for bit."""
    compression = UNION_SCHEMES[scheme]()
    assert_same_training(train(compression, None, workers, steps=4),
                         train(compression, "device-like-cpu", workers, steps=4))


@CUDA
@pytest.mark.parametrize("workers", WORKERS)
def test_sum_at_tensors_on_a_gpu_equals_sum_at(workers: int) -> None:
    """On CUDA tensors, the transport sending them as they are (as NCCL does): the host's bits."""

    def work(transport: Transport) -> tuple:
        transport.tensor_device = "cuda"
        return sum_at_both(transport, "cuda")

    check_sum_at(ThreadGroup(workers).run(work))


@CUDA
@pytest.mark.parametrize("workers", [2, 3, 5])
def test_gather_indices_tensors_on_a_gpu(workers: int) -> None:
    def work(transport: Transport) -> tuple:
        transport.tensor_device = "cuda"
        mine = np.arange((transport.rank * 7) % 5, dtype=np.int64) + 100 * transport.rank
        want, want_counts = union.gather_indices(transport, mine, ReductionStats())
        got, counts = union.gather_indices_tensors(transport, torch.from_numpy(mine).cuda(),
                                                   ReductionStats())
        return want, want_counts, got.cpu().numpy(), counts

    for want, want_counts, got, counts in ThreadGroup(workers).run(work):
        assert np.array_equal(got, want) and np.array_equal(counts, want_counts)


@CUDA
@pytest.mark.parametrize("dtype", [np.int32, np.int64])
@pytest.mark.parametrize(("n_a", "n_b"), [(0, 0), (0, 9), (500, 0), (1000, 700), (40000, 3)])
def test_cuda_sorted_union_equals_union1d(dtype: type, n_a: int, n_b: int) -> None:
    rng = np.random.default_rng([n_a, n_b])
    a = np.sort(rng.choice(60000, n_a, replace=False)).astype(dtype)
    b = np.sort(rng.choice(60000, n_b, replace=False)).astype(dtype)
    union_ = ops.sorted_union(torch.from_numpy(a).cuda(), torch.from_numpy(b).cuda())
    assert union_.is_cuda and union_.dtype == torch.from_numpy(a).dtype
    assert np.array_equal(union_.cpu().numpy(), np.union1d(a, b))
    assert np.array_equal(union_.cpu().numpy(), ops.sorted_union(a, b))
