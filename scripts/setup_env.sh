#!/usr/bin/env bash
# Create/refresh the project virtualenv (.venv) and install the plugin with its dependencies.
# Usage: bash scripts/setup_env.sh        (run by scripts/demo.sh and scripts/test.sh, with their VENV)
# Env:   TORCH_SPEC  torch requirement to install first (default torch==2.13.0: on the project's
#                    machines a local CPU wheel; set e.g. TORCH_SPEC='torch>=2.1' elsewhere)
#        VENV        virtualenv directory (default: <repo>/.venv)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${VENV:-$ROOT/.venv}"
TORCH_SPEC="${TORCH_SPEC:-torch==2.13.0}"
PY="${PYTHON:-python3}"
stamp="$VENV/.installed"
want="$(cat "$ROOT/setup.cfg" "$ROOT/pyproject.toml"; echo "$TORCH_SPEC")"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  echo "[setup] $VENV is up to date"
else
  echo "[setup] creating $VENV (first run builds fairseq-fixed: ~3-4 minutes)"
  [ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
  "$VENV/bin/python" -m pip install -q --upgrade pip setuptools wheel
  "$VENV/bin/python" -m pip install -q "$TORCH_SPEC"
  "$VENV/bin/python" -m pip install -q -e "$ROOT[test]"
  printf '%s' "$want" > "$stamp.tmp" && mv "$stamp.tmp" "$stamp"
fi
