"""What Horovod's test_torch.py does not reach of gtopk_hvd.torch's Horovod compatibility: the
documented limits (num_groups / groups raise NotImplementedError with a sparse compression), the
fixes made for Horovod's tests (Horovod's compression objects, the synchronize-then-step warning,
sparse embeddings, requires_grad changing between steps, broadcast_optimizer_state with state on
some ranks only), each checked for identical replicas. Run under mpirun beside the port
(tests/horovod/test_horovod_upstream.py), in the wrapper modes; every rank runs every test.
"""

from __future__ import annotations

import os
import warnings

import horovod.torch as hvd
import pytest
import torch

import gtopk_hvd.torch as gtopk

pytestmark = pytest.mark.skipif(os.environ.get("GTOPK_HVD_MODE") in (None, "horovod"),
                                reason="gtopk_hvd's own checks: wrapper modes only")

SPARSE = {"gtopk": gtopk.Compression.gtopk(density=1.0),
          "topk": gtopk.Compression.topk(density=1.0)}


@pytest.fixture(autouse=True)
def _horovod() -> None:
    hvd.init()


def _same_on_all_ranks(*tensors: torch.Tensor) -> None:
    flat = torch.cat([t.detach().reshape(-1).double() for t in tensors])
    # Named: Horovod's generated names count this process's unnamed ops, which the upstream
    # tests run before may leave different on each rank.
    gathered = hvd.allgather(flat.unsqueeze(0), name="gtopk_limits.same_on_all_ranks")
    assert all(torch.equal(gathered[0], row) for row in gathered), "replicas differ"


@pytest.mark.parametrize("name", sorted(SPARSE))
@pytest.mark.parametrize("option", [{"num_groups": 2}, {"groups": 1}, {"groups": "list"}])
def test_groups_raise_not_implemented(name, option):
    model = torch.nn.Linear(3, 2)
    if option.get("groups") == "list":
        option = {"groups": [[model.weight, model.bias]]}
    with pytest.raises(NotImplementedError, match="num_groups / groups"):
        gtopk.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   compression=SPARSE[name], **option)


@pytest.mark.parametrize("compression", ["none", "fp16"])
def test_horovod_compression_objects_are_accepted(compression):
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    optimizer = gtopk.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1), named_parameters=model.named_parameters(),
        compression=getattr(hvd.Compression, compression))
    assert not hasattr(optimizer, "_sparse")  # Horovod's own wrapper, with that compression
    assert optimizer._compression is getattr(hvd.Compression, compression)
    torch.manual_seed(hvd.rank())
    model(torch.randn(8, 4)).sum().backward()
    optimizer.step()
    _same_on_all_ranks(*model.parameters())


@pytest.mark.parametrize("name", sorted(SPARSE))
def test_step_after_synchronize_warns_and_keeps_the_update(name):
    results = []
    for skip in (True, False):
        torch.manual_seed(0)
        model = torch.nn.Linear(4, 3)
        optimizer = gtopk.DistributedOptimizer(
            torch.optim.SGD(model.parameters(), lr=0.1),
            named_parameters=model.named_parameters(), compression=SPARSE[name])
        torch.manual_seed(hvd.rank())
        model(torch.randn(8, 4)).sum().backward()
        optimizer.synchronize()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.1)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            if skip:
                with optimizer.skip_synchronize():
                    optimizer.step()
            else:
                optimizer.step()
        messages = [str(w.message) for w in caught if issubclass(w.category, UserWarning)
                    and "skip_synchronize()" in str(w.message)]
        assert len(messages) == (0 if skip else 1), messages
        results.append(torch.cat([p.detach().reshape(-1) for p in model.parameters()]))
    assert torch.equal(results[0], results[1]), "step() synchronized again"
    _same_on_all_ranks(results[1])


@pytest.mark.parametrize("name", sorted(SPARSE))
@pytest.mark.parametrize("optimizer_class", [torch.optim.SparseAdam, torch.optim.SGD])
def test_sparse_embedding_gradients(name, optimizer_class):
    torch.manual_seed(0)
    embedding = torch.nn.Embedding(10, 3, sparse=True)
    dense = torch.nn.Linear(3, 1)
    parameters = list(embedding.parameters())
    if optimizer_class is torch.optim.SGD:
        parameters += list(dense.parameters())
    optimizer = gtopk.DistributedOptimizer(optimizer_class(parameters, lr=0.1),
                                           compression=SPARSE[name])
    for step in range(3):
        rows = torch.tensor([[1, 2, 4], [4, 3, 9]]) if hvd.rank() == 0 else torch.tensor(
            [[1, 3, 7], [step, 7, 9]])
        optimizer.zero_grad()
        dense(embedding(rows)).sum().backward()
        optimizer.step()
        assert embedding.weight.grad.is_sparse, "the wrapped optimizer got a dense gradient"
    _same_on_all_ranks(embedding.weight, *dense.parameters())


@pytest.mark.parametrize("name", sorted(SPARSE))
def test_requires_grad_changing_between_steps(name):
    torch.manual_seed(0)
    first, second = torch.nn.Linear(4, 4), torch.nn.Linear(4, 1)
    model = torch.nn.Sequential(first, second)
    optimizer = gtopk.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
        named_parameters=model.named_parameters(), compression=SPARSE[name])
    for step in range(4):
        frozen = step % 2 == 1
        for p in first.parameters():
            p.requires_grad_(not frozen)
        optimizer.zero_grad()
        torch.manual_seed(10 * hvd.rank() + step)
        model(torch.randn(8, 4)).sum().backward()
        optimizer.step()
        _same_on_all_ranks(*model.parameters())
    for p in first.parameters():
        p.requires_grad_(True)

    late = torch.nn.Linear(4, 1)
    late.weight.requires_grad_(False)
    optimizer = gtopk.DistributedOptimizer(
        torch.optim.SGD(late.parameters(), lr=0.1), named_parameters=late.named_parameters(),
        compression=SPARSE[name])
    late.weight.requires_grad_(True)
    late(torch.randn(8, 4)).sum().backward()
    with pytest.raises(NotImplementedError, match=r"\['weight'\] did not require grad"):
        optimizer.step()


@pytest.mark.parametrize("name", sorted(SPARSE))
def test_broadcast_optimizer_state_with_state_on_rank_0_only(name):
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    optimizer = gtopk.DistributedOptimizer(
        torch.optim.Adam(model.parameters(), lr=0.1), named_parameters=model.named_parameters(),
        compression=SPARSE[name])
    if hvd.rank() == 0:  # as after loading a checkpoint on rank 0 only
        optimizer.state[model.weight]["step"] = torch.tensor(5.0)
        optimizer.state[model.weight]["exp_avg"] = torch.ones_like(model.weight)
        optimizer.state[model.weight]["exp_avg_sq"] = torch.ones_like(model.weight)
        optimizer.state[model.bias]["step"] = torch.tensor(5.0)
        optimizer.state[model.bias]["exp_avg"] = torch.ones_like(model.bias)
        optimizer.state[model.bias]["exp_avg_sq"] = torch.ones_like(model.bias)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)  # hung before: a step on rank 1 only
    assert float(optimizer.state[model.weight]["step"]) == 5.0
    for step in range(2):
        optimizer.zero_grad()
        torch.manual_seed(hvd.rank() + 10 * step)
        model(torch.randn(8, 4)).sum().backward()
        optimizer.step()
    _same_on_all_ranks(*model.parameters(), optimizer.state[model.weight]["exp_avg"])
