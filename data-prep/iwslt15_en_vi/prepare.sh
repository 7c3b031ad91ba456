#!/usr/bin/env bash
# Prepare iwslt15_en_vi for fairseq: `mt-prep iwslt15_en_vi` (mt_pipeline/prep) on data-prep/iwslt15_en_vi/corpus.yaml
# (sources, checksums, recipe); --help for the options, --dry-run for the URLs, checksums and every step.
exec bash "$(dirname "${BASH_SOURCE[0]}")/../mt-prep" iwslt15_en_vi "$@"
