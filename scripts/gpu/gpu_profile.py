"""Where a GPU call's time goes: the device kernels of the top-k kernel and of one sparse step,
each with its device time, beside the call's wall time (the rest is host work and idle device).

    python scripts/gpu/gpu_profile.py --json profile.json                  # on a GPU
    python scripts/gpu/gpu_profile.py --device cpu --topk-d 2e5 --step-d 2e5 --json p.json  # dry

Cases (density 0.001, float32, Gaussian values):

    read@D          torch.amax(x): one read of D values, the floor of any pass over them (for
                    each D of --topk-d and --step-d)
    topk@D          ops.topk_abs(x, k) alone, D = --topk-d (target: at most 1.5 reads)
    fused@D         ops.accumulate_select(gradient, residual, k) alone, D = --step-d: the fused
                    accumulate-and-select of every error-feedback step (its traffic is about
                    three reads: gradient and residual read, the residual written)
    <scheme>@D      SparseStep(...).update(gradient) at P = 1 (one-worker transport), D = --step-d
                    for every --schemes entry
    <scheme>-update@D   the same SparseStep's update(gradient, out) into a device buffer (what
                    the adapters run) for every --update-schemes entry
    sketch-select@D, sketch-select-filtered@D   the sketch's selection alone (5 rows, 10 k
                    columns, the table of a Gaussian residual), without and with the kernel's
                    row bitmaps in pass 1 (ops.sketch_select runs without: the filtered
                    pass measured slower); D = --step-d, when "sketch" is in --schemes

For each case: the median wall time of --repeats calls (synchronised around each), then one
profiled call per repeat under torch.profiler: per kernel name its calls and device time per
call, the device-busy time per call (the sum of kernel, copy and set times), and "host + idle" =
wall - busy. Written to --json and printed as tables; a case that fails is recorded as its error.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import torch
from gpu_common import JsonRecord, dump_stacks_on_term, ensure_parent, error_record
from gpu_step import SCHEMES

from gtopk_hvd import ops
from gtopk_hvd.core import SparseStep
from gtopk_hvd.schemes.sketch import sketch_keys
from gtopk_hvd.transports.local import LocalGroup


def parse_arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--topk-d", type=float, nargs="*", default=[1e8, 1e9])
    parser.add_argument("--step-d", type=float, nargs="*", default=[25.6e6, 1e9])
    parser.add_argument("--schemes", nargs="*", choices=sorted(SCHEMES),
                        default=["gtopk", "topk", "gtopk-momentum", "sketch"])
    parser.add_argument("--update-schemes", nargs="*", choices=sorted(SCHEMES),
                        default=["gtopk", "micro"])
    parser.add_argument("--density", type=float, default=0.001)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--top", type=int, default=12, help="kernels listed per case")
    parser.add_argument("--json", required=True)
    return parser.parse_args()


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def profile_call(fn: Callable[[], object], device: torch.device, repeats: int, top: int
                 ) -> dict[str, Any]:
    """Median wall time of fn, and its device kernels under the profiler (module docstring)."""
    fn()  # warm-up: kernel loading, allocator growth
    walls = []
    for _ in range(repeats):
        synchronize(device)
        start = time.perf_counter()
        fn()
        synchronize(device)
        walls.append(time.perf_counter() - start)
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=activities) as profiler:
        for _ in range(repeats):
            fn()
            synchronize(device)
    per_kernel: dict[str, list[float]] = defaultdict(list)
    busy_us = 0.0
    for event in profiler.events():
        if event.device_type != torch.autograd.DeviceType.CUDA:
            continue  # host events; kernels, copies and sets are the device's
        per_kernel[event.name].append(event.time_range.elapsed_us())
        busy_us += event.time_range.elapsed_us()
    kernels = sorted(({"name": name[:120], "calls_per_call": len(times) / repeats,
                       "us_per_call": sum(times) / repeats}
                      for name, times in per_kernel.items()),
                     key=lambda row: -row["us_per_call"])
    wall_us = statistics.median(walls) * 1e6
    busy = busy_us / repeats
    return {"wall_us": wall_us, "device_busy_us": busy, "host_and_idle_us": wall_us - busy,
            "launches_per_call": sum(len(t) for t in per_kernel.values()) / repeats,
            "kernels": kernels[:top], "kernels_listed_of": len(kernels)}


def read_case(device: torch.device, d: int) -> Callable[[], object]:
    x = torch.randn(d, device=device, generator=torch.Generator(device).manual_seed(0))
    return lambda: torch.amax(x)


def topk_case(device: torch.device, d: int, density: float) -> Callable[[], object]:
    x = torch.randn(d, device=device, generator=torch.Generator(device).manual_seed(0))
    k = max(1, int(density * d))
    return lambda: ops.topk_abs(x, k)


def fused_case(device: torch.device, d: int, density: float) -> Callable[[], object]:
    seeded = torch.Generator(device)
    gradient = torch.randn(d, device=device, generator=seeded.manual_seed(1))
    residual = torch.randn(d, device=device, generator=seeded.manual_seed(3))
    k = max(1, int(density * d))
    return lambda: ops.accumulate_select(gradient, residual, k)


def step_case(device: torch.device, d: int, density: float, scheme: str, update: bool = False
              ) -> Callable[[], object]:
    gradient = torch.randn(d, device=device, generator=torch.Generator(device).manual_seed(1))
    step = SparseStep(SCHEMES[scheme](density), [d], LocalGroup(1).transports[0], device=device)
    if update:
        out = torch.empty_like(gradient)
        return lambda: step.update(gradient, out)
    return lambda: step.update(gradient)


def sketch_select_case(device: torch.device, d: int, density: float, row_filter: bool
                       ) -> Callable[[], object]:
    residual = torch.randn(d, device=device, generator=torch.Generator(device).manual_seed(2))
    k = max(1, int(density * d))
    keys, columns = sketch_keys(5, 3), 10 * k
    table = ops.sketch_table(None, residual, keys, columns)
    if device.type != "cuda":  # the dry run: the CPU has one selection
        return lambda: ops.sketch_select(table, keys, k, d=d)
    return lambda: ops.sketch._cuda_sketch_select(table, keys, columns, k, d, None,
                                           row_filter=row_filter)


def print_case(name: str, record: dict[str, Any]) -> None:
    if "error" in record:
        print(f"{name}: error {record['error']}", flush=True)
        return
    print(f"{name}: wall {record['wall_us']:.0f} us, device busy {record['device_busy_us']:.0f} "
          f"us, host + idle {record['host_and_idle_us']:.0f} us, "
          f"{record['launches_per_call']:.0f} device operations", flush=True)
    for row in record["kernels"]:
        print(f"    {row['us_per_call']:9.1f} us  x{row['calls_per_call']:<5g} {row['name']}")


def main() -> None:
    args = parse_arguments()
    dump_stacks_on_term()
    ensure_parent(args.json)
    device = torch.device(args.device)
    if device.type == "cuda" and not (torch.cuda.is_available() and ops.cuda_built):
        raise SystemExit("gpu_profile: needs a GPU and the CUDA kernels")
    out = JsonRecord(args.json, device=str(device), density=args.density, cases={})
    cases: list[tuple[str, Callable[[], Callable[[], object]]]] = []
    for size in sorted(set(args.topk_d) | set(args.step_d)):
        cases.append((f"read@{int(size)}", lambda d=int(size): read_case(device, d)))
    for size in args.topk_d:
        cases.append((f"topk@{int(size)}",
                      lambda d=int(size): topk_case(device, d, args.density)))
    for size in args.step_d:
        cases.append((f"fused@{int(size)}",
                      lambda d=int(size): fused_case(device, d, args.density)))
        for scheme in args.schemes:
            cases.append((f"{scheme}@{int(size)}",
                          lambda d=int(size), s=scheme: step_case(device, d, args.density, s)))
        if "sketch" in args.schemes:
            for suffix, row_filter in (("", False), ("-filtered", True)):
                cases.append((f"sketch-select{suffix}@{int(size)}",
                              lambda d=int(size), f=row_filter: sketch_select_case(
                                  device, d, args.density, f)))
        for scheme in args.update_schemes:
            cases.append((f"{scheme}-update@{int(size)}",
                          lambda d=int(size), s=scheme: step_case(device, d, args.density, s,
                                                                  update=True)))
    for name, make in cases:
        try:
            record = profile_call(make(), device, args.repeats, args.top)
        except Exception as error:  # noqa: BLE001 - a failed case is recorded, the rest run
            record = error_record(error)
        if device.type == "cuda":
            torch.cuda.empty_cache()
        out.data["cases"][name] = record
        out.save()
        print_case(name, record)


if __name__ == "__main__":
    main()
