"""Shared by the torch MPI programs: replica digests and Horovod's dense average as reference."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

import horovod.torch as hvd
import torch


def parameter_bytes(model: torch.nn.Module) -> bytes:
    """The raw bytes of every tensor of the model's state (any dtype, bfloat16 and 0-dim too)."""
    return b"".join(tensor.detach().reshape(-1).view(torch.uint8).numpy().tobytes()
                    for tensor in model.state_dict().values())


def assert_same_on_all_ranks(model: torch.nn.Module, what: str) -> None:
    """Fails on every rank unless every replica's state is bitwise the same."""
    digest = hashlib.sha256(parameter_bytes(model)).hexdigest()
    everyone = hvd.allgather_object(digest)
    assert len(set(everyone)) == 1, f"{what}: replicas differ: {everyone}"


def average_gradients_with_horovod(parameters: Iterable[torch.Tensor]) -> None:
    """The dense reference: p.grad = Horovod's average of the gradients in float64, cast back to
    p's dtype. A parameter that requires a gradient but has none on this worker contributes
    zeros (what horovod.torch.DistributedOptimizer does); frozen parameters are skipped."""
    for parameter in parameters:
        if not parameter.requires_grad:
            continue
        gradient = torch.zeros_like(parameter) if parameter.grad is None else parameter.grad
        parameter.grad = hvd.allreduce(gradient.double(), op=hvd.Average).to(parameter.dtype)
