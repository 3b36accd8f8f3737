#!/usr/bin/env bash
# The one install step: system OpenMPI, a virtual env in .venv with pinned packages, Horovod 0.28.1
# built from its sdist with our fixes (wheel cached outside the repo), then gtopk_hvd itself.
# Idempotent: every step checks whether it is already done; a second run takes seconds.
# Both README commands (scripts/ci/run_main.sh, scripts/ci/run_tests.sh) call it first.
set -euo pipefail

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
VENV="${GTOPK_HVD_VENV:-$REPO_ROOT/.venv}"
CACHE_DIR="${GTOPK_HVD_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/gtopk_hvd}"
HOROVOD_VERSION=0.28.1
TF_KERAS_PIN="tf-keras==2.21.0"
PY="$VENV/bin/python"

current_step="start"
on_error() {
    local code=$?
    echo "install.sh: FAILED in step '$current_step' (exit $code); see the output above for the cause" >&2
    exit "$code"
}
trap on_error ERR
# Each step prints the seconds the previous one took, so a slow install shows where it went.
step_started=$SECONDS
install_started=$SECONDS
step() {
    [[ "$current_step" == "start" ]] || echo "   ($((SECONDS - step_started)) s)"
    current_step="$1"; step_started=$SECONDS; echo "== install: $1"
}

# The slow builds run beside another step (the machine has cores to spare while pip unpacks or
# Horovod links): `in_background NAME LOG command...` starts one, `finish NAME PID LOG` waits for
# it and fails the install with the end of its log if it failed.
in_background() { local log="$2"; shift 2; "$@" >"$log" 2>&1 & }
finish() {
    if ! wait "$2"; then
        echo "install.sh: $1 failed; the end of its log ($3):" >&2
        tail -40 "$3" >&2
        false
    fi
}

# Stamps record what a step installed, so a rerun with the same inputs skips it.
stamp_matches() { [[ -f "$VENV/.gtopk-$1" && "$(cat "$VENV/.gtopk-$1")" == "$2" ]]; }
write_stamp() { echo "$2" >"$VENV/.gtopk-$1"; }

step "system OpenMPI (apt: libopenmpi-dev openmpi-bin)"
if ! dpkg -s libopenmpi-dev openmpi-bin >/dev/null 2>&1; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends libopenmpi-dev openmpi-bin >/dev/null
fi
command -v mpicxx >/dev/null || { echo "mpicxx not on PATH after installing OpenMPI" >&2; false; }
OMPI_VERSION="$(mpirun --allow-run-as-root --version | head -1 | awk '{print $NF}')"

step "virtual env at $VENV"
if [[ ! -x "$PY" ]]; then
    python3 -m venv "$VENV"
fi
PY_TAG="$("$PY" -c 'import sys; print(f"py{sys.version_info[0]}{sys.version_info[1]}")')"

step "pinned Python packages (requirements.txt, $TF_KERAS_PIN)"
requirements_key="$(cat "$REPO_ROOT/requirements.txt" | sha256sum | cut -c1-16)-$TF_KERAS_PIN-$OMPI_VERSION"
if ! stamp_matches requirements "$requirements_key"; then
    "$PY" -m pip install -q --upgrade "pip==25.3" "setuptools==80.9.0" "wheel==0.45.1"
    # mpi4py is compiled against the system OpenMPI so that it and Horovod load the same libmpi.
    # Its compile (one core, minutes) runs beside the install of the other packages.
    mpi4py_pin="$(grep -E '^mpi4py==' "$REPO_ROOT/requirements.txt")"
    mpi4py_dir="$(mktemp -d)"
    mpi4py_pid=""
    if [[ "$("$PY" -m pip list --format=freeze 2>/dev/null | grep -E '^mpi4py==' || true)" != "$mpi4py_pin" ]]; then
        in_background mpi4py "$mpi4py_dir/build.log" \
            "$PY" -m pip wheel -q --no-deps --no-binary mpi4py -w "$mpi4py_dir/wheel" "$mpi4py_pin"
        mpi4py_pid=$!
    fi
    "$PY" -m pip install -q -r <(grep -v -E '^mpi4py==' "$REPO_ROOT/requirements.txt")
    # tf-keras depends on `tensorflow`, which would install a second TF beside tensorflow-cpu.
    "$PY" -m pip install -q --no-deps "$TF_KERAS_PIN"
    if [[ -n "$mpi4py_pid" ]]; then
        finish "the mpi4py build" "$mpi4py_pid" "$mpi4py_dir/build.log"
        "$PY" -m pip install -q --no-deps "$mpi4py_dir"/wheel/mpi4py-*.whl
    fi
    rm -rf "$mpi4py_dir"
    write_stamp requirements "$requirements_key"
fi

# The extension is (re)built when a source that goes into it changes; when Horovod must be
# compiled too, the two builds run side by side (Horovod's configure and link use one core).
extension_key="$(cd "$REPO_ROOT" && { cat setup.py CMakeLists.txt $(find csrc -type f | sort); echo "CUDAARCHS=${CUDAARCHS:-}"; } | sha256sum | cut -c1-16)"
extension_pid=""
extension_log="$(mktemp)"
extension_wanted() {
    ! stamp_matches extension "$extension_key" || ! compgen -G "$REPO_ROOT/gtopk_hvd/_C*.so" >/dev/null
}
build_extension() (
    cd "$REPO_ROOT" && PATH="$VENV/bin:$PATH" "$PY" -m pip install -q --no-build-isolation --no-deps -e .
)

step "Horovod $HOROVOD_VERSION (PyTorch, TensorFlow, MPI)"
versions="$("$PY" - <<'EOF'
from importlib.metadata import version
print(f"torch{version('torch')}-tf{version('tensorflow-cpu')}")
EOF
)"
# The patches are part of the build: a changed scripts/ci/patch_horovod.py builds a new wheel.
patches="$(sha256sum "$REPO_ROOT/scripts/ci/patch_horovod.py" | cut -c1-12)"
horovod_key="horovod${HOROVOD_VERSION}-${PY_TAG}-${versions}-ompi${OMPI_VERSION}-patch${patches}"
if ! stamp_matches horovod "$horovod_key"; then
    wheel_dir="$CACHE_DIR/wheels/$horovod_key"
    if ! compgen -G "$wheel_dir/horovod-*.whl" >/dev/null; then
        echo "   building Horovod from source (4-8 minutes on 2 cores); cache: $wheel_dir"
        if extension_wanted; then
            echo "   building gtopk_hvd's extension beside it"
            in_background extension "$extension_log" build_extension
            extension_pid=$!
        fi
        build_dir="$(mktemp -d)"
        "$PY" -m pip download -q --no-deps --no-binary :all: -d "$build_dir" "horovod==$HOROVOD_VERSION"
        tar -xzf "$build_dir/horovod-$HOROVOD_VERSION.tar.gz" -C "$build_dir"
        "$PY" "$REPO_ROOT/scripts/ci/patch_horovod.py" "$build_dir/horovod-$HOROVOD_VERSION"
        (
            cd "$build_dir/horovod-$HOROVOD_VERSION"
            export PATH="$VENV/bin:$PATH" CMAKE_POLICY_VERSION_MINIMUM=3.5 MAKEFLAGS=-j2 \
                HOROVOD_WITH_MPI=1 HOROVOD_WITH_PYTORCH=1 HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITHOUT_MXNET=1
            "$PY" -m pip wheel -q --no-build-isolation --no-deps -w "$build_dir/wheel" . \
                >"$build_dir/build.log" 2>&1 || { tail -50 "$build_dir/build.log" >&2; false; }
        )
        mkdir -p "$wheel_dir"
        cp "$build_dir"/wheel/horovod-*.whl "$wheel_dir/"
        rm -rf "$build_dir"
    fi
    # Two pip installs do not share the venv at once: the extension's finishes first.
    if [[ -n "$extension_pid" ]]; then
        finish "the extension build" "$extension_pid" "$extension_log"
        write_stamp extension "$extension_key"
    fi
    "$PY" -m pip install -q --no-deps --force-reinstall "$wheel_dir"/horovod-*.whl
    write_stamp horovod "$horovod_key"
fi

step "gtopk_hvd (C++/CUDA extension, editable install)"
if extension_wanted; then
    build_extension
    write_stamp extension "$extension_key"
fi
rm -f "$extension_log"

step "done"
echo "== install: done in $((SECONDS - install_started)) s ($VENV)"
