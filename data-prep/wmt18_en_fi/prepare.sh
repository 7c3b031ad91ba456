#!/usr/bin/env bash
# Prepare wmt18_en_fi for fairseq: `mt-prep wmt18_en_fi` (mt_pipeline/prep) on data-prep/wmt18_en_fi/corpus.yaml
# (sources, checksums, recipe); --help for the options, --dry-run for the URLs, checksums and every step.
exec bash "$(dirname "${BASH_SOURCE[0]}")/../mt-prep" wmt18_en_fi "$@"
