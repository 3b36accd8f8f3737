"""torch.compile and the DDP communication hook (gtopk_hvd.torch.ddp.gtopk_hook), every scheme.

Launches tests/mpi/torchrun_compiled_hook.py under torchrun on 2 workers (Gloo, CPU): for
every sparse scheme (topk, gtopk, gtopk-exact, micro, exdyna, sketch, oktopk) a DDP model with
the hook trains 8 iterations eagerly and through `torch.compile(ddp_model)` from the same
initial weights on the same batches, and the final weights are compared on every rank:

  buckets=fixed    (find_unused_parameters=True: DDP keeps its construction-time buckets, the
                   same in both runs) backend aot_eager: bit for bit; backend inductor (what
                   users get): within rounding, TOLERANCE, with the same entries sent
  buckets=rebuilt  DDP's default: the compiled backward delivers gradients in another order,
                   so DDP's rebuilt buckets group the parameters otherwise than in eager mode,
                   and the hook (which selects per bucket) sends other entries: the weights
                   differ by whole selections (~1e-3 here), not by rounding. Asserted: the hook
                   ran its sparse steps compiled, the replicas agree, and bitwise weights
                   should the buckets ever come out the same

Every run must have compiled (one graph per DDP bucket: DDPOptimizer split the model; a
silent eager fallback would compare eager with eager) and keep every rank's replica bitwise
identical. Why: torch.compile changes who computes the gradients the hook reads (the compiled
backward, split at DDP's buckets) and when DDP's reducer sees them; the hook must neither
break there nor train otherwise. The inductor cache is a fresh directory (the test's own), so
the compile is measured cold, as on a new machine.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from helpers.mpi_launcher import run_mpi

SCHEMES = ("topk", "gtopk", "gtopk-exact", "micro", "exdyna", "sketch", "oktopk")
RUNS = (("aot_eager", "fixed"), ("inductor", "fixed"), ("aot_eager", "rebuilt"))
TOLERANCE = 1e-6  # tests/mpi/torchrun_compiled_hook.py's TOLERANCE (its docstring: why)
BUCKETS = 3
LINE = re.compile(
    r"COMPILED scheme=(?P<scheme>\S+) backend=(?P<backend>\S+) buckets=(?P<buckets>\S+) "
    r"bitwise=(?P<bitwise>True|False) max_abs_diff=(?P<diff>\S+) "
    r"same_buckets=(?P<same>True|False) n_buckets=(?P<n>\d+) graphs=(?P<graphs>\d+) "
    r"replicas=(?P<replicas>\S+) eager_s=\S+ compiled_s=\S+ ok=(?P<ok>True|False)")


@pytest.mark.mpi
def test_compiled_ddp_with_the_hook_trains_as_eager(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    output = run_mpi("torchrun_compiled_hook.py", 2, launcher="torchrun", timeout_s=600)
    found = {(m["scheme"], m["backend"], m["buckets"]): m for m in LINE.finditer(output)}
    assert sorted(found) == sorted((s, b, k) for s in SCHEMES for b, k in RUNS), (
        f"runs reported: {sorted(found)}\n{output[-6000:]}")
    for (scheme, backend, buckets), m in found.items():
        where = f"{scheme} {backend} buckets={buckets}: {m.group(0)}"
        assert m["ok"] == "True", where
        assert m["replicas"] == "identical", where
        assert int(m["graphs"]) == BUCKETS and int(m["n"]) == BUCKETS, where
        diff = float(m["diff"])
        if buckets == "fixed":
            assert m["same"] == "True", where
            if backend == "aot_eager":
                assert m["bitwise"] == "True" and diff == 0.0, where
            else:
                assert diff <= TOLERANCE, where
        elif m["same"] == "True":
            assert m["bitwise"] == "True" and diff == 0.0, where
    assert "compiled hook ok on 2 workers" in output, output[-3000:]
