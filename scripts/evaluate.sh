#!/usr/bin/env bash
# Translate test sets with a fairseq checkpoint and score them: entry point of mt_pipeline.evaluate
# (console command mt-evaluate; see --help).  PYTHON: the interpreter with fairseq (default: python
# on PATH if it imports fairseq, else <repo>/.venv/bin/python).
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if [[ -z "${PYTHON:-}" ]]; then
  if command -v python >/dev/null 2>&1 && python -c 'import fairseq_cli' 2>/dev/null; then PYTHON=python
  else PYTHON="$REPO/.venv/bin/python"; fi
fi
PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}" exec "$PYTHON" -m mt_pipeline.evaluate "$@"
