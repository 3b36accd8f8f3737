"""Tentative steps (gtopk_hvd.core.tentative) against the step that decides first.

Workers are threads (tests/helpers/thread_transport.py). Each worker takes STEPS steps of one
SparseStep on its gradients twice: `update` (nonfinite="propagate": the count first, then the
step or the skip), and a TentativeStep run first, then the count, then commit or discard. Worker
1's gradient holds a NaN at NAN_AT. Every update, residual, step count, skipped count and scheme
state must be bit-equal in the two, at every step, on every worker; the skipped step leaves the
state as it was before it.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
from helpers.thread_transport import ThreadGroup

from gtopk_hvd.compression import Compression
from gtopk_hvd.core import SparseStep, TentativeStep, can_step_tentatively, count_workers

D, STEPS, NAN_AT = 5_000, 6, 3
SCHEMES = {
    "gtopk": lambda: Compression.gtopk(0.02),
    "topk": lambda: Compression.topk(0.02),
    "randomk": lambda: Compression.sparse(0.02, sparsifier="randomk"),
    "gtopk-exact": lambda: Compression.gtopk(0.02, exact=True),
    "micro": lambda: Compression.micro(0.02),
    "exdyna": lambda: Compression.exdyna(0.02, blocks=16),
    "sketch": lambda: Compression.sketch(0.02, columns=200),
    "warmup": lambda: Compression.gtopk(0.02, warmup_densities=(0.2, 0.05), warmup_steps=4),
}


def gradient(rank: int, step: int) -> np.ndarray:
    g = (np.random.default_rng([rank, step]).standard_normal(D) * (1 + step)).astype(np.float32)
    if rank == 1 and step == NAN_AT:
        g[17] = np.nan
    return g


def record(sparse: SparseStep, update: np.ndarray) -> tuple:
    return (update.tobytes(), sparse.residual.tobytes(), sparse.step_count,
            sparse.skipped_steps, repr(copy.deepcopy(sparse.scheme.state_dict())))


def run(make: object, workers: int, tentative: bool) -> list:
    def work(transport: object) -> list:
        sparse = SparseStep(make(), [D], transport)
        assert can_step_tentatively(sparse)
        steps = []
        for step in range(STEPS):
            buffer = gradient(transport.rank, step)
            if tentative:
                finite = bool(np.isfinite(buffer).all())
                early = TentativeStep(sparse, buffer, finite)
                early.run()
                if count_workers(transport, not finite) > 0:
                    early.discard()
                else:
                    early.commit()
            else:
                sparse.update(buffer, buffer, clear_gradient=True)
            steps.append(record(sparse, buffer))
        return steps

    return ThreadGroup(workers).run(work)


@pytest.mark.parametrize("workers", [1, 3])
@pytest.mark.parametrize("scheme", list(SCHEMES))
def test_a_tentative_step_commits_and_discards_as_the_step_decides(scheme: str,
                                                                   workers: int) -> None:
    deciding = run(SCHEMES[scheme], workers, tentative=False)
    tentative = run(SCHEMES[scheme], workers, tentative=True)
    for rank in range(workers):
        for step in range(STEPS):
            assert tentative[rank][step] == deciding[rank][step], (rank, step)
        skipped = tentative[rank][NAN_AT]
        before = tentative[rank][NAN_AT - 1]
        if workers > 1:  # worker 1's NaN skips the step everywhere; nothing changed
            assert np.isnan(np.frombuffer(skipped[0], np.float32)).all()
            assert skipped[1:3] == before[1:3] and skipped[4] == before[4]
            assert skipped[3] == before[3] + 1
        assert tentative[rank][-1][2] == STEPS - (workers > 1)


@pytest.mark.parametrize("config", [Compression.topk(0.02, momentum_correction=True),
                                    Compression.oktopk(0.02)])
def test_what_cannot_step_tentatively_is_refused(config: object) -> None:
    def work(transport: object) -> None:
        sparse = SparseStep(config, [D], transport)
        assert not can_step_tentatively(sparse)
        with pytest.raises(ValueError, match="tentative step needs"):
            TentativeStep(sparse, np.zeros(D, np.float32), True)

    ThreadGroup(1).run(work)
