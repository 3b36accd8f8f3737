"""Runs Horovod's own tests (vendored beside this file, unchanged) against gtopk_hvd's wrappers.

The swap is done from outside the vendored files: with GTOPK_HVD_MODE set, this plugin replaces
`horovod.torch.DistributedOptimizer` (with GTOPK_HVD_KERAS=1:
`horovod.tensorflow.keras.DistributedOptimizer` instead) by a function that builds gtopk_hvd's
wrapper with the same arguments and the mode's compression:

    horovod   no swap: plain Horovod, the baseline
    none      gtopk_hvd's wrapper with Compression.none (handed on to Horovod's own)
    gtopk     gtopk_hvd's wrapper with Compression.gtopk(density=1.0)
    topk      gtopk_hvd's wrapper with Compression.topk(density=1.0)

A test that passes a compression of its own (Horovod's `hvd.Compression.none` / `.fp16`) keeps
it: it asks for that dense behaviour, which gtopk_hvd's wrappers accept and hand on to Horovod.
The mode replaces only the default compression.

Without GTOPK_HVD_MODE the vendored files are not collected: they are meant to run under mpirun,
launched by tests/test_horovod_upstream.py. With GTOPK_HVD_REPORT_DIR set, every rank appends
each test's outcome, as one JSON line, to `rank<N>.jsonl` there as soon as it is known, so that a
run killed for a hang still tells which tests finished.

The vendored files need `mock` and `parameterized`, pinned in requirements.txt.
"""

from __future__ import annotations

import inspect
import json
import os
from collections.abc import Callable
from typing import Any

import pytest

MODES = ("horovod", "none", "gtopk", "topk")
MODE = os.environ.get("GTOPK_HVD_MODE")
REPORT_DIR = os.environ.get("GTOPK_HVD_REPORT_DIR")

if MODE is None:
    collect_ignore_glob = ["test_*.py"]
elif MODE not in MODES:
    raise ValueError(f"GTOPK_HVD_MODE must be one of {MODES}, got {MODE!r}")


def _mode_compression(compression_namespace: Any) -> Any:
    """The compression that replaces the default in this mode (gtopk_hvd's namespace)."""
    if MODE == "gtopk":
        return compression_namespace.gtopk(density=1.0)
    if MODE == "topk":
        return compression_namespace.topk(density=1.0)
    return compression_namespace.none


def _swap(module: Any, ours: Callable[..., Any], compression_namespace: Any) -> None:
    """Replaces `module.DistributedOptimizer` (Horovod's) by a stand-in that builds `ours`
    with the same arguments, the default compression replaced by the mode's. While `ours`
    runs, Horovod's own is put back: gtopk_hvd hands dense compressions on to it."""
    original = module.DistributedOptimizer
    signature = inspect.signature(original)

    def distributed_optimizer(*args: Any, **kwargs: Any) -> Any:
        arguments = dict(signature.bind(*args, **kwargs).arguments)
        if "compression" not in arguments:
            arguments["compression"] = _mode_compression(compression_namespace)
        module.DistributedOptimizer = original
        try:
            return ours(**arguments)
        finally:
            module.DistributedOptimizer = distributed_optimizer

    module.DistributedOptimizer = distributed_optimizer


def _install_torch_swap() -> None:
    import horovod.torch as hvd

    import gtopk_hvd.torch as gtopk  # at collection, before any hvd.init(): loads mpi4py

    _swap(hvd, gtopk.DistributedOptimizer, gtopk.Compression)


def _install_keras_swap() -> None:
    import horovod.tensorflow.keras as hvd

    import gtopk_hvd.tensorflow.keras as gtopk  # at collection, before any hvd.init()

    _swap(hvd, gtopk.DistributedOptimizer, gtopk.Compression)


if MODE is not None:
    if MODE != "horovod":
        if os.environ.get("GTOPK_HVD_KERAS") == "1":
            _install_keras_swap()
        else:
            _install_torch_swap()


def _rank() -> str:
    return os.environ.get("OMPI_COMM_WORLD_RANK", os.environ.get("PMI_RANK", "0"))


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Appends the outcome of each phase that decides a test's result to this rank's file."""
    if REPORT_DIR is None:
        return
    if report.when != "call" and not (report.failed or report.skipped):
        return
    record = {"test": report.nodeid.split("::")[-1], "when": report.when,
              "outcome": report.outcome, "mode": MODE}
    if report.failed:
        record["message"] = str(report.longrepr)[-3000:]
    elif report.skipped and isinstance(report.longrepr, tuple):
        record["message"] = report.longrepr[2]
    path = os.path.join(REPORT_DIR, f"rank{_rank()}.jsonl")
    with open(path, "a") as file:
        file.write(json.dumps(record) + "\n")
