"""Adam with its second moment frozen after a dense start (`freeze_variance_after`,
gtopk_hvd.torch.frozen_variance) and the core's dense step it starts with
(`SparseStep.update(dense=True)`).

- The torch DistributedOptimizer (Horovod of size 1, the state on the host and device-like)
  against an independent numpy replay: AdamW's dense steps, then the frozen scale, Top-k with
  error feedback on the preconditioned gradient, the first moment and the decoupled decay, two
  parameter groups (one decayed); exp_avg_sq does not move after the freeze; a NaN step is
  skipped without a change; a checkpoint resumes bit for bit, taken in either phase and
  loaded into a new optimizer or one that froze since.
- `update(dense=True)` over the "local" transport at P = 3: the mean of the gradients on every
  worker alike, the sparse state untouched, a ring all-reduce's bytes, the non-finite rule, and a
  joined worker taking part in the others' dense steps.
- The same replay with the momentum correction at beta1 (the first moment in the exchange),
  with DGC's masking of the velocity and without it.
- Bad input refused with the reason: SGD, Adam's coupled L2, amsgrad, N < 1, a momentum
  correction whose momentum is not beta1, a dense compression.
The mpirun job with it is tests/tools/test_simulate.py's transformer test (bitwise the simulation).
"""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest
from helpers.device_like import optimizer_state_on  # noqa: F401 - a fixture

from gtopk_hvd.compression import Compression
from gtopk_hvd.core import SparseStep
from gtopk_hvd.transports import resolve_transport
from gtopk_hvd.transports.local import LocalGroup

torch = pytest.importorskip("torch")
hvd = pytest.importorskip("horovod.torch")

import gtopk_hvd.torch as gtopk  # noqa: E402

LR, BETAS, EPS, DECAY, DENSITY, AFTER = 0.05, (0.9, 0.95), 1e-8, 0.1, 0.3, 3


def model_and_optimizer() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Linear(5, 2))
    matrices = [p for p in model.parameters() if p.dim() == 2]
    biases = [p for p in model.parameters() if p.dim() == 1]
    return model, torch.optim.AdamW([{"params": matrices, "weight_decay": DECAY},
                                     {"params": biases, "weight_decay": 0.0}],
                                    lr=LR, betas=BETAS, eps=EPS)


def distributed(optimizer: torch.optim.Optimizer, model: torch.nn.Module,
                after: int = AFTER, momentum: bool = False,
                masking: bool = True) -> torch.optim.Optimizer:
    """momentum: the compression's momentum correction at Adam's beta1 (the first moment in
    the exchange), its velocity cleared where sent unless masking is False."""
    hvd.init()
    compression = gtopk.Compression.topk(DENSITY, momentum_correction=momentum,
                                         momentum=BETAS[0],
                                         momentum_masking=masking or not momentum)
    return gtopk.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                      compression=compression, freeze_variance_after=after)


def gradients(step: int, sizes: list[int]) -> list[np.ndarray]:
    generator = np.random.default_rng(100 + step)
    return [generator.standard_normal(n).astype(np.float32) for n in sizes]


def one_step(optimizer: torch.optim.Optimizer, parameters: list, grads: list[np.ndarray]) -> None:
    optimizer.zero_grad()
    for p, g in zip(parameters, grads):
        p.grad.copy_(torch.from_numpy(g).view(p.shape))
    optimizer.step()


def numpy_replay(weights: list[np.ndarray], decays: list[float], steps: int,
                 momentum: bool = False, masking: bool = True) -> list[np.ndarray]:
    """AdamW for AFTER steps, then its frozen-variance rule with Top-k and error feedback at
    P = 1 (docstring of gtopk_hvd.torch.frozen_variance), in float64 over the flat vector;
    momentum: the first moment in the exchange (a velocity seeded from m_hat, zeroed where
    sent if masking)."""
    w = np.concatenate(weights).astype(np.float64)
    decay = np.concatenate([np.full(x.size, d) for x, d in zip(weights, decays)])
    m, v, residual = np.zeros_like(w), np.zeros_like(w), np.zeros_like(w)
    velocity = np.zeros_like(w)
    k = math.ceil(DENSITY * w.size)
    (b1, b2), scale = BETAS, None
    for t in range(steps):
        g = np.concatenate(gradients(t, [x.size for x in weights])).astype(np.float64)
        w *= 1 - LR * decay
        if t < AFTER:
            m = b1 * m + (1 - b1) * g
            v = b2 * v + (1 - b2) * g * g
            w -= LR / (1 - b1 ** (t + 1)) * m / (np.sqrt(v / (1 - b2 ** (t + 1))) + EPS)
            continue
        if scale is None:
            scale = 1 / (np.sqrt(v / (1 - b2 ** AFTER)) + EPS)
            velocity = m / (1 - b1 ** AFTER) * scale / (1 - b1)  # u_0 = m_hat s / (1 - b1)
        if momentum:
            velocity = b1 * velocity + g * scale
        accumulated = residual + (velocity if momentum else g * scale)
        chosen = np.argsort(-np.abs(accumulated), kind="stable")[:k]
        u = np.zeros_like(w)
        u[chosen] = accumulated[chosen]
        residual = accumulated - u
        if momentum:
            if masking:
                velocity[chosen] = 0.0
            w -= LR * (1 - b1) * u
            continue
        m = b1 * m + (1 - b1) * u
        w -= LR / (1 - b1 ** (t + 1)) * m
    bounds = np.cumsum([0] + [x.size for x in weights])
    return [w[a:b] for a, b in zip(bounds[:-1], bounds[1:])]


@pytest.mark.usefixtures("optimizer_state_on")
@pytest.mark.parametrize("momentum,masking", [(False, True), (True, True), (True, False)],
                         ids=["first-moment-after", "momentum-in", "momentum-in-unmasked"])
def test_the_optimizer_follows_adamw_then_its_frozen_variance_rule(momentum: bool,
                                                                   masking: bool) -> None:
    model, adamw = model_and_optimizer()
    order = [p for group in adamw.param_groups for p in group["params"]]  # the fused order
    start = [p.detach().numpy().reshape(-1).copy() for p in order]
    decays = [group["weight_decay"] for group in adamw.param_groups for _ in group["params"]]
    optimizer = distributed(adamw, model, momentum=momentum, masking=masking)
    sizes = [p.numel() for p in order]
    frozen_v = None
    for t in range(7):
        one_step(optimizer, order, gradients(t, sizes))
        if t == AFTER - 1:
            frozen_v = [optimizer.state[p]["exp_avg_sq"].clone() for p in order]
    for p, v in zip(order, frozen_v):  # never updated after the freeze
        assert torch.equal(optimizer.state[p]["exp_avg_sq"], v)
        assert int(optimizer.state[p]["step"]) == 7
    for p, expected in zip(order, numpy_replay(start, decays, 7, momentum, masking)):
        np.testing.assert_allclose(p.detach().numpy().reshape(-1), expected, rtol=2e-5,
                                   atol=2e-6)


@pytest.mark.usefixtures("optimizer_state_on")
@pytest.mark.parametrize("at", [1, AFTER + 1], ids=["dense-start", "frozen"])
def test_a_nonfinite_step_changes_nothing_in_either_phase(at: int) -> None:
    model, adamw = model_and_optimizer()
    order = [p for group in adamw.param_groups for p in group["params"]]
    optimizer = distributed(adamw, model)
    sizes = [p.numel() for p in order]
    for t in range(at):
        one_step(optimizer, order, gradients(t, sizes))
    weights = [p.detach().clone() for p in order]
    state = copy.deepcopy(optimizer.state_dict())
    bad = gradients(at, sizes)
    bad[0][2] = np.nan
    one_step(optimizer, order, bad)
    assert optimizer.last_stats.skipped
    assert all(torch.equal(p, w) for p, w in zip(order, weights))
    after = optimizer.state_dict()
    for key, value in state["state"].items():
        for name, tensor in value.items():
            assert torch.equal(after["state"][key][name], tensor), name
    one_step(optimizer, order, gradients(at + 1, sizes))
    assert not optimizer.last_stats.skipped
    assert not all(torch.equal(p, w) for p, w in zip(order, weights))


@pytest.mark.usefixtures("optimizer_state_on")
def test_a_skipped_first_sparse_step_seeds_the_velocity_once() -> None:
    """The momentum in the exchange: a NaN at the first sparse step, then the same gradients
    as a twin that never saw it: bit for bit the twin (the first moment is handed over once)."""
    runs = []
    for bad_step in (True, False):
        model, adamw = model_and_optimizer()
        order = [p for group in adamw.param_groups for p in group["params"]]
        optimizer = distributed(adamw, model, momentum=True)
        sizes = [p.numel() for p in order]
        for t in range(AFTER):
            one_step(optimizer, order, gradients(t, sizes))
        if bad_step:
            bad = gradients(99, sizes)
            bad[1][0] = np.inf
            one_step(optimizer, order, bad)
            assert optimizer.last_stats.skipped
        for t in range(AFTER, AFTER + 3):
            one_step(optimizer, order, gradients(t, sizes))
        runs.append([p.detach().clone() for p in order])
    assert all(torch.equal(p, q) for p, q in zip(*runs))


def resumed_from(saved_model: dict, saved: dict, momentum: bool = False
                 ) -> tuple[torch.optim.Optimizer, list]:
    """A new model and optimizer from a checkpoint (copies: torch keeps the tensors it loads)."""
    model, adamw = model_and_optimizer()
    model.load_state_dict(copy.deepcopy(saved_model))
    optimizer = distributed(adamw, model, momentum=momentum)
    optimizer.load_state_dict(copy.deepcopy(saved))
    return optimizer, [p for group in adamw.param_groups for p in group["params"]]


@pytest.mark.parametrize("momentum", [False, True], ids=["first-moment-after", "momentum-in"])
def test_a_checkpoint_resumes_bit_for_bit_in_either_phase(momentum: bool) -> None:
    model, adamw = model_and_optimizer()
    order = [p for group in adamw.param_groups for p in group["params"]]
    optimizer = distributed(adamw, model, momentum=momentum)
    sizes = [p.numel() for p in order]
    saved = {}
    for t in range(8):
        if t in (2, 5):  # in the dense start; after the freeze
            saved[t] = copy.deepcopy(model.state_dict()), copy.deepcopy(optimizer.state_dict())
        one_step(optimizer, order, gradients(t, sizes))
    resumed, order2 = resumed_from(*saved[5], momentum)
    for t in range(5, 8):
        one_step(resumed, order2, gradients(t, sizes))
    assert all(torch.equal(p, q) for p, q in zip(order, order2))

    # The dense start's checkpoint loaded into the optimizer that froze since, other gradients
    # after it: the same as a new optimizer from that checkpoint (the scale made again).
    fresh, order3 = resumed_from(*saved[2], momentum)
    model.load_state_dict(copy.deepcopy(saved[2][0]))
    optimizer.load_state_dict(copy.deepcopy(saved[2][1]))
    for t in range(2, 8):
        one_step(optimizer, order, gradients(50 + t, sizes))
        one_step(fresh, order3, gradients(50 + t, sizes))
    assert all(torch.equal(p, q) for p, q in zip(order, order3))


def run_dense_local(steps: list[list[str]], d: int = 50) -> list[list]:
    """Worker r runs steps[r] ("dense", "sparse", "nan" (dense, one NaN), "join") on a fresh
    SparseStep over the local transport; returns per worker what each call gave."""
    group = LocalGroup(len(steps), timeout_s=60)

    def work(rank: int) -> list:
        sparse = SparseStep(Compression.topk(0.1), [d], resolve_transport("local"))
        out, seen = np.zeros(d, np.float32), []
        for t, kind in enumerate(steps[rank]):
            if kind == "join":
                seen.append(("join", sparse.join(), sparse.step_count))
                continue
            gradient = np.random.default_rng(10 * t + rank).standard_normal(d).astype(np.float32)
            if kind == "nan":
                gradient[3] = np.inf
            residual = sparse.residual.copy()
            if kind == "sparse":
                sparse.update(gradient, out)
            else:
                sparse.update(gradient, out, clear_gradient=True, dense=True)
                assert not gradient.any()
                assert np.array_equal(residual, sparse.residual)
            seen.append((kind, out.copy(), sparse.step_count, sparse.last_stats))
        return seen

    try:
        return group.run(work)
    finally:
        group.close()


def test_dense_update_averages_and_keeps_the_sparse_state() -> None:
    d = 50
    results = run_dense_local([["sparse", "dense", "nan", "dense"]] * 3, d)
    for t in (1, 3):  # the dense steps
        mean = sum(np.random.default_rng(10 * t + r).standard_normal(d).astype(np.float64)
                   for r in range(3)) / 3
        outs = [worker[t][1] for worker in results]
        assert all(np.array_equal(out, outs[0]) for out in outs)
        np.testing.assert_allclose(outs[0], mean, rtol=1e-5, atol=1e-6)
        stats = results[0][t][3]
        assert stats.bytes_sent == 2 * 2 * 4 * d // 3 and stats.density == 1.0
    for worker in results:
        assert np.isnan(worker[2][1]).all() and worker[2][3].skipped  # every worker skips
        assert [entry[2] for entry in worker] == [1, 2, 2, 3]


def test_a_joined_worker_takes_part_in_the_dense_steps() -> None:
    d = 50
    results = run_dense_local([["dense", "dense", "sparse", "join"],
                               ["dense", "dense", "sparse", "join"],
                               ["dense", "join"]], d)
    second = sum(np.random.default_rng(10 + r).standard_normal(d).astype(np.float64)
                 for r in range(2)) / 3  # worker 2 contributes zeros, the average divides by 3
    np.testing.assert_allclose(results[0][1][1], second, rtol=1e-5, atol=1e-6)
    assert results[2][1][0] == "join" and results[2][1][1] == 1
    assert all(worker[-1][1] == 1 for worker in results)  # workers 0 and 1 joined later...
    assert all(worker[-1][2] == 3 for worker in results)  # ...and the step counts agree


@pytest.mark.parametrize("make,message", [
    (lambda ps: torch.optim.SGD(ps, lr=0.1), "Adam or AdamW"),
    (lambda ps: torch.optim.Adam(ps, weight_decay=0.01), "coupled|L2"),
    (lambda ps: torch.optim.AdamW(ps, amsgrad=True), "amsgrad"),
])
def test_optimizers_the_rule_does_not_cover_are_refused(make: object, message: str) -> None:
    model = torch.nn.Linear(3, 2)
    with pytest.raises(ValueError, match=message):
        distributed(make(model.parameters()), model)


def test_bad_settings_are_refused() -> None:
    model = torch.nn.Linear(3, 2)
    hvd.init()
    with pytest.raises(ValueError, match="integer >= 1"):
        distributed(torch.optim.AdamW(model.parameters()), model, after=0)
    with pytest.raises(ValueError, match=r"momentum \(0.8\) must be Adam's beta1 \(0.9\)"):
        gtopk.DistributedOptimizer(
            torch.optim.AdamW(model.parameters()), named_parameters=model.named_parameters(),
            compression=gtopk.Compression.gtopk(0.1, momentum_correction=True, momentum=0.8),
            freeze_variance_after=2)
    with pytest.raises(ValueError, match="sparse compressions"):
        gtopk.DistributedOptimizer(torch.optim.AdamW(model.parameters()),
                                   named_parameters=model.named_parameters(),
                                   compression=gtopk.Compression.none, freeze_variance_after=2)
