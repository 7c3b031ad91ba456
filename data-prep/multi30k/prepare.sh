#!/usr/bin/env bash
# Prepare Multi30k Task 1 English-German for fairseq (joint BPE, joined dictionary).
#
# Run `data-prep/multi30k/prepare.sh --help` for the options.  Pipeline:
#   0. inputs   raw .gz files from --raw-dir (default ../shared/data/multi30k_en_de/raw next to the
#               repo) or downloaded from github.com/multi30k/dataset at a pinned commit; sha256 of
#               every file checked against the hard-coded values below (abort on mismatch).
#   1. raw      decompress to <out>/raw/{train,valid,test,test1}.{en,de}  (valid = val,
#               test = test_2016_flickr, test1 = test_2017_flickr); train optionally cut to the
#               first --train-lines pairs.  These are the detokenized references for scoring.
#   2. tok      Moses tokenisation with sacremoses (python API, MosesTokenizer(lang).tokenize(
#               escape=False)): language-specific rules (en / de), NO XML escaping, no
#               aggressive dash splitting, no lowercasing/truecasing (case kept), no punctuation
#               normalisation -> <out>/tok/
#   3. bpe      joint BPE (subword-nmt's Python API, learn_bpe with --bpe-merges merges and
#               min-frequency 2, via m30k_tools.py) learned on the concatenation
#               tok/train.en + tok/train.de -> <out>/bpe/codes; applied to every split -> <out>/bpe/
#   4. bin      fairseq-preprocess --joined-dictionary -> <out>/bin
#               ({train,valid,test,test1}.SRC-TGT.{SRC,TGT}.{bin,idx}, dict.{en,de}.txt)
#
# The bin dir serves both directions: with a joined dictionary dict.en.txt == dict.de.txt and
# fairseq's translation task (tasks/translation.py, load_langpair_dataset/split_exists) falls back
# to "{split}.{tgt}-{src}.*" when "{split}.{src}-{tgt}.*" is absent, so data binarized as en-de is
# also loaded by `--source-lang de --target-lang en`.
#
# Every stage checks line counts (src == tgt == raw count) and writes a `.done` stamp holding its
# parameters (and a hash of the previous stage's stamp); a stage whose stamp matches and whose
# outputs exist is skipped, so re-running is cheap and changing --bpe-merges or --train-lines
# redoes exactly the affected stages.  Every output file is written to a temp file in the same
# directory and moved into place; a failed run leaves no half-written output behind.
set -euo pipefail

PROG="data-prep/multi30k/prepare.sh"
SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$SCRIPT_DIR/../.." && pwd)"
TOOLS="$SCRIPT_DIR/m30k_tools.py"

UPSTREAM_COMMIT="a3d2e0d26b56f3846f66a952536ffed4e401d05a"
UPSTREAM_BASE="https://raw.githubusercontent.com/multi30k/dataset/${UPSTREAM_COMMIT}/data/task1/raw"
# A mirror of data/task1/raw/ may be given with MULTI30K_BASE_URL (any URL curl/wget accept,
# e.g. file:///path/to/dir); the sha256 checks still apply.
UPSTREAM_BASE="${MULTI30K_BASE_URL:-$UPSTREAM_BASE}"

# sha256 of the upstream .gz files (from /work/shared/data/MANIFEST.md, section 6).
declare -A SHA256=(
  [train.en.gz]=d79cfa999dd4c51d2cb42499b6796d5a882c3a8a961923c25a898c90f8bbd56f
  [train.de.gz]=726e39b2fa9eb9ffb6dc763fb35a179f80fae06ffc5d28b6ace5faa883de28a6
  [val.en.gz]=14f7d25ddd868909a9213e361768460edcacdd6ab9d1e77b92560dc10c10dc28
  [val.de.gz]=f0cba2f995189cf5770f29a8a9a537a3ad3f51657ad873405082ff6863a5e75a
  [test_2016_flickr.en.gz]=611d361c6334bc7246101d48097c13cf5c4413c5befc793cc629934359d532d9
  [test_2016_flickr.de.gz]=9204244e408ccb38d2a55cfcd344df15005fc42a07a6e55ca6c52b6ababb8cc8
  [test_2017_flickr.en.gz]=76a444ee25172e72695cddb13ae4a3bda59430617be88e0bb46b60504f054074
  [test_2017_flickr.de.gz]=a2c89666db00c495cd8513b9d708d5a3acc205d7de312ef2bf5fb7ebc1540aee
)
# Sentence-pair counts of the upstream splits.
declare -A NLINES=( [train]=29000 [val]=1014 [test_2016_flickr]=1000 [test_2017_flickr]=1000 )
UP_SPLITS=(train val test_2016_flickr test_2017_flickr)   # upstream names ...
FS_SPLITS=(train valid test test1)                        # ... and the fairseq names, same order
LANGS=(en de)

usage() {
  cat <<EOF
Usage: $PROG [options]

Prepare Multi30k Task 1 en-de (raw cased text) for fairseq: Moses tokenisation (sacremoses, no XML
escaping, case kept) -> joint BPE (subword-nmt) -> fairseq-preprocess --joined-dictionary.

Options:
  --raw-dir DIR       directory with {train,val,test_2016_flickr,test_2017_flickr}.{en,de}.gz
                      (default: <repo>/../shared/data/multi30k_en_de/raw if it exists, else download)
  --download          force download from github.com/multi30k/dataset (commit ${UPSTREAM_COMMIT:0:12})
                      into <out>/download/ (uses curl or wget); exclusive with --raw-dir
  --out DIR           output directory (default: <repo>/data-bin/multi30k_en_de)
  --bpe-merges N      number of joint BPE merge operations (default: 8000)
  --train-lines N     use only the first N training pairs (default: all 29000)
  --src en|de         source language (default: en)
  --tgt de|en         target language (default: de).  The bin dir serves both directions.
  --workers N         worker processes for apply-bpe and fairseq-preprocess (default: 2)
  --no-checksum       do not check the sha256 and line counts of the input .gz files
                      (for a --raw-dir holding other files; default: check, abort on mismatch)
  --dry-run           print the URLs + sha256 and the commands of the stages that would run; do nothing
  -h, --help          show this help

Environment: PYTHON (interpreter with sacremoses, subword_nmt, fairseq; default: python on PATH,
else <repo>/.venv/bin/python), MULTI30K_BASE_URL (mirror of the upstream data/task1/raw/ dir).

Output layout (<out>):
  download/   downloaded .gz files (download mode only)
  raw/        {train,valid,test,test1}.{en,de}   detokenized text (references for sacreBLEU)
  tok/        {train,valid,test,test1}.{en,de}   Moses-tokenised text (references for tokenized BLEU)
  bpe/        {train,valid,test,test1}.{en,de}   BPE'd text; bpe/codes = joint BPE codes
  bin/        fairseq binarized data + dict.{en,de}.txt  (pass this dir to fairseq-train/-generate)
  logs/       logs of subword-nmt and fairseq-preprocess
  */.done     stage stamps (parameters); a stage with a matching stamp is skipped

The last line printed on stdout is the absolute path of the bin dir.
EOF
}

log() { echo "[multi30k] $*"; }
die() { echo "[multi30k] ERROR: $*" >&2; exit 1; }
q() { printf '%q' "$1"; }
is_posint() { [[ "$1" =~ ^[0-9]+$ ]] && (( 10#$1 > 0 )); }

# ---------------------------------------------------------------------------------------------
# Arguments
# ---------------------------------------------------------------------------------------------
RAW_DIR=""
RAW_DIR_GIVEN=0
OUT=""
BPE_MERGES=8000
TRAIN_LINES=""
SRC=en
TGT=de
WORKERS=2
FORCE_DOWNLOAD=0
DRY_RUN=0
CHECKSUM=1

VALID_OPTS="--raw-dir, --download, --out, --bpe-merges, --train-lines, --src, --tgt, --workers, --no-checksum, --dry-run, --help"
while (( $# )); do
  arg="$1"
  if [[ "$arg" == --*=* ]]; then       # accept --opt=value as well as --opt value
    set -- "${arg%%=*}" "${arg#*=}" "${@:2}"
    arg="$1"
  fi
  case "$arg" in
    --raw-dir|--out|--bpe-merges|--train-lines|--src|--tgt|--workers)
      (( $# >= 2 )) || die "$arg needs a value (see --help)"
      val="$2"; shift 2
      case "$arg" in
        --raw-dir) RAW_DIR="$val"; RAW_DIR_GIVEN=1 ;;
        --out) OUT="$val" ;;
        --bpe-merges) BPE_MERGES="$val" ;;
        --train-lines) TRAIN_LINES="$val" ;;
        --src) SRC="$val" ;;
        --tgt) TGT="$val" ;;
        --workers) WORKERS="$val" ;;
      esac
      ;;
    --download) FORCE_DOWNLOAD=1; shift ;;
    --dry-run) DRY_RUN=1; shift ;;
    --no-checksum) CHECKSUM=0; shift ;;
    -h|--help) usage; exit 0 ;;
    *) die "unknown option '$arg'; valid options: $VALID_OPTS" ;;
  esac
done

is_posint "$BPE_MERGES" || die "--bpe-merges must be a positive integer (got '$BPE_MERGES')"
BPE_MERGES=$((10#$BPE_MERGES))
is_posint "$WORKERS" || die "--workers must be a positive integer (got '$WORKERS')"
WORKERS=$((10#$WORKERS))
if [[ -n "$TRAIN_LINES" ]]; then
  is_posint "$TRAIN_LINES" || die "--train-lines must be a positive integer (got '$TRAIN_LINES')"
  TRAIN_LINES=$((10#$TRAIN_LINES))
fi
[[ "$SRC" == en || "$SRC" == de ]] || die "--src must be one of: en, de (got '$SRC')"
[[ "$TGT" == en || "$TGT" == de ]] || die "--tgt must be one of: en, de (got '$TGT')"
[[ "$SRC" != "$TGT" ]] || die "--src and --tgt must differ (valid pairs: --src en --tgt de, --src de --tgt en)"

DEFAULT_RAW_DIR="$REPO/../shared/data/multi30k_en_de/raw"
if (( FORCE_DOWNLOAD )); then
  (( RAW_DIR_GIVEN == 0 )) || die "--download and --raw-dir exclude each other"
  MODE=download
elif (( RAW_DIR_GIVEN )); then
  [[ -d "$RAW_DIR" ]] || die "--raw-dir '$RAW_DIR' is not a directory"
  MODE=local
elif [[ -d "$DEFAULT_RAW_DIR" ]]; then
  RAW_DIR="$DEFAULT_RAW_DIR"
  MODE=local
else
  MODE=download
fi
[[ "$MODE" == local ]] && RAW_DIR="$(cd "$RAW_DIR" && pwd)"

OUT="${OUT:-$REPO/data-bin/multi30k_en_de}"
if [[ -d "$OUT" ]]; then OUT="$(cd "$OUT" && pwd)"
elif [[ "$OUT" != /* ]]; then OUT="$PWD/$OUT"; fi
OUT="${OUT%/}"
BIN="$OUT/bin"
IN_DIR="$RAW_DIR"
[[ "$MODE" == download ]] && IN_DIR="$OUT/download"

# Python interpreter providing sacremoses, subword_nmt and fairseq: $PYTHON if set, else `python`
# from PATH (e.g. an activated venv), else the repo's .venv.
have_modules() { "$1" -c 'import importlib.util as u, sys; sys.exit(any(u.find_spec(m) is None for m in ("sacremoses", "subword_nmt", "fairseq", "fairseq_cli")))' 2>/dev/null; }
if [[ -z "${PYTHON:-}" ]]; then
  if command -v python >/dev/null 2>&1 && have_modules python; then PYTHON=python
  elif [[ -x "$REPO/.venv/bin/python" ]] && have_modules "$REPO/.venv/bin/python"; then PYTHON="$REPO/.venv/bin/python"
  else PYTHON=python; fi
fi
if ! have_modules "$PYTHON"; then
  msg="'$PYTHON' cannot import sacremoses, subword_nmt and fairseq; activate the venv (. .venv/bin/activate) or set PYTHON=/path/to/python"
  if (( DRY_RUN )); then echo "[multi30k] WARNING: $msg" >&2; else die "$msg"; fi
fi

# ---------------------------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------------------------
TMP="tmp.$$"   # suffix of every temp file/dir of this run (removed on exit)
cleanup() {
  if (( DRY_RUN == 0 )) && [[ -d "$OUT" ]]; then
    find "$OUT" -maxdepth 2 -name "*.$TMP" -exec rm -rf {} + 2>/dev/null || true
  fi
}
trap cleanup EXIT

sha256_file() {
  if command -v sha256sum >/dev/null 2>&1; then sha256sum "$1" | cut -d' ' -f1
  elif command -v shasum >/dev/null 2>&1; then shasum -a 256 "$1" | cut -d' ' -f1
  else "$PYTHON" -c 'import hashlib,sys; print(hashlib.sha256(open(sys.argv[1],"rb").read()).hexdigest())' "$1"; fi
}
sha256_str() { printf '%s' "$1" | { if command -v sha256sum >/dev/null 2>&1; then sha256sum; else shasum -a 256; fi; } | cut -d' ' -f1; }
count_lines() { local n; n=$(wc -l < "$1"); echo $((n)); }

# run CMD: print it under --dry-run, else eval it (CMD is a shell string with %q-quoted words).
run() { if (( DRY_RUN )); then echo "    \$ $1"; else eval "$1"; fi; }
# run_logged LOG CMD: like run, output appended to LOG; on failure show its tail and abort.
run_logged() {
  local logf="$1" cmd="$2"
  if (( DRY_RUN )); then echo "    \$ $cmd >> $(q "$logf") 2>&1"; return 0; fi
  echo "\$ $cmd" >> "$logf"
  if ! eval "$cmd" >> "$logf" 2>&1; then
    tail -n 25 "$logf" >&2 || true
    die "command failed (full log: $logf): $cmd"
  fi
}

# stage_current STAMP EXPECTED FILE...: stamp holds EXPECTED and every FILE exists.
stage_current() {
  local stamp="$1" expected="$2"; shift 2
  [[ -f "$stamp" ]] && [[ "$(cat "$stamp")" == "$expected" ]] || return 1
  local f; for f in "$@"; do [[ -e "$f" ]] || return 1; done
}
write_stamp() { printf '%s\n' "$2" > "$1.$TMP"; mv -f "$1.$TMP" "$1"; }

# check_pair STAGE DIR SPLIT EXPECTED: DIR/SPLIT.en and DIR/SPLIT.de both have EXPECTED lines.
check_pair() {
  local stage="$1" dir="$2" split="$3" expected="$4" n_en n_de
  n_en=$(count_lines "$dir/$split.en"); n_de=$(count_lines "$dir/$split.de")
  [[ "$n_en" -eq "$n_de" ]] || die "$stage: line counts differ: $dir/$split.en has $n_en lines, $dir/$split.de has $n_de"
  [[ "$n_en" -eq "$expected" ]] || die "$stage: $dir/$split.en and $dir/$split.de have $n_en lines, expected $expected (the raw count)"
}

all_files() {  # all_files DIR: DIR/{train,valid,test,test1}.{en,de}
  local s l; for s in "${FS_SPLITS[@]}"; do for l in "${LANGS[@]}"; do echo "$1/$s.$l"; done; done
}

# ---------------------------------------------------------------------------------------------
# Plan: stamps (parameters of every stage; each includes a hash of the previous stamp)
# ---------------------------------------------------------------------------------------------
VERSIONS="$("$PYTHON" "$TOOLS" versions 2>/dev/null | tr '\n' ' ' || true)"
VERSIONS="${VERSIONS% }"
TL_DESC="${TRAIN_LINES:-all}"

input_sha() {  # sha256 recorded in the raw stamp for input file $1
  if (( CHECKSUM )); then echo "${SHA256[$1]}"
  elif [[ -f "$IN_DIR/$1" ]]; then sha256_file "$IN_DIR/$1"
  else echo missing; fi
}
INPUTS_DESC=""
for up in "${UP_SPLITS[@]}"; do for l in "${LANGS[@]}"; do
  INPUTS_DESC+="$up.$l.gz:$(input_sha "$up.$l.gz") "
done; done

RAW_STAMP="stage=raw
inputs=${INPUTS_DESC% }
train_lines=$TL_DESC"
TOK_STAMP="stage=tok
upstream=$(sha256_str "$RAW_STAMP")
train_lines=$TL_DESC
tokenizer=sacremoses MosesTokenizer(lang).tokenize(escape=False, aggressive_dash_splits=False); case kept
versions=$VERSIONS"
BPE_STAMP="stage=bpe
upstream=$(sha256_str "$TOK_STAMP")
train_lines=$TL_DESC
bpe_merges=$BPE_MERGES
bpe=subword-nmt learn_bpe (min_frequency=2) on tok/train.en+tok/train.de, BPE.process_line on all splits
versions=$VERSIONS"
BIN_STAMP="stage=bin
upstream=$(sha256_str "$BPE_STAMP")
train_lines=$TL_DESC
bpe_merges=$BPE_MERGES
src=$SRC
tgt=$TGT
fairseq-preprocess --joined-dictionary"

# ---------------------------------------------------------------------------------------------
# Stage 0: inputs (download and/or checksum)
# ---------------------------------------------------------------------------------------------
fetch() {  # fetch URL DEST
  local tool
  if command -v curl >/dev/null 2>&1; then
    tool="curl -fL --retry 3 --connect-timeout 30 -sS -o $(q "$2") $(q "$1")"
  elif command -v wget >/dev/null 2>&1; then
    tool="wget -q --tries=3 -O $(q "$2") $(q "$1")"
  else
    die "download mode needs curl or wget (neither found); or pass --raw-dir DIR"
  fi
  run "$tool" || { rm -f "$2"; die "download failed: $1 (pass --raw-dir DIR to use local copies of the .gz files)"; }
}

stage_inputs() {
  if (( DRY_RUN )); then
    log "dry run: nothing will be written"
    log "mode: $MODE; inputs: $IN_DIR; out: $OUT"
    log "upstream files (github.com/multi30k/dataset @ $UPSTREAM_COMMIT) and sha256:"
    for up in "${UP_SPLITS[@]}"; do for l in "${LANGS[@]}"; do
      echo "    $UPSTREAM_BASE/$up.$l.gz  ${SHA256[$up.$l.gz]}"
    done; done
    log "(every input's sha256 is checked against these values before use; a mismatch aborts)"
  fi
  local f path actual
  if [[ "$MODE" == download ]]; then
    (( DRY_RUN )) || mkdir -p "$IN_DIR"
    for up in "${UP_SPLITS[@]}"; do for l in "${LANGS[@]}"; do
      f="$up.$l.gz"; path="$IN_DIR/$f"
      if [[ -f "$path" ]] && [[ "$(sha256_file "$path")" == "${SHA256[$f]}" ]]; then
        log "have download/$f (sha256 ok)"; continue
      fi
      log "downloading $f ..."
      fetch "$UPSTREAM_BASE/$f" "$path.$TMP"
      (( DRY_RUN )) && continue
      actual="$(sha256_file "$path.$TMP")"
      if [[ "$actual" != "${SHA256[$f]}" ]]; then
        rm -f "$path.$TMP"
        die "sha256 mismatch for downloaded $f: expected ${SHA256[$f]}, got $actual (URL $UPSTREAM_BASE/$f)"
      fi
      mv -f "$path.$TMP" "$path"
    done; done
  else
    for up in "${UP_SPLITS[@]}"; do for l in "${LANGS[@]}"; do
      f="$up.$l.gz"; path="$IN_DIR/$f"
      [[ -f "$path" ]] || die "missing input $path (--raw-dir must hold {train,val,test_2016_flickr,test_2017_flickr}.{en,de}.gz)"
      if (( CHECKSUM && ! DRY_RUN )); then
        actual="$(sha256_file "$path")"
        [[ "$actual" == "${SHA256[$f]}" ]] || die "sha256 mismatch for $path: expected ${SHA256[$f]}, got $actual (use --no-checksum to accept other files)"
      fi
    done; done
    if (( CHECKSUM && ! DRY_RUN )); then log "inputs in $IN_DIR: sha256 ok"; fi
  fi
}

# ---------------------------------------------------------------------------------------------
# Stage 1: raw (decompress; cut train)
# ---------------------------------------------------------------------------------------------
stage_raw() {
  local t0=$SECONDS
  local dir="$OUT/raw" i up fs l src_gz dst n full
  # shellcheck disable=SC2046
  if stage_current "$dir/.done" "$RAW_STAMP" $(all_files "$dir"); then
    log "raw: up to date (train_lines=$TL_DESC), skipping"; return 0
  fi
  log "raw: decompressing${TRAIN_LINES:+ (train cut to the first $TRAIN_LINES pairs)}"
  (( DRY_RUN )) || { mkdir -p "$dir"; rm -f "$dir/.done"; }
  for i in "${!UP_SPLITS[@]}"; do
    up="${UP_SPLITS[$i]}"; fs="${FS_SPLITS[$i]}"
    for l in "${LANGS[@]}"; do
      src_gz="$IN_DIR/$up.$l.gz"; dst="$dir/$fs.$l"
      log "decompressing $up.$l.gz -> raw/$fs.$l ..."
      run "gzip -dc $(q "$src_gz") > $(q "$dst.$TMP")"
      (( DRY_RUN )) && { [[ "$fs" == train && -n "$TRAIN_LINES" ]] && echo "    (keep the first $TRAIN_LINES lines)"; continue; }
      # make sure the last line ends with a newline, so wc -l counts it
      if [[ -s "$dst.$TMP" ]] && [[ "$(tail -c1 "$dst.$TMP" | wc -l)" -eq 0 ]]; then echo >> "$dst.$TMP"; fi
      full=$(count_lines "$dst.$TMP")
      if (( CHECKSUM )) && [[ "$full" -ne "${NLINES[$up]}" ]]; then
        die "raw: $src_gz has $full lines, expected ${NLINES[$up]}"
      fi
      if [[ "$fs" == train && -n "$TRAIN_LINES" ]] && (( TRAIN_LINES < full )); then
        head -n "$TRAIN_LINES" "$dst.$TMP" > "$dst.cut.$TMP"
        mv -f "$dst.cut.$TMP" "$dst.$TMP"
      fi
      mv -f "$dst.$TMP" "$dst"
    done
    (( DRY_RUN )) && continue
    n=$(count_lines "$dir/$fs.en")
    check_pair raw "$dir" "$fs" "$n"
    if [[ "$fs" == train && -n "$TRAIN_LINES" ]] && (( n != TRAIN_LINES )); then
      log "note: --train-lines $TRAIN_LINES exceeds the corpus; using all $n training pairs"
    fi
  done
  (( DRY_RUN )) || { write_stamp "$dir/.done" "$RAW_STAMP"; log "raw: done ($((SECONDS - t0))s)"; }
}

raw_count() {  # number of pairs of split $1 (from raw/; under --dry-run an estimate)
  if [[ -f "$OUT/raw/$1.en" ]] && (( DRY_RUN == 0 )); then count_lines "$OUT/raw/$1.en"; else echo "?"; fi
}

# ---------------------------------------------------------------------------------------------
# Stage 2: tok (sacremoses)
# ---------------------------------------------------------------------------------------------
stage_tok() {
  local t0=$SECONDS
  local dir="$OUT/tok" fs l
  # shellcheck disable=SC2046
  if stage_current "$dir/.done" "$TOK_STAMP" $(all_files "$dir"); then
    log "tok: up to date, skipping"; return 0
  fi
  (( DRY_RUN )) || { mkdir -p "$dir"; rm -f "$dir/.done"; }
  for fs in "${FS_SPLITS[@]}"; do
    for l in "${LANGS[@]}"; do
      log "tokenising $fs.$l ..."
      run "$(q "$PYTHON") $(q "$TOOLS") tokenize --lang $l --input $(q "$OUT/raw/$fs.$l") --output $(q "$dir/$fs.$l")"
    done
    (( DRY_RUN )) || check_pair tok "$dir" "$fs" "$(raw_count "$fs")"
  done
  (( DRY_RUN )) || { write_stamp "$dir/.done" "$TOK_STAMP"; log "tok: done ($((SECONDS - t0))s)"; }
}

# ---------------------------------------------------------------------------------------------
# Stage 3: bpe (subword-nmt, joint)
# ---------------------------------------------------------------------------------------------
stage_bpe() {
  local t0=$SECONDS
  local dir="$OUT/bpe" logf="$OUT/logs/bpe.log" fs l learned
  # shellcheck disable=SC2046
  if stage_current "$dir/.done" "$BPE_STAMP" "$dir/codes" $(all_files "$dir"); then
    log "bpe: up to date (bpe_merges=$BPE_MERGES), skipping"; return 0
  fi
  (( DRY_RUN )) || { mkdir -p "$dir" "$OUT/logs"; rm -f "$dir/.done"; : > "$logf"; }
  log "learning joint BPE ($BPE_MERGES merges) on tok/train.en + tok/train.de ..."
  run_logged "$logf" "$(q "$PYTHON") $(q "$TOOLS") learn-bpe --merges $BPE_MERGES --output $(q "$dir/codes") $(q "$OUT/tok/train.en") $(q "$OUT/tok/train.de")"
  if (( ! DRY_RUN )); then
    learned=$(grep -vc '^#version' "$dir/codes" || true)
    log "learned $learned merge operations -> bpe/codes"
    (( learned > 0 )) || die "bpe: no merge operations learned (training data too small?)"
  fi
  local io=()
  for fs in "${FS_SPLITS[@]}"; do for l in "${LANGS[@]}"; do
    io+=("$(q "$OUT/tok/$fs.$l")" "$(q "$dir/$fs.$l")")
  done; done
  log "applying BPE to {${FS_SPLITS[*]}}.{en,de} ($WORKERS workers) ..."
  run_logged "$logf" "$(q "$PYTHON") $(q "$TOOLS") apply-bpe --codes $(q "$dir/codes") --workers $WORKERS ${io[*]}"
  if (( ! DRY_RUN )); then
    for fs in "${FS_SPLITS[@]}"; do check_pair bpe "$dir" "$fs" "$(raw_count "$fs")"; done
  fi
  (( DRY_RUN )) || { write_stamp "$dir/.done" "$BPE_STAMP"; log "bpe: done ($((SECONDS - t0))s)"; }
}

# ---------------------------------------------------------------------------------------------
# Stage 4: bin (fairseq-preprocess)
# ---------------------------------------------------------------------------------------------
stage_bin() {
  local t0=$SECONDS
  local tmpdir="$OUT/bin.$TMP" logf="$OUT/logs/bin.log" fs l prefixes=() counts prefix n expected
  local pair="$SRC-$TGT" files=("$BIN/dict.$SRC.txt" "$BIN/dict.$TGT.txt")
  for fs in "${FS_SPLITS[@]}"; do for l in "$SRC" "$TGT"; do
    files+=("$BIN/$fs.$pair.$l.bin" "$BIN/$fs.$pair.$l.idx")
  done; done
  if stage_current "$BIN/.done" "$BIN_STAMP" "${files[@]}"; then
    log "bin: up to date ($pair), skipping"; return 0
  fi
  log "binarizing with fairseq-preprocess ($pair, joined dictionary, $WORKERS workers) ..."
  (( DRY_RUN )) || { mkdir -p "$OUT/logs"; rm -rf "$tmpdir"; : > "$logf"; }
  run_logged "$logf" "$(q "$PYTHON") -m fairseq_cli.preprocess --source-lang $SRC --target-lang $TGT --joined-dictionary --trainpref $(q "$OUT/bpe/train") --validpref $(q "$OUT/bpe/valid") --testpref $(q "$OUT/bpe/test"),$(q "$OUT/bpe/test1") --destdir $(q "$tmpdir") --workers $WORKERS"
  if (( DRY_RUN )); then echo "    (then replace $BIN with the new dir)"; return 0; fi
  cmp -s "$tmpdir/dict.$SRC.txt" "$tmpdir/dict.$TGT.txt" || die "bin: dict.$SRC.txt and dict.$TGT.txt differ in $tmpdir (expected a joined dictionary)"
  for fs in "${FS_SPLITS[@]}"; do for l in "$SRC" "$TGT"; do prefixes+=("$tmpdir/$fs.$pair.$l"); done; done
  counts="$("$PYTHON" "$TOOLS" count-bin "${prefixes[@]}" 2>>"$logf")" || die "bin: fairseq-preprocess did not write every dataset (see $logf)"
  while IFS=$'\t' read -r prefix n; do
    fs="$(basename "$prefix")"; fs="${fs%%.*}"
    expected="$(raw_count "$fs")"
    [[ "$n" -eq "$expected" ]] || die "bin: $(basename "$prefix") has $n sentences, expected $expected (raw/$fs.$SRC)"
  done <<< "$counts"
  printf '%s\n' "$BIN_STAMP" > "$tmpdir/.done"
  rm -rf "$BIN"
  mv "$tmpdir" "$BIN"
  log "dictionary: $(count_lines "$BIN/dict.$SRC.txt") types (+4 special symbols), shared by $SRC and $TGT"
  log "bin: done ($((SECONDS - t0))s)"
}

# ---------------------------------------------------------------------------------------------
# Main
# ---------------------------------------------------------------------------------------------
if (( DRY_RUN == 0 )); then
  mkdir -p "$OUT"
  if command -v flock >/dev/null 2>&1; then   # serialize concurrent runs on the same --out
    exec 9> "$OUT/.lock"
    flock -n 9 || { log "waiting for another prepare.sh on $OUT ..."; flock 9; }
  fi
fi

log "out=$OUT src=$SRC tgt=$TGT bpe_merges=$BPE_MERGES train_lines=$TL_DESC workers=$WORKERS mode=$MODE"
stage_inputs
stage_raw
stage_tok
stage_bpe
stage_bin

if (( DRY_RUN )); then
  log "dry run finished; nothing was done. The bin dir would be:"
else
  log "done. fairseq data dir (serves $SRC->$TGT and $TGT->$SRC):"
fi
echo "$BIN"
