"""Apply the source fixes Horovod 0.28.1 needs to build against torch 2.13 / TF 2.21, and two
that make it cheaper to build and to start.

Each fix must match exactly once; a sdist that does not look like the one we know stops the
build with a message naming the file.

1. C++17 instead of C++14 (torch >= 2.1 headers need it): top-level and torch CMakeLists.
2. Drop xla_mpi_ops.cc from the TF sources (TF 2.21 wheels lack the XLA headers it includes).
3. CMake 4 compatibility is handled by the caller (cmake<4 / CMAKE_POLICY_VERSION_MINIMUM).
4. CMake's Release build instead of RelWithDebInfo: optimised code without debug information,
   which for code compiled against TensorFlow's and torch's headers is a quarter of the build's
   time and nearly all of the wheel's size.
5. horovodrun asks "was Horovod built with Gloo / MPI?" by importing a framework extension in a
   forked process, TensorFlow's first. Every extension is built from the same core and answers
   the same, so torch's, whose import is the cheaper, is asked first: each launch starts sooner.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

FIXES: list[tuple[str, str, str]] = [
    ("CMakeLists.txt", "set(CMAKE_CXX_STANDARD 14)", "set(CMAKE_CXX_STANDARD 17)"),
    ("horovod/torch/CMakeLists.txt", "set(CMAKE_CXX_STANDARD 14)", "set(CMAKE_CXX_STANDARD 17)"),
    (
        "horovod/tensorflow/CMakeLists.txt",
        'list(APPEND TF_SOURCES "${PROJECT_SOURCE_DIR}/horovod/tensorflow/xla_mpi_ops.cc")',
        "# xla_mpi_ops.cc left out: TF 2.21 wheels do not ship the XLA headers it needs",
    ),
    ("setup.py", "else 'RelWithDebInfo'", "else 'Release'  # patched: no debug information"),
    (
        "horovod/common/util.py",
        "EXTENSIONS = ['tensorflow', 'torch', 'mxnet']",
        "EXTENSIONS = ['torch', 'tensorflow', 'mxnet']  # patched: the cheaper import first",
    ),
]


def apply_fixes(source_dir: Path) -> None:
    for relative_path, old, new in FIXES:
        path = source_dir / relative_path
        text = path.read_text()
        if old not in text and new in text:
            continue  # already patched
        if text.count(old) != 1:
            sys.exit(f"patch_horovod: expected exactly one '{old}' in {path}, "
                     f"found {text.count(old)}")
        path.write_text(text.replace(old, new))
        print(f"patch_horovod: patched {relative_path}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("source_dir", type=Path, help="unpacked horovod-0.28.1 sdist")
    apply_fixes(parser.parse_args().source_dir)


if __name__ == "__main__":
    main()
