"""The DDP hook's early steps (gtopk_hvd.torch.early_steps): each bucket's step started as it
arrives, on the hook's thread, and committed or discarded at the last bucket, equal bit for bit
to every bucket held to the last.

Launches tests/mpi/torchrun_early_steps.py under torchrun (Gloo, CPU) at P = 2 and 3: for every
scheme a DDP model in several buckets trains with overlap=True and overlap=False from the same
weights on the same batches, rank 1's gradient holding a NaN once in an early bucket and once in
the last one. Asserted per scheme: the weights, every bucket's residual, step count and scheme
state bitwise equal in the two runs; the NaN iterations skipped by every worker in both; the
replicas identical; with nonfinite="raise" and the NaN, backward raising at the same iteration
on every worker in both runs; and steps started early exactly where the rules allow (none for
Ok-Topk and momentum correction, which are held; every bucket with nonfinite="raise").
"""

from __future__ import annotations

import re

import pytest
from helpers.mpi_launcher import run_mpi

LINE = re.compile(r"EARLY scheme=(?P<scheme>\S+) started=(?P<started>\d+) "
                  r"buckets=(?P<buckets>\d+) "
                  r"same=(?P<same>True|False) skipped=(?P<skipped>\[[^\]]*\]) "
                  r"held_skipped=(?P<held>\[[^\]]*\]) replicas=(?P<replicas>\S+)")
HELD = ("oktopk", "topk-momentum")  # cannot step tentatively
EVERY_BUCKET = ("gtopk-raise",)  # nonfinite="raise": no decision to wait for
RAISED = "gtopk-raise-nan"  # nonfinite="raise" with the NaN: backward raises on every worker
SCHEMES = ("gtopk", "topk", "randomk", "gtopk-exact", "micro", "exdyna", "sketch", *HELD,
           *EVERY_BUCKET, RAISED)
ITERATIONS, START_ITER = 10, 2  # torchrun_early_steps.py's, the hook's default
NAN_ITERATIONS = "[4, 7]"


@pytest.mark.mpi
@pytest.mark.parametrize("workers", [2, 3])
def test_early_steps_equal_the_held_steps_bit_for_bit(workers: int) -> None:
    output = run_mpi("torchrun_early_steps.py", workers, launcher="torchrun", timeout_s=600)
    found = {m["scheme"]: m for m in LINE.finditer(output)}
    assert sorted(found) == sorted(SCHEMES), f"{sorted(found)}\n{output[-4000:]}"
    sparse_iterations = ITERATIONS - START_ITER
    for scheme, m in found.items():
        where = f"{scheme}: {m.group(0)}"
        assert m["replicas"] == "identical", where
        if scheme == RAISED:  # in both runs at the same iteration (the state is then restored
            assert m["skipped"] == m["held"] == "['raised:4']", where  # from a checkpoint)
            continue
        assert m["same"] == "True", where
        started, buckets = int(m["started"]), int(m["buckets"])
        assert buckets >= 2, where
        if scheme in EVERY_BUCKET:
            assert m["skipped"] == m["held"] == "[]", where
            assert started == sparse_iterations * buckets, where
            continue
        assert m["skipped"] == m["held"] == NAN_ITERATIONS, where
        if scheme in HELD:
            assert started == 0, where
        else:  # every bucket but the last, every sparse iteration
            assert started == sparse_iterations * (buckets - 1), where
    assert f"early steps ok on {workers} workers" in output, output[-3000:]
