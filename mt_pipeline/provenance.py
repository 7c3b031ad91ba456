"""Provenance of every result file for the pipeline: :mod:`fairseq_plugins.provenance`, the one
record and Markdown rendering (it lives in the plugin so that the plugin's analysis CLIs need
nothing from ``mt_pipeline``; the pipeline re-exports it here), plus :func:`code_state`: the
uncommitted change behind a ``<sha>+dirty`` commit, which the training runner stores per
fairseq-train invocation (:mod:`mt_pipeline.experiment`).
"""

import os
import subprocess
from typing import Dict

from fairseq_plugins.provenance import *  # noqa: F401,F403  (the one provenance record)
from fairseq_plugins.provenance import __all__ as _plugin_all
from fairseq_plugins.provenance import CODE_DIRS, ROOT, file_sha256, git_commit, repo_relative

__all__ = list(_plugin_all) + ["code_state", "shown_path"]


def shown_path(path: str) -> str:
    """``path`` as a result page shows it: relative to the repository when inside it or in the
    shared data folder (``../shared/data/...``, as the data preparation names it), else as given."""
    from .prep.spec import SHARED_DATA

    full = os.path.abspath(path)
    if os.path.commonpath([full, SHARED_DATA]) == SHARED_DATA:
        return os.path.relpath(full, ROOT)
    return repo_relative(full)


def code_state(root: str = ROOT) -> Dict[str, object]:
    """The code a process runs: ``{"git_commit": <sha>[+dirty] | unknown}`` (:func:`git_commit`),
    and when the commit is ``+dirty`` also ``"diff"``: ``git diff HEAD --binary`` of the paths that
    decide ``+dirty`` (:data:`CODE_DIRS`; results/, docs/ and tests/ are not code and are left out),
    and ``"untracked"``: the untracked, not git-ignored files under those paths as
    ``[[path, sha256], ...]`` (they are in no diff and make no ``+dirty``, but a new module there is
    imported all the same).  The diff applies to ``<sha>`` with ``git apply``.  When git fails
    there (it answered ``rev-parse`` a moment before), ``"diff_error"`` says why instead: a training
    run is never stopped over its record, and an absent diff is never passed off as an empty one.
    """
    commit = git_commit(root)
    state: Dict[str, object] = {"git_commit": commit}
    if not commit.endswith("+dirty"):
        return state
    try:
        diff = subprocess.run(["git", "diff", "HEAD", "--binary", "--", *CODE_DIRS], cwd=root, capture_output=True,
                              text=True, errors="replace", timeout=60, check=True).stdout
        names = subprocess.run(["git", "ls-files", "--others", "--exclude-standard", "-z", "--", *CODE_DIRS],
                               cwd=root, capture_output=True, text=True, timeout=60, check=True).stdout.split("\0")
    except (OSError, subprocess.SubprocessError) as err:  # never stop a training run over its record
        state["diff_error"] = f"{type(err).__name__}: {err}"
        return state
    state["diff"] = diff
    state["untracked"] = [[n, file_sha256(os.path.join(root, n))] for n in sorted(filter(None, names))
                          if os.path.isfile(os.path.join(root, n))]
    return state
