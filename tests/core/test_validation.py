"""Bad arguments are clear errors that name the problem (one process, Horovod of size 1)."""

from __future__ import annotations

import pytest

from gtopk_hvd.compression import Compression
from gtopk_hvd.core import SparseStep
from gtopk_hvd.transports.mpi import default_transport


@pytest.mark.parametrize("options,message", [
    ({"density": 0.0}, "density"), ({"density": 2.0}, "density"),
    ({"density": 0.1, "wire_dtype": "float64"}, "wire_dtype"),
    ({"density": 0.1, "selection": "layer"}, "selection"),
    ({"density": 0.1, "warmup_densities": (0.5, 0.0), "warmup_steps": 3},
     r"warmup_densities\[1\]"),
    ({"density": 0.1, "momentum": 1.0}, "momentum"),
])
def test_bad_hyper_parameters_are_named(options: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Compression.gtopk(**options)


def test_a_model_without_trainable_parameters_is_refused() -> None:
    torch = pytest.importorskip("torch")
    import horovod.torch as hvd

    import gtopk_hvd.torch as gtopk

    hvd.init()
    model = torch.nn.Linear(4, 2)
    for parameter in model.parameters():
        parameter.requires_grad_(False)
    with pytest.raises(ValueError, match="no parameters with gradients"):
        gtopk.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters(),
                                   compression=gtopk.Compression.gtopk(density=0.1))
    with pytest.raises(ValueError, match="no parameters with gradients"):
        SparseStep(Compression.gtopk(density=0.1), [], default_transport())
