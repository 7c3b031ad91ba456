# Shell entry point shared by the sentence-level corpora (sourced by data-prep/<corpus>/prepare.sh
# after it sets CORPUS): finds the Python interpreter (prep_lib.sh's find_python: $PYTHON, else
# `python` on PATH, else <repo>/.venv/bin/python, each needing sacremoses, subword_nmt, fairseq)
# and runs data-prep/common/mt_prep.py on data-prep/$CORPUS/corpus.yaml with the script's options.
set -euo pipefail
LOG_TAG="$CORPUS"
# shellcheck source=prep_lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/prep_lib.sh"   # sets REPO
DRY_RUN=0
for arg in "$@"; do [[ "$arg" == --dry-run ]] && DRY_RUN=1; done
find_python
exec "$PYTHON" "$REPO/data-prep/common/mt_prep.py" --corpus "$CORPUS" "$@"
