"""The torch DistributedOptimizer's step, split into phases, next to its floors and to the plain
optimizer's step, all measured in one run.

    python -m gtopk_hvd.bench step                                  # P = 1
    mpirun --allow-run-as-root --oversubscribe -np 4 python -m gtopk_hvd.bench step   # P = 4

Model: --parameters float32 values in --tensors tensors (default: ResNet-50's 25,557,032 in 161
tensors of log-uniform sizes); gradients from a real backward of sum_i <c_i, p_i>, so p.grad
accumulates as in training. One iteration: zero_grad(); backward; step(). Timed (median over
--steps, the slowest worker's): step() (synchronize included) and zero_grad(), for
gtopk_hvd.torch.DistributedOptimizer(SGD(momentum=0.9)) and for the plain SGD on a copy.
Floors on d values in the same run: one ops.accumulate_select pass, one zero pass (the faster of
numpy and torch), one read pass. `check` is the non-finite check of nonfinite="propagate" (a
read pass and a one-integer all-reduce; `--nonfinite raise` leaves it out).

    overhead = ours step - plain step;  target: overhead <= 2 x (accumulate_select + zero)
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Callable

import numpy as np

from gtopk_hvd import ops
from gtopk_hvd.bench.timing import barrier, median_seconds, read_floor, slowest
from gtopk_hvd.transports import resolve_transport

RESNET50 = 25_557_032
PHASES = ("check", "select", "communicate", "merge", "write")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--parameters", type=int, default=RESNET50,
                        help="d, the model's parameter count (ResNet-50's)")
    parser.add_argument("--tensors", type=int, default=161,
                        help="parameters tensors d is split into (ResNet-50's)")
    parser.add_argument("--density", type=float, default=0.001, help="k / d")
    parser.add_argument("--scheme", choices=["gtopk", "topk"], default="gtopk",
                        help="the sparse scheme, by its name")
    parser.add_argument("--nonfinite", choices=["propagate", "raise"], default="propagate",
                        help="the compression's non-finite rule (raise: no check per step)")
    parser.add_argument("--steps", type=int, default=10, help="timed iterations (after 2 more)")


def tensor_sizes(total: int, count: int) -> list[int]:
    """count sizes, log-uniform between 64 and 2.4M, that add up to total."""
    rng = np.random.default_rng(50)
    raw = np.exp(rng.uniform(np.log(64), np.log(2_400_000), count))
    sizes = np.maximum(1, (raw / raw.sum() * total).astype(np.int64))
    sizes[np.argmax(sizes)] += total - int(sizes.sum())
    return sizes.tolist()


class Workload:
    """Parameters and the fixed gradient coefficients of one worker."""

    def __init__(self, sizes: list[int], seed: int) -> None:
        import torch

        generator = torch.Generator().manual_seed(seed)
        self.parameters = [torch.nn.Parameter(torch.zeros(n)) for n in sizes]
        self.coefficients = [torch.randn(n, generator=generator) for n in sizes]

    def backward(self) -> None:
        import torch

        loss = sum(torch.dot(p, c) for p, c in zip(self.parameters, self.coefficients))
        loss.backward()


def time_iterations(optimizer: object, workload: Workload, steps: int,
                    on_step: Callable[[], None] = lambda: None) -> tuple[float, float]:
    """Median slowest-worker seconds of step() and of zero_grad()."""
    step_times, zero_times = [], []
    transport = resolve_transport(None)
    for iteration in range(steps + 2):
        start = time.perf_counter()
        optimizer.zero_grad()
        zero_s = time.perf_counter() - start
        workload.backward()
        barrier(transport)
        start = time.perf_counter()
        optimizer.step()
        step_s = slowest(transport, time.perf_counter() - start)
        on_step()
        if iteration >= 2:
            step_times.append(step_s)
            zero_times.append(slowest(transport, zero_s))
    return statistics.median(step_times), statistics.median(zero_times)


def floors(d: int, k: int, repeats: int) -> dict[str, float]:
    import torch

    gradient = np.random.default_rng(1).standard_normal(d).astype(np.float32)
    residual = np.zeros(d, dtype=np.float32)
    buffer = torch.zeros(d)
    return {
        "accumulate_select": median_seconds(lambda: ops.accumulate_select(gradient, residual, k),
                                            repeats),
        "zero": min(median_seconds(lambda: buffer.numpy().fill(0), repeats),
                    median_seconds(buffer.zero_, repeats)),
        "read": median_seconds(lambda: read_floor(gradient), repeats),
    }


def run(args: argparse.Namespace) -> None:
    # Here, not at the top: `bench -h` builds every command's parser and should not load torch.
    import gtopk_hvd.torch as gtopk  # before horovod: loads mpi4py first

    # isort: split
    import horovod.torch as hvd
    import torch

    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    sizes = tensor_sizes(args.parameters, args.tensors)
    d = sum(sizes)
    k = max(1, int(np.ceil(args.density * d)))

    plain_workload = Workload(sizes, seed=rank)
    plain = torch.optim.SGD(plain_workload.parameters, lr=0.01, momentum=0.9)
    plain_step, plain_zero = time_iterations(plain, plain_workload, args.steps)
    del plain, plain_workload

    workload = Workload(sizes, seed=rank)
    compression = getattr(gtopk.Compression, args.scheme)(density=args.density,
                                                          nonfinite=args.nonfinite)
    ours = gtopk.DistributedOptimizer(
        torch.optim.SGD(workload.parameters, lr=0.01, momentum=0.9),
        named_parameters=[(f"p{i}", p) for i, p in enumerate(workload.parameters)],
        compression=compression)
    phases: dict[str, list[float]] = {name: [] for name in PHASES}
    transport = resolve_transport(None)

    def record() -> None:
        stats = ours.last_stats
        for name in PHASES:
            phases[name].append(slowest(transport, getattr(stats, f"{name}_seconds")))

    ours_step, ours_zero = time_iterations(ours, workload, args.steps, record)
    phase_s = {name: statistics.median(values[2:]) for name, values in phases.items()}
    floor_s = floors(d, k, args.steps)
    if rank != 0:
        return
    overhead = ours_step - plain_step
    floor = floor_s["accumulate_select"] + floor_s["zero"]
    accounted = sum(phase_s.values())
    print(f"workers: {size}; d = {d:,} in {len(sizes)} tensors; {args.scheme} density "
          f"{args.density} (k = {k:,}), nonfinite={args.nonfinite}; kernel threads: "
          f"{ops.get_num_threads()}; torch threads: {torch.get_num_threads()}; median of "
          f"{args.steps} steps, slowest worker")
    for name, step_s, zero_s in (("plain SGD", plain_step, plain_zero),
                                 ("gtopk_hvd", ours_step, ours_zero)):
        print(f"{name + ' step':<25} {step_s * 1e3:8.2f} ms   zero_grad {zero_s * 1e3:6.2f} ms")
    for name in PHASES:
        print(f"  {name:<23} {phase_s[name] * 1e3:8.2f} ms")
    print(f"  {'rest (gather, SGD, ...)':<23} {(ours_step - accounted) * 1e3:8.2f} ms")
    print(f"floors: accumulate_select {floor_s['accumulate_select'] * 1e3:.2f} ms, zero "
          f"{floor_s['zero'] * 1e3:.2f} ms, read {floor_s['read'] * 1e3:.2f} ms")
    print(f"overhead = step - plain step = {overhead * 1e3:.2f} ms = {overhead / floor:.2f} x "
          f"(accumulate_select + zero)   [target <= 2]")
