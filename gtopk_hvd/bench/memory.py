"""Peak memory of one sparse step beyond the gradient, per scheme, as a multiple of the gradient.

    python -m gtopk_hvd.bench memory [--parameters D] [--density 0.001] [--steps 3]
        [--states numpy torch-cpu cuda] [--schemes gtopk topk ...] [--workers P]

For each scheme (with and without DGC momentum correction) and each kind of state (numpy arrays;
torch CPU tensors; CUDA tensors when a GPU is present), P workers (threads of this process over
`gtopk_hvd.transports.local` when P > 1) run --steps steps of `SparseStep.update`
on a fused gradient of d float32 values the way the adapters call it (the update written into the
gradient, `clear_gradient=True`), and again as `step(gradient)` with a read-only gradient (and a
gradient_predivide_factor of 2: its division must not copy the gradient). Printed per row:

    extra = state + temporaries, in gradients (d float32 values)

state: what the step keeps between steps (the residual, 1; with momentum correction also the
velocity, 2); temporaries: the largest, over the steps (the first included: it has its own
paths), of the peak of what the P workers' step allocates minus what was allocated when it
started, divided by P. The target is state + 5% of the gradient. Allocations are
counted by:

    numpy      tracemalloc (numpy's arrays, and every Python object)
    torch-cpu  tracemalloc + torch.profiler's memory events (torch's CPU allocator), each one's
               peak: their sum bounds the true peak from above
    cuda       torch.cuda.max_memory_allocated after reset_peak_memory_stats

The kernels' own scratch (C++ vectors of k-sized candidates, CUDA workspaces from torch's
allocator) is counted on CUDA; on the host only what Python and torch allocate is seen.
"""

from __future__ import annotations

import argparse
import contextlib
import tracemalloc
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from gtopk_hvd.compression import Compression
from gtopk_hvd.core import SparseStep
from gtopk_hvd.schemes import known_scheme_names, scheme_of
from gtopk_hvd.transports.local import LocalGroup

MEASURED = ("topk", "gtopk", "gtopk-exact", "micro", "exdyna", "sketch")
"""The schemes `bench memory` measures by default (--schemes takes any registered one)."""
STATES = ("numpy", "torch-cpu", "cuda")
WARM_UP_D = 1 << 14
"""Each row first runs its steps on a gradient this small, unmeasured but for the same paths."""
TARGET_SLACK = 0.05
"""Temporaries allowed beyond the state, as a fraction of the gradient."""


@dataclass
class Row:
    scheme: str
    state: str
    momentum: bool
    call: str  # "update" (clear_gradient, in place) or "step" (read-only gradient, predivide)
    state_gradients: float  # residual (+ velocity), in gradients
    temporaries: float  # peak temporaries of a step, in gradients

    @property
    def extra(self) -> float:
        return self.state_gradients + self.temporaries

    @property
    def target(self) -> float:
        return self.state_gradients + TARGET_SLACK

    @property
    def ok(self) -> bool:
        return self.extra <= self.target


# -- counting allocations ---------------------------------------------------------------------


class Meter:
    """Peak bytes allocated inside `measure()` beyond what was allocated when it began."""

    def __init__(self, state: str) -> None:
        self.state = state
        self.peak = 0

    @contextlib.contextmanager
    def measure(self) -> Iterator[None]:
        if self.state == "cuda":
            with self._cuda():
                yield
            return
        with self._host(), self._torch_cpu() if self.state == "torch-cpu" else _nothing():
            yield

    @contextlib.contextmanager
    def _host(self) -> Iterator[None]:
        tracemalloc.start()
        try:
            tracemalloc.reset_peak()
            start = tracemalloc.get_traced_memory()[0]
            yield
            self.peak += tracemalloc.get_traced_memory()[1] - start
        finally:
            tracemalloc.stop()

    @contextlib.contextmanager
    def _torch_cpu(self) -> Iterator[None]:
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as profiler:
            yield
        self.peak += torch_cpu_peak(profiler)

    @contextlib.contextmanager
    def _cuda(self) -> Iterator[None]:
        import torch

        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        start = torch.cuda.memory_allocated()
        yield
        torch.cuda.synchronize()
        self.peak += torch.cuda.max_memory_allocated() - start


@contextlib.contextmanager
def _nothing() -> Iterator[None]:
    yield


def torch_cpu_peak(profiler: Any) -> int:
    """The peak of the running sum of the profiler's memory events (allocations positive, frees
    negative, in time order): torch's CPU allocations beyond what was allocated at the start."""
    events = sorted((event.start_ns(), event.nbytes())
                    for event in profiler.profiler.kineto_results.events()
                    if event.name() == "[memory]" and event.device_type().name == "CPU")
    running = peak = 0
    for _, nbytes in events:
        running += nbytes
        peak = max(peak, running)
    return peak


# -- one scheme -------------------------------------------------------------------------------


def device_of(state: str) -> Any:
    return {"numpy": None, "torch-cpu": "cpu", "cuda": "cuda"}[state]


def make_gradient(state: str, d: int, rng: np.random.Generator) -> Any:
    """A heavy-tailed gradient of d float32 values of the state's array type."""
    values = (rng.standard_t(3, d) * np.exp(np.linspace(-2, 2, d))).astype(np.float32)
    if state == "numpy":
        return values
    import torch

    return torch.from_numpy(values).to(device_of(state))


def refill(gradient: Any, rng: np.random.Generator) -> None:
    """A new gradient into the same buffer (outside the measurement)."""
    fresh = make_gradient("numpy", len(gradient), rng)
    if isinstance(gradient, np.ndarray):
        gradient[:] = fresh
    else:
        import torch

        gradient.copy_(torch.from_numpy(fresh))


def measure(name: str, state: str, d: int, density: float, steps: int, momentum: bool,
            call: str, workers: int = 1) -> Row:
    """One row: the scheme's peak temporaries over `steps` steps of `workers` workers (threads
    of one `LocalGroup`, all measured at once: the peak of their sum, divided by P)."""
    config = Compression.scheme(name, density, momentum_correction=momentum)
    if d > WARM_UP_D:  # what is made once per process (imports, the profiler) is not a step's
        measure(name, state, WARM_UP_D, density, steps, momentum, call, workers)
    predivide = 2.0 if call == "step" else 1.0
    group = LocalGroup(workers)
    try:
        made = group.run(lambda rank: (
            SparseStep(config, [d], group.transports[rank], device=device_of(state),
                       predivide=predivide),
            make_gradient(state, d, np.random.default_rng(rank)),
            np.random.default_rng(1000 + rank)))
        largest = 0
        for _ in range(steps):
            for _, gradient, rng in made:
                refill(gradient, rng)
            meter = Meter(state)
            with meter.measure():
                group.run(lambda rank: _one_step(made[rank][0], made[rank][1], call))
            largest = max(largest, meter.peak)
    finally:
        group.close()
    state_size = scheme_of(config).state_values(config, d) / d  # the scheme's own word
    kept = 1.0 + (made[0][0].velocity is not None)  # what the step holds
    if state_size != kept:
        raise AssertionError(f"{name}: state_values says {state_size} gradients, the step "
                             f"keeps {kept}")
    return Row(name, state, momentum, call, state_size, largest / workers / (4 * d))


def _one_step(step: SparseStep, gradient: Any, call: str) -> None:
    if call == "update":  # the adapters' call: the update written over the gradient
        step.update(gradient, gradient, clear_gradient=True)
    else:
        step.update(gradient)


# -- the command ------------------------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--parameters", type=int, default=1 << 22, help="d")
    parser.add_argument("--density", type=float, default=0.001)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--workers", type=int, default=1,
                        help="P (> 1: threads of one process, `gtopk_hvd.transports.local`)")
    parser.add_argument("--states", nargs="+", default=None, choices=STATES,
                        help="default: numpy, torch-cpu, and cuda where a GPU is present")
    parser.add_argument("--schemes", nargs="+", default=list(MEASURED),
                        choices=known_scheme_names())


def default_states() -> list[str]:
    states = ["numpy"]
    try:
        import torch
    except ImportError:
        return states
    states.append("torch-cpu")
    if torch.cuda.is_available():
        states.append("cuda")
    return states


def run(args: argparse.Namespace) -> None:
    states = args.states or default_states()
    print(f"d = {args.parameters}, density {args.density}, P = {args.workers}, "
          f"{args.steps} steps; extra = state + temporaries, in gradients (target: state + "
          f"{TARGET_SLACK})")
    print(f"{'scheme':12} {'state':10} {'momentum':8} {'call':7} {'extra':>7} {'target':>7} "
          f"{'temporaries':>11}  ok")
    for state in states:
        for name in args.schemes:
            for momentum in (False, True):
                for call in ("update", "step"):
                    row = measure(name, state, args.parameters, args.density, args.steps,
                                  momentum, call, args.workers)
                    print(f"{name:12} {state:10} {str(momentum):8} {call:7} {row.extra:7.3f} "
                          f"{row.target:7.3f} {row.temporaries:11.3f}  "
                          f"{'yes' if row.ok else 'NO'}", flush=True)
