#!/usr/bin/env bash
# Set up the environment and run the whole test suite (what CI runs via .ci/run).
# Usage: bash scripts/test.sh [pytest args...]
# Env:   VENV            the virtualenv to set up and test in (default: <repo>/.venv; scripts/setup_env.sh)
#        PYTEST_WORKERS  pytest-xdist workers (default: auto = one per CPU core; 0 runs in this process).
#                        Each test file runs whole on one worker (--dist loadfile: its module fixtures are
#                        built once), the costliest files first (--no-loadscope-reorder keeps the order
#                        tests/conftest.py gives them: FILE_COSTS); tests/conftest.py gives each worker
#                        its share of the threads (cores // workers: one on 2 cores), and so the
#                        subprocesses it starts.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export VENV="${VENV:-$ROOT/.venv}"  # setup_env.sh's virtualenv (default <repo>/.venv)
bash "$ROOT/scripts/setup_env.sh"
cd "$ROOT"
set +e
"$VENV/bin/python" -m pytest -ra -n "${PYTEST_WORKERS:-auto}" --dist loadfile --no-loadscope-reorder --durations=20 "$@"
rc=$?
set -e
if [ "$rc" -eq 5 ]; then echo "pytest collected no tests: failing" >&2; exit 1; fi
exit "$rc"
