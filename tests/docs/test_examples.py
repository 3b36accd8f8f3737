"""The examples run end to end under mpirun (and horovodrun --gloo, torchrun)."""

from __future__ import annotations

import json
import math
import re

import numpy as np
import pytest
from helpers import margins
from helpers.mpi_launcher import run_mpi

pytestmark = pytest.mark.mpi  # launches mpirun / horovodrun: `pytest -m "not mpi"` skips it


@pytest.mark.parametrize("workers", [1, 3, 4])
def test_extension_smoke_agrees_on_every_worker(workers: int) -> None:
    output = run_mpi("examples/extension_smoke.py", workers, "--size", "300000")
    match = re.search(r"workers=(\d+) d=300,000 k=300 .* merged=300 entries, identical", output)
    assert match and int(match.group(1)) == workers, output


def parse_digits_run(output: str, workers: int) -> dict[str, str]:
    result = re.search(r"RESULT (.*)", output)
    assert result, output[-3000:]
    fields = dict(item.split("=", 1) for item in result.group(1).split())
    checksums = re.findall(r"CHECKSUM rank=(\d+) ([0-9a-f]{64})", output)
    assert sorted(int(rank) for rank, _ in checksums) == list(range(workers)), output[-3000:]
    assert len({digest for _, digest in checksums}) == 1, f"replicas differ: {checksums}"
    return fields


@pytest.mark.parametrize(("launcher", "workers"), [("mpirun", 4), ("mpirun", 3),
                                                  ("horovodrun", 4)])  # --gloo: no MPI at all
def test_pytorch_digits_gtopk_learns_on_every_launcher(launcher: str, workers: int) -> None:
    output = run_mpi("examples/pytorch_digits.py", workers, "--compression", "gtopk",
                     "--density", "0.01", "--quiet", timeout_s=900, launcher=launcher)
    fields = parse_digits_run(output, workers)
    case = "pytorch_digits_gtopk" + ("_3" if workers == 3 else "") + (
        "_horovodrun" if launcher == "horovodrun" else "")
    assert float(fields["test_accuracy"]) >= margins.floor(case), fields
    k = -(-int(fields["params"]) // 100)  # ceil(0.01 * d)
    if workers == 4:  # log2(4) rounds of k entries, 8 bytes each
        assert int(fields["bytes_per_step"]) == 2 * 8 * k, fields


def test_pytorch_digits_dgc_options_and_history(tmp_path: object) -> None:
    history_path, checkpoint = tmp_path / "history.json", tmp_path / "state"
    output = run_mpi("examples/pytorch_digits.py", 4, "--compression", "gtopk", "--density",
                     "0.001", "--epochs", "4", "--warmup-epochs", "2", "--momentum-correction",
                     "--history", str(history_path), "--checkpoint", str(checkpoint), "--quiet",
                     timeout_s=600)
    fields = parse_digits_run(output, 4)
    history = json.loads(history_path.read_text())
    assert [epoch["epoch"] for epoch in history] == [1, 2, 3, 4]
    assert abs(history[-1]["test_accuracy"] - float(fields["test_accuracy"])) < 1e-4
    assert all(epoch["train_loss"] > 0 for epoch in history)
    steps = [epoch["step"] for epoch in history]
    assert steps == [steps[0] * (n + 1) for n in range(4)] and steps[0] > 0
    seconds = [epoch["seconds"] for epoch in history]
    assert all(after > before > 0 for before, after in zip(seconds, seconds[1:]))
    for epoch in history:  # the sparse step's own phases were timed, by the step's split
        assert epoch["phases"]["select"] > 0 and epoch["phases"]["transfer"] > 0, epoch
    assert float(fields["density"]) == 0.001  # the warm-up stages are over by the last step

    # The warm-up took effect: DGC's stages above 0.001, each round(2 epochs / 4) steps, then
    # 0.001; every step's k = max(1, ceil(density * d)) (each step's optimizer.last_stats).
    sparse_steps = [step for epoch in history for step in epoch["sparse_steps"]]
    assert len(sparse_steps) == steps[-1]
    stage = round(2 * steps[0] / 4)
    stages = (0.25, 0.0625, 0.015625, 0.004)
    want = [stages[step // stage] if step < 4 * stage else 0.001 for step in range(steps[-1])]
    assert [step["density"] for step in sparse_steps] == want
    d = int(fields["params"])
    assert [step["k"] for step in sparse_steps] == [max(1, math.ceil(x * d)) for x in want]

    # Momentum correction took effect: the SGD the example wraps has no momentum of its own,
    # and every worker's checkpoint holds its own velocity u (u = m u + g, accumulated into the
    # residual r), cleared where the worker sent at its last step: where r is 0 (sent and kept
    # globally; or an entry whose gradient has always been 0) u is 0 too, and u is 0 but r not
    # at the entries sent but not kept (back in r): at most k, and some on some worker.
    import torch

    velocities, sent_not_kept, k = [], 0, sparse_steps[-1]["k"]
    for rank in range(4):
        state = torch.load(f"{checkpoint}.rank{rank}", weights_only=True)["optimizer"]
        assert [group["momentum"] for group in state["param_groups"]] == [0.0]
        velocity = state["gtopk"]["velocity"].numpy()
        residual = state["gtopk"]["residual"].numpy()
        assert velocity.size == d and np.isfinite(velocity).all() and velocity.any()
        assert not np.any((residual == 0) & (velocity != 0)), rank
        back = np.count_nonzero((velocity == 0) & (residual != 0))
        assert back <= k, (rank, back, k)
        sent_not_kept += back
        velocities.append(velocity.tobytes())
    assert sent_not_kept > 0
    assert len(set(velocities)) == 4  # each worker's own (its own data)


@pytest.mark.parametrize(("script", "compression", "launcher"), margins.OTHER_SCHEMES)
def test_the_other_schemes_train_the_digits_from_every_example(script: str, compression: str,
                                                               launcher: str) -> None:
    """The examples' --compression takes the new schemes: 4 workers, 10 epochs at density 0.01,
    identical replicas, and the CNN learns (chance is 0.1; dense reaches 0.98 in 30 epochs; the
    floors: helpers/margins.py)."""
    quiet = ["--quiet"] if "torch" in script or "ddp" in script else []
    output = run_mpi(f"examples/{script}", 4, "--compression", compression, "--density", "0.01",
                     "--epochs", "10", *quiet, timeout_s=900, launcher=launcher)
    fields = parse_digits_run(output, 4)
    floor = margins.floor(margins.other_scheme_case(script, compression))
    assert float(fields["test_accuracy"]) >= floor, fields
    assert fields["compression"] == compression and int(fields["bytes_per_step"]) > 0, fields
