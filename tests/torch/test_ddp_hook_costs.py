"""What one iteration of the DDP hook costs the host, counted without a GPU.

On a GPU every host read of a device value waits for the device: the hook's last bucket then
waits for the whole backward, and what follows (the steps, DDP's finalisation, the optimizer)
is launched on an idle device. The hook needs one host value per iteration (whether any
bucket held a NaN/Inf, nonfinite="propagate"), so with DeviceLikeTensor buckets (the path of a
GPU bucket on CPU tensors: tests/helpers/device_like.py) one sparse iteration of several buckets
makes exactly one host read, counted both outside the kernel layer (`count_host_syncs`) and as
the kernel layer's calls that return a host value (`count_kernel_host_reads`); the read of each
bucket as it arrives stays on its device (`ops.mark_nonfinite`).

The hook makes no copy per parameter: a float32 bucket is stepped in place (no copy of it at
all), another dtype is cast once into float32 and back (one flat copy each way); the number of
copies does not change with the number of parameters in a bucket. (DDP's own copies of each
gradient into its bucket and back, `Reducer::mark_variable_ready_dense` /
`finalize_bucket_dense`, happen in C++ and are DDP's: docs/ddp.md.)
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import torch
import torch.distributed as dist
from helpers.device_like import device_like, device_like_cpu
from helpers.host_syncs import count_host_syncs, count_kernel_host_reads
from test_ddp import Bucket, run_hook
from torch.overrides import TorchFunctionMode

from gtopk_hvd import ops
from gtopk_hvd.compression import Compression
from gtopk_hvd.nonfinite import NonfiniteFlags, count_nonfinite_workers
from gtopk_hvd.torch.ddp import GTopkHookState
from gtopk_hvd.transports.local import LocalGroup, LocalTransport

SIZES = (300, 500, 200)  # three buckets


@pytest.fixture(scope="module")
def one_worker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """A one-worker Gloo group (as tests/torch/test_ddp.py's)."""
    created = not dist.is_initialized()
    if created:
        store = dist.FileStore(str(tmp_path_factory.mktemp("ddp_costs") / "store"), 1)
        dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    yield
    if created:
        dist.destroy_process_group()


@pytest.fixture
def device_like_buckets(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The hook takes CPU buckets down the GPU path (its state in torch tensors)."""
    from gtopk_hvd.torch import ddp

    monkeypatch.setattr(ddp, "_step_device", lambda device: device)
    with device_like_cpu():
        yield


def make_buckets(step: int, parameters: list[list[torch.Tensor]], dtype: torch.dtype,
                 bad: bool = False, device_like_tensors: bool = True) -> list[Bucket]:
    generator = torch.Generator().manual_seed(step)
    buckets = []
    for i, params in enumerate(parameters):
        n = sum(p.numel() for p in params)
        values = torch.randn(n, generator=generator).to(dtype)
        if bad and i == 1:
            values[7] = float("nan")
        buffer = device_like(values) if device_like_tensors else values
        buckets.append(Bucket(i, params, buffer, last=i == len(parameters) - 1))
    return buckets


def split(n: int, parts: int, dtype: torch.dtype) -> list[torch.Tensor]:
    sizes = [n // parts] * parts
    sizes[-1] += n - sum(sizes)
    return [torch.zeros(size, dtype=dtype) for size in sizes]


ONE_READ = {"gtopk": lambda: Compression.gtopk(0.02), "topk": lambda: Compression.topk(0.02),
            "gtopk-exact": lambda: Compression.gtopk(0.02, exact=True),
            "sketch": lambda: Compression.sketch(0.02)}


@pytest.mark.parametrize("scheme", list(ONE_READ))
def test_one_sparse_iteration_reads_the_host_once(one_worker: None, device_like_buckets: None,
                                                  scheme: str) -> None:
    """nonfinite="propagate", P = 1, three buckets: one host read per iteration (the flag),
    not one per bucket; and a NaN in a middle bucket still skips the whole iteration."""
    compression = ONE_READ[scheme]()
    state = GTopkHookState(compression=compression, start_iter=2)
    parameters = [split(n, 4, torch.float32) for n in SIZES]
    for step in range(4):  # two dense iterations, then the steps are built and agree
        run_hook(state, make_buckets(step, parameters, torch.float32))
    for step in range(4, 7):
        buckets = make_buckets(step, parameters, torch.float32, bad=step == 5)
        with count_host_syncs() as outside, count_kernel_host_reads() as kernels:
            got = run_hook(state, buckets)
        assert outside.total + kernels.total == 1, (dict(outside), dict(kernels))
        assert state.last_iteration_skipped == (step == 5)
        assert all(bool(torch.isnan(g).all()) == (step == 5) for g in got)
    assert state.book.nonfinite.flags == {}


@pytest.mark.parametrize("scheme", ["micro", "exdyna"])
def test_a_threshold_scheme_iteration_reads_the_host_three_times(
        one_worker: None, device_like_buckets: None, scheme: str) -> None:
    """MiCRO and ExDyna read the device twice a step (their histogram, then every worker's
    count); the hook steps the held buckets in lockstep, so an iteration of three buckets
    reads three times in all (the flag, then the two phases: `ops.read_to_host`), not
    1 + 2 per bucket; a skipped iteration reads the flag only."""
    state = GTopkHookState(compression=getattr(Compression, scheme)(0.02), start_iter=2)
    parameters = [split(n, 4, torch.float32) for n in SIZES]
    for step in range(4):
        run_hook(state, make_buckets(step, parameters, torch.float32))
    for step in range(4, 7):
        buckets = make_buckets(step, parameters, torch.float32, bad=step == 5)
        with count_host_syncs() as outside, count_kernel_host_reads() as kernels:
            run_hook(state, buckets)
        reads = {"read_flag": 1} if step == 5 else {"read_flag": 1, "read_to_host": 2}
        assert outside.total == 0, dict(outside)
        assert {name: n for (name, _), n in kernels.items()} == reads, dict(kernels)
        assert state.last_iteration_skipped == (step == 5)


def test_a_failed_iteration_leaves_no_flag_behind(one_worker: None) -> None:
    """A NaN in an iteration that then fails (a bucket refused midway) does not skip the
    next one: the held flags are dropped with the held futures."""
    state = GTopkHookState(density=0.5, start_iter=2)
    parameters = [[torch.zeros(4)], [torch.zeros(6)], [torch.zeros(5)]]
    for step in range(3):
        run_hook(state, make_buckets(step, parameters, torch.float32,
                                     device_like_tensors=False))
    buckets = make_buckets(3, parameters, torch.float32, device_like_tensors=False)
    buckets[0].buffer()[0] = float("nan")
    buckets[1] = Bucket(1, [torch.zeros(3), torch.zeros(3)], torch.ones(6), last=False)
    from gtopk_hvd.torch.ddp import gtopk_hook

    gtopk_hook(state, buckets[0])
    with pytest.raises(RuntimeError, match="bucket 1 changed"):
        gtopk_hook(state, buckets[1])
    assert state.book.nonfinite.flags == {}
    got = run_hook(state, make_buckets(4, parameters, torch.float32,
                                       device_like_tensors=False))
    assert not state.last_iteration_skipped and all(torch.isfinite(g).all() for g in got)


class CopyCounter(TorchFunctionMode):
    """Counts the torch calls that copy values into new or other memory, by name."""

    COPYING = frozenset({"copy_", "clone", "cat", "stack", "to", "contiguous", "index_copy_",
                         "narrow_copy", "type"})

    def __init__(self) -> None:
        super().__init__()
        self.calls: Counter = Counter()

    def __torch_function__(self, func: Any, types: Any, args: tuple = (),
                           kwargs: dict | None = None) -> Any:
        result = func(*args, **(kwargs or {}))
        name = getattr(func, "__name__", "")
        if name in self.COPYING:
            source = args[0] if args and isinstance(args[0], torch.Tensor) else None
            same = (name in ("to", "contiguous", "type") and isinstance(result, torch.Tensor)
                    and source is not None and result.data_ptr() == source.data_ptr())
            if not same:
                self.calls[name] += 1
        return result


def copies_of_one_iteration(parts: int, dtype: torch.dtype) -> Counter:
    state = GTopkHookState(density=0.02, start_iter=2)
    parameters = [split(n, parts, dtype) for n in SIZES]
    for step in range(4):
        run_hook(state, make_buckets(step, parameters, dtype))
    buckets = make_buckets(4, parameters, dtype)
    with CopyCounter() as counter:
        run_hook(state, buckets)
    return counter.calls


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_hook_copies_no_parameter(one_worker: None, device_like_buckets: None,
                                      dtype: torch.dtype) -> None:
    """The copies of one sparse iteration do not grow with the parameters per bucket (2 or 40:
    no per-parameter copy), and a float32 bucket is not copied at all (the step runs in its
    buffer); another dtype is cast in and out once per bucket."""
    few, many = copies_of_one_iteration(2, dtype), copies_of_one_iteration(40, dtype)
    assert few == many, (few, many)
    whole = many["copy_"] + many["to"] + many["contiguous"] + many["type"]
    assert whole == (0 if dtype == torch.float32 else 2 * len(SIZES)), many


def train_under_ddp(gradient_as_bucket_view: bool) -> list[torch.Tensor]:
    """A small MLP under DDP (several buckets) with the hook, 6 SGD steps; its parameters."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    from gtopk_hvd.torch.ddp import gtopk_hook

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(20, 30), torch.nn.ReLU(), torch.nn.Linear(30, 5))
    ddp = DDP(model, gradient_as_bucket_view=gradient_as_bucket_view, bucket_cap_mb=0.002)
    ddp.register_comm_hook(GTopkHookState(density=0.1, start_iter=2), gtopk_hook)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.1)
    generator = torch.Generator().manual_seed(1)
    for _ in range(6):
        x = torch.randn(8, 20, generator=generator)
        y = torch.randint(0, 5, (8,), generator=generator)
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(ddp(x), y).backward()
        optimizer.step()
    return [p.detach().clone() for p in model.parameters()]


def test_gradient_as_bucket_view_trains_bit_for_bit_the_same(one_worker: None) -> None:
    """DDP(gradient_as_bucket_view=True), which drops DDP's per-parameter copy back into
    param.grad (docs/ddp.md), gives the hook's updates unchanged: the future's value is the
    bucket's own buffer, which the gradients then view."""
    copied, viewed = train_under_ddp(False), train_under_ddp(True)
    assert all(torch.equal(a, b) for a, b in zip(copied, viewed))


# -- the flags themselves, on the host (their CUDA side: tests/ops/test_ops_cuda.py) ------------

@pytest.mark.parametrize("dtype", ["float32", "float64", "float16", "bfloat16"])
@pytest.mark.parametrize("bad", [None, float("nan"), float("inf"), float("-inf")])
def test_mark_nonfinite_on_the_host(dtype: str, bad: object) -> None:
    values = np.random.default_rng(3).standard_normal(10_001)
    if bad is not None:
        values[9_000] = bad
    x = torch.from_numpy(values).to(getattr(torch, dtype))
    expected = int(bad is not None)
    for target in ([x.numpy()] if dtype in ("float32", "float64") else []) + [x]:
        flag = ops.nonfinite_flag(target)
        ops.mark_nonfinite(target[:0], flag)
        assert ops.read_flag(flag) == 0
        ops.mark_nonfinite(target, flag)
        ops.mark_nonfinite(target[:10], flag)  # a finite one leaves a set flag set
        assert ops.read_flag(flag) == expected


def test_nonfinite_flags_gather_and_clear() -> None:
    flags = NonfiniteFlags()
    good, bad = np.ones(5, np.float32), np.array([1.0, np.inf], np.float32)
    flags.check(good)
    flags.check(torch.ones(3))
    assert not flags.read() and flags.flags == {}
    flags.check(good)
    flags.check(torch.tensor([float("nan")]))
    assert flags.read()
    flags.check(bad)
    flags.clear()
    assert not flags.read()
    transport = LocalTransport(LocalGroup(1), 0)
    assert count_nonfinite_workers(transport, [good, torch.ones(2)]) == 0
    assert count_nonfinite_workers(transport, [good, bad]) == 1
