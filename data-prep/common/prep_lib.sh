# Shell helpers shared by data-prep/multi30k/prepare.sh and data-prep/long_documents/prepare.sh
# (sourced by them, not run); their Python side is data-prep/common/text_tools.py.
#
# Set before sourcing: LOG_TAG, the prefix of every message ("[LOG_TAG] ...", e.g. multi30k).
# Sourcing sets REPO, the repository root (two levels above this file), and defines functions
# only.  The functions read the calling script's globals when called (each says which): DRY_RUN,
# OUT, PYTHON, TOOLS, SPLITS, LANGS, BPE_MERGES, WORKERS, the stage stamps, the option tables of
# parse_options, and the script's own `usage` and `split_count` functions.

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"

log() { echo "[$LOG_TAG] $*"; }
die() { echo "[$LOG_TAG] ERROR: $*" >&2; exit 1; }
q() { printf '%q' "$1"; }
is_posint() { [[ "$1" =~ ^[0-9]+$ ]] && (( 10#$1 > 0 )); }

# ---------------------------------------------------------------------------------------------
# Arguments
# ---------------------------------------------------------------------------------------------
# parse_options ARG...: read the command line into variables, by the calling script's tables
#   VALUE_OPTS  "--opt=VAR ..."        options taking a value (--opt VALUE or --opt=VALUE): VAR=VALUE
#   FLAG_OPTS   "--opt=VAR=VALUE ..."  options without a value: VAR=VALUE
# plus the options of both scripts: --out (OUT), --bpe-merges (BPE_MERGES), --workers (WORKERS),
# --dry-run (DRY_RUN=1), --no-checksum (CHECKSUM=0).  -h/--help prints `usage` and exits; an
# unknown option dies naming VALID_OPTS.  Then BPE_MERGES and WORKERS must be positive integers.
# `given OPT` tells whether OPT was on the command line.
parse_options() {
  local arg spec hit
  GIVEN=" "
  while (( $# )); do
    arg="$1"
    if [[ "$arg" == --*=* ]]; then       # accept --opt=value as well as --opt value
      set -- "${arg%%=*}" "${arg#*=}" "${@:2}"
      arg="$1"
    fi
    hit=0
    for spec in --out=OUT --bpe-merges=BPE_MERGES --workers=WORKERS $VALUE_OPTS; do
      [[ "$arg" == "${spec%%=*}" ]] || continue
      (( $# >= 2 )) || die "$arg needs a value (see --help)"
      printf -v "${spec#*=}" '%s' "$2"; hit=2; break
    done
    (( hit )) || for spec in --dry-run=DRY_RUN=1 --no-checksum=CHECKSUM=0 $FLAG_OPTS; do
      [[ "$arg" == "${spec%%=*}" ]] || continue
      spec="${spec#*=}"; printf -v "${spec%%=*}" '%s' "${spec#*=}"; hit=1; break
    done
    if (( ! hit )); then
      [[ "$arg" == -h || "$arg" == --help ]] && { usage; exit 0; }
      die "unknown option '$arg'; valid options: $VALID_OPTS"
    fi
    GIVEN+="$arg "
    shift "$hit"
  done
  posint BPE_MERGES --bpe-merges
  posint WORKERS --workers
}
given() { [[ "$GIVEN" == *" $1 "* ]]; }

# posint VAR OPTION: VAR (the value of OPTION) must be a positive integer; normalised to base 10.
posint() {
  local -n var_ref="$1"
  is_posint "$var_ref" || die "$2 must be a positive integer (got '$var_ref')"
  var_ref=$((10#$var_ref))
}

# abs_out: OUT as an absolute path (cd + pwd when it exists) without a trailing slash.
abs_out() {
  if [[ -d "$OUT" ]]; then OUT="$(cd "$OUT" && pwd)"
  elif [[ "$OUT" != /* ]]; then OUT="$PWD/$OUT"; fi
  OUT="${OUT%/}"
}

# find_python: the interpreter providing sacremoses, subword_nmt and fairseq: $PYTHON if set, else
# `python` from PATH (e.g. an activated venv), else the repo's .venv.  Dies when it lacks them
# (under --dry-run: a warning).
have_modules() { "$1" -c 'import importlib.util as u, sys; sys.exit(any(u.find_spec(m) is None for m in ("sacremoses", "subword_nmt", "fairseq", "fairseq_cli")))' 2>/dev/null; }
find_python() {
  if [[ -z "${PYTHON:-}" ]]; then
    if command -v python >/dev/null 2>&1 && have_modules python; then PYTHON=python
    elif [[ -x "$REPO/.venv/bin/python" ]] && have_modules "$REPO/.venv/bin/python"; then PYTHON="$REPO/.venv/bin/python"
    else PYTHON=python; fi
  fi
  if ! have_modules "$PYTHON"; then
    local msg="'$PYTHON' cannot import sacremoses, subword_nmt and fairseq; activate the venv (. .venv/bin/activate) or set PYTHON=/path/to/python"
    if (( DRY_RUN )); then echo "[$LOG_TAG] WARNING: $msg" >&2; else die "$msg"; fi
  fi
}

# ---------------------------------------------------------------------------------------------
# Files, commands, stamps
# ---------------------------------------------------------------------------------------------
# init_tmp DEPTH: TMP = suffix of every temp file/dir of this run; on exit every *.$TMP up to
# DEPTH levels below OUT is removed (not under --dry-run).
init_tmp() {
  TMP="tmp.$$"
  TMP_DEPTH="$1"
  trap cleanup EXIT
}
cleanup() {
  if (( DRY_RUN == 0 )) && [[ -d "$OUT" ]]; then
    find "$OUT" -maxdepth "$TMP_DEPTH" -name "*.$TMP" -exec rm -rf {} + 2>/dev/null || true
  fi
}

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
# COUNT_NOTE (optional) is appended to the "expected N" of the error message.
check_pair() {
  local stage="$1" dir="$2" split="$3" expected="$4" n_en n_de
  n_en=$(count_lines "$dir/$split.en"); n_de=$(count_lines "$dir/$split.de")
  [[ "$n_en" -eq "$n_de" ]] || die "$stage: line counts differ: $dir/$split.en has $n_en lines, $dir/$split.de has $n_de"
  [[ "$n_en" -eq "$expected" ]] || die "$stage: $dir/$split.en and $dir/$split.de have $n_en lines, expected $expected${COUNT_NOTE:-}"
}

files_of() {  # files_of DIR [SPLIT...]: DIR/SPLIT.{LANGS} (default: every split of SPLITS)
  local d="$1" s l; shift
  (( $# )) || set -- "${SPLITS[@]}"
  for s in "$@"; do for l in "${LANGS[@]}"; do echo "$d/$s.$l"; done; done
}

# tool_versions: the sacremoses and subword-nmt versions on one line (for the stamps).
tool_versions() {
  local v
  v="$("$PYTHON" "$TOOLS" versions 2>/dev/null | tr '\n' ' ' || true)"
  echo "${v% }"
}

# ---------------------------------------------------------------------------------------------
# Downloads
# ---------------------------------------------------------------------------------------------
# fetch URL DEST (curl or wget); the messages name the alternative: FETCH_NO_TOOL_MSG (no curl
# nor wget) and FETCH_FAIL_HINT (after "download failed: URL").
fetch() {
  local tool
  if command -v curl >/dev/null 2>&1; then
    tool="curl -fL --retry 3 --connect-timeout 30 -sS -o $(q "$2") $(q "$1")"
  elif command -v wget >/dev/null 2>&1; then
    tool="wget -q --tries=3 -O $(q "$2") $(q "$1")"
  else
    die "$FETCH_NO_TOOL_MSG"
  fi
  run "$tool" || { rm -f "$2"; die "download failed: $1 ($FETCH_FAIL_HINT)"; }
}

# download_checked DIR REL SHA CHECK: DIR/REL from UPSTREAM_BASE/REL unless DIR/REL already has
# sha256 SHA; with CHECK=1 a download with another sha256 aborts.  Logged as download/REL.
download_checked() {
  local dir="$1" rel="$2" sha="$3" check="$4" path="$1/$2" actual
  if [[ -f "$path" ]] && [[ "$(sha256_file "$path")" == "$sha" ]]; then
    log "have download/$rel (sha256 ok)"; return 0
  fi
  log "downloading $rel ..."
  (( DRY_RUN )) || mkdir -p "$(dirname "$path")"
  fetch "$UPSTREAM_BASE/$rel" "$path.$TMP"
  (( DRY_RUN )) && return 0
  actual="$(sha256_file "$path.$TMP")"
  if (( check )) && [[ "$actual" != "$sha" ]]; then
    rm -f "$path.$TMP"
    die "sha256 mismatch for downloaded $rel: expected $sha, got $actual (URL $UPSTREAM_BASE/$rel)"
  fi
  mv -f "$path.$TMP" "$path"
}

# ---------------------------------------------------------------------------------------------
# Shared stages (sentence level): tok and bpe
# ---------------------------------------------------------------------------------------------
# stage_tok IN: Moses-tokenise OUT/IN/SPLIT.LANG -> OUT/tok/ ($TOOLS tokenize); stamp TOK_STAMP;
# every split must keep `split_count SPLIT` lines.
stage_tok() {
  local t0=$SECONDS in="$OUT/$1" dir="$OUT/tok" s l
  # shellcheck disable=SC2046
  if stage_current "$dir/.done" "$TOK_STAMP" $(files_of "$dir"); then
    log "tok: up to date, skipping"; return 0
  fi
  (( DRY_RUN )) || { mkdir -p "$dir"; rm -f "$dir/.done"; }
  for s in "${SPLITS[@]}"; do
    for l in "${LANGS[@]}"; do
      log "tokenising $s.$l ..."
      run "$(q "$PYTHON") $(q "$TOOLS") tokenize --lang $l --input $(q "$in/$s.$l") --output $(q "$dir/$s.$l")"
    done
    (( DRY_RUN )) || check_pair tok "$dir" "$s" "$(split_count "$s")"
  done
  (( DRY_RUN )) || { write_stamp "$dir/.done" "$TOK_STAMP"; log "tok: done ($((SECONDS - t0))s)"; }
}

# stage_bpe DESC: joint BPE (BPE_MERGES merges, described as DESC in the log) learned on
# OUT/tok/train.{en,de} -> OUT/bpe/codes, applied to every split with WORKERS workers
# -> OUT/bpe/ ($TOOLS learn-bpe / apply-bpe; log OUT/logs/bpe.log); stamp BPE_STAMP.
stage_bpe() {
  local t0=$SECONDS dir="$OUT/bpe" logf="$OUT/logs/bpe.log" s l learned io=()
  # shellcheck disable=SC2046
  if stage_current "$dir/.done" "$BPE_STAMP" "$dir/codes" $(files_of "$dir"); then
    log "bpe: up to date (bpe_merges=$BPE_MERGES), skipping"; return 0
  fi
  (( DRY_RUN )) || { mkdir -p "$dir" "$OUT/logs"; rm -f "$dir/.done"; : > "$logf"; }
  log "learning joint BPE ($1) on tok/train.en + tok/train.de ..."
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
    for s in "${SPLITS[@]}"; do check_pair bpe "$dir" "$s" "$(split_count "$s")"; done
    write_stamp "$dir/.done" "$BPE_STAMP"; log "bpe: done ($((SECONDS - t0))s)"
  fi
}

# ---------------------------------------------------------------------------------------------
# Locking
# ---------------------------------------------------------------------------------------------
# lock_out: create OUT and serialize concurrent runs on it (flock on OUT/.lock, fd 9); not
# under --dry-run.
lock_out() {
  (( DRY_RUN == 0 )) || return 0
  mkdir -p "$OUT"
  if command -v flock >/dev/null 2>&1; then
    exec 9> "$OUT/.lock"
    flock -n 9 || { log "waiting for another prepare.sh on $OUT ..."; flock 9; }
  fi
}
