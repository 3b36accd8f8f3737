"""torch.distributed transport and the DDP communication hook (gtopk_hvd.torch.ddp).

The tests marked mpi launch workers with torchrun (Gloo on localhost, OMP_NUM_THREADS=1, a hard
time limit): tests/mpi/torchrun_transport.py and tests/mpi/torchrun_ddp_hook.py check
everything on every rank against numpy replays, and the DDP digits example must learn. The
others run in this process on a one-worker Gloo group: the hook's step against numpy on
hand-made buckets, its warm-up, dtypes, errors and checkpoints, a restore into a new DDP model,
and the transport's own operations.
"""

from __future__ import annotations

import io
import pickle
import re
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import torch
import torch.distributed as dist
from helpers import margins
from helpers.device_like import device_like, device_like_cpu
from helpers.mpi_launcher import MPI_PROGRAMS, REPO_ROOT, run_with_time_limit, torchrun_command
from helpers.reference import topk_reference

from gtopk_hvd.compression import Compression
from gtopk_hvd.torch.ddp import GTopkHookState, gtopk_hook
from gtopk_hvd.transports import TRANSPORTS, Transport, check_matches_horovod
from gtopk_hvd.transports.torch_distributed import TorchDistributedTransport, default_transport


def torchrun(workers: int, program: str, *args: str, timeout_s: float = 300) -> tuple[int, str]:
    command = torchrun_command(workers, [program, *args])
    return run_with_time_limit(command, timeout_s, f"{program} on {workers} workers")


def run_ok(workers: int, program: str, *args: str, timeout_s: float = 300) -> str:
    returncode, output = torchrun(workers, program, *args, timeout_s=timeout_s)
    assert returncode == 0, f"exit status {returncode}. Output:\n{output[-6000:]}"
    return output


# -- under torchrun -------------------------------------------------------------------------

@pytest.mark.mpi
@pytest.mark.parametrize("workers", [4, 3])
def test_torch_distributed_transport_operations(workers: int) -> None:
    output = run_ok(workers, str(MPI_PROGRAMS / "torchrun_transport.py"))
    assert f"torch.distributed transport ok on {workers} workers" in output


@pytest.mark.mpi
def test_abort_ends_every_worker_under_torchrun() -> None:
    returncode, output = torchrun(3, str(MPI_PROGRAMS / "torchrun_transport.py"), "--abort",
                                  timeout_s=600)
    assert returncode != 0, output[-3000:]
    assert "gtopk_hvd [rank 2]: test abort from the last rank" in output
    assert "was not ended" not in output


@pytest.mark.mpi
@pytest.mark.parametrize("workers", [4, 3])
def test_ddp_hook_matches_replay_and_restores_exactly(workers: int) -> None:
    output = run_ok(workers, str(MPI_PROGRAMS / "torchrun_ddp_hook.py"))
    assert f"ddp hook ok on {workers} workers" in output


def ddp_digits(compression: str) -> dict[str, str]:
    """examples/ddp_digits.py on 4 workers (its default 30 epochs): the RESULT fields, after
    checking that every replica printed the same checksum."""
    output = run_ok(4, str(REPO_ROOT / "examples" / "ddp_digits.py"), "--compression",
                    compression, "--density", "0.01", "--quiet", timeout_s=600)
    result = re.search(r"RESULT (.*)", output)
    assert result, output[-3000:]
    fields = dict(item.split("=", 1) for item in result.group(1).split())
    checksums = re.findall(r"CHECKSUM rank=(\d+) ([0-9a-f]{64})", output)
    assert sorted(int(rank) for rank, _ in checksums) == [0, 1, 2, 3]
    assert len({digest for _, digest in checksums}) == 1, checksums
    return fields


@pytest.mark.mpi
def test_ddp_digits_with_gtopk_stays_close_to_ddps_allreduce() -> None:
    """gTop-k at density 0.01 against DDP's own all-reduce, same seed: the accuracy and the gap
    to dense each above the floor measured over seeds and instruction sets (helpers/margins.py;
    the gap was -1.7 to -0.3 points there, one test image being 0.28)."""
    sparse, dense = ddp_digits("gtopk"), ddp_digits("none")
    assert sparse["workers"] == "4" and sparse["compression"] == "gtopk"
    assert float(sparse["test_accuracy"]) >= margins.floor("ddp_digits_gtopk"), sparse
    gap = float(sparse["test_accuracy"]) - float(dense["test_accuracy"])
    assert gap >= margins.floor("ddp_digits_gtopk - ddp_digits_dense"), (sparse, dense)
    k = -(-int(sparse["params"]) // 100)  # one bucket: log2(4) rounds of k entries, 8 bytes each
    assert int(sparse["bytes_per_step"]) == 2 * 8 * k, sparse


# -- in this process: a one-worker Gloo group ----------------------------------------------

@pytest.fixture(scope="module")
def one_worker(tmp_path_factory: pytest.TempPathFactory) -> None:
    created = not dist.is_initialized()
    if created:
        store = dist.FileStore(str(tmp_path_factory.mktemp("ddp") / "store"), 1)
        dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    yield
    if created:
        dist.destroy_process_group()


@pytest.fixture(params=["host", "device-like"])
def buffers(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """How a test makes its bucket buffers. host: CPU buffers, the step on numpy; device-like:
    the path of a GPU bucket (the state in torch tensors), on CPU tensors that refuse numpy
    conversions (tests/helpers/device_like.py)."""
    if request.param == "host":
        yield lambda tensor: tensor
        return
    from gtopk_hvd.torch import ddp

    monkeypatch.setattr(ddp, "_step_device", lambda device: device)
    with device_like_cpu():
        yield device_like


def host(array: Any) -> np.ndarray:
    """A step's residual as a numpy copy, from either state."""
    return array.cpu().numpy() if isinstance(array, torch.Tensor) else array.copy()


class Bucket:
    """What gtopk_hook reads of a dist.GradBucket."""

    def __init__(self, index: int, parameters: list[torch.Tensor], gradient: torch.Tensor,
                 last: bool = True) -> None:
        self._index, self._parameters, self._buffer, self._last = (index, parameters,
                                                                   gradient, last)

    def index(self) -> int:
        return self._index

    def buffer(self) -> torch.Tensor:
        return self._buffer

    def parameters(self) -> list[torch.Tensor]:
        return self._parameters

    def is_last(self) -> bool:
        return self._last


def test_state_arguments_are_checked() -> None:
    for start_iter in (1, 0, True, 2.5):
        with pytest.raises(ValueError, match="start_iter"):
            GTopkHookState(start_iter=start_iter)
    with pytest.raises(ValueError, match="not both"):
        GTopkHookState(density=0.1, compression=Compression.gtopk(0.1))
    with pytest.raises(TypeError, match="sparse"):
        GTopkHookState(compression=Compression.none)
    with pytest.raises(ValueError, match="density"):
        GTopkHookState(density=0.0)
    with pytest.raises(ValueError, match="allgather"):
        GTopkHookState(density=0.1, reduction="nonsense")
    state = GTopkHookState(density=0.05, reduction="allgather", momentum_correction=True,
                           selection="bucket")
    assert state.compression == Compression.topk(0.05, momentum_correction=True,
                                                 granularity="bucket")
    assert GTopkHookState().compression == Compression.gtopk(0.01)
    assert GTopkHookState().start_iter == 2


def run_hook(state: GTopkHookState, buckets: list[Bucket]) -> list[torch.Tensor]:
    """As DDP does: the hook on every bucket, then waits for their futures."""
    futures = [gtopk_hook(state, bucket) for bucket in buckets]
    return [future.wait() for future in futures]


def reference_step(residual: np.ndarray, gradient: np.ndarray, k: int) -> np.ndarray:
    """One worker: the update is the top-k of residual + gradient; the residual the rest."""
    acc = residual + gradient
    chosen = topk_reference(acc, k)
    update = np.zeros_like(acc)
    update[chosen] = acc[chosen]
    residual[:] = acc
    residual[chosen] = 0.0
    return update


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_hook_warms_up_then_steps_like_numpy(one_worker: None, dtype: torch.dtype,
                                             buffers: Any) -> None:
    parameters = [torch.zeros(30, 2, dtype=dtype), torch.zeros(40, dtype=dtype)]
    d, k = 100, 5
    state = GTopkHookState(density=0.05, start_iter=3)
    residual = np.zeros(d, np.float32)
    generator = torch.Generator().manual_seed(0)
    for step in range(7):
        gradient = torch.randn(d, generator=generator).to(dtype)
        expected = gradient.clone()  # one worker: the plain all-reduce average is itself
        if step >= state.start_iter:
            update = reference_step(residual, gradient.to(torch.float32).numpy(), k)
            expected = torch.from_numpy(update).to(dtype)
        buffer = buffers(gradient.clone())
        (got,) = run_hook(state, [Bucket(0, parameters, buffer)])
        assert got.dtype == dtype and got.data_ptr() == buffer.data_ptr()
        assert torch.equal(got, expected), f"step {step}"
        assert state.iter == step + 1
        assert bool(state.last_stats) == (step >= state.start_iter)
    np.testing.assert_array_equal(host(state.buckets[0].step.residual), residual)
    assert state.last_stats[0].k == k and state.last_stats[0].step == 6


def test_iterations_count_on_the_last_bucket(one_worker: None) -> None:
    state = GTopkHookState(density=0.5)
    parameters = [[torch.zeros(4)], [torch.zeros(6)]]
    for step in range(4):
        buckets = [Bucket(i, parameters[i], torch.ones(n), last=i == 1)
                   for i, n in enumerate((4, 6))]
        run_hook(state, buckets)
        assert state.iter == step + 1
    assert sorted(state.last_stats) == [0, 1]
    assert [state.last_stats[i].k for i in (0, 1)] == [2, 3]


@pytest.mark.parametrize("rule", ["propagate", "raise"])
def test_an_inf_in_the_last_bucket_skips_or_raises(one_worker: None, rule: str,
                                                   buffers: Any) -> None:
    """propagate: every bucket of the iteration comes back all NaN and no residual or count
    moves (the hook decides at the last bucket for all); raise: FloatingPointError."""
    state = GTopkHookState(density=0.5, start_iter=2, nonfinite=rule)
    parameters = [[torch.zeros(4)], [torch.zeros(6)]]

    def buckets(step: int, bad: bool = False) -> list[Bucket]:
        values = [torch.arange(n, dtype=torch.float32) + step for n in (4, 6)]
        if bad:
            values[1][2] = float("inf")
        return [Bucket(i, parameters[i], buffers(v), last=i == 1) for i, v in enumerate(values)]

    for step in range(4):
        run_hook(state, buckets(step))
    residuals = {i: host(b.step.residual) for i, b in state.buckets.items()}
    steps = {i: b.step.step_count for i, b in state.buckets.items()}
    if rule == "raise":
        with pytest.raises(FloatingPointError, match="non-finite"):
            run_hook(state, buckets(4, bad=True))
        return
    got = run_hook(state, buckets(4, bad=True))
    assert all(torch.isnan(g).all() for g in got)
    assert state.iter == 4 and state.last_iteration_skipped
    for i, bucket in state.buckets.items():
        sparse = bucket.step
        assert host(sparse.residual).tobytes() == residuals[i].tobytes()
        assert sparse.step_count == steps[i] and sparse.last_stats.skipped
    got = run_hook(state, buckets(5))
    assert all(torch.isfinite(g).all() for g in got) and state.iter == 5
    assert not state.last_iteration_skipped


def test_when_the_hook_raises_every_held_future_fails(one_worker: None,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """nonfinite="propagate" holds the buckets until the last: a step that raises there, or a
    bucket refused midway, fails every held future with the error (none is left for DDP to
    wait on) and holds nothing; the next iteration then runs normally."""
    from gtopk_hvd.torch import ddp

    state = GTopkHookState(density=0.5, start_iter=2)
    parameters = [[torch.zeros(4)], [torch.zeros(6)], [torch.zeros(5)]]

    def buckets(step: int) -> list[Bucket]:
        return [Bucket(i, parameters[i], torch.arange(n, dtype=torch.float32) + step,
                       last=i == 2) for i, n in enumerate((4, 6, 5))]

    def hook_all(iteration: list[Bucket]) -> tuple[list[torch.futures.Future], Exception]:
        futures = []
        for bucket in iteration:
            try:
                futures.append(gtopk_hook(state, bucket))
            except Exception as error:  # noqa: BLE001 - the test inspects it
                return futures, error
        raise AssertionError("the hook did not raise")

    for step in range(3):
        run_hook(state, buckets(step))
    step_in_place = ddp._step_in_place

    def failing_step(*args: object, **kwargs: object) -> None:
        raise TypeError("a step that fails")

    monkeypatch.setattr(ddp, "_step_in_place", failing_step)
    futures, error = hook_all(buckets(3))
    assert isinstance(error, TypeError) and len(futures) == 2
    for future in futures:
        assert future.done()
        with pytest.raises(TypeError, match="a step that fails"):
            future.wait()
    assert state.book.pending == []
    monkeypatch.setattr(ddp, "_step_in_place", step_in_place)

    changed = buckets(4)
    changed[1] = Bucket(1, [torch.zeros(3), torch.zeros(3)], torch.ones(6), last=False)
    futures, error = hook_all(changed)
    assert "bucket 1 changed" in str(error) and len(futures) == 1
    with pytest.raises(RuntimeError, match="bucket 1 changed"):
        futures[0].wait()
    assert state.book.pending == []
    got = run_hook(state, buckets(5))
    assert all(torch.isfinite(g).all() for g in got)


def test_a_bucket_that_changes_is_refused(one_worker: None) -> None:
    state = GTopkHookState(density=0.5, start_iter=2)
    for _ in range(3):
        run_hook(state, [Bucket(0, [torch.zeros(3), torch.zeros(5)], torch.ones(8))])
    with pytest.raises(RuntimeError, match="bucket 0 changed"):
        run_hook(state, [Bucket(0, [torch.zeros(5), torch.zeros(3)], torch.ones(8))])


@pytest.mark.parametrize("route", ["pickle", "state_dict"])
def test_a_saved_state_continues_identically(one_worker: None, route: str) -> None:
    compression = Compression.gtopk(0.1, momentum_correction=True,
                                    warmup_densities=(0.5, 0.25), warmup_steps=2)
    parameters = [[torch.zeros(20)], [torch.zeros(7, 3)]]
    state = GTopkHookState(compression=compression)
    generator = torch.Generator().manual_seed(1)

    def buckets() -> list[Bucket]:
        return [Bucket(i, parameters[i], torch.randn(n, generator=generator), last=i == 1)
                for i, n in enumerate((20, 21))]

    for _ in range(5):
        run_hook(state, buckets())
    if route == "pickle":
        restored = pickle.loads(pickle.dumps(state))
    else:
        saved = io.BytesIO()
        torch.save(state.state_dict(), saved)
        saved.seek(0)
        restored = GTopkHookState(compression=compression)
        restored.load_state_dict(torch.load(saved, weights_only=True))
    assert restored.iter == 5 and restored.process_group is None
    for _ in range(4):
        same = buckets()
        copies = [Bucket(b.index(), b.parameters(), b.buffer().clone(), b.is_last())
                  for b in same]
        for ours, theirs in zip(run_hook(state, same), run_hook(restored, copies)):
            assert torch.equal(ours, theirs)
    for index in (0, 1):
        ours, theirs = state.buckets[index].step, restored.buckets[index].step
        assert ours.step_count == theirs.step_count == 9
        np.testing.assert_array_equal(ours.residual, theirs.residual)
        np.testing.assert_array_equal(ours.velocity, theirs.velocity)


class Mixed(torch.nn.Module):
    """float32 and float64 layers: DDP makes one bucket per dtype, then rebuilds them."""

    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Linear(6, 40)
        self.b = torch.nn.Linear(40, 20, dtype=torch.float64)
        self.c = torch.nn.Linear(20, 30)
        self.d = torch.nn.Linear(30, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.b(torch.tanh(self.a(x)).double())).float()
        return self.d(torch.tanh(self.c(h)))


@pytest.mark.parametrize("saved_at", [1, 2, 4])  # in the warm-up, at its end, after it
def test_restore_into_a_new_ddp_model_continues_exactly(one_worker: None,
                                                        saved_at: int) -> None:
    from torch.nn.parallel import DistributedDataParallel as DDP

    def train(model: torch.nn.Module, optimizer: torch.optim.Optimizer, steps: range) -> None:
        for step in steps:
            generator = torch.Generator().manual_seed(step)
            x, y = torch.randn(8, 6, generator=generator), torch.randint(0, 3, (8,),
                                                                         generator=generator)
            optimizer.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            optimizer.step()

    torch.manual_seed(0)
    model = DDP(Mixed(), bucket_cap_mb=0.001)
    state = GTopkHookState(density=0.05, momentum_correction=True)
    model.register_comm_hook(state, gtopk_hook)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.2)
    train(model, optimizer, range(saved_at))
    saved = io.BytesIO()
    torch.save({"model": model.module.state_dict(), "hook": state}, saved)
    train(model, optimizer, range(saved_at, 8))

    saved.seek(0)
    checkpoint = torch.load(saved, weights_only=False)
    fresh = Mixed()
    fresh.load_state_dict(checkpoint["model"])
    restored_model = DDP(fresh, bucket_cap_mb=0.001)
    restored = checkpoint["hook"]
    if saved_at >= 2:  # DDP's first buckets (one per dtype) are not its final ones (3)
        assert len(restored.book.remap.saved_record["layouts"]) == 2
        assert len(restored.book.restored) == 3
    restored_model.register_comm_hook(restored, gtopk_hook)
    train(restored_model, torch.optim.SGD(restored_model.parameters(), lr=0.2),
          range(saved_at, 8))
    for ours, theirs in zip(model.parameters(), restored_model.parameters()):
        assert torch.equal(ours, theirs)
    assert restored.iter == state.iter == 8


def test_a_restored_state_refuses_other_buckets(one_worker: None) -> None:
    state = GTopkHookState(density=0.5)
    for _ in range(3):
        run_hook(state, [Bucket(0, [torch.zeros(8)], torch.ones(8))])
    restored = pickle.loads(pickle.dumps(state))
    with pytest.raises(RuntimeError, match="restored state"):
        run_hook(restored, [Bucket(0, [torch.zeros(9)], torch.ones(9))])


class RecordingTransport(TorchDistributedTransport):
    """The one-worker Gloo group's transport, counting the calls made through it."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def sendrecv(self, *args: object, **kwargs: object) -> int:
        self.calls += 1
        return super().sendrecv(*args, **kwargs)

    def allgather(self, local: np.ndarray) -> np.ndarray:
        self.calls += 1
        return super().allgather(local)

    def allgatherv(self, local: np.ndarray, counts: np.ndarray) -> np.ndarray:
        self.calls += 1
        return super().allgatherv(local, counts)

    def allreduce_sum(self, array: np.ndarray) -> None:
        self.calls += 1
        super().allreduce_sum(array)


class TwoWorkers(Transport):
    """A transport that claims two workers (the process group has one)."""

    rank, size = 1, 2

    def sendrecv(self, *args: object, **kwargs: object) -> int:
        raise AssertionError("not to be used")

    allgather = allgatherv = allreduce_sum = sendrecv


@pytest.mark.parametrize("reduction", ["gtopk", "allgather"])
def test_the_transport_given_is_the_one_used(one_worker: None, reduction: str) -> None:
    """transport=: a Transport object is used as it is, "torch" is the process-wide one over
    the default group, None a TorchDistributedTransport over the process group; all three step
    alike."""
    transport = RecordingTransport()
    states = {"object": GTopkHookState(density=0.1, reduction=reduction, transport=transport),
              "torch": GTopkHookState(density=0.1, reduction=reduction, transport="torch"),
              "default": GTopkHookState(density=0.1, reduction=reduction)}
    assert states["object"].transport is transport and states["default"].transport is None
    assert all(state.active_transport is None for state in states.values())  # not yet
    parameters = [[torch.zeros(30)], [torch.zeros(5, 4)]]
    generator = torch.Generator().manual_seed(3)
    for _ in range(5):
        gradients = [torch.randn(n, generator=generator) for n in (30, 20)]
        results = {name: run_hook(state, [Bucket(i, parameters[i], g.clone(), last=i == 1)
                                          for i, g in enumerate(gradients)])
                   for name, state in states.items()}
        for name in ("object", "torch"):
            for ours, theirs in zip(results[name], results["default"]):
                assert torch.equal(ours, theirs), name
    assert states["object"].get_transport() is transport
    assert states["torch"].get_transport() is default_transport()
    default = states["default"].get_transport()
    assert type(default) is TorchDistributedTransport and default is not default_transport()
    assert default.group is None
    for name, state in states.items():
        assert sorted(state.buckets) == [0, 1]
        for bucket in state.buckets.values():
            assert bucket.step.transport is state.get_transport(), name
            assert bucket.step.step_count == 5
    assert transport.calls > 0  # the reductions went through the object given


def test_a_transport_of_other_workers_is_refused(one_worker: None) -> None:
    with pytest.raises(RuntimeError, match=r"the DDP process group's: TwoWorkers sees rank 1 "
                                           r"of 2, the process group rank 0 of 1"):
        GTopkHookState(density=0.1, transport=TwoWorkers())
    state = GTopkHookState(density=0.1)
    state.transport = TwoWorkers()  # set after construction: refused at the first hook call
    with pytest.raises(RuntimeError, match="process group's"):
        run_hook(state, [Bucket(0, [torch.zeros(8)], torch.ones(8))])
    with pytest.raises(ValueError, match="transport must be None .*got str 'nonsense'"):
        GTopkHookState(density=0.1, transport="nonsense")
    with pytest.raises(TypeError, match="transport must be"):
        GTopkHookState(density=0.1, transport=object())


def test_pickling_keeps_the_checkpoint_and_drops_the_group_and_transport(
        one_worker: None, caplog: pytest.LogCaptureFixture) -> None:
    """pickle.dumps / loads: compression, iter, start_iter and every bucket's layout, sizes,
    residual, velocity and step come back; the process group is None and the transport is
    resolved again in the loading process (a registered name is kept, a Transport object is
    not), with a logged note naming what was dropped."""
    compression = Compression.topk(0.2, momentum_correction=True)
    parameters = [[torch.zeros(10)], [torch.zeros(3, 4)]]
    generator = torch.Generator().manual_seed(4)
    states = {"name": GTopkHookState(compression=compression, start_iter=3, transport="torch"),
              "object": GTopkHookState(dist.group.WORLD, compression=compression,
                                       start_iter=3, transport=RecordingTransport())}
    for state in states.values():
        for _ in range(5):
            run_hook(state, [Bucket(i, parameters[i], torch.randn(n, generator=generator),
                                    last=i == 1) for i, n in enumerate((10, 12))])
    for name, state in states.items():
        caplog.clear()
        with caplog.at_level("WARNING", logger="gtopk_hvd.torch.ddp"):
            restored = pickle.loads(pickle.dumps(state))
        notes = [record.getMessage() for record in caplog.records]
        if name == "name":
            assert not notes and restored.transport == "torch"
            assert restored.get_transport() is default_transport()
        else:
            assert len(notes) == 2 and all("process_group and transport" in note
                                           for note in notes), notes
            assert restored.transport is None
            resolved = restored.get_transport()
            assert type(resolved) is TorchDistributedTransport and resolved.group is None
        assert restored.process_group is None
        assert restored.compression == compression
        assert (restored.iter, restored.start_iter) == (5, 3)
        assert not restored.buckets and restored.book.restored_indices == {0, 1}
        assert restored.book.remap.saved_record == state.book.remap.record()
        for index, bucket in state.buckets.items():
            saved = restored.book.restored[index]
            assert saved["layout"] == bucket.layout and saved["sizes"] == bucket.step.sizes
            assert saved["step"] == bucket.step.step_count == 5
            np.testing.assert_array_equal(saved["residual"].numpy(), bucket.step.residual)
            np.testing.assert_array_equal(saved["velocity"].numpy(), bucket.step.velocity)
        pickle.loads(pickle.dumps(restored))  # a restored state, not yet used, saves again


def test_transport_in_one_process(one_worker: None) -> None:
    transport = TorchDistributedTransport()
    assert (transport.rank, transport.size) == (0, 1)
    local = np.arange(6, dtype=np.float64).reshape(2, 3)
    np.testing.assert_array_equal(transport.allgather(local), local[None])
    values = np.array([3, 1, 2], dtype=np.int32)
    np.testing.assert_array_equal(transport.allgatherv(values, np.array([3])), values)
    summed = np.array([1.5, -2.0], dtype=np.float32)
    transport.allreduce_sum(summed)
    np.testing.assert_array_equal(summed, [1.5, -2.0])
    receive = np.zeros(8, np.uint8)
    send = np.arange(8, dtype=np.uint8)
    assert transport.sendrecv(send, 5, 0, receive, 0, tag=1) == 5
    np.testing.assert_array_equal(receive, [0, 1, 2, 3, 4, 0, 0, 0])
    assert transport.sendrecv(send, 5, None, receive, None, tag=2) == 0
    with pytest.raises(ValueError, match="itself"):
        transport.sendrecv(send, 5, 0, receive, None, tag=3)
    with pytest.raises(RuntimeError, match="init_process_group"):
        check_matches_horovod(transport, 0, 2)
    assert "torch" in TRANSPORTS.names()


def test_transport_needs_an_initialised_group(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(dist, "is_initialized", lambda: False)
    with pytest.raises(RuntimeError, match="init_process_group"):
        TorchDistributedTransport()


def test_a_new_worker_loads_the_job_state_without_residuals(one_worker: None) -> None:
    """A worker whose rank the saved job did not have (torchrun restarted on more workers)
    loads another worker's state with keep_residuals=False: zero residuals and velocities, the
    job's iteration and step counts."""
    compression = Compression.gtopk(0.1, momentum_correction=True)
    parameters = [[torch.zeros(20)], [torch.zeros(7, 3)]]
    state = GTopkHookState(compression=compression)
    generator = torch.Generator().manual_seed(3)
    for _ in range(5):
        run_hook(state, [Bucket(i, parameters[i], torch.randn(n, generator=generator),
                                last=i == 1) for i, n in enumerate((20, 21))])
    saved = state.state_dict()
    assert all(saved["buckets"][i]["workers"] == 1 for i in (0, 1))
    assert any(saved["buckets"][i]["residual"].abs().sum() > 0 for i in (0, 1))
    new = GTopkHookState(compression=compression)
    new.load_state_dict(saved, keep_residuals=False)
    run_hook(new, [Bucket(i, parameters[i], torch.zeros(n), last=i == 1)
                   for i, n in enumerate((20, 21))])
    assert new.iter == 6
    for index in (0, 1):
        step = new.buckets[index].step
        assert step.step_count == saved["buckets"][index]["step"] + 1
        assert not np.any(step.residual) and not np.any(step.velocity)  # zero in, zero out


def test_a_bucket_saved_on_other_workers_restarts_its_scheme_state(one_worker: None) -> None:
    """A bucket saved by a job of another size keeps its residual and step count; its scheme's
    own state (here ExDyna's boundaries, one per worker) was for that size and starts again,
    where the same state saved at this size is checked and refused."""
    compression = Compression.exdyna(0.1, blocks=8)
    parameters = [[torch.zeros(64)]]
    state = GTopkHookState(compression=compression)
    generator = torch.Generator().manual_seed(4)
    for _ in range(4):
        run_hook(state, [Bucket(0, parameters[0], torch.randn(64, generator=generator),
                                last=True)])
    saved = state.state_dict()
    bucket = saved["buckets"][0]
    bucket["scheme"]["boundaries"] = np.array([0, 2, 4, 6, 8])  # a 4-worker job's
    for workers, refused in ((1, True), (4, False)):
        bucket["workers"] = workers
        restored = GTopkHookState(compression=compression)
        restored.load_state_dict(saved)
        batch = [Bucket(0, parameters[0], torch.randn(64, generator=generator), last=True)]
        if refused:
            with pytest.raises(ValueError, match="boundaries for 4 workers"):
                run_hook(restored, batch)
        else:
            run_hook(restored, batch)
            step = restored.buckets[0].step
            assert step.step_count == bucket["step"] + 1
            assert list(step.scheme.boundaries) == [0, 8]
