"""Horovod's own wrappers, swapped by importing gtopk_hvd (gtopk_hvd.horovod_swap).

Under mpirun (marked `mpi`): tests/mpi/mpi_horovod_swap.py, bitwise checks against Horovod's
original function and against gtopk_hvd's wrappers, for torch, the TF tape and Keras. In this
process (size 1, no mpirun): the swap's visibility, idempotence and undoing on horovod.torch,
which builds what at size 1, the TypeError of a sparse compression inside Horovod's own wrapper,
and the argument matching of the mechanism on a module of its own.
"""

from __future__ import annotations

import importlib
import inspect
import sys
import types

import numpy as np
import pytest
from helpers.mpi_launcher import run_mpi

from gtopk_hvd import horovod_swap
from gtopk_hvd.compression import Compression

TORCH_NAME = "horovod.torch.DistributedOptimizer"


@pytest.mark.mpi
@pytest.mark.parametrize("mode", ["torch", "tf", "tf-keras"])
def test_swapped_wrappers_under_mpirun(mode: str) -> None:
    output = run_mpi("mpi_horovod_swap.py", 2, mode, timeout_s=600)
    assert f"horovod swap {mode} ok on 2 workers" in output


@pytest.mark.parametrize("compression", [
    Compression.gtopk(0.01), Compression.topk(0.1), Compression.sparse(0.1, sparsifier="randomk")])
def test_a_sparse_compression_inside_horovod_raises_the_fix(compression: object) -> None:
    for call in (lambda: compression.compress(np.zeros(4, np.float32)),
                 lambda: compression.decompress(np.zeros(4, np.float32), None)):
        with pytest.raises(TypeError) as raised:
            call()
        message = str(raised.value)
        assert "cannot run inside Horovod's own DistributedOptimizer" in message
        assert "import gtopk_hvd.torch" in message
        assert "gtopk_hvd.torch.DistributedOptimizer" in message


def test_torch_swap_keeps_horovods_face_is_idempotent_and_undone() -> None:
    pytest.importorskip("torch")
    import horovod.torch as hvd

    import gtopk_hvd.torch as gtopk

    swapped = hvd.DistributedOptimizer
    original = getattr(swapped, horovod_swap.MARKER)
    from horovod.torch.optimizer import DistributedOptimizer as horovods

    assert original is horovods and swapped is not original
    assert TORCH_NAME in horovod_swap.installed()
    assert swapped.__name__ == "DistributedOptimizer" and swapped.__module__ == original.__module__
    assert swapped.__doc__.startswith(original.__doc__) and "gtopk_hvd" in swapped.__doc__
    assert inspect.signature(swapped) == inspect.signature(original)
    importlib.reload(gtopk)  # installs again: still one wrapper around Horovod's original
    assert hvd.DistributedOptimizer is swapped
    assert horovod_swap.install("horovod.torch", "DistributedOptimizer", gtopk.DistributedOptimizer)
    assert hvd.DistributedOptimizer is swapped
    try:
        assert horovod_swap.restore([TORCH_NAME]) == [TORCH_NAME]
        assert hvd.DistributedOptimizer is original and TORCH_NAME not in horovod_swap.installed()
        assert horovod_swap.restore([TORCH_NAME]) == []
    finally:
        horovod_swap.install("horovod.torch", "DistributedOptimizer", gtopk.DistributedOptimizer)
    assert getattr(hvd.DistributedOptimizer, horovod_swap.MARKER) is original


def test_torch_swap_builds_ours_for_sparse_only() -> None:
    torch = pytest.importorskip("torch")
    import horovod.torch as hvd
    from horovod.torch.optimizer import _DistributedOptimizer as HorovodOptimizer

    import gtopk_hvd.torch as gtopk
    from gtopk_hvd.torch.optimizer import _SparseDistributedOptimizer

    hvd.init()
    model = torch.nn.Linear(4, 2)

    def built(*args: object, **kwargs: object) -> type:
        optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), *args,
                                             **kwargs)
        method = type(optimizer).__dict__["synchronize"]
        return next(cls for cls in (HorovodOptimizer, _SparseDistributedOptimizer)
                    if method is cls.__dict__["synchronize"])

    for dense in ({}, {"compression": hvd.Compression.none},
                  {"compression": hvd.Compression.fp16}, {"compression": gtopk.Compression.none}):
        assert built(named_parameters=model.named_parameters(), **dense) is HorovodOptimizer
    assert built(model.named_parameters(), gtopk.Compression.gtopk(0.5)) is (
        _SparseDistributedOptimizer)
    assert built(compression=gtopk.Compression.topk(0.5), transport="horovod") is (
        _SparseDistributedOptimizer)
    # Anything Horovod's signature does not take is Horovod's to refuse, as before.
    with pytest.raises(TypeError, match="transport"):
        built(compression=hvd.Compression.none, transport="horovod")
    with pytest.raises(TypeError, match="unexpected"):
        built(compression=gtopk.Compression.gtopk(0.5), not_an_argument=1)
    # What gtopk_hvd's optimizer refuses is refused through Horovod's function too.
    with pytest.raises(NotImplementedError, match="num_groups"):
        built(compression=gtopk.Compression.gtopk(0.5), num_groups=2)


def _horovod_like(optimizer: object, name: object = None, compression: object = "none",
                  num_groups: int = 0, scale_local_gradients: bool = True) -> tuple:
    """A Horovod-shaped wrapper (another positional order than `_ours`)."""
    return ("original", optimizer, name, compression, num_groups, scale_local_gradients)


def _ours(optimizer: object, name: object = None, compression: object = None,
          backward_passes_per_step: int = 1, num_groups: int = 0, *,
          transport: object = None) -> tuple:
    return ("ours", optimizer, name, compression, backward_passes_per_step, num_groups, transport)


@pytest.fixture
def horovod_like_module(monkeypatch: pytest.MonkeyPatch) -> types.ModuleType:
    module = types.ModuleType("gtopk_swap_test_module")
    module.DistributedOptimizer = _horovod_like
    monkeypatch.setitem(sys.modules, module.__name__, module)
    yield module
    horovod_swap.restore([f"{module.__name__}.DistributedOptimizer"])


def test_the_mechanism_matches_arguments_by_name(horovod_like_module: types.ModuleType) -> None:
    assert horovod_swap.install(horovod_like_module.__name__, "DistributedOptimizer", _ours)
    swapped = horovod_like_module.DistributedOptimizer
    sparse = Compression.gtopk(0.1)
    assert swapped("opt", None, sparse, 3) == ("ours", "opt", None, sparse, 1, 3, None)
    assert swapped("opt", compression=sparse, scale_local_gradients=True, transport="t") == (
        "ours", "opt", None, sparse, 1, 0, "t")
    with pytest.raises(NotImplementedError, match="scale_local_gradients=False"):
        swapped("opt", compression=sparse, scale_local_gradients=False)
    assert swapped("opt", None, "fp16", 3, False) == _horovod_like("opt", None, "fp16", 3, False)
    assert swapped("opt") == _horovod_like("opt")
    with pytest.raises(TypeError, match="transport"):  # the original's own error
        swapped("opt", transport="t")


def test_a_missing_module_or_attribute_is_skipped(horovod_like_module: types.ModuleType) -> None:
    assert not horovod_swap.install("gtopk_swap_no_such_module", "DistributedOptimizer", _ours)
    assert not horovod_swap.install(horovod_like_module.__name__, "NoSuchFunction", _ours)
    assert horovod_like_module.DistributedOptimizer is _horovod_like
