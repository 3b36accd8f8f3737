"""The sparse step's data path: which gtopk_hvd modules one optimizer step passes through.

    python scripts/dev/step_path.py                    # torch DistributedOptimizer, gTop-k, P = 1
    python scripts/dev/step_path.py --granularity bucket --momentum-correction
    python scripts/dev/step_path.py --functions        # the core's, lockstep's and schemes' calls
    PYTHONPATH=OTHER python scripts/dev/step_path.py   # another checkout's gtopk_hvd

Runs one warm-up step, then traces one `optimizer.step()` with `sys.setprofile`: every call
into a function of gtopk_hvd is an event; consecutive calls within one module are one visit.
Prints the path (module per visit, in order), the visits per module, the calls from one layer
into another (adapter, core, scheme, transport, kernels: `LAYERS`; a call's layer is its
module's, the caller's that of the frame that called it), and the calls of the density rule.
--functions also prints the calls into the step's own floors (the core, the lockstep, the
schemes), in order, indented by their depth among them (a generator resumed counts as a call).
Horovod's single-process init is used (no launcher needed).
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter

import numpy as np

LAYERS = (("adapter", ("torch", "tensorflow")),
          ("core", ("core", "sparse_state", "compression", "arguments", "density")),
          ("scheme", ("schemes", "sparsifiers", "reductions")),
          ("transport", ("transports",)),
          ("kernels", ("ops", "_arrays", "wire", "backend")))


STEP_FLOORS = ("gtopk_hvd.core", "gtopk_hvd.lockstep", "gtopk_hvd.schemes")


def layer_of(module: str) -> str:
    """The layer of a gtopk_hvd module ("" for anything else)."""
    if not module.startswith("gtopk_hvd."):
        return ""
    parts = module.split(".")[1:]
    for layer, names in LAYERS:
        if ".".join(parts[:2]) in names:
            return layer
    return next((layer for layer, names in LAYERS if parts[0] in names), parts[0])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parameters", type=int, default=200_000)
    parser.add_argument("--tensors", type=int, default=8)
    parser.add_argument("--density", type=float, default=0.01)
    parser.add_argument("--granularity", choices=["model", "bucket"], default="model")
    parser.add_argument("--momentum-correction", action="store_true")
    parser.add_argument("--functions", action="store_true")
    arguments = parser.parse_args()

    import horovod.torch as hvd
    import torch

    import gtopk_hvd.torch as gtopk

    hvd.init()
    sizes = [arguments.parameters // arguments.tensors] * arguments.tensors
    parameters = [torch.nn.Parameter(torch.zeros(n)) for n in sizes]
    optimizer = gtopk.DistributedOptimizer(
        torch.optim.SGD(parameters, lr=0.1),
        compression=gtopk.Compression.gtopk(
            arguments.density, granularity=arguments.granularity,
            momentum_correction=arguments.momentum_correction))
    generator = np.random.default_rng(0)

    def one_step() -> None:
        optimizer.zero_grad()
        for p in parameters:
            p.grad = torch.from_numpy(generator.standard_normal(p.numel()).astype(np.float32))
        optimizer.step()

    one_step()
    path, density_calls, crossings = [], Counter(), Counter()
    calls: list[str] = []  # --functions: the step floors' calls, indented by depth
    depth = [0]

    def profile(frame: object, event: str, _: object) -> None:
        module = frame.f_globals.get("__name__", "")
        own = module.startswith(STEP_FLOORS)
        if event == "return" and own:
            depth[0] -= 1
        if event != "call" or not module.startswith("gtopk_hvd"):
            return
        if own:
            calls.append("  " * depth[0] + f"{module[len('gtopk_hvd.'):]}.{frame.f_code.co_name}")
            depth[0] += 1
        if "density" in frame.f_code.co_name or frame.f_code.co_name in ("k_at", "budget"):
            density_calls[f"{module}.{frame.f_code.co_name}"] += 1
        if not path or path[-1] != module:
            path.append(module)
        caller = layer_of(frame.f_back.f_globals.get("__name__", "")) if frame.f_back else ""
        if caller and caller != layer_of(module):
            crossings[f"{caller} -> {layer_of(module)}"] += 1

    sys.setprofile(profile)
    one_step()
    sys.setprofile(None)
    visits = Counter(path)
    print("path:", " -> ".join(m.replace("gtopk_hvd.", "") for m in path))
    print(f"\n{len(path)} visits, {len(visits)} modules")
    for module, count in visits.most_common():
        print(f"  {count:3d}  {module}")
    print("\ncalls from one layer into another:")
    for crossing, count in sorted(crossings.items()):
        print(f"  {count:3d}  {crossing}")
    print("density rule calls:", dict(density_calls) or "none")
    if arguments.functions:
        print("\ncalls into the core, the lockstep and the schemes:")
        print("\n".join(calls))


if __name__ == "__main__":
    main()
