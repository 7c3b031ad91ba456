#!/usr/bin/env bash
# The main job: set up the environment, then train a ReLA-g Transformer on real Multi30k En->De
# data on CPU, average its last checkpoints, translate test_2016/test_2017 with beam 4 and print
# the SacreBLEU scores with their signature.  ~15 minutes on 2 CPU cores (+4 min first set-up).
# Re-running resumes from the last checkpoint; a finished run only re-prints its scores.
# Usage: bash scripts/demo.sh [extra args for scripts/experiment.py, e.g. --max-update 800]
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$ROOT/scripts/setup_env.sh"
cd "$ROOT"
exec "$ROOT/.venv/bin/python" scripts/experiment.py --out runs/demo/rela_g --arch rela_transformer_small \
  --fns rela_g rela_g rela_g --name "demo: ReLA-g, Multi30k en-de" "$@"
