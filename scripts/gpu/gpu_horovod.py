"""gtopk_hvd's torch DistributedOptimizer under Horovod at size 1 on a GPU: float32 steps, and
float16 autocast with GradScaler in Horovod's AMP recipe.

    python scripts/gpu/gpu_horovod.py --json horovod.json                 # Horovod built with NCCL
    python scripts/gpu/gpu_horovod.py --device cpu --model tiny --steps 3 --json horovod.json

Plain `python` (no launcher): Horovod runs one worker. Per scheme (dense: Horovod's own
allreduce, Compression.none; gtopk, topk, micro at density 0.001): a fresh model (same seed),
`gtopk.DistributedOptimizer(SGD(momentum 0.9))`, one fixed synthetic batch.

    float32        --warmup steps, then --steps timed steps (zero_grad to optimizer.step(),
                   the device synchronised around each): the median
    float16-amp    --amp-steps steps of Horovod's recipe: scaler.scale(loss).backward();
                   optimizer.synchronize(); scaler.unscale_(optimizer);
                   with optimizer.skip_synchronize(): scaler.step(optimizer); scaler.update()
                   GradScaler from --init-scale (2^24: the first steps overflow, so the skip
                   path runs). Recorded: skipped steps (the scale dropped), whether the sparse
                   step agreed (last_stats.skipped), the loss at the start and the end, finite.

An exception in a run is recorded with its traceback and the next run goes on. JSON written
after every run: {"horovod": version, ..., "runs": [{scheme, precision, median_s?,
ratio_to_dense?, skipped_steps?, error?}]}.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import torch
from gpu_common import JsonRecord, dump_stacks_on_term, ensure_parent, error_record, make_model

import gtopk_hvd.torch as gtopk  # before horovod.torch (under mpirun: mpi4py first)
from gtopk_hvd import ops

# isort: split
import horovod
import horovod.torch as hvd

SCHEMES: dict[str, Any] = {
    "dense": lambda: gtopk.Compression.none,
    "gtopk-0.001": lambda: gtopk.Compression.gtopk(0.001),
    "topk-0.001": lambda: gtopk.Compression.topk(0.001),
    "micro-0.001": lambda: gtopk.Compression.micro(0.001),
}


def parse_arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--model", choices=["resnet50", "tiny"], default="resnet50")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--amp-steps", type=int, default=20)
    parser.add_argument("--init-scale", type=float, default=2.0**24)
    parser.add_argument("--schemes", nargs="+", default=list(SCHEMES), choices=list(SCHEMES))
    parser.add_argument("--json", default=None)
    return parser.parse_args()


class Setup:
    def __init__(self, args: argparse.Namespace, scheme: str, device: torch.device) -> None:
        torch.manual_seed(0)
        model, input_shape, classes, _ = make_model(args.model)
        self.model = model.to(device)
        self.device = device
        self.optimizer = gtopk.DistributedOptimizer(
            torch.optim.SGD(self.model.parameters(), lr=0.01, momentum=0.9),
            named_parameters=self.model.named_parameters(), compression=SCHEMES[scheme]())
        hvd.broadcast_parameters(self.model.state_dict(), root_rank=0)
        generator = torch.Generator().manual_seed(1)
        self.x = torch.randn(args.batch, *input_shape, generator=generator).to(device)
        self.y = torch.randint(0, classes, (args.batch,), generator=generator).to(device)

    def synchronize(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def loss(self, dtype: torch.dtype | None = None) -> torch.Tensor:
        with torch.autocast(self.device.type, dtype=dtype, enabled=dtype is not None):
            return torch.nn.functional.cross_entropy(self.model(self.x), self.y)


def run_float32(setup: Setup, args: argparse.Namespace, record: dict) -> None:
    times, losses = [], []
    for step in range(args.warmup + args.steps):
        setup.synchronize()
        start = time.perf_counter()
        setup.optimizer.zero_grad()
        loss = setup.loss()
        loss.backward()
        setup.optimizer.step()
        setup.synchronize()
        losses.append(float(loss.detach()))
        if step >= args.warmup:
            times.append(time.perf_counter() - start)
        record["steps_done"] = step + 1
    record.update(median_s=statistics.median(times), timed_steps=len(times),
                  first_loss=losses[0], last_loss=losses[-1],
                  finite_loss=all(v == v and abs(v) != float("inf") for v in losses[-3:]))


def run_amp(setup: Setup, args: argparse.Namespace, record: dict) -> None:
    """Horovod's AMP recipe (module docstring)."""
    scaler = torch.amp.GradScaler(setup.device.type, init_scale=args.init_scale)
    optimizer = setup.optimizer
    sparse = getattr(optimizer, "_sparse", None)
    skipped = disagreements = 0
    losses, scales = [], [scaler.get_scale()]
    record["skipped_steps"] = 0
    for step in range(args.amp_steps):
        optimizer.zero_grad()
        loss = setup.loss(torch.float16)
        scaler.scale(loss).backward()
        optimizer.synchronize()
        scaler.unscale_(optimizer)
        with optimizer.skip_synchronize():
            scaler.step(optimizer)
        scale = scaler.get_scale()
        scaler.update()
        dropped = scaler.get_scale() < scale
        skipped += int(dropped)
        if sparse is not None and sparse.last_stats is not None and \
                bool(sparse.last_stats.skipped) != dropped:
            disagreements += 1
        losses.append(float(loss.detach()))
        scales.append(scaler.get_scale())
        record.update(steps_done=step + 1, skipped_steps=skipped)
    setup.synchronize()
    record.update(skip_disagreements=disagreements, first_scale=scales[0], last_scale=scales[-1],
                  first_loss=losses[0], last_loss=losses[-1],
                  finite_loss=all(v == v and abs(v) != float("inf") for v in losses[-3:]),
                  trained=skipped < args.amp_steps)


def main() -> None:
    args = parse_arguments()
    dump_stacks_on_term()
    ensure_parent(args.json)
    hvd.init()
    device = torch.device("cpu")
    if args.device == "cuda":
        if not torch.cuda.is_available():
            raise SystemExit("gpu_horovod: --device cuda but torch sees no GPU")
        device = torch.device("cuda", hvd.local_rank())
        torch.cuda.set_device(device)
        torch.backends.cudnn.benchmark = True
    _, _, _, model_name = make_model(args.model)
    out = JsonRecord(args.json, horovod=horovod.__version__, size=hvd.size(), model=model_name,
                     device=str(device), batch=args.batch, init_scale=args.init_scale,
                     nccl_built=bool(hvd.nccl_built()), gloo_built=bool(hvd.gloo_built()),
                     mpi_built=bool(hvd.mpi_built()), cuda_kernels=ops.cuda_built, runs=[])
    out.save()
    dense = None
    for precision, runner in (("float32", run_float32), ("float16-amp", run_amp)):
        for scheme in args.schemes:
            record: dict[str, Any] = {"precision": precision, "scheme": scheme}
            out.data["runs"].append(record)
            print(f"== {precision} {scheme}", flush=True)
            try:
                runner(Setup(args, scheme, device), args, record)
            except Exception as error:  # noqa: BLE001 - a failed run is a figure
                record.update(error_record(error))
                print(f"   FAILED: {record['error']}", flush=True)
            if device.type == "cuda":
                torch.cuda.empty_cache()
            if precision == "float32" and scheme == "dense" and "median_s" in record:
                dense = record["median_s"]
            if dense and "median_s" in record:
                record["ratio_to_dense"] = record["median_s"] / dense
            print(f"   {({k: v for k, v in record.items() if k != 'traceback'})}", flush=True)
            out.save()


if __name__ == "__main__":
    main()
