#!/usr/bin/env bash
# Prepare wmt16_ro_en for fairseq: `mt-prep wmt16_ro_en` (mt_pipeline/prep) on data-prep/wmt16_ro_en/corpus.yaml
# (sources, checksums, recipe); --help for the options, --dry-run for the URLs, checksums and every step.
exec bash "$(dirname "${BASH_SOURCE[0]}")/../mt-prep" wmt16_ro_en "$@"
