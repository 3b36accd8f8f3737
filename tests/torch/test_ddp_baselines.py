"""The simulated cluster's DDP baselines (gtopk_hvd.torch.ddp_baselines) are torch's own hooks'
arithmetic: `bf16_compress_hook` and `powerSGD_hook` (ranks 1, 2 and 4), checked under torchrun
(Gloo, CPU) at P = 2 and 4 by tests/mpi/torchrun_ddp_baselines.py: every worker's bucket
inputs of a real DDP run, fed to the simulation, give the hook's update in every bucket and
iteration, to rounding: the all-reduces sum in another order (bit for bit at P = 2, where a
sum of two does not depend on it). The hook must also be far from no compression (moved), so
that the comparison could fail.
"""

from __future__ import annotations

import re

import pytest
from helpers.mpi_launcher import run_mpi

torch = pytest.importorskip("torch")

LINE = re.compile(r"BASELINE name=(?P<name>\S+) iterations=\d+ max_rel=(?P<rel>\S+) "
                  r"moved=(?P<moved>\S+)")
# Relative to the bucket's largest value: bf16 sums of P values in another order differ by up
# to P - 1 roundings of 2^-8 (4 ulps at P = 4: 2^-6); PowerSGD's float32 sums, with the
# orthogonalisation after them, measured at most 1.6e-6 (AVX2).
TOLERANCE = {"bf16": 2.0 ** -6, "powersgd-1": 1e-5, "powersgd-2": 1e-5, "powersgd-4": 1e-5}
MOVED = {"bf16": 1e-4, "powersgd-1": 0.05, "powersgd-2": 0.05, "powersgd-4": 0.05}


@pytest.mark.mpi
@pytest.mark.parametrize("workers", [2, 4])
def test_the_simulated_baselines_are_torchs_hooks(workers: int) -> None:
    output = run_mpi("torchrun_ddp_baselines.py", workers, launcher="torchrun", timeout_s=600)
    found = {m["name"]: m for m in LINE.finditer(output)}
    assert sorted(found) == sorted(TOLERANCE), output[-3000:]
    for name, m in found.items():
        rel, moved = float(m["rel"]), float(m["moved"])
        assert rel <= TOLERANCE[name], m.group(0)
        if workers == 2:
            assert rel == 0.0, m.group(0)
        assert moved >= MOVED[name], m.group(0)
    assert f"baselines ok on {workers} workers" in output, output[-3000:]


@pytest.mark.parametrize("shapes", [
    [(64, 32), (64,), (64, 64), (64,), (8, 64), (8,)],
    [(10_000, 200), (200,), (800, 200), (800, 200), (800,), (800,), (200, 10_000)],
])
def test_ddp_buckets_group_the_parameters_as_ddp_does(shapes: list) -> None:
    import torch.distributed as dist

    from gtopk_hvd.torch.ddp_baselines import ddp_buckets

    for first_mb, cap_mb in ((0.01, 0.02), (1.0, 25.0), (0.1, 1.0)):
        tensors = [torch.empty(shape) for shape in reversed(shapes)]
        ddp, _ = dist._compute_bucket_assignment_by_size(
            tensors, [int(first_mb * 2 ** 20), int(cap_mb * 2 ** 20)])
        last = len(shapes) - 1
        expected = [[last - i for i in bucket] for bucket in ddp]
        assert ddp_buckets(shapes, cap_mb, first_mb) == expected, (first_mb, cap_mb)


def test_the_simulated_cluster_takes_a_baseline_in_dense_s_place() -> None:
    import numpy as np

    from gtopk_hvd.compression import Compression
    from gtopk_hvd.simulate import SimulatedCluster
    from gtopk_hvd.torch.ddp_baselines import Bf16Allreduce, PowerSGD

    shapes = [(40, 30), (40,)]
    d = 40 * 30 + 40
    rng = np.random.default_rng(0)
    for baseline, twin in ((Bf16Allreduce(3, d), Bf16Allreduce(3, d)),
                           (PowerSGD(3, shapes, start_iter=2), PowerSGD(3, shapes, start_iter=2))):
        cluster = SimulatedCluster(None, [1200, 40], 3, baseline=baseline)
        for _ in range(4):
            gradients = [rng.standard_normal(d).astype(np.float32) for _ in range(3)]
            for mine, given in zip(cluster.gradients, gradients):
                mine[:] = given
            expected = twin.reduce([g.copy() for g in gradients])
            assert np.array_equal(cluster.reduce(), expected)
            assert not any(g.any() for g in cluster.gradients)  # cleared for the next step
        assert cluster.bytes_sent == [twin.wire()[1]] * 3
        cluster.close()
    with pytest.raises(ValueError, match="compression=None"):
        SimulatedCluster(Compression.gtopk(0.01), [1240], 3, baseline=Bf16Allreduce(3, 1240))
