#!/usr/bin/env bash
# Prepare aspec_en_ja for fairseq: run with --help for the options, --dry-run for the URLs, checksums and
# every step.  The corpus (sources, checksums, recipe) is data-prep/aspec_en_ja/corpus.yaml; the pipeline
# (inputs -> raw -> tok -> bpe -> bin, idempotent, atomic) is data-prep/common/mt_prep.py.
CORPUS=aspec_en_ja
# shellcheck source=../common/mt_prepare.sh
source "$(dirname "${BASH_SOURCE[0]}")/../common/mt_prepare.sh"
