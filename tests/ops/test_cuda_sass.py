"""The CUDA passes that update the residual keep many loads in flight, read from the built
extension's machine code (tests/helpers/sass.py): no GPU needed, any CUDA architecture built.

A pass that reads residual and gradient and writes the residual back is bound by memory only if
each thread has many loads in flight. Written as "load entry i, store entry i, load entry i + 1",
it has one: the gradient and the residual are separate pointers that may alias as far as the
compiler knows, so it cannot move the next load above the store, and the store waits for the
loads of its own entry. On an H200 that made the fused accumulate-and-select about 2.7x its
traffic (docs/results.md, On a GPU). Each pass below now loads a tile or a batch
before it writes any of it back: at most a few loads sit right after a store (the seams between
batches), and a run of at least 8 loads goes out together. The passes as they were fail this:
store-then-load 8-33, or runs of 2-3 loads.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from helpers.sass import cuobjdump, demangle, kernel_opcodes, loads_together, store_then_load

from gtopk_hvd import _C, ops

PASSES = {  # mangled names
    "first_pass_kernel<float, AccumulateValues>": r"first_pass_kernelIf[il]NS1_16AccumulateValues",
    "first_pass_kernel<double, AccumulateValues>": r"first_pass_kernelId[il]NS1_16AccumulateValues",
    "segmented_first_pass_kernel": r"segmented_first_pass_kernel",
    "accumulate_count_kernel": r"accumulate_count_kernel",
    "momentum_kernel": r"momentum_kernel",
    "accumulate_extremes_kernel": r"accumulate_extremes_kernel",
}
MOST_STORE_THEN_LOAD = 4
FEWEST_LOADS_TOGETHER = 8

pytestmark = pytest.mark.skipif(not ops.cuda_built,
                                reason="the extension was built without its CUDA kernels")


@pytest.fixture(scope="module")
def kernels() -> dict[tuple[str, str], list[str]]:
    tool = cuobjdump()
    assert tool is not None, ("cuobjdump not found: requirements.txt installs it "
                              "(nvidia-cuda-cuobjdump)")
    return kernel_opcodes(Path(_C.__file__), "|".join(PASSES.values()), tool)


@pytest.mark.parametrize("label", list(PASSES))
def test_a_pass_that_writes_back_loads_a_batch_before_it_stores(
        kernels: dict[tuple[str, str], list[str]], label: str) -> None:
    found = {(cubin, name): opcodes for (cubin, name), opcodes in kernels.items()
             if re.search(PASSES[label], name)}
    assert found, f"no machine code of {label} in {_C.__file__} (a PTX-only build?)"
    for (cubin, name), opcodes in found.items():
        measured = store_then_load(opcodes), loads_together(opcodes)
        assert measured[0] <= MOST_STORE_THEN_LOAD, (cubin, demangle(name), measured)
        assert measured[1] >= FEWEST_LOADS_TOGETHER, (cubin, demangle(name), measured)
