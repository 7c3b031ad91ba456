"""Line-aligned text files: reading, atomic writing, counting, and the checks run on parallel text.

Files are read with :func:`read_lines`, split on ``\\n`` only: ``codecs``-style readers (and
``str.splitlines``) also break lines at U+2028, U+0085, ..., which would shift every later sentence
pair.  Files are written with :func:`write_lines_atomic` (:mod:`mt_pipeline.atomic`: temp file +
``os.replace``), so a killed stage never leaves a half-written file.
"""

import gzip
import os

from mt_pipeline.atomic import write_lines_atomic, write_text_atomic  # noqa: F401  (re-exported for the stages)

MAX_WORDS = 250  # default longest raw line, in words (Multi30k's longest line has 41)


def read_lines(path):
    """Lines of ``path`` (UTF-8) split on ``\\n`` only, without the newline."""
    with open(path, encoding="utf-8", newline="\n") as f:
        return [line[:-1] if line.endswith("\n") else line for line in f]


def count_lines(path):
    """Number of ``\\n`` in ``path`` (what ``wc -l`` counts)."""
    n = 0
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            n += block.count(b"\n")
    return n


def _line_problems(name, lines, max_words):
    """Problems of one file's raw byte lines (each with or without its ``\\n``); returns
    ``(problems, number of lines)``."""
    problems, n = [], 0
    for n, raw in enumerate(lines, 1):
        body = raw[:-1] if raw.endswith(b"\n") else raw
        try:
            line = body.decode("utf-8")
        except UnicodeDecodeError as err:
            problems.append(f"{name}:{n}: invalid UTF-8 at byte {err.start} of the line "
                            f"({body[max(0, err.start - 10):err.start + 4]!r})")
            continue
        control = next((c for c in line if ord(c) < 32 and c not in "\t\r"), None)
        if control is not None:
            problems.append(f"{name}:{n}: control character {control!r} (e.g. a NUL byte: the tokeniser would "
                            "join the words around it)")
            continue
        words = len(line.split())
        if words == 0:
            problems.append(f"{name}:{n}: empty line")
        elif words > max_words:
            problems.append(f"{name}:{n}: {words} words, more than --max-words {max_words}")
    return problems, n


def check_parallel_lines(named_lines, max_words=MAX_WORDS):
    """Problems of line-aligned raw text (one entry per language) already in memory.

    Args:
        named_lines: ``[(name, lines)]``, ``lines`` the byte lines of one file (split on ``\\n``);
            ``name`` is what the messages call the file.
        max_words: longest allowed line, in whitespace-separated words.

    Returns:
        A list of messages, each naming the file and the 1-based line (empty: all good).  Checks:
        strict UTF-8 (the byte offset of the bad sequence is given); no NUL or other control
        character but tab and CR; no empty / whitespace-only
        line (it would give an empty sentence, which fairseq drops or pairs with the wrong
        neighbour); no line over ``max_words`` words; equal line counts.
    """
    problems, counts = [], {}
    for name, lines in named_lines:
        found, counts[name] = _line_problems(name, lines, max_words)
        problems += found
    if len(set(counts.values())) > 1:
        first = min(counts.values())
        problems.append("line counts differ: " + ", ".join(f"{p} has {c}" for p, c in counts.items())
                        + f" (pairs are misaligned from line {first + 1})")
    return problems


def check_parallel(paths, max_words=MAX_WORDS):
    """:func:`check_parallel_lines` on files (a path ending in ``.gz`` is decompressed; line
    numbers are those of its content); a missing file is a problem of its own."""
    named, problems = [], []
    for path in paths:
        if not os.path.isfile(path):
            problems.append(f"{path}: missing file")
            continue
        with (gzip.open if path.endswith(".gz") else open)(path, "rb") as f:
            named.append((path, f.read().split(b"\n")))
        if named[-1][1] and named[-1][1][-1] == b"":
            named[-1][1].pop()  # the end of the last line, not a line
    return problems + check_parallel_lines(named, max_words)


def report_problems(problems, prefix, limit=20):
    """Print the first ``limit`` problems to stderr, each as ``PREFIX: message``."""
    import sys

    for msg in problems[:limit]:
        print(f"{prefix}: {msg}", file=sys.stderr)
    if len(problems) > limit:
        print(f"{prefix}: ... and {len(problems) - limit} more problems", file=sys.stderr)


def check_pair(run, stage, directory, split, langs, expected, note=""):
    """Stop the run unless ``directory/split.LANG`` of every language have ``expected`` lines.

    Args:
        run: the :class:`~mt_pipeline.prep.run.PrepRun` (for its error message).
        stage: the stage named in the message.
        note: appended to "expected N" (e.g. " (the raw count)").

    Raises:
        SystemExit: the counts differ between languages, or from ``expected``."""
    counts = [count_lines(os.path.join(directory, f"{split}.{lang}")) for lang in langs]
    files = [f"{directory}/{split}.{lang}" for lang in langs]
    if len(set(counts)) > 1:
        run.die(f"{stage}: line counts differ: " + ", ".join(f"{f} has {n} lines" for f, n in zip(files, counts)))
    if counts[0] != int(expected):
        run.die(f"{stage}: {' and '.join(files)} have {counts[0]} lines, expected {expected}{note}")
