"""The run-directory lock: ``<dir>/.lock``, an exclusive ``flock``.

One implementation for every tool that owns a directory: the experiment runner
(:func:`mt_pipeline.experiment.run_dir_lock`: refuses a second runner, and its children inherit
the lock), mt-prep (:meth:`mt_pipeline.prep.run.PrepRun.lock`: waits for another prep) and
mt-campaign (:func:`lock_held`: a probe, to tell a run being trained from a stopped one).

Standard library only.
"""

import contextlib
import fcntl
import os
import time

LOCK_NAME = ".lock"

#: seconds a non-waiting :func:`dir_lock` keeps trying before it calls the lock held: a
#: :func:`lock_held` probe holds it for microseconds, an owner for a run's life
PROBE_GRACE_S = 0.5

#: file descriptors of the locks this process holds with ``inherit=True``; pass them to a child
#: (``subprocess`` ``pass_fds=inherited_fds()``) and the lock lives as long as this process *or*
#: that child does
_INHERITED = set()


def lock_path(directory: str) -> str:
    """The lock file of ``directory``: ``<directory>/.lock`` (:data:`LOCK_NAME`; the path only)."""
    return os.path.join(directory, LOCK_NAME)


def inherited_fds() -> tuple:
    """The descriptors of this process's ``inherit=True`` locks, for ``pass_fds``."""
    return tuple(sorted(_INHERITED))


@contextlib.contextmanager
def dir_lock(directory: str, *, wait: bool = False, busy_message: str = None, on_wait=None,
             inherit: bool = False):
    """Hold ``<directory>/.lock`` (``flock``, exclusive; the file is created) for the block.

    Args:
        wait: when another process holds it, call ``on_wait()`` (if given) and block until it is
            free; else raise.
        busy_message: the SystemExit message when ``wait`` is False and the lock is held (still
            held after :data:`PROBE_GRACE_S`, so another tool's :func:`lock_held` probe is not
            taken for an owner).
        inherit: record the descriptor in :func:`inherited_fds` while the block runs.

    Raises:
        SystemExit: ``wait`` is False and another process holds the lock.
    """
    path = lock_path(directory)
    f = open(path, "a")
    try:
        if not _try_lock(f, 0.0 if wait else PROBE_GRACE_S):
            if not wait:
                raise SystemExit(busy_message or f"another process holds {path}")
            if on_wait is not None:
                on_wait()
            fcntl.flock(f, fcntl.LOCK_EX)
        if inherit:
            _INHERITED.add(f.fileno())
        yield
    finally:
        if inherit:
            _INHERITED.discard(f.fileno())
        f.close()  # releases the lock (once no child holds it either)


def _try_lock(f, grace_s: float) -> bool:
    """Take the exclusive lock on ``f`` without blocking, trying again for up to ``grace_s``."""
    deadline = time.monotonic() + grace_s
    while True:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.02)


def lock_held(directory: str) -> bool:
    """True when another process holds ``<directory>/.lock`` (a probe: takes and drops it at once;
    creates nothing)."""
    path = lock_path(directory)
    if not os.path.exists(path):
        return False
    with open(path, "a") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(f, fcntl.LOCK_UN)
    return False
