"""The split of a reduction's communication time into wait and transfer (the readiness probe of
gtopk_hvd/reductions/wait_probe.py): a worker that arrives S seconds late shows up as S of wait
on the others and as a small transfer everywhere. Workers are threads here (ThreadTransport);
tests/mpi/mpi_wait_split.py checks the same over mpirun, horovodrun and torchrun."""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np
import pytest
from helpers.mpi_launcher import run_mpi
from helpers.thread_transport import ThreadGroup, ThreadTransport

from gtopk_hvd.compression import Compression
from gtopk_hvd.core import SparseStep
from gtopk_hvd.reductions import GTopkReducer, ReductionStats, dense_allreduce, topk_allgather
from gtopk_hvd.reductions.wait_probe import resolve_wait_probe, wait_probe_from_environment
from gtopk_hvd.transports import Transport
from gtopk_hvd.transports.horovod import HorovodTransport
from gtopk_hvd.transports.torch_distributed import TorchDistributedTransport

LATE_S = 0.4
TOLERANCE_S = 0.05  # the late worker's own start-up after the barrier, thread scheduling


@pytest.fixture(autouse=True)
def _probe_on_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GTOPK_HVD_WAIT_PROBE", raising=False)


def local_set(rank: int, k: int = 8, d: int = 200) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(rank)
    indices = np.sort(rng.choice(d, size=k, replace=False)).astype(np.int32)
    return indices, rng.standard_normal(k).astype(np.float32)


def late_step(group: ThreadGroup, late: int,
              reduce: Callable[[ThreadTransport], ReductionStats]) -> list[ReductionStats]:
    """reduce() twice on every worker; before the second, `late` sleeps LATE_S after a barrier.
    The stats of the second call, in rank order."""

    def work(transport: ThreadTransport) -> ReductionStats:
        reduce(transport)  # first call: agreement checks, buffers
        transport.allgather(np.zeros(1))  # everyone here at once
        if transport.rank == late:
            time.sleep(LATE_S)
        return reduce(transport)

    return group.run(work)


def assert_split(stats: list[ReductionStats], late: int) -> None:
    for rank, s in enumerate(stats):
        assert s.comm_seconds == pytest.approx(s.wait_seconds + s.transfer_seconds), (rank, s)
        assert s.transfer_seconds < LATE_S / 4, (rank, s)
        if rank == late:
            assert s.wait_seconds < LATE_S / 4, (rank, s)
        else:
            assert s.wait_seconds >= LATE_S - TOLERANCE_S, (rank, s)


def gtopk_reduce(transport: ThreadTransport, wait_probe: bool = True) -> ReductionStats:
    reducers = transport.__dict__.setdefault("reducers", {})
    reducer = reducers.get(wait_probe)
    if reducer is None:
        reducer = reducers[wait_probe] = GTopkReducer(8, np.int32, "float32", transport,
                                                      wait_probe=wait_probe)
    return reducer.allreduce(*local_set(transport.rank)).stats


@pytest.mark.parametrize(("workers", "late"), [(2, 0), (2, 1), (3, 1), (3, 2), (4, 3), (5, 4),
                                               (5, 1)])
def test_gtopk_partners_of_a_late_worker_wait_and_transfer_little(workers: int,
                                                                   late: int) -> None:
    """Every worker depends on the late one through the rounds (or the fold), so all of them
    wait about S in their probes, whoever their partner; the late one waits for nobody."""
    assert_split(late_step(ThreadGroup(workers), late, gtopk_reduce), late)


def test_gtopk_wait_is_in_transfer_without_the_probe() -> None:
    stats = late_step(ThreadGroup(2), 1, lambda t: gtopk_reduce(t, wait_probe=False))
    assert stats[0].wait_seconds == 0.0 and stats[0].transfer_seconds >= LATE_S - TOLERANCE_S
    assert stats[0].comm_seconds == stats[0].transfer_seconds


def test_topk_allgather_waits_for_the_slowest_worker() -> None:
    stats = late_step(ThreadGroup(3), 2, lambda t: topk_allgather(*local_set(t.rank), t).stats)
    assert_split(stats, 2)


def test_dense_allreduce_waits_for_the_slowest_worker() -> None:
    stats = late_step(ThreadGroup(3), 0,
                      lambda t: dense_allreduce(np.ones(1000, np.float32), t))
    assert_split(stats, 0)


@pytest.mark.parametrize("compression", [Compression.gtopk(density=0.05),
                                         Compression.topk(density=0.05)])
def test_step_stats_carry_the_split(compression: object) -> None:
    """optimizer.last_stats: communicate_seconds = wait_seconds + transfer_seconds, the wait on
    the partners of the late worker."""

    def step(transport: ThreadTransport) -> ReductionStats:
        state = transport.__dict__.get("state")
        if state is None:
            state = transport.state = SparseStep(compression, [300], transport)
        gradient = np.random.default_rng(transport.rank).standard_normal(300).astype(np.float32)
        state.update(gradient)
        s = state.last_stats
        return ReductionStats(comm_seconds=s.communicate_seconds, wait_seconds=s.wait_seconds,
                              transfer_seconds=s.transfer_seconds)

    assert_split(late_step(ThreadGroup(4), 2, step), 2)


class QuietThreadTransport(ThreadTransport):
    """A transport whose probe is off by default, as Horovod's and torch.distributed's."""

    wait_probe_default = False


def test_the_probe_default_follows_the_transport_and_the_environment(
        monkeypatch: pytest.MonkeyPatch) -> None:
    group = ThreadGroup(1)
    on, off = ThreadTransport(group, 0), QuietThreadTransport(group, 0)
    assert (resolve_wait_probe(None, on), resolve_wait_probe(None, off)) == (True, False)
    assert not HorovodTransport.wait_probe_default
    assert not TorchDistributedTransport.wait_probe_default
    assert Transport.wait_probe_default  # MPITransport keeps the base class's default
    for text, expected in (("", None), ("1", True), ("0", False)):
        monkeypatch.setenv("GTOPK_HVD_WAIT_PROBE", text)
        assert wait_probe_from_environment() is expected
        if expected is not None:  # the environment wins over the transport's default
            assert resolve_wait_probe(None, on) is resolve_wait_probe(None, off) is expected
    assert resolve_wait_probe(True, off) and not resolve_wait_probe(False, on)  # argument wins
    monkeypatch.setenv("GTOPK_HVD_WAIT_PROBE", "yes")
    with pytest.raises(ValueError, match="GTOPK_HVD_WAIT_PROBE"):
        wait_probe_from_environment()


def test_a_transport_without_the_probe_by_default_sends_no_probe() -> None:
    group = ThreadGroup(2, check_phases=True)

    def work(transport: ThreadTransport) -> ReductionStats:
        quiet = QuietThreadTransport(transport.group, transport.rank)
        return GTopkReducer(8, np.int32, "float32", quiet).allreduce(
            *local_set(transport.rank)).stats

    stats = group.run(work)
    assert group.phases == [12]  # the round only, no probe phase (22)
    assert all(s.wait_seconds == 0.0 and s.comm_seconds == s.transfer_seconds for s in stats)


def test_workers_with_different_probe_settings_are_refused() -> None:
    """The probe adds phases to the schedule: a mixed setting would mismatch messages, so the
    first call's agreement check raises on every worker instead."""

    def work(transport: ThreadTransport) -> str:
        reducer = GTopkReducer(8, np.int32, "float32", transport,
                               wait_probe=transport.rank == 0)
        with pytest.raises(ValueError, match="wait probe") as error:
            reducer.allreduce(*local_set(transport.rank))
        return str(error.value)

    assert all("GTOPK_HVD_WAIT_PROBE" in message for message in ThreadGroup(2).run(work))


@pytest.mark.mpi
@pytest.mark.parametrize(("launcher", "workers", "transport"), [
    ("mpirun", 3, "mpi"),          # a fold: the late worker is the folded one
    ("mpirun", 2, "horovod"),      # each probe is a Horovod alltoall
    ("torchrun", 2, "torch"),      # each probe is a length message
])
def test_wait_split_over_real_transports(launcher: str, workers: int, transport: str) -> None:
    output = run_mpi("mpi_wait_split.py", workers, "--transport", transport, timeout_s=300,
                     launcher=launcher)
    assert f"wait split ok on {workers} workers over {transport}" in output
