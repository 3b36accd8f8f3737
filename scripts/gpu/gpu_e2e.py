"""The DDP hook end to end: ResNet-50 training steps under DDP at P = 1, every scheme against DDP's
own all-reduce, in float32, bfloat16 autocast and float16 autocast with GradScaler.

    python scripts/gpu/gpu_e2e.py --json e2e.json                       # on a GPU (NCCL)
    python scripts/gpu/gpu_e2e.py --device cpu --model tiny --batch 8 --steps 3 --json e2e.json

One process, a one-worker process group (NCCL on a GPU, Gloo on the CPU). Per (precision,
scheme): a fresh model (same seed), DDP (bucket_cap_mb default), `gtopk_hook` with the scheme's
compression (none for "dense": DDP's all-reduce, the baseline; "-host-skip": the non-finite skip
decided on the host, `skip_on_device=False`, as before that moved to the device), SGD(momentum
0.9), one fixed
synthetic batch. Steps: DDP's `start_iter` = 2 dense iterations and one sparse step as warm-up
(more while the configuration's time allows), then up to --steps timed steps, each from
zero_grad to the optimizer's step, the device synchronised before and after. The median over
the timed steps that were not skipped is the figure; its ratio to the dense baseline of the same
precision is the target's (<= 1.03: within +3%).

--rounds R (> 1): a machine whose step times drift by more than the difference sought (runs 7
and 8 on an H200: 20-40% between a configuration's steps) would rank configurations measured one
after another by when they ran. With rounds, a precision's configurations are made together,
warmed up, and then take --steps timed steps each in turn, R times, so a slow phase falls on
all alike; the figure is the median over every round's steps (each round's median recorded).

float16: GradScaler starts at --init-scale (2^24: the first steps overflow, so the skip path
runs); a step counts as skipped when the scale drops. An exception in a configuration (e.g. the
sparse path's TypeError at the first overflow) is recorded with its traceback and the next
configuration runs.

--gradient-as-bucket-view: DDP's option in every configuration, dense included (the gradients
are views of DDP's buckets, so DDP copies no bucket slice back into param.grad at the end of
backward; under the hook that copy runs after its one wait: docs/ddp.md).

Host synchronisations (--syncs, float32 only): after the timed steps, two more steps are run
twice: once under torch.cuda.set_sync_debug_mode("warn"), counting the warnings torch raises
(synchronisations torch itself makes: .item(), .cpu(), nonzero, ...), once under
torch.profiler, counting the CUDA runtime calls that block the host (cuda*Synchronize,
synchronous cudaMemcpy), which also sees those made inside gtopk_hvd's extension.

Timeline (--trace SCHEME...): after the timed steps (and the counts), the float32 run of each
named scheme records one more step under torch.profiler (CPU and CUDA activities, no shapes,
no stacks) and writes it as a gzipped Chrome trace, trace_<scheme>.json.gz, into --trace-dir
(default: the --json file's folder): chrome://tracing or Perfetto show where the host waits
and where the device idles. A trace over TRACE_LIMIT_BYTES is deleted and the record says so
(the GPU check carries the folder back in one archive).

The JSON (written after every configuration): {"model", "device", ..., "runs": [{precision,
scheme, median_s, ratio_to_dense, timed_steps, skipped_steps, losses, error?, syncs?}]}.
"""

from __future__ import annotations

import argparse
import gzip
import os
import shutil
import statistics
import tempfile
import time
import warnings
from collections import Counter
from typing import Any

import torch
import torch.distributed as dist
from gpu_common import JsonRecord, dump_stacks_on_term, ensure_parent, error_record, make_model
from torch.nn.parallel import DistributedDataParallel as DDP

from gtopk_hvd import ops
from gtopk_hvd.compression import Compression
from gtopk_hvd.torch.ddp import GTopkHookState, gtopk_hook

SCHEMES: dict[str, Any] = {
    "dense": None,
    "gtopk-0.001": lambda: Compression.gtopk(0.001),
    "gtopk-0.01": lambda: Compression.gtopk(0.01),
    "topk-0.001": lambda: Compression.topk(0.001),
    "micro-0.001": lambda: Compression.micro(0.001),
    "exdyna-0.001": lambda: Compression.exdyna(0.001),
    "gtopk-exact-0.001": lambda: Compression.gtopk(0.001, exact=True),
    "sketch-0.001": lambda: Compression.sketch(0.001),
    "gtopk-0.001-host-skip": lambda: Compression.gtopk(0.001),
}
HOOK_OPTIONS: dict[str, dict[str, Any]] = {
    "gtopk-0.001-host-skip": {"skip_on_device": False},  # the skip decided on the host: before
}
PRECISIONS = ("float32", "bfloat16-amp", "float16-amp")  # the one known to raise last
START_ITER = 2
TRACE_LIMIT_BYTES = 8 << 20
SYNC_PROFILE_STEPS = 2
BLOCKING_CALLS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize",
                  "cudaMemcpy", "cudaMemcpy2D", "cuStreamSynchronize", "cuCtxSynchronize",
                  "cuEventSynchronize", "cuMemcpyDtoH", "cuMemcpyHtoD")


def parse_arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--model", choices=["resnet50", "tiny"], default="resnet50")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--steps", type=int, default=20, help="timed steps per configuration")
    parser.add_argument("--warmup", type=int, default=3,
                        help="sparse steps before timing (after DDP's start_iter dense ones)")
    parser.add_argument("--schemes", nargs="+", default=list(SCHEMES), choices=list(SCHEMES))
    parser.add_argument("--precisions", nargs="+", default=list(PRECISIONS),
                        choices=list(PRECISIONS))
    parser.add_argument("--rounds", type=int, default=1,
                        help="> 1: a precision's configurations side by side, --steps timed "
                             "steps each per round, in turn (module docstring)")
    parser.add_argument("--config-budget-s", type=float, default=20.0,
                        help="seconds one configuration may take: a slow scheme gets fewer "
                             "warm-up and timed steps (at least one timed)")
    parser.add_argument("--init-scale", type=float, default=2.0**24,
                        help="GradScaler's first scale (float16)")
    parser.add_argument("--syncs", action="store_true",
                        help="count host synchronisations per step (float32 runs)")
    parser.add_argument("--gradient-as-bucket-view", action="store_true",
                        help="DDP(gradient_as_bucket_view=True) in every configuration: no copy "
                        "of each bucket slice back into param.grad (docs/ddp.md)")
    parser.add_argument("--trace", nargs="+", default=[], choices=list(SCHEMES),
                        metavar="SCHEME", help="write a profiler trace of one float32 step of "
                        "these schemes (trace_<scheme>.json.gz)")
    parser.add_argument("--trace-dir", default=None,
                        help="where the traces go (default: the --json file's folder)")
    parser.add_argument("--json", default=None, help="write the figures here")
    return parser.parse_args()


class Run:
    """One (precision, scheme) configuration's model, optimizer and step."""

    def __init__(self, args: argparse.Namespace, precision: str, scheme: str,
                 device: torch.device) -> None:
        torch.manual_seed(0)
        module, input_shape, classes, _ = make_model(args.model)
        module = module.to(device)
        self.device = device
        self.ddp = DDP(module, device_ids=[device.index] if device.type == "cuda" else None,
                       gradient_as_bucket_view=args.gradient_as_bucket_view)
        self.state = None
        if SCHEMES[scheme] is not None:
            self.state = GTopkHookState(compression=SCHEMES[scheme](), start_iter=START_ITER,
                                        **HOOK_OPTIONS.get(scheme, {}))
            self.ddp.register_comm_hook(self.state, gtopk_hook)
        self.optimizer = torch.optim.SGD(self.ddp.parameters(), lr=0.01, momentum=0.9)
        generator = torch.Generator().manual_seed(1)
        self.x = torch.randn(args.batch, *input_shape, generator=generator).to(device)
        self.y = torch.randint(0, classes, (args.batch,), generator=generator).to(device)
        self.precision = precision
        self.autocast_dtype = {"float16-amp": torch.float16,
                               "bfloat16-amp": torch.bfloat16}.get(precision)
        self.scaler = (torch.amp.GradScaler(device.type, init_scale=args.init_scale)
                       if precision == "float16-amp" else None)

    def synchronize(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def step(self) -> tuple[float, bool]:
        """One training step: (loss, skipped by the scaler)."""
        self.optimizer.zero_grad(set_to_none=True)
        with torch.autocast(self.device.type, dtype=self.autocast_dtype,
                            enabled=self.autocast_dtype is not None):
            loss = torch.nn.functional.cross_entropy(self.ddp(self.x), self.y)
        if self.scaler is None:
            loss.backward()
            self.optimizer.step()
            return float(loss.detach()), False
        self.scaler.scale(loss).backward()
        self.scaler.step(self.optimizer)
        scale = self.scaler.get_scale()
        self.scaler.update()
        return float(loss.detach()), self.scaler.get_scale() < scale

    def timed_step(self) -> tuple[float, float, bool]:
        self.synchronize()
        start = time.perf_counter()
        loss, skipped = self.step()
        self.synchronize()
        return time.perf_counter() - start, loss, skipped


def measure(run: Run, args: argparse.Namespace, record: dict) -> None:
    """Warm-up and timed steps within the configuration's budget; fills `record`."""
    began = time.perf_counter()
    budget = args.config_budget_s
    times: list[float] = []
    skipped_flags: list[bool] = []
    losses: list[float] = []
    warmup_total = START_ITER + args.warmup
    step = 0
    while True:
        # DDP's dense iterations and the first sparse step are never timed; further warm-up
        # steps are dropped once half the configuration's budget is spent (a slow scheme).
        timed = step >= warmup_total or (step > START_ITER and
                                         time.perf_counter() - began > budget / 2)
        seconds, loss, skipped = run.timed_step()
        step += 1
        record["steps_done"] = step
        record["skipped_steps"] = record.get("skipped_steps", 0) + int(skipped)
        losses.append(loss)
        if not timed and step == START_ITER + 1 and seconds > budget / 2:
            # A scheme whose first sparse step alone takes half the budget (the sketch, host
            # numpy): that step is its figure; allocation is noise next to it.
            timed = True
            record["note"] = "the first sparse step is the figure (slow scheme, no warm-up)"
        if timed:
            times.append(seconds)
            skipped_flags.append(skipped)
        if len(times) >= args.steps or (times and time.perf_counter() - began > budget):
            break
    summarise(record, times, skipped_flags, losses, began)


def summarise(record: dict, times: list[float], skipped_flags: list[bool], losses: list[float],
              began: float) -> None:
    """The configuration's figure: the median of its timed steps that were not skipped."""
    kept = [t for t, s in zip(times, skipped_flags) if not s] or times
    record.update(median_s=statistics.median(kept), timed_steps=len(times),
                  timed_skipped=sum(skipped_flags), min_s=min(kept), max_s=max(kept),
                  first_loss=losses[0], last_loss=losses[-1],
                  finite_loss=all(map(_finite, losses[-3:])),
                  seconds=time.perf_counter() - began)


def measure_in_rounds(runs: dict[str, Run], records: dict[str, dict],
                      args: argparse.Namespace) -> None:
    """--rounds R > 1 (module docstring): the configurations of one precision warmed up, then R
    rounds in which each takes --steps timed steps in turn; a configuration that raises is
    recorded and leaves the rounds."""
    began = time.perf_counter()
    times: dict[str, list[float]] = {scheme: [] for scheme in runs}
    flags: dict[str, list[bool]] = {scheme: [] for scheme in runs}
    losses: dict[str, list[float]] = {scheme: [] for scheme in runs}

    def steps(scheme: str, count: int, timed: bool) -> None:
        record = records[scheme]
        for _ in range(count):
            seconds, loss, skipped = runs[scheme].timed_step()
            record["steps_done"] = record.get("steps_done", 0) + 1
            record["skipped_steps"] = record.get("skipped_steps", 0) + int(skipped)
            losses[scheme].append(loss)
            if timed:
                times[scheme].append(seconds)
                flags[scheme].append(skipped)

    for round_ in range(args.rounds + 1):  # round 0: DDP's dense iterations and the warm-up
        for scheme in list(runs):
            try:
                if round_ == 0:
                    steps(scheme, START_ITER + args.warmup, timed=False)
                else:
                    steps(scheme, args.steps, timed=True)
                    kept = [t for t, s in zip(times[scheme][-args.steps:],
                                              flags[scheme][-args.steps:]) if not s]
                    records[scheme].setdefault("round_medians_s", []).append(
                        statistics.median(kept) if kept else None)
            except Exception as error:  # noqa: BLE001 - a failed configuration is a figure
                records[scheme].update(error_record(error))
                print(f"   {scheme} FAILED: {records[scheme]['error']}", flush=True)
                del runs[scheme]
    for scheme in runs:
        if times[scheme]:
            summarise(records[scheme], times[scheme], flags[scheme], losses[scheme], began)


def warm_up(args: argparse.Namespace, precision: str, device: torch.device) -> None:
    """An untimed dense run per precision before its configurations: cuDNN's search for each
    convolution's algorithm (benchmark mode) and the allocator's first growth happen here, not
    in the first configuration's budget (where they had left dense one timed step)."""
    run = Run(args, precision, "dense", device)
    try:
        for _ in range(START_ITER + args.warmup):
            run.timed_step()
    finally:
        del run
        if device.type == "cuda":
            torch.cuda.empty_cache()


def _finite(value: float) -> bool:
    return value == value and abs(value) != float("inf")


def count_syncs(run: Run, slow: bool) -> dict:
    """Host synchronisations per step (module docstring), over SYNC_PROFILE_STEPS steps each
    way; a slow configuration (seconds a step): one step, the profiler's count alone."""
    steps = 1 if slow else SYNC_PROFILE_STEPS
    result: dict[str, Any] = {"steps": steps}
    if run.device.type == "cuda" and not slow:
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                torch.cuda.set_sync_debug_mode("warn")
                try:
                    for _ in range(steps):
                        run.step()
                    torch.cuda.synchronize()
                finally:
                    torch.cuda.set_sync_debug_mode("default")
            messages = [str(w.message) for w in caught if "synchroniz" in str(w.message).lower()]
            result["torch_sync_warnings_per_step"] = len(messages) / steps
            result["torch_sync_warning_sample"] = sorted(Counter(
                m.splitlines()[0][:160] for m in messages).items())[:8]
        except Exception as error:  # noqa: BLE001 - recorded, the other count still runs
            result["torch_sync_warnings_error"] = error_record(error)["error"]
    try:
        from torch.profiler import ProfilerActivity, profile

        activities = [ProfilerActivity.CPU]
        if run.device.type == "cuda":
            activities.append(ProfilerActivity.CUDA)
        with profile(activities=activities) as profiler:
            for _ in range(steps):
                run.step()
            run.synchronize()
        calls = Counter(event.name for event in profiler.events()
                        if "Synchronize" in event.name or "Memcpy" in event.name
                        or "memcpy" in event.name)
        blocking = sum(n for name, n in calls.items() if name in BLOCKING_CALLS)
        result["runtime_blocking_calls_per_step"] = blocking / steps
        result["runtime_calls_per_step"] = {name: n / steps
                                            for name, n in sorted(calls.items())}
    except Exception as error:  # noqa: BLE001 - recorded
        result["profiler_error"] = error_record(error)["error"]
    return result


def write_trace(run: Run, scheme: str, folder: str) -> dict:
    """One step under torch.profiler as a gzipped Chrome trace (module docstring): {"path",
    "bytes"}, or {"error"} / {"dropped"} when it failed or came out over TRACE_LIMIT_BYTES."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU]
    if run.device.type == "cuda":
        activities.append(ProfilerActivity.CUDA)
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, f"trace_{scheme}.json.gz")
    try:
        run.step()  # the step before starts from a drained device, as the profiled one
        run.synchronize()
        with profile(activities=activities) as profiler:
            run.step()
            run.synchronize()
        with tempfile.TemporaryDirectory(prefix="gpu_e2e_trace_") as scratch:
            plain = os.path.join(scratch, "trace.json")
            profiler.export_chrome_trace(plain)
            with open(plain, "rb") as source, gzip.open(path, "wb", compresslevel=6) as target:
                shutil.copyfileobj(source, target)
    except Exception as error:  # noqa: BLE001 - recorded, the run goes on
        return {"error": error_record(error)["error"]}
    size = os.path.getsize(path)
    if size > TRACE_LIMIT_BYTES:
        os.remove(path)
        return {"dropped": f"{size} bytes, over {TRACE_LIMIT_BYTES}"}
    return {"path": os.path.basename(path), "bytes": size}


def init_group(device: torch.device) -> None:
    store = dist.FileStore(os.path.join(tempfile.mkdtemp(prefix="gpu_e2e_"), "store"), 1)
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo", store=store, rank=0,
                            world_size=1)


def measure_precision(args: argparse.Namespace, precision: str, device: torch.device,
                      out: JsonRecord, trace_dir: str) -> None:
    """Every scheme's configuration in one precision: one after another (each a fresh model,
    made, measured, let go), or side by side in rounds (--rounds > 1); then, in float32, the
    host synchronisations and traces asked for; ratios to dense's figure."""
    records: dict[str, dict[str, Any]] = {}
    for scheme in args.schemes:
        records[scheme] = {"precision": precision, "scheme": scheme}
        out.data["runs"].append(records[scheme])
    runs: dict[str, Run] = {}
    for scheme in args.schemes:
        if args.rounds == 1:
            print(f"== {precision} {scheme}", flush=True)
        try:
            runs[scheme] = Run(args, precision, scheme, device)
            if args.rounds == 1:
                measure(runs[scheme], args, records[scheme])
                finish(runs.pop(scheme), records[scheme], args, trace_dir)
        except Exception as error:  # noqa: BLE001 - a failed configuration is a figure
            records[scheme].update(error_record(error))
            print(f"   FAILED: {records[scheme]['error']}", flush=True)
            runs.pop(scheme, None)
        release(device)
        if args.rounds == 1:
            report(records, scheme, out)
    if args.rounds > 1:
        print(f"== {precision}: {', '.join(runs)} in {args.rounds} rounds of {args.steps} "
              "steps", flush=True)
        measure_in_rounds(runs, records, args)
        for scheme in list(runs):
            try:
                finish(runs.pop(scheme), records[scheme], args, trace_dir)
            except Exception as error:  # noqa: BLE001 - a failed configuration is a figure
                records[scheme].update(error_record(error))
            release(device)
        for scheme in args.schemes:
            report(records, scheme, out)


def finish(run: Run, record: dict, args: argparse.Namespace, trace_dir: str) -> None:
    """After the timed steps, float32 only: host synchronisations and a trace, if asked."""
    if "median_s" not in record or run.precision != "float32":
        return
    if args.syncs:
        record["syncs"] = count_syncs(run, record["median_s"] > 1.0)
    if record["scheme"] in args.trace:
        record["trace"] = write_trace(run, record["scheme"], trace_dir)


def release(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.empty_cache()


def report(records: dict[str, dict], scheme: str, out: JsonRecord) -> None:
    """The configuration's ratio to dense's figure, printed; the JSON saved."""
    record, dense = records[scheme], records.get("dense", {}).get("median_s")
    if dense and "median_s" in record:
        record["ratio_to_dense"] = record["median_s"] / dense
    if "median_s" in record:
        rounds = record.get("round_medians_s")
        print(f"   {scheme}: median {record['median_s'] * 1e3:.2f} ms over "
              f"{record['timed_steps']} steps, ratio to dense "
              f"{record.get('ratio_to_dense', float('nan')):.3f}, skipped "
              f"{record['skipped_steps']}"
              + (f", rounds {[round(r * 1e3, 2) for r in rounds if r]} ms" if rounds else "")
              + (f", syncs {record['syncs']}" if "syncs" in record else ""), flush=True)
    out.save()


def main() -> None:
    args = parse_arguments()
    dump_stacks_on_term()
    ensure_parent(args.json)
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("gpu_e2e: --device cuda but torch sees no GPU")
    device = torch.device("cuda", 0) if args.device == "cuda" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
        torch.backends.cudnn.benchmark = True
    _, _, _, model_name = make_model(args.model)
    out = JsonRecord(args.json, model=model_name, device=str(device), batch=args.batch,
                     steps=args.steps, warmup=args.warmup, start_iter=START_ITER,
                     init_scale=args.init_scale, cuda_kernels=ops.cuda_built,
                     gpu=torch.cuda.get_device_name() if device.type == "cuda" else None,
                     backend="nccl" if device.type == "cuda" else "gloo",
                     gradient_as_bucket_view=args.gradient_as_bucket_view, runs=[])
    trace_dir = args.trace_dir or os.path.dirname(os.path.abspath(args.json or "e2e.json"))
    init_group(device)
    out.save()
    try:
        for precision in args.precisions:
            warm_up(args, precision, device)
            measure_precision(args, precision, device, out, trace_dir)
    finally:
        out.save()
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
