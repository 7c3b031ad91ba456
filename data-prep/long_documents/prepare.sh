#!/usr/bin/env bash
# Prepare long-document English->German data for fairseq (ReLUFormer §4.3.2 / Appendix B).
#
# Run `data-prep/long_documents/prepare.sh --help` for the options.  Pipeline:
#   0. inputs   the Maruf et al. (2019) document-level dev/test files from --data-dir
#               (default ../shared/data next to the repo) or downloaded from
#               github.com/sameenmaruf/selective-attn at a pinned commit (--download); the sha256
#               of every input's uncompressed content is checked (abort on mismatch).
#   1. sent     read every source into documents of sentence pairs (longdoc_tools.py
#               read-sources): test = Europarl7 test, valid = Europarl7 dev, train pool = every
#               other document-bounded set, deduplicated against valid/test and within itself
#               -> <out>/sent/{train,valid,test}.{en,de,docids} + sent/sources.json
#   2. tok      Moses tokenisation (sacremoses python API, escape=False, case kept) -> <out>/tok/
#   3. bpe      joint BPE (subword-nmt, --bpe-merges merges, min frequency 2) learned on the
#               sentence-level train pool, applied to every split -> <out>/bpe/ (+ bpe/codes)
#   4. dict     one joined fairseq dictionary from bpe/train.{en,de} -> <out>/dict/
#   5. L{L}     for every L of --lengths: pack consecutive sentences of each document (never
#               crossing documents) into documents of <= L BPE tokens per side
#               -> <out>/L{L}/{bpe,tok,raw}/..., <out>/L{L}/{split}.map
#   6. bin      fairseq-preprocess --srcdict/--tgtdict <out>/dict/... for every L, so that all
#               lengths share one vocabulary -> <out>/L{L}/bin/
#   7. stats    <out>/stats.json + a short summary
#
# Every stage checks line counts and writes a `.done` stamp holding its parameters (and a hash of
# the previous stage's stamp); a stage whose stamp matches and whose outputs exist is skipped, so
# re-running is cheap and changing --bpe-merges or --lengths redoes exactly the affected stages.
# Every output file is written to a temp file and moved into place (bin dirs are built in a temp
# dir and swapped in): a failed run leaves no half-written output behind.
#
# Shared with data-prep/multi30k/prepare.sh: the shell helpers and the tok/bpe stages in
# data-prep/common/prep_lib.sh, and the Python side of tokenize/learn-bpe/apply-bpe/count-bin/versions
# in data-prep/common/text_tools.py (longdoc_tools.py registers those subcommands).
set -euo pipefail

LOG_TAG=long_docs
# shellcheck source=../common/prep_lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../common/prep_lib.sh"   # sets REPO (the repo root)
TOOLS="$REPO/data-prep/long_documents/longdoc_tools.py"
SPLITS=(train valid test)
LANGS=(en de)
DEFAULT_LENGTHS="128 256 512 1024 2048"

UPSTREAM_COMMIT="b30c31c8b1014f9cb1ec190658fc2369a6fd015c"
# A mirror of data/ may be given with MARUF_BASE_URL (any URL curl/wget accept, e.g.
# file:///path/to/dir holding {Europarl7,IWSLT2017,NC-2016}/...); the sha256 checks still apply.
UPSTREAM_BASE="${MARUF_BASE_URL:-https://raw.githubusercontent.com/sameenmaruf/selective-attn/${UPSTREAM_COMMIT}/data}"

PROG="data-prep/long_documents/prepare.sh"
usage() {
  cat <<EOF
Usage: $PROG [options]

Build long-document En->De translation data (ReLUFormer §4.3.2, Appendix B): documents of at most L
BPE tokens made of consecutive sentences of one original document, for every L of --lengths, all
sharing one joint BPE and one joined fairseq dictionary.

  test  = Europarl7 test of Maruf et al. (2019)  (5,134 sentences, 360 documents)
  valid = Europarl7 dev  of Maruf et al. (2019)  (3,587 sentences, 240 documents)
  train = pool of every other document-bounded set found: Maruf IWSLT17 TED + News Commentary
          dev/test, IWSLT14 TED talks (XML), newstest2014 (sgm), [+ --train-dir]; deduplicated
          against valid/test and within itself (see data-prep/long_documents/README.md).

Options:
  --data-dir DIR      shared data folder holding docmt_maruf2019_en_de/, iwslt14_de_en/orig_xml/ and
                      wmt/sgm/ (default: <repo>/../shared/data if it exists)
  --download          download the 12 Maruf dev/test files from github.com/sameenmaruf/selective-attn
                      (commit ${UPSTREAM_COMMIT:0:12}) into <out>/download/ (curl or wget) and use them
                      instead of those in --data-dir; the IWSLT14 XML and newstest2014 sgm still come
                      from --data-dir when it exists (else the pool is the Maruf TED + NC sets only)
  --train-dir DIR     add a Maruf-format training set to the pool: DIR/concatenated_en2de_train_{en,de}.txt
                      (or .txt.gz; one sentence per line, a line "<d>" starts each document).  The full
                      Europarl7 document-level training set of Maruf et al. has no stable official URL,
                      so it is never downloaded: obtain it yourself and pass it here
  --out DIR           output directory (default: <repo>/data-bin/long_docs_en_de)
  --lengths "L ..."   document length limits in BPE tokens (default: "$DEFAULT_LENGTHS")
  --bpe-merges N      number of joint BPE merge operations (default: 10000)
  --workers N         worker processes for apply-bpe and fairseq-preprocess (default: 2)
  --no-checksum       do not check the sha256 of the input files (for other copies of them)
  --dry-run           print the URLs + sha256 and the stages/commands that would run; do nothing
  -h, --help          show this help

Environment: PYTHON (interpreter with sacremoses, subword_nmt, fairseq; default: python on PATH,
else <repo>/.venv/bin/python), MARUF_BASE_URL (mirror of the upstream data/ dir for --download).

Output layout (<out>):
  sent/        {train,valid,test}.{en,de} raw sentences, {split}.docids (doc id per line), sources.json
  tok/, bpe/   sentence-level Moses-tokenised / BPE'd text; bpe/codes = joint BPE codes
  dict/        dict.en.txt == dict.de.txt, the joined dictionary shared by every L
  L<L>/bpe/    {train,valid,test}.{en,de}: one packed document per line (sentences joined by a space)
  L<L>/raw/    {valid,test}.{en,de}: the same documents, detokenized (references for sacreBLEU)
  L<L>/tok/    {valid,test}.{en,de}: the same documents, Moses-tokenised (tokenized BLEU)
  L<L>/{split}.map  per packed doc: index, docid, first/end sentence index (0-based, end exclusive,
                    into sent/{split}.*), #sentences, #en / #de BPE tokens, over-length flag
  L<L>/bin/    fairseq binarized data (en-de, train/valid/test) + dict.{en,de}.txt
  stats.json   counts per split, source and L; logs/ = tool logs; */.done = stage stamps

Training at L needs --max-source-positions/--max-target-positions >= L+2 (see README.md).
The last line printed on stdout is the absolute path of <out>.
EOF
}

# ---------------------------------------------------------------------------------------------
# Arguments
# ---------------------------------------------------------------------------------------------
DATA_DIR=""
TRAIN_DIR=""
OUT=""
LENGTHS="$DEFAULT_LENGTHS"
BPE_MERGES=10000
WORKERS=2
DOWNLOAD=0
DRY_RUN=0
CHECKSUM=1

VALID_OPTS="--data-dir, --download, --train-dir, --out, --lengths, --bpe-merges, --workers, --no-checksum, --dry-run, --help"
VALUE_OPTS="--data-dir=DATA_DIR --train-dir=TRAIN_DIR --lengths=LENGTHS"   # (+ --out, --bpe-merges, --workers)
FLAG_OPTS="--download=DOWNLOAD=1"                                       # (+ --dry-run, --no-checksum)
parse_options "$@"
# --lengths: positive integers separated by spaces or commas; duplicates dropped, sorted.
L_LIST=()
for l in ${LENGTHS//,/ }; do
  is_posint "$l" || die "--lengths must be positive integers separated by spaces or commas, e.g. \"$DEFAULT_LENGTHS\" (got '$LENGTHS')"
  L_LIST+=("$((10#$l))")
done
(( ${#L_LIST[@]} )) || die "--lengths is empty; e.g. --lengths \"$DEFAULT_LENGTHS\""
mapfile -t L_LIST < <(printf '%s\n' "${L_LIST[@]}" | sort -n -u)
LENGTHS="${L_LIST[*]}"

DEFAULT_DATA_DIR="$REPO/../shared/data"
if given --data-dir; then
  [[ -d "$DATA_DIR" ]] || die "--data-dir '$DATA_DIR' is not a directory"
elif [[ -d "$DEFAULT_DATA_DIR" ]]; then
  DATA_DIR="$DEFAULT_DATA_DIR"
else
  DATA_DIR=""
fi
[[ -n "$DATA_DIR" ]] && DATA_DIR="$(cd "$DATA_DIR" && pwd)"
if (( ! DOWNLOAD )); then
  [[ -n "$DATA_DIR" ]] || die "no data: $DEFAULT_DATA_DIR does not exist; pass --data-dir DIR (the shared data folder) or --download"
  [[ -d "$DATA_DIR/docmt_maruf2019_en_de" ]] || die "--data-dir $DATA_DIR has no docmt_maruf2019_en_de/ (the Maruf et al. dev/test files); pass the shared data folder or use --download"
fi
if [[ -n "$TRAIN_DIR" ]]; then
  [[ -d "$TRAIN_DIR" ]] || die "--train-dir '$TRAIN_DIR' is not a directory"
  TRAIN_DIR="$(cd "$TRAIN_DIR" && pwd)"
  for l in "${LANGS[@]}"; do
    f="$TRAIN_DIR/concatenated_en2de_train_$l.txt"
    [[ -f "$f" || -f "$f.gz" ]] || die "--train-dir $TRAIN_DIR has no concatenated_en2de_train_$l.txt[.gz] (Maruf format: one sentence per line, '<d>' starts a document)"
  done
fi

OUT="${OUT:-$REPO/data-bin/long_docs_en_de}"
abs_out
MARUF_DIR=""
(( DOWNLOAD )) && MARUF_DIR="$OUT/download"

find_python

# ---------------------------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------------------------
init_tmp 3   # temp files/dirs (suffix $TMP) up to 3 levels below OUT are removed on exit

split_count() {  # sentence count of split $1 (from sent/; under --dry-run "?")
  if [[ -f "$OUT/sent/$1.docids" ]] && (( DRY_RUN == 0 )); then count_lines "$OUT/sent/$1.docids"; else echo "?"; fi
}

# ---------------------------------------------------------------------------------------------
# Stamps
# ---------------------------------------------------------------------------------------------
VERSIONS="$(tool_versions)"
MARUF_LIST="$("$PYTHON" "$TOOLS" maruf-files 2>/dev/null || true)"
[[ -n "$MARUF_LIST" ]] || (( DRY_RUN )) || die "'$PYTHON $TOOLS maruf-files' failed"

# sha256 of the versions of longdoc_tools.py known to write byte-identical outputs (full runs
# compared with `diff -r`).  The sent stamp records the first of them for each of them, so data
# prepared with one is not redone with another.  After an edit of longdoc_tools.py that keeps the
# outputs (verified the same way), append its new hash; any other version gets stamps of its own.
TOOLS_SAME_OUTPUT=(
  5f8fa250cf14866c33c9de88996573772ad9d61c5d97b397b7ef7a427be73f2e   # up to commit e141f7e
  3745acca7513d61d10a95fef7e22c56366d440a8c0be726e4f9457feef325011   # tokenize, BPE, count-bin, versions moved to data-prep/common/text_tools.py
  f3cd7139eb254b8a92b38dee3047893f4831833454cce8e4dc9cfeae41deac0a   # + check-inputs subcommand only (no reader, dedup or packing code touched: `git diff` shows it)
)
tools_sha() {  # the tools= value of the sent stamp
  local h; h="$(sha256_file "$TOOLS")"
  [[ " ${TOOLS_SAME_OUTPUT[*]} " == *" $h "* ]] && h="${TOOLS_SAME_OUTPUT[0]}"
  echo "$h"
}

input_desc() {  # size and mtime of every input file (the sha256 values are checked by read-sources)
  local f
  {
    if [[ -n "$DATA_DIR" ]]; then
      for f in "$DATA_DIR"/docmt_maruf2019_en_de/*/* "$DATA_DIR"/iwslt14_de_en/orig_xml/IWSLT14.*.xml* "$DATA_DIR"/wmt/sgm/newstest2014-deen-*.sgm*; do
        [[ -f "$f" ]] && echo "$f"
      done
    fi
    [[ -n "$MARUF_DIR" && -d "$MARUF_DIR" ]] && find "$MARUF_DIR" -type f -name 'concatenated_*'
    [[ -n "$TRAIN_DIR" ]] && find "$TRAIN_DIR" -maxdepth 1 -type f -name 'concatenated_en2de_train_*'
  } 2>/dev/null | sort | while read -r f; do
    stat -c '%n:%s:%Y' "$f" 2>/dev/null || stat -f '%N:%z:%m' "$f"
  done | tr '\n' ' '
}

make_stamps() {  # after stage_inputs (a download changes the inputs)
  SENT_STAMP="stage=sent
data_dir=${DATA_DIR:-none}
maruf_dir=${MARUF_DIR:-from data_dir}
train_dir=${TRAIN_DIR:-none}
checksum=$CHECKSUM
inputs=$(input_desc)
tools=$(tools_sha)"
  # (tools: the hash of longdoc_tools.py, see tools_sha, so a change of the readers or the dedup rule
  # redoes everything)
  TOK_STAMP="stage=tok
upstream=$(sha256_str "$SENT_STAMP")
tokenizer=sacremoses MosesTokenizer(lang).tokenize(escape=False); case kept
versions=$VERSIONS"
  BPE_STAMP="stage=bpe
upstream=$(sha256_str "$TOK_STAMP")
bpe_merges=$BPE_MERGES
bpe=subword-nmt learn_bpe (min_frequency=2) on tok/train.en+tok/train.de, BPE.process_line on all splits
versions=$VERSIONS"
  DICT_STAMP="stage=dict
upstream=$(sha256_str "$BPE_STAMP")
fairseq-preprocess --joined-dictionary --dict-only on bpe/train.{en,de}"
}
pack_stamp() { printf 'stage=pack\nupstream=%s\nlength=%s\nunit=max(#BPE en, #BPE de) per sentence' "$(sha256_str "$BPE_STAMP")" "$1"; }
bin_stamp() { printf 'stage=bin\nupstream=%s\ndict=%s\nfairseq-preprocess --srcdict --tgtdict en-de' "$(sha256_str "$(pack_stamp "$1")")" "$(sha256_str "$DICT_STAMP")"; }

# ---------------------------------------------------------------------------------------------
# Stage 0: inputs (download mode only; local files are checked by read-sources)
# ---------------------------------------------------------------------------------------------
# messages of fetch (prep_lib.sh) when a download cannot be done
FETCH_NO_TOOL_MSG="--download needs curl or wget (neither found); or pass --data-dir DIR"
FETCH_FAIL_HINT="pass --data-dir DIR to use local copies"

stage_inputs() {
  if (( DRY_RUN )); then
    log "dry run: nothing will be written"
    log "data dir: ${DATA_DIR:-none}; maruf files: ${MARUF_DIR:-from the data dir}; train dir: ${TRAIN_DIR:-none}; out: $OUT"
    log "Maruf et al. dev/test files (github.com/sameenmaruf/selective-attn @ $UPSTREAM_COMMIT) and the sha256 of their uncompressed content:"
    while IFS=$'\t' read -r rel sha; do echo "    $UPSTREAM_BASE/$rel  $sha"; done <<< "$MARUF_LIST"
  fi
  (( DOWNLOAD )) || return 0
  local rel sha
  while IFS=$'\t' read -r rel sha; do
    download_checked "$MARUF_DIR" "$rel" "$sha" "$CHECKSUM"
  done <<< "$MARUF_LIST"
}

# ---------------------------------------------------------------------------------------------
# Stage 1: sent (read, split, dedup)
# ---------------------------------------------------------------------------------------------
stage_sent() {
  local t0=$SECONDS dir="$OUT/sent" s args=()
  # shellcheck disable=SC2046
  if stage_current "$dir/.done" "$SENT_STAMP" "$dir/sources.json" $(files_of "$dir") $(for s in "${SPLITS[@]}"; do echo "$dir/$s.docids"; done); then
    log "sent: up to date, skipping"; return 0
  fi
  if (( ! DRY_RUN )) && [[ -n "$DATA_DIR$MARUF_DIR" ]]; then
    # before anything is written: the line-aligned Maruf dev/test inputs must be strict UTF-8,
    # without empty or over-long lines, with equal line counts (check-parallel, messages name
    # the input file and line); the XML/sgm sources are checked by their parsers in read-sources
    args=()
    [[ -n "$DATA_DIR" ]] && args+=(--data-dir "$DATA_DIR")
    [[ -n "$MARUF_DIR" ]] && args+=(--maruf-dir "$MARUF_DIR")
    "$PYTHON" "$TOOLS" check-inputs "${args[@]}" || die "sent: bad input (see above); nothing written to $dir"
    args=()
  fi
  log "sent: reading the sources (test = Europarl7 test, valid = Europarl7 dev, train = the deduplicated pool) ..."
  (( DRY_RUN )) || { mkdir -p "$dir" "$OUT/logs"; rm -f "$dir/.done"; }
  [[ -n "$DATA_DIR" ]] && args+=(--data-dir "$(q "$DATA_DIR")")
  [[ -n "$MARUF_DIR" ]] && args+=(--maruf-dir "$(q "$MARUF_DIR")")
  [[ -n "$TRAIN_DIR" ]] && args+=(--train-dir "$(q "$TRAIN_DIR")")
  (( CHECKSUM )) || args+=(--no-checksum)
  run "$(q "$PYTHON") $(q "$TOOLS") read-sources --out-dir $(q "$dir") ${args[*]}"
  if (( ! DRY_RUN )); then
    for s in "${SPLITS[@]}"; do check_pair sent "$dir" "$s" "$(split_count "$s")"; done
    write_stamp "$dir/.done" "$SENT_STAMP"
    log "sent: done ($((SECONDS - t0))s)"
  fi
}

# ---------------------------------------------------------------------------------------------
# Stage 2: tok (sacremoses)
# ---------------------------------------------------------------------------------------------
# stage_tok: data-prep/common/prep_lib.sh (sent/ -> tok/)

# ---------------------------------------------------------------------------------------------
# Stage 3: bpe (subword-nmt, joint, learned on the sentence-level train pool)
# ---------------------------------------------------------------------------------------------
# stage_bpe: data-prep/common/prep_lib.sh (tok/ -> bpe/, joint codes bpe/codes)

# ---------------------------------------------------------------------------------------------
# Stage 4: dict (one joined dictionary for every L)
# ---------------------------------------------------------------------------------------------
stage_dict() {
  local t0=$SECONDS dir="$OUT/dict" tmpdir="$OUT/dict.$TMP" logf="$OUT/logs/dict.log"
  if stage_current "$dir/.done" "$DICT_STAMP" "$dir/dict.en.txt" "$dir/dict.de.txt"; then
    log "dict: up to date, skipping"; return 0
  fi
  log "building the joined dictionary from bpe/train.{en,de} ..."
  (( DRY_RUN )) || { mkdir -p "$OUT/logs"; rm -rf "$tmpdir"; : > "$logf"; }
  run_logged "$logf" "$(q "$PYTHON") -m fairseq_cli.preprocess --source-lang en --target-lang de --joined-dictionary --dict-only --trainpref $(q "$OUT/bpe/train") --destdir $(q "$tmpdir") --workers $WORKERS"
  (( DRY_RUN )) && return 0
  cmp -s "$tmpdir/dict.en.txt" "$tmpdir/dict.de.txt" || die "dict: dict.en.txt and dict.de.txt differ in $tmpdir (expected a joined dictionary)"
  printf '%s\n' "$DICT_STAMP" > "$tmpdir/.done"
  rm -rf "$dir"; mv "$tmpdir" "$dir"
  log "dict: $(count_lines "$dir/dict.en.txt") types (+4 special symbols), shared by en and de and every L ($((SECONDS - t0))s)"
}

# ---------------------------------------------------------------------------------------------
# Stage 5: pack (per L)
# ---------------------------------------------------------------------------------------------
stage_pack() {
  local L="$1" t0=$SECONDS dir="$OUT/L$1" stamp s n
  stamp="$(pack_stamp "$L")"
  # shellcheck disable=SC2046
  if stage_current "$dir/.done" "$stamp" $(files_of "$dir/bpe") $(files_of "$dir/raw" valid test) $(files_of "$dir/tok" valid test) \
       $(for s in "${SPLITS[@]}"; do echo "$dir/$s.map"; done); then
    log "L=$L pack: up to date, skipping"; return 0
  fi
  log "L=$L: packing sentences into documents of <= $L BPE tokens per side ..."
  (( DRY_RUN )) || { mkdir -p "$dir"; rm -f "$dir/.done"; }
  run "$(q "$PYTHON") $(q "$TOOLS") pack --out $(q "$OUT") --length $L"
  (( DRY_RUN )) && return 0
  for s in "${SPLITS[@]}"; do
    n=$(count_lines "$dir/$s.map")
    check_pair "L=$L pack" "$dir/bpe" "$s" "$n"
    if [[ "$s" != train ]]; then check_pair "L=$L pack" "$dir/raw" "$s" "$n"; check_pair "L=$L pack" "$dir/tok" "$s" "$n"; fi
  done
  write_stamp "$dir/.done" "$stamp"
  log "L=$L pack: train/valid/test $(count_lines "$dir/train.map")/$(count_lines "$dir/valid.map")/$(count_lines "$dir/test.map") documents ($((SECONDS - t0))s)"
}

# ---------------------------------------------------------------------------------------------
# Stage 6: bin (per L, shared dictionary)
# ---------------------------------------------------------------------------------------------
stage_bin() {
  local L="$1" t0=$SECONDS bin="$OUT/L$1/bin" tmpdir="$OUT/L$1/bin.$TMP" logf="$OUT/logs/bin.L$1.log"
  local stamp s l prefixes=() counts prefix n expected files=("$OUT/L$1/bin/dict.en.txt" "$OUT/L$1/bin/dict.de.txt")
  stamp="$(bin_stamp "$L")"
  for s in "${SPLITS[@]}"; do for l in "${LANGS[@]}"; do files+=("$bin/$s.en-de.$l.bin" "$bin/$s.en-de.$l.idx"); done; done
  if stage_current "$bin/.done" "$stamp" "${files[@]}"; then
    log "L=$L bin: up to date, skipping"; return 0
  fi
  log "L=$L: binarizing with fairseq-preprocess (shared dictionary, $WORKERS workers) ..."
  (( DRY_RUN )) || { rm -rf "$tmpdir"; : > "$logf"; }
  run_logged "$logf" "$(q "$PYTHON") -m fairseq_cli.preprocess --source-lang en --target-lang de --srcdict $(q "$OUT/dict/dict.en.txt") --tgtdict $(q "$OUT/dict/dict.de.txt") --trainpref $(q "$OUT/L$L/bpe/train") --validpref $(q "$OUT/L$L/bpe/valid") --testpref $(q "$OUT/L$L/bpe/test") --destdir $(q "$tmpdir") --workers $WORKERS"
  (( DRY_RUN )) && return 0
  cmp -s "$tmpdir/dict.en.txt" "$OUT/dict/dict.en.txt" && cmp -s "$tmpdir/dict.de.txt" "$OUT/dict/dict.en.txt" \
    || die "L=$L bin: the dictionaries in $tmpdir differ from $OUT/dict/dict.en.txt"
  for s in "${SPLITS[@]}"; do for l in "${LANGS[@]}"; do prefixes+=("$tmpdir/$s.en-de.$l"); done; done
  counts="$("$PYTHON" "$TOOLS" count-bin "${prefixes[@]}" 2>>"$logf")" || die "L=$L bin: fairseq-preprocess did not write every dataset (see $logf)"
  while IFS=$'\t' read -r prefix n; do
    s="$(basename "$prefix")"; s="${s%%.*}"
    expected=$(count_lines "$OUT/L$L/bpe/$s.en")
    [[ "$n" -eq "$expected" ]] || die "L=$L bin: $(basename "$prefix") has $n documents, expected $expected (L$L/bpe/$s.en)"
  done <<< "$counts"
  printf '%s\n' "$stamp" > "$tmpdir/.done"
  rm -rf "$bin"; mv "$tmpdir" "$bin"
  log "L=$L bin: done ($((SECONDS - t0))s)"
}

# ---------------------------------------------------------------------------------------------
# Main
# ---------------------------------------------------------------------------------------------
lock_out   # serialize concurrent runs on the same --out

log "out=$OUT data_dir=${DATA_DIR:-none} download=$DOWNLOAD train_dir=${TRAIN_DIR:-none} lengths=\"$LENGTHS\" bpe_merges=$BPE_MERGES workers=$WORKERS"
stage_inputs
make_stamps
stage_sent
stage_tok sent
stage_bpe "$BPE_MERGES merges, min frequency 2"
stage_dict
for L in "${L_LIST[@]}"; do
  stage_pack "$L"
  stage_bin "$L"
done
if (( DRY_RUN )); then
  echo "    \$ $(q "$PYTHON") $(q "$TOOLS") stats --out $(q "$OUT") --lengths \"$LENGTHS\""
  log "dry run finished; nothing was done. The output dir would be:"
else
  "$PYTHON" "$TOOLS" stats --out "$OUT" --lengths "$LENGTHS" 2>&1 || die "stats failed"
  log "done. fairseq data dirs: $OUT/L{${LENGTHS// /,}}/bin (stats: $OUT/stats.json). Output dir:"
fi
echo "$OUT"
