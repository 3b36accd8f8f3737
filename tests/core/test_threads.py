"""gtopk_hvd.threads: the kernels' thread count by cores per local rank; the user's setting wins."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from gtopk_hvd import threads


@pytest.mark.parametrize(("environ", "ranks"), [
    ({}, 1),
    ({"OMPI_COMM_WORLD_LOCAL_SIZE": "4"}, 4),
    ({"MPI_LOCALNRANKS": "3"}, 3),
    ({"HOROVOD_LOCAL_SIZE": "2"}, 2),
    ({"LOCAL_WORLD_SIZE": "8"}, 8),
    ({"OMPI_COMM_WORLD_LOCAL_SIZE": "junk", "LOCAL_WORLD_SIZE": "2"}, 2),
])
def test_local_ranks_from_the_launcher(environ: dict, ranks: int) -> None:
    assert threads.local_ranks(environ) == ranks


def test_default_threads_share_the_cores(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(threads, "usable_cores", lambda: (8, False))
    assert threads.default_threads({"OMPI_COMM_WORLD_LOCAL_SIZE": "4"}) == 2
    assert threads.default_threads({"OMPI_COMM_WORLD_LOCAL_SIZE": "16"}) == 1
    assert threads.default_threads({}) == 8
    monkeypatch.setattr(threads, "usable_cores", lambda: (2, True))  # pinned by the launcher
    assert threads.default_threads({"OMPI_COMM_WORLD_LOCAL_SIZE": "4"}) == 2


def kernel_settings(extra: dict) -> list[str]:
    """(threads, OMP_WAIT_POLICY) seen by a fresh process that imports gtopk_hvd.ops."""
    environ = {key: value for key, value in os.environ.items()
               if key not in ("OMP_NUM_THREADS", "OMP_WAIT_POLICY")
               and key not in threads.LOCAL_SIZE_VARIABLES}
    environ.update(extra)
    code = ("import os; from gtopk_hvd import ops; "
            "print(ops.get_num_threads(), os.environ.get('OMP_WAIT_POLICY'))")
    result = subprocess.run([sys.executable, "-c", code], env=environ, capture_output=True,
                            text=True, check=True)
    return result.stdout.split()


def test_ranks_sharing_a_machine_get_their_share_and_sleep_when_idle() -> None:
    cores, pinned = threads.usable_cores()
    expected = cores if pinned else max(1, cores // 4)
    assert kernel_settings({"OMPI_COMM_WORLD_LOCAL_SIZE": "4"}) == [str(expected), "passive"]
    assert kernel_settings({}) == [str(cores), "None"]


def test_the_users_settings_win() -> None:
    assert kernel_settings({"OMP_NUM_THREADS": "3", "OMPI_COMM_WORLD_LOCAL_SIZE": "4",
                            "OMP_WAIT_POLICY": "active"}) == ["3", "active"]
