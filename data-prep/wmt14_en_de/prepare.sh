#!/usr/bin/env bash
# Prepare wmt14_en_de for fairseq: run with --help for the options, --dry-run for the URLs, checksums and
# every step.  The corpus (sources, checksums, recipe) is data-prep/wmt14_en_de/corpus.yaml; the pipeline
# (inputs -> raw -> tok -> bpe -> bin, idempotent, atomic) is data-prep/common/mt_prep.py.
CORPUS=wmt14_en_de
# shellcheck source=../common/mt_prepare.sh
source "$(dirname "${BASH_SOURCE[0]}")/../common/mt_prepare.sh"
