"""Under torchrun (Gloo, CPU): the sparse reduce-scatter (`gtopk_hvd.torch.sparse_reduce_scatter`)
and its FSDP2 adapter (`gtopk_hvd.torch.fsdp`), against numpy.

    --mode comm    the comm called directly, several shard sizes, densities and dtypes, steps
                   with a NaN on one worker: every worker's shard and residual equal to a numpy
                   reference of all P workers, bit for bit; what was applied plus every
                   residual equals every gradient summed (gathered); the bytes
    --mode fsdp    an MLP under fully_shard (a unit a layer) with SGD: every worker's gathered
                   model equal bit for bit to a one-process replay that computes each worker's
                   gradient, runs the numpy reference on FSDP's layout and applies its shards;
                   at density 1 at P = 2, equal to FSDP's own reduce-scatter's run
    --mode resume  AdamW, a checkpoint halfway (each worker's model and optimizer shards and
                   its residuals), a new model restored from it: the same model as without the
                   stop, bit for bit (and not without the residuals)
    --mode errors  each bad registration raises on every rank, naming the problem

Each mode prints "FSDP <mode> ok rank=R" on every rank when every check passed.
"""

from __future__ import annotations

import argparse
import os
import tempfile

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import fully_shard

from gtopk_hvd.torch import fsdp
from gtopk_hvd.torch.sparse_reduce_scatter import SparseReduceScatter, shard_budget


def reference(gradients: np.ndarray, residuals: np.ndarray, k: int
              ) -> tuple[np.ndarray, np.ndarray]:
    """(every owner's shard (P, S), the residuals after) for every worker's flat gradient (P, n)
    and residual (P, n), in numpy, written from the docstring's steps, not from the code."""
    workers, n = gradients.shape
    shard = n // workers
    if not np.isfinite(gradients).all():
        return np.full((workers, shard), np.nan, np.float32), residuals.copy()
    accumulated = residuals + gradients
    after = accumulated.copy()
    shards = np.zeros((workers, shard), np.float32)
    for sender in range(workers):
        for owner in range(workers):
            piece = accumulated[sender, owner * shard:(owner + 1) * shard]
            chosen = np.sort(np.argsort(-np.abs(piece), kind="stable")[:k])
            shards[owner, chosen] += piece[chosen]
            after[sender, owner * shard + chosen] = 0
    return shards, after


def check_comm(rank: int, size: int) -> None:
    cases = [(1, 0.5, torch.float32), (7, 0.3, torch.float32), (40, 0.05, torch.float32),
             (33, 1.0, torch.float32), (25, 0.1, torch.bfloat16)]
    for shard, density, dtype in cases:
        k = shard_budget(shard, density)
        comm = SparseReduceScatter(density)
        rng = np.random.default_rng(shard)  # the same draws on every worker
        residuals = np.zeros((size, size * shard), np.float32)
        total = np.zeros(size * shard, np.float64)
        applied = np.zeros(size * shard, np.float64)
        for step in range(6):
            drawn = rng.standard_normal((size, size * shard)).astype(np.float32)
            if step == 3:
                drawn[size - 1, shard // 2] = np.nan
            gradients = torch.from_numpy(drawn).to(dtype)
            as_float = gradients.to(torch.float32).numpy()
            expected, residuals = reference(as_float, residuals, k)
            output = torch.empty(shard, dtype=dtype)
            comm(output, gradients[rank].clone(), None if size == 1 else dist.group.WORLD,
                 dist.ReduceOp.SUM)
            want = torch.from_numpy(expected[rank]).to(dtype)
            assert torch.equal(output.isnan(), want.isnan()), (shard, step)
            assert torch.equal(output.nan_to_num(), want.nan_to_num()), (shard, step, output, want)
            assert np.array_equal(comm.residual.numpy(), residuals[rank]), (shard, step)
            if np.isfinite(as_float).all():
                total += as_float.sum(axis=0, dtype=np.float64)
                applied += expected.reshape(-1)
        # conservation: everything applied plus every worker's residual, gathered
        mine = torch.from_numpy(comm.residual.numpy().astype(np.float64))
        everyone = [torch.empty_like(mine) for _ in range(size)]
        if size > 1:
            dist.all_gather(everyone, mine)
        else:
            everyone = [mine]
        held = sum(tensor.numpy() for tensor in everyone)
        assert np.allclose(applied + held, total, rtol=0, atol=1e-4), np.abs(
            applied + held - total).max()
        assert comm.skipped == 1 and comm.steps == 6
        if size > 1:
            assert comm.bytes_sent == 6 * (8 * k * (size - 1) + 4)
            itemsize = torch.tensor([], dtype=dtype).element_size()
            assert comm.dense_bytes == 6 * itemsize * shard * (size - 1)


WIDTHS = (8, 16, 16, 4)
LR = 0.125  # a power of two: lr x gradient is exact, so the shards' and the replay's SGD agree


def mlp() -> nn.Sequential:
    torch.manual_seed(0)
    layers: list[nn.Module] = []
    for fan_in, fan_out in zip(WIDTHS[:-1], WIDTHS[1:]):
        layers += [nn.Linear(fan_in, fan_out), nn.Tanh()]
    return nn.Sequential(*layers[:-1])


def batch(step: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(1000 * step + rank)
    return (torch.randn(6, WIDTHS[0], generator=generator),
            torch.randn(6, WIDTHS[-1], generator=generator))


def sharded(model: nn.Module) -> nn.Module:
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer)
    fully_shard(model)
    return model


def loss_of(model: nn.Module, step: int, rank: int) -> torch.Tensor:
    inputs, targets = batch(step, rank)
    return ((model(inputs) - targets) ** 2).mean()


def replay(size: int, density: float, steps: int) -> dict[str, torch.Tensor]:
    """The model after `steps` SGD steps, in this process alone: each worker's gradient, FSDP's
    layout per unit (each parameter in P chunks along dim 0, chunk q of every parameter in
    order making shard q), the numpy reference, FSDP's division by P, SGD."""
    model = mlp()
    units = [layer for layer in model if isinstance(layer, nn.Linear)]
    residuals = {id(unit): None for unit in units}
    for step in range(steps):
        per_worker = []
        for worker in range(size):
            model.zero_grad()
            loss_of(model, step, worker).backward()
            per_worker.append({id(p): p.grad.clone() for p in model.parameters()})
        for unit in units:
            parameters = list(unit.parameters())
            flat = np.stack([torch.cat([torch.cat([g[id(p)].chunk(size)[q].reshape(-1)
                                                   for p in parameters]) for q in range(size)]
                                       ).numpy() for g in per_worker])
            shard = flat.shape[1] // size
            if residuals[id(unit)] is None:
                residuals[id(unit)] = np.zeros_like(flat)
            shards, residuals[id(unit)] = reference(flat, residuals[id(unit)],
                                                    shard_budget(shard, density))
            for q in range(size):
                offset = 0
                for p in parameters:
                    piece = p.chunk(size)[q]
                    values = torch.from_numpy(shards[q, offset:offset + piece.numel()].copy())
                    p.grad.chunk(size)[q].copy_(values.reshape(piece.shape) / size)
                    offset += piece.numel()
        with torch.no_grad():
            for p in model.parameters():
                p.add_(p.grad, alpha=-LR)
    return {name: p.detach().clone() for name, p in model.named_parameters()}


def train_fsdp(density: float | None, steps: int, rank: int) -> dict[str, torch.Tensor]:
    model = sharded(mlp())
    sparse = fsdp.register(model, density) if density is not None else None
    optimizer = torch.optim.SGD(model.parameters(), lr=LR, foreach=False)
    for step in range(steps):
        optimizer.zero_grad()
        loss_of(model, step, rank).backward()
        optimizer.step()
    if sparse is not None:
        assert sorted(sparse.comms) == ["0", "2", "4"], sorted(sparse.comms)
        assert all(comm.steps == steps for comm in sparse.comms.values())
    return fsdp.full_state(model)


def check_fsdp(rank: int, size: int) -> None:
    steps = 5
    dense = train_fsdp(None, steps, rank)
    for density in (0.1, 0.3):
        got = train_fsdp(density, steps, rank)
        want = replay(size, density, steps)
        for name, tensor in want.items():
            assert torch.equal(got[name], tensor), (density, name, (got[name] - tensor).abs().max())
        assert not all(torch.equal(got[name], dense[name]) for name in dense), density
    if size == 2:  # a + b = b + a: at density 1 the sparse sums are the dense ones
        full = train_fsdp(1.0, steps, rank)
        for name, tensor in dense.items():
            assert torch.equal(full[name], tensor), name


def adamw_run(rank: int, steps: int, folder: str, stop_at: int | None, resume: bool,
              residuals: bool = True) -> dict[str, torch.Tensor]:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    model = sharded(mlp())
    sparse = fsdp.register(model, 0.2)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    first = 0
    if resume:
        model_state, optimizer_state = get_state_dict(model, optimizer)
        state = {"model": model_state, "optimizer": optimizer_state}
        dcp.load(state, checkpoint_id=folder)
        set_state_dict(model, optimizer, model_state_dict=state["model"],
                       optim_state_dict=state["optimizer"])
        if residuals:
            sparse.load_state_dict(torch.load(os.path.join(folder, f"sparse_rank{rank}.pt")))
        first = stop_at
    for step in range(first, steps):
        if step == stop_at and not resume:
            model_state, optimizer_state = get_state_dict(model, optimizer)
            dcp.save({"model": model_state, "optimizer": optimizer_state}, checkpoint_id=folder)
            torch.save(sparse.state_dict(), os.path.join(folder, f"sparse_rank{rank}.pt"))
            break
        optimizer.zero_grad()
        loss_of(model, step, rank).backward()
        optimizer.step()
    return fsdp.full_state(model)


def check_resume(rank: int, size: int) -> None:
    steps, stop_at = 8, 4
    folder = [tempfile.mkdtemp(prefix="fsdp_ckpt_") if rank == 0 else None]
    dist.broadcast_object_list(folder)
    whole = adamw_run(rank, steps, folder[0], None, False)
    adamw_run(rank, steps, folder[0], stop_at, False)
    resumed = adamw_run(rank, steps, folder[0], stop_at, True)
    for name, tensor in whole.items():
        assert torch.equal(resumed[name], tensor), name
    forgetful = adamw_run(rank, steps, folder[0], stop_at, True, residuals=False)
    assert not all(torch.equal(forgetful[name], whole[name]) for name in whole)


def check_errors(rank: int, size: int) -> None:
    """Each bad choice raises on every rank, with words that name it."""
    from gtopk_hvd.options import OptionError

    def raises(kind: type[Exception], words: str, call) -> None:
        try:
            call()
        except kind as error:
            assert words in str(error), str(error)
        else:
            raise AssertionError(f"no {kind.__name__} ({words})")

    raises(ValueError, "has no FSDP module", lambda: fsdp.register(mlp(), 0.01))
    model = sharded(mlp())
    raises(OptionError, "density", lambda: fsdp.register(model, 0.0))
    fsdp.register(model, 0.01)
    raises(ValueError, "register a model once", lambda: fsdp.register(model, 0.01))
    raises(ValueError, "density", lambda: SparseReduceScatter(0.5).load_state_dict(
        SparseReduceScatter(0.25).state_dict()))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mode", choices=("comm", "fsdp", "resume", "errors"), required=True)
    mode = parser.parse_args().mode
    dist.init_process_group("gloo")
    rank, size = dist.get_rank(), dist.get_world_size()
    {"comm": check_comm, "fsdp": check_fsdp, "resume": check_resume,
     "errors": check_errors}[mode](rank, size)
    dist.barrier()
    print(f"FSDP {mode} ok rank={rank}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
