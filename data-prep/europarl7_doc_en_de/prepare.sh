#!/usr/bin/env bash
# Europarl7 document-level En-De (ReLUFormer Table 6): the document-level pipeline lives in
# data-prep/long_documents (Maruf et al. 2019 Europarl7 dev/test, packing by L BPE tokens, one shared
# dictionary across L); this entry point runs it with the same options (see --help there).
exec bash "$(dirname "${BASH_SOURCE[0]}")/../long_documents/prepare.sh" "$@"
