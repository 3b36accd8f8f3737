"""Run by scripts/studies/emulated_cluster.py in the tests: each rank reports its network namespace,
its address and its link's queueing discipline, then sends BYTES to the next rank over MPI."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
from mpi4py import MPI

BYTES = 4_000_000

comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()
address = subprocess.run(["ip", "-4", "-o", "addr", "show", "dev", "eth0"], capture_output=True,
                         text=True).stdout.split()[3]
qdisc = " ".join(subprocess.run(["tc", "qdisc", "show", "dev", "eth0"], capture_output=True,
                                text=True).stdout.split())
send = np.full(BYTES, rank, dtype=np.uint8)
receive = np.empty(BYTES, dtype=np.uint8)
comm.Sendrecv(send, (rank + 1) % size, 0, receive, (rank - 1) % size, 0)
assert (receive == (rank - 1) % size).all()
line = (f"PROBE rank={rank} netns={os.readlink('/proc/self/ns/net')} address={address} "
        f"qdisc={qdisc!r}")
sys.stdout.write(line + "\n")
sys.stdout.flush()
