#!/usr/bin/env bash
# Prepare wmt14_en_de for fairseq: `mt-prep wmt14_en_de` (mt_pipeline/prep) on data-prep/wmt14_en_de/corpus.yaml
# (sources, checksums, recipe); --help for the options, --dry-run for the URLs, checksums and every step.
exec bash "$(dirname "${BASH_SOURCE[0]}")/../mt-prep" wmt14_en_de "$@"
