"""The step's writes of a sparse set into dense vectors, on the host (numpy and CPU tensors):
`ops.write_sparse` (its `zeroed` hint, its skip flag), `ops.restore_unselected` and `ops.take_at`
against numpy,
and the contract the `zeroed` hint rests on: every scheme, asked to clear the gradient, leaves it
all zeros, so `SparseStep.update` writing over the gradient it was given need not zero it again.
The CUDA kernels are checked against the same references in tests/ops/test_ops_cuda.py."""

from __future__ import annotations

from functools import partial

import numpy as np
import pytest

from gtopk_hvd import ops
from gtopk_hvd.bench.memory import MEASURED as MEMORY_SCHEMES
from gtopk_hvd.compression import Compression
from gtopk_hvd.core.step import SparseStep
from gtopk_hvd.transports.local import LocalGroup

torch = pytest.importorskip("torch")

RNG = np.random.default_rng(20261127)


def sparse_set(d: int, n: int, dtype: type) -> tuple[np.ndarray, np.ndarray]:
    indices = np.sort(RNG.choice(d, n, replace=False)).astype(np.int32)
    return indices, RNG.standard_normal(n).astype(dtype)


def as_kind(x: np.ndarray, kind: str):
    return torch.from_numpy(x.copy()) if kind == "torch" else x.copy()


def host(x) -> np.ndarray:
    return x.numpy() if hasattr(x, "numpy") else x


@pytest.mark.parametrize("kind", ["numpy", "torch"])
@pytest.mark.parametrize("skip", [None, 0, 1])
@pytest.mark.parametrize("zeroed", [False, True])
def test_write_sparse_writes_the_set_over_zeros_or_nan_when_skipped(kind: str, skip: int | None,
                                                                     zeroed: bool) -> None:
    d = 10_007
    indices, values = sparse_set(d, 97, np.float32)
    dest = np.zeros(d, np.float32) if zeroed else RNG.standard_normal(d).astype(np.float32)
    dest = as_kind(dest, kind)
    flag = None if skip is None else as_kind(np.array([skip], np.int32), kind)
    ops.write_sparse(dest, as_kind(indices, kind), as_kind(values, kind), flag, zeroed=zeroed)
    if skip:
        assert np.isnan(host(dest)).all()
        return
    expected = np.zeros(d, np.float32)
    expected[indices] = values
    assert host(dest).tobytes() == expected.tobytes()


@pytest.mark.parametrize("kind", ["numpy", "torch"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("selected_share", [0.0, 0.3, 1.0])
@pytest.mark.parametrize("skip", [None, 0, 1])
def test_restore_unselected_adds_back_what_the_global_set_dropped(
        kind: str, dtype: type, selected_share: float, skip: int | None) -> None:
    d, n = 5_003, 400
    indices, values = sparse_set(d, n, dtype)
    kept = np.sort(RNG.choice(indices, int(selected_share * n), replace=False))
    others = np.setdiff1d(np.arange(d), indices)[:50]  # global entries this worker did not send
    selected = np.union1d(kept, others).astype(np.int32)
    residual = RNG.standard_normal(d).astype(dtype)
    expected = residual.copy()
    if not skip:
        dropped = ~np.isin(indices, selected)
        expected[indices[dropped]] += values[dropped]
    got = as_kind(residual, kind)
    flag = None if skip is None else as_kind(np.array([skip], np.int32), kind)
    ops.restore_unselected(got, as_kind(indices, kind), as_kind(values, kind),
                           as_kind(selected, kind), flag)
    assert host(got).tobytes() == expected.tobytes()


def take_at_reference(residual: np.ndarray, indices: np.ndarray, taken: tuple | None,
                      skip: bool) -> tuple[np.ndarray, np.ndarray]:
    """(values, residual after) of `ops.take_at`, entry by entry."""
    residual = residual.copy()
    found = {} if taken is None else dict(zip(taken[0].tolist(), taken[1]))
    values = np.array([residual[i] + found[i] if i in found else residual[i]
                       for i in indices.tolist()], residual.dtype)
    if not skip:
        residual[indices] = 0
    return values, residual


@pytest.mark.parametrize("kind", ["numpy", "torch"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("index_dtype", [np.int32, np.int64])
@pytest.mark.parametrize("n,taken_share", [(300, None), (300, 0.0), (300, 0.4), (300, 1.0),
                                           (0, None), (0, 0.4)])
@pytest.mark.parametrize("skip", [None, 0, 1])
def test_take_at_gathers_the_set_adds_what_was_taken_and_clears_it(
        kind: str, dtype: type, index_dtype: type, n: int, taken_share: float | None,
        skip: int | None) -> None:
    """`ops.take_at` against an entry-by-entry reference: the residual's values at the set,
    plus the taken value where an index was taken (taken entries outside the set ignored), the
    set cleared unless the flag is set; an empty set, an empty taken set."""
    d = 5_003
    indices = sparse_set(d, n, dtype)[0].astype(index_dtype)
    taken = None
    if taken_share is not None:
        inside = RNG.choice(indices, int(taken_share * n), replace=False)
        outside = np.setdiff1d(np.arange(d), indices)[::97][:20]
        taken_indices = np.union1d(inside, outside).astype(index_dtype)
        taken = (taken_indices, RNG.standard_normal(taken_indices.size).astype(dtype))
    residual = RNG.standard_normal(d).astype(dtype)
    want_values, want_residual = take_at_reference(residual, indices, taken, bool(skip))
    got = as_kind(residual, kind)
    flag = None if skip is None else as_kind(np.array([skip], np.int32), kind)
    values = ops.take_at(got, as_kind(indices, kind),
                         None if taken is None else tuple(as_kind(t, kind) for t in taken), flag)
    assert type(values) is type(got)
    assert host(values).tobytes() == want_values.tobytes()
    assert host(got).tobytes() == want_residual.tobytes()


def test_take_at_refuses_values_it_cannot_add() -> None:
    residual = torch.zeros(10, dtype=torch.bfloat16)
    with pytest.raises(TypeError, match="float32 or float64, got bfloat16"):
        ops.take_at(residual, torch.tensor([1, 2]))
    with pytest.raises(TypeError, match="taken values are float64, the residual float32"):
        ops.take_at(np.zeros(10, np.float32), np.array([1, 2]),
                    (np.array([1]), np.array([1.0])))


CLEARING = {**{name: partial(Compression.scheme, name) for name in MEMORY_SCHEMES},
            "sketch": lambda density, **options: Compression.sketch(density, columns=64,
                                                                    **options),
            "oktopk": lambda density, **options: Compression.oktopk(density, **options)}


@pytest.mark.parametrize("workers", [1, 3])
@pytest.mark.parametrize("state", ["numpy", "cpu"])
@pytest.mark.parametrize("scheme", sorted(CLEARING))
def test_every_scheme_leaves_a_gradient_it_may_clear_all_zeros(scheme: str, state: str,
                                                               workers: int) -> None:
    """What `SparseStep.update`'s `zeroed` hint to `ops.write_sparse` relies on, for every
    built-in scheme with and without momentum correction and predivision: after a step with
    clear_gradient, the gradient holds zeros only, and the update written over it equals the
    update written into a fresh buffer by a twin step."""
    d = 4_000
    group = LocalGroup(workers)
    try:
        for momentum, predivide in ((False, 1.0), (True, 1.0), (False, 2.0)):
            config = CLEARING[scheme](0.02, momentum_correction=momentum)
            device = None if state == "numpy" else "cpu"
            made = group.run(lambda rank, config=config, device=device, predivide=predivide:
                             _cleared_after_step(config, d, group, rank, device, predivide))
            assert all(made), (scheme, state, momentum, predivide)
    finally:
        group.close()


def _cleared_after_step(config, d: int, group: LocalGroup, rank: int, device,
                        predivide: float) -> bool:
    """Two twin steps on one worker, three iterations: one writes its update over the gradient
    it clears, the other into a fresh buffer from an untouched copy; both updates equal, and the
    cleared gradient all zeros after `step` too."""
    twins = [SparseStep(config, [d], group.transports[rank], device=device, predivide=predivide)
             for _ in range(2)]
    rng = np.random.default_rng(rank)
    same = True
    for _ in range(3):
        fresh = rng.standard_normal(d).astype(np.float32)
        over, kept = fresh.copy(), fresh.copy()
        out = np.empty_like(fresh)
        if device is not None:
            over, kept, out = torch.from_numpy(over), torch.from_numpy(kept), torch.empty(d)
        twins[0].update(over, over, clear_gradient=True)
        twins[1].update(kept, out)
        same &= host(over).tobytes() == host(out).tobytes()
    cleared = fresh.copy() if device is None else torch.from_numpy(fresh.copy())
    twins[0].update(cleared, clear_gradient=True)
    return same and not host(cleared).any()
