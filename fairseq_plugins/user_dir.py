"""A fairseq ``--user-dir`` of the researcher's own, beside the plugin (docs/extending.md).

fairseq takes one ``--user-dir``; a directory that registers its own attention function imports
``fairseq_plugins`` and so brings the plugin's architectures and criterions with it.  The
plugin's commands that build a model from a checkpoint (the analyses) import such a directory
with :func:`import_user_dir`, as ``fairseq-train`` does; ``mt-experiment --user-dir`` trains and
evaluates with it and records :func:`fingerprint` -- the git commit of this repository does not
cover a directory outside it.
"""

import os
from typing import Dict

__all__ = ["USER_DIR_HINT", "import_user_dir", "fingerprint"]

#: the end of every "not a registered attention function" message: how a function of one's own is found
USER_DIR_HINT = ("A function registered outside the plugin needs the --user-dir that registers it "
                 "(for a trained model: the one it was trained with; docs/extending.md).")

#: files a fingerprint leaves out: compiled bytecode and editor / VCS droppings, never source
SKIPPED_DIRS = ("__pycache__", ".git", ".ipynb_checkpoints")
SKIPPED_SUFFIXES = (".pyc", ".pyo", "~", ".swp")


def import_user_dir(user_dir) -> None:
    """Import a fairseq ``--user-dir`` as ``fairseq-train`` does (``fairseq.utils.import_user_module``:
    its attention functions, architectures and criterions register on import), after the plugin.
    ``None`` or ``""``: nothing to import.

    Raises:
        FileNotFoundError: ``user_dir`` is not a directory (checked before anything is imported).
    """
    import argparse

    if not user_dir:
        return
    if not os.path.isdir(user_dir):
        raise FileNotFoundError(f"--user-dir {user_dir}: no such directory")
    import fairseq_plugins  # noqa: F401  (a user directory may import it; fairseq imports it first too)
    from fairseq.utils import import_user_module

    import_user_module(argparse.Namespace(user_dir=os.path.abspath(user_dir)))


def fingerprint(user_dir: str) -> Dict[str, object]:
    """What a result records of the user directory it was trained or evaluated with:
    ``{"path": repo-relative or absolute path, "name": its base name, "files": {relative path:
    SHA-256}}`` over every file under it (sorted; ``__pycache__``, ``.git`` and bytecode left out).
    Two runs whose ``files`` are equal ran the same user code.

    Raises:
        FileNotFoundError: ``user_dir`` is not a directory.
    """
    from .provenance import file_sha256, repo_relative

    if not os.path.isdir(user_dir):
        raise FileNotFoundError(f"--user-dir {user_dir}: no such directory")
    root = os.path.abspath(user_dir)
    files = {}
    for here, dirs, names in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d not in SKIPPED_DIRS)
        for name in sorted(names):
            if not name.endswith(SKIPPED_SUFFIXES):
                path = os.path.join(here, name)
                files[os.path.relpath(path, root)] = file_sha256(path)
    return {"path": repo_relative(root), "name": os.path.basename(root), "files": files}
