#!/usr/bin/env bash
# The main job: set up the environment, then train a ReLA-g Transformer (3+3 layers, d 256) on real
# Multi30k En->De data, average its last checkpoints, translate test_2016/test_2017 with beam 4 and
# print SacreBLEU and chrF with their signatures.
#  - with a GPU: the converged budget (configs/multi30k/converged.yaml, 3,000 updates, fp16; minutes);
#  - on CPU: the 400-update smoke budget (~15 min on 2 cores, +4 min first set-up) -- early training,
#    a test that everything runs, not a converged model.
# Re-running with the same arguments resumes from the last checkpoint; a finished run only re-prints
# its scores. Other settings are another run: mt-experiment refuses to resume a run directory with
# them, so give it its own --out (the last --out wins).
# Usage: bash scripts/demo.sh [extra args for mt-experiment, e.g. --max-update 800 --out runs/demo/rela_g_800]
# Env:   VENV  the virtualenv (default: <repo>/.venv; scripts/setup_env.sh)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export VENV="${VENV:-$ROOT/.venv}"  # setup_env.sh's virtualenv (default <repo>/.venv)
bash "$ROOT/scripts/setup_env.sh"
cd "$ROOT"
PY="$VENV/bin/python"
if "$PY" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)'; then
  BUDGET=configs/multi30k/converged.yaml OUT=runs/demo/rela_g_converged
  echo "[demo] GPU found: converged budget ($BUDGET)"
else
  BUDGET=configs/multi30k/small_cpu.yaml OUT=runs/demo/rela_g
  echo "[demo] no GPU: the 400-update CPU smoke budget ($BUDGET). This is early training: expect SacreBLEU"
  echo "[demo] near 17 on test2016 (results/rela/table1_multi30k.md, row 7). A converged run (3,000 updates,"
  echo "[demo] configs/multi30k/converged.yaml; ~80 min here, minutes on a GPU) is what tests a claim:"
  echo "[demo] see results/README.md, or run: $0 --budget configs/multi30k/converged.yaml --out runs/demo/rela_g_converged"
fi
PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" exec "$PY" -m mt_pipeline.experiment --out "$OUT" --budget "$BUDGET" \
  --arch rela_transformer_small --fns rela_g rela_g rela_g --name "demo: ReLA-g, Multi30k en-de" "$@"
