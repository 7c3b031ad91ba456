#!/usr/bin/env bash
# Prepare wmt14_en_fr for fairseq: `mt-prep wmt14_en_fr` (mt_pipeline/prep) on data-prep/wmt14_en_fr/corpus.yaml
# (sources, checksums, recipe); --help for the options, --dry-run for the URLs, checksums and every step.
exec bash "$(dirname "${BASH_SOURCE[0]}")/../mt-prep" wmt14_en_fr "$@"
