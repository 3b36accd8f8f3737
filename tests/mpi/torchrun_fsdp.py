"""Under torchrun (Gloo, CPU): the sparse reduce-scatter (`gtopk_hvd.torch.sparse_reduce_scatter`)
and its FSDP2 adapter (`gtopk_hvd.torch.fsdp`), against numpy.

    --mode comm    the comm called directly, several shard sizes, densities and dtypes, steps
                   with a NaN on one worker: every worker's shard and residual equal to a numpy
                   reference of all P workers, bit for bit (float32 and bfloat16 residuals);
                   what was applied plus every residual equals every gradient summed
                   (gathered; to bfloat16's rounding with its residual); the bytes
    --mode fsdp    an MLP under fully_shard (a unit a layer) with SGD: every worker's gathered
                   model equal bit for bit to a one-process replay that computes each worker's
                   gradient, runs the numpy reference on FSDP's layout and applies its shards,
                   with a float32 and a bfloat16 reduce dtype (MixedPrecisionPolicy) and a
                   bfloat16 residual; at density 1 at P = 2, equal to FSDP's own
                   reduce-scatter's run
    --mode adamw   AdamW with freeze_variance_after: every worker's gathered model equal bit
                   for bit to a one-process replay of the rule on FSDP's shards (the dense
                   start summed in rank order, s gathered in FSDP's padded layout, the frozen
                   step), NaNs on one worker in each phase skipping the step everywhere; at P = 3
                   some shards are padded and one is empty
    --mode fsdp1   FSDP1 (FULL_SHARD and SHARD_GRAD_OP, a unit a layer) with SGD against the
                   replay on FSDP1's flat layout, bit for bit
    --mode accumulate  two micro-batches a step, the first without gradient sync (FSDP2 and
                   FSDP1): the accumulated gradient reduced once, against the replay, bit for bit
    --mode resume  AdamW with freeze_variance_after and a binding clip, a checkpoint in the
                   sparse phase (each worker's model and optimizer shards, its residuals and
                   last norms), a new model restored from it: the same model as without the
                   stop, bit for bit (and not without the sparse state)
    --mode alone   one worker: register warns and changes nothing (FSDP reduces nothing)
    --mode errors  each bad registration raises on every rank, naming the problem

Each mode prints "FSDP <mode> ok rank=R" on every rank when every check passed.
"""

from __future__ import annotations

import argparse
import math
import os
import tempfile

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import fully_shard

from gtopk_hvd import fsdp_plan
from gtopk_hvd.density import shard_budget
from gtopk_hvd.torch import fsdp
from gtopk_hvd.torch.ddp import end_process_group
from gtopk_hvd.torch.sparse_reduce_scatter import SparseReduceScatter


def reference(gradients: np.ndarray, residuals: np.ndarray, k: int, bf16: bool = False
              ) -> tuple[np.ndarray, np.ndarray]:
    """(every owner's shard (P, S), the residuals after) for every worker's flat gradient (P, n)
    and residual (P, n), in numpy, written from the docstring's steps, not from the code; bf16:
    the residual after rounded to bfloat16 (held in float32 here)."""
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
    if bf16:
        after = torch.from_numpy(after).to(torch.bfloat16).to(torch.float32).numpy()
    return shards, after


def check_comm(rank: int, size: int) -> None:
    cases = [(1, 0.5, torch.float32, torch.float32), (7, 0.3, torch.float32, torch.float32),
             (40, 0.05, torch.float32, torch.float32), (33, 1.0, torch.float32, torch.float32),
             (25, 0.1, torch.bfloat16, torch.float32), (40, 0.05, torch.float32, torch.bfloat16),
             (25, 0.1, torch.bfloat16, torch.bfloat16)]
    for shard, density, dtype, kept in cases:
        k = shard_budget(shard, density)
        bf16 = kept == torch.bfloat16
        comm = SparseReduceScatter(density, residual_dtype=kept)
        rng = np.random.default_rng(shard)  # the same draws on every worker
        residuals = np.zeros((size, size * shard), np.float32)
        total = np.zeros(size * shard, np.float64)
        lost = np.zeros(size * shard, np.float64)  # what bfloat16 rounding took, summed
        applied = np.zeros(size * shard, np.float64)
        for step in range(6):
            drawn = rng.standard_normal((size, size * shard)).astype(np.float32)
            if step == 3:
                drawn[size - 1, shard // 2] = np.nan
            gradients = torch.from_numpy(drawn).to(dtype)
            as_float = gradients.to(torch.float32).numpy()
            unrounded = reference(as_float, residuals, k)[1]
            expected, residuals = reference(as_float, residuals, k, bf16)
            lost += np.abs(unrounded.astype(np.float64) - residuals).sum(axis=0)
            output = torch.empty(shard, dtype=dtype)
            comm(output, gradients[rank].clone(), None if size == 1 else dist.group.WORLD,
                 dist.ReduceOp.SUM)
            want = torch.from_numpy(expected[rank]).to(dtype)
            assert torch.equal(output.isnan(), want.isnan()), (shard, step)
            assert torch.equal(output.nan_to_num(), want.nan_to_num()), (shard, step, output, want)
            assert comm.residual.dtype == kept
            assert np.array_equal(comm.residual.float().numpy(), residuals[rank]), (shard, step)
            if np.isfinite(as_float).all():
                total += as_float.sum(axis=0, dtype=np.float64)
                applied += expected.reshape(-1)
        # conservation: everything applied plus every worker's residual, gathered
        mine = torch.from_numpy(comm.residual.float().numpy().astype(np.float64))
        everyone = [torch.empty_like(mine) for _ in range(size)]
        if size > 1:
            dist.all_gather(everyone, mine)
        else:
            everyone = [mine]
        held = sum(tensor.numpy() for tensor in everyone)
        assert np.all(np.abs(applied + held - total) <= lost + 1e-4), np.abs(
            applied + held - total).max()
        assert bf16 or not lost.any()
        assert comm.skipped == 1 and comm.steps == 6
        if size > 1:
            assert comm.bytes_sent == 6 * (8 * k * (size - 1) + 4)
            itemsize = torch.tensor([], dtype=dtype).element_size()
            assert comm.dense_bytes == 6 * itemsize * shard * (size - 1)


WIDTHS = (8, 16, 16, 4)
LR = 0.125  # a power of two: lr x gradient is exact, so the shards' and the replay's SGD agree


POISON_FIRST_UNIT = [False]
"""While set, the first Linear's output gradient is NaN: that unit's gradient alone is."""


def mlp() -> nn.Sequential:
    torch.manual_seed(0)
    layers: list[nn.Module] = []
    for fan_in, fan_out in zip(WIDTHS[:-1], WIDTHS[1:]):
        layers += [nn.Linear(fan_in, fan_out), nn.Tanh()]
    model = nn.Sequential(*layers[:-1])

    def poison(module: nn.Module, inputs: object, output: torch.Tensor) -> None:
        if POISON_FIRST_UNIT[0]:
            output.register_hook(lambda gradient: torch.full_like(gradient, float("nan")))

    model[0].register_forward_hook(poison)
    return model


def batch(step: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(1000 * step + rank)
    return (torch.randn(6, WIDTHS[0], generator=generator),
            torch.randn(6, WIDTHS[-1], generator=generator))


def sharded(model: nn.Module, policy: object = None) -> nn.Module:
    options = {} if policy is None else {"mp_policy": policy}
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, **options)
    fully_shard(model, **options)
    return model


def loss_of(model: nn.Module, step: int, rank: int, poison: str | bool = False
            ) -> torch.Tensor:
    """The MSE of a batch; poison: a NaN in the input (every unit's gradient NaN) or, with
    "unit0", in the first unit's gradient alone."""
    inputs, targets = batch(step, rank)
    if poison is True:
        inputs[0, 0] = float("nan")
    POISON_FIRST_UNIT[0] = poison == "unit0"
    return ((model(inputs) - targets) ** 2).mean()


def chunk_rows(tensor: torch.Tensor, size: int) -> int:
    """Rows of FSDP's dim-0 shard of `tensor` over `size` workers (the last ones padded)."""
    return -(-tensor.shape[0] // size)


def flat_layout(tensors: list[torch.Tensor], size: int) -> torch.Tensor:
    """A unit's flat gradient as FSDP2 lays it out: each tensor padded along dim 0 to P equal
    chunks, chunk q of every tensor in order making shard q, the shards in rank order."""
    chunks = []
    for tensor in tensors:
        rows = chunk_rows(tensor, size)
        padded = torch.zeros((rows * size,) + tuple(tensor.shape[1:]), dtype=tensor.dtype)
        padded[:tensor.shape[0]] = tensor
        chunks.append([piece.reshape(-1) for piece in padded.chunk(size)])
    return torch.cat([torch.cat([pieces[q] for pieces in chunks]) for q in range(size)])


def local_piece(tensor: torch.Tensor, size: int, q: int) -> torch.Tensor:
    """Worker q's shard of `tensor` (a view; empty where the padding takes all of it)."""
    rows = chunk_rows(tensor, size)
    return tensor[q * rows:(q + 1) * rows]


def pieces_of(row: torch.Tensor, tensors: list[torch.Tensor], size: int, q: int
              ) -> list[torch.Tensor]:
    """Shard q's values (FSDP's layout) cut into each tensor's piece on worker q."""
    out, offset = [], 0
    for tensor in tensors:
        piece = local_piece(tensor, size, q)
        out.append(row[offset:offset + piece.numel()].reshape(piece.shape))
        offset += chunk_rows(tensor, size) * math.prod(tensor.shape[1:])
    return out


def worker_gradients(model: nn.Module, step: int, size: int, poisoned: dict[int, int],
                     micro: int = 1) -> list[dict[int, torch.Tensor]]:
    """Each worker's gradient by parameter id (worker poisoned[step] gets a NaN input); with
    micro > 1, accumulated over micro-batches micro step .. micro step + micro - 1, as autograd
    accumulates them."""
    per_worker = []
    for worker in range(size):
        model.zero_grad()
        for batch_index in range(micro * step, micro * step + micro):
            how = poisoned.get(step, (None, None))
            loss_of(model, batch_index, worker, how[1] if how[0] == worker else False).backward()
        per_worker.append({id(p): p.grad.clone() for p in model.parameters()})
    return per_worker


def units_of(model: nn.Module) -> list[list[torch.Tensor]]:
    return [list(layer.parameters()) for layer in model if isinstance(layer, nn.Linear)]


def replay(size: int, density: float, steps: int, reduce_dtype: torch.dtype = torch.float32,
           residual_dtype: torch.dtype = torch.float32, micro: int = 1
           ) -> dict[str, torch.Tensor]:
    """The model after `steps` SGD steps, in this process alone: each worker's gradient, FSDP's
    layout per unit in the reduce dtype, the numpy reference (in float32), the shard in the
    reduce dtype divided by P there (FSDP's division), SGD."""
    model = mlp()
    residuals: dict[int, np.ndarray | None] = {}
    for step in range(steps):
        per_worker = worker_gradients(model, step, size, {}, micro)
        for parameters in units_of(model):
            flat = np.stack([flat_layout([g[id(p)] for p in parameters], size).to(reduce_dtype)
                             .to(torch.float32).numpy() for g in per_worker])
            shard = flat.shape[1] // size
            held = residuals.get(id(parameters[0]))
            shards, residuals[id(parameters[0])] = reference(
                flat, np.zeros_like(flat) if held is None else held,
                shard_budget(shard, density), residual_dtype == torch.bfloat16)
            for q in range(size):
                row = torch.from_numpy(shards[q].copy()).to(reduce_dtype).div_(size)
                for p, values in zip(parameters, pieces_of(row.to(torch.float32), parameters,
                                                           size, q)):
                    local_piece(p.grad, size, q).copy_(values)
        with torch.no_grad():
            for p in model.parameters():
                p.add_(p.grad, alpha=-LR)
    return {name: p.detach().clone() for name, p in model.named_parameters()}


def train_fsdp(density: float | None, steps: int, rank: int,
               reduce_dtype: torch.dtype = torch.float32,
               residual_dtype: torch.dtype = torch.float32) -> dict[str, torch.Tensor]:
    policy = None
    if reduce_dtype != torch.float32:
        from torch.distributed.fsdp import MixedPrecisionPolicy

        policy = MixedPrecisionPolicy(reduce_dtype=reduce_dtype)
    model = sharded(mlp(), policy)
    sparse = (fsdp.register(model, density, residual_dtype=residual_dtype)
              if density is not None else None)
    optimizer = torch.optim.SGD(model.parameters(), lr=LR, foreach=False)
    for step in range(steps):
        optimizer.zero_grad()
        loss_of(model, step, rank).backward()
        optimizer.step()
    if sparse is not None:
        assert sorted(sparse.comms) == ["0", "2", "4"], sorted(sparse.comms)
        assert all(comm.steps == steps for comm in sparse.comms.values())
        assert all(comm.residual.dtype == residual_dtype for comm in sparse.comms.values())
        size = dist.get_world_size()  # the planner's bytes are what the comms sent
        shards = [comm.residual.numel() // size for comm in sparse.comms.values()]
        assert sparse.bytes_sent == steps * sum(fsdp_plan.sparse_bytes(shard, size, density)
                                                for shard in shards)
        itemsize = torch.tensor([], dtype=reduce_dtype).element_size()
        assert sparse.dense_bytes == steps * sum(itemsize * shard * (size - 1)
                                                 for shard in shards)
    return fsdp.full_state(model)


def assert_same(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor], case: object
                ) -> None:
    for name, tensor in want.items():
        assert torch.equal(got[name], tensor), (case, name, (got[name] - tensor).abs().max())


def check_fsdp(rank: int, size: int) -> None:
    steps = 5
    dense = train_fsdp(None, steps, rank)
    cases = [(0.1, torch.float32, torch.float32), (0.3, torch.float32, torch.float32),
             (0.1, torch.bfloat16, torch.float32), (0.1, torch.float32, torch.bfloat16)]
    for density, reduce_dtype, residual_dtype in cases:
        got = train_fsdp(density, steps, rank, reduce_dtype, residual_dtype)
        assert_same(got, replay(size, density, steps, reduce_dtype, residual_dtype),
                    (density, reduce_dtype, residual_dtype))
        assert not all(torch.equal(got[name], dense[name]) for name in dense), density
    if size == 2:  # a + b = b + a: at density 1 the sparse sums are the dense ones
        assert_same(train_fsdp(1.0, steps, rank), dense, "density 1")


ADAMW = {"lr": 1e-2, "betas": (0.9, 0.95), "eps": 1e-8, "weight_decay": 0.1}
AFTER = 3  # dense AdamW steps before the freeze
POISONED = {1: (1, True), 5: (0, True), 7: (1, "unit0")}
"""step -> (worker, loss_of's poison): a NaN input in the dense start and in the sparse phase,
then a NaN in the first unit's gradient alone (the other units' reductions finite)."""
CALLER_SKIPS = {6}
"""Steps after whose backward the caller does not call optimizer.step()."""


def adamw_replay(size: int, density: float, steps: int, clip: float | None = None
                 ) -> tuple[dict[str, torch.Tensor], int]:
    """freeze_variance_after=AFTER in this process alone, on every worker's shards as separate
    tensors (so each arithmetic op sees the shapes it sees under FSDP), from the rule as
    docs/adamw.md states it: dense steps summed in rank order, divided by P, AdamW; then s from
    the frozen exp_avg_sq, each worker's gradient times s in FSDP's layout, the numpy
    reference, the shard / P as u, and m <- b1 m + (1 - b1) u, w <- w (1 - lr wd) -
    lr m / (1 - b1^t). A step with a NaN on any worker, or one the caller does not take,
    changes no weight, and each finite unit's residual then holds what it held plus the
    step's gradient (nothing sent in it is lost). With clip = M, each
    worker's unit gradient is first scaled by min(1, M / (norm + 1e-6)), the norm over every
    unit's of this worker: this step's for the units reduced so far (in backward's order, the
    last layer first), the last applied step's for the others. Returns the model and how many
    unit gradients the clip cut."""
    model = mlp()
    units = units_of(model)
    shards = {id(p): [nn.Parameter(local_piece(p.detach(), size, q).clone())
                      for q in range(size)] for p in model.parameters()}
    optimizer = torch.optim.AdamW([piece for p in model.parameters() for piece in shards[id(p)]],
                                  foreach=False, **ADAMW)
    residuals: dict[int, np.ndarray] = {}
    scales: dict[int, torch.Tensor] = {}
    applied = cut = 0
    last: list[dict[int, torch.Tensor]] = [{} for _ in range(size)]  # each worker's norms
    for step in range(steps):
        per_worker = worker_gradients(model, step, size, POISONED)
        finite = all(torch.isfinite(g).all() for grads in per_worker for g in grads.values())
        now: list[dict[int, torch.Tensor]] = [{} for _ in range(size)]
        outcome: dict[int, tuple[np.ndarray, np.ndarray]] = {}  # unit -> residual: applied, not
        for parameters in reversed(units):  # FSDP reduces the last unit first
            flat = torch.stack([flat_layout([g[id(p)] for p in parameters], size)
                                for g in per_worker])
            n = flat.shape[1]
            unit = id(parameters[0])
            if applied < AFTER:
                for worker in range(size):
                    now[worker][unit] = torch.linalg.vector_norm(flat[worker],
                                                                 dtype=torch.float32)
                rows = torch.zeros(size, n // size)
                for worker in range(size):
                    rows += flat[worker].reshape(size, -1)
            else:
                if id(parameters[0]) not in scales:
                    mine = []
                    for q in range(size):
                        for p in parameters:
                            v = optimizer.state[shards[id(p)][q]]["exp_avg_sq"]
                            s = 1.0 / ((v / (1.0 - ADAMW["betas"][1] ** AFTER)).sqrt()
                                       + ADAMW["eps"])
                            padded = torch.zeros(chunk_rows(p, size) * math.prod(p.shape[1:]))
                            padded[:s.numel()] = s.reshape(-1)
                            mine.append(padded)
                    scales[id(parameters[0])] = torch.cat(mine)
                if clip is not None:
                    for worker in range(size):
                        now[worker][unit] = torch.linalg.vector_norm(flat[worker])
                        norm = torch.linalg.vector_norm(torch.stack([
                            now[worker].get(id(u[0]), last[worker].get(id(u[0]), torch.zeros(())))
                            for u in units]))
                        coefficient = torch.clamp(clip / (norm + 1e-6), max=1.0)
                        cut += bool(coefficient < 1.0)
                        flat[worker] = flat[worker] * coefficient
                flat = (flat * scales[id(parameters[0])]).numpy()
                held = residuals.get(id(parameters[0]), np.zeros_like(flat))
                found, after = reference(flat, held, shard_budget(n // size, density))
                rows = torch.from_numpy(found)
                # not applied: a finite unit's residual holds all it had and its gradient
                outcome[unit] = (after, held + flat if np.isfinite(flat).all() else after)
            for q in range(size):
                row = rows[q].clone().div_(size)
                for p, values in zip(parameters, pieces_of(row, parameters, size, q)):
                    shards[id(p)][q].grad = values.clone()
        applies = finite and step not in CALLER_SKIPS
        for unit, (if_applied, if_not) in outcome.items():
            residuals[unit] = if_applied if applies else if_not
        if not applies:
            continue
        for worker in range(size):
            last[worker].update(now[worker])
        if applied < AFTER:
            optimizer.step()
        else:
            with torch.no_grad():
                for group in optimizer.param_groups:
                    beta1, lr, decay = group["betas"][0], group["lr"], group["weight_decay"]
                    for piece in group["params"]:
                        state = optimizer.state[piece]
                        state["step"] += 1
                        piece.mul_(1.0 - lr * decay)
                        state["exp_avg"].mul_(beta1).add_(piece.grad, alpha=1.0 - beta1)
                        piece.add_(state["exp_avg"],
                                   alpha=-lr / (1.0 - beta1 ** float(state["step"])))
        applied += 1
        with torch.no_grad():
            for p in model.parameters():
                p.copy_(torch.cat(list(shards[id(p)])))
    return {name: p.detach().clone() for name, p in model.named_parameters()}, cut


def adamw_run(rank: int, steps: int, density: float, folder: str | None = None,
              stop_at: int | None = None, resume: bool = False, residuals: bool = True,
              clip: float | None = None) -> tuple[dict[str, torch.Tensor], fsdp.SparseFSDP]:
    """The MLP under fully_shard with AdamW and freeze_variance_after=AFTER; with a folder, a
    checkpoint saved at stop_at (then stop) or loaded from it (resume)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    model = sharded(mlp())
    optimizer = torch.optim.AdamW(model.parameters(), foreach=False, **ADAMW)
    sparse = fsdp.register(model, density, freeze_variance_after=AFTER, optimizer=optimizer,
                           max_grad_norm=clip)
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
        how = POISONED.get(step, (None, None))
        loss_of(model, step, rank, how[1] if how[0] == rank else False).backward()
        if step not in CALLER_SKIPS:
            optimizer.step()
    return fsdp.full_state(model), sparse


def check_adamw(rank: int, size: int) -> None:
    steps = 9
    for density, clip in ((0.1, None), (0.3, 0.05)):
        got, sparse = adamw_run(rank, steps, density, clip=clip)
        want, cut = adamw_replay(size, density, steps, clip)
        assert_same(got, want, (density, clip))
        assert (cut > 0) == (clip is not None), cut  # the clip binds where it is set
        assert sparse.preconditioned and sparse.remedy.skipped_steps == len(POISONED)
        assert {name: comm.skipped for name, comm in sparse.comms.items()} == {
            "0": 2, "2": 1, "4": 1}  # the sparse phase's NaN input, and unit 0's own


def check_resume(rank: int, size: int) -> None:
    steps, stop_at = 9, 6  # in the sparse phase: the residuals and s come back
    folder = [tempfile.mkdtemp(prefix="fsdp_ckpt_") if rank == 0 else None]
    dist.broadcast_object_list(folder)
    clip = 0.05  # binding: the last step's norms come back with the residuals
    whole = adamw_run(rank, steps, 0.2, clip=clip)[0]
    adamw_run(rank, steps, 0.2, folder[0], stop_at, clip=clip)
    assert_same(adamw_run(rank, steps, 0.2, folder[0], stop_at, True, clip=clip)[0], whole,
                "resumed")
    forgetful = adamw_run(rank, steps, 0.2, folder[0], stop_at, True, residuals=False,
                          clip=clip)[0]
    assert not all(torch.equal(forgetful[name], whole[name]) for name in whole)


def fsdp1_replay(size: int, density: float, steps: int, micro: int = 1
                 ) -> dict[str, torch.Tensor]:
    """SGD on FSDP1's layout: a unit's parameters flattened and concatenated into one flat
    vector, padded at its end to P equal shards."""
    model = mlp()
    residuals: dict[int, np.ndarray] = {}
    for step in range(steps):
        per_worker = worker_gradients(model, step, size, {}, micro)
        for parameters in units_of(model):
            flat = [torch.cat([g[id(p)].reshape(-1) for p in parameters]) for g in per_worker]
            n = -(-flat[0].numel() // size) * size
            flat = np.stack([torch.nn.functional.pad(f, (0, n - f.numel())).numpy()
                             for f in flat])
            held = residuals.get(id(parameters[0]), np.zeros_like(flat))
            found, residuals[id(parameters[0])] = reference(flat, held,
                                                            shard_budget(n // size, density))
            summed = torch.from_numpy(found.reshape(-1).copy()).div_(size)
            offset = 0
            for p in parameters:
                p.grad.copy_(summed[offset:offset + p.numel()].reshape(p.shape))
                offset += p.numel()
        with torch.no_grad():
            for p in model.parameters():
                p.add_(p.grad, alpha=-LR)
    return {name: p.detach().clone() for name, p in model.named_parameters()}


def check_fsdp1(rank: int, size: int) -> None:
    from torch.distributed.fsdp import FullyShardedDataParallel, ShardingStrategy

    steps, density = 5, 0.2
    want = fsdp1_replay(size, density, steps)
    for strategy in (ShardingStrategy.FULL_SHARD, ShardingStrategy.SHARD_GRAD_OP):
        model = FullyShardedDataParallel(
            mlp(), sharding_strategy=strategy, device_id=torch.device("cpu"),
            auto_wrap_policy=lambda module, recurse, nonwrapped_numel: (
                recurse or isinstance(module, nn.Linear)))
        sparse = fsdp.register(model, density)
        assert sorted(sparse.comms) == ["_fsdp_wrapped_module.0", "_fsdp_wrapped_module.2",
                                        "_fsdp_wrapped_module.4"], sorted(sparse.comms)
        optimizer = torch.optim.SGD(model.parameters(), lr=LR, foreach=False)
        for step in range(steps):
            optimizer.zero_grad()
            loss_of(model, step, rank).backward()
            optimizer.step()
        assert all(comm.steps == steps for comm in sparse.comms.values())
        with FullyShardedDataParallel.summon_full_params(model):
            got = {name.replace("_fsdp_wrapped_module.", ""): p.detach().clone()
                   for name, p in model.named_parameters()}
        assert_same(got, want, strategy)


def check_accumulate(rank: int, size: int) -> None:
    """Gradient accumulation: two micro-batches a step, the first without gradient sync (FSDP2's
    set_requires_gradient_sync(False), FSDP1's no_sync()); FSDP reduces the accumulated
    gradient once, as the replay does."""
    from torch.distributed.fsdp import FullyShardedDataParallel

    steps, density = 4, 0.2
    model = sharded(mlp())
    sparse = fsdp.register(model, density)
    optimizer = torch.optim.SGD(model.parameters(), lr=LR, foreach=False)
    for step in range(steps):
        optimizer.zero_grad()
        model.set_requires_gradient_sync(False)
        loss_of(model, 2 * step, rank).backward()
        model.set_requires_gradient_sync(True)
        loss_of(model, 2 * step + 1, rank).backward()
        optimizer.step()
    assert all(comm.steps == steps for comm in sparse.comms.values())
    assert_same(fsdp.full_state(model), replay(size, density, steps, micro=2), "FSDP2")

    model = FullyShardedDataParallel(
        mlp(), device_id=torch.device("cpu"),
        auto_wrap_policy=lambda module, recurse, nonwrapped_numel: (
            recurse or isinstance(module, nn.Linear)))
    sparse = fsdp.register(model, density)
    optimizer = torch.optim.SGD(model.parameters(), lr=LR, foreach=False)
    for step in range(steps):
        optimizer.zero_grad()
        with model.no_sync():
            loss_of(model, 2 * step, rank).backward()
        loss_of(model, 2 * step + 1, rank).backward()
        optimizer.step()
    assert all(comm.steps == steps for comm in sparse.comms.values())
    with FullyShardedDataParallel.summon_full_params(model):
        got = {name.replace("_fsdp_wrapped_module.", ""): p.detach().clone()
               for name, p in model.named_parameters()}
    assert_same(got, fsdp1_replay(size, density, steps, micro=2), "FSDP1")


def check_alone(rank: int, size: int) -> None:
    """One worker: FSDP reduces nothing, so register warns and changes nothing, the remedy
    included (AdamW trains as always, preconditioned stays False)."""
    import warnings

    model = sharded(mlp())
    optimizer = torch.optim.AdamW(model.parameters())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        sparse = fsdp.register(model, 0.01, freeze_variance_after=1, optimizer=optimizer)
    assert any("one worker" in str(w.message) for w in caught), [str(w.message) for w in caught]
    assert sparse.comms == {} and sparse.remedy is None
    for step in range(3):
        optimizer.zero_grad()
        loss_of(model, step, rank).backward()
        optimizer.step()
    assert not sparse.preconditioned
    assert all(int(state["step"]) == 3 for state in optimizer.state.values())


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
    raises(OptionError, "residual_dtype",
           lambda: fsdp.register(sharded(mlp()), 0.01, residual_dtype=torch.float16))
    raises(ValueError, "go together",
           lambda: fsdp.register(sharded(mlp()), 0.01, freeze_variance_after=3))
    raises(ValueError, "max_grad_norm", lambda: fsdp.register(sharded(mlp()), 0.01,
                                                              max_grad_norm=1.0))
    from torch.distributed.fsdp import MixedPrecisionPolicy

    raises(ValueError, "float16", lambda: fsdp.register(
        sharded(mlp(), MixedPrecisionPolicy(reduce_dtype=torch.float16)), 0.01))
    early = mlp()  # an optimizer built before fully_shard holds no shard
    stale = torch.optim.AdamW(early.parameters())
    raises(ValueError, "after fully_shard", lambda: fsdp.register(
        sharded(early), 0.01, freeze_variance_after=3, optimizer=stale))
    plain = sharded(mlp())
    raises(ValueError, "Adam", lambda: fsdp.register(
        plain, 0.01, freeze_variance_after=3,
        optimizer=torch.optim.SGD(plain.parameters(), lr=0.1)))

    from torch.distributed.fsdp import FullyShardedDataParallel, ShardingStrategy

    def fsdp1(strategy: ShardingStrategy) -> nn.Module:
        return FullyShardedDataParallel(mlp(), sharding_strategy=strategy,
                                        device_id=torch.device("cpu"))

    raises(ValueError, "NO_SHARD", lambda: fsdp.register(fsdp1(ShardingStrategy.NO_SHARD), 0.01))
    full = fsdp1(ShardingStrategy.FULL_SHARD)
    raises(ValueError, "FSDP2", lambda: fsdp.register(
        full, 0.01, freeze_variance_after=3,
        optimizer=torch.optim.AdamW(full.parameters())))
    fsdp.register(full, 0.01)
    raises(ValueError, "register a model once", lambda: fsdp.register(full, 0.01))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mode", choices=("comm", "fsdp", "adamw", "fsdp1", "accumulate",
                                            "resume", "alone", "errors"), required=True)
    mode = parser.parse_args().mode
    dist.init_process_group("gloo")
    rank, size = dist.get_rank(), dist.get_world_size()
    {"comm": check_comm, "fsdp": check_fsdp, "adamw": check_adamw, "fsdp1": check_fsdp1,
     "accumulate": check_accumulate, "resume": check_resume, "alone": check_alone,
     "errors": check_errors}[mode](
        rank, size)
    dist.barrier()
    print(f"FSDP {mode} ok rank={rank}", flush=True)
    end_process_group()


if __name__ == "__main__":
    main()
