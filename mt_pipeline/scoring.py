#!/usr/bin/env python3
"""Score translations with sacreBLEU (detokenized) and, optionally, tokenized BLEU.

Usage::

    mt-score --hyp HYP.detok --ref REF.detok \\
        [--tokenized-hyp HYP.tok --tokenized-ref REF.tok [--ribes]] [--json OUT.json] [--meta KEY=VALUE ...]

* ``BLEU``: sacreBLEU corpus BLEU on detokenized text with the default settings
  (``13a`` tokenizer, mixed case, exponential smoothing), computed with the sacrebleu
  Python API.  Printed as ``BLEU = ...`` followed by the sacreBLEU signature.
* ``tok BLEU`` (only with ``--tokenized-hyp/--tokenized-ref``): BLEU on Moses-tokenised
  text with ``tokenize='none'``, i.e. what ``multi-bleu.perl`` reports (mixed case).
  Not comparable across tokenisations; report the sacreBLEU number.
* ``RIBES`` (opt-in, ``--ribes``; needs the tokenized files): Isozaki et al. (2010) RIBES on the same tokens,
  ``NKT * P^alpha * BP^beta`` with alpha = 0.25, beta = 0.10 (the defaults of RIBES 1.02, used
  by WAT for ASPEC En-Ja; the flexible-attention paper reports it there), averaged over
  sentences -- computed with ``nltk.translate.ribes_score.corpus_ribes``.  Opt-in because
  nltk's RIBES is super-linear in sentence length: on long, repetitive hypotheses (document-level
  translation) it can run for many CPU-minutes, and only the En-Ja tables report it.

Each hypothesis file must have exactly as many lines as its reference: a mismatch (e.g.
``fairseq-generate`` silently dropping sentences) is an error (exit status 1), never a
score.  Files are read as UTF-8 and split on ``\\n`` only.

``--json OUT`` writes (atomically) a dict with keys ``bleu``, ``signature``, ``tok_bleu`` and
``tok_ribes`` (``null`` without tokenized files; ``tok_ribes`` also without ``--ribes``), ``n_hyp``, ``n_ref``, ``hyp``, ``ref`` and, for
information, ``bleu_str``, ``tok_signature``, ``tok_hyp``, ``tok_ref``, plus any
``--meta KEY=VALUE`` pairs (strings; e.g. checkpoint, subset, beam -- see scripts/evaluate.sh).

Importable: ``score_files(hyp, ref, tok_hyp=None, tok_ref=None, ribes=False, lowercase=False) -> dict`` (same dict;
raises :class:`LineCountError` on a line-count mismatch).
"""

import argparse
import os
import re
import sys

from .atomic import writable_problem, write_json_atomic

__all__ = ["LineCountError", "TextError", "read_lines", "score_files", "main"]


class LineCountError(ValueError):
    """Hypothesis and reference files have different numbers of lines."""


class TextError(ValueError):
    """A file to score is not UTF-8 text (the message names the file, line and byte)."""


def read_lines(path):
    """Return the lines of ``path`` (UTF-8; gzip-compressed when the name ends in ``.gz``, as the
    committed hypotheses of :mod:`mt_pipeline.evidence`) without their ``\\n``; split on ``\\n`` only.

    Raises:
        TextError: the file is not valid UTF-8 (e.g. a Latin-1 hypothesis); names file:line."""
    if str(path).endswith(".gz"):
        import gzip

        with gzip.open(path, "rb") as f:
            data = f.read()
    else:
        with open(path, "rb") as f:
            data = f.read()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        line = data[:err.start].count(b"\n") + 1
        raise TextError(f"{path}:{line}: not UTF-8 (byte {data[err.start]:#04x} at offset {err.start}; Latin-1 or "
                        "another encoding?): convert it, e.g. iconv -f latin1 -t utf-8") from None
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return lines


def _check_counts(hyp_path, hyp_lines, ref_path, ref_lines):
    if len(hyp_lines) != len(ref_lines):
        raise LineCountError(
            f"line count mismatch: hypothesis {hyp_path} has {len(hyp_lines)} lines but "
            f"reference {ref_path} has {len(ref_lines)} lines (did fairseq-generate drop "
            f"sentences? refusing to score)"
        )
    if not ref_lines:
        raise LineCountError(f"reference {ref_path} is empty")


#: fairseq's scripts/compound_split_bleu.sh: ``perl -ple 's{(\S)-(\S)}{$1 ##AT##-##AT## $2}g'``
_COMPOUND = re.compile(r"(\S)-(\S)")


def compound_split(line: str) -> str:
    """fairseq's ``compound_split_bleu.sh`` rewrite of one tokenized line (WMT14 En-De's usual
    tokenized BLEU, after tensor2tensor): every ``X-Y`` becomes ``X ##AT##-##AT## Y`` -- with
    tokenizer.perl ``-a`` output, ``@-@`` becomes ``@ ##AT##-##AT## @``.  Perl's global
    substitution does not overlap matches; neither does :meth:`re.Pattern.sub`."""
    return _COMPOUND.sub(r"\1 ##AT##-##AT## \2", line)


def score_files(hyp, ref, tok_hyp=None, tok_ref=None, ribes=False, lowercase=False, compound=False):
    """Score ``hyp`` against ``ref`` (file paths) and return a result dict.

    ``compound``: also ``tok_bleu_compound``, the tokenized BLEU of fairseq's
    ``compound_split_bleu.sh`` (:func:`compound_split` on both tokenized files) -- the variant
    many WMT14 En-De numbers use; needs ``tok_hyp``/``tok_ref``.

    ``lowercase``: sacreBLEU's BLEU and chrF compare lowercased text (signature ``case:lc``) --
    for a model trained on lowercased data (IWSLT14 De-En's recipe), whose hypotheses cannot match
    a cased reference's capitals.

    Keys: ``bleu`` (float, sacreBLEU 13a, mixed case unless ``lowercase``), ``bleu_str``, ``signature`` (str),
    ``chrf`` (float, sacreBLEU's chrF on the detokenized text), ``chrf_signature``,
    ``tok_bleu`` (float or None; BLEU with ``tokenize='none'`` on ``tok_hyp``/``tok_ref``),
    ``tok_signature``, ``tok_ribes`` (float in [0, 1], or None unless ``ribes``; RIBES on the
    tokenized files, Isozaki et al. 2010), ``n_hyp``, ``n_ref``, ``hyp``, ``ref``, ``tok_hyp``, ``tok_ref``
    (absolute paths).  Raises :class:`TextError` when a file is not UTF-8 (names file and line),
    :class:`LineCountError` when a hypothesis and its reference
    differ in line count, ``ValueError`` when only one of ``tok_hyp``/``tok_ref`` is given or
    ``ribes`` is asked for without them.
    """
    from sacrebleu.metrics import BLEU, CHRF

    if (tok_hyp is None) != (tok_ref is None):
        raise ValueError("give both tok_hyp and tok_ref (tokenized hypothesis and reference) or neither")
    if ribes and tok_hyp is None:
        raise ValueError("RIBES is computed on tokenized text: give tok_hyp and tok_ref with ribes=True")
    hyp_lines, ref_lines = read_lines(hyp), read_lines(ref)
    _check_counts(hyp, hyp_lines, ref, ref_lines)

    bleu = BLEU(lowercase=lowercase)  # defaults: tokenize='13a', lowercase=False, smooth_method='exp'
    score = bleu.corpus_score(hyp_lines, [ref_lines])
    chrf = CHRF(lowercase=lowercase)  # defaults: character 6-grams, no word n-grams (chrF, not chrF++), beta 2
    chrf_score = chrf.corpus_score(hyp_lines, [ref_lines])
    result = {
        "bleu": score.score,
        "bleu_str": str(score),
        "signature": str(bleu.get_signature()),
        "chrf": chrf_score.score,
        "chrf_signature": str(chrf.get_signature()),
        "tok_bleu": None,
        "tok_signature": None,
        "tok_ribes": None,
        "n_hyp": len(hyp_lines),
        "n_ref": len(ref_lines),
        "hyp": os.path.abspath(hyp),
        "ref": os.path.abspath(ref),
        "tok_hyp": None,
        "tok_ref": None,
    }
    if tok_hyp is not None:
        tok_hyp_lines, tok_ref_lines = read_lines(tok_hyp), read_lines(tok_ref)
        _check_counts(tok_hyp, tok_hyp_lines, tok_ref, tok_ref_lines)
        if len(tok_ref_lines) != len(ref_lines):
            raise LineCountError(
                f"line count mismatch: tokenized reference {tok_ref} has {len(tok_ref_lines)} "
                f"lines but reference {ref} has {len(ref_lines)}"
            )
        # force=True: the input is tokenized on purpose (silences sacrebleu's warning)
        tok_bleu = BLEU(tokenize="none", force=True)
        tok_score = tok_bleu.corpus_score(tok_hyp_lines, [tok_ref_lines])
        if ribes:
            from nltk.translate.ribes_score import corpus_ribes

            result["tok_ribes"] = corpus_ribes([[r.split()] for r in tok_ref_lines],
                                               [h.split() for h in tok_hyp_lines])
        if compound:
            result["tok_bleu_compound"] = tok_bleu.corpus_score(
                [compound_split(h) for h in tok_hyp_lines], [[compound_split(r) for r in tok_ref_lines]]).score
        result.update(
            tok_bleu=tok_score.score,
            tok_signature=str(tok_bleu.get_signature()),
            tok_hyp=os.path.abspath(tok_hyp),
            tok_ref=os.path.abspath(tok_ref),
        )
    return result


def main(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog="Exit status: 0 ok, 1 line-count mismatch or unreadable file, 2 usage error.",
    )
    parser.add_argument("--hyp", required=True, help="detokenized hypotheses, one per line")
    parser.add_argument("--ref", required=True, help="detokenized (raw) reference, one per line")
    parser.add_argument("--tokenized-hyp", help="Moses-tokenised hypotheses (for tokenized BLEU)")
    parser.add_argument("--tokenized-ref", help="Moses-tokenised reference (for tokenized BLEU)")
    parser.add_argument("--ribes", action="store_true",
                        help="also compute RIBES on the tokenized files (slow on long sentences)")
    parser.add_argument("--lowercase", action="store_true",
                        help="sacreBLEU BLEU and chrF on lowercased text (case:lc), for models trained on lowercased data")
    parser.add_argument("--json", metavar="OUT", help="write the scores as JSON to OUT (atomically)")
    parser.add_argument("--meta", action="append", default=[], metavar="KEY=VALUE",
                        help="extra string field for the --json dict (repeatable)")
    args = parser.parse_args(argv)
    meta = {}
    for item in args.meta:
        key, sep, value = item.partition("=")
        if not sep or not key:
            parser.error(f"--meta expects KEY=VALUE (got {item!r})")
        meta[key] = value
    if (args.tokenized_hyp is None) != (args.tokenized_ref is None):
        parser.error("--tokenized-hyp and --tokenized-ref must be given together")
    if args.ribes and args.tokenized_hyp is None:
        parser.error("--ribes needs --tokenized-hyp and --tokenized-ref (RIBES is computed on tokens)")
    for name in ("hyp", "ref", "tokenized_hyp", "tokenized_ref"):
        path = getattr(args, name)
        if path is not None and not os.path.isfile(path):
            print(f"mt-score: error: --{name.replace('_', '-')} {path}: no such file", file=sys.stderr)
            return 1
    if args.json and writable_problem(args.json, is_dir=False):
        print(f"mt-score: error: --json {args.json}: {writable_problem(args.json, is_dir=False)}", file=sys.stderr)
        return 1
    try:
        result = score_files(args.hyp, args.ref, args.tokenized_hyp, args.tokenized_ref, ribes=args.ribes,
                             lowercase=args.lowercase)
    except (LineCountError, TextError) as e:
        print(f"mt-score: error: {e}", file=sys.stderr)
        return 1
    print(result["bleu_str"])
    print(f"signature: {result['signature']}")
    print(f"chrF = {result['chrf']:.2f} ({result['chrf_signature']})")
    if result["tok_bleu"] is not None:
        print(f"tokenized BLEU = {result['tok_bleu']:.2f} ({result['tok_signature']})")
    if result["tok_ribes"] is not None:
        print(f"RIBES = {result['tok_ribes']:.4f} (nltk corpus_ribes, alpha 0.25, beta 0.10, tokenized)")
    if args.json:
        clash = sorted(set(meta) & set(result))
        if clash:
            print(f"mt-score: error: --meta keys {clash} clash with score fields", file=sys.stderr)
            return 2
        write_json_atomic(args.json, {**result, **meta})
    return 0


if __name__ == "__main__":
    sys.exit(main())
