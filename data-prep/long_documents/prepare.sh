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
set -euo pipefail

PROG="data-prep/long_documents/prepare.sh"
SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$SCRIPT_DIR/../.." && pwd)"
TOOLS="$SCRIPT_DIR/longdoc_tools.py"

UPSTREAM_COMMIT="b30c31c8b1014f9cb1ec190658fc2369a6fd015c"
UPSTREAM_BASE="https://raw.githubusercontent.com/sameenmaruf/selective-attn/${UPSTREAM_COMMIT}/data"
# A mirror of data/ may be given with MARUF_BASE_URL (any URL curl/wget accept, e.g.
# file:///path/to/dir holding {Europarl7,IWSLT2017,NC-2016}/...); the sha256 checks still apply.
UPSTREAM_BASE="${MARUF_BASE_URL:-$UPSTREAM_BASE}"
SPLITS=(train valid test)
LANGS=(en de)
DEFAULT_LENGTHS="128 256 512 1024 2048"

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

log() { echo "[long_docs] $*"; }
die() { echo "[long_docs] ERROR: $*" >&2; exit 1; }
q() { printf '%q' "$1"; }
is_posint() { [[ "$1" =~ ^[0-9]+$ ]] && (( 10#$1 > 0 )); }

# ---------------------------------------------------------------------------------------------
# Arguments
# ---------------------------------------------------------------------------------------------
DATA_DIR=""
DATA_DIR_GIVEN=0
TRAIN_DIR=""
OUT=""
LENGTHS="$DEFAULT_LENGTHS"
BPE_MERGES=10000
WORKERS=2
DOWNLOAD=0
DRY_RUN=0
CHECKSUM=1

VALID_OPTS="--data-dir, --download, --train-dir, --out, --lengths, --bpe-merges, --workers, --no-checksum, --dry-run, --help"
while (( $# )); do
  arg="$1"
  if [[ "$arg" == --*=* ]]; then       # accept --opt=value as well as --opt value
    set -- "${arg%%=*}" "${arg#*=}" "${@:2}"
    arg="$1"
  fi
  case "$arg" in
    --data-dir|--train-dir|--out|--lengths|--bpe-merges|--workers)
      (( $# >= 2 )) || die "$arg needs a value (see --help)"
      val="$2"; shift 2
      case "$arg" in
        --data-dir) DATA_DIR="$val"; DATA_DIR_GIVEN=1 ;;
        --train-dir) TRAIN_DIR="$val" ;;
        --out) OUT="$val" ;;
        --lengths) LENGTHS="$val" ;;
        --bpe-merges) BPE_MERGES="$val" ;;
        --workers) WORKERS="$val" ;;
      esac
      ;;
    --download) DOWNLOAD=1; shift ;;
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
if (( DATA_DIR_GIVEN )); then
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
if [[ -d "$OUT" ]]; then OUT="$(cd "$OUT" && pwd)"
elif [[ "$OUT" != /* ]]; then OUT="$PWD/$OUT"; fi
OUT="${OUT%/}"
MARUF_DIR=""
(( DOWNLOAD )) && MARUF_DIR="$OUT/download"

# Python interpreter providing sacremoses, subword_nmt and fairseq.
have_modules() { "$1" -c 'import importlib.util as u, sys; sys.exit(any(u.find_spec(m) is None for m in ("sacremoses", "subword_nmt", "fairseq", "fairseq_cli")))' 2>/dev/null; }
if [[ -z "${PYTHON:-}" ]]; then
  if command -v python >/dev/null 2>&1 && have_modules python; then PYTHON=python
  elif [[ -x "$REPO/.venv/bin/python" ]] && have_modules "$REPO/.venv/bin/python"; then PYTHON="$REPO/.venv/bin/python"
  else PYTHON=python; fi
fi
if ! have_modules "$PYTHON"; then
  msg="'$PYTHON' cannot import sacremoses, subword_nmt and fairseq; activate the venv (. .venv/bin/activate) or set PYTHON=/path/to/python"
  if (( DRY_RUN )); then echo "[long_docs] WARNING: $msg" >&2; else die "$msg"; fi
fi

# ---------------------------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------------------------
TMP="tmp.$$"   # suffix of every temp file/dir of this run (removed on exit)
cleanup() {
  if (( DRY_RUN == 0 )) && [[ -d "$OUT" ]]; then
    find "$OUT" -maxdepth 3 -name "*.$TMP" -exec rm -rf {} + 2>/dev/null || true
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

run() { if (( DRY_RUN )); then echo "    \$ $1"; else eval "$1"; fi; }
run_logged() {
  local logf="$1" cmd="$2"
  if (( DRY_RUN )); then echo "    \$ $cmd >> $(q "$logf") 2>&1"; return 0; fi
  echo "\$ $cmd" >> "$logf"
  if ! eval "$cmd" >> "$logf" 2>&1; then
    tail -n 25 "$logf" >&2 || true
    die "command failed (full log: $logf): $cmd"
  fi
}

stage_current() {  # stage_current STAMP EXPECTED FILE...: stamp holds EXPECTED and every FILE exists
  local stamp="$1" expected="$2"; shift 2
  [[ -f "$stamp" ]] && [[ "$(cat "$stamp")" == "$expected" ]] || return 1
  local f; for f in "$@"; do [[ -e "$f" ]] || return 1; done
}
write_stamp() { printf '%s\n' "$2" > "$1.$TMP"; mv -f "$1.$TMP" "$1"; }

check_pair() {  # check_pair STAGE DIR SPLIT EXPECTED: DIR/SPLIT.en and DIR/SPLIT.de have EXPECTED lines
  local stage="$1" dir="$2" split="$3" expected="$4" n_en n_de
  n_en=$(count_lines "$dir/$split.en"); n_de=$(count_lines "$dir/$split.de")
  [[ "$n_en" -eq "$n_de" ]] || die "$stage: line counts differ: $dir/$split.en has $n_en lines, $dir/$split.de has $n_de"
  [[ "$n_en" -eq "$expected" ]] || die "$stage: $dir/$split.en and $dir/$split.de have $n_en lines, expected $expected"
}
files_of() {  # files_of DIR [SPLIT...]: DIR/SPLIT.{en,de}
  local d="$1" s l; shift
  (( $# )) || set -- "${SPLITS[@]}"
  for s in "$@"; do for l in "${LANGS[@]}"; do echo "$d/$s.$l"; done; done
}
sent_count() {  # sentence count of split $1 (from sent/)
  if [[ -f "$OUT/sent/$1.docids" ]] && (( DRY_RUN == 0 )); then count_lines "$OUT/sent/$1.docids"; else echo "?"; fi
}

# ---------------------------------------------------------------------------------------------
# Stamps
# ---------------------------------------------------------------------------------------------
VERSIONS="$("$PYTHON" "$TOOLS" versions 2>/dev/null | tr '\n' ' ' || true)"
VERSIONS="${VERSIONS% }"
MARUF_LIST="$("$PYTHON" "$TOOLS" maruf-files 2>/dev/null || true)"
[[ -n "$MARUF_LIST" ]] || (( DRY_RUN )) || die "'$PYTHON $TOOLS maruf-files' failed"

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
tools=$(sha256_file "$TOOLS")"
  # (tools: the hash of longdoc_tools.py, so a change of the readers or the dedup rule redoes everything)
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
fetch() {  # fetch URL DEST
  local tool
  if command -v curl >/dev/null 2>&1; then
    tool="curl -fL --retry 3 --connect-timeout 30 -sS -o $(q "$2") $(q "$1")"
  elif command -v wget >/dev/null 2>&1; then
    tool="wget -q --tries=3 -O $(q "$2") $(q "$1")"
  else
    die "--download needs curl or wget (neither found); or pass --data-dir DIR"
  fi
  run "$tool" || { rm -f "$2"; die "download failed: $1 (pass --data-dir DIR to use local copies)"; }
}

stage_inputs() {
  if (( DRY_RUN )); then
    log "dry run: nothing will be written"
    log "data dir: ${DATA_DIR:-none}; maruf files: ${MARUF_DIR:-from the data dir}; train dir: ${TRAIN_DIR:-none}; out: $OUT"
    log "Maruf et al. dev/test files (github.com/sameenmaruf/selective-attn @ $UPSTREAM_COMMIT) and the sha256 of their uncompressed content:"
    while IFS=$'\t' read -r rel sha; do echo "    $UPSTREAM_BASE/$rel  $sha"; done <<< "$MARUF_LIST"
  fi
  (( DOWNLOAD )) || return 0
  local rel sha path actual
  while IFS=$'\t' read -r rel sha; do
    path="$MARUF_DIR/$rel"
    if [[ -f "$path" ]] && [[ "$(sha256_file "$path")" == "$sha" ]]; then
      log "have download/$rel (sha256 ok)"; continue
    fi
    log "downloading $rel ..."
    (( DRY_RUN )) || mkdir -p "$(dirname "$path")"
    fetch "$UPSTREAM_BASE/$rel" "$path.$TMP"
    (( DRY_RUN )) && continue
    actual="$(sha256_file "$path.$TMP")"
    if (( CHECKSUM )) && [[ "$actual" != "$sha" ]]; then
      rm -f "$path.$TMP"
      die "sha256 mismatch for downloaded $rel: expected $sha, got $actual (URL $UPSTREAM_BASE/$rel)"
    fi
    mv -f "$path.$TMP" "$path"
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
  log "sent: reading the sources (test = Europarl7 test, valid = Europarl7 dev, train = the deduplicated pool) ..."
  (( DRY_RUN )) || { mkdir -p "$dir" "$OUT/logs"; rm -f "$dir/.done"; }
  [[ -n "$DATA_DIR" ]] && args+=(--data-dir "$(q "$DATA_DIR")")
  [[ -n "$MARUF_DIR" ]] && args+=(--maruf-dir "$(q "$MARUF_DIR")")
  [[ -n "$TRAIN_DIR" ]] && args+=(--train-dir "$(q "$TRAIN_DIR")")
  (( CHECKSUM )) || args+=(--no-checksum)
  run "$(q "$PYTHON") $(q "$TOOLS") read-sources --out-dir $(q "$dir") ${args[*]}"
  if (( ! DRY_RUN )); then
    for s in "${SPLITS[@]}"; do check_pair sent "$dir" "$s" "$(sent_count "$s")"; done
    write_stamp "$dir/.done" "$SENT_STAMP"
    log "sent: done ($((SECONDS - t0))s)"
  fi
}

# ---------------------------------------------------------------------------------------------
# Stage 2: tok (sacremoses)
# ---------------------------------------------------------------------------------------------
stage_tok() {
  local t0=$SECONDS dir="$OUT/tok" s l
  # shellcheck disable=SC2046
  if stage_current "$dir/.done" "$TOK_STAMP" $(files_of "$dir"); then
    log "tok: up to date, skipping"; return 0
  fi
  (( DRY_RUN )) || { mkdir -p "$dir"; rm -f "$dir/.done"; }
  for s in "${SPLITS[@]}"; do
    for l in "${LANGS[@]}"; do
      log "tokenising $s.$l ..."
      run "$(q "$PYTHON") $(q "$TOOLS") tokenize --lang $l --input $(q "$OUT/sent/$s.$l") --output $(q "$dir/$s.$l")"
    done
    (( DRY_RUN )) || check_pair tok "$dir" "$s" "$(sent_count "$s")"
  done
  (( DRY_RUN )) || { write_stamp "$dir/.done" "$TOK_STAMP"; log "tok: done ($((SECONDS - t0))s)"; }
}

# ---------------------------------------------------------------------------------------------
# Stage 3: bpe (subword-nmt, joint, learned on the sentence-level train pool)
# ---------------------------------------------------------------------------------------------
stage_bpe() {
  local t0=$SECONDS dir="$OUT/bpe" logf="$OUT/logs/bpe.log" s l learned io=()
  # shellcheck disable=SC2046
  if stage_current "$dir/.done" "$BPE_STAMP" "$dir/codes" $(files_of "$dir"); then
    log "bpe: up to date (bpe_merges=$BPE_MERGES), skipping"; return 0
  fi
  (( DRY_RUN )) || { mkdir -p "$dir" "$OUT/logs"; rm -f "$dir/.done"; : > "$logf"; }
  log "learning joint BPE ($BPE_MERGES merges, min frequency 2) on tok/train.en + tok/train.de ..."
  run_logged "$logf" "$(q "$PYTHON") $(q "$TOOLS") learn-bpe --merges $BPE_MERGES --output $(q "$dir/codes") $(q "$OUT/tok/train.en") $(q "$OUT/tok/train.de")"
  if (( ! DRY_RUN )); then
    learned=$(grep -vc '^#version' "$dir/codes" || true)
    log "learned $learned merge operations -> bpe/codes"
    (( learned > 0 )) || die "bpe: no merge operations learned (training data too small?)"
  fi
  for s in "${SPLITS[@]}"; do for l in "${LANGS[@]}"; do
    io+=("$(q "$OUT/tok/$s.$l")" "$(q "$dir/$s.$l")")
  done; done
  log "applying BPE to {${SPLITS[*]}}.{en,de} ($WORKERS workers) ..."
  run_logged "$logf" "$(q "$PYTHON") $(q "$TOOLS") apply-bpe --codes $(q "$dir/codes") --workers $WORKERS ${io[*]}"
  if (( ! DRY_RUN )); then
    for s in "${SPLITS[@]}"; do check_pair bpe "$dir" "$s" "$(sent_count "$s")"; done
    write_stamp "$dir/.done" "$BPE_STAMP"; log "bpe: done ($((SECONDS - t0))s)"
  fi
}

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
if (( DRY_RUN == 0 )); then
  mkdir -p "$OUT"
  if command -v flock >/dev/null 2>&1; then   # serialize concurrent runs on the same --out
    exec 9> "$OUT/.lock"
    flock -n 9 || { log "waiting for another prepare.sh on $OUT ..."; flock 9; }
  fi
fi

log "out=$OUT data_dir=${DATA_DIR:-none} download=$DOWNLOAD train_dir=${TRAIN_DIR:-none} lengths=\"$LENGTHS\" bpe_merges=$BPE_MERGES workers=$WORKERS"
stage_inputs
make_stamps
stage_sent
stage_tok
stage_bpe
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
