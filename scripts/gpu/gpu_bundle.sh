#!/usr/bin/env bash
# Puts into .gpu_bundle/ (ignored by git) what scripts/gpu/gpu_check.sh needs on a GPU machine that
# can fetch nothing: Horovod 0.28.1's sdist and the cffi and pycparser wheels for CPython 3.12 on
# x86-64 Linux (Horovod's setup imports cffi), plus the commit they go with. About 4 MB; pass
# .gpu_bundle in the device call's `carry` (docs/gpu.md). Run it on the development machine, in
# the repository: it downloads with pip from PyPI (or copies from GPU_BUNDLE_FROM, a folder
# holding the same three files). Idempotent.
set -euo pipefail

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
BUNDLE="${GPU_CHECK_BUNDLE:-$REPO_ROOT/.gpu_bundle}"
PY="${GPU_BUNDLE_PYTHON:-python3}"
mkdir -p "$BUNDLE"

have() { compgen -G "$BUNDLE/$1" >/dev/null; }

if [[ -n ${GPU_BUNDLE_FROM:-} ]]; then
    cp "$GPU_BUNDLE_FROM"/horovod-0.28.1.tar.gz "$GPU_BUNDLE_FROM"/cffi-*cp312*.whl \
        "$GPU_BUNDLE_FROM"/pycparser-*.whl "$BUNDLE/"
fi
if ! have horovod-0.28.1.tar.gz; then
    "$PY" -m pip download -q --no-deps --no-binary :all: -d "$BUNDLE" horovod==0.28.1
fi
if ! have 'cffi-*cp312*manylinux*x86_64*.whl' || ! have 'pycparser-*.whl'; then
    "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
        --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
        --platform manylinux2014_x86_64 -d "$BUNDLE" cffi pycparser
fi
# One version of each: two would both be installed there.
for pattern in 'cffi-*.whl' 'pycparser-*.whl'; do
    mapfile -t found < <(compgen -G "$BUNDLE/$pattern" | sort -V)
    if (( ${#found[@]} > 1 )); then
        rm -f "${found[@]:0:${#found[@]}-1}"
    fi
done
git -C "$REPO_ROOT" rev-parse HEAD >"$BUNDLE/commit.txt" 2>/dev/null || echo unknown >"$BUNDLE/commit.txt"
ls -la "$BUNDLE"
du -sh "$BUNDLE"
