#!/usr/bin/env bash
# Prepare aspec_en_ja for fairseq: `mt-prep aspec_en_ja` (mt_pipeline/prep) on data-prep/aspec_en_ja/corpus.yaml
# (sources, checksums, recipe); --help for the options, --dry-run for the URLs, checksums and every step.
exec bash "$(dirname "${BASH_SOURCE[0]}")/../mt-prep" aspec_en_ja "$@"
