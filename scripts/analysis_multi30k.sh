#!/usr/bin/env bash
# Regenerate results/analysis/: attention analysis of the Multi30k En->De models of ReLA Table 1
# (row1 softmax [stock fairseq transformer], row2 sparsemax, row3 1.5-entmax, row7 ReLA-g) on the
# test split (test_2016_flickr), with the hallucination test, heatmaps of three sentences and the
# ranking of the valid split by cross-attention null rate.
#
#   scripts/analysis_multi30k.sh [RUNS_DIR] [DATA_PREP_DIR] [OUT_DIR]
#
# Defaults: RUNS_DIR=runs/rela_table1, DATA_PREP_DIR=data-bin/multi30k_en_de, OUT=results/analysis.
# AER (ReLA Table 5 / Fig. 4): the four En->De models against the RWTH De-En gold alignments (GOLD_DIR,
# default ../shared/data/rwth_gold_alignment_de_en; skipped when it is not there), as §5.2 measures its
# En-De models, with the data-prep's BPE codes; DEEN_CHECKPOINTS="label=ck ..." (or DEEN_CHECKPOINT=ck,
# labelled deen) adds De->En models trained on the same data-prep (e.g. `--source-lang de --target-lang
# en` on DATA_PREP_DIR/bin) to the same AER table.  Checkpoints: the one each row's run was scored with
# (its result.json; average_last3.pt at smoke, average_last5_epochs.pt at the converged budget:
# RUNS_DIR=runs/converged/rela_table1), else average_last3.pt, else checkpoints/checkpoint_last.pt.
# A DEEN_CHECKPOINTS path may be a run directory too.  (ReLA Table 5 alone: `reproduce rela table5`.)
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
RUNS="${1:-$REPO/runs/rela_table1}"
PREP="${2:-$REPO/data-bin/multi30k_en_de}"
OUT="${3:-$REPO/results/analysis}"
GOLD_DIR="${GOLD_DIR:-$REPO/../shared/data/rwth_gold_alignment_de_en}"
PYTHON="${PYTHON:-$(command -v python || echo "$REPO/.venv/bin/python")}"
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}" MKL_NUM_THREADS="${MKL_NUM_THREADS:-1}"

ck() {  # checkpoint of a row: the run directory of a finished mt-experiment run (the analysis reads
        # the checkpoint its BLEU was scored with: result.json's decoded_checkpoint), else a file
  if [[ -f "$RUNS/$1/result.json" ]]; then echo "$RUNS/$1"
  elif [[ -f "$RUNS/$1/average_last3.pt" ]]; then echo "$RUNS/$1/average_last3.pt"
  elif [[ -f "$RUNS/$1/checkpoints/checkpoint_last.pt" ]]; then echo "$RUNS/$1/checkpoints/checkpoint_last.pt"
  else echo "no checkpoint for $1 in $RUNS" >&2; exit 1; fi
}
# DEEN_CHECKPOINTS="softmax_deen=ck1 rela_g_deen=ck2" (De->En models beside the four En->De ones in the
# AER table) or DEEN_CHECKPOINT=ck (one model, labelled deen)
DEEN=(${DEEN_CHECKPOINTS:-})
[[ -z "${DEEN_CHECKPOINT:-}" ]] || DEEN+=("deen=$DEEN_CHECKPOINT")
AER=()
if [[ -d "$GOLD_DIR" ]]; then
  AER=(--aer-checkpoint "softmax=$(ck row1)" "sparsemax=$(ck row2)" "entmax15=$(ck row3)" "rela_g=$(ck row7)"
       "${DEEN[@]}" --aer-gold "$GOLD_DIR" --bpe-codes "$PREP/bpe/codes")
elif (( ${#DEEN[@]} )); then
  echo "no gold alignments at $GOLD_DIR (set GOLD_DIR): AER not measured" >&2; exit 2
else
  echo "no gold alignments at $GOLD_DIR (set GOLD_DIR): AER skipped" >&2
fi
"$PYTHON" "$REPO/scripts/analyze_attention.py" \
  --checkpoint "softmax=$(ck row1)" "sparsemax=$(ck row2)" "entmax15=$(ck row3)" "rela_g=$(ck row7)" \
  --data "$PREP/bin" --source-lang en --target-lang de --split test \
  --hallucination --heatmap-ids 0 1 2 --heatmap-kinds cross \
  --rank-split valid --rank-with rela_g \
  --out "$OUT" "${AER[@]}"
