"""No temporary the size of the gradient in a step (`python -m gtopk_hvd.bench memory`): for
every scheme but the sketch (rewritten on its own branch), with and without momentum
correction, called as the adapters call it (update written over a cleared gradient) and with a
read-only, predivided gradient, on numpy and torch CPU state, the peak a step allocates beyond
what it keeps (the residual, the velocity) stays within 5% of the gradient."""

from __future__ import annotations

import pytest

from gtopk_hvd.bench.memory import TARGET_SLACK, measure

SCHEMES = ("topk", "gtopk", "gtopk-exact", "micro", "exdyna")
D = 1 << 20


def _states() -> list[str]:
    try:
        import torch  # noqa: F401
    except ImportError:
        return ["numpy"]
    return ["numpy", "torch-cpu"]


@pytest.mark.parametrize("call", ["update", "step"])
@pytest.mark.parametrize("momentum", [False, True])
@pytest.mark.parametrize("state", _states())
@pytest.mark.parametrize("scheme", SCHEMES)
def test_step_makes_no_gradient_sized_temporary(scheme: str, state: str, momentum: bool,
                                                call: str) -> None:
    row = measure(scheme, state, D, 0.001, 2, momentum, call)
    assert row.temporaries <= TARGET_SLACK, row


@pytest.mark.parametrize("momentum", [False, True])
@pytest.mark.parametrize("scheme", SCHEMES)
def test_two_workers_make_no_gradient_sized_temporary(scheme: str, momentum: bool) -> None:
    row = measure(scheme, "numpy", D, 0.001, 2, momentum, "step", workers=2)
    assert row.temporaries <= TARGET_SLACK, row
