#!/usr/bin/env bash
# Europarl7 document-level En-De (ReLUFormer Table 6): the long-document pipeline (data-prep/long_documents:
# Maruf et al. 2019 Europarl7 dev/test, packing by L BPE tokens, one shared dictionary across L) with the
# same options (`mt-prep long_documents --help`).
exec bash "$(dirname "${BASH_SOURCE[0]}")/../mt-prep" long_documents "$@"
