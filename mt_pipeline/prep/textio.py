"""Line-aligned text files: reading, atomic writing, counting, and the checks run on parallel text.

Files are read with :func:`read_lines` / :func:`iter_lines`, split on ``\\n`` only: ``codecs``-style
readers (and ``str.splitlines``) also break lines at U+2028, U+0085, ..., which would shift every
later sentence pair.  Files are written with :func:`write_lines_atomic` or, streamed, through
:func:`lines_writer` (both :mod:`mt_pipeline.atomic`: temp file + ``os.replace``), so a killed stage
never leaves a half-written file.

A stage that transforms every line of a corpus streams it (:func:`map_file`): the file is read in
chunks of lines, each chunk transformed in this process or over a worker pool
(:func:`worker_pool`), at most a few chunks in flight (:func:`map_chunks`), so memory is bounded by
the chunk size times the workers, not by the corpus (WMT14 En-Fr: 36M pairs).
"""

import collections
import contextlib
import gzip
import itertools
import os

from mt_pipeline.atomic import atomic_path, write_lines_atomic, write_text_atomic  # noqa: F401  (re-exported)

MAX_WORDS = 250  # default longest raw line, in words (Multi30k's longest line has 41)


def iter_lines(path):
    """The lines of ``path`` (UTF-8) one by one, split on ``\\n`` only, without the newline (a last
    line without one is a line; a file ending in ``\\n`` has no empty line after it).

    Raises:
        UnicodeDecodeError: the file is not UTF-8 (when the bad line is reached)."""
    with open(path, encoding="utf-8", newline="\n") as f:
        for line in f:
            yield line[:-1] if line.endswith("\n") else line


def read_lines(path):
    """:func:`iter_lines` of ``path`` as a list (small files only: a stage streams its corpus)."""
    return list(iter_lines(path))


def paired_lines(paths):
    """The lines of line-aligned ``paths`` together: one tuple (a line of each) per line number.

    Raises:
        SystemExit: a file has more lines than another (names both and the line)."""
    end = object()
    for n, lines in enumerate(itertools.zip_longest(*(iter_lines(p) for p in paths), fillvalue=end), 1):
        if end in lines:
            short = [p for p, x in zip(paths, lines) if x is end]
            raise SystemExit(f"{', '.join(short)} ended at line {n - 1}, before "
                             f"{', '.join(p for p in paths if p not in short)} (the files must be line-aligned)")
        yield lines


def chunked(items, size):
    """``items`` (any iterable) as lists of ``size`` items, the last one shorter (none when empty)."""
    it = iter(items)
    while True:
        chunk = list(itertools.islice(it, size))
        if not chunk:
            return
        yield chunk


@contextlib.contextmanager
def lines_writer(path):
    """Stream lines to ``path`` atomically (:func:`mt_pipeline.atomic.atomic_path`): yields a text
    file (UTF-8, no newline translation) to write each line plus ``\\n`` to; ``path`` is replaced
    when the block ends without an error, else it stays as it was and the temp file is removed."""
    with atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8", newline="\n") as f:
        yield f


class WorkerExit(Exception):
    """A ``SystemExit`` raised in a pool worker, carried back as an exception the pool forwards
    (a ``SystemExit`` would end the worker process and leave the pool waiting for its result)."""


_INIT_ERROR = None  # what the initializer of this worker process raised


def _init_worker(init, initargs):
    global _INIT_ERROR
    try:
        init(*initargs)
    except BaseException as err:  # raised by each task instead: a failing initializer makes the pool respawn forever
        _INIT_ERROR = err


def _guarded(fn, chunk):
    try:
        if _INIT_ERROR is not None:
            raise _INIT_ERROR
        return fn(chunk)
    except SystemExit as err:
        raise WorkerExit(str(err)) from None


@contextlib.contextmanager
def worker_pool(workers, init, initargs=()):
    """A ``multiprocessing`` pool of ``workers`` processes, each set up by ``init(*initargs)`` (the
    per-process state: a tokeniser, a truecaser, BPE codes); with ``workers`` <= 1 no pool: ``init``
    runs in this process and None is yielded (:func:`map_chunks` then works here).  What ``init``
    raises in a worker is raised by :func:`map_chunks` (a pool whose initializer fails would start
    new workers forever).  The pool is closed when the block ends (terminated on an error)."""
    if workers <= 1:
        init(*initargs)
        yield None
        return
    import multiprocessing

    # fork where there is one (Python 3.14 defaults to forkserver): a worker then starts with this
    # process's modules instead of importing them again (torch and fairseq come with mt_pipeline)
    ctx = multiprocessing.get_context("fork" if "fork" in multiprocessing.get_all_start_methods() else None)
    pool = ctx.Pool(workers, initializer=_init_worker, initargs=(init, initargs))
    try:
        yield pool
    except BaseException:
        pool.terminate()
        raise
    else:
        pool.close()
    finally:
        pool.join()


def map_chunks(fn, chunks, pool=None, ahead=None):
    """``fn(chunk)`` for each of ``chunks``, in order, over ``pool`` (None: in this process).

    Unlike ``Pool.imap`` (whose feeder thread reads the whole input at once) at most ``ahead``
    chunks (default: twice the pool's processes) are read and not yet returned, so memory stays
    bounded by the chunk size times the workers.  ``fn`` must be a module-level function.

    Raises:
        SystemExit: ``fn`` raised one (in a worker too); any other exception of ``fn`` as raised."""
    if pool is None:
        for chunk in chunks:
            yield fn(chunk)
        return
    ahead = ahead or 2 * pool._processes
    pending = collections.deque()
    try:
        for chunk in chunks:
            pending.append(pool.apply_async(_guarded, (fn, chunk)))
            if len(pending) >= ahead:
                yield pending.popleft().get()
        while pending:
            yield pending.popleft().get()
    except WorkerExit as err:
        raise SystemExit(str(err)) from None


def map_file(src, dst, fn, pool=None, chunk=20000):
    """Stream ``src`` through ``fn`` to ``dst``: its lines (:func:`iter_lines`) in chunks of ``chunk``,
    ``fn(lines) -> lines`` on each (:func:`map_chunks` over ``pool``), written through
    :func:`lines_writer` (``dst`` appears complete or not at all; it may be ``src``).

    Returns:
        The number of lines written.

    Raises:
        SystemExit: ``fn`` raised one, or returned another number of lines than it was given or a
            line with a line break in it (the output would not align)."""
    sizes, n = collections.deque(), 0

    def feed():
        for lines in chunked(iter_lines(src), chunk):
            sizes.append(len(lines))
            yield lines

    with lines_writer(dst) as f:
        for out in map_chunks(fn, feed(), pool):
            if len(out) != sizes.popleft() or any("\n" in line for line in out):
                raise SystemExit(f"the line count changed after line {n} of {src}")
            f.writelines(line + "\n" for line in out)
            n += len(out)
    return n


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


def report_problems(problems, prefix, limit=20, total=None):
    """Print the first ``limit`` problems to stderr, each as ``PREFIX: message``, then how many more
    there are (of ``total``, default ``len(problems)``: a streamed check keeps only the first ones)."""
    import sys

    total = len(problems) if total is None else total
    for msg in problems[:limit]:
        print(f"{prefix}: {msg}", file=sys.stderr)
    if total > limit:
        print(f"{prefix}: ... and {total - limit} more problems", file=sys.stderr)


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
