"""Runs Horovod's own tests (vendored beside this file, unchanged) against gtopk_hvd's wrappers.

The swap is done from outside the vendored files: with GTOPK_HVD_MODE set, this plugin replaces
`horovod.torch.DistributedOptimizer` (with GTOPK_HVD_KERAS=1:
`horovod.tensorflow.keras.DistributedOptimizer` instead) by a function that builds, in the mode
being run, gtopk_hvd's wrapper with the same arguments and the mode's compression (in mode
`horovod`: Horovod's own optimizer, untouched):

    horovod   no swap: plain Horovod, the baseline
    none      gtopk_hvd's wrapper with Compression.none (handed on to Horovod's own)
    gtopk     gtopk_hvd's wrapper with Compression.gtopk(density=1.0)
    topk      gtopk_hvd's wrapper with Compression.topk(density=1.0)

A test that passes a compression of its own (Horovod's `hvd.Compression.none` / `.fp16`) keeps
it: it asks for that dense behaviour, which gtopk_hvd's wrappers accept and hand on to Horovod.
The mode replaces only the default compression.

GTOPK_HVD_MODE may name several modes, comma-separated (`horovod,none,gtopk,topk`): then each
of Horovod's tests runs once per mode, one mode after the other, each run a fresh setup, call
and teardown of the test (a new TestCase), in this one process: one launch of the ranks (each
imports torch or TensorFlow and Horovod) serves every mode. gtopk_hvd's own files
(test_gtopk_torch_limits.py: not Horovod's, and mode-independent) run once.

Without GTOPK_HVD_MODE the vendored files are not collected: they are meant to run under mpirun,
launched by tests/horovod/test_horovod_upstream.py. With GTOPK_HVD_REPORT_DIR set, every rank
appends each test's outcome in each mode, as one JSON line, to `rank<N>.jsonl` there as soon as it
is known, so that a run killed for a hang still tells which tests finished.

The vendored files need `mock` and `parameterized`, pinned in requirements.txt.
"""

from __future__ import annotations

import inspect
import json
import os
from collections.abc import Callable
from typing import Any

import pytest
from _pytest.runner import runtestprotocol

MODES = ("horovod", "none", "gtopk", "topk")
RUN_MODES = tuple(os.environ.get("GTOPK_HVD_MODE", "").split(",")) if os.environ.get(
    "GTOPK_HVD_MODE") else ()
REPORT_DIR = os.environ.get("GTOPK_HVD_REPORT_DIR")
# gtopk_hvd's own checks beside the port: run once, whatever the modes.
MODE_INDEPENDENT = ("test_gtopk_torch_limits.py",)

if not RUN_MODES:
    collect_ignore_glob = ["test_*.py"]
elif not set(RUN_MODES) <= set(MODES) or len(set(RUN_MODES)) != len(RUN_MODES):
    raise ValueError(f"GTOPK_HVD_MODE must be distinct modes of {MODES}, comma-separated, "
                     f"got {os.environ.get('GTOPK_HVD_MODE')!r}")

_current = {"mode": RUN_MODES[0] if RUN_MODES else None}  # the mode being run


def _mode_compression(compression_namespace: Any) -> Any:
    """The compression that replaces the default in the current mode (gtopk_hvd's
    namespace)."""
    if _current["mode"] == "gtopk":
        return compression_namespace.gtopk(density=1.0)
    if _current["mode"] == "topk":
        return compression_namespace.topk(density=1.0)
    return compression_namespace.none


def _swap(module: Any, ours: Callable[..., Any], compression_namespace: Any) -> None:
    """Replaces `module.DistributedOptimizer` (Horovod's) by a stand-in that builds `ours`
    with the same arguments, the default compression replaced by the mode's. While `ours`
    runs, Horovod's own is put back: gtopk_hvd hands dense compressions on to it."""
    original = module.DistributedOptimizer
    signature = inspect.signature(original)

    def distributed_optimizer(*args: Any, **kwargs: Any) -> Any:
        if _current["mode"] == "horovod":
            return original(*args, **kwargs)
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


if RUN_MODES and RUN_MODES != ("horovod",):
    if os.environ.get("GTOPK_HVD_KERAS") == "1":
        _install_keras_swap()
    else:
        _install_torch_swap()


def _rank() -> str:
    return os.environ.get("OMPI_COMM_WORLD_RANK", os.environ.get("PMI_RANK", "0"))


def _remove_added_process_sets() -> None:
    """Removes the process sets beyond Horovod's global one: what a test that failed before its
    own removal left (test_optimizer_process_sets in the sparse modes), which would make the
    next mode's run of it fail to add them again. Every rank runs the same tests in the same
    order, so every rank removes the same sets here."""
    from horovod.common import process_sets

    basics = process_sets._basics
    if basics is None or not basics.is_initialized():
        return
    for set_id in sorted(basics._get_process_set_ids_and_ranks()):
        if set_id != 0:
            process_sets.remove_process_set(process_sets._temp_process_set_object(set_id))


def pytest_runtest_protocol(item: pytest.Item, nextitem: Any) -> Any:
    """With several modes: runs the test once per mode (setup, call, teardown each time; every
    node above the test torn down between modes too, and the process sets a failed test left
    removed, so nothing carries over but what the process itself keeps), reported as usual."""
    if len(RUN_MODES) < 2 or item.path.name in MODE_INDEPENDENT:
        return None  # pytest's own protocol
    for index, mode in enumerate(RUN_MODES):
        _current["mode"] = mode
        last = index == len(RUN_MODES) - 1
        item.ihook.pytest_runtest_logstart(nodeid=item.nodeid, location=item.location)
        runtestprotocol(item, nextitem=nextitem if last else None, log=True)
        _remove_added_process_sets()
        item.ihook.pytest_runtest_logfinish(nodeid=item.nodeid, location=item.location)
    _current["mode"] = RUN_MODES[0]
    return True


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Appends the outcome of each phase that decides a test's result to this rank's file."""
    if REPORT_DIR is None:
        return
    if report.when != "call" and not (report.failed or report.skipped):
        return
    record = {"test": report.nodeid.split("::")[-1], "when": report.when,
              "outcome": report.outcome, "mode": _current["mode"]}
    if report.failed:
        record["message"] = str(report.longrepr)[-3000:]
    elif report.skipped and isinstance(report.longrepr, tuple):
        record["message"] = report.longrepr[2]
    path = os.path.join(REPORT_DIR, f"rank{_rank()}.jsonl")
    with open(path, "a") as file:
        file.write(json.dumps(record) + "\n")
