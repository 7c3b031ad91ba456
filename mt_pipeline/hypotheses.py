#!/usr/bin/env python3
"""Extract hypotheses from fairseq-generate output, in corpus order, and detokenize them.

Usage::

    fairseq-generate ... --remove-bpe | python scripts/extract_hypotheses.py \\
        --expected N --lang de --tok-out HYP.tok --detok-out HYP.detok [--unescape]
    python scripts/extract_hypotheses.py GENERATE_LOG --expected N --lang de \\
        --tok-out HYP.tok --detok-out HYP.detok [--detruecase [--truecased-out HYP.tc]]

Reads the ``H-<id>\\t<score>\\t<text>`` lines (other lines are ignored), sorts them by
sentence id and checks that the ids are exactly ``0 .. N-1`` for ``N = --expected`` (the
reference's line count): a missing, duplicated (``--nbest`` > 1) or out-of-range id is an
error (exit status 1) -- fairseq-generate has been seen to drop sentences silently.

Writes (each atomically: temp file in the same directory, then rename):

* ``--tok-out``: the hypotheses as generated, i.e. Moses-tokenised with BPE removed
  (run fairseq-generate with ``--remove-bpe``; hypotheses still holding ``@@`` markers are
  an error unless ``--remove-bpe`` is passed here, which removes them);
* ``--detok-out``: the same, detokenized with sacremoses ``MosesDetokenizer(--lang)``, for
  sacreBLEU against the raw reference.  XML entities (``&quot; &apos; &amp; &lt; &gt; &#124;
  &#91; &#93;``) are unescaped only with ``--unescape``: the data were tokenised with
  tokenizer.perl's escaping (the data-prep recipes with ``escape: true``: WMT, IWSLT14, ASPEC;
  :func:`mt_pipeline.evaluate.tokenized_with_escaping` reads it from the prep's ``tok/.done``).
  Without it the text is kept as generated: Multi30k and the long-document sets are tokenised
  without escaping, and a pretokenized corpus (IWSLT15 En-Vi, Stanford) keeps its entities in
  the reference too.

With ``--detruecase`` (a model trained on truecased text: data-prep's ``truecase`` recipes, e.g.
E-ATT's, where scripts/evaluate.sh finds ``<prep>/tc/truecase-model.TGT``), the hypotheses as
generated (truecased; written to ``--truecased-out`` when given) are detruecased first with
sacremoses ``MosesDetruecaser`` (Moses detruecase.perl: the first letter of every sentence-initial
word upper-cased) -- so ``--tok-out`` and ``--detok-out`` are in the references' original case.
"""

import argparse
import io
import os
import re
import sys

from .atomic import write_lines_atomic

__all__ = ["ExtractError", "parse_hypotheses", "detokenize", "detruecase", "main"]

_H_LINE = re.compile(r"^H-(\d+)\t([^\t]*)(?:\t(.*))?$")
_BPE_MARK = re.compile(r"(@@ )|(@@ ?$)")


class ExtractError(ValueError):
    """The generate output does not hold exactly one hypothesis per expected sentence id."""


def _ranges(ids):
    """Compact '0-4, 7, 9-10' rendering of sorted ints (at most 10 ranges)."""
    out, start, prev = [], None, None
    for i in ids:
        if start is None:
            start = prev = i
        elif i == prev + 1:
            prev = i
        else:
            out.append(f"{start}-{prev}" if prev > start else str(start))
            start = prev = i
    if start is not None:
        out.append(f"{start}-{prev}" if prev > start else str(start))
    return ", ".join(out[:10]) + (f", ... ({len(out) - 10} more ranges)" if len(out) > 10 else "")


def parse_hypotheses(lines, expected):
    """Return the hypothesis texts ordered by id from fairseq-generate output ``lines``.

    Raises :class:`ExtractError` unless the ids are exactly ``0 .. expected-1``, each once.
    """
    hyps = {}
    counts = {}
    for lineno, line in enumerate(lines, 1):
        if not line.startswith("H-"):
            continue
        line = line.rstrip("\n").rstrip("\r")
        m = _H_LINE.match(line)
        if m is None:
            raise ExtractError(f"line {lineno}: malformed hypothesis line (expected 'H-<id>\\t<score>\\t<text>'): {line[:80]!r}")
        sid = int(m.group(1))
        counts[sid] = counts.get(sid, 0) + 1
        hyps.setdefault(sid, m.group(3) or "")
    problems = []
    dups = sorted(i for i, c in counts.items() if c > 1)
    if dups:
        problems.append(f"{len(dups)} ids occur more than once ({_ranges(dups)}); run fairseq-generate with --nbest 1")
    extra = sorted(i for i in hyps if i >= expected)
    if extra:
        problems.append(f"{len(extra)} ids are >= --expected {expected} ({_ranges(extra)}); wrong --expected or --gen-subset?")
    missing = sorted(set(range(expected)) - set(hyps))
    if missing:
        problems.append(f"{len(missing)} of {expected} ids are missing ({_ranges(missing)}); fairseq-generate dropped sentences (too long for --max-len-a/b or --max-positions?)")
    if problems:
        raise ExtractError(f"found {len(hyps)} hypotheses, expected ids 0..{expected - 1}: " + "; ".join(problems))
    return [hyps[i] for i in range(expected)]


def detokenize(texts, lang, unescape=False):
    """Detokenize Moses-tokenised ``texts`` with sacremoses ``MosesDetokenizer(lang)``;
    ``unescape``: also turn tokenizer.perl's XML entities back into characters (detokenizer.perl's
    default; needed when the data were tokenised with escaping, else sacreBLEU compares
    ``&quot;`` with ``"``)."""
    from sacremoses import MosesDetokenizer

    detok = MosesDetokenizer(lang=lang)
    return [detok.detokenize(t.split(), return_str=True, unescape=unescape) for t in texts]


def detruecase(texts):
    """Detruecase tokenized ``texts`` with sacremoses ``MosesDetruecaser`` (detruecase.perl: the
    first letter of the first word of every sentence -- the line start and after ``. : ? !``,
    skipping opening quotes/brackets -- upper-cased; nothing else changes)."""
    from sacremoses import MosesDetruecaser

    dt = MosesDetruecaser()
    return [dt.detruecase(t, return_str=True) for t in texts]


def _write_atomic(path, lines):
    write_lines_atomic(path, lines)


def main(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog="Exit status: 0 ok, 1 wrong/missing/duplicated hypothesis ids or BPE left, 2 usage error.",
    )
    parser.add_argument("input", nargs="?", default="-", help="fairseq-generate output file (default: stdin)")
    parser.add_argument("--expected", type=int, required=True, metavar="N",
                        help="number of sentences in the subset (ids must be exactly 0..N-1)")
    parser.add_argument("--lang", required=True, help="target language code for the Moses detokenizer (e.g. en, de)")
    parser.add_argument("--tok-out", required=True, help="output: tokenized hypotheses (BPE removed)")
    parser.add_argument("--detok-out", required=True, help="output: detokenized hypotheses")
    parser.add_argument("--detruecase", action="store_true",
                        help="the model was trained on truecased text: detruecase (Moses) before --tok-out/--detok-out")
    parser.add_argument("--truecased-out", help="output (with --detruecase): the hypotheses as generated (truecased)")
    parser.add_argument("--unescape", action="store_true",
                        help="the data were tokenised with XML escaping (tokenizer.perl's default; data-prep recipes "
                             "with escape: true): unescape &quot; &apos; &amp; ... when detokenizing")
    parser.add_argument("--remove-bpe", action="store_true",
                        help="remove '@@ ' BPE markers here (when fairseq-generate ran without --remove-bpe)")
    args = parser.parse_args(argv)
    if args.expected <= 0:
        parser.error(f"--expected must be a positive integer (got {args.expected})")
    if not re.fullmatch(r"[a-z]{2,3}", args.lang):
        parser.error(f"--lang must be a language code such as en or de (got {args.lang!r})")
    if args.truecased_out and not args.detruecase:
        parser.error("--truecased-out needs --detruecase")

    if args.input == "-":
        stream = io.TextIOWrapper(sys.stdin.buffer, encoding="utf-8", newline="\n")
        name = "<stdin>"
    else:
        if not os.path.isfile(args.input):
            print(f"extract_hypotheses.py: error: {args.input}: no such file", file=sys.stderr)
            return 1
        stream = open(args.input, encoding="utf-8", newline="\n")
        name = args.input
    try:
        with stream:
            hyps = parse_hypotheses(stream, args.expected)
    except ExtractError as e:
        print(f"extract_hypotheses.py: error: {name}: {e}", file=sys.stderr)
        return 1

    if args.remove_bpe:
        hyps = [_BPE_MARK.sub("", h) for h in hyps]
    else:
        with_bpe = sum(1 for h in hyps if _BPE_MARK.search(h))
        if with_bpe:
            print(f"extract_hypotheses.py: error: {name}: {with_bpe} hypotheses still contain BPE markers '@@'; "
                  f"run fairseq-generate with --remove-bpe, or pass --remove-bpe here", file=sys.stderr)
            return 1
    if args.detruecase:
        if args.truecased_out:
            _write_atomic(args.truecased_out, hyps)
        hyps = detruecase(hyps)
    detok = detokenize(hyps, args.lang, unescape=args.unescape)
    _write_atomic(args.tok_out, hyps)
    _write_atomic(args.detok_out, detok)
    print(f"extract_hypotheses.py: {len(hyps)} hypotheses -> {args.tok_out} (tokenized"
          + (", detruecased" if args.detruecase else "") + f"), {args.detok_out} (detokenized"
          + (", unescaped" if args.unescape else "") + ")", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
