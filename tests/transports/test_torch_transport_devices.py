"""Where TorchDistributedTransport moves host bytes and takes tensors, from the process group's
backend for each device type: NCCL alone (both on the GPU), Gloo (both on the CPU), and the group
`init_process_group()` makes without a backend on a GPU machine ("cpu:gloo,cuda:nccl": host bytes
through Gloo, tensors on the GPU through NCCL, so the device reduction needs no host copy). The
GPU is not needed: the mapping is checked with torch's answers given."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402

from gtopk_hvd.transports import torch_distributed  # noqa: E402
from gtopk_hvd.transports.torch_distributed import backend_config, group_devices  # noqa: E402

CPU, GPU = torch.device("cpu"), torch.device("cuda", 0)


@pytest.mark.parametrize("text,config", [
    ("cuda:nccl", {"cuda": "nccl"}),
    ("cpu:gloo,cuda:gloo", {"cpu": "gloo", "cuda": "gloo"}),
    ("cpu:gloo,cuda:nccl", {"cpu": "gloo", "cuda": "nccl"}),
    ("cpu:gloo", {"cpu": "gloo"})])
def test_the_backend_config_is_read_per_device_type(monkeypatch: pytest.MonkeyPatch, text: str,
                                                    config: dict) -> None:
    monkeypatch.setattr(dist, "get_backend_config", lambda group=None: text, raising=False)
    assert backend_config() == config


@pytest.mark.parametrize("name,config", [("nccl", {"cuda": "nccl"}), ("gloo", {"cpu": "gloo"})])
def test_a_plain_backend_name_where_torch_has_no_config(monkeypatch: pytest.MonkeyPatch,
                                                        name: str, config: dict) -> None:
    monkeypatch.delattr(dist, "get_backend_config", raising=False)
    monkeypatch.setattr(dist, "get_backend", lambda group=None: name)
    assert backend_config() == config


@pytest.mark.parametrize("config,devices", [
    ({"cuda": "nccl"}, (GPU, GPU)),
    ({"cpu": "gloo", "cuda": "nccl"}, (CPU, GPU)),
    ({"cpu": "gloo", "cuda": "gloo"}, (CPU, CPU)),
    ({"cpu": "gloo"}, (CPU, CPU)),
    ({"cpu": "mpi", "cuda": "mpi"}, (CPU, CPU))])
def test_host_bytes_and_tensors_go_where_the_group_serves_them(
        monkeypatch: pytest.MonkeyPatch, config: dict, devices: tuple) -> None:
    monkeypatch.setattr(torch_distributed.torch.cuda, "current_device", lambda: 0)
    assert group_devices(config) == devices
