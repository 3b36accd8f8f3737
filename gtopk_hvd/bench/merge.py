"""Sparse merge of two k-sets: ours vs a plain numpy version vs a memcpy of the inputs.

    python -m gtopk_hvd.bench merge

The merge gTop-k runs log2(P) times per step: union of two index-sorted sets of k entries with
values summed, then the top-k of the union by magnitude. Sets: k indices drawn at random from
d = 25,557,032 (ResNet-50), a fraction --overlap of b's indices taken from a's, Gaussian values.
`numpy` is what one would write without our kernel (np.unique + np.add.at + argpartition);
`memcpy` copies the four input arrays once, the least any merge must move. Ours writes into
reused output arrays, as the reduction does. Ratios are what to read (same run, same data).
"""

from __future__ import annotations

import argparse

import numpy as np

from gtopk_hvd import _C, ops
from gtopk_hvd.bench.timing import median_seconds

RESNET50 = 25_557_032


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--ks", type=int, nargs="+", default=[25_557, 255_570, 2_555_703],
                        help="entries per set (ResNet-50 at density 0.001, 0.01, 0.1)")
    parser.add_argument("--d", type=int, default=RESNET50, help="index range")
    parser.add_argument("--overlap", type=float, default=0.0,
                        help="fraction of b's indices that are also in a")
    parser.add_argument("--repeats", type=int, default=7, help="timed runs of each merge")


def make_sets(k: int, d: int, overlap: float,
              rng: np.random.Generator) -> list[tuple[np.ndarray, np.ndarray]]:
    a = rng.choice(d, size=k, replace=False)
    shared = a[:int(overlap * k)]
    rest = np.setdiff1d(rng.choice(d, size=2 * k, replace=False), a)[:k - shared.size]
    b = np.concatenate([shared, rest])
    return [(np.sort(indices).astype(np.int32), rng.standard_normal(indices.size)
             .astype(np.float32)) for indices in (a, b)]


def numpy_merge(index_a: np.ndarray, value_a: np.ndarray, index_b: np.ndarray,
                value_b: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The same merge in plain numpy (ties not broken as ours: a speed baseline only)."""
    union, position = np.unique(np.concatenate([index_a, index_b]), return_inverse=True)
    summed = np.zeros(union.size, dtype=np.float32)
    np.add.at(summed, position, np.concatenate([value_a, value_b]))
    if union.size <= k:
        return union, summed
    keep = np.sort(np.argpartition(-np.abs(summed), k - 1)[:k])
    return union[keep], summed[keep]


def time_one(k: int, args: argparse.Namespace, rng: np.random.Generator,
             threads: int) -> tuple[float, float, float, float]:
    """(ours, ours on one thread, numpy, memcpy) seconds for sets of k entries."""
    (index_a, value_a), (index_b, value_b) = make_sets(k, args.d, args.overlap, rng)
    out = (np.empty(k, dtype=np.int32), np.empty(k, dtype=np.float32))
    inputs = (index_a, value_a, index_b, value_b)
    copies = [np.empty_like(x) for x in inputs]

    def ours() -> None:
        ops.merge_topk(index_a, value_a, index_b, value_b, k, out=out)

    ours_s = median_seconds(ours, args.repeats)
    ops.set_num_threads(1)
    ours_1_s = median_seconds(ours, args.repeats)
    ops.set_num_threads(threads)
    numpy_s = median_seconds(lambda: numpy_merge(*inputs, k), max(1, args.repeats // 2))
    memcpy_s = median_seconds(lambda: [np.copyto(c, x) for c, x in zip(copies, inputs)],
                              args.repeats)
    return ours_s, ours_1_s, numpy_s, memcpy_s


def run(args: argparse.Namespace) -> None:
    rng = np.random.default_rng(0)
    threads = ops.get_num_threads()
    rows = [(k, *time_one(k, args, rng, threads)) for k in args.ks]
    print(f"threads: {threads} (ours), 1 (ours 1t); d = {args.d:,}; overlap {args.overlap}; "
          f"median of {args.repeats}; CPU SIMD: {_C.simd_level()} (ours, float32 / int32)")
    header = (f"{'k':>10} | {'ours ms':>8} {'ours 1t':>8} {'numpy ms':>9} {'memcpy ms':>9} | "
              f"{'numpy/ours':>10} {'ours/memcpy':>11} {'ns/entry':>8}")
    print(header)
    print("-" * len(header))
    for k, ours_s, ours_1_s, numpy_s, memcpy_s in rows:
        print(f"{k:>10,} | {ours_s * 1e3:8.2f} {ours_1_s * 1e3:8.2f} {numpy_s * 1e3:9.2f} "
              f"{memcpy_s * 1e3:9.2f} | {numpy_s / ours_s:10.1f} {ours_s / memcpy_s:11.1f} "
              f"{ours_s / (2 * k) * 1e9:8.2f}", flush=True)
