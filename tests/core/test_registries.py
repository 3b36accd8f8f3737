"""Sparsifiers, reductions and transports chosen by name; random-k as the example of a
sparsifier added in one file (checked against a numpy replay of its definition)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from helpers.thread_transport import ThreadGroup

from gtopk_hvd.compression import Compression
from gtopk_hvd.core import SparseStep
from gtopk_hvd.schemes import check_config
from gtopk_hvd.sparsifiers import SPARSIFIERS, Sparsifier
from gtopk_hvd.transports import resolve_transport


@pytest.mark.parametrize("options,message", [
    ({"sparsifier": "nope"}, r"sparsifier must be one of 'randomk', 'topk', got str 'nope'"),
    ({"reduction": "nope"},
     r"reduction must be one of 'allgather', 'allreduce', 'gtopk', got str 'nope'"),
    ({"sparsifier": "topk", "reduction": "allreduce"}, "picks the same ones on every worker"),
    ({"sparsifier": "randomk", "wire_dtype": "float16"},
     "wire_dtype must be 'float32' with reduction 'allreduce', got str 'float16'"),
])
def test_bad_names_and_combinations_are_named(options: dict, message: str) -> None:
    """Names and combinations are checked when the configuration is made (and again by
    check_config where a step is built)."""
    with pytest.raises(ValueError, match=message):
        Compression.sparse(0.1, **options)
    assert check_config(Compression.sparse(0.1, sparsifier="randomk")).__name__ == "SelectReduce"


def test_ranges_are_checked_when_the_configuration_is_made() -> None:
    with pytest.raises(ValueError, match="seed"):
        Compression.sparse(0.1, sparsifier="randomk", seed=-1)


def test_transport_names_and_types_are_checked() -> None:
    known = "known: horovod, local, mpi, torch"
    with pytest.raises(ValueError, match=f"unknown transport 'carrier-pigeon'; {known}"):
        resolve_transport("carrier-pigeon")
    with pytest.raises(TypeError, match="MPITransport"):
        resolve_transport(object())
    group = ThreadGroup(1)
    transport = group.run(lambda t: t)[0]
    assert resolve_transport(transport) is transport


def randomk_replay(gradients: list[np.ndarray], density: float, seed: int, sizes: list[int],
                   steps: int) -> list[tuple[np.ndarray, np.ndarray, list[np.ndarray]]]:
    """Random-k with error feedback written out with numpy, per its definition: per step, per
    bucket, sorted indices drawn without replacement by default_rng([seed, step, part])."""
    workers, d = len(gradients), sum(sizes)
    residuals = [np.zeros(d, np.float32) for _ in range(workers)]
    history = []
    for step in range(steps):
        chosen, begin = [], 0
        for part, size in enumerate(sizes):
            k = max(1, math.ceil(density * size))
            draw = np.random.default_rng([seed, step, part]).choice(size, k, replace=False)
            chosen.append(np.sort(draw) + begin)
            begin += size
        indices = np.concatenate(chosen)
        total = np.zeros(indices.size, np.float32)
        for p in range(workers):
            residuals[p] += gradients[p][step]
            total += residuals[p][indices]
            residuals[p][indices] = 0
        history.append((indices, total / np.float32(workers), [r.copy() for r in residuals]))
    return history


@pytest.mark.parametrize("granularity,sizes", [("model", [300]), ("bucket", [40, 7, 253])])
def test_randomk_matches_its_numpy_replay_on_every_worker(granularity: str,
                                                          sizes: list[int]) -> None:
    workers, steps, density, seed = 3, 6, 0.05, 11
    generator = np.random.default_rng(0)
    gradients = [generator.standard_normal((steps, sum(sizes))).astype(np.float32)
                 for _ in range(workers)]
    compression = Compression.sparse(density, sparsifier="randomk", seed=seed,
                                     granularity=granularity)

    def work(transport: object) -> list:
        state = SparseStep(compression, sizes, transport)
        out = []
        for step in range(steps):
            indices, values = state.update(gradients[transport.rank][step].copy())
            out.append((np.array(indices), np.array(values), state.residual.copy()))
        return out

    results = ThreadGroup(workers).run(work)
    expected = randomk_replay(gradients, density, seed, sizes, steps)
    for step, (want_indices, want_values, want_residuals) in enumerate(expected):
        for rank in range(workers):
            indices, values, residual = results[rank][step]
            np.testing.assert_array_equal(indices, want_indices, err_msg=f"step {step}")
            np.testing.assert_allclose(values, want_values, rtol=1e-6, atol=1e-6)
            np.testing.assert_array_equal(residual, want_residuals[rank])


def test_randomk_draws_every_index_about_equally_often() -> None:
    """Uniform without replacement: 400 steps of k = 5 of d = 50 pick each index ~40 times."""
    compression = Compression.sparse(0.1, sparsifier="randomk")
    counts = np.zeros(50, int)

    def work(transport: object) -> None:
        state = SparseStep(compression, [50], transport)
        for _ in range(400):
            indices, _ = state.update(np.zeros(50, np.float32))
            assert indices.size == 5 and np.all(np.diff(indices) > 0)
            counts[indices] += 1

    ThreadGroup(1).run(work)
    assert counts.sum() == 2000 and counts.min() >= 15 and counts.max() <= 70, counts


class FirstK(Sparsifier):
    """A sparsifier defined here, registered below: the first k entries."""

    def select(self, gradient: np.ndarray, residual: np.ndarray, k: int, clear_gradient: bool,
               step: int, part: int) -> tuple[np.ndarray, np.ndarray]:
        residual += gradient
        indices = np.arange(k)
        values = residual[:k].copy()
        residual[:k] = 0
        return indices, values


def test_a_new_sparsifier_is_one_class_and_its_registration() -> None:
    SPARSIFIERS.register("test-firstk")(FirstK)
    compression = Compression.sparse(0.25, sparsifier="test-firstk")  # gTop-k by default
    gradients = [np.arange(8, dtype=np.float32) + 10 * rank for rank in range(2)]

    def work(transport: object) -> tuple[np.ndarray, np.ndarray]:
        state = SparseStep(compression, [8], transport)
        return state.update(gradients[transport.rank].copy())

    for indices, values in ThreadGroup(2).run(work):
        np.testing.assert_array_equal(indices, [0, 1])
        np.testing.assert_array_equal(values, (gradients[0][:2] + gradients[1][:2]) / 2)
