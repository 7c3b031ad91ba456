"""Atomic file writing: never leave a half-written output file (the one implementation, used by
the pipeline, the data preparation and the plugin's analyses).

``with atomic_path(path) as tmp: <write tmp>`` writes to a temporary file in the target's
directory and moves it over ``path`` with ``os.replace`` only if the block succeeds; on any
error (or Ctrl-C) the temporary file is removed and ``path`` is untouched.  Standard library
only.  It lives in the plugin so that the plugin imports nothing from ``mt_pipeline`` (which
re-exports it as :mod:`mt_pipeline.atomic`).
"""

import contextlib
import json
import os
import re
import tempfile

__all__ = ["atomic_path", "write_lines_atomic", "write_text_atomic", "write_json_atomic", "remove_leftovers",
           "OwnedFiles", "NotOwnedError", "writable_problem"]


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


class NotOwnedError(RuntimeError):
    """A tool was about to overwrite or delete a file it did not write (the message names it)."""


class OwnedFiles:
    """The files one tool wrote in one directory, recorded in its manifest ``<dir>/.<tool>.owned``.

    The rule of every tool: it deletes or overwrites only files it wrote itself.  A tool
    :meth:`claim` claims a name *before* it creates the file (so a kill between the two leaves at
    worst a claimed name without a file, never an unrecorded file of its own), and :meth:`remove`
    deletes only claimed names.  Anything else in the directory (a user's ``notes.json``, another
    tool's ``config.json``) is never touched.

    Args:
        directory: the output directory (created when missing).
        tool: the owner's name, e.g. ``mt-evaluate`` (the manifest is ``.mt-evaluate.owned``).
    """

    def __init__(self, directory: str, tool: str):
        self.directory, self.tool = directory, tool
        self.path = os.path.join(directory, f".{tool}.owned")
        self.exists = os.path.isfile(self.path)
        self.names = set()
        if self.exists:
            with open(self.path, encoding="utf-8") as f:
                data = json.load(f)
            self.names = set(data.get("files", []))

    def _save(self):
        os.makedirs(self.directory, exist_ok=True)
        write_json_atomic(self.path, {"tool": self.tool, "files": sorted(self.names)})
        self.exists = True

    def owns(self, name: str) -> bool:
        """Whether ``name`` (a file name in the directory) was claimed by this tool."""
        return name in self.names

    def foreign(self, names) -> list:
        """The ``names`` that exist in the directory but were not written by this tool."""
        return [n for n in names if os.path.lexists(os.path.join(self.directory, n)) and n not in self.names]

    def claim(self, names) -> None:
        """Record ``names`` as this tool's before it writes them.

        Raises:
            NotOwnedError: one of them exists and was not written by this tool (nothing recorded).
        """
        names = list(names)
        alien = self.foreign(names)
        if alien:
            raise NotOwnedError(f"{', '.join(os.path.join(self.directory, n) for n in alien)} "
                                f"{'exists' if len(alien) == 1 else 'exist'} and {'was' if len(alien) == 1 else 'were'} "
                                f"not written by {self.tool}; refusing to overwrite "
                                f"{'it' if len(alien) == 1 else 'them'} (use another output directory, or move "
                                f"{'it' if len(alien) == 1 else 'them'} away)")
        if not set(names) <= self.names or not self.exists:
            self.names |= set(names)
            self._save()

    def adopt(self, names) -> None:
        """Record existing files as this tool's without the :meth:`claim` check: only for files a
        caller has recognised as its own output from before the manifest existed."""
        self.names |= set(names)
        self._save()

    def remove(self, name: str) -> bool:
        """Delete ``name`` if this tool wrote it (a foreign file stays); True when deleted."""
        if name not in self.names:
            return False
        path = os.path.join(self.directory, name)
        if os.path.lexists(path):
            os.unlink(path)
        self.names.discard(name)
        self._save()
        return True


def writable_problem(path: str, is_dir: bool = True):
    """Why outputs cannot be written at ``path`` (a directory, or with ``is_dir=False`` a file
    whose directory is checked), or None when they can: the nearest existing directory must be
    a writable directory.  For the up-front checks of the command-line tools (a read-only output
    folder is named before any work, not found by a ``PermissionError`` at the end)."""
    d = os.path.abspath(path if is_dir else os.path.dirname(os.path.abspath(path)))
    while not os.path.exists(d):
        parent = os.path.dirname(d)
        if parent == d:
            break
        d = parent
    if not os.path.isdir(d):
        return f"{d} is not a directory"
    if not os.access(d, os.W_OK | os.X_OK):
        return f"{d} is not writable (read-only folder or another owner)"
    return None
