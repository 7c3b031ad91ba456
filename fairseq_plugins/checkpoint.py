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

:func:`load_checkpoint` (a state dict) and :func:`load_model_ensemble_and_task` (models and
task, as fairseq's function of that name) are the loaders every tool of the project uses: the
same restricted unpickler, and one explanation of a file that cannot be loaded
(:func:`explain_load_error`: empty, cut short, not a torch checkpoint, or a refused pickle
global) that names the file -- never torch's advice to re-run with ``weights_only=False``.
fairseq's own command-line tools (``fairseq-generate``, ``fairseq-interactive``,
``fairseq-train`` resuming) load with ``torch.load`` inside fairseq; the same explanation
replaces torch's message there through a chained ``sys.excepthook``
(:func:`install_cli_refusal_message`).
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
from typing import Optional

import torch

__all__ = ["SAFE_GLOBALS", "CheckpointError", "UnsafeCheckpointError", "UnsupportedCheckpointError",
           "checkpoint_is_complete", "explain_load_error", "install_cli_refusal_message", "load_checkpoint",
           "load_model_ensemble_and_task", "refusal_message", "register_safe_globals", "repair_last_checkpoint",
           "unknown_attention_functions"]


class CheckpointError(RuntimeError):
    """A checkpoint file cannot be used: empty, cut short, not a torch checkpoint, a refused
    pickle global, or a model the tool does not support.  The message names the file."""


class UnsafeCheckpointError(CheckpointError):
    """A checkpoint holds a pickled global outside :data:`SAFE_GLOBALS`; nothing was executed."""


class UnsupportedCheckpointError(CheckpointError):
    """A checkpoint loads, but holds a model the tool cannot work on (e.g. an ``rnnsearch`` model
    given to a Transformer analysis)."""


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
        CheckpointError: ``path`` is empty (0 bytes), cut short, or not a torch checkpoint
            (:func:`explain_load_error`).
        FileNotFoundError: ``path`` does not exist.
    """
    register_safe_globals()
    try:
        return torch.load(path, map_location=map_location, weights_only=True)
    except Exception as err:  # torch raises pickle.UnpicklingError (wrapped as RuntimeError in some versions)
        explained = _explain(err, path)
        if explained is None:
            raise
        raise explained[0](explained[1]) from None


def load_model_ensemble_and_task(filenames, arg_overrides: Optional[dict] = None, task=None, **kw):
    """fairseq's ``checkpoint_utils.load_model_ensemble_and_task`` with every file read by
    :func:`load_checkpoint` (so a bad file raises the plugin's :class:`CheckpointError`).

    Args:
        filenames: checkpoint paths (an ensemble).
        arg_overrides: stored args/cfg to override (``{"data": ..., "source_lang": ...}``).
        task: an already set-up task, or None (built from the first checkpoint).
        **kw: passed to fairseq's function (``strict``, ``suffix``); sharded checkpoints
            (``num_shards > 1``) are not supported.

    Returns:
        ``(models, cfg, task)`` as fairseq's function: models in the order of ``filenames``, the
        last checkpoint's cfg.

    Raises:
        CheckpointError / UnsafeCheckpointError: see :func:`load_checkpoint`.
        UnsupportedCheckpointError: the checkpoint's model uses an attention function this process
            has not registered (:func:`unknown_attention_functions`; one of a user directory not
            imported), before any model is built.
        fairseq_plugins.trained_data.DataMismatchError: ``source_lang``/``target_lang`` overrides
            other than the direction a checkpoint was trained in; a plugin model whose recorded
            dictionaries differ from the data dir's (checked when the model is built).
        FileNotFoundError: a missing file.
    """
    from fairseq import checkpoint_utils

    from .trained_data import check_languages

    models, cfg = [], None
    over = arg_overrides or {}
    for path in filenames:
        if not os.path.exists(path):
            raise FileNotFoundError(f"checkpoint not found: {path}")
        state = load_checkpoint(path)
        unknown = unknown_attention_functions(state)
        if unknown:
            from .attention import attention_fn_names
            from .user_dir import USER_DIR_HINT

            raise UnsupportedCheckpointError(
                f"{path} was trained with attention function(s) not registered here: "
                + ", ".join(f"{flag} {name!r}" for flag, name in unknown)
                + f"; registered: {', '.join(attention_fn_names())}. " + USER_DIR_HINT)
        check_languages(state, over.get("source_lang"), over.get("target_lang"), path)
        state = prepare_state(state, over)
        ms, cfg, task = checkpoint_utils.load_model_ensemble_and_task(
            [path], arg_overrides=arg_overrides, task=task, state=state, **kw)
        models += ms
    return models, cfg, task


def unknown_attention_functions(state: dict):
    """``[(flag, name)]``: the attention functions a checkpoint's model config names (``cfg.model``,
    or the legacy ``args``; ``--encoder-attention-fn`` / ``--decoder-attention-fn`` /
    ``--cross-attention-fn``) that are not registered in this process -- a function of a user
    directory that was not imported.  Empty for a model without those options (``rnnsearch``,
    stock ``transformer``)."""
    from .attention import attention_fn_names
    from .models.transformer import ATTENTION_TYPES

    cfg = state.get("cfg")
    model = (cfg.get("model") if hasattr(cfg, "get") else getattr(cfg, "model", None)) if cfg is not None else None
    model = model if model is not None else state.get("args")
    if model is None:
        return []
    valid = set(attention_fn_names())
    names = [(flag, model.get(attr) if isinstance(model, dict) else getattr(model, attr, None))
             for flag, attr in ATTENTION_TYPES.values()]
    return [(flag, name) for flag, name in names if name is not None and name not in valid]


def prepare_state(state: dict, overrides: dict) -> dict:
    """What ``fairseq.checkpoint_utils.load_checkpoint_to_cpu`` does after ``torch.load``
    (apply ``overrides`` to the stored args/cfg, wrap the cfg in omegaconf, upgrade old
    layouts), for a state read by :func:`load_checkpoint`."""
    from fairseq import checkpoint_utils
    from fairseq.dataclass.utils import overwrite_args_by_name
    from omegaconf import OmegaConf

    if state.get("args") is not None:
        for k, v in overrides.items():
            setattr(state["args"], k, v)
    if state.get("cfg") is not None:
        state["cfg"] = OmegaConf.create(state["cfg"], flags={"allow_objects": True})
        overwrite_args_by_name(state["cfg"], overrides)
    return checkpoint_utils._upgrade_state_dict(state)


def _is_refusal(err: BaseException) -> bool:
    """Whether ``err`` is torch's weights-only unpickler refusing the pickle (a global outside the
    allow-list, or any other construct it does not accept)."""
    text = str(err)
    return "GLOBAL " in text or "Unsupported global" in text or (
        isinstance(err, pickle.UnpicklingError) and "Weights only load failed" in text)


def explain_load_error(err: BaseException, path=None) -> Optional[str]:
    """The plugin's explanation of ``err``, raised by ``torch.load(path)``, or None when it is
    not one of the cases below (the caller then re-raises ``err`` unchanged).

    * a pickle torch's weights-only unpickler refuses (a global outside the allow-list, or another
      construct): :func:`refusal_message` (the file, the global, that nothing ran,
      how to allow-list a trusted type) -- instead of torch's advice to set ``weights_only=False``;
    * an empty file (0 bytes; torch says a bare ``EOFError``);
    * a torch zip archive whose directory cannot be read: cut short (torch says ``OSError:
      [Errno 22] Invalid argument`` or a ``PytorchStreamReader`` error);
    * a file that is neither a zip archive nor a pickle torch can read.

    Args:
        err: the exception ``torch.load`` raised.
        path: the file given to ``torch.load`` (a path or an open file with ``.name``); without
            it only the refusal is explained.

    Returns:
        The message (it names ``path``), or None.
    """
    explained = _explain(err, path)
    return None if explained is None else explained[1]


def _explain(err: BaseException, path=None):
    """``(exception class, message)`` for :func:`explain_load_error`, or None."""
    if path is not None and not isinstance(path, (str, bytes, os.PathLike)):
        path = getattr(path, "name", None)
    refusal = (UnsafeCheckpointError, refusal_message(str(err), path)) if _is_refusal(err) else None
    # KeyError / IndexError / TypeError: torch's legacy unpickler running text as pickle opcodes
    # (b"h..." is BINGET -> KeyError: 104, b"e..." APPENDS -> IndexError); reclassified below only
    # for a file that is neither a zip archive nor a pickle
    if path is None or not isinstance(err, (EOFError, OSError, RuntimeError, ValueError, pickle.UnpicklingError,
                                            KeyError, IndexError, TypeError)):
        return refusal
    try:
        if not os.path.isfile(path):
            return refusal  # FileNotFoundError / IsADirectoryError already name it
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            head = f.read(4)
    except OSError:
        return refusal
    advice = ("use another checkpoint (fairseq also keeps checkpoint_<epoch>_<updates>.pt / checkpoint<epoch>.pt "
              "when --save-interval-updates / epoch checkpoints are on), or move it away and train again")
    if size == 0:
        return CheckpointError, (f"{path} is empty (0 bytes): not a checkpoint. It was created but never written "
                                 f"(a full disk, or a kill or a failed copy before anything was written); {advice}")
    if head == b"PK\x03\x04":
        try:
            with zipfile.ZipFile(path):
                pass
        except (zipfile.BadZipFile, OSError, EOFError):
            return CheckpointError, (f"{path} is cut short or corrupt ({size} bytes; the directory at the end of "
                                     f"its zip archive cannot be read): it was killed or truncated while being "
                                     f"written or copied; {advice}")
        return refusal  # a whole zip archive: a refusal, or torch's own error says more
    if head[:1] != b"\x80":  # not a pickle (torch's legacy format starts with one)
        return CheckpointError, (f"{path} is not a torch checkpoint ({size} bytes starting with {head!r}: neither "
                                 "a zip archive written by torch.save nor a legacy torch pickle)")
    return refusal


def refusal_message(torch_message: str, path=None) -> str:
    """The plugin's explanation of torch's weights-only refusal ``torch_message``: the file, the
    offending global(s), that nothing ran, and how to allow-list a type one trusts."""
    names = re.findall(r"GLOBAL ([\w.]+)", torch_message) or re.findall(r"Unsupported global: ([\w.]+)", torch_message)
    names = list(dict.fromkeys(names))
    if names:
        what = ", ".join(names)
    else:  # torch's own reason, without its advice to re-run with weights_only=False
        reason = [l.strip() for l in torch_message.splitlines() if l.strip() and "weights_only" not in l
                  and not l.startswith(("Weights only load failed", "Check the documentation"))]
        what = "an object outside the allow-list" + (f" (torch: {' '.join(reason)})" if reason else "")
    return (f"refusing to load {path or 'the checkpoint'}: its pickle references {what}, which is not in "
            "the allow-list of fairseq checkpoint types (fairseq_plugins.checkpoint.SAFE_GLOBALS). Nothing "
            "from it was executed. A checkpoint from an untrusted source can run arbitrary code: only if you "
            "trust this file and the type is plain data, allow-list it in a --user-dir module with "
            "torch.serialization.add_safe_globals([<the type>]) (never os.system, eval, exec or the like).")


def _loaded_path(tb):
    """The file ``torch.load`` was reading when the traceback ``tb`` was raised, or None: the
    ``f`` argument of ``torch.serialization.load`` (a path, or an open file's ``.name``) in the
    innermost such frame."""
    found = None
    while tb is not None:
        frame = tb.tb_frame
        if frame.f_code.co_name == "load" and frame.f_code.co_filename.endswith(
                os.path.join("torch", "serialization.py")):
            f = frame.f_locals.get("f")
            f = f if isinstance(f, (str, os.PathLike)) else getattr(f, "name", None)
            if isinstance(f, (str, os.PathLike)):
                found = os.fspath(f)
        tb = tb.tb_next
    return found


def install_cli_refusal_message():
    """Make fairseq's command-line tools explain a checkpoint they cannot load in the plugin's words.

    ``fairseq-generate`` / ``fairseq-interactive`` (``--path``) and ``fairseq-train``
    (``checkpoint_last.pt``, ``--restore-file``) load with ``torch.load`` inside fairseq
    (``checkpoint_utils.load_checkpoint_to_cpu``), so a bad file reaches the user as torch's
    exception: a bare ``EOFError`` for an empty file, an ``UnpicklingError`` advising to re-run
    with ``weights_only=False`` for a refused global.  Rather than patching fairseq, this
    chains a ``sys.excepthook``: when the uncaught exception was raised by ``torch.load`` and
    :func:`explain_load_error` explains it, the traceback is printed with torch's message
    replaced by ``fairseq_plugins: <explanation>`` (naming the file); any other exception goes
    to the previous hook unchanged.  Idempotent.
    """
    previous = sys.excepthook
    if getattr(previous, "_fairseq_plugins_refusal", False):
        return

    def hook(etype, value, tb):
        path = _loaded_path(tb)
        msg = explain_load_error(value, path) if path is not None else None
        if msg is None:
            previous(etype, value, tb)
            return
        import traceback

        lines = traceback.format_exception(etype, value, tb)
        only = traceback.format_exception_only(etype, value)
        if lines[-len(only):] == only:
            lines = lines[:-len(only)]
        name = etype.__qualname__ if etype.__module__ == "builtins" else f"{etype.__module__}.{etype.__qualname__}"
        sys.stderr.write("".join(lines) + f"{name}: (explained by fairseq_plugins below)\n\n"
                         f"fairseq_plugins: {msg}\n")

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
