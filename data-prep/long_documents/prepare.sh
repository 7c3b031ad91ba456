#!/usr/bin/env bash
# Prepare long-document English->German data for fairseq (ReLUFormer §4.3.2 / Appendix B): `mt-prep
# long_documents` (mt_pipeline/prep/longdoc/) on data-prep/long_documents/corpus.yaml -- documents of at most
# L BPE tokens for every L of --lengths, one joint BPE and one dictionary shared by every L.  --help for the
# options (--data-dir, --download, --train-dir, --lengths, --bpe-merges, --dry-run, ...); see README.md here.
exec bash "$(dirname "${BASH_SOURCE[0]}")/../mt-prep" long_documents "$@"
