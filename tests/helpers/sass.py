"""The machine code (SASS) of the extension's CUDA kernels, read without a GPU.

`kernel_opcodes(binary, wanted)` extracts the cubins of `binary` (the built extension, or a
cubin) with cuobjdump, picks the kernels whose mangled names match the regular expression
`wanted`, and returns each one's opcodes in address order ("LDG.E", "STG.E.64", ...), keyed by
(cubin, mangled name): a kernel built for two architectures is there once for each (`demangle`
for messages).

Two measures of how a pass over d keeps memory busy, both over the opcodes in address order
(every copy of a loop body the compiler made, branches not followed):

    store_then_load(ops)   global loads placed right after a global store (no load between):
                           a load the compiler could not move above a store that may alias it
                           waits there for the loads the store needed, so each such place is a
                           round trip to memory that the thread makes alone
    loads_together(ops)    the longest run of global loads with no global store between them:
                           how many loads a thread can have in flight at once
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

_FUNCTION = re.compile(r"\n\s*Function : (\S+)")
_OPCODE = re.compile(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P[T0-9]+\s+)?([A-Z][A-Z0-9_.]*)")


def cuobjdump() -> str | None:
    """The cuobjdump of the nvidia-cuda-cuobjdump wheel (requirements.txt; its -sass runs the
    nvdisasm beside it, of nvidia-cuda-nvdisasm), else one on PATH or in the CUDA toolkit's
    folder; None if there is none."""
    for entry in map(Path, sys.path):
        for found in sorted(entry.glob("nvidia/cu*/bin/cuobjdump")):
            return str(found)
    return shutil.which("cuobjdump") or next(
        (str(p) for p in sorted(Path("/usr/local").glob("cuda*/bin/cuobjdump"))), None)


def kernel_opcodes(binary: Path, wanted: str, tool: str) -> dict[tuple[str, str], list[str]]:
    """{(cubin, mangled kernel name): its opcodes in address order} for the kernels of `binary`
    whose mangled names match `wanted`; empty when it holds no machine code (a PTX-only build:
    cuobjdump then extracts no cubin)."""
    pattern = re.compile(rb"_Z[A-Za-z0-9_]*(?:" + wanted.encode() + rb")[A-Za-z0-9_]*")
    kernels: dict[tuple[str, str], list[str]] = {}
    with tempfile.TemporaryDirectory() as folder:
        subprocess.run([tool, "-xelf", "all", str(binary.resolve())], cwd=folder,
                       capture_output=True, timeout=120)  # exits non-zero when there is none
        cubins = sorted(Path(folder).glob("*.cubin"))
        for cubin in cubins:
            names = sorted({m.decode() for m in pattern.findall(cubin.read_bytes())})
            if not names:
                continue
            sass = subprocess.run([tool, "-sass", "-fun", ",".join(names), str(cubin)],
                                  check=True, capture_output=True, text=True, timeout=300,
                                  env={**os.environ, "NVDISASM_PATH": str(Path(tool).parent)}
                                  ).stdout
            parts = _FUNCTION.split(sass)
            for name, body in zip(parts[1::2], parts[2::2], strict=True):
                kernels[cubin.name, name] = _OPCODE.findall(body)
    return kernels


def demangle(name: str) -> str:
    found = shutil.which("c++filt")
    if found is None:
        return name
    return subprocess.run([found, name], capture_output=True, text=True,
                          check=True).stdout.strip()


def store_then_load(opcodes: list[str]) -> int:
    count, last = 0, None
    for op in opcodes:
        if op.startswith("LDG"):
            count += last == "STG"
            last = "LDG"
        elif op.startswith("STG"):
            last = "STG"
    return count


def loads_together(opcodes: list[str]) -> int:
    longest = run = 0
    for op in opcodes:
        if op.startswith("LDG"):
            run += 1
            longest = max(longest, run)
        elif op.startswith("STG"):
            run = 0
    return longest
