"""Atomic file writing: never leave a half-written output file (the one implementation, used by
the pipeline, the data preparation and the plugin's analyses).

``with atomic_path(path) as tmp: <write tmp>`` writes to a temporary file in the target's
directory and moves it over ``path`` with ``os.replace`` only if the block succeeds; on any
error (or Ctrl-C) the temporary file is removed and ``path`` is untouched.  Standard library
only, so scoring and data preparation do not pay for importing torch or fairseq.
"""

import contextlib
import json
import os
import re
import tempfile

__all__ = ["atomic_path", "write_lines_atomic", "write_text_atomic", "write_json_atomic", "remove_leftovers"]


@contextlib.contextmanager
def atomic_path(path: str):
    """Yield a temporary path next to ``path``; ``os.replace`` it onto ``path`` on success."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix="." + os.path.basename(path) + ".", suffix=".tmp", dir=directory)
    os.close(fd)
    try:
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        yield tmp
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def write_lines_atomic(path: str, lines) -> None:
    """Write ``lines`` (strings without newlines) to ``path``, one per line, atomically."""
    with atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8", newline="\n") as f:
        for line in lines:
            f.write(line + "\n")


def write_text_atomic(path: str, text: str) -> None:
    """Write ``text`` (UTF-8) to ``path`` atomically."""
    with atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8", newline="\n") as f:
        f.write(text)


def write_json_atomic(path: str, obj) -> None:
    """Write ``obj`` as indented JSON to ``path`` atomically."""
    write_text_atomic(path, json.dumps(obj, indent=1, ensure_ascii=False) + "\n")


def remove_leftovers(directory: str, names=None):
    """Remove the temp files a SIGKILL left in ``directory`` (no ``except`` runs then).

    Those are ``atomic_path``'s ``.<name>.<random>.tmp`` and the shell scripts'
    ``<name>.tmp.<pid>`` (scripts/evaluate.sh).  Only call this while no other process writes
    into ``directory`` (e.g. under a lock): their temp files look the same.

    Args:
        directory: the directory (a missing one is fine).
        names: only the temp files of these output names (default: every temp file).

    Returns:
        The removed paths.
    """
    if not os.path.isdir(directory):
        return []
    removed = []
    for entry in os.listdir(directory):
        m = re.fullmatch(r"\.(.+)\.[^.]+\.tmp", entry) or re.fullmatch(r"(.+)\.tmp\.[0-9]+", entry)
        path = os.path.join(directory, entry)
        if m and (names is None or m.group(1) in names) and os.path.isfile(path):
            os.unlink(path)
            removed.append(path)
    return removed
