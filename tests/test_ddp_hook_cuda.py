"""The DDP hook on CUDA buckets (run by scripts/gpu_check.sh's tests stage): the same updates,
residuals and skipped iteration as the host path, bit for bit, and no wait for the device at any
bucket: each bucket's non-finite read stays on the device (`ops.mark_nonfinite`), and so does
the decision to skip at the last one (`skip_on_device`, the default on CUDA buckets; gTop-k and
the sketch, whose table's kernel reads the flag;
tests/test_ddp_hook_costs.py and tests/test_device_skip.py count the host reads without a
GPU). With skip_on_device=False the last bucket waits (the host decision) and the results are
the same."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
import torch
import torch.distributed as dist
from test_ddp import Bucket

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
