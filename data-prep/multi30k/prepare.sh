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
#   3'. char    with --char instead of bpe: character-level symbols (m30k_tools.py split-chars):
#               every character of a token is a symbol, all but its last carry BPE's "@@", so the
#               word boundaries stay marked and --remove-bpe / scripts/evaluate.sh restore the
#               tokens unchanged -> <out>/char/ (for long inputs: Flexible Attention, Table 3)
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
#
# Shared with data-prep/long_documents/prepare.sh: the shell helpers and the tok/bpe stages in
# data-prep/common/prep_lib.sh, and the Python side of tokenize/learn-bpe/apply-bpe/count-bin/versions
# in data-prep/common/text_tools.py (m30k_tools.py registers those subcommands).
set -euo pipefail

LOG_TAG=multi30k
# shellcheck source=../common/prep_lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../common/prep_lib.sh"   # sets REPO (the repo root)
TOOLS="$REPO/data-prep/multi30k/m30k_tools.py"

UPSTREAM_COMMIT="a3d2e0d26b56f3846f66a952536ffed4e401d05a"
# A mirror of data/task1/raw/ may be given with MULTI30K_BASE_URL (any URL curl/wget accept,
# e.g. file:///path/to/dir); the sha256 checks still apply.
UPSTREAM_BASE="${MULTI30K_BASE_URL:-https://raw.githubusercontent.com/multi30k/dataset/${UPSTREAM_COMMIT}/data/task1/raw}"

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
SPLITS=(train valid test test1)                           # ... and the fairseq names, same order
LANGS=(en de)

PROG="data-prep/multi30k/prepare.sh"
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
  --char              character-level symbols instead of BPE (word ends marked with "@@" as BPE
                      does, so --remove-bpe restores the words); use its own --out
  --train-lines N     use only the first N training pairs (default: all 29000)
  --src en|de         source language (default: en)
  --tgt de|en         target language (default: de).  The bin dir serves both directions.
  --workers N         worker processes for apply-bpe and fairseq-preprocess (default: 2)
  --max-words N       longest raw line allowed, in words (default: 250); raw input is also
                      checked for invalid UTF-8, empty lines and unequal line counts
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
  char/       {train,valid,test,test1}.{en,de}   character-level text (--char, instead of bpe/)
  bin/        fairseq binarized data + dict.{en,de}.txt  (pass this dir to fairseq-train/-generate)
  logs/       logs of subword-nmt and fairseq-preprocess
  */.done     stage stamps (parameters); a stage with a matching stamp is skipped

The last line printed on stdout is the absolute path of the bin dir.
EOF
}

# ---------------------------------------------------------------------------------------------
# Arguments
# ---------------------------------------------------------------------------------------------
RAW_DIR=""
OUT=""
BPE_MERGES=8000
TRAIN_LINES=""
MAX_WORDS=250
SRC=en
TGT=de
WORKERS=2
FORCE_DOWNLOAD=0
DRY_RUN=0
CHECKSUM=1
CHAR=0

VALID_OPTS="--raw-dir, --download, --out, --bpe-merges, --char, --train-lines, --max-words, --src, --tgt, --workers, --no-checksum, --dry-run, --help"
VALUE_OPTS="--raw-dir=RAW_DIR --train-lines=TRAIN_LINES --max-words=MAX_WORDS --src=SRC --tgt=TGT"   # (+ --out, --bpe-merges, --workers)
FLAG_OPTS="--download=FORCE_DOWNLOAD=1 --char=CHAR=1"                                     # (+ --dry-run, --no-checksum)
parse_options "$@"
[[ -z "$TRAIN_LINES" ]] || posint TRAIN_LINES --train-lines
posint MAX_WORDS --max-words
[[ "$SRC" == en || "$SRC" == de ]] || die "--src must be one of: en, de (got '$SRC')"
[[ "$TGT" == en || "$TGT" == de ]] || die "--tgt must be one of: en, de (got '$TGT')"
[[ "$SRC" != "$TGT" ]] || die "--src and --tgt must differ (valid pairs: --src en --tgt de, --src de --tgt en)"

DEFAULT_RAW_DIR="$REPO/../shared/data/multi30k_en_de/raw"
if (( FORCE_DOWNLOAD )); then
  ! given --raw-dir || die "--download and --raw-dir exclude each other"
  MODE=download
elif given --raw-dir; then
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
abs_out
BIN="$OUT/bin"
IN_DIR="$RAW_DIR"
[[ "$MODE" == download ]] && IN_DIR="$OUT/download"

find_python

# ---------------------------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------------------------
init_tmp 2   # temp files/dirs (suffix $TMP) up to 2 levels below OUT are removed on exit

split_count() {  # number of pairs of split $1 (from raw/; under --dry-run "?")
  if [[ -f "$OUT/raw/$1.en" ]] && (( DRY_RUN == 0 )); then count_lines "$OUT/raw/$1.en"; else echo "?"; fi
}
COUNT_NOTE=" (the raw count)"   # in check_pair's messages

# ---------------------------------------------------------------------------------------------
# Plan: stamps (parameters of every stage; each includes a hash of the previous stamp)
# ---------------------------------------------------------------------------------------------
VERSIONS="$(tool_versions)"
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
CHAR_STAMP="stage=char
upstream=$(sha256_str "$TOK_STAMP")
train_lines=$TL_DESC
segmentation=characters, @@ on all but a token's last (m30k_tools.py split-chars)"
if (( CHAR )); then   # character-level: bin/ is built from char/ (its stamp says so)
  SEG=char
  BIN_STAMP="stage=bin
upstream=$(sha256_str "$CHAR_STAMP")
train_lines=$TL_DESC
segmentation=char
src=$SRC
tgt=$TGT
fairseq-preprocess --joined-dictionary"
else                  # BPE (the stamp is unchanged from before --char existed)
  SEG=bpe
  BIN_STAMP="stage=bin
upstream=$(sha256_str "$BPE_STAMP")
train_lines=$TL_DESC
bpe_merges=$BPE_MERGES
src=$SRC
tgt=$TGT
fairseq-preprocess --joined-dictionary"
fi

# ---------------------------------------------------------------------------------------------
# Stage 0: inputs (download and/or checksum)
# ---------------------------------------------------------------------------------------------
# messages of fetch (prep_lib.sh) when a download cannot be done
FETCH_NO_TOOL_MSG="download mode needs curl or wget (neither found); or pass --raw-dir DIR"
FETCH_FAIL_HINT="pass --raw-dir DIR to use local copies of the .gz files"

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
    for up in "${UP_SPLITS[@]}"; do for l in "${LANGS[@]}"; do
      f="$up.$l.gz"
      download_checked "$IN_DIR" "$f" "${SHA256[$f]}" 1
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
  local dir="$OUT/raw" tmpdir="$OUT/raw.$TMP" i up fs l src_gz dst n full files
  local -A full_of
  # shellcheck disable=SC2046
  if stage_current "$dir/.done" "$RAW_STAMP" $(files_of "$dir"); then
    log "raw: up to date (train_lines=$TL_DESC), skipping"; return 0
  fi
  log "raw: decompressing${TRAIN_LINES:+ (train cut to the first $TRAIN_LINES pairs)}"
  # every split is written and checked in raw.$TMP/, which replaces raw/ only when all are good:
  # a bad input or a kill leaves no partial raw/ (the EXIT trap removes raw.$TMP/)
  (( DRY_RUN )) || { rm -rf "$tmpdir"; mkdir -p "$tmpdir"; }
  for i in "${!UP_SPLITS[@]}"; do
    up="${UP_SPLITS[$i]}"; fs="${SPLITS[$i]}"
    for l in "${LANGS[@]}"; do
      src_gz="$IN_DIR/$up.$l.gz"; dst="$tmpdir/$fs.$l"
      log "decompressing $up.$l.gz -> raw/$fs.$l ..."
      run "gzip -dc $(q "$src_gz") > $(q "$dst")" || die "raw: cannot decompress $src_gz (not a valid .gz file?)"
      (( DRY_RUN )) && { [[ "$fs" == train && -n "$TRAIN_LINES" ]] && echo "    (keep the first $TRAIN_LINES lines)"; continue; }
      # make sure the last line ends with a newline, so wc -l counts it
      if [[ -s "$dst" ]] && [[ "$(tail -c1 "$dst" | wc -l)" -eq 0 ]]; then echo >> "$dst"; fi
      full=$(count_lines "$dst"); full_of[$l]=$full
      if (( CHECKSUM )) && [[ "$full" -ne "${NLINES[$up]}" ]]; then
        die "raw: $src_gz has $full lines, expected ${NLINES[$up]}"
      fi
      if [[ "$fs" == train && -n "$TRAIN_LINES" ]] && (( TRAIN_LINES < full )); then
        head -n "$TRAIN_LINES" "$dst" > "$dst.cut"
        mv -f "$dst.cut" "$dst"
      fi
    done
    (( DRY_RUN )) && continue
    # before any --train-lines cut: the full files must pair up
    [[ "${full_of[${LANGS[0]}]}" -eq "${full_of[${LANGS[1]}]}" ]] || die "raw: line counts differ: $IN_DIR/$up.${LANGS[0]}.gz has ${full_of[${LANGS[0]}]} lines, $IN_DIR/$up.${LANGS[1]}.gz has ${full_of[${LANGS[1]}]}; nothing written to $dir"
    # UTF-8, no empty or over-long line, equal line counts; messages name the input file and line
    files=()
    for l in "${LANGS[@]}"; do files+=("$tmpdir/$fs.$l"); done
    if ! "$PYTHON" "$TOOLS" check-parallel --max-words "$MAX_WORDS" "${files[@]}" 2> "$tmpdir/check.log"; then
      for l in "${LANGS[@]}"; do  # name the user's input, not the temp copy
        sed -i "s|$tmpdir/$fs.$l|$IN_DIR/$up.$l.gz (decompressed)|g" "$tmpdir/check.log"
      done
      cat "$tmpdir/check.log" >&2
      die "raw: bad input in $IN_DIR/$up.{${LANGS[0]},${LANGS[1]}}.gz (see above); nothing written to $dir"
    fi
    rm -f "$tmpdir/check.log"
    n=$(count_lines "$tmpdir/$fs.en")
    check_pair raw "$tmpdir" "$fs" "$n"
    if [[ "$fs" == train && -n "$TRAIN_LINES" ]] && (( n != TRAIN_LINES )); then
      log "note: --train-lines $TRAIN_LINES exceeds the corpus; using all $n training pairs"
    fi
  done
  if (( ! DRY_RUN )); then
    printf '%s\n' "$RAW_STAMP" > "$tmpdir/.done"   # the stamp travels with the files
    rm -rf "$dir"
    mv "$tmpdir" "$dir"
    log "raw: done ($((SECONDS - t0))s)"
  fi
}

# ---------------------------------------------------------------------------------------------
# Stage 2: tok (sacremoses)
# ---------------------------------------------------------------------------------------------
# stage_tok: data-prep/common/prep_lib.sh (raw/ -> tok/)

# ---------------------------------------------------------------------------------------------
# Stage 3: bpe (subword-nmt, joint)
# ---------------------------------------------------------------------------------------------
# stage_bpe: data-prep/common/prep_lib.sh (tok/ -> bpe/, joint codes bpe/codes)

# ---------------------------------------------------------------------------------------------
# Stage 3': char (--char; instead of bpe)
# ---------------------------------------------------------------------------------------------
stage_char() {
  local t0=$SECONDS dir="$OUT/char" s l io=()
  # shellcheck disable=SC2046
  if stage_current "$dir/.done" "$CHAR_STAMP" $(files_of "$dir"); then
    log "char: up to date, skipping"; return 0
  fi
  (( DRY_RUN )) || { mkdir -p "$dir"; rm -f "$dir/.done"; }
  for s in "${SPLITS[@]}"; do for l in "${LANGS[@]}"; do
    io+=("$(q "$OUT/tok/$s.$l")" "$(q "$dir/$s.$l")")
  done; done
  log "splitting {${SPLITS[*]}}.{en,de} into characters ..."
  run "$(q "$PYTHON") $(q "$TOOLS") split-chars ${io[*]}"
  if (( ! DRY_RUN )); then
    for s in "${SPLITS[@]}"; do check_pair char "$dir" "$s" "$(split_count "$s")"; done
    write_stamp "$dir/.done" "$CHAR_STAMP"; log "char: done ($((SECONDS - t0))s)"
  fi
}

# ---------------------------------------------------------------------------------------------
# Stage 4: bin (fairseq-preprocess)
# ---------------------------------------------------------------------------------------------
stage_bin() {
  local t0=$SECONDS
  local tmpdir="$OUT/bin.$TMP" logf="$OUT/logs/bin.log" fs l prefixes=() counts prefix n expected
  local pair="$SRC-$TGT" files=("$BIN/dict.$SRC.txt" "$BIN/dict.$TGT.txt")
  for fs in "${SPLITS[@]}"; do for l in "$SRC" "$TGT"; do
    files+=("$BIN/$fs.$pair.$l.bin" "$BIN/$fs.$pair.$l.idx")
  done; done
  if stage_current "$BIN/.done" "$BIN_STAMP" "${files[@]}"; then
    log "bin: up to date ($pair), skipping"; return 0
  fi
  log "binarizing with fairseq-preprocess ($pair, joined dictionary, $WORKERS workers) ..."
  (( DRY_RUN )) || { mkdir -p "$OUT/logs"; rm -rf "$tmpdir"; : > "$logf"; }
  run_logged "$logf" "$(q "$PYTHON") -m fairseq_cli.preprocess --source-lang $SRC --target-lang $TGT --joined-dictionary --trainpref $(q "$OUT/$SEG/train") --validpref $(q "$OUT/$SEG/valid") --testpref $(q "$OUT/$SEG/test"),$(q "$OUT/$SEG/test1") --destdir $(q "$tmpdir") --workers $WORKERS"
  if (( DRY_RUN )); then echo "    (then replace $BIN with the new dir)"; return 0; fi
  cmp -s "$tmpdir/dict.$SRC.txt" "$tmpdir/dict.$TGT.txt" || die "bin: dict.$SRC.txt and dict.$TGT.txt differ in $tmpdir (expected a joined dictionary)"
  for fs in "${SPLITS[@]}"; do for l in "$SRC" "$TGT"; do prefixes+=("$tmpdir/$fs.$pair.$l"); done; done
  counts="$("$PYTHON" "$TOOLS" count-bin "${prefixes[@]}" 2>>"$logf")" || die "bin: fairseq-preprocess did not write every dataset (see $logf)"
  while IFS=$'\t' read -r prefix n; do
    fs="$(basename "$prefix")"; fs="${fs%%.*}"
    expected="$(split_count "$fs")"
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
lock_out   # serialize concurrent runs on the same --out

log "out=$OUT src=$SRC tgt=$TGT $( (( CHAR )) && echo segmentation=char || echo bpe_merges=$BPE_MERGES) train_lines=$TL_DESC workers=$WORKERS mode=$MODE"
stage_inputs
stage_raw
stage_tok raw
if (( CHAR )); then stage_char; else stage_bpe "$BPE_MERGES merges"; fi
stage_bin

if (( DRY_RUN )); then
  log "dry run finished; nothing was done. The bin dir would be:"
else
  log "done. fairseq data dir (serves $SRC->$TGT and $TGT->$SRC):"
fi
echo "$BIN"
