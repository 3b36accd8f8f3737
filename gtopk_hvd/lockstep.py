"""Steps in lockstep: several buckets' steps with their host reads brought over together.

A step that must read a value of the device on the host (a threshold scheme's histogram, the
count it selected) waits for the device there: for everything enqueued before, and the device
then idles while the host computes what comes next. The DDP hook holds an iteration's buckets
and steps them at the last one, so their steps can run in phases instead, one after another:

    a step written as a generator (`SparseStep.update_phases`, `Scheme.exchange_phases`) yields
    `HostRead(tensors)` where it needs values of the device, and is sent back those values on
    the host (numpy arrays, in the same order); what it returns is its result.

`drive(steps)` runs one such generator alone (a read, a wait, each time it asks).
`run_in_lockstep([steps_0, steps_1, ...])` advances every generator to its next read, in list
order, brings all the reads of that phase to the host together (`ops.read_to_host`: one wait
a phase instead of one a read) and sends each its values, until all have returned: with B
buckets of R reads each, R waits instead of B x R, and the same results bit for bit, since
each generator sees the same values in the same order as alone.

Collectives: a generator may call the transport between its reads. In lockstep the calls of
bucket b's phase r come after those of every bucket's phase r - 1, in bucket order. That order is
the same on every worker as long as the number of reads a step makes depends only on what every
worker agrees on (its configuration, summed histograms, gathered counts), never on local data:
the rule for any `exchange_phases`.
"""

from __future__ import annotations

from collections.abc import Generator, Sequence
from typing import Any, NamedTuple

from gtopk_hvd import ops


class HostRead(NamedTuple):
    """What a step generator yields: the tensors (of one device) it needs on the host next."""

    tensors: tuple


Phases = Generator[HostRead, tuple, Any]


def drive(steps: Phases) -> Any:
    """Runs one step generator to its end, each read brought to the host as it is asked for
    (one wait each); returns the generator's result."""
    try:
        request = next(steps)
        while True:
            request = steps.send(ops.read_to_host(request.tensors))
    except StopIteration as done:
        return done.value


def run_in_lockstep(steps: Sequence[Phases]) -> list[Any]:
    """Runs step generators phase by phase (module docstring): every one advanced to its next
    read in list order, then all those reads brought to the host with one wait. Returns their
    results in list order. An exception from one is raised as it comes (the others are left
    unfinished)."""
    results: list[Any] = [None] * len(steps)
    asked: dict[int, HostRead] = {}
    for i, generator in enumerate(steps):
        _advance(generator, None, i, asked, results)
    while asked:
        order = sorted(asked)
        values = ops.read_to_host([t for i in order for t in asked[i].tensors])
        start = 0
        for i in order:
            n = len(asked.pop(i).tensors)
            _advance(steps[i], tuple(values[start:start + n]), i, asked, results)
            start += n
    return results


def _advance(generator: Phases, values: tuple | None, i: int, asked: dict[int, HostRead],
             results: list[Any]) -> None:
    try:
        asked[i] = next(generator) if values is None else generator.send(values)
    except StopIteration as done:
        results[i] = done.value
