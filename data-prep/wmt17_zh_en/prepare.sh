#!/usr/bin/env bash
# Prepare wmt17_zh_en for fairseq: `mt-prep wmt17_zh_en` (mt_pipeline/prep) on data-prep/wmt17_zh_en/corpus.yaml
# (sources, checksums, recipe); --help for the options, --dry-run for the URLs, checksums and every step.
exec bash "$(dirname "${BASH_SOURCE[0]}")/../mt-prep" wmt17_zh_en "$@"
