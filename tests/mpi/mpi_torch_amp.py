"""Under mpirun: torch.amp loss scaling (GradScaler) with gtopk_hvd's sparse optimizer, Horovod's
recipe (synchronize, unscale_, skip_synchronize, scaler.step, update), on scikit-learn's digits.

    mpi_torch_amp.py MODE [MODE ...]      MODE: gtopk, topk or dense

Several modes run one after the other in the one launch, each exactly as alone (its own model,
optimizer and scaler from the same seed).

A digits MLP under float16 autocast on the CPU, twice with the same seed, data and steps:
"overflow" starts GradScaler at 2^24, so the first steps overflow (Inf gradients) and are
skipped while the scale drops; "no overflow" starts it low enough to never overflow. Checked on
every rank: overflow steps were skipped by the scaler on every worker alike (the scale dropped,
the optimizer's step count did not move), the residual after each skipped step is bit-equal to
the one before it, the final test accuracy is within 1 point of the run without overflow, and
the replicas are bitwise identical. Prints one RESULT line per run.
"""

from __future__ import annotations

import hashlib
import sys

import horovod.torch as hvd
import torch
from harness import run_on_all_ranks
from helpers import margins
from helpers.digits import digits_split, model_seed, worker_batches

import gtopk_hvd.torch as gtopk

EPOCHS = 12
BATCH = 32


def data() -> tuple[torch.Tensor, ...]:
    return tuple(torch.from_numpy(array) for array in digits_split())


def run(mode: str, init_scale: float) -> dict:
    x_train, y_train, x_test, y_test = data()
    torch.manual_seed(model_seed())
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(),
                                torch.nn.Linear(128, 10))
    compression = {"gtopk": gtopk.Compression.gtopk(0.05),
                   "topk": gtopk.Compression.topk(0.05),
                   "dense": gtopk.Compression.none}[mode]
    optimizer = gtopk.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
        named_parameters=model.named_parameters(), compression=compression)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    scaler = torch.amp.GradScaler("cpu", init_scale=init_scale, growth_interval=10**9)
    sparse = getattr(optimizer, "_sparse", None)
    skipped, scales = 0, [scaler.get_scale()]
    for index in worker_batches(len(x_train), EPOCHS, hvd.rank(), hvd.size(), BATCH):
        optimizer.zero_grad()
        with torch.autocast("cpu", dtype=torch.float16):
            loss = torch.nn.functional.cross_entropy(model(x_train[index]), y_train[index])
        scaler.scale(loss).backward()
        residual_before = None if sparse is None else sparse.residual.copy()
        steps_before = None if sparse is None else sparse.step_count
        optimizer.synchronize()
        scaler.unscale_(optimizer)
        with optimizer.skip_synchronize():
            scaler.step(optimizer)
        scale = scaler.get_scale()
        scaler.update()
        if scaler.get_scale() < scale:  # the scaler found Inf/NaN and skipped the step
            skipped += 1
            if sparse is not None:
                assert sparse.last_stats.skipped, "the scaler skipped a step we applied"
                assert sparse.residual.tobytes() == residual_before.tobytes(), (
                    "residual changed by a skipped step")
                assert sparse.step_count == steps_before
        elif sparse is not None:
            assert not sparse.last_stats.skipped, "we skipped a step the scaler applied"
        scales.append(scaler.get_scale())
    with torch.no_grad():
        accuracy = float((model(x_test).argmax(1) == y_test).float().mean())
    digest = hashlib.sha256(b"".join(p.detach().numpy().tobytes()
                                     for p in model.parameters())).hexdigest()
    everyone = hvd.allgather_object((digest, skipped))
    assert len(set(everyone)) == 1, f"replicas or skip counts differ: {everyone}"
    return {"accuracy": accuracy, "skipped": skipped, "first_scale": scales[0],
            "last_scale": scales[-1]}


def check_mode(mode: str) -> None:
    overflow = run(mode, init_scale=2.0**24)
    clean = run(mode, init_scale=2.0**8)
    if hvd.rank() == 0:
        for name, result in (("overflow", overflow), ("no overflow", clean)):
            print(f"RESULT mode={mode} run={name} accuracy={result['accuracy']:.4f} "
                  f"skipped={result['skipped']} scale={result['first_scale']:g}->"
                  f"{result['last_scale']:g}", flush=True)
    assert overflow["skipped"] >= 3 and overflow["last_scale"] < overflow["first_scale"], overflow
    assert clean["skipped"] == 0, clean
    gap = overflow["accuracy"] - clean["accuracy"]
    assert gap >= margins.floor(f"torch_amp_{mode}", f"{mode}_gap"), (overflow, clean)
    assert clean["accuracy"] >= margins.floor(f"torch_amp_{mode}", f"{mode}_clean"), clean
    if hvd.rank() == 0:
        print(f"CHECKED mode={mode}", flush=True)


def main() -> None:
    modes = sys.argv[1:]
    if not modes or not set(modes) <= {"gtopk", "topk", "dense"}:
        raise SystemExit(f"usage: mpi_torch_amp.py MODE [MODE ...] (gtopk, topk, dense); "
                         f"got {modes}")
    hvd.init()
    torch.set_num_threads(1)
    for mode in modes:
        check_mode(mode)


if __name__ == "__main__":
    run_on_all_ranks(main)
