"""The non-finite rule of the sparse step (gtopk_hvd.core, `nonfinite=`), on workers that
are threads of this process (tests/helpers/thread_transport.py), every scheme, sparsifier and
reduction, with the state in numpy arrays, in CPU torch tensors, and in CPU tensors that refuse
what CUDA tensors refuse (tests/helpers/device_like.py: where a GPU's state would fail):

- "propagate": one worker's NaN / Inf makes every worker skip the step alike: update all NaN,
  residual and velocity bit-equal to before, step count (warm-up) unchanged, gradient cleared
  when asked; the run then goes on exactly as a run that never saw the bad step.
- "raise": every worker raises FloatingPointError at that step.
- ops.all_finite equals numpy's isfinite on every dtype and array type.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers.device_like import device_like, device_like_cpu
from helpers.thread_transport import ThreadGroup

from gtopk_hvd import ops
from gtopk_hvd.compression import Compression, SparseCompression
from gtopk_hvd.core import SparseStep
from gtopk_hvd.nonfinite import count_nonfinite_workers

D = 1000
SIZES = [600, 400]
CHOICES = {
    "gtopk": Compression.gtopk(0.02, momentum_correction=True),
    "topk": Compression.topk(0.02, warmup_steps=1, warmup_densities=(0.1, 0.05)),
    "randomk": Compression.sparse(0.02, sparsifier="randomk", seed=3),
    "gtopk-bucket": Compression.gtopk(0.02, granularity="bucket"),
    "gtopk-exact": Compression.gtopk(0.02, exact=True),
    "micro": Compression.micro(0.02, momentum_correction=True),
    "exdyna": Compression.exdyna(0.02, blocks=8),
    "sketch": Compression.sketch(0.02, columns=100),
    "oktopk": Compression.oktopk(0.02, reestimate_every=2),
}
STATES = ["numpy", "torch-cpu", "device-like-cpu"]


def _gradients(steps: int, workers: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((steps, workers, D)).astype(np.float32)


def _run(compression: SparseCompression, gradients: np.ndarray, workers: int,
         state_in: str = "numpy", wrap: object = lambda tensor: tensor) -> list[dict]:
    """Every worker's updates, residual and velocity snapshots and step counts, per step, as
    numpy; the step's state (and the gradient and update buffers) in `state_in` (STATES)."""
    if state_in == "device-like-cpu":
        with device_like_cpu():
            return _run(compression, gradients, workers, "torch-cpu", device_like)
    on_torch = state_in == "torch-cpu"

    def array(values: np.ndarray) -> object:
        return wrap(torch.from_numpy(values)) if on_torch else values

    def host(values: object) -> np.ndarray:
        return values.cpu().numpy().copy() if on_torch else values.copy()

    def work(transport: object) -> dict:
        state = SparseStep(compression, SIZES, transport, device="cpu" if on_torch else None)
        record: dict = {"updates": [], "residuals": [], "velocities": [], "steps": [],
                        "skipped": [], "cleared": []}
        for step_gradients in gradients:
            gradient = array(step_gradients[transport.rank].copy())
            update = state.update(gradient, array(np.empty(D, np.float32)),
                                  clear_gradient=True)
            record["updates"].append(host(update))
            record["residuals"].append(host(state.residual))
            record["velocities"].append(None if state.velocity is None
                                        else host(state.velocity))
            record["steps"].append(state.step_count)
            record["skipped"].append(state.last_stats.skipped)
            record["cleared"].append(not host(gradient).any())
        return record

    return ThreadGroup(workers).run(work)


@pytest.mark.parametrize("state_in", STATES)
@pytest.mark.parametrize("name", sorted(CHOICES))
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_propagate_skips_the_step_on_every_worker_and_loses_nothing(name: str, bad: float,
                                                                    state_in: str) -> None:
    workers, steps, bad_step = 3, 6, 3
    compression = CHOICES[name]
    clean = _gradients(steps, workers)
    poisoned = clean.copy()
    poisoned[bad_step, 1, 17] = bad  # worker 1 only
    runs = _run(compression, poisoned, workers, state_in)
    # The reference: the same run without the bad step at all, on numpy state.
    reference = _run(compression, np.delete(clean, bad_step, axis=0), workers)
    for rank, (run, ref) in enumerate(zip(runs, reference)):
        assert run["skipped"] == [step == bad_step for step in range(steps)]
        assert np.isnan(run["updates"][bad_step]).all(), rank
        assert all(run["cleared"]), "the gradient is cleared on a skipped step too"
        before, at = bad_step - 1, bad_step
        assert run["residuals"][at].tobytes() == run["residuals"][before].tobytes(), rank
        if run["velocities"][at] is not None:
            assert run["velocities"][at].tobytes() == run["velocities"][before].tobytes()
        assert run["steps"][at] == run["steps"][before] == bad_step
        kept = [s for s in range(steps) if s != bad_step]
        for mine, theirs in zip([run["updates"][s] for s in kept], ref["updates"]):
            assert mine.tobytes() == theirs.tobytes(), (rank, "the run after the skip differs")
        for mine, theirs in zip([run["residuals"][s] for s in kept], ref["residuals"]):
            assert mine.tobytes() == theirs.tobytes()


@pytest.mark.parametrize("name", sorted(CHOICES))
def test_raise_raises_on_every_worker(name: str) -> None:
    workers = 2
    compression = SparseCompression(**{**CHOICES[name].__dict__, "nonfinite": "raise"})
    gradients = _gradients(3, workers)
    gradients[1, 0, :] = np.inf  # all of worker 0's entries: random-k draws one at once

    def work(transport: object) -> str:
        state = SparseStep(compression, SIZES, transport)
        try:
            for step_gradients in gradients:
                state.update(step_gradients[transport.rank].copy(),
                              np.empty(D, np.float32))
        except FloatingPointError as error:
            return str(error)
        return "no error"

    for message in ThreadGroup(workers).run(work):
        assert "non-finite" in message and "step 1" in message, message


def test_the_rule_is_part_of_the_agreement_check() -> None:
    def work(transport: object) -> str:
        compression = Compression.gtopk(0.1, nonfinite="raise" if transport.rank else
                                        "propagate")
        state = SparseStep(compression, SIZES, transport)
        try:
            state.update(np.ones(D, np.float32), np.empty(D, np.float32))
        except ValueError as error:
            return str(error)
        return "agreed"

    for message in ThreadGroup(2).run(work):
        assert "workers disagree" in message, message


def test_bad_rule_is_named() -> None:
    with pytest.raises(ValueError, match="nonfinite must be one of"):
        Compression.topk(0.01, nonfinite="ignore")


def test_nonfinite_workers_counts_each_worker_once() -> None:
    def work(transport: object) -> int:
        gradients = [np.ones(10, np.float32), np.ones(5, np.float64)]
        if transport.rank in (1, 3):
            gradients[transport.rank // 2][2] = np.nan
        return count_nonfinite_workers(transport, gradients)

    assert ThreadGroup(4).run(work) == [2, 2, 2, 2]


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
@pytest.mark.parametrize("bad", [None, np.nan, np.inf, -np.inf, "max"])
@pytest.mark.parametrize("kind", ["numpy", "torch", "strided"])
def test_all_finite_equals_numpy(dtype: type, bad: object, kind: str) -> None:
    x = np.random.default_rng(1).standard_normal(100_003).astype(dtype)
    if bad == "max":
        x[5] = np.finfo(dtype).max  # the largest finite value is finite
        x[6] = -np.finfo(dtype).max
    elif bad is not None:
        x[99_999] = bad
    expected = bool(np.isfinite(x).all())
    if kind == "torch":
        x = torch.from_numpy(x)
    elif kind == "strided":
        x = x[::2] if bad is None or bad == "max" else x[1::2]
        expected = bool(np.isfinite(x).all())
    assert ops.all_finite(x) == expected
    assert ops.all_finite(np.empty(0, dtype))
