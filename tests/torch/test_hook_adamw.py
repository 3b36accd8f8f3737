"""AdamW's frozen second moment on the DDP hook (`gtopk_hvd.torch.hook_optimizer`) against the
torch DistributedOptimizer's (`freeze_variance_after`, `gtopk_hvd.torch.frozen_variance`).

Under torchrun, examples/ddp_transformer.py trains examples/pytorch_transformer.py's decoder with
the hook; under mpirun, examples/pytorch_transformer.py trains it with Horovod's optimizer path.
The same configuration (model, data, seeds, schedule, --dense-steps dense AdamW steps, then the
preconditioned gradient sparsified, AdamW's first moment and weight decay applied to the reduced
update; one DDP bucket, so that each selection is over the whole gradient as the optimizer's
is):

- at P = 1 ends with the same weights bit for bit, Top-k and gTop-k, the first moment after
  the exchange and in it (--momentum-correction), with a clip that never binds (--clip 1e6: both
  paths multiply by exactly 1; a binding clip in the sparse phase, each worker's own, moves the
  last bits: the hook's norm is over the bucket, clip_grad_norm_'s over the parameters);
- at P = 3, with a clip that binds (--clip 1), within float rounding: the dense start's
  all-reduce sums in its backend's order (Gloo's under torchrun, MPI's under mpirun), the
  clip's norm in the sparse phase is over the bucket; the rest is the same arithmetic. The bound
  measured at 4885f5b+ (x86-64): 3.3e-6 on weights of magnitude up to 1.0, the validation
  perplexity equal to two decimals.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
from helpers.mpi_launcher import run_mpi

OPTIONS = ["--vocab-size", "2000", "--size", "32", "--layers", "2", "--heads", "4",
           "--bptt", "16", "--batch-size", "4", "--max-steps", "12", "--eval-every", "12",
           "--warmup-steps", "3", "--density", "0.01", "--sparsify", "preconditioned",
           "--dense-steps", "4", "--lr", "5e-4", "--quiet"]


def train_both(workers: int, tmp_path: Path, *options: str) -> tuple[dict, dict]:
    """{path: its weights}, {path: its validation perplexity} for the hook and the optimizer,
    each path's replicas checked to be identical."""
    weights, perplexity = {}, {}
    for path, example, launcher in (("hook", "examples/ddp_transformer.py", "torchrun"),
                                    ("optimizer", "examples/pytorch_transformer.py", "mpirun")):
        output = run_mpi(example, workers, *OPTIONS, *options, "--save",
                         str(tmp_path / f"{path}.npz"), launcher=launcher, timeout_s=300)
        replicas = set(re.findall(r"CHECKSUM rank=\d+ (\w+)", output))
        assert len(replicas) == 1, f"{path} at P = {workers}: replicas differ {replicas}"
        weights[path] = dict(np.load(tmp_path / f"{path}.npz"))
        perplexity[path] = re.search(r"RESULT .*valid_perplexity=([\d.]+)", output).group(1)
    assert sorted(weights["hook"]) == sorted(weights["optimizer"])
    return weights, perplexity


@pytest.mark.mpi
@pytest.mark.parametrize("scheme", [["--compression", "topk"], ["--compression", "gtopk"],
                                    ["--compression", "topk", "--momentum-correction"]],
                         ids=["topk", "gtopk", "topk-momentum-in-exchange"])
def test_at_one_worker_the_hook_and_the_optimizer_end_with_the_same_weights(
        scheme: list[str], tmp_path: Path) -> None:
    weights, _ = train_both(1, tmp_path, *scheme, "--clip", "1e6")
    for name, hook in weights["hook"].items():
        assert hook.tobytes() == weights["optimizer"][name].tobytes(), (scheme, name)


@pytest.mark.mpi
@pytest.mark.parametrize("compression", ["topk", "gtopk"])
def test_at_three_workers_they_differ_by_the_all_reduces_rounding(compression: str,
                                                                  tmp_path: Path) -> None:
    weights, perplexity = train_both(3, tmp_path, "--compression", compression, "--clip", "1.0")
    for name, hook in weights["hook"].items():
        difference = np.abs(hook - weights["optimizer"][name]).max()
        assert difference <= 5e-5, (compression, name, difference)
    assert perplexity["hook"] == perplexity["optimizer"], perplexity
