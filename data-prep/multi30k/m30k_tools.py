#!/usr/bin/env python3
"""Python helpers for ``data-prep/multi30k/prepare.sh`` (not meant to be run by hand).

Subcommands::

    python m30k_tools.py tokenize --lang {en,de} --input RAW --output TOK
        Moses-tokenise RAW with sacremoses into TOK (written atomically).
        Settings: MosesTokenizer(lang).tokenize(line, escape=False,
        aggressive_dash_splits=False), case kept (no lowercasing, no truecasing),
        no punctuation normalisation.  ``escape=False`` means no XML escaping:
        ``"`` stays ``"`` instead of becoming ``&quot;``.  (The ``sacremoses tokenize
        -x`` CLI flag is *not* used on purpose: with recent click versions it does not
        turn escaping off.)  Lines are split on ``\\n`` only, so the output has
        exactly as many lines as the input.

    python m30k_tools.py learn-bpe --merges N --output CODES TOK [TOK ...]
        Learn N joint BPE merge operations (subword-nmt ``learn_bpe``, default
        min-frequency 2) on the concatenation of the TOK files; write CODES atomically.

    python m30k_tools.py apply-bpe --codes CODES [--workers N] IN OUT [IN OUT ...]
        Apply BPE (subword-nmt ``BPE.process_line``, separator ``@@``) to each IN, writing
        OUT atomically, one output line per input line.  (The ``subword-nmt`` CLI is not
        used: it reads with ``codecs``, whose readline also breaks lines at U+2028, U+0085,
        etc., and its ``apply-bpe`` ignores ``--num-workers``.)

    python m30k_tools.py split-chars IN OUT [IN OUT ...]
        Character-level segmentation (``--char``): every character a symbol, ``@@`` on all
        but a token's last, so ``--remove-bpe`` restores the tokens (text_tools.split_chars).

    python m30k_tools.py count-bin PREFIX [PREFIX ...]
        Print ``PREFIX<TAB>N`` with the number of sentences N of each fairseq
        mmap-binarized dataset ``PREFIX.{bin,idx}``; exit 1 naming the prefix when
        one does not exist.

    python m30k_tools.py versions
        Print the sacremoses and subword-nmt versions (recorded in stage stamps).
"""

import argparse
import os
import sys

# tokenize, learn-bpe, apply-bpe, count-bin and versions are shared with
# long_documents/longdoc_tools.py: data-prep/common/text_tools.py.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
import text_tools  # noqa: E402

SUBCOMMANDS = ["check-parallel", "tokenize", "learn-bpe", "apply-bpe", "split-chars", "count-bin", "versions"]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="cmd", required=True, metavar="{" + ",".join(SUBCOMMANDS) + "}")
    text_tools.add_subcommands(sub, SUBCOMMANDS)
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
