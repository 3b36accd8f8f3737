"""The gTop-k all-reduce and its baselines, under mpirun for many worker counts."""

from __future__ import annotations

import numpy as np
import pytest
from helpers.mpi_launcher import run_mpi

from gtopk_hvd.wire import WireFormat


@pytest.mark.mpi
@pytest.mark.parametrize("workers", [1, 2, 3, 4, 5, 6, 8])
def test_gtopk_allreduce_matches_replay_on_every_worker(workers: int) -> None:
    output = run_mpi("mpi_gtopk_reduction.py", workers, timeout_s=600)
    assert f"gtopk reduction ok on {workers} workers over mpi" in output


@pytest.mark.mpi
@pytest.mark.parametrize(("launcher", "workers", "transport"), [
    ("horovodrun", 4, "horovod"),  # horovodrun --gloo: no MPI world at all
    ("horovodrun", 3, "horovod"),  # non-power-of-two: idle workers join the fold phases
    ("mpirun", 3, "horovod"),      # Horovod's collectives over its MPI controller
    ("torchrun", 4, "torch"),      # torch.distributed over Gloo
    ("torchrun", 3, "torch"),
])
def test_gtopk_allreduce_matches_replay_over_other_transports(launcher: str, workers: int,
                                                              transport: str) -> None:
    output = run_mpi("mpi_gtopk_reduction.py", workers, "--transport", transport,
                     timeout_s=600, launcher=launcher)
    assert f"gtopk reduction ok on {workers} workers over {transport}" in output


@pytest.mark.parametrize("value_type", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("index_dtype", [np.int32, np.int64])
def test_wire_roundtrip(value_type: str, index_dtype: type) -> None:
    wire = WireFormat(np.dtype(index_dtype), value_type)
    indices = np.array([0, 5, 9, 2**30], dtype=index_dtype)
    values = np.array([1.5, -np.inf, np.nan, 3.0e-3], dtype=np.float32)
    buffer = np.empty(4 * wire.entry_bytes, np.uint8)
    n_bytes = wire.pack(indices, values, buffer)
    assert n_bytes == 4 * (np.dtype(index_dtype).itemsize + (4 if value_type == "float32" else 2))
    got_indices, got_values = wire.unpack(buffer, n_bytes)
    np.testing.assert_array_equal(got_indices, indices)
    np.testing.assert_array_equal(got_values, wire.round_values(values))
    assert got_values[0] == 1.5 and np.isneginf(got_values[1]) and np.isnan(got_values[2])


def test_bfloat16_rounding_matches_ml_dtypes() -> None:
    ml_dtypes = pytest.importorskip("ml_dtypes")
    values = np.random.default_rng(0).standard_normal(100_000).astype(np.float32) * 1e3
    values[:3] = [np.inf, -0.0, 65504.5]
    expected = values.astype(ml_dtypes.bfloat16).astype(np.float32)
    np.testing.assert_array_equal(WireFormat(np.dtype(np.int32), "bfloat16").round_values(values),
                                  expected)


def test_bad_wire_dtype_is_named() -> None:
    with pytest.raises(ValueError, match="float64"):
        WireFormat(np.dtype(np.int32), "float64")
