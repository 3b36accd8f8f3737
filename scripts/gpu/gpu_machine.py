"""Facts for the GPU check's report (scripts/gpu/gpu_check.sh).

    python scripts/gpu/gpu_machine.py machine OUT.json  # nvidia-smi, Python, torch, CUDA, nvcc,
    CPUs python scripts/gpu/gpu_machine.py build OUT.json    # the extension: built with CUDA
    kernels? python scripts/gpu/gpu_machine.py nccl-home         # the folder holding
    lib/libnccl.so.2
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
from importlib import metadata


def _run(command: list[str]) -> str:
    try:
        return subprocess.run(command, capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError) as error:
        return f"{command[0]}: {error}"


def _version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def machine() -> dict:
    facts: dict = {"python": platform.python_version(), "executable": sys.executable,
                   "cpus": os.cpu_count(), "platform": platform.platform(),
                   "nvidia_smi": _run(["nvidia-smi"]),
                   "nvcc": (_run(["nvcc", "--version"]).strip().splitlines() or ["none"])[-1],
                   "packages": {name: _version(name) for name in (
                       "torch", "torchvision", "numpy", "pytest", "pytest-xdist",
                       "pytest-timeout", "pybind11", "cmake", "mpi4py", "cffi", "horovod",
                       "nvidia-nccl-cu13", "nvidia-nccl-cu12", "lightning")}}
    query = _run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total",
                  "--format=csv,noheader"]).strip()
    if query and "," in query:
        facts["gpu"], facts["driver"], facts["gpu_memory"] = [
            part.strip() for part in query.splitlines()[0].split(",")[:3]]
    try:
        import torch

        facts.update(torch=torch.__version__, torch_cuda=torch.version.cuda,
                     cuda_available=torch.cuda.is_available())
        if torch.cuda.is_available():
            props = torch.cuda.get_device_properties(0)
            facts.update(torch_gpu=props.name, capability=f"{props.major}.{props.minor}",
                         multiprocessors=props.multi_processor_count,
                         memory_gib=round(props.total_memory / 2**30, 1))
            facts.setdefault("gpu", props.name)
    except Exception as error:  # noqa: BLE001 - a fact like any other
        facts["torch_error"] = repr(error)
    return facts


def build() -> dict:
    from gtopk_hvd import _C, ops

    return {"cuda_built": bool(ops.cuda_built), "simd": _C.simd_level(),
            "extension": _C.__file__}


def nccl_home() -> str:
    """The installed NCCL wheel's folder (include/nccl.h, lib/libnccl.so.2): nvidia.nccl's, or
    wherever under the nvidia namespace libnccl.so.2 lies (CUDA 13 wheels may nest it)."""
    from pathlib import Path

    import nvidia

    roots = [Path(p) for p in nvidia.__path__]
    for root in roots:
        if (root / "nccl" / "lib" / "libnccl.so.2").is_file():
            return str(root / "nccl")
    for root in roots:
        for library in sorted(root.rglob("libnccl.so.2")):
            return str(library.parent.parent)
    raise SystemExit(f"no libnccl.so.2 under {roots}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=["machine", "build", "nccl-home"])
    parser.add_argument("json", nargs="?", help="where to write the facts (machine, build)")
    args = parser.parse_args()
    if args.what == "nccl-home":
        print(nccl_home())
        return
    if not args.json:
        parser.error(f"{args.what} needs the JSON path")
    what, path = args.what, args.json
    facts = {"machine": machine, "build": build}[what]()
    with open(path, "w") as file:
        json.dump(facts, file, indent=1)
    print(json.dumps({k: v for k, v in facts.items() if k != "nvidia_smi"}, indent=1))
    if what == "machine":
        print(f"{facts.get('gpu', 'no GPU')}, driver {facts.get('driver', '-')}, torch "
              f"{facts.get('torch')} (CUDA {facts.get('torch_cuda')}), Python {facts['python']}")
    else:
        print(f"extension built; CUDA kernels: {facts['cuda_built']}; SIMD: {facts['simd']}")


if __name__ == "__main__":
    main()
