"""One worker never reaches the reduction (stuck elsewhere, not dead): the others, waiting for
it in the transport, must end the job within the wait bound (GTOPK_HVD_WAIT_TIMEOUT, 5 s here)
with an error naming the wait. Transport-neutral (`--transport NAME`, tests/helpers/worlds.py);
tests/transports/test_failures.py launches it under torchrun (stuck_worker.py covers mpirun and
horovodrun through the optimizer). The job is expected to exit non-zero."""

from __future__ import annotations

import os
import time

os.environ["GTOPK_HVD_WAIT_TIMEOUT"] = "5"

import numpy as np  # noqa: E402
from helpers.worlds import world_from_arguments  # noqa: E402

from gtopk_hvd.reductions import gtopk_allreduce  # noqa: E402

world = world_from_arguments()
if world.rank == 1:
    print("worker 1 is stuck outside the training loop", flush=True)
    time.sleep(600)
indices, values = np.arange(8, dtype=np.int32), np.ones(8, dtype=np.float32)
gtopk_allreduce(indices, values, 8, transport=world.transport)
print("unreachable: every worker finished", flush=True)
