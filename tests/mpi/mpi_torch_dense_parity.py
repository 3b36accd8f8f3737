"""Under mpirun (2 workers): gtopk_hvd.torch.DistributedOptimizer with Compression.none / .fp16
gives bitwise what Horovod's own DistributedOptimizer gives, argument by argument (groups,
num_groups, op=Sum, Adasum, gradient_predivide_factor, process_set, sparse_as_dense,
backward_passes_per_step, fp16 as ours and as Horovod's class), after three SGD steps from the
same weights and data; or the same error where Horovod refuses the combination."""

from __future__ import annotations

import hashlib
import os

import horovod.torch as hvd
import torch
from harness import run_on_all_ranks

import gtopk_hvd.torch as gtopk
from gtopk_hvd import horovod_swap


def horovod_optimizer() -> object:
    """Horovod's original DistributedOptimizer (the swap keeps it)."""
    return getattr(hvd.DistributedOptimizer, horovod_swap.MARKER)


def train(make: object, kwargs: dict) -> str:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Embedding(20, 6), torch.nn.Flatten(),
                                torch.nn.Linear(18, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))
    passes = kwargs.get("backward_passes_per_step", 1)
    try:
        optimizer = make(torch.optim.SGD(model.parameters(), lr=0.1),
                         named_parameters=model.named_parameters(), **kwargs)
        for step in range(3):
            generator = torch.Generator().manual_seed(100 * step + hvd.rank())
            tokens = torch.randint(0, 20, (8, 3), generator=generator)
            optimizer.zero_grad()
            for part in tokens.chunk(passes):
                model(part).pow(2).mean().backward()
            optimizer.step()
    except Exception as error:  # noqa: BLE001 - Horovod's refusals must be ours too
        return f"{type(error).__name__}: {str(error).splitlines()[0]}"
    return hashlib.sha256(b"".join(p.detach().numpy().tobytes()
                                   for p in model.parameters())).hexdigest()


def main() -> None:
    os.environ["HOROVOD_DYNAMIC_PROCESS_SETS"] = "1"  # as Horovod's test_optimizer_process_sets
    hvd.init()
    torch.set_num_threads(1)
    own_set = [hvd.add_process_set([rank]) for rank in range(hvd.size())][hvd.rank()]
    cases = {"defaults": {}, "fp16": {"compression": gtopk.Compression.fp16},
             "neutral fp16": {"compression": "neutral-fp16"}, "op=Sum": {"op": hvd.Sum},
             "Adasum": {"op": hvd.Adasum}, "predivide": {"gradient_predivide_factor": 2.0},
             "groups=2": {"groups": 2}, "num_groups=2": {"num_groups": 2},
             "sparse_as_dense": {"sparse_as_dense": True},
             "backward_passes_per_step=2": {"backward_passes_per_step": 2},
             "process_set": {"process_set": own_set}}
    outcomes = {}
    for name, kwargs in cases.items():
        if kwargs.get("compression") == "neutral-fp16":
            from gtopk_hvd.compression import Compression

            ours_kwargs = dict(kwargs, compression=Compression.fp16)
            theirs_kwargs = dict(kwargs, compression=hvd.Compression.fp16)
        else:
            ours_kwargs = theirs_kwargs = kwargs
        ours = train(gtopk.DistributedOptimizer, ours_kwargs)
        theirs = train(horovod_optimizer(), theirs_kwargs)
        hvd.barrier()  # a rank done with its own process set waits for the other's
        assert ours == theirs, f"{name}: ours {ours}, Horovod's {theirs}"
        outcomes[name] = "bitwise equal" if ":" not in ours else f"same error ({ours[:60]})"
    if hvd.rank() == 0:
        print(f"torch dense parity: {outcomes}", flush=True)
    assert all(value == "bitwise equal" for value in outcomes.values()), outcomes


if __name__ == "__main__":
    run_on_all_ranks(main)
