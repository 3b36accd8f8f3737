#!/usr/bin/env bash
# The main job: installs what is missing, then trains a small CNN on scikit-learn's digits with
# 4 Horovod workers under mpirun, gradients exchanged by gTop-k at density 0.01.
# WORKERS=N changes the worker count; other arguments go to examples/pytorch_digits.py.
set -euo pipefail
REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$REPO_ROOT"
bash scripts/ci/install.sh
exec mpirun --allow-run-as-root --oversubscribe -np "${WORKERS:-4}" -x OMP_NUM_THREADS=1 \
    .venv/bin/python examples/pytorch_digits.py --compression gtopk --density 0.01 "$@"
