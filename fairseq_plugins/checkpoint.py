"""Safe loading of fairseq checkpoints under torch >= 2.6 (``weights_only=True`` by default).

fairseq stores its configuration in checkpoints as ``argparse.Namespace`` (legacy
``fairseq-train``) or omegaconf containers (``fairseq-hydra-train``).  torch's restricted
unpickler refuses those types unless they are allow-listed.  Importing this module (the
plugin's ``__init__`` does) allow-lists exactly the types listed in :data:`SAFE_GLOBALS` --
plain data containers whose unpickling runs no user code -- with
``torch.serialization.add_safe_globals``; ``fairseq-generate``, ``fairseq-interactive`` and
``torch.load`` then load plugin checkpoints with no environment variable and without
``weights_only=False``.  Anything else in a checkpoint (e.g. ``os.system`` smuggled into a
pickle) is still refused by torch before it runs.

:func:`load_checkpoint` is the loader our scripts use: the same restricted unpickler, and a
refusal message that names the offending global and the file.
"""

import argparse
import collections
import logging
import os
import pickle
import re
import shutil
import sys
import typing
import zipfile

import torch

__all__ = ["SAFE_GLOBALS", "UnsafeCheckpointError", "checkpoint_is_complete", "install_cli_refusal_message",
           "load_checkpoint", "refusal_message", "register_safe_globals", "repair_last_checkpoint"]


class UnsafeCheckpointError(RuntimeError):
    """A checkpoint holds a pickled global outside :data:`SAFE_GLOBALS`; nothing was executed."""


def _omegaconf_types():
    try:
        import omegaconf
        from omegaconf import base, nodes
    except ImportError:  # pragma: no cover - omegaconf ships with fairseq
        return []
    return [
        omegaconf.DictConfig,
        omegaconf.ListConfig,
        base.ContainerMetadata,
        base.Metadata,
        nodes.AnyNode,
        nodes.StringNode,
        nodes.IntegerNode,
        nodes.FloatNode,
        nodes.BooleanNode,
        nodes.EnumNode,
    ]


def _numpy_types():
    """numpy scalars (e.g. a best validation loss stored as ``numpy.float64``)."""
    try:
        import numpy as np
    except ImportError:  # pragma: no cover
        return []
    types = [np.dtype]
    try:  # numpy >= 2 moved the pickled reconstructor to numpy._core
        from numpy._core.multiarray import scalar
    except ImportError:  # pragma: no cover - numpy 1.x
        from numpy.core.multiarray import scalar
    types.append(scalar)
    types += [type(np.dtype(t)) for t in ("float64", "float32", "int64", "int32", "bool")]
    return types


#: Types a fairseq checkpoint may hold besides tensors and builtin containers.
SAFE_GLOBALS = [
    argparse.Namespace,
    collections.defaultdict,
    typing.Any,
    # omegaconf metadata records the value types themselves (object_type / ref_type)
    dict,
    list,
    int,
    float,
    bool,
    str,
    bytes,
    *_omegaconf_types(),
    *_numpy_types(),
]


def register_safe_globals():
    """Allow-list :data:`SAFE_GLOBALS` for ``torch.load(weights_only=True)`` (idempotent).

    A no-op on torch versions without ``torch.serialization.add_safe_globals`` (< 2.4),
    which do not default to ``weights_only=True`` either.
    """
    add = getattr(torch.serialization, "add_safe_globals", None)
    if add is not None:
        add(SAFE_GLOBALS)


def load_checkpoint(path: str, map_location="cpu") -> dict:
    """Load a fairseq checkpoint with torch's restricted (weights-only) unpickler.

    Args:
        path: checkpoint file (``checkpoint_last.pt``, an averaged checkpoint, ...).
        map_location: as for ``torch.load``.

    Returns:
        The checkpoint state dict (keys ``model``, ``cfg``/``args``, ``extra_state``, ...).

    Raises:
        UnsafeCheckpointError: the pickle references a global that is not allow-listed
            (nothing from it was executed); the message names the global and the file.
        FileNotFoundError: ``path`` does not exist.
    """
    register_safe_globals()
    try:
        return torch.load(path, map_location=map_location, weights_only=True)
    except Exception as err:  # torch raises pickle.UnpicklingError (wrapped as RuntimeError in some versions)
        msg = str(err)
        if "weights_only" not in msg and "Unsupported global" not in msg:
            raise
        raise UnsafeCheckpointError(refusal_message(msg, path)) from None


def refusal_message(torch_message: str, path=None) -> str:
    """The plugin's explanation of torch's weights-only refusal ``torch_message``: the file, the
    offending global(s), that nothing ran, and how to allow-list a type one trusts."""
    names = re.findall(r"GLOBAL ([\w.]+)", torch_message) or re.findall(r"Unsupported global: ([\w.]+)", torch_message)
    names = list(dict.fromkeys(names))
    what = ", ".join(names) if names else "an object outside the allow-list"
    return (f"refusing to load {path or 'the checkpoint'}: its pickle references {what}, which is not in "
            "the allow-list of fairseq checkpoint types (fairseq_plugins.checkpoint.SAFE_GLOBALS). Nothing "
            "from it was executed. A checkpoint from an untrusted source can run arbitrary code: only if you "
            "trust this file and the type is plain data, allow-list it in a --user-dir module with "
            "torch.serialization.add_safe_globals([<the type>]) (never os.system, eval, exec or the like).")


def install_cli_refusal_message():
    """Make fairseq's command-line tools explain a refused checkpoint in the plugin's words.

    ``fairseq-generate`` / ``fairseq-interactive`` load ``--path`` with ``torch.load`` inside
    fairseq (``checkpoint_utils.load_checkpoint_to_cpu``), so the refusal reaches the user as
    torch's ``UnpicklingError``.  Rather than patching fairseq, this chains a ``sys.excepthook``
    that, after the usual traceback, prints :func:`refusal_message` when the uncaught exception
    is that refusal (any other exception is printed as before).  Idempotent.
    """
    previous = sys.excepthook
    if getattr(previous, "_fairseq_plugins_refusal", False):
        return

    def hook(etype, value, tb):
        previous(etype, value, tb)
        text = str(value)
        if isinstance(value, pickle.UnpicklingError) and ("GLOBAL " in text or "Unsupported global" in text):
            argv = sys.argv
            path = argv[argv.index("--path") + 1] if "--path" in argv[:-1] else None
            print(f"\nfairseq_plugins: {refusal_message(text, path)}", file=sys.stderr)

    hook._fairseq_plugins_refusal = True
    sys.excepthook = hook


def checkpoint_is_complete(path: str) -> bool:
    """Whether ``path`` is a whole torch zip checkpoint: its central directory (at the end of the
    file) is readable and every member's CRC matches.  Reads the file once, unpickles nothing."""
    try:
        with zipfile.ZipFile(path) as z:
            return z.testzip() is None
    except (OSError, zipfile.BadZipFile, EOFError):
        return False


def _update_checkpoints(save_dir):
    """``checkpoint_<epoch>_<updates>.pt`` and ``checkpoint<epoch>.pt`` newest first."""
    found = []
    for name in os.listdir(save_dir):
        m = re.fullmatch(r"checkpoint_(\d+)_(\d+)\.pt", name) or re.fullmatch(r"checkpoint(\d+)\.pt", name)
        if m:
            found.append((os.path.getmtime(os.path.join(save_dir, name)), name))
    return [os.path.join(save_dir, n) for _, n in sorted(found, reverse=True)]


def repair_last_checkpoint(save_dir: str):
    """Make ``save_dir/checkpoint_last.pt`` loadable again after a kill while fairseq wrote it.

    fairseq (``checkpoint_utils.save_checkpoint``) writes the *first* checkpoint of a save
    atomically (``torch.save`` to ``<name>.tmp`` + ``os.rename``) but produces the others --
    ``checkpoint_last.pt`` among them whenever ``--save-interval-updates`` or epoch
    checkpoints are on -- with ``shutil.copyfile`` into place.  A kill during that copy leaves a
    truncated ``checkpoint_last.pt`` and the restarted ``fairseq-train`` dies loading it.  The
    checkpoint it was copied from is complete (it was renamed into place first), so this
    replaces the torn file with the newest complete ``checkpoint_<e>_<u>.pt`` /
    ``checkpoint<e>.pt`` (copy to a temp file + ``os.replace``), keeping the torn file as
    ``checkpoint_last.pt.torn``.  Leftover ``*.pt.tmp`` files of a kill during ``torch.save``
    are removed.

    Args:
        save_dir: fairseq's ``--save-dir``.

    Returns:
        The checkpoint restored as ``checkpoint_last.pt``, or None when nothing needed repair
        (no directory, no ``checkpoint_last.pt``, or it is complete).

    Raises:
        RuntimeError: ``checkpoint_last.pt`` is torn and no complete checkpoint is left to
            restore it from (the message says to move it away to start afresh).
    """
    last = os.path.join(save_dir, "checkpoint_last.pt")
    if not os.path.isdir(save_dir):
        return None
    for name in os.listdir(save_dir):
        if name.endswith(".pt.tmp"):
            os.unlink(os.path.join(save_dir, name))
            logger.warning("removed %s, left by a kill while fairseq was writing a checkpoint", name)
    if not os.path.exists(last) or checkpoint_is_complete(last):
        return None
    for cand in _update_checkpoints(save_dir):
        if checkpoint_is_complete(cand):
            tmp = last + ".repair.tmp"
            shutil.copyfile(cand, tmp)
            os.replace(last, last + ".torn")
            os.replace(tmp, last)
            logger.warning("%s was torn (killed while being written); restored it from %s and kept "
                           "the torn file as %s.torn", last, os.path.basename(cand), last)
            return cand
    raise RuntimeError(f"{last} is torn (killed while being written) and {save_dir} holds no complete "
                       "checkpoint_<epoch>_<updates>.pt or checkpoint<epoch>.pt to restore it from; move it "
                       "away to start training afresh")


logger = logging.getLogger(__name__)
register_safe_globals()
install_cli_refusal_message()
