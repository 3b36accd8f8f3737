"""Launch mistakes are errors that name the fix: the MPI transport asked for under
`horovodrun --gloo` (no MPI world) and a missing hvd.init()."""

from __future__ import annotations

import re
import sys
import time
from pathlib import Path

import pytest
from helpers.mpi_launcher import MPI_PROGRAMS, run_with_time_limit

pytestmark = pytest.mark.mpi  # launches horovodrun and fresh interpreters

TIMEOUT_S = 120


def test_the_mpi_transport_under_horovodrun_gloo_fails_on_every_worker_naming_the_fix() -> None:
    horovodrun = Path(sys.executable).with_name("horovodrun")  # the venv's, next to python
    assert horovodrun.exists(), horovodrun
    command = [str(horovodrun), "--gloo", "-np", "2", "-H", "localhost:2", sys.executable,
               str(MPI_PROGRAMS / "gloo_sparse_optimizer.py")]
    start = time.monotonic()
    returncode, output = run_with_time_limit(command, TIMEOUT_S, "horovodrun --gloo -np 2")
    assert time.monotonic() - start < TIMEOUT_S
    assert returncode != 0, output[-3000:]
    assert "built the optimizer" not in output, output[-3000:]
    for rank in (0, 1):
        refused = re.search(rf"rank {rank} of 2 refused: (.*)", output)
        assert refused, f"rank {rank} printed no refusal:\n{output[-3000:]}"
        message = refused.group(1)
        assert "Launch with mpirun" in message and "not `horovodrun --gloo`" in message, message
        assert f"Horovod rank {rank} of 2" in message, message


# Run in a fresh interpreter: this test process may have called hvd.init() already.
WITHOUT_INIT = {
    "torch": """
import torch
import gtopk_hvd.torch as gtopk
model = torch.nn.Linear(4, 2)
gtopk.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                           named_parameters=model.named_parameters(),
                           compression=gtopk.Compression.gtopk(density=0.1))
print("built without hvd.init()")
""",
    "tensorflow": """
import tensorflow as tf
import gtopk_hvd.tensorflow as gtopk

variable = tf.Variable(tf.ones([4]))
with tf.GradientTape() as tape:
    loss = tf.reduce_sum(variable * variable)
tape = gtopk.DistributedGradientTape(tape, compression=gtopk.Compression.gtopk(density=0.1))
tape.gradient(loss, [variable])
print("built without hvd.init()")
""",
}


@pytest.mark.parametrize("framework", sorted(WITHOUT_INIT))
def test_a_missing_hvd_init_is_named(framework: str) -> None:
    pytest.importorskip(framework)
    returncode, output = run_with_time_limit([sys.executable, "-c", WITHOUT_INIT[framework]],
                                             TIMEOUT_S, f"{framework} without hvd.init()")
    assert returncode != 0 and "built without" not in output, output[-3000:]
    last_line = output.strip().splitlines()[-1]
    assert "hvd.init()" in last_line, output[-3000:]
