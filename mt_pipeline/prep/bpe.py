"""Stage bpe (subword-nmt) and its character-level alternative (Multi30k's ``--char``, a recipe's
``char_vocab``).

BPE uses subword-nmt's Python API: ``learn_bpe`` (min-frequency 2) on the concatenated training
files, ``BPE.process_line`` (separator ``@@``) on every line.  (The ``subword-nmt`` CLI is not
used: it reads with ``codecs``, whose readline also breaks lines at U+2028, U+0085, ..., and its
``apply-bpe`` ignores ``--num-workers``.)  Joint BPE learns one model on both sides' training
text (``bpe/codes``); separate BPE one per language on its own side (``bpe/codes.LANG``).
"""

import collections
import contextlib
import gzip
import io
import os
import time

from mt_pipeline.atomic import atomic_path
from mt_pipeline.prep.textio import check_pair, iter_lines, map_file, read_lines, worker_pool, write_lines_atomic

APPLY_BPE_CHUNK = 2000  # lines per task of the apply-bpe worker pool
CHAR_SEPARATOR = "@@"  # BPE's continuation marker, so fairseq's --remove-bpe undoes the split


def learn_bpe(inputs, output, merges, log=None):
    """Learn ``merges`` BPE merge operations (subword-nmt ``learn_bpe``, min-frequency 2) on the
    concatenation of the tokenized files ``inputs``; write the codes to ``output`` atomically.
    subword-nmt's progress bar and messages go to the file ``log`` (default: stderr)."""
    from subword_nmt.learn_bpe import learn_bpe as _learn

    lines = (line + "\n" for path in inputs for line in iter_lines(path))  # streamed: only the counts are kept
    codes = io.StringIO()
    with contextlib.ExitStack() as stack:
        if log:
            os.makedirs(os.path.dirname(log), exist_ok=True)
            stack.enter_context(contextlib.redirect_stderr(stack.enter_context(open(log, "a", encoding="utf-8"))))
        _learn(lines, codes, merges, min_frequency=2)
    text = codes.getvalue().split("\n")
    write_lines_atomic(output, text[:-1] if text and text[-1] == "" else text)


def truncate(log):
    """Make ``log`` an empty file (creating its directory)."""
    os.makedirs(os.path.dirname(log), exist_ok=True)
    open(log, "w").close()


def count_merges(codes):
    """Number of merge operations in the codes file ``codes`` (its lines but ``#version``)."""
    return sum(1 for line in read_lines(codes) if not line.startswith("#version"))


def copy_codes(src, dst):
    """Copy the codes file ``src`` (decompressed when it ends in ``.gz``) to ``dst`` atomically."""
    with open(src, "rb") as f:
        data = f.read()
    with atomic_path(dst) as tmp, open(tmp, "wb") as f:
        f.write(gzip.decompress(data) if src.endswith(".gz") else data)


def check_codes(path):
    """Parse the BPE codes file ``path`` (``.gz`` decompressed) as subword-nmt's ``BPE`` reads it,
    in this process, and return its number of merge operations.  subword-nmt calls ``sys.exit``
    on a bad file inside ``BPE()``; in a worker pool's initializer that respawns workers forever
    (issue 29.4), so every codes file is checked here before any pool starts.

    Raises:
        SystemExit: the file cannot be read, is not UTF-8, holds no merge operation, or has a line
            that is not two subword units separated by a space (the message names file and line).
    """
    try:
        with open(path, "rb") as f:
            data = f.read()
        if path.endswith(".gz"):
            data = gzip.decompress(data)
        text = data.decode("utf-8")
    except (OSError, EOFError) as err:
        raise SystemExit(f"BPE codes {path}: cannot read it ({err})") from None
    except UnicodeDecodeError as err:
        raise SystemExit(f"BPE codes {path}: not UTF-8 text (byte {err.start})") from None
    lines = text.rstrip("\n").split("\n")
    first = 1
    if lines and lines[0].startswith("#version:"):
        lines, first = lines[1:], 2
    if not lines or lines == [""]:
        raise SystemExit(f"BPE codes {path}: no merge operations (an empty file?); give the codes file "
                         "learn_bpe wrote (one 'a b' pair per line), or leave --bpe-codes out to learn them")
    for n, line in enumerate(lines, first):
        if len(line.strip("\r\n ").split(" ")) != 2:
            raise SystemExit(f"BPE codes {path}:{n}: {line[:60]!r} is not two subword units separated by a space "
                             "(not a subword-nmt codes file?)")
    return len(lines)


_BPE = None  # the BPE object of this process (set by _init_bpe, in the workers too)


def _init_bpe(codes_path):
    global _BPE
    from subword_nmt.apply_bpe import BPE

    with open(codes_path, encoding="utf-8") as f:
        _BPE = BPE(f)


def _apply_chunk(lines):
    return [_BPE.process_line(line) for line in lines]


def apply_bpe_lines(lines, codes):
    """``lines`` (tokenised text) segmented in memory with the codes file ``codes``, one output
    line per input line, exactly as :func:`apply_bpe` segments files (single process).

    Raises:
        SystemExit: a bad codes file (:func:`check_codes`)."""
    check_codes(codes)
    _init_bpe(codes)
    return _apply_chunk(list(lines))


def apply_bpe(pairs, codes, workers=1):
    """Segment each ``(IN, OUT)`` of ``pairs`` with the codes file ``codes``, streamed in chunks of
    ``APPLY_BPE_CHUNK`` lines (over a pool of ``workers`` processes when > 1;
    :func:`~mt_pipeline.prep.textio.map_file`); one output line per input line, ``OUT`` written
    atomically.

    Raises:
        SystemExit: a bad codes file (:func:`check_codes`) or a file's line count changed."""
    check_codes(codes)  # before the pool: a bad file would make its initializer exit and respawn forever
    with worker_pool(workers, _init_bpe, (codes,)) as pool:
        for src, dst in pairs:
            try:
                map_file(src, dst, _apply_chunk, pool, APPLY_BPE_CHUNK)
            except SystemExit:
                raise SystemExit(f"apply-bpe: line count changed for {src}") from None


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


def split_chars_files(pairs):
    """:func:`split_chars` on every line of each ``(IN, OUT)``; ``OUT`` written atomically.

    Raises:
        SystemExit: a token contains ``@@`` (names the file)."""
    for src, dst in pairs:
        try:
            map_file(src, dst, _split_chars_chunk)
        except SystemExit as e:
            raise SystemExit(f"split-chars: {src}: {e}") from None


def _split_chars_chunk(lines):
    try:
        return [split_chars(line) for line in lines]
    except ValueError as e:
        raise SystemExit(str(e)) from None


def char_dictionary(train_file, n_chars):
    """The fairseq dictionary (lines ``SYMBOL COUNT``, most frequent first, ties by symbol) of a
    character-split training file (:func:`split_chars`) that keeps its ``n_chars`` most frequent
    characters: a character's frequency counts it with and without :data:`CHAR_SEPARATOR`, and
    both its symbols are kept (count 0 for a form training never shows); symbols of every other
    character are left out (fairseq-preprocess
    ``--srcdict`` / ``--tgtdict`` maps them to ``<unk>``).  Flexible Attention (Shu & Nakayama
    2017) §5.4: the 100 most frequent English and 3,000 Japanese characters.

    Args:
        train_file: the training side of one language, after :func:`split_chars`.
        n_chars: characters kept (> 0); fewer when the file has fewer.

    Returns:
        ``(lines, kept, total)``: the dictionary lines, the characters kept and the characters the
        file has (counts of types).

    Raises:
        ValueError: ``n_chars`` is not positive."""
    if n_chars <= 0:
        raise ValueError(f"n_chars must be positive (got {n_chars})")
    counts = collections.Counter()
    for line in iter_lines(train_file):
        counts.update(line.split())
    sep = len(CHAR_SEPARATOR)
    base = {s: (s[:-sep] if len(s) > sep and s.endswith(CHAR_SEPARATOR) else s) for s in counts}
    per_char = collections.Counter()
    for s, n in counts.items():
        per_char[base[s]] += n
    kept = {c for c, _ in sorted(per_char.items(), key=lambda kv: (-kv[1], kv[0]))[:n_chars]}
    # both symbols of a kept character, also the one training never shows (a character seen only
    # inside words may end one in the test set): its count is 0
    symbols = sorted((s for c in kept for s in (c, c + CHAR_SEPARATOR)), key=lambda s: (-counts[s], s))
    return [f"{s} {counts[s]}" for s in symbols], len(kept), len(per_char)


def io_pairs(src_dir, dst_dir, splits, langs):
    """``[(src_dir/SPLIT.LANG, dst_dir/SPLIT.LANG)]`` for every split and language."""
    return [(os.path.join(src_dir, f"{s}.{l}"), os.path.join(dst_dir, f"{s}.{l}")) for s in splits for l in langs]


def alts(items):
    """``{a,b}`` (shell-brace style) for several items, the item itself for one."""
    return items[0] if len(items) == 1 else "{" + ",".join(items) + "}"


def joint_bpe(run, tok_dir, d, splits, langs, merges, desc, split_count):
    """Joint BPE of the sentence-level pipelines (Multi30k, long documents): ``merges`` merges
    (``desc`` in the log) learned on ``tok_dir/train.*`` -> ``d/codes``, applied to every split;
    each split must keep ``split_count(split)`` lines.

    Raises:
        SystemExit: no merge was learned, or a line count changed."""
    run.step(f"learn joint BPE ({desc}) on {' + '.join(f'tok/train.{l}' for l in langs)} -> bpe/codes")
    if not run.dry:
        t0 = time.time()
        truncate(os.path.join(run.out, "logs", "bpe.log"))
        learn_bpe([os.path.join(tok_dir, f"train.{l}") for l in langs], os.path.join(d, "codes"), merges,
                  log=os.path.join(run.out, "logs", "bpe.log"))
        learned = count_merges(os.path.join(d, "codes"))
        run.log(f"learned {learned} merge operations -> bpe/codes ({time.time() - t0:.0f}s)")
        if learned == 0:
            run.die("bpe: no merge operations learned (training data too small?)")
    run.step(f"apply BPE to {alts(splits)}.{alts(langs)} ({run.workers} workers)")
    if not run.dry:
        try:
            apply_bpe(io_pairs(tok_dir, d, splits, langs), os.path.join(d, "codes"), run.workers)
        except SystemExit as err:
            run.die(str(err))
        for s in splits:
            check_pair(run, "bpe", d, s, langs, split_count(s))
