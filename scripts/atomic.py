"""Atomic file writing shared by the scripts: never leave a half-written output file.

``with atomic_path(path) as tmp: <write tmp>`` writes to a temporary file in the target's
directory and moves it over ``path`` with ``os.replace`` only if the block succeeds; on any
error (or Ctrl-C) the temporary file is removed and ``path`` is untouched.
"""

import contextlib
import os
import tempfile

__all__ = ["atomic_path", "write_lines_atomic"]


@contextlib.contextmanager
def atomic_path(path: str):
    """Yield a temporary path next to ``path``; publish it as ``path`` when the block succeeds."""
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix="." + os.path.basename(path) + ".", suffix=".tmp", dir=directory)
    os.close(fd)
    try:
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp creates 0600; use the usual umask-based mode
        yield tmp
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def write_lines_atomic(path: str, lines):
    """Write ``lines`` (strings without newlines) to ``path``, one per line, atomically."""
    with atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8", newline="\n") as f:
        for line in lines:
            f.write(line + "\n")
