"""The public API documents its arguments: every function, class and method that a user or an
extension calls (`PUBLIC` below, with each class's public methods) and that takes arguments has
a docstring with an `Args:` section (a dataclass or named tuple: `Attributes:` for its fields; a
class that holds its arguments may name them there), and one with a return value says what it
returns (`Returns:` or `Yields:`). A method that overrides a framework's (a Lightning or Keras
callback's hook, `torch.optim.Optimizer.step`) is the framework's contract and is left out."""

from __future__ import annotations

import dataclasses
import importlib
import inspect
from typing import Any

import pytest

# What a user calls (the docs' one-line changes and their options) and what an extension
# implements (a scheme, a transport: docs/extending.md), by module.
PUBLIC = {
    "gtopk_hvd.compression": ["Compression", "SparseCompression", "DenseCompression"],
    "gtopk_hvd.core": ["SparseStep", "StepStats"],
    "gtopk_hvd.schemes": ["Scheme", "Wire", "Exchange", "reads_nothing"],
    "gtopk_hvd.transports": ["Transport", "resolve_transport"],
    "gtopk_hvd.torch": ["DistributedOptimizer", "join"],
    "gtopk_hvd.torch.ddp": ["GTopkHookState", "gtopk_hook", "end_process_group"],
    "gtopk_hvd.torch.fsdp": ["SparseFSDP", "full_state", "register"],
    "gtopk_hvd.torch.hf": ["load_worker_state", "register_on_accelerator",
                           "register_on_trainer", "save_worker_state", "trainer_callback"],
    "gtopk_hvd.torch.lightning": ["GTopkHookCallback"],
    "gtopk_hvd.tensorflow": ["DistributedGradientTape", "DistributedOptimizer", "GTopkState",
                             "join"],
    "gtopk_hvd.tensorflow.keras": ["BroadcastGlobalVariablesCallback", "DistributedOptimizer",
                                   "GTopkState", "LearningRateScheduleCallback",
                                   "LearningRateWarmupCallback", "MetricAverageCallback",
                                   "broadcast_variables", "check_replicas_agree"],
    "gtopk_hvd.tensorflow.keras.elastic": ["CommitStateCallback", "KerasState",
                                           "UpdateBatchStateCallback",
                                           "UpdateEpochStateCallback", "run"],
}


def takes_arguments(function: Any) -> bool:
    try:
        parameters = inspect.signature(function).parameters
    except (TypeError, ValueError):
        return False
    return any(name not in ("self", "cls") for name in parameters)


def returns_something(function: Any) -> bool:
    annotation = inspect.signature(function).return_annotation
    return annotation not in (inspect.Signature.empty, None, "None")


def overrides_a_framework(cls: type, name: str) -> bool:
    return any(name in vars(base) for base in cls.__mro__[1:]
               if not base.__module__.startswith("gtopk_hvd") and base is not object)


def undocumented(module_name: str) -> list[str]:
    module = importlib.import_module(module_name)
    found = []

    def check(qualified: str, function: Any, documented: str | None = None) -> None:
        doc = documented if documented is not None else inspect.getdoc(function) or ""
        if takes_arguments(function) and "Args:" not in doc:
            found.append(f"{qualified}: no Args:")
        if (not inspect.isclass(function) and returns_something(function)
                and "Returns:" not in doc and "Yields:" not in doc):
            found.append(f"{qualified}: no Returns:")

    for name in PUBLIC[module_name]:
        value = getattr(module, name)
        if not (inspect.isfunction(value) or inspect.isclass(value)):
            continue
        if not value.__module__.startswith("gtopk_hvd"):
            continue
        qualified = f"{value.__module__}.{value.__qualname__}"
        if inspect.isfunction(value):
            check(qualified, value)
            continue
        if dataclasses.is_dataclass(value) or hasattr(value, "_fields"):
            if not any(section in (inspect.getdoc(value) or "")
                       for section in ("Args:", "Attributes:", "Fields:")):
                found.append(f"{qualified}: no Attributes: for its fields")
        elif "__init__" in vars(value):
            doc = inspect.getdoc(value) or ""
            holds = "Attributes:" in doc and all(
                name in doc for name in inspect.signature(value.__init__).parameters
                if name != "self")
            check(qualified, value.__init__, doc + ("\nArgs:" if holds else ""))
        for attribute, member in vars(value).items():
            if isinstance(member, (staticmethod, classmethod)):
                member = member.__func__
            if (attribute.startswith("_") or not inspect.isfunction(member)
                    or overrides_a_framework(value, attribute)):
                continue
            check(f"{qualified}.{attribute}", member)
    return found


@pytest.mark.parametrize("module_name", sorted(PUBLIC))
def test_public_functions_document_their_arguments(module_name: str) -> None:
    if module_name.startswith("gtopk_hvd.tensorflow"):
        pytest.importorskip("tensorflow")
    missing = sorted(set(undocumented(module_name)))
    assert not missing, ("public functions without Args: / Returns: in their docstrings "
                         "(Google style, as the rest of the public API):\n  "
                         + "\n  ".join(missing))
