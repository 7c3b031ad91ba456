#!/usr/bin/env bash
# Translate test sets with a fairseq checkpoint and score them (sacreBLEU + tokenized BLEU).
#
# Usage: scripts/evaluate.sh --checkpoint CKPT --data-bin DIR --prep-dir DIR --src en --tgt de
#            [--subsets test,test1] [--beam 4] [--lenpen 0.6] [--batch-size 128] [--out DIR]
#            [--user-dir fairseq_plugins] [--extra "..."] [--ribes]
# Run with --help for details.  For every subset S this runs fairseq-generate (log kept as
# <out>/S.generate.log), extracts the hypotheses in corpus order checking that none is missing
# (scripts/extract_hypotheses.py), scores them against <prep-dir>/raw/S.TGT (sacreBLEU, 13a,
# mixed case) and <prep-dir>/tok/S.TGT (tokenized BLEU) with scripts/score.py, writes
# <out>/S.json and prints one summary line.  When the prep truecased the target side
# (<prep-dir>/tc/truecase-model.TGT exists: data-prep's `truecase` recipes, e.g. E-ATT's), the
# hypotheses are detruecased (Moses detruecase.perl, sacremoses) before both scores, so both
# compare against the references in their original case.
set -euo pipefail

PROG="scripts/evaluate.sh"
SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$SCRIPT_DIR/.." && pwd)"

usage() {
  cat <<EOF
Usage: $PROG --checkpoint CKPT --data-bin DIR --prep-dir DIR --src LANG --tgt LANG [options]

Translate fairseq subsets with CKPT and score them.

Required:
  --checkpoint CKPT     model checkpoint (.pt)
  --data-bin DIR        fairseq binarized data dir (e.g. data-bin/multi30k_en_de/bin)
  --prep-dir DIR        data-prep output dir holding raw/S.TGT (detokenized reference) and
                        tok/S.TGT (Moses-tokenised reference), e.g. data-bin/multi30k_en_de
  --src LANG, --tgt LANG  translation direction, e.g. --src en --tgt de (or --src de --tgt en)

Options:
  --subsets LIST        comma-separated fairseq subsets (default: test,test1;
                        Multi30k: valid=val, test=test_2016_flickr, test1=test_2017_flickr)
  --beam N              beam size (default: 4)
  --lenpen X            length penalty (default: 0.6)
  --batch-size N        sentences per batch (default: 128)
  --out DIR             output dir (default: <checkpoint dir>/eval_<checkpoint name>)
  --user-dir DIR        fairseq --user-dir (default: <repo>/fairseq_plugins; "" or none: no user dir)
  --extra "ARGS"        extra fairseq-generate arguments, split on whitespace (no quoting)
  --ribes               also compute RIBES on the tokenized text (scripts/score.py --ribes;
                        slow on long sentences, so off by default)
  -h, --help            show this help

Outputs in <out>, per subset S:
  S.generate.log   full fairseq-generate output (stdout+stderr)
  S.hyp.tok        hypotheses, Moses-tokenised, BPE removed (in corpus order; detruecased
                   when <prep-dir>/tc/truecase-model.TGT exists)
  S.hyp.tc         (truecased preps only) the hypotheses as generated, before detruecasing
  S.hyp.detok      hypotheses, detokenized (sacremoses)
  S.json           scores: bleu, signature, tok_bleu, n_hyp, n_ref, hyp, ref, ... and the settings
Each file is written to a temp file and renamed.  Exits non-zero if fairseq-generate fails or
the number of hypotheses differs from the number of reference lines.
Environment: PYTHON (interpreter with fairseq; default: python on PATH, else <repo>/.venv/bin/python).
EOF
}

log() { echo "[evaluate] $*" >&2; }
die() { echo "[evaluate] ERROR: $*" >&2; exit 1; }
is_posint() { [[ "$1" =~ ^[0-9]+$ ]] && (( 10#$1 > 0 )); }
is_number() { [[ "$1" =~ ^-?[0-9]+([.][0-9]+)?$|^-?[.][0-9]+$ ]]; }

CKPT="" DATA_BIN="" PREP_DIR="" SRC="" TGT=""
SUBSETS="test,test1" BEAM=4 LENPEN=0.6 BATCH_SIZE=128 OUT="" USER_DIR="$REPO/fairseq_plugins" EXTRA=""
RIBES_ARGS=()
VALID_OPTS="--checkpoint, --data-bin, --prep-dir, --src, --tgt, --subsets, --beam, --lenpen, --batch-size, --out, --user-dir, --extra, --ribes, --help"
while (( $# )); do
  arg="$1"
  if [[ "$arg" == --*=* ]]; then set -- "${arg%%=*}" "${arg#*=}" "${@:2}"; arg="$1"; fi
  case "$arg" in
    -h|--help) usage; exit 0 ;;
    --ribes) RIBES_ARGS=(--ribes); shift; continue ;;
    --checkpoint|--data-bin|--prep-dir|--src|--tgt|--subsets|--beam|--lenpen|--batch-size|--out|--user-dir|--extra)
      (( $# >= 2 )) || die "$arg needs a value (see --help)"
      val="$2"; shift 2
      case "$arg" in
        --checkpoint) CKPT="$val" ;; --data-bin) DATA_BIN="$val" ;; --prep-dir) PREP_DIR="$val" ;;
        --src) SRC="$val" ;; --tgt) TGT="$val" ;; --subsets) SUBSETS="$val" ;; --beam) BEAM="$val" ;;
        --lenpen) LENPEN="$val" ;; --batch-size) BATCH_SIZE="$val" ;; --out) OUT="$val" ;;
        --user-dir) USER_DIR="$val" ;; --extra) EXTRA="$val" ;;
      esac ;;
    *) die "unknown option '$arg'; valid options: $VALID_OPTS" ;;
  esac
done

for pair in "--checkpoint:$CKPT" "--data-bin:$DATA_BIN" "--prep-dir:$PREP_DIR" "--src:$SRC" "--tgt:$TGT"; do
  [[ -n "${pair#*:}" ]] || die "${pair%%:*} is required (see --help)"
done
[[ -f "$CKPT" ]] || die "--checkpoint $CKPT: no such file"
[[ -d "$DATA_BIN" ]] || die "--data-bin $DATA_BIN: no such directory"
[[ -d "$PREP_DIR" ]] || die "--prep-dir $PREP_DIR: no such directory"
langs_available() { local f out=(); for f in "$DATA_BIN"/dict.*.txt; do [[ -e "$f" ]] && { f="${f##*/dict.}"; out+=("${f%.txt}"); }; done; echo "${out[*]:-none}"; }
for l in "$SRC" "$TGT"; do
  [[ -f "$DATA_BIN/dict.$l.txt" ]] || die "no dictionary $DATA_BIN/dict.$l.txt; languages available in --data-bin: $(langs_available)"
done
[[ "$SRC" != "$TGT" ]] || die "--src and --tgt must differ"
is_posint "$BEAM" || die "--beam must be a positive integer (got '$BEAM')"
is_posint "$BATCH_SIZE" || die "--batch-size must be a positive integer (got '$BATCH_SIZE')"
is_number "$LENPEN" || die "--lenpen must be a number (got '$LENPEN')"
USER_DIR_ARGS=()
if [[ -n "$USER_DIR" && "$USER_DIR" != none ]]; then
  [[ -d "$USER_DIR" ]] || die "--user-dir $USER_DIR: no such directory (use --user-dir none for no plugin)"
  USER_DIR_ARGS=(--user-dir "$(cd "$USER_DIR" && pwd)")
fi
read -r -a EXTRA_ARGS <<< "$EXTRA"
IFS=',' read -r -a SUBSET_LIST <<< "$SUBSETS"
(( ${#SUBSET_LIST[@]} )) || die "--subsets is empty"

if [[ -z "$OUT" ]]; then
  base="$(basename "$CKPT")"; OUT="$(dirname "$CKPT")/eval_${base%.pt}"
fi
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"

if [[ -z "${PYTHON:-}" ]]; then
  if command -v python >/dev/null 2>&1 && python -c 'import fairseq_cli' 2>/dev/null; then PYTHON=python
  elif [[ -x "$REPO/.venv/bin/python" ]]; then PYTHON="$REPO/.venv/bin/python"
  else PYTHON=python; fi
fi
"$PYTHON" -c 'import fairseq_cli, sacrebleu, sacremoses' 2>/dev/null \
  || die "'$PYTHON' cannot import fairseq, sacrebleu and sacremoses; activate the venv or set PYTHON"
CPU_ARGS=()
if ! "$PYTHON" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
  CPU_ARGS=(--cpu)
fi

# The official test-set name of subset $1, recorded in S.json: only Multi30k preps map fairseq's
# subset names to the WMT16 Multimodal file names; any other prep keeps the subset name.
testset_name() {
  case "$(basename "$PREP_DIR")" in
    multi30k*)
      case "$1" in
        valid) echo val ;; test) echo test_2016_flickr ;; test1) echo test_2017_flickr ;; *) echo "$1" ;;
      esac ;;
    *) echo "$1" ;;
  esac
}
TMP="tmp.$$"
trap 'rm -f "$OUT"/*."$TMP" "$OUT"/.*."$TMP" 2>/dev/null || true' EXIT

# Validate every subset before the (slow) generation starts.
for S in "${SUBSET_LIST[@]}"; do
  [[ "$S" =~ ^[A-Za-z0-9_]+$ ]] || die "bad subset name '$S' in --subsets (e.g. test,test1)"
  [[ -f "$PREP_DIR/raw/$S.$TGT" ]] || die "missing detokenized reference $PREP_DIR/raw/$S.$TGT (subsets available in --prep-dir: $(cd "$PREP_DIR/raw" 2>/dev/null && ls | sed -n "s/\.$TGT\$//p" | tr '\n' ' '))"
  [[ -f "$PREP_DIR/tok/$S.$TGT" ]] || die "missing tokenized reference $PREP_DIR/tok/$S.$TGT"
  if [[ ! -f "$DATA_BIN/$S.$SRC-$TGT.$SRC.idx" && ! -f "$DATA_BIN/$S.$TGT-$SRC.$SRC.idx" ]]; then
    die "subset '$S' not binarized in $DATA_BIN (no $S.$SRC-$TGT.$SRC.idx or $S.$TGT-$SRC.$SRC.idx)"
  fi
done

# A target side truecased by the prep (its truecaser model is there): detruecase the hypotheses.
DETRUECASE=0 POSTPROCESS="remove-bpe,detokenize"
if [[ -f "$PREP_DIR/tc/truecase-model.$TGT" ]]; then
  DETRUECASE=1 POSTPROCESS="remove-bpe,detruecase,detokenize"
fi

log "checkpoint=$CKPT direction=$SRC->$TGT beam=$BEAM lenpen=$LENPEN batch_size=$BATCH_SIZE postprocess=$POSTPROCESS device=$([[ ${#CPU_ARGS[@]} -gt 0 ]] && echo cpu || echo cuda) out=$OUT"
SUMMARY=()
for S in "${SUBSET_LIST[@]}"; do
  NAME="$(testset_name "$S")"
  REF="$PREP_DIR/raw/$S.$TGT"; TOKREF="$PREP_DIR/tok/$S.$TGT"
  N=$(( $(wc -l < "$REF") ))
  GEN=( "$PYTHON" -m fairseq_cli.generate "$DATA_BIN" "${USER_DIR_ARGS[@]}" --path "$CKPT" --gen-subset "$S"
        --source-lang "$SRC" --target-lang "$TGT" --beam "$BEAM" --lenpen "$LENPEN" --remove-bpe
        --batch-size "$BATCH_SIZE" --required-batch-size-multiple 1 "${CPU_ARGS[@]}" "${EXTRA_ARGS[@]}" )
  # drop results of an earlier run first, so a failure cannot leave stale scores looking current
  rm -f "$OUT/$S.json" "$OUT/$S.hyp.tok" "$OUT/$S.hyp.tc" "$OUT/$S.hyp.detok" "$OUT/$S.score.txt" "$OUT/$S.generate.log" "$OUT/$S.generate.failed.log"
  log "$S ($NAME): generating $N sentences ..."
  { printf '# command:'; printf ' %q' "${GEN[@]}"; printf '\n'; } > "$OUT/$S.generate.log.$TMP"
  if ! "${GEN[@]}" >> "$OUT/$S.generate.log.$TMP" 2>&1; then
    tail -n 20 "$OUT/$S.generate.log.$TMP" >&2
    mv -f "$OUT/$S.generate.log.$TMP" "$OUT/$S.generate.failed.log"
    die "fairseq-generate failed on subset $S (log: $OUT/$S.generate.failed.log)"
  fi
  mv -f "$OUT/$S.generate.log.$TMP" "$OUT/$S.generate.log"
  TC_ARGS=()
  if (( DETRUECASE )); then TC_ARGS=(--detruecase --truecased-out "$OUT/$S.hyp.tc"); fi
  "$PYTHON" "$SCRIPT_DIR/extract_hypotheses.py" "$OUT/$S.generate.log" --expected "$N" --lang "$TGT" \
    --tok-out "$OUT/$S.hyp.tok" --detok-out "$OUT/$S.hyp.detok" "${TC_ARGS[@]}" \
    || die "could not extract $N hypotheses for subset $S from $OUT/$S.generate.log"
  "$PYTHON" "$SCRIPT_DIR/score.py" --hyp "$OUT/$S.hyp.detok" --ref "$REF" \
    --tokenized-hyp "$OUT/$S.hyp.tok" --tokenized-ref "$TOKREF" "${RIBES_ARGS[@]}" --json "$OUT/$S.json" \
    --meta "subset=$S" --meta "testset=$NAME" --meta "src=$SRC" --meta "tgt=$TGT" \
    --meta "checkpoint=$(cd "$(dirname "$CKPT")" && pwd)/$(basename "$CKPT")" --meta "beam=$BEAM" \
    --meta "lenpen=$LENPEN" --meta "extra=$EXTRA" --meta "postprocess=$POSTPROCESS" > "$OUT/$S.score.txt.$TMP" \
    || die "scoring failed for subset $S"
  mv -f "$OUT/$S.score.txt.$TMP" "$OUT/$S.score.txt"
  line="$("$PYTHON" - "$OUT/$S.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
print(f"{r['subset']} ({r['testset']}) {r['src']}->{r['tgt']}: BLEU = {r['bleu']:.2f} | tok BLEU = {r['tok_bleu']:.2f} | n = {r['n_hyp']} | {r['signature']}")
PY
)"
  SUMMARY+=("$line")
  echo "$line"
done
log "done; results in $OUT/{$(IFS=,; echo "${SUBSET_LIST[*]}")}.json"
