#!/usr/bin/env bash
# The test command: installs what is missing (scripts/install.sh), then lint, then the whole
# pytest suite, which launches its MPI programs with mpirun (each with a hard time limit).
# Exits non-zero on any failure, and when pytest collected no test (its exit code 5).
set -uo pipefail
REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO_ROOT"

bash scripts/install.sh || exit $?

echo "== tests: ruff"
.venv/bin/ruff check . || { echo "run_tests.sh: ruff found problems" >&2; exit 1; }

echo "== tests: pytest (unit and mpirun tests)"
# The suite's own limit per test is a backstop; MPI launches have their own shorter ones.
.venv/bin/python -m pytest tests -q -ra --timeout=1200 --durations=20 "$@"
code=$?
if [[ $code -eq 5 ]]; then
    echo "run_tests.sh: pytest collected no tests; the suite is broken" >&2
    exit 1
fi
exit $code
