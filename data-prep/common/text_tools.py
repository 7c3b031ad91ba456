"""Text steps shared by the data-prep tool scripts (``multi30k/m30k_tools.py`` and
``long_documents/longdoc_tools.py``); not a command of its own.

A tool script adds this directory to ``sys.path`` (from its own location), imports this
module and registers the subcommands it offers with :func:`add_subcommands`::

    tokenize --lang {en,de} --input RAW --output TOK
        sacremoses python API: MosesTokenizer(lang).tokenize(line, escape=False,
        aggressive_dash_splits=False, return_str=True); no XML escaping, case kept, no
        punctuation normalisation.  One output line per input line (written atomically).
    learn-bpe --merges N --output CODES TOK [TOK ...]
        subword-nmt ``learn_bpe`` (min-frequency 2) on the concatenation of the TOK files;
        CODES written atomically.
    apply-bpe --codes CODES [--workers N] IN OUT [IN OUT ...]
        subword-nmt ``BPE.process_line`` (separator ``@@``), in chunks of 2000 lines (over a
        pool of N worker processes when N > 1); one output line per input line, OUT written
        atomically.
    count-bin PREFIX [PREFIX ...]
        ``PREFIX<TAB>N`` per fairseq mmap dataset ``PREFIX.{bin,idx}`` (N = #sequences);
        exit status 1, naming the prefix on stderr, when one does not exist.
    versions
        the sacremoses and subword-nmt versions (recorded in the stage stamps).
    split-chars IN OUT [IN OUT ...]
        character-level segmentation of tokenised text (:func:`split_chars`): every character
        of a token is a symbol, all but a token's last one carry BPE's continuation marker
        ``@@``, so word boundaries stay marked and ``--remove-bpe`` restores the tokens.  One
        output line per input line (written atomically).
    check-parallel [--max-words N] FILE [FILE ...]
        validate raw parallel text before anything is derived from it: every FILE exists, is
        UTF-8, has no empty (whitespace-only) line and no line over N words (default 250), and
        all FILEs have the same number of lines.  Writes nothing; exit status 1 with one
        message per problem naming the file and the 1-based line.

Files are read with :func:`read_lines` (split on ``\\n`` only: ``codecs``-style readers also
break lines at U+2028, U+0085, ..., which would shift every later sentence pair) and written
with :func:`write_lines_atomic` (:mod:`mt_pipeline.atomic`: temp file + ``os.replace``).
"""

import gzip
import os
import sys

from mt_pipeline.atomic import write_lines_atomic  # noqa: E402,F401  (used here and by the tool scripts)

APPLY_BPE_CHUNK = 2000  # lines per task of the apply-bpe worker pool


def read_lines(path):
    """Lines of ``path`` split on ``\\n`` only, without the newline."""
    with open(path, encoding="utf-8", newline="\n") as f:
        return [line[:-1] if line.endswith("\n") else line for line in f]


def cmd_tokenize(args):
    from sacremoses import MosesTokenizer

    tok = MosesTokenizer(lang=args.lang)
    out = [
        tok.tokenize(line, escape=False, aggressive_dash_splits=False, return_str=True)
        for line in read_lines(args.input)
    ]
    # The tokenizer collapses whitespace, so no stray "\r" or "\n" can survive;
    # assert it anyway: a line break inside a line would shift every later pair.
    for i, line in enumerate(out):
        if "\n" in line or "\r" in line:
            sys.exit(f"tokenize: line {i + 1} of {args.input} contains a line break after tokenisation")
    write_lines_atomic(args.output, out)
    return 0


def cmd_learn_bpe(args):
    import io

    from subword_nmt.learn_bpe import learn_bpe

    lines = []
    for path in args.inputs:
        lines.extend(line + "\n" for line in read_lines(path))
    codes = io.StringIO()
    learn_bpe(lines, codes, args.merges, min_frequency=2)
    write_lines_atomic(args.output, codes.getvalue().splitlines())
    return 0


_BPE = None  # the BPE object of this process (set by _init_bpe, in the workers too)


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
    chunk = APPLY_BPE_CHUNK
    pool = None
    if args.workers > 1:
        import multiprocessing

        pool = multiprocessing.Pool(args.workers, initializer=_init_bpe, initargs=(args.codes,))
    else:
        _init_bpe(args.codes)
    try:
        for src, dst in pairs:
            lines = read_lines(src)
            chunks = [lines[i:i + chunk] for i in range(0, len(lines), chunk)]
            parts = pool.map(_apply_chunk, chunks) if pool is not None else [_apply_chunk(c) for c in chunks]
            out = [line for part in parts for line in part]
            if len(out) != len(lines) or any("\n" in line for line in out):
                sys.exit(f"apply-bpe: line count changed for {src}")
            write_lines_atomic(dst, out)
    finally:
        if pool is not None:
            pool.close()
            pool.join()
    return 0


CHAR_SEPARATOR = "@@"  # BPE's continuation marker, so fairseq's --remove-bpe undoes the split


def split_chars(line):
    """Character-level segmentation of one tokenised line: ``"a man ."`` ->
    ``"a m@@ a@@ n ."``.  Every character of a token is one symbol; every symbol but a token's
    last carries :data:`CHAR_SEPARATOR` (the word-boundary marking of BPE with zero merges), so
    ``--remove-bpe`` (``"@@ "`` removed) gives the tokenised line back.

    Raises:
        ValueError: a token already contains ``@@`` (the split could not be undone).
    """
    out = []
    for tok in line.split():
        if CHAR_SEPARATOR in tok:
            raise ValueError(f"token {tok!r} contains the separator {CHAR_SEPARATOR!r}")
        out.extend(c + CHAR_SEPARATOR for c in tok[:-1])
        out.append(tok[-1])
    return " ".join(out)


def cmd_split_chars(args):
    if len(args.files) % 2:
        sys.exit("split-chars: expected pairs of IN OUT files")
    for src, dst in zip(args.files[0::2], args.files[1::2]):
        lines = read_lines(src)
        try:
            out = [split_chars(line) for line in lines]
        except ValueError as e:
            sys.exit(f"split-chars: {src}: {e}")
        write_lines_atomic(dst, out)
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


MAX_WORDS = 250  # default of check-parallel --max-words (Multi30k's longest line has 41)


def check_parallel(paths, max_words=MAX_WORDS):
    """Problems of a set of line-aligned raw text files (one per language), as messages.

    Args:
        paths: the files (e.g. ``train.en``, ``train.de``), read as bytes and decoded per line;
            a path ending in ``.gz`` is decompressed (line numbers are those of its content).
        max_words: longest allowed line, in whitespace-separated words.

    Returns:
        A list of strings, each naming the file and the 1-based line (empty: all good).
        Checks: the file exists; strict UTF-8 (the byte offset of the bad sequence is given);
        no empty/whitespace-only line (it would give an empty sentence, which fairseq drops or
        pairs with the wrong neighbour); no line over ``max_words`` words; equal line counts.
    """
    problems, counts = [], {}
    for path in paths:
        if not os.path.isfile(path):
            problems.append(f"{path}: missing file")
            continue
        n = 0
        with (gzip.open if path.endswith(".gz") else open)(path, "rb") as f:  # .gz: decompressed lines
            for n, raw in enumerate(f, 1):
                body = raw[:-1] if raw.endswith(b"\n") else raw
                try:
                    line = body.decode("utf-8")
                except UnicodeDecodeError as err:
                    problems.append(f"{path}:{n}: invalid UTF-8 at byte {err.start} of the line "
                                    f"({body[max(0, err.start - 10):err.start + 4]!r})")
                    continue
                words = len(line.split())
                if words == 0:
                    problems.append(f"{path}:{n}: empty line")
                elif words > max_words:
                    problems.append(f"{path}:{n}: {words} words, more than --max-words {max_words}")
        counts[path] = n
    if len(set(counts.values())) > 1:
        first = min(counts.values())
        problems.append("line counts differ: " + ", ".join(f"{p} has {c}" for p, c in counts.items())
                        + f" (pairs are misaligned from line {first + 1})")
    return problems


def cmd_check_parallel(args):
    problems = check_parallel(args.files, args.max_words)
    for msg in problems[:20]:
        print(f"check-parallel: {msg}", file=sys.stderr)
    if len(problems) > 20:
        print(f"check-parallel: ... and {len(problems) - 20} more problems", file=sys.stderr)
    return 1 if problems else 0


def cmd_versions(args):
    from importlib.metadata import PackageNotFoundError, version

    for dist in ("sacremoses", "subword-nmt"):
        try:
            print(f"{dist}={version(dist)}")
        except PackageNotFoundError:
            print(f"{dist}=unknown")
    return 0


def _add_tokenize(sub):
    p = sub.add_parser("tokenize", help="Moses-tokenise a file (no XML escaping, case kept)")
    p.add_argument("--lang", required=True, choices=["en", "de"])
    p.add_argument("--input", required=True)
    p.add_argument("--output", required=True)
    p.set_defaults(func=cmd_tokenize)


def _add_learn_bpe(sub):
    p = sub.add_parser("learn-bpe", help="learn joint BPE codes")
    p.add_argument("--merges", type=int, required=True)
    p.add_argument("--output", required=True)
    p.add_argument("inputs", nargs="+", metavar="TOK")
    p.set_defaults(func=cmd_learn_bpe)


def _add_apply_bpe(sub):
    p = sub.add_parser("apply-bpe", help="apply BPE codes to files")
    p.add_argument("--codes", required=True)
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("files", nargs="+", metavar="IN OUT")
    p.set_defaults(func=cmd_apply_bpe)


def _add_split_chars(sub):
    p = sub.add_parser("split-chars", help="character-level segmentation (word ends marked as BPE does)")
    p.add_argument("files", nargs="+", metavar="IN OUT")
    p.set_defaults(func=cmd_split_chars)


def _add_count_bin(sub):
    p = sub.add_parser("count-bin", help="count sentences of fairseq mmap datasets")
    p.add_argument("prefixes", nargs="+", metavar="PREFIX")
    p.set_defaults(func=cmd_count_bin)


def _add_versions(sub):
    p = sub.add_parser("versions", help="print tool versions")
    p.set_defaults(func=cmd_versions)


def _add_check_parallel(sub):
    p = sub.add_parser("check-parallel", help="validate raw parallel text (writes nothing)")
    p.add_argument("--max-words", type=int, default=MAX_WORDS)
    p.add_argument("files", nargs="+", metavar="FILE")
    p.set_defaults(func=cmd_check_parallel)


SUBCOMMANDS = {"check-parallel": _add_check_parallel, "tokenize": _add_tokenize, "learn-bpe": _add_learn_bpe, "apply-bpe": _add_apply_bpe,
               "split-chars": _add_split_chars, "count-bin": _add_count_bin, "versions": _add_versions}


def add_subcommands(sub, names):
    """Register the shared subcommands ``names`` (keys of SUBCOMMANDS), in that order, on the
    ``argparse`` subparsers object ``sub``; each sets ``func`` to its ``cmd_*`` function."""
    for name in names:
        SUBCOMMANDS[name](sub)

