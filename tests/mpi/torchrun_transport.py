"""Under torchrun (Gloo, any P): TorchDistributedTransport's own operations.

Messages shorter than the buffer, one-sided and idle phases, several dtypes, a transport over a
sub-group (group ranks differ from global ranks) and the "torch" name of the registry. The
reductions through this transport are checked against numpy by tests/mpi/mpi_gtopk_reduction.py
(`--transport torch`, tests/reductions/test_reduction.py). The sparse step given this transport (in
a recording wrapper, tests/helpers/counting_transport.py) sends each step's reduction through it
(gTop-k's schedule of messages, Top-k's all-gathers, with their bytes), and its update equals the
mean of every rank's gradient, gathered by torch.distributed's all_gather_object (not through the
transport) and averaged in numpy. With the step's state in CPU tensors, gTop-k's sets go
through `sendrecv_tensors` as tensors, bit for bit the host path's result; exact gTop-k's sum
at the global set through `allreduce_sum_tensors` (the same Gloo all-reduce as the host's).

`--abort` instead makes the last rank call transport.abort while the others wait in a
collective: torchrun must end them all and exit non-zero.
"""

from __future__ import annotations

import sys
import time

import numpy as np
import torch.distributed as dist
from helpers.counting_transport import CountingTransport, check_reduction_calls
from helpers.reference import gtopk_schedule_reference

from gtopk_hvd.compression import Compression
from gtopk_hvd.core import SparseStep
from gtopk_hvd.reductions import gtopk_allreduce
from gtopk_hvd.transports import resolve_transport
from gtopk_hvd.transports.torch_distributed import TorchDistributedTransport, end_process_group


def check_operations(transport: TorchDistributedTransport) -> None:
    """The transport's own contract, one operation at a time."""
    rank, size = transport.rank, transport.size
    # allgather of several dtypes and shapes (sent as bytes)
    for dtype in (np.int64, np.int32, np.float32, np.float64, np.uint16, np.bool_):
        local = (np.arange(6).reshape(2, 3) + 10 * rank).astype(dtype)
        gathered = transport.allgather(local)
        assert gathered.shape == (size, 2, 3) and gathered.dtype == dtype
        for r in range(size):
            assert np.array_equal(gathered[r], (np.arange(6).reshape(2, 3) + 10 * r).astype(dtype))
    assert transport.allgather(np.zeros(0, np.float32)).shape == (size, 0)
    # allgatherv with uneven and empty pieces
    counts = np.array([(r * 3) % 4 for r in range(size)], dtype=np.int64)
    local = np.arange(counts[rank], dtype=np.int64) + 100 * rank
    expected = np.concatenate([np.arange(c, dtype=np.int64) + 100 * r
                               for r, c in enumerate(counts)])
    assert np.array_equal(transport.allgatherv(local, counts), expected)
    assert transport.allgatherv(np.zeros(0, np.float32), np.zeros(size, np.int64)).size == 0
    # sendrecv in a ring: both partners send first; the message is shorter than the buffer and
    # its length differs per rank; the tail of the buffer is left untouched
    receive = np.full(64, 255, dtype=np.uint8)
    send = np.full(64, rank, dtype=np.uint8)
    right, left = (rank + 1) % size, (rank - 1) % size
    got = transport.sendrecv(send, 5 + rank, right, receive, left, tag=21)
    assert got == 5 + left and np.all(receive[:got] == left) and np.all(receive[got:] == 255)
    # one-sided phases and idle ones: rank 0 sends to the last rank, the rest idle
    receive[:] = 255
    if rank == 0 and size > 1:
        assert transport.sendrecv(send, 7, size - 1, receive, None, tag=22) == 0
    elif rank == size - 1 and size > 1:
        assert transport.sendrecv(send, 0, None, receive, 0, tag=22) == 7
        assert np.all(receive[:7] == 0)
    else:
        assert transport.sendrecv(send, 0, None, receive, None, tag=22) == 0
    # an empty message
    assert transport.sendrecv(send, 0, right, receive, left, tag=23) == 0
    # all-reduce in place, also into a non-contiguous view
    whole = np.ones(20, dtype=np.float32)
    strided = whole[::2]
    transport.allreduce_sum(strided)
    assert np.all(strided == size) and np.all(whole[1::2] == 1)
    # all-reduce of tensors in place (the union schemes' sums on the device), an empty one too
    import torch

    tensors = [torch.full((5,), float(rank + 1)), torch.zeros(0), torch.arange(3.0) * rank]
    transport.allreduce_sum_tensors(tensors)
    assert torch.equal(tensors[0], torch.full((5,), size * (size + 1) / 2))
    assert tensors[1].numel() == 0
    assert torch.equal(tensors[2], torch.arange(3.0) * (size * (size - 1) / 2))
    # the name "torch" is one process-wide transport over the default group
    named = resolve_transport("torch")
    assert named is resolve_transport("torch") and (named.rank, named.size) == (rank, size)


def check_subgroup() -> None:
    """A transport over the odd (or all but rank 0) ranks: group ranks != global ranks, so
    point-to-point peers must be translated."""
    rank, size = dist.get_rank(), dist.get_world_size()
    if size < 2:
        return
    members = list(range(1, size)) if size > 2 else [0, 1]
    group = dist.new_group(members)  # every rank takes part in new_group
    if rank not in members:
        return
    transport = TorchDistributedTransport(group)
    assert transport.size == len(members) and transport.rank == members.index(rank)
    k, d = 40, 3000
    rng = np.random.default_rng([7, transport.rank])
    index = np.sort(rng.choice(d, size=k, replace=False)).astype(np.int32)
    value = rng.standard_normal(k).astype(np.float32)
    result = gtopk_allreduce(index, value, k, transport=transport)
    sets = transport.allgather(np.concatenate([index.astype(np.float64),
                                               value.astype(np.float64)]).reshape(1, -1))
    local_sets = [(row[0, :k].astype(np.int32), row[0, k:].astype(np.float32)) for row in sets]
    expected, _, _ = gtopk_schedule_reference(local_sets, k, 8, lambda v: v)
    assert np.array_equal(result.indices, expected[transport.rank][0])
    assert result.values.tobytes() == expected[transport.rank][1].tobytes()


def check_sparse_step(transport: TorchDistributedTransport) -> None:
    """Density 1.0, three steps of each reduction through a recording wrapper: the calls and
    bytes of each step's reduction, and the update against numpy's mean of the gradients."""
    counting = CountingTransport(transport)
    rank, size, sizes = transport.rank, transport.size, [200, 7, 93]
    d = sum(sizes)
    for reduction, compression in (("gtopk", Compression.gtopk(1.0)),
                                   ("allgather", Compression.topk(1.0))):
        state = SparseStep(compression, sizes, counting)
        for step in range(3):
            what = f"sparse step, {reduction}, step {step}, rank {rank}"
            gradient = np.random.default_rng([rank, step]).standard_normal(d).astype(np.float32)
            counting.take()
            indices, values = state.update(gradient.copy())
            check_reduction_calls(counting.take(), state.last_stats, reduction, d, rank, size,
                                  what)
            gathered: list = [None] * size
            dist.all_gather_object(gathered, gradient)
            update = np.zeros(d, np.float32)
            update[indices] = values
            np.testing.assert_allclose(update, np.mean(np.array(gathered, np.float64), axis=0),
                                       rtol=1e-5, atol=1e-7, err_msg=what)


def check_reduction_on_tensors(transport: TorchDistributedTransport) -> None:
    """The sparse step with its state in torch tensors on the group's device (the CPU under
    Gloo, a GPU under NCCL): gTop-k's sets go through sendrecv_tensors and merge there
    (`gtopk_hvd.reductions.gtopk_device`), Top-k's through allgather_tensors; bit for bit what
    the host path gives."""
    import torch

    from gtopk_hvd.reductions.gtopk_device import DeviceGTopkReducer

    rank, sizes = transport.rank, [500, 300]
    for compression in (Compression.gtopk(0.05), Compression.gtopk(0.05, wire_dtype="float16"),
                        Compression.topk(0.05), Compression.gtopk(0.05, exact=True)):
        wire_dtype = (f"{compression.reduction} {compression.wire_dtype}"
                      f"{' exact' if compression.exact else ''}")
        on_host = SparseStep(compression, sizes, transport)
        on_tensors = SparseStep(compression, sizes, transport, device="cpu")
        for step in range(3):
            gradient = np.random.default_rng([rank, step, 9]).standard_normal(
                sum(sizes)).astype(np.float32)
            want = on_host.update(gradient.copy())
            got = on_tensors.update(torch.from_numpy(gradient.copy()))
            what = f"{wire_dtype}, step {step}, rank {rank}"
            assert np.array_equal(got[0], want[0]), what
            assert got[1].tobytes() == want[1].tobytes(), what
            if compression.reduction == "gtopk":
                assert on_tensors.last_stats.bytes_sent == on_host.last_stats.bytes_sent, what
        assert on_tensors.residual.numpy().tobytes() == on_host.residual.tobytes()
        reducers = getattr(on_tensors.scheme.reduction, "_reducers", {}).values()
        assert compression.reduction != "gtopk" or any(
            isinstance(r, DeviceGTopkReducer) for r in reducers)


def main() -> None:
    dist.init_process_group("gloo")
    transport = TorchDistributedTransport()
    rank, size = transport.rank, transport.size
    assert (rank, size) == (dist.get_rank(), dist.get_world_size())
    if "--abort" in sys.argv:
        if rank == size - 1:
            time.sleep(0.5)
            transport.abort("test abort from the last rank")
        transport.allreduce_sum(np.zeros(4, np.float32))  # waits for the last rank forever
        print(f"rank {rank} was not ended", flush=True)
        return
    check_operations(transport)
    check_subgroup()
    check_sparse_step(transport)
    check_reduction_on_tensors(transport)
    dist.barrier()
    if rank == 0:
        print(f"torch.distributed transport ok on {size} workers", flush=True)
    end_process_group()


if __name__ == "__main__":
    main()
