"""Any P, any transport: gtopk_allreduce and topk_allgather against a replay in numpy.

    mpirun -np P python mpi_gtopk_reduction.py [--transport mpi|horovod]
    horovodrun --gloo -np P python mpi_gtopk_reduction.py --transport horovod
    torchrun --nproc_per_node P mpi_gtopk_reduction.py --transport torch

Every rank reduces its own set; rank 0 gathers every local set, replays the schedule with the merge
of tests/helpers/reference.py and checks, for every rank: the global set bit for bit, that it is
the same on all ranks, the survivor mask, and the byte counters against the cost model.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
from helpers.reference import gtopk_schedule_reference
from helpers.worlds import run_on_all_ranks, world_from_arguments

from gtopk_hvd.reductions import dense_allreduce, gtopk_allreduce, topk_allgather

WORLD = world_from_arguments()
RANK, SIZE, TRANSPORT = WORLD.rank, WORLD.size, WORLD.transport

ROUNDING = {
    "float32": lambda v: v,
    "float16": lambda v: v.astype(np.float16).astype(np.float32),
    "bfloat16": lambda v: v.astype(ml_dtypes.bfloat16).astype(np.float32),
}


def local_set(case: str, d: int, k: int, seed: int, index_dtype: type) -> tuple:
    rng = np.random.default_rng([seed, RANK])
    if case == "same_indices":
        index = np.random.default_rng(seed).choice(d, size=k, replace=False)
    elif case == "disjoint":
        share = d // SIZE
        index = RANK * share + rng.choice(share, size=min(k, share), replace=False)
    elif case == "short":
        index = rng.choice(d, size=int(rng.integers(0, k + 1)), replace=False)
    else:
        index = rng.choice(d, size=k, replace=False)
    index = np.sort(index).astype(index_dtype)
    if case == "ties":
        value = rng.choice([-2.0, -1.0, 1.0, 2.0], size=index.size)
    elif case == "zeros":
        value = np.zeros(index.size)
    else:
        value = rng.standard_normal(index.size) * 10.0 ** rng.uniform(-3, 3, index.size)
    return index, value.astype(np.float32)


def check_gtopk(case: str, d: int, k: int, seed: int, index_dtype: type = np.int32,
                wire: str = "float32") -> None:
    index, value = local_set(case, d, k, seed, index_dtype)
    result = gtopk_allreduce(index, value, k, transport=TRANSPORT, wire_dtype=wire)
    gathered = WORLD.allgather_objects((index, value, result))
    problem = None
    if RANK == 0:
        entry_bytes = np.dtype(index_dtype).itemsize + (4 if wire == "float32" else 2)
        expected, sent, received = gtopk_schedule_reference(
            [(i, v) for i, v, _ in gathered], k, entry_bytes, ROUNDING[wire])
        base = 1 << (SIZE.bit_length() - 1)
        for rank, (local_index, _, got) in enumerate(gathered):
            where = f"{case} d={d} k={k} wire={wire} rank={rank}"
            if not (np.array_equal(got.indices, expected[rank][0])
                    and got.values.tobytes() == expected[rank][1].tobytes()):
                problem = f"{where}: global set differs from the replay"
            elif (got.indices.tobytes(), got.values.tobytes()) != (
                    gathered[0][2].indices.tobytes(), gathered[0][2].values.tobytes()):
                problem = f"{where}: global set differs from rank 0's"
            elif not np.array_equal(got.survived, np.isin(local_index, got.indices)):
                problem = f"{where}: survivor mask is wrong"
            elif (got.stats.bytes_sent, got.stats.bytes_received) != (sent[rank], received[rank]):
                problem = (f"{where}: bytes sent/received {got.stats.bytes_sent}/"
                           f"{got.stats.bytes_received}, cost model {sent[rank]}/{received[rank]}")
            elif got.stats.rounds != (base.bit_length() - 1 if rank < base else 0):
                problem = f"{where}: {got.stats.rounds} rounds"
            elif got.indices.dtype != index_dtype or got.values.dtype != np.float32:
                problem = f"{where}: dtypes {got.indices.dtype}, {got.values.dtype}"
            if problem:
                break
        full_sets = all(i.size == k for i, _, _ in gathered) and d >= 2 * k
        if problem is None and full_sets and case in ("random", "disjoint") and SIZE == base:
            model = (base.bit_length() - 1) * entry_bytes * k  # log2(P) * 8k for int32/float32
            if gathered[0][2].stats.bytes_sent != model:
                problem = f"{case}: {gathered[0][2].stats.bytes_sent} bytes, model {model}"
    problem = WORLD.allgather_objects(problem)[0]
    assert problem is None, problem


def check_topk_allgather(d: int, k: int, seed: int) -> None:
    index, value = local_set("random", d, k, seed, np.int32)
    result = topk_allgather(index, value, transport=TRANSPORT)
    gathered = WORLD.allgather_objects((index, value))
    totals: dict[int, np.float32] = {}
    for local_index, local_value in gathered:  # rank order
        for i, v in zip(local_index.tolist(), local_value):
            totals[i] = totals[i] + v if i in totals else v
    expected_index = np.array(sorted(totals), dtype=np.int32)
    expected_value = np.array([totals[i] for i in expected_index.tolist()], dtype=np.float32)
    assert np.array_equal(result.indices, expected_index)
    assert result.values.tobytes() == expected_value.tobytes()
    assert result.survived.all()
    others = sum(i.size for i, _ in gathered) - index.size
    assert result.stats.bytes_received == 8 * others + 8 * (SIZE - 1)


def check_dense(d: int, seed: int) -> None:
    mine = np.random.default_rng([seed, RANK]).standard_normal(d).astype(np.float32)
    everyone = WORLD.allgather_objects(mine)
    summed = mine.copy()
    stats = dense_allreduce(summed, transport=TRANSPORT)
    np.testing.assert_allclose(summed, np.sum(everyone, axis=0, dtype=np.float64), rtol=1e-5,
                               atol=1e-5)
    assert all(summed.tobytes() == other.tobytes() for other in WORLD.allgather_objects(summed))
    assert stats.bytes_sent == 2 * (SIZE - 1) * 4 * d // SIZE


def main(world: object) -> None:
    seed = 0
    for case in ("random", "same_indices", "disjoint", "ties", "zeros", "short"):
        for d, k in ((5000, 64), (200_000, 1000), (40, 25)):
            seed += 1
            check_gtopk(case, d, k, seed)
    for repeat in range(3):  # the cached reducer and its buffers, reused
        check_gtopk("random", 100_000, 500, 100 + repeat)
    check_gtopk("random", 100_000, 500, 200, index_dtype=np.int64)
    check_gtopk("random", 100_000, 500, 201, wire="float16")
    check_gtopk("ties", 100_000, 500, 202, wire="bfloat16")
    check_gtopk("random", 100_000, 500, 203, wire="bfloat16")
    check_topk_allgather(100_000, 300, 300)
    check_dense(10_001, 400)
    if RANK == 0:
        print(f"gtopk reduction ok on {SIZE} workers over {WORLD.name}", flush=True)


if __name__ == "__main__":
    run_on_all_ranks(main, WORLD)
