"""The core step at P = 1 on a GPU, per scheme: time against the fused accumulate-and-select
kernel alone and a read pass, and the peak memory it adds.

    python scripts/gpu/gpu_step.py --json step.json                      # d = 25.6M and 1e9, CUDA
    python scripts/gpu/gpu_step.py --device cpu --sizes 2e5 --json step.json   # a dry run

For each d (one flat float32 gradient, Gaussian) in the same process:

    read        torch.amax(x): one read of d values (the floor of any pass)
    fused       ops.accumulate_select(gradient, residual, k) alone: the fused accumulate-and-
                select kernel every error-feedback scheme's step contains
    <scheme>    SparseStep(config, [d], a one-worker transport, device).update(gradient): the
                whole step (the non-finite check, selection, the exchange with itself, the
                residual update, the global set copied to the host: step's return), median of
                --steps after one warm-up step
    update      update(gradient, out) into a device buffer of a fresh SparseStep of the same
                configuration: what the adapters run (the set stays on the device, written
                into out), median of --steps after one warm-up; reported beside the step, not
                in its memory

Targets: step <= 1.5 x fused, every scheme; exact gTop-k <= 1.3 x gTop-k; sketch
<= 10 read passes. Memory (CUDA only): the gradient is allocated first; the peak of
torch.cuda.max_memory_allocated over the SparseStep's construction and all its steps, less what
was allocated before, is the step's extra memory, in units of the gradient's bytes; target <= the
state (1x: the residual; 2x with momentum correction's velocity) + 0.05x. "steady" is the same
over one later step alone, from what was allocated just before it. Memory the extension takes
outside torch's allocator is not in these counters: its growth from before the SparseStep to
after its steps (device memory in use less torch's reserved memory) is recorded beside them.

Granularity (--granularity-d): gTop-k at density 0.001 over ResNet-50's 161 tensor sizes,
granularity "bucket" (each tensor its own share) against "model" (one selection): target bucket
<= 1.5 x model.

A measurement whose first step takes longer than --budget-s keeps that one step as its figure
(noted "1 step"); a size listed in --skip-slow (sketch at 1e9 by default: host numpy, minutes)
is not run (none by default: the sketch runs on the GPU since its CUDA kernels).
"""

from __future__ import annotations

import argparse
import functools
import gc
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
from gpu_common import JsonRecord, dump_stacks_on_term, ensure_parent, error_record, resnet50_sizes

from gtopk_hvd import ops
from gtopk_hvd.compression import Compression
from gtopk_hvd.core import SparseStep
from gtopk_hvd.transports.local import LocalGroup

DENSITY = 0.001
SCHEMES: dict[str, Callable[[float], Any]] = {
    "gtopk": lambda density: Compression.gtopk(density),
    "topk": lambda density: Compression.topk(density),
    "micro": lambda density: Compression.micro(density),
    "exdyna": lambda density: Compression.exdyna(density),
    "gtopk-exact": lambda density: Compression.gtopk(density, exact=True),
    "gtopk-momentum": lambda density: Compression.gtopk(density, momentum_correction=True),
    "sketch": lambda density: Compression.sketch(density),
}


def parse_arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--sizes", type=float, nargs="+", default=[25.6e6, 1e9])
    parser.add_argument("--density", type=float, default=DENSITY)
    parser.add_argument("--schemes", nargs="+", default=list(SCHEMES), choices=list(SCHEMES))
    parser.add_argument("--steps", type=int, default=5, help="timed steps (after one warm-up)")
    parser.add_argument("--budget-s", type=float, default=8.0,
                        help="a measurement whose first step takes longer keeps that step alone")
    parser.add_argument("--skip-slow", nargs="*", default=[],
                        help="SCHEME@D pairs not run (host-bound, minutes)")
    parser.add_argument("--granularity-steps", type=int, default=5)
    parser.add_argument("--no-granularity", action="store_true")
    parser.add_argument("--json", default=None)
    return parser.parse_args()


class Device:
    """Allocation, synchronisation and memory counters of the device measured on."""

    def __init__(self, name: str) -> None:
        self.device = torch.device("cuda", 0) if name == "cuda" else torch.device("cpu")
        self.cuda = self.device.type == "cuda"

    def synchronize(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()

    def allocated(self) -> int | None:
        return torch.cuda.memory_allocated() if self.cuda else None

    def reset_peak(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()

    def peak(self) -> int | None:
        return torch.cuda.max_memory_allocated() if self.cuda else None

    def outside_torch(self) -> int | None:
        """Device memory in use that torch's allocator does not hold (the CUDA context, and
        whatever the extension allocates itself): its growth over a step is memory the peak
        above cannot see (held after the step only)."""
        if not self.cuda:
            return None
        free, total = torch.cuda.mem_get_info()
        return total - free - torch.cuda.memory_reserved()

    def free(self) -> None:
        gc.collect()
        if self.cuda:
            torch.cuda.empty_cache()

    def median(self, fn: Callable[[], object], repeats: int) -> float:
        fn()
        self.synchronize()
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            fn()
            self.synchronize()
            times.append(time.perf_counter() - start)
        return statistics.median(times)


def floors(dev: Device, d: int, k: int, repeats: int) -> dict[str, float]:
    generator = torch.Generator(dev.device).manual_seed(0)
    residual = torch.randn(d, device=dev.device, generator=generator)
    gradient = torch.zeros(d, device=dev.device)
    return {"read_s": dev.median(lambda: torch.amax(residual), repeats),
            "fused_s": dev.median(lambda: ops.accumulate_select(gradient, residual, k), repeats)}


def measure_step(dev: Device, config: Any, sizes: list[int], steps: int, budget_s: float
                 ) -> dict[str, Any]:
    """One scheme's step: median time and peak extra memory (module docstring)."""
    d = sum(sizes)
    gradient = torch.randn(d, device=dev.device,
                           generator=torch.Generator(dev.device).manual_seed(1))
    dev.reset_peak()
    before = dev.allocated()
    outside_before = dev.outside_torch()
    transport = LocalGroup(1).transports[0]
    step = SparseStep(config, sizes, transport, device=dev.device)
    state_bytes = 4 * d * (2 if step.velocity is not None else 1)
    dev.synchronize()
    start = time.perf_counter()
    step.update(gradient)
    dev.synchronize()
    first_s = time.perf_counter() - start
    times = []
    if first_s <= budget_s:
        for _ in range(steps):
            dev.synchronize()
            start = time.perf_counter()
            step.update(gradient)
            dev.synchronize()
            times.append(time.perf_counter() - start)
    peak = dev.peak()
    record: dict[str, Any] = {
        "d": d, "tensors": len(sizes), "k": max(1, int(config.density * d)),
        "first_step_s": first_s, "timed_steps": len(times),
        "median_s": statistics.median(times) if times else first_s,
        "note": "" if times else f"1 step (the first took {first_s:.1f} s > budget)",
        "state_bytes": state_bytes, "gradient_bytes": 4 * d}
    if dev.cuda:
        extra = peak - before
        record.update(peak_extra_bytes=extra, peak_extra_x_gradient=extra / (4 * d),
                      memory_target_x_gradient=state_bytes / (4 * d) + 0.05,
                      outside_torch_growth_bytes=dev.outside_torch() - outside_before)
    if dev.cuda and times:  # a slow scheme's step is not run again for the steady figure
        dev.reset_peak()
        steady_before = dev.allocated()
        step.update(gradient)
        steady = dev.peak() - steady_before
        record["steady_extra_x_gradient"] = steady / (4 * d)
    if times:  # what the adapters run: the dense update written into a device buffer, by a
        # fresh step as the set's figure was (the same gradient added again and again flattens
        # the residual's tail, which the selection sees)
        del step
        step = SparseStep(config, sizes, transport, device=dev.device)
        out = torch.empty_like(gradient)
        record["update_median_s"] = dev.median(functools.partial(step.update, gradient, out),
                                               steps)
        del out
    del step, gradient
    dev.free()
    return record


def main() -> None:
    args = parse_arguments()
    dump_stacks_on_term()
    ensure_parent(args.json)
    dev = Device(args.device)
    if dev.cuda and not (torch.cuda.is_available() and ops.cuda_built):
        raise SystemExit(f"gpu_step: needs a GPU and the CUDA kernels (built: {ops.cuda_built}, "
                         f"GPU: {torch.cuda.is_available()})")
    out = JsonRecord(args.json, device=str(dev.device), density=args.density,
                     cuda_kernels=ops.cuda_built, steps=args.steps,
                     gpu=torch.cuda.get_device_name() if dev.cuda else None,
                     sizes={}, granularity=None)
    out.save()
    skipped = {(item.partition("@")[0], int(float(item.partition("@")[2])))
               for item in args.skip_slow}
    for size in args.sizes:
        d = int(size)
        k = max(1, int(args.density * d))
        entry: dict[str, Any] = {"d": d, "k": k, "schemes": {}}
        out.data["sizes"][str(d)] = entry
        try:
            entry.update(floors(dev, d, k, args.steps))
            dev.free()
            print(f"d={d:,}: read {entry['read_s'] * 1e3:.3f} ms, fused accumulate-select "
                  f"{entry['fused_s'] * 1e3:.3f} ms", flush=True)
        except Exception as error:  # noqa: BLE001 - recorded, the schemes still run
            entry["floors_error"] = error_record(error)
        out.save()
        try:  # a discarded run first: the first scheme timed at a size ran slow (2026-11-26)
            measure_step(dev, SCHEMES[args.schemes[0]](args.density), [d], 1, args.budget_s)
        except Exception:  # noqa: BLE001, S110 - the measured run records any error
            pass
        dev.free()
        for name in args.schemes:
            if (name, d) in skipped:
                entry["schemes"][name] = {"skipped": "listed in --skip-slow (host-bound)"}
                continue
            try:
                record = measure_step(dev, SCHEMES[name](args.density), [d], args.steps,
                                      args.budget_s)
                if "fused_s" in entry:
                    record["ratio_to_fused"] = record["median_s"] / entry["fused_s"]
                    if "update_median_s" in record:
                        record["update_ratio_to_fused"] = (record["update_median_s"]
                                                           / entry["fused_s"])
                if "read_s" in entry:
                    record["read_passes"] = record["median_s"] / entry["read_s"]
            except Exception as error:  # noqa: BLE001 - a failed scheme is a figure
                record = error_record(error)
                dev.free()
            entry["schemes"][name] = record
            print(f"  {name}: {_summary(record)}", flush=True)
            out.save()
        plain, exact = entry["schemes"].get("gtopk", {}), entry["schemes"].get("gtopk-exact", {})
        if "median_s" in plain and "median_s" in exact:
            entry["exact_over_gtopk"] = exact["median_s"] / plain["median_s"]
        out.save()
    if not args.no_granularity:
        sizes = resnet50_sizes()
        if args.device == "cpu":  # a dry run: the same 161 tensors, a hundredth of the values
            sizes = [max(1, n // 100) for n in sizes]
        granularity: dict[str, Any] = {"tensors": len(sizes), "d": sum(sizes)}
        out.data["granularity"] = granularity
        for mode in ("model", "bucket"):
            try:
                granularity[mode] = measure_step(
                    dev, Compression.gtopk(args.density, granularity=mode), sizes,
                    args.granularity_steps, args.budget_s)
            except Exception as error:  # noqa: BLE001 - recorded
                granularity[mode] = error_record(error)
            print(f"granularity {mode}: {_summary(granularity[mode])}", flush=True)
            out.save()
        if "median_s" in granularity.get("model", {}) and \
                "median_s" in granularity.get("bucket", {}):
            granularity["bucket_over_model"] = (granularity["bucket"]["median_s"]
                                                / granularity["model"]["median_s"])
        out.save()


def _summary(record: dict) -> str:
    if "error" in record:
        return f"FAILED {record['error']}"
    if "skipped" in record:
        return f"skipped ({record['skipped']})"
    text = f"{record['median_s'] * 1e3:.3f} ms"
    if "ratio_to_fused" in record:
        text += f" = {record['ratio_to_fused']:.2f} x fused"
    if "update_ratio_to_fused" in record:
        text += f"; update {record['update_ratio_to_fused']:.2f} x fused"
    if "peak_extra_x_gradient" in record:
        text += (f", peak extra {record['peak_extra_x_gradient']:.2f} x gradient (target <= "
                 f"{record['memory_target_x_gradient']:.2f})")
    return text + (f" [{record['note']}]" if record.get("note") else "")


if __name__ == "__main__":
    main()
