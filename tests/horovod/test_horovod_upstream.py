"""Horovod 0.28.1's own optimizer tests (tests/horovod_upstream/, vendored unchanged) against
gtopk_hvd's DistributedOptimizer, under mpirun on 2 workers, in each mode:

    horovod   plain Horovod: the baseline, which also verifies the list of what fails there
    none      gtopk_hvd.torch.DistributedOptimizer with Compression.none
    gtopk     ... with Compression.gtopk(density=1.0)
    topk      ... with Compression.topk(density=1.0)

(tests/horovod_upstream/conftest.py does the swap.) One launch serves the four modes: each
test runs once per mode, a fresh TestCase each time, in the same two ranks (conftest.py), so
torch's tests are one launch and each Keras flavour one (a flavour is chosen at import); the
tests here, one per mode, assert on that launch's outcomes for their mode. Every selected test
must pass in every mode
but for the cases listed below, each with its reason and the message it must fail with on every
rank. No run may hang: each has a hard time limit, and pytest-timeout ends a hanging test with
the stacks of every thread.

The Keras tests run on tf-keras (Keras 2) and on Keras 3. On Keras 3 Horovod's tests fail in
their own Keras 2 code, in every mode; test_tensorflow2_keras_variants.py runs the same methods
with those Keras 2 spellings given their Keras 3 meaning, and there the sparse modes must pass
every one but test_legacy_optimizer (Keras 3 has no legacy optimizers, so it has no variant),
"none" every one but those with backward_passes_per_step > 1 (a documented limitation), and
plain Horovod (Keras 2 code itself) fails all but test_sparse_as_dense, each for its reason.
"""

from __future__ import annotations

import json
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import pytest
from helpers.mpi_launcher import TESTS_DIR, mpirun_command, run_with_time_limit

pytestmark = pytest.mark.mpi  # launches mpirun: `pytest -m "not mpi"` skips it

UPSTREAM = TESTS_DIR / "horovod_upstream"
WORKERS = 2
MODES = ("horovod", "none", "gtopk", "topk")
SPARSE_MODES = ("gtopk", "topk")

# The tests of test_torch.py that build or exercise the distributed optimizer.
TORCH_TESTS = (
    "test_broadcast_state", "test_broadcast_state_gpu", "test_broadcast_state_options",
    "test_broadcast_state_no_grad", "test_compression_fp16", "test_force_allreduce",
    "test_model_parallelism", "test_delta_optimizer", "test_duplicate_names",
    "test_dynamic_requires_grad", "test_gradient_clipping", "test_synchronize_step_warning",
    "test_no_named_parameters", "test_missing_named_parameters",
    "test_optimizer_no_named_parameters", "test_sparse_embeddings",
    "test_optimizer_process_sets",
)
# test_torch_variants.py: the same methods where this install breaks them for Horovod too.
TORCH_VARIANTS = (
    "test_broadcast_state_without_muon", "test_broadcast_state_options_without_muon",
    "test_force_allreduce_without_muon", "test_dynamic_requires_grad_finite",
)
# test_gtopk_torch_limits.py: gtopk_hvd's limits and fixes that test_torch.py does not reach.
TORCH_LIMITS = ("test_gtopk_torch_limits.py",)

MUON = ("torch 2.13 has torch.optim.Muon, which refuses the test model's 1-D biases; the test "
        "enumerates every optimizer (the _without_muon variant runs the rest)",
        "ValueError: Muon only supports 2D parameters")
SKIPPED = {
    "test_broadcast_state_gpu": "skipped upstream (@unittest.skip)",
    "test_model_parallelism": "needs GPUs",
    "test_delta_optimizer": "needs GPUs",
}
# (modes, reason, message every rank's failure must contain)
EXPECTED_FAILURES = {
    "test_broadcast_state": (MODES, *MUON),
    "test_broadcast_state_options": (MODES, *MUON),
    "test_force_allreduce": (MODES, *MUON),
    "test_optimizer_process_sets": (
        SPARSE_MODES, "documented limitation: a sparse compression runs on the global "
        "process set only", "NotImplementedError: sparse compression runs on the global "
        "process set only"),
}


# test_tensorflow2_keras.py: the tests that build or exercise the distributed optimizer (not:
# test_elastic_state, test_partial_distributed_optimizer (Horovod's PartialDistributedOptimizer,
# not swapped), test_broadcast_global_variables_callback_with_local_vars (a callback only)).
KERAS_TESTS = (
    "test_train_model_lr_schedule", "test_sparse_as_dense", "test_legacy_optimizer",
    "test_sparse_as_dense_with_grad_aggregation", "test_grad_aggregation_with_inf_grad",
    "test_from_config", "test_gradient_aggregation_0", "test_gradient_aggregation_1",
    "test_gradient_aggregation_with_local_vars_0", "test_gradient_aggregation_with_local_vars_1",
)
KERAS_GET_VALUE = (
    MODES, "Horovod's LearningRate callbacks call keras.backend.get_value, which the Keras 3 "
    "package that horovod.tensorflow.keras imports no longer has",
    "module 'keras.backend' has no attribute 'get_value'")

# Keras 3. The vendored tests, unchanged, fail in their own Keras 2 code (lr=, an Optimizer
# subclass without learning_rate, keras.losses.mean_squared_error, keras.optimizers.legacy;
# Horovod 0.28 predates Keras 3) before the distributed optimizer matters, in every mode alike:
# asserted as such. test_tensorflow2_keras_variants.py runs the same methods with those Keras 2
# spellings mapped onto Keras 3 (its docstring), in every mode.
KERAS2_CODE = "the test's own Keras 2 code, which Keras 3 refuses"
KERAS3_UNCHANGED_FAILS = {
    "test_train_model_lr_schedule": "has no attribute 'mean_squared_error'",
    "test_sparse_as_dense": "Argument(s) not recognized: {'lr': 0.0001}",
    "test_legacy_optimizer": "`keras.optimizers.legacy` is not supported in Keras 3",
    "test_sparse_as_dense_with_grad_aggregation": "Argument(s) not recognized: {'lr'",
    "test_gradient_aggregation_0": "missing 1 required positional argument: 'learning_rate'",
    "test_gradient_aggregation_1": "missing 1 required positional argument: 'learning_rate'",
    "test_gradient_aggregation_with_local_vars_0": "missing 1 required positional argument",
    "test_gradient_aggregation_with_local_vars_1": "missing 1 required positional argument",
}
DENSE_PASSES_KERAS3 = (
    ("none",), "documented limitation: backward_passes_per_step > 1 with a dense compression "
    "is not supported on Keras 3 (gtopk_hvd runs Horovod's allreduce itself there; the Keras 3 "
    "optimizer's gradient_accumulation_steps does it)",
    "NotImplementedError: backward_passes_per_step > 1 with dense compression is not supported "
    "on Keras 3")
HOROVOD_ON_KERAS3 = "Horovod 0.28's Keras wrapper is Keras 2 code: "
# The variants (test_tensorflow2_keras_variants.py): the methods the Keras 3 wrappers can run.
KERAS3_VARIANTS = ("test_train_model_lr_schedule", "test_sparse_as_dense",
                   "test_sparse_as_dense_with_grad_aggregation",
                   "test_grad_aggregation_with_inf_grad", "test_gradient_aggregation_0",
                   "test_gradient_aggregation_1", "test_gradient_aggregation_with_local_vars_0",
                   "test_gradient_aggregation_with_local_vars_1")
# Not run as a variant: test_legacy_optimizer (keras.optimizers.legacy is Keras 2's; Keras 3 has
# no legacy optimizers: the tf_keras flavour runs it); test_from_config passes unchanged.
KERAS3_VARIANT_FAILS = {
    "test_train_model_lr_schedule": [(
        ("horovod",), HOROVOD_ON_KERAS3 + "its optimizer's `variables` is a method",
        "TypeError: 'list' object is not callable")],
    **{test: [(("horovod",), HOROVOD_ON_KERAS3 + "it calls the optimizer's aggregate_gradients, "
                             "which Keras 3 has not", "has no attribute 'aggregate_gradients'"),
              DENSE_PASSES_KERAS3]
       for test in KERAS3_VARIANTS[2:]},
}
# {flavour: {test: [(modes, reason, message), ...]}}: the test fails in those modes with that
# message on every rank; in the other modes it passes.
KERAS_EXPECTED_FAILURES = {
    "tf_keras": {"test_train_model_lr_schedule": [KERAS_GET_VALUE]},
    "keras3": {
        **{test: [(MODES, KERAS2_CODE, message)]
           for test, message in KERAS3_UNCHANGED_FAILS.items()},
        "test_grad_aggregation_with_inf_grad": [
            (("horovod",), HOROVOD_ON_KERAS3 + "its _compute_gradients calls the optimizer's "
             "compute_gradients, which Keras 3 has not",
             "object has no attribute 'compute_gradients'"),
            (SPARSE_MODES, KERAS2_CODE + ": the test calls Keras 2's private "
             "Optimizer._compute_gradients, which Keras 3 optimizers, and so gtopk_hvd's Keras 3 "
             "subclass, have not (the variant supplies it)",
             "object has no attribute '_compute_gradients'"),
            DENSE_PASSES_KERAS3],
        **{f"{test}_keras3": failures for test, failures in KERAS3_VARIANT_FAILS.items()},
    },
}


def expected(test: str, mode: str, failures: dict = EXPECTED_FAILURES) -> tuple[str, str]:
    """(outcome, message the failure must contain) of `test` in `mode`: "skipped", "failed"
    where `failures` lists the mode for the test, else "passed". A failure entry is
    (modes, reason, message), or a list of them for modes that fail differently."""
    if test in SKIPPED:
        return "skipped", ""
    entries = failures.get(test, [])
    for modes, _, message in [entries] if isinstance(entries, tuple) else entries:
        if mode in modes:
            return "failed", message
    return "passed", ""


def run_modes(files: list[str], selection: str, timeout_s: float,
              environment: tuple[str, ...] = ()) -> dict:
    """Runs the files' selected tests on WORKERS ranks, once per mode of MODES, in one launch
    (`environment`: more NAME=value for the ranks); returns {mode: {test: {rank: record}}}
    from the ranks' reports (conftest.py), and the output."""
    with tempfile.TemporaryDirectory() as reports:
        exports = [item for variable in environment for item in ("-x", variable)]
        command = mpirun_command(WORKERS, [
            *exports,
            "-x", f"GTOPK_HVD_MODE={','.join(MODES)}", "-x", f"GTOPK_HVD_REPORT_DIR={reports}",
            sys.executable, "-m", "pytest", *[str(UPSTREAM / f) for f in files],
            "-k", selection, "-q", "-p", "no:cacheprovider", "--color=no",
            "--timeout=600", "--timeout-method=thread"])
        try:
            _, output = run_with_time_limit(command, timeout_s, "Horovod's tests")
        finally:
            outcomes: dict = {mode: {} for mode in MODES}
            for rank in range(WORKERS):
                path = Path(reports) / f"rank{rank}.jsonl"
                for line in path.read_text().splitlines() if path.exists() else []:
                    record = json.loads(line)
                    outcomes[record["mode"]].setdefault(record["test"], {})[rank] = record
    return {"outcomes": outcomes, "output": output}


def check(outcomes: dict, tests: list[str], mode: str, output: str,
          failures: dict = EXPECTED_FAILURES) -> None:
    problems = []
    for test in tests:
        want, message = expected(test, mode, failures)
        for rank in range(WORKERS):
            record = outcomes.get(test, {}).get(rank)
            if record is None:
                problems.append(f"{test}: no outcome on rank {rank} (not run, or hung)")
            elif record["outcome"] != want:
                problems.append(f"{test} on rank {rank}: {record['outcome']}, expected {want}"
                                f"\n{record.get('message', '')[-1500:]}")
            elif message and message not in record.get("message", ""):
                problems.append(f"{test} on rank {rank} failed otherwise than expected "
                                f"({message!r}):\n{record.get('message', '')[-1500:]}")
    assert not problems, f"mode {mode}:\n" + "\n".join(problems) + f"\n{output[-3000:]}"


TORCH_FILES = ["test_torch.py", "test_torch_variants.py", *TORCH_LIMITS]
KERAS_LEGACY = {"tf_keras": "1", "keras3": "0"}


def torch_launch() -> dict:
    """Horovod's torch tests in the four modes, and gtopk_hvd's own limits once: one launch."""
    selection = " or ".join([*TORCH_TESTS, *TORCH_VARIANTS, "test_gtopk_torch_limits"])
    return run_modes(TORCH_FILES, selection, timeout_s=1200)


def keras_launch(flavour: str) -> dict:
    """Horovod's Keras tests on one flavour (tf-keras or Keras 3: chosen at import, so a
    launch of its own) in the four modes."""
    files = ["test_tensorflow2_keras.py"]
    if flavour == "keras3":
        files.append("test_tensorflow2_keras_variants.py")
    return run_modes(files, " or ".join(keras_tests(flavour)), timeout_s=1200,
                     environment=(f"TF_USE_LEGACY_KERAS={KERAS_LEGACY[flavour]}",
                                  "GTOPK_HVD_KERAS=1"))


def keras_tests(flavour: str) -> list[str]:
    tests = list(KERAS_TESTS)
    if flavour == "keras3":
        tests += [f"{test}_keras3" for test in KERAS3_VARIANTS]
    return tests


@pytest.fixture(scope="module")
def launches() -> Callable[[str], dict]:
    """launches("torch") / launches("tf_keras") / launches("keras3"): that launch's result,
    launched once for the module and shared by the tests of every mode (a launch that failed
    fails each of them with its error, without launching again)."""
    done: dict[str, object] = {}
    makers = {"torch": torch_launch, "tf_keras": lambda: keras_launch("tf_keras"),
              "keras3": lambda: keras_launch("keras3")}

    def get(name: str) -> dict:
        if name not in done:
            try:
                done[name] = makers[name]()
            except BaseException as error:  # noqa: BLE001 - re-raised for every test asking
                done[name] = error
        if isinstance(done[name], BaseException):
            raise done[name]
        return done[name]

    return get


@pytest.mark.parametrize("mode", MODES)
def test_horovod_torch_tests(mode: str, launches: Callable[[str], dict]) -> None:
    result = launches("torch")
    check(result["outcomes"][mode], list(TORCH_TESTS + TORCH_VARIANTS), mode, result["output"])


def test_gtopk_torch_limits(launches: Callable[[str], dict]) -> None:
    """gtopk_hvd's own checks (test_gtopk_torch_limits.py) ran beside the port and all
    passed."""
    result = launches("torch")
    ran = [mode for mode in MODES
           if any(test.startswith("test_") and test not in TORCH_TESTS + TORCH_VARIANTS
                  for test in result["outcomes"][mode])]
    assert len(ran) == 1, f"gtopk_hvd's own checks ran in modes {ran}, not once"
    limits = {test: ranks for test, ranks in result["outcomes"][ran[0]].items()
              if test not in TORCH_TESTS + TORCH_VARIANTS}
    assert len(limits) >= 18, f"gtopk_hvd's own checks did not run:\n{result['output']}"
    assert all(len(ranks) == WORKERS for ranks in limits.values()), limits
    failed = {test: ranks for test, ranks in limits.items()
              if any(r["outcome"] != "passed" for r in ranks.values())}
    assert not failed, f"{failed}\n{result['output'][-3000:]}"


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("flavour", ["tf_keras", "keras3"])
def test_horovod_keras_tests(flavour: str, mode: str, launches: Callable[[str], dict]) -> None:
    result = launches(flavour)
    check(result["outcomes"][mode], keras_tests(flavour), mode, result["output"],
          KERAS_EXPECTED_FAILURES[flavour])
