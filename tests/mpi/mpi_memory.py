"""Under mpirun: 1000 optimizer steps with gTop-k allocate nothing that stays (buffers reused).

Measured between step 100 and step 1000: memory traced by tracemalloc (numpy's buffers are
traced; a leaked k-entry set per step would add 900 x 8k bytes) and the process's RSS.
"""

from __future__ import annotations

import gc
import tracemalloc

import horovod.torch as hvd
import psutil
import torch
from harness import run_on_all_ranks

import gtopk_hvd.torch as gtopk

D_HIDDEN = 256  # about 100k parameters, k = 1000 at density 0.01


def main() -> None:
    hvd.init()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, D_HIDDEN), torch.nn.ReLU(),
                                torch.nn.Linear(D_HIDDEN, 128))
    optimizer = gtopk.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9),
        named_parameters=model.named_parameters(),
        compression=gtopk.Compression.gtopk(density=0.01))
    x = torch.randn(16, 256, generator=torch.Generator().manual_seed(hvd.rank()))
    process = psutil.Process()

    def steps(n: int) -> None:
        for _ in range(n):
            optimizer.zero_grad()
            model(x).square().mean().backward()
            optimizer.step()

    tracemalloc.start()
    steps(100)
    gc.collect()
    traced_before, rss_before = tracemalloc.get_traced_memory()[0], process.memory_info().rss
    steps(900)
    gc.collect()
    traced_after, rss_after = tracemalloc.get_traced_memory()[0], process.memory_info().rss
    k = optimizer.last_stats.k
    traced_growth, rss_growth = traced_after - traced_before, rss_after - rss_before
    # A leak of one k-entry set per step would be 900 * 8k = 7.2 MB here.
    assert traced_growth < 8 * k * 20, f"traced memory grew by {traced_growth} bytes"
    assert rss_growth < 4 * 2**20, f"RSS grew by {rss_growth / 2**20:.1f} MiB"
    print(f"[rank {hvd.rank()}] memory ok: traced {traced_growth:+} B, RSS "
          f"{rss_growth / 2**20:+.2f} MiB over 900 steps (k={k})", flush=True)


if __name__ == "__main__":
    run_on_all_ranks(main)
