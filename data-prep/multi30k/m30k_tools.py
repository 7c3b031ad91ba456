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
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts"))
from atomic import write_lines_atomic  # noqa: E402


def _atomic_write_lines(path, lines):
    write_lines_atomic(path, lines)


def cmd_tokenize(args):
    from sacremoses import MosesTokenizer

    tok = MosesTokenizer(lang=args.lang)
    raw = _read_lines(args.input)
    out = [
        tok.tokenize(line, escape=False, aggressive_dash_splits=False, return_str=True)
        for line in raw
    ]
    # The tokenizer collapses whitespace, so no stray "\r" or "\n" can survive;
    # assert it anyway: a line break inside a line would shift every later pair.
    for i, line in enumerate(out):
        if "\n" in line or "\r" in line:
            sys.exit(f"tokenize: line {i + 1} of {args.input} contains a line break after tokenisation")
    _atomic_write_lines(args.output, out)
    return 0


def _read_lines(path):
    """Lines of ``path`` split on ``\\n`` only, without the newline."""
    with open(path, encoding="utf-8", newline="\n") as f:
        return [line[:-1] if line.endswith("\n") else line for line in f]


def cmd_learn_bpe(args):
    import io

    from subword_nmt.learn_bpe import learn_bpe

    lines = []
    for path in args.inputs:
        lines.extend(line + "\n" for line in _read_lines(path))
    codes = io.StringIO()
    learn_bpe(lines, codes, args.merges)
    _atomic_write_lines(args.output, codes.getvalue().splitlines())
    return 0


_BPE = None


def _init_bpe(codes_path):
    global _BPE
    from subword_nmt.apply_bpe import BPE

    with open(codes_path, encoding="utf-8") as f:
        _BPE = BPE(f)


def _apply_chunk(lines):
    return [_BPE.process_line(line) for line in lines]


def cmd_apply_bpe(args):
    if len(args.files) % 2:
        sys.exit("apply-bpe: expected pairs of IN OUT files")
    pairs = list(zip(args.files[0::2], args.files[1::2]))
    chunk = 2000
    if args.workers > 1:
        import multiprocessing

        pool = multiprocessing.Pool(args.workers, initializer=_init_bpe, initargs=(args.codes,))
    else:
        pool = None
        _init_bpe(args.codes)
    try:
        for src, dst in pairs:
            lines = _read_lines(src)
            chunks = [lines[i:i + chunk] for i in range(0, len(lines), chunk)]
            if pool is not None:
                parts = pool.map(_apply_chunk, chunks)
            else:
                parts = [_apply_chunk(c) for c in chunks]
            out = [line for part in parts for line in part]
            if len(out) != len(lines) or any("\n" in line for line in out):
                sys.exit(f"apply-bpe: line count changed for {src}")
            _atomic_write_lines(dst, out)
    finally:
        if pool is not None:
            pool.close()
            pool.join()
    return 0


def cmd_count_bin(args):
    from fairseq.data import indexed_dataset

    status = 0
    for prefix in args.prefixes:
        if not indexed_dataset.MMapIndexedDataset.exists(prefix):
            print(f"count-bin: no mmap dataset {prefix}.bin/.idx", file=sys.stderr)
            status = 1
            continue
        print(f"{prefix}\t{len(indexed_dataset.MMapIndexedDataset(prefix))}")
    return status


def cmd_versions(args):
    from importlib.metadata import PackageNotFoundError, version

    for dist in ("sacremoses", "subword-nmt"):
        try:
            print(f"{dist}={version(dist)}")
        except PackageNotFoundError:
            print(f"{dist}=unknown")
    return 0


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="cmd", required=True, metavar="{tokenize,learn-bpe,apply-bpe,count-bin,versions}")
    p = sub.add_parser("tokenize", help="Moses-tokenise a file (no XML escaping, case kept)")
    p.add_argument("--lang", required=True, choices=["en", "de"])
    p.add_argument("--input", required=True)
    p.add_argument("--output", required=True)
    p.set_defaults(func=cmd_tokenize)
    p = sub.add_parser("learn-bpe", help="learn joint BPE codes")
    p.add_argument("--merges", type=int, required=True)
    p.add_argument("--output", required=True)
    p.add_argument("inputs", nargs="+", metavar="TOK")
    p.set_defaults(func=cmd_learn_bpe)
    p = sub.add_parser("apply-bpe", help="apply BPE codes to files")
    p.add_argument("--codes", required=True)
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("files", nargs="+", metavar="IN OUT")
    p.set_defaults(func=cmd_apply_bpe)
    p = sub.add_parser("count-bin", help="count sentences of fairseq mmap datasets")
    p.add_argument("prefixes", nargs="+", metavar="PREFIX")
    p.set_defaults(func=cmd_count_bin)
    p = sub.add_parser("versions", help="print tool versions")
    p.set_defaults(func=cmd_versions)
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
