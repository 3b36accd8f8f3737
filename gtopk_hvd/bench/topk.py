"""Top-k by magnitude: gtopk_hvd vs torch.topk(x.abs(), k, sorted=False) vs a read-only pass.

All three run on the same array in the same process; the ratios are what to read, since the
machines are shared and absolute times drift. CPU always; CUDA too when torch sees a GPU and the
extension was built with CUDA. Data: Gaussian float32 (gradients are close to that).
"""

from __future__ import annotations

import argparse
import json

import numpy as np

from gtopk_hvd import _C, ops
from gtopk_hvd.bench.timing import median_seconds


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--sizes", type=float, nargs="+", default=[1e6, 1e7, 1e8],
                        help="numbers of values d")
    parser.add_argument("--densities", type=float, nargs="+", default=[0.001, 0.01],
                        help="k / d")
    parser.add_argument("--repeats", type=int, default=5, help="timed runs of ours and the floor")
    parser.add_argument("--torch-repeats", type=int, default=2, help="timed runs of torch.topk")
    parser.add_argument("--device", choices=["cpu", "cuda", "all"], default="all")
    parser.add_argument("--json", metavar="PATH", default=None,
                        help="also write the rows (seconds) to PATH")


def cpu_rows(d: int, densities: list[float], repeats: int, torch_repeats: int) -> list[dict]:
    import torch

    x_torch = torch.randn(d, generator=torch.Generator().manual_seed(0))
    x = x_torch.numpy()
    floor = median_seconds(lambda: _C.read_pass(x), repeats)
    rows = []
    for density in densities:
        k = max(1, int(d * density))
        ours = median_seconds(lambda k=k: ops.topk_abs(x, k), repeats)
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
    floor = median_seconds(lambda: torch.amax(x), repeats, synchronize=sync)
    rows = []
    for density in densities:
        k = max(1, int(d * density))
        ours = median_seconds(lambda k=k: ops.topk_abs(x, k), repeats, synchronize=sync)
        reference = median_seconds(lambda k=k: torch.topk(x.abs(), k, sorted=False), repeats,
                                   synchronize=sync)
        rows.append(dict(device="cuda", d=d, k=k, ours=ours, ours_hint=float("nan"), floor=floor,
                         torch=reference))
    return rows


def print_table(rows: list[dict]) -> None:
    header = (f"{'device':6} {'d':>11} {'k':>9} {'ours ms':>9} {'hint ms':>9} {'read ms':>9} "
              f"{'torch ms':>10} {'ours/read':>9} {'torch/ours':>10} {'GB/s ours':>9}")
    print(header)
    print("-" * len(header))
    for r in rows:
        print(f"{r['device']:6} {r['d']:>11,} {r['k']:>9,} {r['ours'] * 1e3:9.2f} "
              f"{r['ours_hint'] * 1e3:9.2f} {r['floor'] * 1e3:9.2f} {r['torch'] * 1e3:10.1f} "
              f"{r['ours'] / r['floor']:9.2f} {r['torch'] / r['ours']:10.1f} "
              f"{4 * r['d'] / r['ours'] / 1e9:9.1f}", flush=True)


def run(args: argparse.Namespace) -> None:
    import torch

    rows = []
    for size in args.sizes:
        d = int(size)
        if args.device in ("cpu", "all"):
            rows += cpu_rows(d, args.densities, args.repeats, args.torch_repeats)
        if args.device in ("cuda", "all") and torch.cuda.is_available() and ops.cuda_built:
            rows += cuda_rows(d, args.densities, args.repeats)
    print(f"threads: {torch.get_num_threads()} torch, OpenMP default for ours; "
          f"CUDA kernels built: {ops.cuda_built}; GPU: {torch.cuda.is_available()}; "
          f"CPU SIMD: {_C.simd_level()} (ours, float32)")
    print_table(rows)
    if args.json:
        with open(args.json, "w") as file:
            json.dump(rows, file, indent=1)
