#!/usr/bin/env bash
# Packaging as users install it: builds the sdist and, from the sdist, the wheel (python -m build),
# checks what each holds, installs the wheel with --no-deps into a fresh virtual env that already
# has the frameworks and Horovod (those of .venv, without .venv's own gtopk_hvd), and from a
# folder outside the repository imports it, runs a kernel and reads its metadata: the only
# requirement without an extra is numpy, mpi4py is the `mpi` extra, the version is
# gtopk_hvd.__version__ and CHANGELOG.md has an entry for it.
#
# Works on a copy of the working tree (tracked and untracked, not ignored, files) in a temporary
# folder, so it leaves nothing in the repository and does not touch the editable install's build.
# Needs scripts/ci/install.sh's .venv (python -m build, setuptools, pybind11, cmake). Environment:
#   GTOPK_HVD_VENV         the env that builds and lends its packages (default: .venv)
#   GTOPK_WITH_CUDA        default 0 here (the CUDA kernels triple the compile time); 1 to include
#   GTOPK_BUILD_JOBS       default 2
#   BUILD_ISOLATION=1      let `build` fetch the build requirements into an isolated env, as
#                          `pip install .` does for users (needs PyPI); default: .venv's
#   KEEP=1                 keep the temporary folder and print its path
set -euo pipefail

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
VENV="${GTOPK_HVD_VENV:-$REPO_ROOT/.venv}"
PY="$VENV/bin/python"
export GTOPK_WITH_CUDA="${GTOPK_WITH_CUDA:-0}" GTOPK_BUILD_JOBS="${GTOPK_BUILD_JOBS:-2}"
export PATH="$VENV/bin:$PATH"  # cmake and ninja of the env

fail() { echo "check_packaging.sh: FAILED: $*" >&2; exit 1; }
[[ -x "$PY" ]] || fail "no $PY: run scripts/ci/install.sh first"
"$PY" -c "import build" 2>/dev/null || fail "python -m build is not in $VENV: run scripts/ci/install.sh"

WORK="$(mktemp -d "${TMPDIR:-/tmp}/gtopk-packaging.XXXXXX")"
if [[ "${KEEP:-0}" == 1 ]]; then
    trap 'echo "check_packaging.sh: kept $WORK"' EXIT
else
    trap 'rm -rf "$WORK"' EXIT
fi
start=$SECONDS

echo "== packaging: copy of the working tree"
mkdir -p "$WORK/src"
(
    cd "$REPO_ROOT"
    git ls-files -z --cached --others --exclude-standard | while IFS= read -r -d '' file; do
        [[ -f "$file" ]] && printf '%s\0' "$file"  # a file deleted but not yet staged: skip
    done | xargs -0 cp --parents -t "$WORK/src"
)

echo "== packaging: sdist, then the wheel from the sdist (python -m build)"
build_args=(--outdir "$WORK/dist")
[[ "${BUILD_ISOLATION:-0}" == 1 ]] || build_args+=(--no-isolation)
"$PY" -m build "${build_args[@]}" "$WORK/src" >"$WORK/build.log" 2>&1 \
    || { tail -40 "$WORK/build.log" >&2; fail "python -m build (log above)"; }
sdist="$(compgen -G "$WORK/dist/gtopk_hvd-*.tar.gz")" || fail "no sdist in $WORK/dist"
wheel="$(compgen -G "$WORK/dist/gtopk_hvd-*.whl")" || fail "no wheel in $WORK/dist"
echo "   $(basename "$sdist"), $(basename "$wheel")"

echo "== packaging: contents"
"$PY" - "$sdist" "$wheel" "$WORK/src" <<'EOF'
import sys
import tarfile
import zipfile
from pathlib import Path

sdist, wheel, src = sys.argv[1], sys.argv[2], Path(sys.argv[3])
with tarfile.open(sdist) as tar:
    in_sdist = {name.split("/", 1)[1] for name in tar.getnames() if "/" in name}
with zipfile.ZipFile(wheel) as zf:
    in_wheel = set(zf.namelist())

problems = []
sources = sorted(str(p.relative_to(src)) for p in (src / "csrc").rglob("*") if p.is_file())
for name in ["setup.py", "pyproject.toml", "CMakeLists.txt", "README.md", "CHANGELOG.md",
             "MANIFEST.in", *sources]:
    if name not in in_sdist:
        problems.append(f"sdist lacks {name}")
problems += [f"sdist holds a build output: {n}" for n in sorted(in_sdist)
             if n.endswith((".so", ".pyc")) or n.startswith(("build/", "dist/"))]

modules = sorted(str(p.relative_to(src)) for p in (src / "gtopk_hvd").rglob("*.py"))
problems += [f"wheel lacks {m}" for m in modules if m not in in_wheel]
extensions = [n for n in in_wheel if n.startswith("gtopk_hvd/_C.") and n.endswith(".so")]
if len(extensions) != 1:
    problems.append(f"wheel should hold one gtopk_hvd/_C*.so, holds {extensions}")
problems += [f"wheel holds a file outside the package: {n}" for n in sorted(in_wheel)
             if not n.startswith(("gtopk_hvd/", "gtopk_hvd-"))]
if problems:
    sys.exit("\n".join(problems))
print(f"   sdist: {len(in_sdist)} files ({len(sources)} in csrc/); wheel: {len(in_wheel)} files, "
      f"{len(modules)} modules, extension {extensions[0]}")
EOF

echo "== packaging: fresh env with $VENV's packages but not its gtopk_hvd"
"$PY" -m venv "$WORK/env"
site_of() { "$1" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])'; }
host_site="$(site_of "$PY")"
env_site="$(site_of "$WORK/env/bin/python")"
# The frameworks and Horovod as a user has them, installed beforehand: every entry of the host's
# site-packages except gtopk_hvd's own (its editable finder and metadata), on the path after the
# env's own site-packages.
mkdir "$WORK/host-site"
for entry in "$host_site"/*; do
    case "$(basename "$entry")" in
        gtopk_hvd*|__editable__*gtopk_hvd*|*.pth) ;;
        *) ln -s "$entry" "$WORK/host-site/" ;;
    esac
done
echo "$WORK/host-site" >"$env_site/zz_host_site.pth"
"$WORK/env/bin/python" -m pip install -q --no-deps --no-index "$wheel" \
    || fail "pip install of the wheel"

echo "== packaging: import from outside the repository"
cd "$WORK"
"$WORK/env/bin/python" - "$REPO_ROOT" "$env_site" <<'EOF'
import re
import sys
from importlib.metadata import distribution
from pathlib import Path

repo, env_site = Path(sys.argv[1]), Path(sys.argv[2]).resolve()


class NoMpi4py:
    """A torchrun / horovodrun --gloo user has no mpi4py: the package must import without it."""

    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "mpi4py":
            raise ImportError(f"mpi4py is not installed (check_packaging.sh hides it): {name}")


sys.meta_path.insert(0, NoMpi4py())

import numpy as np  # noqa: E402

import gtopk_hvd  # noqa: E402
import gtopk_hvd._C  # noqa: E402, F401
from gtopk_hvd import ops  # noqa: E402

for module in (gtopk_hvd, gtopk_hvd._C):
    where = Path(module.__file__).resolve()
    if env_site not in where.parents:
        sys.exit(f"{module.__name__} loaded from {where}, not from the installed wheel")

x = np.array([0.5, -3.0, 2.0, 0.0, -1.0, 4.0], dtype=np.float32)
indices, values = ops.topk_abs(x, 3)
if sorted(indices.tolist()) != [1, 2, 5] or sorted(values.tolist()) != [-3.0, 2.0, 4.0]:
    sys.exit(f"topk_abs gave {indices}, {values}")

dist = distribution("gtopk_hvd")
if dist.version != gtopk_hvd.__version__:
    sys.exit(f"metadata version {dist.version} != gtopk_hvd.__version__ {gtopk_hvd.__version__}")
requires = dist.requires or []
plain = [r for r in requires if "extra ==" not in r]
if plain != ["numpy"]:
    sys.exit(f"requirements without an extra should be ['numpy'], are {plain}")
extras = dist.metadata.get_all("Provides-Extra") or []
if "mpi" not in extras or not any(re.match(r'mpi4py\b.*extra == "mpi"', r) for r in requires):
    sys.exit(f"mpi4py should be the `mpi` extra; extras {extras}, requirements {requires}")
changelog = (repo / "CHANGELOG.md").read_text()
if not re.search(rf"^## \[{re.escape(gtopk_hvd.__version__)}\]", changelog, re.MULTILINE):
    sys.exit(f"CHANGELOG.md has no '## [{gtopk_hvd.__version__}]' entry")

# The torch adapter and its DDP hook, as a torchrun user imports them (without mpi4py).
try:
    import torch  # noqa: F401
except ImportError:
    print("   (torch not installed: adapter import not checked)")
else:
    import gtopk_hvd.torch  # noqa: F401
    import gtopk_hvd.torch.ddp  # noqa: F401
print(f"   gtopk_hvd {dist.version} from {Path(gtopk_hvd.__file__).parent}: topk_abs ran, "
      f"gtopk_hvd.torch imported without mpi4py; requires {plain}, extras {extras}")
EOF
shown="$("$WORK/env/bin/python" -m pip show gtopk_hvd 2>/dev/null)" || fail "pip show gtopk_hvd"
grep -E '^(Name|Version|Requires):' <<<"$shown" | sed 's/^/   /'
grep -qx 'Requires: numpy' <<<"$shown" || fail "pip show should list numpy alone under Requires"

echo "== packaging: ok ($((SECONDS - start)) s)"
