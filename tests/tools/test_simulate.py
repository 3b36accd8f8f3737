"""The simulated cluster (gtopk_hvd.simulate, the "local" transport) is the real algorithm.

- examples/simulated_cluster.py ends with weights bitwise identical to examples/pytorch_lm.py
  under mpirun with the same seeds and shards: gTop-k at P = 2, 6 and 8, Top-k at P = 3; and
  equal to float rounding for dense (Horovod's all-reduce sums in its own order; at P = 3). The
  same for the digits CNN (examples/pytorch_digits.py, its DistributedSampler shards and
  learning rate x P): gTop-k and dense at P = 3, gTop-k at P = 2 (1,437 training images: at
  P = 2 the sampler pads the last shard, at P = 3 it does not). P = 2 and 8 are powers of two
  (gTop-k's tree is complete), 3 and 6 are not (a partner is missing in a round). gTop-k, whose
  tree depends on P, carries the P dimension; Top-k and dense sum P contributions in an order
  that float addition makes visible only from P = 3 on, so once each at P = 3 is enough. Each
  mpirun launch starts every rank with torch and Horovod, so the matrix covers each case once.
- examples/simulated_cluster.py transformer (the GPT-style decoder with AdamW and its warm-up,
  its second moment frozen after a dense start, its first moment after the exchange or in it)
  at P = 3: bitwise the mpirun job of
  examples/pytorch_transformer.py with MiCRO, a union scheme (the recipe does not depend on the
  scheme; gTop-k at P = 3 is the digits CNN's).
- The local transport: messages and collectives as the real transports; a worker that fails
  ends every worker's wait at once (no hang) with the cause; "local" outside a worker names
  the fix.
- SimulatedCluster: dense equals the numpy sum; Top-k's first update equals an independent
  numpy reference; bytes per worker as the reductions count them.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers.mpi_launcher import REPO_ROOT, run_mpi

from gtopk_hvd.compression import Compression
from gtopk_hvd.simulate import SimulatedCluster
from gtopk_hvd.transports import resolve_transport
from gtopk_hvd.transports.local import LocalGroup, LocalGroupBroken

LM_OPTIONS = ["--vocab-size", "2000", "--size", "32", "--max-steps", "5", "--eval-every", "5",
              "--density", "0.01", "--quiet"]
PER_WORKER_BATCH = 4


def simulated(workers: int, compression: str, save: Path) -> str:
    command = [sys.executable, str(REPO_ROOT / "examples/simulated_cluster.py"), "lm",
               "--workers", str(workers), "--global-batch", str(PER_WORKER_BATCH * workers),
               "--compression", compression, "--save", str(save), *LM_OPTIONS]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return re.search(r"CHECKSUM simulated (\w+)", done.stdout).group(1)


@pytest.mark.mpi
@pytest.mark.parametrize("workers,compressions", [
    (2, ("gtopk",)), (3, ("topk", "none")), (6, ("gtopk",)), (8, ("gtopk",))],
    ids=["P2", "P3", "P6", "P8"])
def test_simulated_lm_equals_the_mpirun_job(workers: int, compressions: tuple[str, ...],
                                            tmp_path: Path) -> None:
    for compression in compressions:
        output = run_mpi("examples/pytorch_lm.py", workers, "--compression", compression,
                         "--batch-size", str(PER_WORKER_BATCH), "--save",
                         str(tmp_path / f"mpi_{compression}.npz"), *LM_OPTIONS, timeout_s=300)
        ranks = set(re.findall(r"CHECKSUM rank=\d+ (\w+)", output))
        assert len(ranks) == 1, f"{compression}: mpirun replicas differ: {ranks}"
        checksum = simulated(workers, compression, tmp_path / f"sim_{compression}.npz")
        real = np.load(tmp_path / f"mpi_{compression}.npz")
        fake = np.load(tmp_path / f"sim_{compression}.npz")
        assert sorted(real) == sorted(fake)
        if compression == "none":
            for name in real:
                np.testing.assert_allclose(fake[name], real[name], rtol=1e-5, atol=1e-6,
                                           err_msg=name)
        else:
            assert checksum == ranks.pop(), f"{compression} at P = {workers}: not bitwise"
            for name in real:
                assert real[name].tobytes() == fake[name].tobytes(), (compression, name)


TRANSFORMER_OPTIONS = ["--vocab-size", "2000", "--size", "32", "--layers", "2", "--heads", "4",
                       "--bptt", "16", "--max-steps", "6", "--eval-every", "6",
                       "--warmup-steps", "2", "--density", "0.01", "--sparsify",
                       "preconditioned", "--dense-steps", "2", "--quiet"]


@pytest.mark.mpi
@pytest.mark.parametrize("momentum", [[], ["--momentum-correction"]],
                         ids=["first-moment-after", "momentum-in-exchange"])
def test_simulated_transformer_equals_the_mpirun_job(momentum: list[str], tmp_path: Path) -> None:
    """examples/pytorch_transformer.py (AdamW, its warm-up) at P = 3 with the optimizer's
    freeze_variance_after (--sparsify preconditioned: 2 dense steps, then 4 on the
    preconditioned gradient; each worker clips its own gradient): the simulated cluster ends
    bitwise where the mpirun job does, with a union scheme (MiCRO: each worker selects by a
    threshold within its own rotating partition of the indices, the sums exact). The plain
    optimizer path (AdamW on the sparse average) is the LSTM's; the recipe does not depend on
    the scheme; the selection-and-merge gTop-k is proven at P = 3 on the digits CNN and at 2, 6
    and 8 on the LSTM. With --momentum-correction too, AdamW's first moment moves into the
    exchange (each worker's velocity, seeded from the dense start's moment)."""
    compression = "micro"
    output = run_mpi("examples/pytorch_transformer.py", 3, "--compression", compression,
                     "--batch-size", str(PER_WORKER_BATCH), "--save",
                     str(tmp_path / "mpi.npz"), *TRANSFORMER_OPTIONS, *momentum, timeout_s=300)
    ranks = set(re.findall(r"CHECKSUM rank=\d+ (\w+)", output))
    assert len(ranks) == 1, f"{compression}: mpirun replicas differ: {ranks}"
    command = [sys.executable, str(REPO_ROOT / "examples/simulated_cluster.py"),
               "transformer", "--workers", "3", "--global-batch", str(3 * PER_WORKER_BATCH),
               "--compression", compression, "--save", str(tmp_path / "sim.npz"),
               *TRANSFORMER_OPTIONS, *momentum]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    checksum = re.search(r"CHECKSUM simulated (\w+)", done.stdout).group(1)
    assert checksum == ranks.pop(), f"{compression}: not bitwise"
    real, fake = np.load(tmp_path / "mpi.npz"), np.load(tmp_path / "sim.npz")
    assert sorted(real) == sorted(fake)
    for name in real:
        assert real[name].tobytes() == fake[name].tobytes(), (compression, name)


def test_the_transformer_refuses_the_momentum_correction_without_the_frozen_variance() -> None:
    done = subprocess.run([sys.executable, str(REPO_ROOT / "examples/pytorch_transformer.py"),
                           "--compression", "topk", "--momentum-correction"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert "needs its second moment frozen: add --sparsify preconditioned" in done.stderr


DIGITS_OPTIONS = ["--epochs", "1", "--density", "0.05", "--quiet"]


@pytest.mark.mpi
@pytest.mark.parametrize("workers,compressions", [(3, ("gtopk", "none")), (2, ("gtopk",))],
                         ids=["P3", "P2"])
def test_simulated_digits_cnn_equals_the_mpirun_job(workers: int, compressions: tuple[str, ...],
                                                    tmp_path: Path) -> None:
    for compression in compressions:
        output = run_mpi("examples/pytorch_digits.py", workers, "--compression", compression,
                         "--batch-size", "8", "--checkpoint", str(tmp_path / "mpi"),
                         *DIGITS_OPTIONS, timeout_s=300)
        ranks = set(re.findall(r"CHECKSUM rank=\d+ (\w+)", output))
        assert len(ranks) == 1, f"{compression}: mpirun replicas differ: {ranks}"
        command = [sys.executable, str(REPO_ROOT / "examples/simulated_cluster.py"), "digits",
                   "--workers", str(workers), "--global-batch", str(8 * workers),
                   "--compression", compression, "--checkpoint", str(tmp_path / "sim"),
                   *DIGITS_OPTIONS]
        done = subprocess.run(command, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        checksum = re.search(r"CHECKSUM simulated (\w+)", done.stdout).group(1)
        real = torch.load(tmp_path / "mpi.rank0")["model"]
        fake = torch.load(tmp_path / "sim")["model"]
        if compression == "none":
            for name in real:
                torch.testing.assert_close(fake[name], real[name], rtol=1e-5, atol=1e-6)
        else:
            assert checksum == ranks.pop(), f"{compression} at P = {workers}: not bitwise"


# -- the local transport ---------------------------------------------------------------------

def test_local_transport_messages_and_collectives() -> None:
    group = LocalGroup(4, timeout_s=30)

    def work(rank: int) -> tuple:
        transport = resolve_transport("local")
        assert transport.rank == rank and transport.size == 4
        send = np.arange(rank * 10, rank * 10 + 6, dtype=np.uint8)
        receive = np.zeros(16, dtype=np.uint8)
        got = transport.sendrecv(send, 3 + rank, (rank + 1) % 4, receive, (rank - 1) % 4, tag=7)
        gathered = transport.allgather(np.full(2, rank, dtype=np.int32))
        counts = np.arange(1, 5)
        varied = transport.allgatherv(np.full(rank + 1, rank, dtype=np.int64), counts)
        summed = np.full(3, rank + 0.5, dtype=np.float64)
        transport.allreduce_sum(summed)
        return got, receive[:got].tolist(), gathered.tolist(), varied.tolist(), summed.tolist()

    results = group.run(work)
    group.close()
    for rank, (got, received, gathered, varied, summed) in enumerate(results):
        source = (rank - 1) % 4
        assert got == 3 + source
        assert received == list(range(source * 10, source * 10 + got))
        assert gathered == [[r, r] for r in range(4)]
        assert varied == [0, 1, 1, 2, 2, 2, 3, 3, 3, 3]
        assert summed == [8.0] * 3


def test_a_failing_worker_ends_every_wait_at_once() -> None:
    group = LocalGroup(3, timeout_s=60)

    def work(rank: int) -> None:
        transport = resolve_transport("local")
        if rank == 1:
            raise ValueError("worker 1's own error")
        if rank == 0:
            transport.allreduce_sum(np.zeros(1))  # waits for 1, which never comes
        receive = np.zeros(4, dtype=np.uint8)
        transport.sendrecv(receive, 0, None, receive, 1, tag=3)  # waits for 1's message

    began = time.perf_counter()
    with pytest.raises(ValueError, match="worker 1's own error"):
        group.run(work)
    assert time.perf_counter() - began < 10
    with pytest.raises(LocalGroupBroken):
        group.run(lambda rank: None)
    group.close()


def test_local_outside_a_worker_names_the_fix() -> None:
    errors = []
    thread = threading.Thread(target=lambda: errors.append(_resolve_error()))
    thread.start()
    thread.join()
    assert "LocalGroup.run" in errors[0]


def _resolve_error() -> str:
    try:
        resolve_transport("local")
    except RuntimeError as error:
        return str(error)
    return "no error"


# -- SimulatedCluster against numpy ----------------------------------------------------------

def test_dense_cluster_is_the_average() -> None:
    rng = np.random.default_rng(1)
    cluster = SimulatedCluster(None, [300, 700], 5)
    grads = rng.standard_normal((5, 1000)).astype(np.float32)
    for rank in range(5):
        cluster.gradients[rank][:] = grads[rank]
    update = cluster.reduce()
    np.testing.assert_allclose(update, grads.sum(axis=0) / 5, rtol=1e-6)
    assert all(not g.any() for g in cluster.gradients)
    assert cluster.bytes_sent == [int(2 * 4 / 5 * 4 * 1000)] * 5


def test_topk_cluster_first_step_equals_numpy() -> None:
    workers, d, density = 6, 2000, 0.01
    k = int(density * d)
    rng = np.random.default_rng(2)
    cluster = SimulatedCluster(Compression.topk(density), [d], workers)
    grads = rng.standard_normal((workers, d)).astype(np.float32)
    expected = np.zeros(d, dtype=np.float64)
    for rank in range(workers):
        cluster.gradients[rank][:] = grads[rank]
        chosen = np.argsort(-np.abs(grads[rank]), kind="stable")[:k]
        expected[chosen] += grads[rank][chosen]
    update = cluster.reduce()
    np.testing.assert_allclose(update, expected / workers, rtol=1e-6, atol=1e-7)
    for rank in range(workers):  # the residual keeps what was not sent
        residual = cluster.steps[rank].residual
        chosen = np.argsort(-np.abs(grads[rank]), kind="stable")[:k]
        kept = grads[rank].copy()
        kept[chosen] = 0
        np.testing.assert_array_equal(residual, kept)
    assert cluster.bytes_sent == [stats.bytes_sent for stats in cluster.last_stats]
    assert all(sent > 0 for sent in cluster.bytes_sent)
    cluster.close()


def test_largest_entries_rank_residual_plus_gradient() -> None:
    """What --record-k-sets writes: each worker's largest |residual + gradient| (numpy's)."""
    workers, d, density, count = 3, 3000, 0.01, 45
    rng = np.random.default_rng(3)
    cluster = SimulatedCluster(Compression.topk(density), [d], workers)
    for rank in range(workers):
        cluster.gradients[rank][:] = rng.standard_normal(d)
    cluster.reduce()  # leaves each worker a residual
    grads = rng.standard_normal((workers, d)).astype(np.float32)
    for rank in range(workers):
        cluster.gradients[rank][:] = grads[rank]
    indices, values = cluster.largest_entries(count)
    assert indices.shape == values.shape == (workers, count)
    for rank in range(workers):
        accumulated = cluster.steps[rank].residual + grads[rank]
        expected = np.sort(np.argsort(-np.abs(accumulated), kind="stable")[:count])
        np.testing.assert_array_equal(indices[rank], expected)
        np.testing.assert_array_equal(values[rank], accumulated[expected])
    assert not np.array_equal(indices[0], indices[1])
    cluster.close()


def test_a_lost_residual_is_what_changes(tmp_path: Path) -> None:
    """--lose-residual-at: the run is the same as without it up to that step and differs after;
    what was lost is reported (a non-zero residual of the chosen worker)."""
    runs = {}
    for name, extra in (("calm", []), ("lost", ["--lose-residual-at", "3", "--lose-worker", "1"])):
        history = tmp_path / f"{name}.json"
        command = [sys.executable, str(REPO_ROOT / "examples/simulated_cluster.py"), "lm",
                   "--workers", "2", "--global-batch", "8", "--compression", "gtopk",
                   "--history", str(history), *LM_OPTIONS[:4], "--max-steps", "6",
                   "--eval-every", "1", "--density", "0.01", "--quiet", *extra]
        done = subprocess.run(command, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        runs[name] = json.loads(history.read_text())
    calm, lost = ([e["valid_perplexity"] for e in runs[n]["evaluations"]] for n in runs)
    assert calm[:3] == lost[:3] and calm[3:] != lost[3:], (calm, lost)
    report = runs["lost"]["lost_residual"]
    assert report["worker"] == 1 and report["step"] == 3 and report["l1"] > 0
    assert report["nonzero"] > 0 and report["update_l2"] > 0
    assert runs["calm"]["lost_residual"] == {}


def test_the_transformer_learns_with_adamw_and_gtopk() -> None:
    """The GPT-style decoder with AdamW and gTop-k 0.01 at P = 2, 150 steps: validation
    perplexity from the vocabulary's size (2,001: a uniform guess) to below 200 (94 measured,
    so a 2x margin: a broken update, e.g. one Adam never sees, stays near 2,000)."""
    command = [sys.executable, str(REPO_ROOT / "examples/simulated_cluster.py"), "transformer",
               "--workers", "2", "--global-batch", "16", "--compression", "gtopk",
               "--density", "0.01", "--vocab-size", "2000", "--size", "64", "--layers", "2",
               "--heads", "4", "--bptt", "32", "--max-steps", "150", "--eval-every", "150",
               "--warmup-steps", "20", "--quiet"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    perplexity = float(re.search(r"valid_perplexity=([\d.]+)", done.stdout).group(1))
    assert perplexity < 200, perplexity
