"""Every scheme's step on P workers: bytes per worker against its formula, and time.

    mpirun -np P python -m gtopk_hvd.bench schemes [--parameters D] [--density 0.001]
        [--schemes dense topk gtopk ...] [--k-sets recorded.npz] [--json PATH]

Each worker runs each scheme's core step (`gtopk_hvd.core.SparseStep`; dense: the all-reduce of
the whole gradient) for --steps steps on its own heavy-tailed gradient (Student-t, 3 degrees of
freedom, scales varying along the vector: gradient-like), over the transport. With --k-sets the
gradient is worker r's recorded one instead (a file written by `examples/simulated_cluster.py
--record-k-sets`: the largest entries of each worker's residual + gradient in a real run, d and
P from the file), below them noise smaller than the smallest recorded magnitude. Bytes are the
step's count of what this worker sends (each collective counted as a ring moves it, each
message as sent), the mean over the steps after the first and the largest over workers; the
formula is the scheme's leading term, with k = density d and |I| the union's size where the
scheme sends the union: dense's ring all-reduce, 2 4 d (P-1)/P, and each sparse scheme's own
(`Scheme.wire`, in the scheme's module: the planner reads the same).

"selected" is |I| / k. Time: each worker's step minus its own selection and write-back (what
the step spends communicating and merging), the slowest worker's, median over the steps after
the first. "latency" is the median time of a one-byte exchange between ranks 0 and P-1 (both
send, both receive): the per-message latency of the cost model, measured. Rank 0 prints and
writes --json (one record per scheme: the cost model's input, `scripts/studies/link_scale.py`).
"""

from __future__ import annotations

import argparse
import json
import math
import time
from collections.abc import Callable
from functools import partial

import numpy as np

from gtopk_hvd.bench.timing import barrier, slowest
from gtopk_hvd.compression import Compression
from gtopk_hvd.core import SparseStep
from gtopk_hvd.reductions import dense_allreduce
from gtopk_hvd.schemes import known_scheme_names, scheme_of
from gtopk_hvd.transports import Transport
from gtopk_hvd.transports.launch import LAUNCHABLE, close_transports, open_transport


def configurations() -> dict[str, Callable[[float], object] | None]:
    """"dense" and every registered scheme by its name (`gtopk_hvd.schemes.known_scheme_names`),
    each made by `Compression.scheme(name, density)`."""
    return {"dense": None, **{name: partial(Compression.scheme, name)
                              for name in known_scheme_names()}}
LATENCY_REPEATS = 200


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--parameters", type=int, default=1_000_000, help="d")
    parser.add_argument("--density", type=float, default=0.001, help="k / d")
    parser.add_argument("--steps", type=int, default=6, help="steps per scheme")
    names = list(configurations())
    parser.add_argument("--schemes", nargs="+", default=names[1:], choices=names,
                        help="the schemes, by their names")
    parser.add_argument("--k-sets", metavar="NPZ", default=None,
                        help="each worker's recorded gradient (simulated_cluster.py "
                             "--record-k-sets) instead of a random one; d from the file")
    parser.add_argument("--json", metavar="PATH", default=None,
                        help="also write one record per scheme to PATH (rank 0)")
    parser.add_argument("--transport", default="mpi", choices=LAUNCHABLE,
                        help="how the workers communicate (start them with its launcher)")


def formula(name: str, d: int, k: int, union: float, size: int, config: object) -> float:
    """The scheme's leading bytes per worker per step (module docstring)."""
    if name == "dense":
        return 2 * 4 * d * (size - 1) / size
    return scheme_of(config).wire(config, size, d, k, union).bytes


def gradient(d: int, rank: int, step: int) -> np.ndarray:
    rng = np.random.default_rng([rank, step])
    scale = np.repeat(rng.uniform(0.05, 2.0, 64), -(-d // 64))[:d]
    return (rng.standard_t(3, d) * scale).astype(np.float32)


def recorded_gradient(path: str, rank: int, size: int) -> np.ndarray:
    """Worker `rank`'s recorded entries, and below them uniform noise of at most half the
    smallest recorded magnitude (so that every selection ranks the recorded entries first)."""
    with np.load(path) as recorded:
        if int(recorded["workers"]) != size:
            raise SystemExit(f"{path} holds {int(recorded['workers'])} workers' sets; this job "
                             f"has {size} workers")
        d = int(recorded["d"])
        indices, values = recorded["indices"][rank], recorded["values"][rank]
    floor = 0.5 * float(np.abs(values).min())
    out = np.random.default_rng(rank).uniform(-floor, floor, d).astype(np.float32)
    out[indices] = values
    return out


def exchange_latency_s(transport: Transport) -> float:
    """Median seconds of a one-byte exchange between ranks 0 and P-1 (module docstring)."""
    last = transport.size - 1
    send, receive = np.zeros(1, np.uint8), np.zeros(1, np.uint8)
    partner = {0: last, last: 0}.get(transport.rank)
    times = []
    barrier(transport)
    for repeat in range(LATENCY_REPEATS):
        start = time.perf_counter()
        transport.sendrecv(send, 1 if partner is not None else 0, partner, receive, partner,
                           tag=repeat)
        times.append(time.perf_counter() - start)
    return float(transport.allgather(np.array([np.median(times[1:])]))[[0, last], 0].max())


def measure(name: str, density: float, sizes: list[int], transport: Transport, steps: int,
            data_for_step: Callable[[int], np.ndarray]) -> dict:
    """One scheme's row: bytes, union and communication time over `steps` steps."""
    d = sum(sizes)
    make = configurations()[name]
    config = None if make is None else make(density)
    step = None if config is None else SparseStep(config, sizes, transport)
    sent, unions, seconds = [], [], []
    for t in range(steps):
        data = data_for_step(t)
        barrier(transport)
        start = time.perf_counter()
        if step is None:
            stats = dense_allreduce(data, transport)
            own, sent_now, union = time.perf_counter() - start, stats.bytes_sent, d
        else:
            step.update(data)
            stats = step.last_stats
            own = time.perf_counter() - start - stats.select_seconds - stats.write_seconds
            sent_now, union = stats.bytes_sent, stats.global_entries
        seconds.append(slowest(transport, own))
        if t > 0:
            sent.append(sent_now)
            unions.append(union)
    k = max(1, math.ceil(density * d))
    union = float(np.mean(unions))
    return {"scheme": name, "workers": transport.size, "d": d, "density": density, "k": k,
            "selected": union / k,
            "bytes": float(transport.allgather(np.array([np.mean(sent)]))[:, 0].max()),
            "formula_bytes": formula(name, d, k, union, transport.size, config),
            "seconds": float(np.median(seconds[1:]))}


def run(args: argparse.Namespace) -> None:
    transport = open_transport(args.transport)
    size, rank = transport.size, transport.rank
    if args.k_sets:
        recorded = recorded_gradient(args.k_sets, rank, size)
        d, source = recorded.size, f"recorded in {args.k_sets}"

        def data_for_step(t: int) -> np.ndarray:
            return recorded.copy()
    else:
        d, source = args.parameters, "random (Student-t)"

        def data_for_step(t: int) -> np.ndarray:
            return gradient(d, rank, t)
    k = max(1, math.ceil(args.density * d))
    latency = exchange_latency_s(transport) if size > 1 else 0.0
    if rank == 0:
        print(f"workers: {size}; transport: {args.transport}; d = {d:,}; density "
              f"{args.density} (k = {k:,}); gradients: {source}; bytes: sent per worker per "
              f"step, mean of steps 2..{args.steps}, largest worker; time: slowest worker's "
              f"communication, median; latency (one-byte exchange): {latency * 1e6:.0f} us")
        print(f"{'scheme':12} {'selected':>9} {'bytes':>12} {'formula':>12} {'ratio':>6} "
              f"{'comm ms':>8}")
    rows = []
    for name in args.schemes:
        row = measure(name, args.density, [d], transport, args.steps, data_for_step)
        row.update(latency_s=latency, gradients="recorded" if args.k_sets else "random")
        rows.append(row)
        if rank == 0:
            ratio = row["bytes"] / row["formula_bytes"] if row["formula_bytes"] else math.nan
            print(f"{name:12} {row['selected']:9.3f} {row['bytes']:12,.0f} "
                  f"{row['formula_bytes']:12,.0f} {ratio:6.3f} {row['seconds'] * 1e3:8.1f}",
                  flush=True)
    if rank == 0 and args.json:
        with open(args.json, "w") as file:
            json.dump(rows, file, indent=1)
    close_transports()
