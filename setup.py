"""Build gtopk_hvd: the Python package plus its C++/CUDA extension, compiled by CMake.

`pip install .`, `pip install -e .`, `pip wheel .` and `python -m build` all run CMake on
CMakeLists.txt (metadata, dependencies and extras: pyproject.toml). The CMake build folder is
build/cmake-<python tag> beside this file, so that a rebuild is incremental; CMake writes the
module where setuptools asks for it (the package folder for an editable install, setuptools'
build/lib for a wheel), so the wheel carries it. Environment:
  GTOPK_WITH_CUDA=0   skip the CUDA kernels even when nvcc is found
  GTOPK_NATIVE=0      do not tune for the building CPU (-march=native): set it when the wheel
                      is for other machines
  GTOPK_BUILD_JOBS=N  parallel compile jobs (default: number of CPUs)
  CUDAARCHS=...       the GPU architectures the CUDA kernels are compiled for (CMake's own
                      variable, e.g. "86" or "80;90"; default: CMakeLists.txt's), followed by
                      an existing build folder too
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent


def _drop_if_configured_elsewhere(build_dir: Path) -> None:
    """A build folder that CMake configured for another source folder (the tree was copied or
    moved) makes CMake stop with an error: start that one afresh."""
    cache = build_dir / "CMakeCache.txt"
    if not cache.is_file():
        return
    for line in cache.read_text(errors="replace").splitlines():
        if line.startswith("CMAKE_HOME_DIRECTORY:"):
            if Path(line.partition("=")[2]).resolve() != ROOT:
                shutil.rmtree(build_dir)
            return


class CMakeExtension(Extension):
    def __init__(self, name: str) -> None:
        super().__init__(name, sources=[])


class CMakeBuild(build_ext):
    def build_extension(self, ext: Extension) -> None:
        output_dir = Path(self.get_ext_fullpath(ext.name)).resolve().parent
        build_dir = ROOT / "build" / f"cmake-py{sys.version_info[0]}{sys.version_info[1]}"
        _drop_if_configured_elsewhere(build_dir)
        build_dir.mkdir(parents=True, exist_ok=True)
        configure = [
            "cmake",
            "-S", str(ROOT),
            "-B", str(build_dir),
            f"-DPython_EXECUTABLE={sys.executable}",
            f"-DCMAKE_LIBRARY_OUTPUT_DIRECTORY={output_dir}",
            "-DCMAKE_BUILD_TYPE=Release",
            f"-DGTOPK_WITH_CUDA={'OFF' if os.environ.get('GTOPK_WITH_CUDA') == '0' else 'ON'}",
            f"-DGTOPK_NATIVE={'OFF' if os.environ.get('GTOPK_NATIVE') == '0' else 'ON'}",
        ]
        # Forget the architectures a previous configure cached: CMakeLists.txt reads CUDAARCHS.
        configure.append("-UCMAKE_CUDA_ARCHITECTURES")
        jobs = os.environ.get("GTOPK_BUILD_JOBS", str(os.cpu_count() or 1))
        subprocess.run(configure, check=True)
        subprocess.run(["cmake", "--build", str(build_dir), "--parallel", jobs], check=True)


setup(
    ext_modules=[CMakeExtension("gtopk_hvd._C")],
    cmdclass={"build_ext": CMakeBuild},
)
