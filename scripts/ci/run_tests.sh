#!/usr/bin/env bash
# The test command: installs what is missing (scripts/ci/install.sh), then lint, then the whole
# pytest suite, which launches its MPI programs with mpirun (each with a hard time limit).
# Without arguments: the tests that launch nothing on every core, then the launches one at a time;
# with arguments, one pytest run with them. Exits non-zero on any failure, and when a pytest run
# collected no test (its exit code 5).
set -uo pipefail
REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$REPO_ROOT"

# Without a GPU the CUDA kernels are only compiled, never run: for one architecture, the oldest
# one the build targets (sm_80, the strictest on what the code may use), which halves nvcc's time.
if [[ -z "${CUDAARCHS:-}" ]] && ! nvidia-smi -L >/dev/null 2>&1; then
    export CUDAARCHS=80-real
    echo "== tests: no GPU here: the CUDA kernels are compiled for sm_80 only (CUDAARCHS=$CUDAARCHS)"
fi
bash scripts/ci/install.sh || exit $?

# Our modules' bytecode, written once: where PYTHONDONTWRITEBYTECODE is set, each of the hundreds
# of processes the launches start would compile them again.
PYTHONDONTWRITEBYTECODE= .venv/bin/python -m compileall -q gtopk_hvd examples tests >/dev/null

echo "== tests: ruff"
.venv/bin/ruff check . || { echo "run_tests.sh: ruff found problems" >&2; exit 1; }

# The suite's own limit per test is a backstop; MPI launches have their own shorter ones.
pytest_run() {
    .venv/bin/python -m pytest tests -q -ra --timeout=1200 --durations=20 "$@"
    local code=$?
    if [[ $code -eq 5 ]]; then
        echo "run_tests.sh: pytest collected no tests ($*); the suite is broken" >&2
        return 1
    fi
    return $code
}

if [[ $# -gt 0 ]]; then
    echo "== tests: pytest $*"
    pytest_run "$@"
    exit $?
fi
# The whole suite in two runs: the tests that launch nothing on every core (pytest-xdist), then
# the launches one at a time (each already keeps the cores busy with its ranks).
echo "== tests: pytest, the tests that launch no MPI job (on every core)"
pytest_run -m "not mpi" -n auto
unit=$?
echo "== tests: pytest, the mpirun / horovodrun / torchrun tests (one at a time)"
pytest_run -m mpi
launches=$?
if [[ $unit -ne 0 || $launches -ne 0 ]]; then
    echo "run_tests.sh: failures (tests without launches: exit $unit; with: exit $launches)" >&2
    exit 1
fi
