"""Property tests of the gTop-k schedule, in one process (workers are threads), against the
numpy replay of tests/helpers/reference.py: any P, any set sizes, ties, wire dtypes."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from helpers.reference import gtopk_schedule_reference
from helpers.thread_transport import ThreadGroup
from hypothesis import given, settings
from hypothesis import strategies as st

from gtopk_hvd.reductions import GTopkReducer

ROUNDING = {
    "float32": lambda v: v,
    "float16": lambda v: v.astype(np.float16).astype(np.float32),
    "bfloat16": lambda v: v.astype(ml_dtypes.bfloat16).astype(np.float32),
}


@st.composite
def scenarios(draw: st.DrawFn) -> tuple:
    workers = draw(st.integers(1, 12))
    k = draw(st.integers(1, 24))
    d = draw(st.integers(1, 80))
    wire = draw(st.sampled_from(sorted(ROUNDING)))
    levels = draw(st.sampled_from([None, (-1.0, 1.0), (0.0,)]))  # None: continuous values
    sets = []
    for _ in range(workers):
        index = np.array(sorted(draw(st.sets(st.integers(0, d - 1), max_size=min(k, d)))),
                         dtype=np.int32)
        seed = draw(st.integers(0, 2**32 - 1))
        rng = np.random.default_rng(seed)
        if levels is None:
            value = rng.standard_normal(index.size) * 10.0 ** rng.uniform(-4, 4, index.size)
        else:
            value = rng.choice(levels, size=index.size)
        sets.append((index, value.astype(np.float32)))
    return workers, k, wire, sets


@settings(max_examples=150, deadline=None)
@given(scenarios())
def test_schedule_equals_replay_for_any_worker_count(scenario: tuple) -> None:
    workers, k, wire, sets = scenario
    def reduce(transport: object) -> object:
        return GTopkReducer(k, np.int32, wire, transport).allreduce(*sets[transport.rank])

    results = ThreadGroup(workers).run(reduce)
    entry_bytes = 4 + (4 if wire == "float32" else 2)
    expected, sent, received = gtopk_schedule_reference(sets, k, entry_bytes, ROUNDING[wire])
    for rank, result in enumerate(results):
        np.testing.assert_array_equal(result.indices, expected[rank][0])
        assert result.values.tobytes() == expected[rank][1].tobytes()
        assert result.values.tobytes() == results[0].values.tobytes()
        np.testing.assert_array_equal(result.survived, np.isin(sets[rank][0], result.indices))
        assert (result.stats.bytes_sent, result.stats.bytes_received) == (sent[rank],
                                                                          received[rank])


def test_torch_tensors_in_and_out() -> None:
    torch = __import__("pytest").importorskip("torch")
    from gtopk_hvd.reductions import gtopk_allreduce

    group = ThreadGroup(2)
    sets = [(torch.tensor([1, 5, 7], dtype=torch.int32), torch.tensor([1.0, -4.0, 2.0])),
            (torch.tensor([5, 6], dtype=torch.int32), torch.tensor([1.0, 3.0]))]
    results = group.run(lambda t: gtopk_allreduce(*sets[t.rank], k=3, transport=t))
    for result in results:
        assert isinstance(result.indices, torch.Tensor) and result.indices.device.type == "cpu"
        assert result.indices.tolist() == [5, 6, 7]  # sums: 1 -> 1, 5 -> -3, 6 -> 3, 7 -> 2
        assert result.values.tolist() == [-3.0, 3.0, 2.0]


@pytest.mark.parametrize("wait_probe", [True, False])
def test_every_worker_joins_every_phase_of_the_schedule(wait_probe: bool) -> None:
    """A collective transport (Horovod's alltoall) needs each phase called on every worker, idle
    ones included: fold-in, log2(P') rounds, fold-out, in the same order everywhere; with the
    wait probe each phase is preceded by its probe phase (tag + 10)."""
    for workers in range(1, 11):
        group = ThreadGroup(workers, check_phases=True)
        sets = [(np.array([rank, 20 + rank], dtype=np.int32), np.array([1.0, -2.0], np.float32))
                for rank in range(workers)]
        group.run(lambda t, sets=sets: GTopkReducer(2, np.int32, "float32", t,
                                                    wait_probe=wait_probe).allreduce(
            *sets[t.rank]))
        base = 1 << (workers.bit_length() - 1)
        folds = [1] if workers > base else []
        rounds = base.bit_length() - 1
        phases = [11] * len(folds) + [12] * rounds + [13] * len(folds)
        expected = [t for tag in phases for t in ((tag + 10, tag) if wait_probe else (tag,))]
        assert group.phases == expected, (workers, group.phases)
