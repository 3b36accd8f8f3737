"""Top-k by magnitude: gtopk_hvd vs torch.topk(x.abs(), k, sorted=False) vs a read-only pass.

All three run on the same array in the same process; the ratios are what to read, since the
machines are shared and absolute times drift. CPU always; CUDA too when torch sees a GPU and the
extension was built with CUDA. Data: Gaussian float32 (gradients are close to that).

Columns (times: the median of --repeats runs):
  ours ms     gtopk_hvd's top-k (ops.topk_abs), no hint
  hint ms     the same with threshold_hint = 0.95 x the k-th largest magnitude, as the step
              passes the last step's threshold: how fast it is when the hint is good (CPU only)
  read ms     one multi-threaded read of the array: the least any exact top-k can cost
  torch ms    torch.topk(x.abs(), k, sorted=False)
  ours/read   ours over the read: 1 is the floor
  torch/ours  how many times faster ours is than torch.topk
  GB/s ours   4 d bytes over ours
  ours +-%, read +-%   the spread of the repeats: (slowest - fastest) / median
The header says how many threads each side used; a warning follows the table when the machine
looks loaded (its load average above its cores, or the read pass's repeats spread by more than
25% of their median).
"""

from __future__ import annotations

import argparse
import json
import os

import numpy as np

from gtopk_hvd import _C, ops
from gtopk_hvd.bench.timing import Timing, load_warning, median_seconds, read_floor, timed


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--sizes", type=float, nargs="+", default=[1e6, 1e7, 1e8],
                        help="numbers of values d")
    parser.add_argument("--densities", type=float, nargs="+", default=[0.001, 0.01],
                        help="k / d")
    parser.add_argument("--repeats", type=int, default=5, help="timed runs of ours and the floor")
    parser.add_argument("--torch-repeats", type=int, default=2, help="timed runs of torch.topk")
    parser.add_argument("--device", choices=["cpu", "cuda", "all"], default="all",
                        help="where the rows run (all: the CPU, and a GPU if there is one)")
    parser.add_argument("--json", metavar="PATH", default=None,
                        help="also write the rows (seconds) to PATH")


def cpu_rows(d: int, densities: list[float], repeats: int, torch_repeats: int) -> list[dict]:
    import torch

    x_torch = torch.randn(d, generator=torch.Generator().manual_seed(0))
    x = x_torch.numpy()
    floor = timed(lambda: read_floor(x), repeats)
    rows = []
    for density in densities:
        k = max(1, int(d * density))
        ours = timed(lambda k=k: ops.topk_abs(x, k), repeats)
        _, values = ops.topk_abs(x, k)
        hint = 0.95 * float(np.abs(values).min())  # the last k-th magnitude, less a margin
        ours_hint = median_seconds(lambda k=k, hint=hint: ops.topk_abs(x, k, threshold_hint=hint),
                                 repeats)
        reference = median_seconds(lambda k=k: torch.topk(x_torch.abs(), k, sorted=False),
                                   torch_repeats, warmup=0)
        rows.append(dict(device="cpu", d=d, k=k, ours=ours, ours_hint=ours_hint, floor=floor,
                         torch=reference))
    return rows


def cuda_rows(d: int, densities: list[float], repeats: int) -> list[dict]:
    import torch

    x = torch.randn(d, device="cuda", generator=torch.Generator("cuda").manual_seed(0))
    sync = torch.cuda.synchronize
    floor = timed(lambda: torch.amax(x), repeats, synchronize=sync)
    rows = []
    for density in densities:
        k = max(1, int(d * density))
        ours = timed(lambda k=k: ops.topk_abs(x, k), repeats, synchronize=sync)
        reference = median_seconds(lambda k=k: torch.topk(x.abs(), k, sorted=False), repeats,
                                   synchronize=sync)
        rows.append(dict(device="cuda", d=d, k=k, ours=ours, ours_hint=float("nan"), floor=floor,
                         torch=reference))
    return rows


def print_table(rows: list[dict]) -> None:
    """The rows (module docstring's columns); ours and floor are Timings."""
    header = (f"{'device':6} {'d':>11} {'k':>9} {'ours ms':>9} {'hint ms':>9} {'read ms':>9} "
              f"{'torch ms':>10} {'ours/read':>9} {'torch/ours':>10} {'GB/s ours':>9} "
              f"{'ours +-%':>8} {'read +-%':>8}")
    print(header)
    print("-" * len(header))
    for r in rows:
        ours, floor = r["ours"].median, r["floor"].median
        print(f"{r['device']:6} {r['d']:>11,} {r['k']:>9,} {ours * 1e3:9.2f} "
              f"{r['ours_hint'] * 1e3:9.2f} {floor * 1e3:9.2f} {r['torch'] * 1e3:10.1f} "
              f"{ours / floor:9.2f} {r['torch'] / ours:10.1f} "
              f"{4 * r['d'] / ours / 1e9:9.1f} {100 * r['ours'].spread:8.0f} "
              f"{100 * r['floor'].spread:8.0f}", flush=True)


def explain() -> str:
    """The lines printed under the table: what hint ms and the spreads mean."""
    return ("hint ms: ours given threshold_hint = 0.95 x the k-th largest magnitude (what the "
            "step passes from the last step; nan: not measured on a GPU). +-%: (slowest - "
            "fastest) / median of the repeats. `bench topk -h` explains every column.")


def run(args: argparse.Namespace) -> None:
    import torch

    rows = []
    for size in args.sizes:
        d = int(size)
        if args.device in ("cpu", "all"):
            rows += cpu_rows(d, args.densities, args.repeats, args.torch_repeats)
        if args.device in ("cuda", "all") and torch.cuda.is_available() and ops.cuda_built:
            rows += cuda_rows(d, args.densities, args.repeats)
    print(f"threads: {torch.get_num_threads()} torch, {ops.get_num_threads()} ours "
          f"({thread_source()}); CUDA kernels built: {ops.cuda_built}; GPU: "
          f"{torch.cuda.is_available()}; CPU SIMD: {_C.simd_level()} (ours, float32)")
    print_table(rows)
    if args.json:
        with open(args.json, "w") as file:
            json.dump(rows, file, indent=1, default=_as_json)
    print(explain())
    reads = [r["floor"] for r in rows if r["device"] == "cpu"]
    warning = load_warning(max(reads, key=lambda t: t.spread) if reads else None)
    if warning:
        print(warning, flush=True)


def _as_json(value: object) -> float:
    """A row's Timing as its median seconds (what --json writes)."""
    if isinstance(value, Timing):
        return value.median
    raise TypeError(f"not JSON: {type(value).__name__}")


def thread_source() -> str:
    """Where ours' thread count comes from: OMP_NUM_THREADS, or gtopk_hvd.threads' rule."""
    if os.environ.get("OMP_NUM_THREADS"):
        return f"OMP_NUM_THREADS={os.environ['OMP_NUM_THREADS']}"
    return "gtopk_hvd.threads' default for this machine"

