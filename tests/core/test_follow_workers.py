"""A sparse step following a change of workers (Elastic Horovod's reset), in one process: workers
are threads of a `LocalGroup` ("local" transport), and what the adapters ask of Horovod (its rank
and size) is read from the group the thread runs in. `follow_horovod` moves a step made for 3
workers onto 2 (residual, velocity and step count kept, a scheme's own state restarted) and its
next step equals that of a step made for 2 workers from the same state; `restarted` gives a new
worker's state; a Transport object given by the user cannot follow (an error naming the fix)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TypeVar

import numpy as np
import pytest

from gtopk_hvd.compression import Compression
from gtopk_hvd.core import SparseStep
from gtopk_hvd.core.elastic import follow_horovod
from gtopk_hvd.density import Schedule
from gtopk_hvd.transports import resolve_transport
from gtopk_hvd.transports.local import LocalGroup

D = 300
T = TypeVar("T")
CONFIGS = {"gtopk": Compression.gtopk(0.02, momentum_correction=True, momentum=0.9),
           "micro": Compression.micro(0.02)}


class ThreadWorkers:
    """Rank and size of the LocalGroup worker this thread is (what hvd.rank()/size() say)."""

    current = threading.local()

    def rank(self) -> int:
        return self.current.rank

    def size(self) -> int:
        return self.current.size


def in_group(size: int, work: Callable[[int], T]) -> list[T]:
    """work(rank) on each of `size` thread workers, ThreadWorkers answering for each."""
    group = LocalGroup(size, timeout_s=60)

    def worker(rank: int) -> T:
        ThreadWorkers.current.rank, ThreadWorkers.current.size = rank, size
        return work(rank)

    try:
        return group.run(worker)
    finally:
        group.close()


def gradient(rank: int, step: int) -> np.ndarray:
    return np.random.default_rng([rank, step]).standard_normal(D).astype(np.float32)


def stepped(config: object, rank: int, steps: int) -> SparseStep:
    """This thread worker's SparseStep over the "local" transport after `steps` steps."""
    step = SparseStep(config, [D], resolve_transport("local"))
    for t in range(steps):
        step.update(gradient(rank, t), np.zeros(D, np.float32))
    return step


@pytest.mark.parametrize("scheme", list(CONFIGS))
def test_a_step_moves_to_fewer_workers_with_its_state(scheme: str) -> None:
    config = CONFIGS[scheme]

    before = in_group(3, lambda rank: stepped(config, rank, 4))
    saved = [step.state_dict() for step in before]

    def two(rank: int) -> tuple[dict, np.ndarray, np.ndarray]:
        moved = follow_horovod(before[rank], "local", ThreadWorkers())
        assert moved is not before[rank] and moved.transport.size == 2
        kept = moved.state_dict()
        reference = SparseStep(config, [D], resolve_transport("local"))
        reference.load_state_dict({k: v for k, v in saved[rank].items() if k != "scheme"})
        assert follow_horovod(moved, "local", ThreadWorkers()) is moved  # same workers: kept
        out = moved.update(gradient(rank, 9), np.zeros(D, np.float32)).copy()
        expected = reference.update(gradient(rank, 9), np.zeros(D, np.float32)).copy()
        return kept, out, expected

    for rank, (kept, out, expected) in enumerate(in_group(2, two)):
        assert np.array_equal(kept["residual"], saved[rank]["residual"])
        assert kept["step"] == saved[rank]["step"] == 4
        if "velocity" in saved[rank]:
            assert np.array_equal(kept["velocity"], saved[rank]["velocity"])
        if scheme == "micro":
            assert saved[rank]["scheme"], "MiCRO keeps a state of its own"
        np.testing.assert_array_equal(out, expected)


def test_restarted_is_a_new_worker_at_the_jobs_step() -> None:
    def one(rank: int) -> SparseStep:
        step = SparseStep(CONFIGS["gtopk"], [D], resolve_transport("local"))
        step.update(gradient(rank, 0), np.zeros(D, np.float32))
        return step.restarted(7)

    (fresh,) = in_group(1, one)
    assert fresh.step_count == 7
    assert not np.any(fresh.residual) and not np.any(fresh.velocity)


def test_a_transport_object_cannot_follow() -> None:
    def work(rank: int) -> str:
        step = SparseStep(CONFIGS["gtopk"], [D], resolve_transport("local"))
        with pytest.raises(RuntimeError, match="pass transport=None or \"horovod\""):
            follow_horovod(step, step.transport, Resized())
        return "ok"

    class Resized(ThreadWorkers):
        def size(self) -> int:
            return 5

    assert in_group(2, work) == ["ok", "ok"]


def test_a_new_worker_takes_the_jobs_step_count_at_its_first_step() -> None:
    """With a density warm-up, k goes by the step count: a worker new to the job (count 0) takes
    the others' at the first step's agreement check, so every worker selects the same k."""
    config = Compression.gtopk(0.01, warmup_densities=(0.25, 0.1), warmup_steps=4)

    survivors = in_group(2, lambda rank: stepped(config, rank, 5))

    def three(rank: int) -> tuple[int, int]:
        step = (follow_horovod(survivors[rank], "local", ThreadWorkers()) if rank < 2
                else stepped(config, rank, 0))
        step.update(gradient(rank, 5), np.zeros(D, np.float32))
        return step.last_stats.k, step.step_count

    at_step_5 = Schedule(config, [D]).budget(5).k
    assert at_step_5 != Schedule(config, [D]).budget(0).k  # so a count of 0 would show
    assert in_group(3, three) == [(at_step_5, 6)] * 3
