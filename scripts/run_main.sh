#!/usr/bin/env bash
# The main job: installs what is missing, then a 4-worker run under mpirun.
set -euo pipefail
REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO_ROOT"
bash scripts/install.sh
exec mpirun --allow-run-as-root --oversubscribe -np "${WORKERS:-4}" -x OMP_NUM_THREADS=1 \
    -x TF_CPP_MIN_LOG_LEVEL=3 .venv/bin/python examples/extension_smoke.py "$@"
