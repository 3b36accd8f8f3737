"""The warning for an aggressive density without a warm-up (gtopk_hvd/core/warmup_warning.py):
once per process, from SparseStep (the one place every adapter and the DDP hook pass through),
naming the fix; the step's numerics are unchanged."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from helpers.thread_transport import ThreadGroup, ThreadTransport

from gtopk_hvd.compression import DGC_WARMUP, Compression, SparseCompression
from gtopk_hvd.core import SparseStep, warmup_warning


@pytest.fixture(autouse=True)
def _not_yet_warned(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test starts as a fresh process would: no warning issued yet."""
    monkeypatch.setattr(warmup_warning, "_density_warning_issued", False)


def build(compression: SparseCompression,
          caught: list[warnings.WarningMessage] | None = None) -> list[str]:
    """The UserWarning messages emitted while a SparseState is built (every filter: always);
    the warnings themselves are appended to `caught` if given."""
    transport = ThreadTransport(ThreadGroup(1), 0)
    with warnings.catch_warnings(record=True) as recorded:
        warnings.simplefilter("always")
        SparseStep(compression, [40_000, 960], transport)
    user_warnings = [w for w in recorded if issubclass(w.category, UserWarning)]
    if caught is not None:
        caught.extend(user_warnings)
    return [str(w.message) for w in user_warnings]


def test_warns_once_per_process_naming_the_fix() -> None:
    caught: list[warnings.WarningMessage] = []
    first = build(Compression.gtopk(density=0.001), caught)
    assert len(first) == 1, first
    assert caught[0].filename == __file__  # the user's line, not gtopk_hvd's internals
    message = first[0]
    assert "density 0.001 is below 0.01" in message
    assert ("warmup_steps=<steps per stage>, "
            "warmup_densities=gtopk_hvd.compression.DGC_WARMUP") in message
    assert "momentum_correction=True" in message
    # Once per process: later optimizers, tapes and states stay quiet, whatever the density.
    assert build(Compression.gtopk(density=0.001)) == []
    assert build(Compression.topk(density=0.0001)) == []


@pytest.mark.parametrize("compression", [
    Compression.topk(density=0.005),
    Compression.sparse(0.002, sparsifier="randomk"),
    # warmup_steps without stages is no warm-up (density_at is the density from step 0)
    Compression.gtopk(density=0.001, warmup_steps=100),
])
def test_every_sparse_scheme_below_the_threshold_warns(compression: SparseCompression) -> None:
    assert len(build(compression)) == 1


@pytest.mark.parametrize("compression", [
    Compression.gtopk(density=warmup_warning.WARMUP_DENSITY_THRESHOLD),
    Compression.gtopk(density=0.05),
    Compression.topk(density=1.0),
    Compression.gtopk(density=0.001, warmup_steps=50, warmup_densities=DGC_WARMUP),
    Compression.gtopk(density=0.001, momentum_correction=True),
])
def test_no_warning_at_or_above_the_threshold_or_with_a_remedy(
        compression: SparseCompression) -> None:
    assert build(compression) == []
    assert not warmup_warning._density_warning_issued  # a later aggressive density still warns
    assert len(build(Compression.gtopk(density=0.001))) == 1


def test_the_warning_leaves_the_step_unchanged() -> None:
    """Same update with the warning shown or already spent (it only tells)."""
    gradient = np.random.default_rng(0).standard_normal(41_000).astype(np.float32)
    updates = []
    for _ in range(2):
        transport = ThreadTransport(ThreadGroup(1), 0)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            state = SparseStep(Compression.gtopk(density=0.001), [41_000], transport)
        indices, values = state.update(gradient.copy())
        updates.append((indices.copy(), values.copy()))
    assert warmup_warning._density_warning_issued
    np.testing.assert_array_equal(updates[0][0], updates[1][0])
    assert updates[0][1].tobytes() == updates[1][1].tobytes()
    assert updates[0][0].size == 41  # k = ceil(0.001 * 41,000): the density is not changed
