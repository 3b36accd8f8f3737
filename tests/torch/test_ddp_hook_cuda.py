"""The DDP hook on CUDA buckets (run by scripts/gpu/gpu_check.sh's tests stage): the same updates,
residuals and skipped iteration as the host path, bit for bit, and no wait for the device at any
bucket: each bucket's non-finite read stays on the device (`ops.mark_nonfinite`), and so does
the decision to skip at the last one (`skip_on_device`, the default on CUDA buckets; gTop-k and
the sketch, whose table's kernel reads the flag;
tests/torch/test_ddp_hook_costs.py and tests/torch/test_device_skip.py count the host reads without
a GPU). With skip_on_device=False the last bucket waits (the host decision) and the results are
the same."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
import torch
import torch.distributed as dist
from helpers.device_like import device_like, device_like_cpu
from helpers.figures import record_figure
from helpers.host_syncs import count_host_syncs, count_kernel_host_reads, torch_sync_warnings
from test_ddp import Bucket, run_hook

from gtopk_hvd import ops
from gtopk_hvd.compression import Compression
from gtopk_hvd.torch.ddp import GTopkHookState, gtopk_hook

pytestmark = pytest.mark.skipif(not (torch.cuda.is_available() and ops.cuda_built),
                                reason="needs a GPU and gtopk_hvd's CUDA kernels")
SIZES = (3000, 5000, 2000)


@pytest.fixture(scope="module")
def one_worker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    created = not dist.is_initialized()
    if created:
        store = dist.FileStore(str(tmp_path_factory.mktemp("ddp_cuda") / "store"), 1)
        # CUDA tensors through NCCL, as DDP on GPUs
        dist.init_process_group("cpu:gloo,cuda:nccl", store=store, rank=0, world_size=1)
    yield
    if created:
        dist.destroy_process_group()


def gradients(step: int) -> list[np.ndarray]:
    rng = np.random.default_rng(step)
    values = [rng.standard_normal(n).astype(np.float32) for n in SIZES]
    if step == 5:
        values[1][17] = np.nan
    return values


@pytest.mark.parametrize("scheme", ["gtopk", "sketch"])
@pytest.mark.parametrize("on_device", [True, False])
def test_cuda_buckets_step_as_the_host_without_waiting(one_worker: None, on_device: bool,
                                                       scheme: str) -> None:
    compression = getattr(Compression, scheme)(0.02)
    host_state = GTopkHookState(compression=compression, start_iter=2)
    cuda_state = GTopkHookState(compression=compression, start_iter=2,
                                skip_on_device=None if on_device else False)
    host_parameters = [[torch.zeros(n)] for n in SIZES]
    cuda_parameters = [[torch.zeros(n, device="cuda")] for n in SIZES]
    for step in range(8):
        values = gradients(step)
        host_buckets = [Bucket(i, host_parameters[i], torch.from_numpy(v.copy()),
                               last=i == len(SIZES) - 1) for i, v in enumerate(values)]
        cuda_buckets = [Bucket(i, cuda_parameters[i], torch.from_numpy(v).cuda(),
                               last=i == len(SIZES) - 1) for i, v in enumerate(values)]
        # the hook holds every bucket until the last one: a future is waited for after all
        host_futures = [gtopk_hook(host_state, b) for b in host_buckets]
        host_got = [future.wait() for future in host_futures]
        futures = []
        for bucket in cuda_buckets:
            if step >= 4 and (on_device or not bucket.is_last()):
                torch.cuda.synchronize()
                torch.cuda._sleep(1_000_000_000)  # keeps the stream busy for about 0.5 s
                futures.append(gtopk_hook(cuda_state, bucket))
                assert not torch.cuda.current_stream().query(), "the hook waited"
            else:
                futures.append(gtopk_hook(cuda_state, bucket))
        cuda_got = [future.wait() for future in futures]
        torch.cuda.synchronize()
        for host, device in zip(host_got, cuda_got):
            assert device.is_cuda
            assert host.numpy().tobytes() == device.cpu().numpy().tobytes(), f"step {step}"
        assert cuda_state.last_iteration_skipped == host_state.last_iteration_skipped == (
            step == 5)
        assert cuda_state.iter == host_state.iter
    for index, bucket in host_state.buckets.items():
        residual = cuda_state.buckets[index].step.residual
        assert residual.is_cuda
        assert residual.cpu().numpy().tobytes() == bucket.step.residual.tobytes()


@pytest.mark.parametrize("scheme", ["micro", "exdyna"])
def test_cuda_buckets_of_a_threshold_scheme_step_in_lockstep_as_the_host(one_worker: None,
                                                                         scheme: str) -> None:
    """MiCRO and ExDyna read the device twice a step; the hook runs the held buckets' steps in
    lockstep (gtopk_hvd.lockstep: two waits an iteration, not two a bucket). The updates, the
    skipped iteration and the residuals equal the host path's bit for bit."""
    compression = getattr(Compression, scheme)(0.02)
    host_state = GTopkHookState(compression=compression, start_iter=2)
    cuda_state = GTopkHookState(compression=compression, start_iter=2)
    host_parameters = [[torch.zeros(n)] for n in SIZES]
    cuda_parameters = [[torch.zeros(n, device="cuda")] for n in SIZES]
    for step in range(8):
        values = gradients(step)
        host_futures = [gtopk_hook(host_state, Bucket(i, host_parameters[i],
                                                      torch.from_numpy(v.copy()),
                                                      last=i == len(SIZES) - 1))
                        for i, v in enumerate(values)]
        cuda_futures = [gtopk_hook(cuda_state, Bucket(i, cuda_parameters[i],
                                                      torch.from_numpy(v).cuda(),
                                                      last=i == len(SIZES) - 1))
                        for i, v in enumerate(values)]
        for host, device in zip([f.wait() for f in host_futures],
                                [f.wait() for f in cuda_futures]):
            assert host.numpy().tobytes() == device.cpu().numpy().tobytes(), f"step {step}"
        assert cuda_state.last_iteration_skipped == host_state.last_iteration_skipped == (
            step == 5)
    for index, bucket in host_state.buckets.items():
        residual = cuda_state.buckets[index].step.residual
        assert residual.cpu().numpy().tobytes() == bucket.step.residual.tobytes()


SYNC_SCHEMES = {
    "gtopk": lambda: Compression.gtopk(0.02),
    "gtopk-momentum": lambda: Compression.gtopk(0.02, momentum_correction=True),
    "topk": lambda: Compression.topk(0.02),
    "gtopk-exact": lambda: Compression.gtopk(0.02, exact=True),
    "micro": lambda: Compression.micro(0.02),
    "exdyna": lambda: Compression.exdyna(0.02),
    "sketch": lambda: Compression.sketch(0.02),
}
COUNTED = range(4, 7)  # sparse iterations, the NaN at 5


def syncs_per_iteration(scheme: str, device_like_model: bool) -> list[int]:
    """The host synchronisations of each COUNTED iteration of the hook over SIZES' buckets:
    on the GPU, those torch reports; on DeviceLikeTensors (the model the CPU tests hold the
    code to: tests/helpers/host_syncs.py), those made outside the kernel layer plus the
    kernel layer's host reads. Both decide the skip where a CUDA state does (the device)."""
    state = GTopkHookState(compression=SYNC_SCHEMES[scheme](), start_iter=2,
                           skip_on_device=True)
    device = "cpu" if device_like_model else "cuda"
    parameters = [[torch.zeros(n, device=device)] for n in SIZES]
    counts = []
    for step in range(max(COUNTED) + 1):
        buckets = []
        for i, values in enumerate(gradients(step)):
            buffer = torch.from_numpy(values).to(device)
            buckets.append(Bucket(i, parameters[i],
                                  device_like(buffer) if device_like_model else buffer,
                                  last=i == len(SIZES) - 1))
        if step not in COUNTED:
            run_hook(state, buckets)
        elif device_like_model:
            with count_host_syncs() as outside, count_kernel_host_reads() as kernels:
                run_hook(state, buckets)
            counts.append(outside.total + kernels.total)
        else:
            with torch_sync_warnings() as seen:
                run_hook(state, buckets)
            counts.append(len(seen))
    # read after the loop, outside every count (reading the skip is a wait)
    assert not state.last_iteration_skipped, state.iter
    return counts


@pytest.mark.parametrize("scheme", list(SYNC_SCHEMES))
def test_host_synchronisations_per_iteration_within_the_cpu_model(
        one_worker: None, monkeypatch: pytest.MonkeyPatch, scheme: str) -> None:
    """What torch sees wait on the GPU in one iteration of the hook (three buckets, P = 1 on
    NCCL) is at most what the CPU tests count for the same iteration on DeviceLikeTensors
    (tests/torch/test_ddp_hook_costs.py, tests/core/test_lockstep.py): a wait that only a real
    device makes (a host tensor indexing a device one, a pageable copy) fails here. The counts go to
    the GPU check's report (helpers/figures.py)."""
    on_gpu = syncs_per_iteration(scheme, device_like_model=False)
    from gtopk_hvd.torch import ddp

    monkeypatch.setattr(ddp, "_step_device", lambda device: device)
    with device_like_cpu():
        model = syncs_per_iteration(scheme, device_like_model=True)
    record_figure("hook_host_syncs", scheme=scheme, iterations=list(COUNTED),
                  skipped_iteration=5, torch_on_gpu=on_gpu, cpu_model=model)
    assert all(seen <= bound for seen, bound in zip(on_gpu, model)), (on_gpu, model)
