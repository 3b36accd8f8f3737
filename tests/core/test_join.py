"""Uneven data: `hvd.join()` / `SparseStep.join()` with sparse steps (Horovod's semantics: a
joined worker takes part with an empty contribution until all have joined; the average still
divides by P; join returns the rank that joined last).

In one process over the "local" transport (every scheme, against a numpy replay for Top-k), and
under each launcher: mpirun (MPI transport) and horovodrun --gloo (Horovod's collectives) with
Horovod's own `hvd.join()` and the torch optimizer, the Keras optimizer or the TensorFlow tape,
torchrun with the core step over torch.distributed (tests/mpi/join_uneven.py and
join_uneven_tf.py check and print JOIN OK on every rank)."""

from __future__ import annotations

import re
import sys

import numpy as np
import pytest
from helpers.mpi_launcher import MPI_PROGRAMS, run_mpi

from gtopk_hvd.compression import Compression
from gtopk_hvd.core import SparseStep
from gtopk_hvd.transports import resolve_transport
from gtopk_hvd.transports.local import LocalGroup

sys.path.insert(0, str(MPI_PROGRAMS))
from join_uneven import DENSITY, D, gradient, topk_replay  # noqa: E402

SCHEMES = {"topk": Compression.topk(DENSITY), "gtopk": Compression.gtopk(DENSITY),
           "gtopk-exact": Compression.gtopk(DENSITY, exact=True),
           "micro": Compression.micro(DENSITY), "sketch": Compression.sketch(DENSITY),
           "oktopk": Compression.oktopk(DENSITY, reestimate_every=2)}


def run_local(config: object, steps: list[int]) -> list[tuple[int, np.ndarray, np.ndarray, int]]:
    """Worker r takes steps[r] steps then joins: (returned rank, weights, residual before the
    join == after, step count) per worker."""
    group = LocalGroup(len(steps), timeout_s=60)

    def work(rank: int) -> tuple[int, np.ndarray, bool, int]:
        sparse = SparseStep(config, [D], resolve_transport("local"))
        weights, update = np.zeros(D, np.float32), np.zeros(D, np.float32)
        for t in range(steps[rank]):
            weights -= sparse.update(gradient(rank, t), update)
        residual = sparse.residual.copy()
        last = sparse.join()
        return last, weights, np.array_equal(residual, sparse.residual), sparse.step_count

    try:
        return group.run(work)
    finally:
        group.close()


@pytest.mark.parametrize("scheme", list(SCHEMES))
@pytest.mark.parametrize("steps", [[4, 2, 3], [0, 3, 1, 3]])
def test_join_in_one_process(scheme: str, steps: list[int]) -> None:
    results = run_local(SCHEMES[scheme], steps)
    longest = max(steps)
    last = max(range(len(steps)), key=lambda r: (steps[r], r))
    full = [r for r in range(len(steps)) if steps[r] == longest]
    for rank, (returned, weights, residual_kept, step_count) in enumerate(results):
        assert returned == last
        assert residual_kept, f"worker {rank}'s residual changed while joined"
        assert step_count == longest  # the density schedule stays in step
        if steps[rank] == 0:
            assert not weights.any()
    reference = results[full[0]][1]
    assert all(np.array_equal(results[r][1], reference) for r in full)
    assert np.isfinite(reference).all() and reference.any()
    if scheme == "topk":
        np.testing.assert_allclose(reference, topk_replay(steps), rtol=1e-5, atol=1e-6)


def test_join_alone_returns_at_once() -> None:
    (returned, weights, kept, count), = run_local(Compression.gtopk(DENSITY), [2])
    assert returned == 0 and count == 2 and kept and weights.any()


@pytest.mark.mpi
@pytest.mark.parametrize(("launcher", "mode", "scheme", "steps"), [
    ("mpirun", "optimizer", "topk", [4, 2, 3]),
    ("mpirun", "optimizer", "gtopk", [3, 5, 1]),
    ("mpirun", "core:mpi", "gtopk", [1, 3]),
    ("horovodrun", "optimizer", "topk", [2, 1]),  # the issue's: rank 1 joins at rank 0's 2nd
    ("horovodrun", "optimizer", "gtopk", [3, 1, 4]),
    ("torchrun", "core:torch", "topk", [3, 1, 2]),
    ("mpirun", "keras", "topk", [4, 2, 3]),
    ("horovodrun", "keras", "gtopk", [3, 1, 4]),
    ("mpirun", "tape", "gtopk", [1, 3]),
    ("horovodrun", "tape", "topk", [2, 1]),
])
def test_join_under_each_launcher(launcher: str, mode: str, scheme: str,
                                  steps: list[int]) -> None:
    program = "join_uneven_tf.py" if mode in ("keras", "tape") else "join_uneven.py"
    output = run_mpi(program, len(steps), scheme, mode, *map(str, steps),
                     timeout_s=600, launcher=launcher)
    last = max(range(len(steps)), key=lambda r: (steps[r], r))
    oks = sorted(re.findall(r"JOIN OK rank=(\d+) last=(\d+)", output))
    assert oks == [(str(r), str(last)) for r in range(len(steps))], output[-4000:]
