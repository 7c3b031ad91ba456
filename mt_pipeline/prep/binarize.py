"""Stage bin: ``fairseq-preprocess`` (fairseq_cli.preprocess) into a fresh directory, checked.

A bin directory is built whole in a temporary directory and swapped in by the stage runner, so a
failed or killed binarization never leaves a half-written ``bin/``.  After fairseq-preprocess:
a joined dictionary must be the same file for both languages, and every dataset
``SPLIT.SRC-TGT.LANG.{bin,idx}`` must hold as many sentences as its text file has lines.
"""

import contextlib
import filecmp
import io
import os
import shlex
import sys

from mt_pipeline.prep.bpe import truncate


def preprocess_cmd(src, tgt, destdir, workers, trainpref=None, validpref=None, testprefs=(), joined=False,
                   srcdict=None, tgtdict=None, dict_only=False, nwords=None):
    """The ``python -m fairseq_cli.preprocess`` command (list of words) for these options;
    ``nwords``: ``(source, target)`` dictionary sizes (``--nwordssrc`` / ``--nwordstgt``; a joined
    dictionary takes the source size) or None (every symbol kept)."""
    cmd = [sys.executable, "-m", "fairseq_cli.preprocess", "--source-lang", src, "--target-lang", tgt]
    if joined:
        cmd.append("--joined-dictionary")
    if nwords:
        cmd += ["--nwordssrc", str(nwords[0]), "--nwordstgt", str(nwords[1])]
    if dict_only:
        cmd.append("--dict-only")
    if srcdict:
        cmd += ["--srcdict", srcdict, "--tgtdict", tgtdict]
    if trainpref:
        cmd += ["--trainpref", trainpref]
    if validpref:
        cmd += ["--validpref", validpref]
    if testprefs:
        cmd += ["--testpref", ",".join(testprefs)]
    return cmd + ["--destdir", destdir, "--workers", str(workers)]


def quoted(cmd):
    """``cmd`` (list of words) as one shell-quoted line."""
    return " ".join(shlex.quote(c) for c in cmd)


def run_preprocess(run, cmd, logf):
    """Announce and run the fairseq-preprocess ``cmd`` (output in ``logf``, truncated first)."""
    run.step("binarize: " + quoted(cmd))
    if run.dry:
        return
    truncate(logf)
    run.run_logged(logf, cmd)


def count_sentences(prefix):
    """Number of sentences of the fairseq mmap dataset ``PREFIX.{bin,idx}`` (None: no such dataset)."""
    with contextlib.redirect_stderr(io.StringIO()):  # fairseq's import-time notices (tensorboardX, ...)
        from fairseq.data import indexed_dataset

    if not indexed_dataset.MMapIndexedDataset.exists(prefix):
        return None
    return len(indexed_dataset.MMapIndexedDataset(prefix))


def check_joined(run, stage, destdir, src, tgt, reference=None):
    """Stop unless ``dict.SRC.txt`` and ``dict.TGT.txt`` of ``destdir`` are the same file (and equal
    to ``reference`` when given)."""
    a, b = os.path.join(destdir, f"dict.{src}.txt"), os.path.join(destdir, f"dict.{tgt}.txt")
    ref = reference or a
    if not (filecmp.cmp(a, ref, shallow=False) and filecmp.cmp(b, ref, shallow=False)):
        if reference:
            run.die(f"{stage}: the dictionaries in {destdir} differ from {reference}")
        run.die(f"{stage}: dict.{src}.txt and dict.{tgt}.txt differ in {destdir} (expected a joined dictionary)")


def check_counts(run, stage, destdir, pair, splits, langs, expected, unit="sentences"):
    """Stop unless every dataset ``destdir/SPLIT.PAIR.LANG`` exists and holds ``expected(split,
    lang)`` sequences (``(count, what the count is)``)."""
    for s in splits:
        for lang in langs:
            prefix = os.path.join(destdir, f"{s}.{pair}.{lang}")
            n = count_sentences(prefix)
            if n is None:
                run.die(f"{stage}: fairseq-preprocess did not write {prefix}.bin/.idx")
            want, what = expected(s, lang)
            if n != want:
                run.die(f"{stage}: {s}.{pair}.{lang} has {n} {unit}, expected {want} ({what})")


def dataset_files(bin_dir, pair, splits, langs):
    """The ``.bin`` and ``.idx`` files of every split and language."""
    return [os.path.join(bin_dir, f"{s}.{pair}.{lang}.{ext}") for s in splits for lang in langs for ext in ("bin", "idx")]
