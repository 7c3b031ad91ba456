"""One preparation run: logging, dry-run plans, stage stamps, the output lock, logged commands.

Every stage of every pipeline goes through :meth:`PrepRun.stage`:

* **idempotent**: a stage writes ``<stage dir>/.done`` holding its *stamp* (its parameters, the
  tool versions and the stamp of the stage it reads from, so a change upstream redoes everything
  downstream); a stage whose stamp matches and whose outputs all exist is skipped;
* **atomic**: the stamp goes last; before an in-place stage runs its ``.done`` is replaced by
  :data:`INCOMPLETE` (matching no stamp), so a killed stage is redone; files are written with
  :mod:`mt_pipeline.atomic`, and a stage built as a whole directory (``swap=True``: raw/, bin/) is
  written to ``<dir>.tmp.<pid>`` and renamed into place;
* **owned**: a ``.done`` file (a stamp or :data:`INCOMPLETE`) marks a directory mt-prep wrote; a
  stage replaces, writes into or removes an existing directory only when it has one (an in-place
  stage also takes an empty directory), so the user's own files are never overwritten or deleted
  (:func:`owned`);
* **serialised**: a run holds ``<out>/.lock`` (``flock``), and on taking it removes what a killed
  run left (``*.tmp.<pid>`` directories and files, ``mt_pipeline.atomic`` temp files);
* **dry runs** (``dry=True``) write nothing and print every step as "would ...", stages that are
  up to date included (they are marked as such);
* **partial runs** (``until=STAGE``, ``mt-prep --until``) stop after that stage, done or up to date
  (:class:`StopAfter`); a later run without it goes on from there (the earlier stages are up to date).
"""

import contextlib
import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time

from mt_pipeline.atomic import atomic_path, remove_leftovers
from mt_pipeline.locks import dir_lock

_RUN_TMP = re.compile(r".+\.tmp\.[0-9]+")  # <name>.tmp.<pid>: a stage dir / file being built

#: the ``.done`` of an in-place stage while it runs: it matches no stamp (a killed stage is redone)
#: but still marks the directory as mt-prep's (:func:`owned`)
INCOMPLETE = "stage=incomplete\nnote=mt-prep was writing this stage when it stopped; the next run redoes it"


def owned(directory, swap=False):
    """Whether mt-prep may write into, replace or remove ``directory``: it does not exist, or it
    holds a ``.done`` file (a stage's stamp or :data:`INCOMPLETE`: mt-prep wrote it).  An in-place
    stage (``swap`` False) also takes an empty directory, which holds nothing to lose; a swap
    stage's directory is renamed into place together with its stamp, so an existing one without a
    stamp is never mt-prep's."""
    if not os.path.lexists(directory):
        return True
    if os.path.isdir(directory) and not os.path.islink(directory):
        if os.path.isfile(os.path.join(directory, ".done")):
            return True
        return not swap and not os.listdir(directory)
    return False


def not_owned_message(name, directory, action="replace"):
    """The refusal for a ``directory`` that :func:`owned` says is not mt-prep's (names it and the way out)."""
    return (f"{name}: {directory} exists and was not written by mt-prep (it has no .done stamp); refusing to "
            f"{action} it. Move it away (or remove it yourself) and run again, or use another --out")


def stamp_text(stage, **fields):
    """A stage's stamp (the one format of ``.done``): ``stage=STAGE``, then one ``key=value`` line
    a field in the order given; strings and numbers as they are, other values (lists, dicts,
    booleans) as compact JSON with sorted keys.  No trailing newline (:meth:`PrepRun.write_stamp`
    adds one).  It is the format of the shell pipeline mt-prep replaced: the multi30k and
    long_documents stamps are byte for byte its, so preps made with it stay up to date."""
    lines = [f"stage={stage}"]
    for key, value in fields.items():
        if not isinstance(value, (str, int)) or isinstance(value, bool):
            value = json.dumps(value, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
        value = str(value)
        assert "\n" not in value, f"stamp field {key} spans lines"
        lines.append(f"{key}={value}")
    return "\n".join(lines)


def sha256_text(text):
    """Hex sha256 of ``text`` (UTF-8), as ``printf '%s' TEXT | sha256sum`` gives it."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


class StopAfter(Exception):
    """Raised by :meth:`PrepRun.stage` after the stage a run was told to stop at (``until``) has
    run or was up to date; ``mt-prep`` catches it and prints ``directory`` (the stage's) last.

    Attributes:
        stage: the stage's name; directory: its directory (absolute)."""

    def __init__(self, stage, directory):
        super().__init__(f"stopped after stage {stage}")
        self.stage, self.directory = stage, directory


class PrepRun:
    """The context of one run of one pipeline.

    Args:
        tag: prefix of every message (``[tag] ...``), e.g. the corpus name.
        out: the output directory (absolute).
        dry: print the plan, write nothing.
        workers: worker processes for tokenisation, truecasing, BPE and fairseq-preprocess.
        until: the name of the stage to stop after (:class:`StopAfter`), or None for every stage.
    """

    def __init__(self, tag, out, dry=False, workers=1, until=None):
        self.tag, self.out, self.dry, self.workers, self.until = tag, out, dry, workers, until

    # ------------------------------------------------------------------ messages
    def log(self, msg):
        """Print ``[tag] msg`` to stdout."""
        print(f"[{self.tag}] {msg}", flush=True)

    def warn(self, msg):
        """Print ``[tag] WARNING: msg`` to stderr."""
        print(f"[{self.tag}] WARNING: {msg}", file=sys.stderr, flush=True)

    def die(self, msg):
        """Print ``[tag] ERROR: msg`` to stderr and stop (``SystemExit(1)``)."""
        print(f"[{self.tag}] ERROR: {msg}", file=sys.stderr, flush=True)
        raise SystemExit(1)

    def step(self, msg):
        """Announce a step: the plan in a dry run ("would ..."), progress in a real one."""
        self.log(("would " if self.dry else "") + msg)

    # ------------------------------------------------------------------ stamps
    @staticmethod
    def current(directory, stamp, files, legacy=()):
        """Whether ``directory/.done`` holds ``stamp`` or one of the ``legacy`` stamps (trailing
        newlines aside) and every one of ``files`` exists."""
        path = os.path.join(directory, ".done")
        if not os.path.isfile(path):
            return False
        with open(path, encoding="utf-8") as f:
            if f.read().rstrip("\n") not in {s.rstrip("\n") for s in (stamp, *legacy)}:
                return False
        return all(os.path.exists(f) for f in files)

    @staticmethod
    def write_stamp(directory, stamp):
        """Write ``stamp`` (plus one newline) to ``directory/.done`` atomically."""
        with atomic_path(os.path.join(directory, ".done")) as tmp, open(tmp, "w", encoding="utf-8") as f:
            f.write(stamp.rstrip("\n") + "\n")

    def stage(self, name, directory, stamp, files, body, swap=False, note="", legacy=()):
        """Run one stage unless it is up to date.

        Args:
            name: the stage's name in the messages (``tok``, ``L=128 pack``, ...).
            directory: the stage directory holding ``.done``.
            stamp: the stage's stamp (text, :func:`stamp_text`).
            files: the outputs that must exist for the stage to count as done.
            body: ``body(d)`` does the work, writing into ``d``: ``directory`` itself, or (with
                ``swap``) a fresh temporary directory that replaces ``directory`` afterwards.
            note: appended to the stage name in the "up to date" message.
            legacy: stamps an earlier mt-prep wrote for the same stage that still count as up to
                date (a stage that runs writes ``stamp``).

        Returns:
            False when the stage was up to date and skipped, True when it ran (or would run).

        Raises:
            StopAfter: ``name`` is the run's ``until`` (after the stage ran or was up to date).
        """
        ran = self._stage(name, directory, stamp, files, body, swap, note, legacy)
        if name == self.until:
            raise StopAfter(name, directory)
        return ran

    def _stage(self, name, directory, stamp, files, body, swap, note, legacy):
        if self.current(directory, stamp, files, legacy):
            if not self.dry:
                self.log(f"{name}: up to date{note}, skipping")
                return False
            self.log(f"{name}: up to date{note}; a real run skips it (its steps:)")
        if self.dry:
            if not owned(directory, swap):
                self.warn(not_owned_message(name, directory, "replace" if swap else "write into")
                          + " (a real run stops here)")
            body(directory)
            return True
        t0 = time.time()
        if not owned(directory, swap):
            # a directory without a stamp was not written by mt-prep (e.g. the user's upstream
            # files): never replaced, written into or deleted
            self.die(not_owned_message(name, directory, "replace" if swap else "write into"))
        if swap:
            tmp = f"{directory}.tmp.{os.getpid()}"
            shutil.rmtree(tmp, ignore_errors=True)
            os.makedirs(tmp)
            try:
                body(tmp)
                self.write_stamp(tmp, stamp)  # the stamp travels with the files
                shutil.rmtree(directory, ignore_errors=True)
                os.rename(tmp, directory)
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
        else:
            os.makedirs(directory, exist_ok=True)
            self.write_stamp(directory, INCOMPLETE)  # no longer up to date, still mt-prep's
            body(directory)
            self.write_stamp(directory, stamp)
        self.log(f"{name}: done ({time.time() - t0:.0f}s)")
        return True

    # ------------------------------------------------------------------ commands
    def run_logged(self, logf, cmd):
        """Run ``cmd`` (list of words), its output appended to ``logf`` after a ``$ cmd`` line;
        on failure show the log's tail and stop.  Nothing in a dry run.

        Raises:
            SystemExit: the command failed (the message names the log)."""
        if self.dry:
            return
        line = " ".join(shlex.quote(c) for c in cmd)
        os.makedirs(os.path.dirname(logf), exist_ok=True)
        with open(logf, "a", encoding="utf-8") as f:
            f.write(f"$ {line}\n")
            f.flush()
            rc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT).returncode
        if rc != 0:
            with open(logf, encoding="utf-8", errors="replace") as f:
                sys.stderr.write("".join(f.readlines()[-25:]))
            self.die(f"command failed (full log: {logf}): {line}")

    # ------------------------------------------------------------------ lock
    @contextlib.contextmanager
    def lock(self):
        """Hold ``<out>/.lock`` (creating ``out``) for the block and remove what a killed run left
        in ``out``; nothing in a dry run."""
        if self.dry:
            yield
            return
        os.makedirs(self.out, exist_ok=True)
        with dir_lock(self.out, wait=True, on_wait=lambda: self.log(f"waiting for another run on {self.out} ...")):
            remove_run_leftovers(self.out)
            yield


def remove_run_leftovers(out, depth=3):
    """Remove what a killed run left up to ``depth`` levels below ``out``: stage directories and
    files being built (``<name>.tmp.<pid>``) and :mod:`mt_pipeline.atomic` temp files.  Call it
    only while holding the run lock."""
    removed = []
    base = out.rstrip(os.sep).count(os.sep)
    for d, dirs, files in os.walk(out):
        for name in [x for x in dirs if _RUN_TMP.fullmatch(x)]:
            shutil.rmtree(os.path.join(d, name), ignore_errors=True)
            dirs.remove(name)
            removed.append(os.path.join(d, name))
        for name in [x for x in files if _RUN_TMP.fullmatch(x)]:
            os.unlink(os.path.join(d, name))
            removed.append(os.path.join(d, name))
        removed += remove_leftovers(d)
        if d.count(os.sep) - base >= depth:
            dirs[:] = []
    return removed
