"""Every call of a `gtopk_hvd._C` entry in the repository passes the arguments its binding
declares, read without running it: the call sites' positional and keyword arguments (ast)
against the signature pybind11 writes into each entry's docstring. The CUDA entries' callers
(gtopk_hvd/ops/) run only on a GPU; this checks their argument lists on any machine whose build
has the CUDA kernels (a CPU-only build checks the CPU entries)."""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

from gtopk_hvd import _C

ROOT = Path(__file__).resolve().parents[2]
SOURCES = ("gtopk_hvd", "tests", "scripts", "examples")


@dataclass(frozen=True)
class Parameter:
    name: str
    has_default: bool


def _split_top_level(text: str) -> list[str]:
    """text split at the commas outside brackets."""
    parts, depth, start = [], 0, 0
    for i, char in enumerate(text):
        depth += char in "[(" and 1 or char in "])" and -1 or 0
        if char == "," and depth == 0:
            parts.append(text[start:i].strip())
            start = i + 1
    tail = text[start:].strip()
    return parts + [tail] if tail else parts


def signature(name: str) -> list[Parameter]:
    """The parameters of _C.<name> from the first line of its pybind11 docstring."""
    first = (getattr(_C, name).__doc__ or "").lstrip().splitlines()[0]
    match = re.fullmatch(rf"{name}\((.*)\) -> .*", first)
    assert match, f"_C.{name}: no signature in its docstring: {first!r}"
    return [Parameter(part.split(":")[0].strip(), "=" in part)
            for part in _split_top_level(match.group(1))]


@dataclass(frozen=True)
class Call:
    where: str
    name: str
    positional: int
    keywords: tuple[str, ...]
    unpacked: bool


def _is_module_c(node: ast.expr) -> bool:
    return (isinstance(node, ast.Name) and node.id == "_C") or (
        isinstance(node, ast.Attribute) and node.attr == "_C")


def calls() -> list[Call]:
    """Every call `_C.<name>(...)` (or `<something>._C.<name>(...)`) in the sources."""
    found = []
    for folder in SOURCES:
        for path in sorted((ROOT / folder).rglob("*.py")):
            tree = ast.parse(path.read_text(), str(path))
            for node in ast.walk(tree):
                if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                        and _is_module_c(node.func.value)):
                    found.append(Call(
                        f"{path.relative_to(ROOT)}:{node.lineno}", node.func.attr,
                        sum(not isinstance(a, ast.Starred) for a in node.args),
                        tuple(k.arg for k in node.keywords if k.arg is not None),
                        any(isinstance(a, ast.Starred) for a in node.args)
                        or any(k.arg is None for k in node.keywords)))
    return found


def entries() -> list[str]:
    """The functions of _C that its bindings define (pybind11 builtins with a signature)."""
    return sorted(name for name in dir(_C)
                  if not name.startswith("_") and callable(getattr(_C, name))
                  and type(getattr(_C, name)).__name__ == "builtin_function_or_method")


CALLS = calls()


def test_the_call_sites_are_found() -> None:
    names = {call.name for call in CALLS}
    assert {"topk_abs", "merge_topk", "sketch_select"} <= names
    if _C.built_with_cuda:
        assert {"cuda_topk_abs", "cuda_accumulate_count", "cuda_sketch_table"} <= names


@pytest.mark.parametrize("call", CALLS, ids=lambda call: f"{call.name}@{call.where}")
def test_a_call_passes_what_its_binding_declares(call: Call) -> None:
    if not hasattr(_C, call.name):
        assert call.name.startswith("cuda_") and not _C.built_with_cuda, (
            f"{call.where}: _C has no {call.name}")
        pytest.skip("the CUDA entries are not built here")
    parameters = signature(call.name)
    names = [p.name for p in parameters]
    assert not call.unpacked, (
        f"{call.where}: *args / **kwargs hide what _C.{call.name} is given")
    assert call.positional <= len(parameters), (
        f"{call.where}: {call.positional} positional arguments, _C.{call.name} takes "
        f"{len(parameters)}: {names}")
    given = names[:call.positional]
    for keyword in call.keywords:
        assert keyword in names, f"{call.where}: _C.{call.name} has no argument {keyword!r}"
        assert keyword not in given, f"{call.where}: {keyword!r} given twice"
    missing = [p.name for p in parameters[call.positional:]
               if not p.has_default and p.name not in call.keywords]
    assert not missing, f"{call.where}: _C.{call.name} is not given {missing}"


@pytest.mark.parametrize("name", entries())
def test_every_entry_names_its_arguments(name: str) -> None:
    """Named arguments: a call site's keywords and a reader see what each position is."""
    unnamed = [p.name for p in signature(name) if re.fullmatch(r"arg\d+", p.name)]
    assert not unnamed, f"_C.{name} declares no names for its arguments"


def test_every_cuda_entry_has_a_caller() -> None:
    if not _C.built_with_cuda:
        pytest.skip("the CUDA entries are not built here")
    called = {call.name for call in CALLS}
    assert not [name for name in entries() if name.startswith("cuda_") and name not in called]


def test_an_address_is_an_int_or_a_host_arrays_buffer() -> None:
    """Address (bindings.h): an int, None (no array) or a contiguous host array read in place;
    a strided view has no one address and is refused, never read as if it were contiguous."""
    import numpy as np

    int32 = _C.IndexType.int32
    broken = np.array([0, 2, 1, 5], dtype=np.int32)
    assert _C.first_not_increasing(int32, broken, broken.size) == 2
    assert _C.first_not_increasing(int32, broken.ctypes.data, broken.size) == 2
    assert _C.first_not_increasing(int32, None, 0) == 0
    assert _C.first_not_increasing(int32, broken[2:], 2) == 0  # a slice: its own first item
    with pytest.raises(TypeError):
        _C.first_not_increasing(int32, np.arange(8, dtype=np.int32)[::2], 4)
    with pytest.raises(TypeError):
        _C.first_not_increasing(int32, -1, 0)
