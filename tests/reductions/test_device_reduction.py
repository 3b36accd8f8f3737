"""gTop-k's reduction on the state's device (`gtopk_hvd.reductions.gtopk_device`), on workers
that are threads (tests/helpers/thread_transport.py, whose `sendrecv_tensors` takes CPU tensors,
as torch.distributed takes a GPU's under NCCL), with CPU tensors that refuse numpy conversions
outside the kernel layer (tests/helpers/device_like.py): every P's schedule (powers of two and
folds), every wire dtype, equals the host reduction bit for bit (indices, values, residuals,
bytes), and the global set never leaves the tensors; exact gTop-k's sum at the global set
too (an all-reduce of tensors, `gtopk_hvd.schemes.union.sum_at_tensors`). Under torchrun the
same through torch.distributed: tests/mpi/torchrun_transport.py."""

from __future__ import annotations

import numpy as np
import pytest
from helpers.device_like import device_like, device_like_cpu
from helpers.thread_transport import ThreadGroup

from gtopk_hvd.compression import Compression
from gtopk_hvd.core import SparseStep
from gtopk_hvd.lockstep import drive
from gtopk_hvd.reductions.gtopk_device import DeviceGTopkReducer

torch = pytest.importorskip("torch")
SIZES = [700, 1, 299]


def run(compression: object, workers: int, on_device: bool, steps: int = 4) -> list:
    """Every worker's (updates, residual, bytes sent, reducer types) as numpy."""

    def work(transport: object) -> tuple:
        state = SparseStep(compression, SIZES, transport, device="cpu" if on_device else None)
        updates, sent = [], []
        for step in range(steps):
            gradient = np.random.default_rng([transport.rank, step]).standard_normal(
                sum(SIZES)).astype(np.float32) * (1 + step)
            out = np.empty(sum(SIZES), np.float32)
            if on_device:
                out = device_like(torch.from_numpy(out))
                gradient = device_like(torch.from_numpy(gradient))
            update = state.update(gradient, out, clear_gradient=True)
            updates.append(update.cpu().numpy() if on_device else update.copy())
            sent.append(state.last_stats.bytes_sent)
        residual = state.residual.cpu().numpy() if on_device else state.residual.copy()
        reducers = {type(r) for r in getattr(state.scheme.reduction, "_reducers", {}).values()}
        return updates, residual, sent, reducers

    if not on_device:
        return ThreadGroup(workers).run(work)
    with device_like_cpu():
        return ThreadGroup(workers).run(work)


@pytest.mark.parametrize("wire_dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("workers", [2, 3, 5, 8])
def test_device_reduction_equals_the_host_one_bit_for_bit(workers: int, wire_dtype: str) -> None:
    compression = Compression.gtopk(0.03, wire_dtype=wire_dtype, momentum_correction=True)
    host, device = run(compression, workers, False), run(compression, workers, True)
    for rank, ((updates, residual, sent, _), (d_updates, d_residual, d_sent, reducers)) in (
            enumerate(zip(host, device, strict=True))):
        assert reducers == {DeviceGTopkReducer}, reducers
        for step, (want, got) in enumerate(zip(updates, d_updates, strict=True)):
            assert got.tobytes() == want.tobytes(), (rank, step)
        assert d_residual.tobytes() == residual.tobytes(), rank
        assert d_sent == sent, rank
    assert all(np.count_nonzero(u) for u in device[0][0])


def test_the_global_set_stays_in_tensors() -> None:
    """update() hands host arrays to its caller; inside (`phases`), the reduction's result is
    tensors."""

    def work(transport: object) -> tuple:
        state = SparseStep(Compression.gtopk(0.05), SIZES, transport, device="cpu")
        gradient = device_like(torch.arange(sum(SIZES), dtype=torch.float32))
        inside = drive(state.phases(gradient))
        return type(inside[0]), type(inside[1])

    with device_like_cpu():
        for types in ThreadGroup(4).run(work):
            assert all(issubclass(t, torch.Tensor) for t in types), types


@pytest.mark.parametrize("workers", [1, 2, 3, 5])
def test_topk_allgather_on_tensors_equals_the_host_one_bit_for_bit(
        workers: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Top-k's all-gather of the sets as tensors, merged in rank order there: the host's sums
    in rank order, bit for bit; bytes as a ring all-gather of the sets (no counts gathered)."""
    from gtopk_hvd.reductions import allgather

    calls = []
    gather = allgather.allgather_tensors
    monkeypatch.setattr(allgather, "allgather_tensors",
                        lambda *args: calls.append(1) or gather(*args))
    compression = Compression.topk(0.03, momentum_correction=True)
    host, device = run(compression, workers, False), run(compression, workers, True)
    assert len(calls) == workers * 4
    k = -(-3 * sum(SIZES) // 100)
    for (updates, residual, _, _), (d_updates, d_residual, d_sent, _) in zip(host, device,
                                                                          strict=True):
        for want, got in zip(updates, d_updates, strict=True):
            assert got.tobytes() == want.tobytes()
        assert d_residual.tobytes() == residual.tobytes()
        assert d_sent == [(4 + 4) * k * (workers - 1)] * 4


@pytest.mark.parametrize("order", ["sorted", "unsorted", "duplicates"])
def test_topk_allgather_of_one_worker_is_the_sum_from_zero(order: str) -> None:
    """One worker: an index-sorted set is returned without a collective, each value + 0.0 (a
    lone -0.0 becomes +0.0, NaN stays NaN) as np.add.at into zeros gives; a set out of order
    or with a repeated index goes the general way (np.unique sorts it and sums repeats)."""
    from gtopk_hvd.reductions.allgather import allgather_sets
    from gtopk_hvd.transports.local import LocalGroup

    rng = np.random.default_rng(3)
    indices = np.sort(rng.choice(10_000, 300, replace=False)).astype(np.int32)
    values = rng.standard_normal(300).astype(np.float32)
    values[[0, 7]] = [-0.0, np.nan]
    if order == "unsorted":
        indices = indices[::-1].copy()
    elif order == "duplicates":
        indices[5] = indices[4]
    want_indices, position = np.unique(indices, return_inverse=True)
    want_values = np.zeros(want_indices.size, np.float32)
    np.add.at(want_values, position, values)
    result = allgather_sets(LocalGroup(1).transports[0], indices, values)
    np.testing.assert_array_equal(result.indices, want_indices)
    assert result.values.tobytes() == want_values.tobytes()
    assert result.survived.all() and result.stats.bytes_sent == 0
    assert result.stats.messages_sent == 0 and result.stats.bytes_received == 0


@pytest.mark.parametrize("wire_dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("workers", [1, 2, 3, 5])
def test_exact_gtopk_on_tensors_equals_the_host_one_bit_for_bit(workers: int,
                                                                 wire_dtype: str) -> None:
    """Exact gTop-k with its state in tensors: the reduction, the sum at the global set (an
    all-reduce of tensors, `union.sum_at_tensors`) and the velocity's clearing stay there, and
    give the host path's bits (the thread transport sums in rank order both ways); the bytes
    are the host path's."""
    compression = Compression.gtopk(0.03, exact=True, wire_dtype=wire_dtype,
                                    momentum_correction=True)
    host, device = run(compression, workers, False), run(compression, workers, True)
    for rank, ((updates, residual, sent, _), (d_updates, d_residual, d_sent, reducers)) in (
            enumerate(zip(host, device, strict=True))):
        assert reducers == {DeviceGTopkReducer}, reducers
        for step, (want, got) in enumerate(zip(updates, d_updates, strict=True)):
            assert got.tobytes() == want.tobytes(), (rank, step)
        assert d_residual.tobytes() == residual.tobytes(), rank
        assert d_sent == sent, rank
    assert all(np.count_nonzero(u) for u in device[0][0])


@pytest.mark.parametrize("workers", [1, 2, 3, 5])
def test_exact_gtopk_on_tensors_conserves_every_gradient(workers: int) -> None:
    """Exact gTop-k loses nothing (`select_reduce`): after every step, what was applied (the
    summed update, unscaled) plus every worker's residual equals every gradient so far, to the
    float32 rounding of the sums; the state in tensors, the sums on them."""
    steps, d = 5, sum(SIZES)

    def work(transport: object) -> tuple:
        state = SparseStep(Compression.gtopk(0.02, exact=True), SIZES, transport, device="cpu",
                           average=False)
        applied, given = np.zeros(d), np.zeros(d)
        for step in range(steps):
            gradient = np.random.default_rng([transport.rank, step, 5]).standard_normal(
                d).astype(np.float32)
            given += gradient
            out = device_like(torch.empty(d))
            state.update(device_like(torch.from_numpy(gradient)), out)
            applied += out.cpu().numpy()
        return applied, given, state.residual.cpu().numpy().astype(np.float64)

    with device_like_cpu():
        results = ThreadGroup(workers).run(work)
    applied = results[0][0]
    for other in results[1:]:
        assert other[0].tobytes() == applied.tobytes()  # the same update on every worker
    given = sum(r[1] for r in results)
    residuals = sum(r[2] for r in results)
    np.testing.assert_allclose(applied + residuals, given, rtol=0, atol=1e-5 * steps * workers)
    assert np.count_nonzero(applied) > 0


def test_workers_with_their_state_in_different_places_are_refused() -> None:
    """A worker whose state is in numpy beside one whose state is in tensors would reduce on the
    host while the other sends tensors: the first step's agreement check refuses it on both."""

    def work(transport: object) -> str:
        on_torch = transport.rank == 1
        state = SparseStep(Compression.gtopk(0.1), SIZES, transport,
                           device="cpu" if on_torch else None)
        gradient = np.ones(sum(SIZES), np.float32)
        try:
            state.update(torch.from_numpy(gradient) if on_torch else gradient)
        except ValueError as error:
            return str(error)
        return "stepped"

    for message in ThreadGroup(2).run(work):
        assert "workers disagree" in message and "where the state lives" in message, message


def run_on_cuda(compression: object, workers: int, transport_device: str,
                steps: int = 4) -> list:
    """Every worker's (updates, residual, bytes sent, reducer types) from a CUDA state, the
    transport sending tensors from `transport_device` ("cuda": the reduction on the GPU, as
    under NCCL; "cpu": the host reduction a CUDA state takes on a CPU transport)."""

    def work(transport: object) -> tuple:
        transport.tensor_device = transport_device
        state = SparseStep(compression, SIZES, transport, device="cuda")
        updates, sent = [], []
        for step in range(steps):
            rng = np.random.default_rng([transport.rank, step])
            gradient = torch.from_numpy(
                rng.standard_normal(sum(SIZES)).astype(np.float32) * (1 + step)).cuda()
            out = torch.empty(sum(SIZES), dtype=torch.float32, device="cuda")
            update = state.update(gradient, out, clear_gradient=True)
            updates.append(update.cpu().numpy())
            sent.append(state.last_stats.bytes_sent)
        reducers = {type(r) for r in getattr(state.scheme.reduction, "_reducers", {}).values()}
        return updates, state.residual.cpu().numpy(), sent, reducers

    return ThreadGroup(workers).run(work)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize(("scheme", "wire_dtype"), [("gtopk", "float32"), ("gtopk", "bfloat16"),
                                                  ("gtopk", "float16"), ("topk", "float32")])
@pytest.mark.parametrize("workers", [2, 3, 8])
def test_the_reduction_on_a_gpu_equals_the_host_one_bit_for_bit(
        scheme: str, workers: int, wire_dtype: str) -> None:
    """The same CUDA state reduced on the GPU (gTop-k: merge kernel, survivors by binary search,
    the residual restored there; Top-k: the sets summed in rank order there) and on the host:
    the same bits."""
    compression = getattr(Compression, scheme)(0.03, wire_dtype=wire_dtype,
                                               momentum_correction=True)
    host, device = run_on_cuda(compression, workers, "cpu"), run_on_cuda(compression, workers,
                                                                         "cuda")
    for rank, ((updates, residual, sent, _), (d_updates, d_residual, d_sent, reducers)) in (
            enumerate(zip(host, device, strict=True))):
        if scheme == "gtopk":
            assert reducers == {DeviceGTopkReducer}, reducers
        for step, (want, got) in enumerate(zip(updates, d_updates, strict=True)):
            assert got.tobytes() == want.tobytes(), (rank, step)
        assert d_residual.tobytes() == residual.tobytes(), rank
        if scheme == "gtopk":
            assert d_sent == sent, rank
        else:  # a ring all-gather of the sets; the host's also gathers the counts
            assert d_sent == [(4 + 4) * -(-3 * sum(SIZES) // 100) * (workers - 1)] * 4, rank
    assert all(np.count_nonzero(u) for u in device[0][0])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("workers", [1, 2, 3, 5])
def test_exact_gtopk_on_a_gpu_equals_the_host_one_bit_for_bit(workers: int) -> None:
    """Exact gTop-k on a CUDA state, the transport sending tensors from the GPU: the reduction,
    the sum at the global set (index_select, the taken values added by binary search, an
    all-reduce of tensors) and the clearing run there, and give the bits of the same state on a
    CPU transport, where they run on the host (P = 1, where every transport takes tensors: the
    numpy state's)."""
    compression = Compression.gtopk(0.03, exact=True, momentum_correction=True)
    device = run_on_cuda(compression, workers, "cuda")
    host = run_on_cuda(compression, workers, "cpu") if workers > 1 else run(compression, 1,
                                                                           False)
    for rank, ((updates, residual, sent, _), (d_updates, d_residual, d_sent, reducers)) in (
            enumerate(zip(host, device, strict=True))):
        assert reducers == {DeviceGTopkReducer}, reducers
        for step, (want, got) in enumerate(zip(updates, d_updates, strict=True)):
            assert got.tobytes() == want.tobytes(), (rank, step)
        assert d_residual.tobytes() == residual.tobytes(), rank
        assert d_sent == sent, rank
    assert all(np.count_nonzero(u) for u in device[0][0])
