"""Uneven data with `hvd.join()` and a sparse optimizer (tests/core/test_join.py), under mpirun (the
MPI transport) or horovodrun --gloo (Horovod's collectives):

    python join_uneven.py SCHEME optimizer STEPS_OF_RANK_0 STEPS_OF_RANK_1 ...
    python join_uneven.py SCHEME core:TRANSPORT STEPS_OF_RANK_0 ...      (any launcher)

Rank r takes STEPS_OF_RANK_r steps, its gradient at step t drawn from (r, t) and set directly as
p.grad (SGD, lr 1: the parameters move by minus the update), then calls Horovod's own
`hvd.join()` ("optimizer": gtopk_hvd.torch's DistributedOptimizer built by Horovod's own
`hvd.DistributedOptimizer`) or `SparseStep.join()` ("core": the framework-neutral step over the
named transport, e.g. torch under torchrun). Checks, on every rank:
- hvd.join() returns the rank that joined last (the most steps; the highest rank on a tie);
- Top-k: the final weights of the rank(s) that ran every step equal a numpy replay of Top-k with
  error feedback in which a joined worker contributes nothing and the average divides by P;
  gTop-k: every worker that ran the step got the same update (the weights agree bitwise);
- a joined worker's weights are those of its last own step; after broadcasting from the
  returned rank every replica is bitwise identical;
- Horovod's collectives work again after the join.
Prints "JOIN OK rank=<r> last=<rank>".
"""

from __future__ import annotations

import sys
from typing import Callable

import horovod.torch as hvd
import numpy as np
import torch
from harness import run_on_all_ranks

import gtopk_hvd.torch as gtopk
from gtopk_hvd.compression import Compression
from gtopk_hvd.core import SparseStep
from gtopk_hvd.transports.launch import close_transports, open_transport

D, DENSITY = 500, 0.02


def gradient(rank: int, step: int) -> np.ndarray:
    return np.random.default_rng([rank, step]).standard_normal(D).astype(np.float32)


def topk_replay(steps: list[int]) -> np.ndarray:
    """numpy Top-k with error feedback: each worker's k largest |residual + gradient|, summed
    over the workers still taking steps, / P; returns the weights after max(steps) steps."""
    workers, k = len(steps), int(np.ceil(DENSITY * D))
    residuals = np.zeros((workers, D), np.float32)
    weights = np.zeros(D, np.float32)
    for t in range(max(steps)):
        total = np.zeros(D, np.float32)
        for r in range(workers):
            if t >= steps[r]:
                continue
            accumulated = residuals[r] + gradient(r, t)
            chosen = np.argsort(-np.abs(accumulated), kind="stable")[:k]
            total[chosen] += accumulated[chosen]
            accumulated[chosen] = 0
            residuals[r] = accumulated
        weights -= total / np.float32(workers)
    return weights


def check(scheme: str, steps: list[int], rank: int, last: int, weights: np.ndarray,
          own: np.ndarray, allgather: Callable[[np.ndarray], np.ndarray]) -> None:
    """The checks of the module docstring on one rank (allgather: the launcher's)."""
    expected_last = max(range(len(steps)), key=lambda r: (steps[r], r))
    assert last == expected_last, (last, expected_last)
    assert np.array_equal(weights, own), "the joined worker's weights moved"
    if scheme == "topk" and steps[rank] == max(steps):
        np.testing.assert_allclose(weights, topk_replay(steps), rtol=1e-5, atol=1e-6)
    finished = allgather(own)
    full = [r for r in range(len(steps)) if steps[r] == max(steps)]
    assert all(np.array_equal(finished[r], finished[full[0]]) for r in full), "replicas differ"


def core_main(scheme: str, transport_name: str, steps: list[int]) -> None:
    transport = open_transport(transport_name)
    rank = transport.rank
    assert transport.size == len(steps), (transport.size, steps)
    compression = {"topk": Compression.topk, "gtopk": Compression.gtopk}[scheme]
    sparse = SparseStep(compression(DENSITY), [D], transport)
    weights, update = np.zeros(D, np.float32), np.zeros(D, np.float32)
    for t in range(steps[rank]):
        weights -= sparse.update(gradient(rank, t), update)
    own = weights.copy()
    last = sparse.join()
    check(scheme, steps, rank, last, weights, own, transport.allgather)
    print(f"JOIN OK rank={rank} last={last}", flush=True)
    close_transports()


def main() -> None:
    scheme, mode, steps = sys.argv[1], sys.argv[2], [int(n) for n in sys.argv[3:]]
    if mode.startswith("core:"):
        core_main(scheme, mode.removeprefix("core:"), steps)
        return
    hvd.init()
    rank = hvd.rank()
    assert hvd.size() == len(steps), (hvd.size(), steps)
    weights = torch.nn.Parameter(torch.zeros(D))
    compression = {"topk": gtopk.Compression.topk, "gtopk": gtopk.Compression.gtopk}[scheme]
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD([weights], lr=1.0),
                                         named_parameters=[("weights", weights)],
                                         compression=compression(DENSITY))
    for t in range(steps[rank]):
        optimizer.zero_grad()
        weights.grad = torch.from_numpy(gradient(rank, t))
        optimizer.step()
    own = weights.detach().clone()
    last = hvd.join()
    check(scheme, steps, rank, last, weights.detach().numpy(), own.numpy(),
          lambda x: hvd.allgather(torch.from_numpy(x).unsqueeze(0)).numpy())
    finished = hvd.allgather(own.unsqueeze(0)).numpy()
    hvd.broadcast_parameters({"weights": weights}, root_rank=last)
    replicas = hvd.allgather(weights.detach().unsqueeze(0)).numpy()
    assert all(np.array_equal(replica, replicas[0]) for replica in replicas), "not identical"
    assert np.array_equal(replicas[0], finished[last])
    print(f"JOIN OK rank={rank} last={last}", flush=True)


if __name__ == "__main__":
    run_on_all_ranks(main)
