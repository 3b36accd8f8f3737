"""Steps in lockstep: several buckets' steps with their host reads brought over together.

A step that must read a value of the device on the host (a threshold scheme's histogram, the
count it selected) waits for the device there: for everything enqueued before, and the device
then idles while the host computes what comes next. The DDP hook holds an iteration's buckets
and steps them at the last one, so their steps can run in phases instead, one after another:

    a step written as a generator (`SparseStep.phases`, `Scheme.exchange`) yields
    `HostRead(tensors)` where it needs values of the device, and is sent back those values on
    the host (numpy arrays, in the same order); what it returns is its result. A scheme's method
    that reads nothing is made one by `gtopk_hvd.schemes.reads_nothing`.

`drive(steps)` runs one such generator alone (a read, a wait, each time it asks).
`run_in_lockstep([steps_0, steps_1, ...])` advances every generator to its next read, in list
order, brings all the reads of that phase to the host together (`ops.read_to_host`: one wait
a phase instead of one a read) and sends each its values, until all have returned: with B
buckets of R reads each, R waits instead of B x R, and the same results bit for bit, since
each generator sees the same values in the same order as alone.

Timings: a step's values come back as a `Reply`, a tuple of them with the step's share of the
wait that brought them (alone: the whole wait; in lockstep: the phase's wait split evenly over
the steps that asked). A step measures its own time with `OwnTime` (reads through
`OwnTime.read`): its wall time less the time it spent suspended beyond that share, while the
other steps' phases ran. So the steps' own times add up to at most the wall time of the whole
run, as the times of steps run one at a time do.

Collectives: a generator may call the transport between its reads. In lockstep the calls of
bucket b's phase r come after those of every bucket's phase r - 1, in bucket order. That order is
the same on every worker as long as the number of reads a step makes depends only on what every
worker agrees on (its configuration, summed histograms, gathered counts), never on local data:
the rule for any `Scheme.exchange`.
"""

from __future__ import annotations

import time
from collections.abc import Generator, Sequence
from typing import Any, NamedTuple

from gtopk_hvd import ops


class HostRead(NamedTuple):
    """What a step generator yields: the tensors (of one device) it needs on the host next."""

    tensors: tuple


class Reply(tuple):
    """What a read sends back: its values on the host (a tuple, in the read's order), and
    `wait_seconds`, this step's share of the wait that brought them."""

    wait_seconds: float

    def __new__(cls, values: Sequence[Any], wait_seconds: float) -> Reply:
        reply = super().__new__(cls, values)
        reply.wait_seconds = wait_seconds
        return reply

    def __reduce__(self) -> tuple:
        return Reply, (tuple(self), self.wait_seconds)


Phases = Generator[HostRead, Reply, Any]


class OwnTime:
    """A step generator's own time since it was made: the wall time less what it spent
    suspended at its reads beyond its share of their waits (module docstring)."""

    def __init__(self) -> None:
        self.start = time.perf_counter()
        self.away = 0.0

    def read(self, tensors: Sequence[Any]) -> Generator[HostRead, Reply, Reply]:
        """Yields the read of `tensors` (`yield from` it); returns the values."""
        asked = time.perf_counter()
        reply = yield HostRead(tuple(tensors))
        self.away += max(0.0, time.perf_counter() - asked - reply.wait_seconds)
        return reply

    def seconds(self) -> float:
        return time.perf_counter() - self.start - self.away


def drive(steps: Phases) -> Any:
    """Runs one step generator to its end, each read brought to the host as it is asked for
    (one wait each); returns the generator's result."""
    try:
        request = next(steps)
        while True:
            request = steps.send(_read([request.tensors])[0])
    except StopIteration as done:
        return done.value


def run_in_lockstep(steps: Sequence[Phases]) -> list[Any]:
    """Runs step generators phase by phase (module docstring): every one advanced to its next
    read in list order, then all those reads brought to the host with one wait. Returns their
    results in list order. An exception from one is raised as it comes; the others are closed
    where they stood, their steps half done (their states no longer fit for a next step)."""
    results: list[Any] = [None] * len(steps)
    asked: dict[int, HostRead] = {}
    try:
        for i, generator in enumerate(steps):
            _advance(generator, None, i, asked, results)
        while asked:
            order = sorted(asked)
            replies = _read([asked.pop(i).tensors for i in order])
            for i, reply in zip(order, replies):
                _advance(steps[i], reply, i, asked, results)
    except BaseException:
        for generator in steps:
            try:
                generator.close()
            except Exception:  # the first error is the one raised
                pass
        raise
    return results


def _read(reads: list[tuple]) -> list[Reply]:
    """Every read's values with one wait (`ops.read_to_host`), the wait split evenly."""
    start = time.perf_counter()
    values = ops.read_to_host([t for tensors in reads for t in tensors])
    share = (time.perf_counter() - start) / len(reads)
    replies, first = [], 0
    for tensors in reads:
        replies.append(Reply(values[first:first + len(tensors)], share))
        first += len(tensors)
    return replies


def _advance(generator: Phases, reply: Reply | None, i: int, asked: dict[int, HostRead],
             results: list[Any]) -> None:
    try:
        asked[i] = next(generator) if reply is None else generator.send(reply)
    except StopIteration as done:
        results[i] = done.value
