"""Under torchrun (Gloo, CPU, P = 2): gtopk_hook on a torch.compile'd DDP model, every scheme.

For every sparse scheme of the hook (examples/sparse_options.py's SPARSE: topk, gtopk,
gtopk-exact, micro, exdyna, sketch, oktopk) one model, from the same initial weights on the
same batches, trains STEPS iterations (the hook's 2 dense, then sparse ones) several times,
each under a new DDP with a fresh GTopkHookState: eagerly (`ddp(x)`), and compiled
(`torch.compile(ddp, backend=...)(x)`) with each backend. Checks, on every rank:

  compiled   the backend was called for DDPOptimizer's subgraphs, one per DDP bucket (Dynamo
             splits the forward at DDP's bucket boundaries: the compiled code ran, not an
             eager fallback), and the hook ran its sparse steps (state.iter == STEPS, every one
             of the BUCKETS buckets stepped at the last iteration)
  weights    fixed buckets (find_unused_parameters=True: DDP keeps its construction-time
             buckets, the same in both runs): the compiled run's final weights equal the
             eager run's bit for bit under aot_eager (it runs the traced ATen graphs with the
             eager kernels); under inductor (generated C++ kernels, whose fused elementwise
             ops and reductions round otherwise) within TOLERANCE, with the same selections:
             every bucket's residual is zero at the same entries (the entries sent)
  rebuilt    DDP's default (buckets rebuilt after the first iteration in the order gradients
             became ready): the compiled backward delivers them in another order, so the
             compiled run's buckets hold other parameters than the eager run's; the hook
             selects per bucket, so the weights differ by whole selections, not by rounding.
             Printed (same_buckets=, max_abs_diff=); asserted: the hook ran, and if torch
             ever makes the same buckets, bitwise weights
  replicas   in every run, every rank's weights are bitwise identical (a SHA-256 of them,
             all-gathered)

Rank 0 prints one line a scheme and run:

    COMPILED scheme=topk backend=aot_eager buckets=fixed bitwise=True max_abs_diff=0.0 ...

and `compiled hook ok on 2 workers` at the end; a failed check exits non-zero after every
scheme has run (the checks fail alike on every rank, so none is left waiting in a collective).

What torch 2.13 needs for this (torch/_dynamo/backends/distributed.py, convert_frame.py):
- DDP's optimizer (`torch._dynamo.config.optimize_ddp`, default True = "ddp_optimizer") keeps
  DDP's C++ reducer, whose buckets call the hook as in eager mode, from the compiled
  backward's AccumulateGrad hooks. "python_reducer" (with compiled autograd) replaces the
  reducer: DDP then calls a comm hook once per parameter as hook(state, (grad, param)), which
  gtopk_hook refuses (NotImplementedError naming the setting: it keeps a residual a bucket).
- bucket_cap_mb >= 1: DDPOptimizer is built with DDP's bucket cap and the default first bucket
  cap (dist._DEFAULT_FIRST_BUCKET_BYTES, 1 MiB) and asserts the first is not larger, so a
  compiled DDP with a smaller cap fails in its first forward. Net is three ~1 MiB layers and a
  small one: three DDP buckets at a 1 MiB cap.
- the model's class is defined here, not an nn.Sequential: Dynamo breaks the graph in DDP's
  forward (DDP's logger) and converts the wrapped module's forward as a frame of its own,
  which it skips for torch's own modules (an nn.Sequential runs eagerly: nothing compiled).
"""

from __future__ import annotations

import argparse
import sys
import time
import traceback
from pathlib import Path

import numpy as np
import torch
import torch._dynamo
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch._dynamo.backends.registry import lookup_backend
from torch.nn.parallel import DistributedDataParallel as DDP
from torchrun_ddp_hook import digest, gather

from gtopk_hvd.torch.ddp import GTopkHookState, end_process_group, gtopk_hook

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
from sparse_options import SPARSE as SCHEMES  # noqa: E402 - the examples' folder first

DENSITY = 0.01
STEPS = 8  # the hook's first start_iter = 2 are DDP's all-reduce, then 6 sparse steps
BUCKET_CAP_MB = 1  # the smallest a compiled DDP takes (module docstring)
BUCKETS = 3  # what DDP makes of Net at that cap
TOLERANCE = 1e-6
"""The most a weight may differ from eager's under inductor. Its differences are rounding:
measured 2.98e-08 in every scheme, one float32 ulp of the largest weights (|w| <= 1/sqrt(12)
in the first layer, ulp 2.98e-08 in [0.25, 0.5)); 1e-6 is ~30 such ulps. One entry selected
otherwise moves a weight by lr * its update, ~1e-4 to 1e-3 here (measured 1e-3 where the
buckets differ), and the residuals' zero pattern catches it directly."""
REQUIRED = {"aot_eager": None, "inductor": TOLERANCE}  # None: bitwise


class Net(nn.Module):
    """Three 512 x 512 layers (~1 MiB each, bias included: a DDP bucket each) and a small
    head."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(12, 512)
        self.b = nn.Linear(512, 512)
        self.c = nn.Linear(512, 512)
        self.d = nn.Linear(512, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.a(x))
        h = torch.tanh(self.b(h))
        h = torch.tanh(self.c(h))
        return self.d(h)


def batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(1000 * step + dist.get_rank())
    return (torch.randn(16, 12, generator=generator),
            torch.randint(0, 5, (16,), generator=generator))


class CountingBackend:
    """A Dynamo backend that counts the graphs it is given (one per DDPOptimizer subgraph) and
    hands each to the named backend."""

    def __init__(self, name: str) -> None:
        self.name, self.inner, self.graphs = name, lookup_backend(name), 0

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: list, **kwargs: object):
        self.graphs += 1
        return self.inner(gm, example_inputs, **kwargs)


def train(scheme: str, backend: CountingBackend | None, fixed: bool) -> dict:
    """STEPS iterations of a fresh model (seed 0) under DDP with the hook, its buckets fixed or
    rebuilt (DDP's default): eagerly, or through torch.compile with `backend`. Returns its
    weights, digest and what the hook's state holds."""
    torch._dynamo.reset()  # each run compiles anew: no cache entry shared, no recompile limit
    torch.manual_seed(0)
    model = DDP(Net(), bucket_cap_mb=BUCKET_CAP_MB, find_unused_parameters=fixed)
    state = GTopkHookState(compression=SCHEMES[scheme](DENSITY))
    model.register_comm_hook(state, gtopk_hook)
    run = model if backend is None else torch.compile(model, backend=backend)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    start = time.perf_counter()
    for step in range(STEPS):
        optimizer.zero_grad()
        x, y = batch(step)
        F.cross_entropy(run(x), y).backward()
        optimizer.step()
    return {"weights": [p.detach().clone() for p in model.parameters()],
            "digest": digest(model), "iter": state.iter, "seconds": time.perf_counter() - start,
            "layouts": {index: bucket.layout for index, bucket in state.buckets.items()},
            "residuals": {index: np.array(bucket.step.residual)
                          for index, bucket in state.buckets.items()},
            "last_steps": sorted(s.step for s in state.last_stats.values()),
            "graphs": None if backend is None else backend.graphs}


def compare(eager: dict, compiled: dict, fixed: bool, tolerance: float | None) -> dict:
    """This rank's findings for one compiled run against the eager one (failures listed)."""
    failures = []
    pairs = list(zip(eager["weights"], compiled["weights"]))
    bitwise = all(torch.equal(p, q) for p, q in pairs)
    diffs = [float((q - p).abs().max()) for p, q in pairs]
    same_buckets = compiled["layouts"] == eager["layouts"]
    if compiled["graphs"] != BUCKETS:
        failures.append(f"{compiled['graphs']} graph(s) compiled, not one per DDP bucket "
                        f"({BUCKETS}): DDPOptimizer did not split the model, or nothing ran "
                        "compiled")
    for name, run in (("eager", eager), ("compiled", compiled)):
        if run["iter"] != STEPS:
            failures.append(f"{name}: the hook counted {run['iter']} iterations, not {STEPS}")
        if len(run["layouts"]) != BUCKETS or run["last_steps"] != [STEPS - 1] * BUCKETS:
            failures.append(f"{name}: buckets {sorted(run['layouts'])} last stepped at "
                            f"{run['last_steps']}, expected {BUCKETS} at step {STEPS - 1}")
    if fixed and not same_buckets:
        failures.append(f"fixed buckets differ: eager {eager['layouts']}, compiled "
                        f"{compiled['layouts']}")
    if same_buckets:
        # the same entries sent in every bucket: the residuals are zero at the same places
        zeros = [index for index in eager["residuals"]
                 if not np.array_equal(eager["residuals"][index] == 0,
                                       compiled["residuals"][index] == 0)]
        if zeros:
            failures.append(f"buckets {zeros}: other entries sent than eager's")
        if bitwise and any(eager["residuals"][index].tobytes()
                           != compiled["residuals"][index].tobytes()
                           for index in eager["residuals"]):
            failures.append("weights bitwise but the residuals differ")
        allowed = tolerance if fixed else None  # rebuilt into the same buckets: bitwise
        if not bitwise and (allowed is None or not max(diffs) <= allowed):
            failures.append(
                f"compiled weights differ from eager by up to {max(diffs):.3g} (per parameter "
                f"{[f'{d:.3g}' for d in diffs]}; allowed: "
                f"{'bitwise' if allowed is None else f'within {allowed}'})")
    return {"bitwise": bitwise, "max_abs_diff": max(diffs), "same_buckets": same_buckets,
            "graphs": compiled["graphs"], "buckets": len(compiled["layouts"]),
            "digests": (eager["digest"], compiled["digest"]),
            "seconds": (eager["seconds"], compiled["seconds"]), "failures": failures}


def report(scheme: str, backend: str, fixed: bool, mine: dict) -> bool:
    """Gathers every rank's findings and adds the replica check; rank 0 prints the run's line
    (and its failures). Returns whether it passed on every rank."""
    everyone = gather(mine)
    failures = [f"rank {rank}: {failure}" for rank, found in enumerate(everyone)
                for failure in found["failures"]]
    for which, run in enumerate(("eager", "compiled")):
        digests = {found["digests"][which] for found in everyone}
        if len(digests) != 1:
            failures.append(f"{run}: the replicas differ across ranks: {sorted(digests)}")
    replicas = all(len({found["digests"][which] for found in everyone}) == 1
                   for which in (0, 1))
    if dist.get_rank() == 0:
        print(f"COMPILED scheme={scheme} backend={backend} "
              f"buckets={'fixed' if fixed else 'rebuilt'} "
              f"bitwise={all(found['bitwise'] for found in everyone)} "
              f"max_abs_diff={max(found['max_abs_diff'] for found in everyone)!r} "
              f"same_buckets={all(found['same_buckets'] for found in everyone)} "
              f"n_buckets={mine['buckets']} graphs={mine['graphs']} "
              f"replicas={'identical' if replicas else 'differ'} "
              f"eager_s={mine['seconds'][0]:.1f} compiled_s={mine['seconds'][1]:.1f} "
              f"ok={not failures}", flush=True)
        for failure in failures:
            print(f"  FAILED {scheme} {backend}: {failure}", flush=True)
    return not failures


def check(scheme: str, backend: str, fixed: bool, eager: dict | None) -> tuple[bool, dict]:
    """One compiled run against `eager` (made here if None); whether it passed everywhere,
    and the eager run for the scheme's next compiled run."""
    try:
        eager = eager or train(scheme, None, fixed)
        compiled = train(scheme, CountingBackend(backend), fixed)
        mine = compare(eager, compiled, fixed, REQUIRED[backend])
    except Exception as error:  # the hook failing under compile: reported, not hidden
        print(f"[rank {dist.get_rank()}] {scheme} {backend} raised:\n"
              f"{traceback.format_exc()}", file=sys.stderr, flush=True)
        mine = {"bitwise": False, "max_abs_diff": float("nan"), "same_buckets": False,
                "graphs": 0, "buckets": 0, "digests": ("", ""), "seconds": (0.0, 0.0),
                "failures": [f"raised {type(error).__name__}: {error}"]}
    return report(scheme, backend, fixed, mine), eager


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--schemes", nargs="+", default=list(SCHEMES), choices=list(SCHEMES))
    parser.add_argument("--backends", nargs="+", default=list(REQUIRED), choices=list(REQUIRED),
                        help="the backends of the fixed-bucket runs")
    parser.add_argument("--rebuilt-backend", default="aot_eager", choices=list(REQUIRED),
                        help="the backend of the run with DDP's rebuilt buckets")
    args = parser.parse_args()
    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    if torch._dynamo.config.optimize_ddp is not True:
        raise SystemExit(f"optimize_ddp is {torch._dynamo.config.optimize_ddp!r}: this checks "
                         "the default (True, DDPOptimizer)")
    passed = True
    for scheme in args.schemes:
        eager = None
        for backend in args.backends:
            ok, eager = check(scheme, backend, True, eager)
            passed &= ok
        ok, _ = check(scheme, args.rebuilt_backend, False, None)
        passed &= ok
    dist.barrier()
    if dist.get_rank() == 0 and passed:
        print(f"compiled hook ok on {dist.get_world_size()} workers", flush=True)
    end_process_group()
    sys.exit(0 if passed else 1)


if __name__ == "__main__":
    main()
