#!/usr/bin/env bash
# Prepare Multi30k Task 1 English-German for fairseq: `mt-prep multi30k` (mt_pipeline/prep/multi30k.py) on
# data-prep/multi30k/corpus.yaml -- Moses tokenisation without XML escaping (case kept) -> joint BPE
# (--bpe-merges, default 8000) or --char -> fairseq-preprocess --joined-dictionary -> <out>/bin (serves both
# directions).  --help for the options (--raw-dir, --download, --out, --train-lines, --src/--tgt, --dry-run, ...).
exec bash "$(dirname "${BASH_SOURCE[0]}")/../mt-prep" multi30k "$@"
