#!/usr/bin/env bash
# Kept at this path for callers outside the repository and older instructions: the script is
# scripts/ci/run_tests.sh.
exec bash "$(dirname "${BASH_SOURCE[0]}")/ci/run_tests.sh" "$@"
