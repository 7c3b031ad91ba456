"""The data a model was trained on -- its direction and the fingerprints of its dictionaries --
recorded at training time and compared whenever the model is used on other data.

A checkpoint's embeddings fix only the *size* of its dictionaries: a data dir whose dictionary
differs but pads to the same size loads without a word and scores every sentence with the wrong
words (issue 29.9: BLEU 3.38 instead of 4.18); a direction given the wrong way round
(``--source-lang de --target-lang en`` for an en->de model) translates German with an English
encoder (BLEU 0.02, issue 29.7).

* At training time (``fairseq_cli.train.main`` on the call stack) the plugin's models record
  :func:`data_record` of the task -- ``source_lang``, ``target_lang`` and the
  :func:`dictionary_fingerprint` of both dictionaries -- in the model configuration
  (``cfg.model.trained_data``), which fairseq stores in every checkpoint.
* Whenever such a model is built outside training (``fairseq-generate``, ``fairseq-interactive``,
  the analyses, ``mt-evaluate``), :func:`check_record` compares the record with the task it is
  built for and raises :class:`DataMismatchError` naming what differs.
* :func:`check_languages` compares the direction stored in any checkpoint's ``cfg.task`` (also
  of checkpoints from before the record, and of the stock Transformer) with the one asked for.

Standard library and fairseq only: the plugin imports nothing from ``mt_pipeline``.
"""

import hashlib
from typing import Dict, Optional

from .checkpoint import CheckpointError

__all__ = ["KEY", "DataMismatchError", "dictionary_fingerprint", "data_record", "record_or_check",
           "check_record", "stored_record", "stored_languages", "check_languages"]

#: the key of the record in the model configuration
KEY = "trained_data"


class DataMismatchError(CheckpointError, ValueError):
    """A model used on data other than its training data (direction or dictionary)."""


def dictionary_fingerprint(dictionary) -> str:
    """Hex SHA-256 of a fairseq ``Dictionary``'s symbols in index order (what an embedding row
    means; the counts in ``dict.*.txt`` do not change the model and are not part of it)."""
    return hashlib.sha256("\n".join(dictionary.symbols).encode("utf-8")).hexdigest()


def data_record(task) -> Dict[str, Optional[str]]:
    """``{source_lang, target_lang, source_dict, target_dict}`` of a translation ``task`` (the
    fingerprints of its dictionaries; None where the task has no such attribute)."""
    cfg = getattr(task, "cfg", None)
    rec = {"source_lang": getattr(cfg, "source_lang", None), "target_lang": getattr(cfg, "target_lang", None)}
    for side in ("source", "target"):
        d = getattr(task, f"{side}_dictionary", None)
        rec[f"{side}_dict"] = dictionary_fingerprint(d) if d is not None else None
    return rec


def _get(args, key):
    if isinstance(args, dict):
        return args.get(key)
    try:
        return getattr(args, key, None)
    except Exception:  # a struct DictConfig without the key
        return None


def _set(args, key, value) -> None:
    from omegaconf import OmegaConf, open_dict

    if OmegaConf.is_config(args):
        with open_dict(args):
            args[key] = value
    else:
        setattr(args, key, value)


def check_record(record: Optional[dict], task, what: str = "this model") -> None:
    """Compare a stored :func:`data_record` with ``task``'s; nothing when ``record`` is None.

    Raises:
        DataMismatchError: another direction, or a dictionary with other symbols (the message says
            which side, both fingerprints and what to do).
    """
    if not record:
        return
    now = data_record(task)
    rs, rt, ns, nt = (record.get("source_lang"), record.get("target_lang"), now["source_lang"], now["target_lang"])
    if rs and rt and ns and nt and (rs, rt) != (ns, nt):
        raise DataMismatchError(f"{what} was trained {rs}->{rt} but is used {ns}->{nt}: give the languages it "
                                f"was trained with (--source-lang {rs} --target-lang {rt}; mt-evaluate --src {rs} "
                                f"--tgt {rt})")
    for side in ("source", "target"):
        want, got = record.get(f"{side}_dict"), now[f"{side}_dict"]
        if want and got and want != got:
            d = getattr(task, f"{side}_dictionary")
            raise DataMismatchError(
                f"the {side} dictionary of the data dir ({len(d)} symbols, fingerprint {got[:12]}) is not the one "
                f"{what} was trained with (fingerprint {want[:12]}): same size or not, its indices name other "
                "words. Use the data dir the model was trained on (its bin/ with the same dict.*.txt)")


def record_or_check(args, task, training: bool) -> None:
    """At training time store :func:`data_record` of ``task`` in ``args`` (the model
    configuration fairseq saves in the checkpoint); otherwise :func:`check_record` the stored one.

    Raises:
        DataMismatchError: see :func:`check_record`.
    """
    if training:
        _set(args, KEY, data_record(task))
    else:
        check_record(_get(args, KEY), task)


def stored_record(state: dict) -> Optional[dict]:
    """The :func:`data_record` stored in a loaded checkpoint ``state`` (None: not recorded)."""
    cfg = state.get("cfg") or {}
    model = cfg.get("model") if isinstance(cfg, dict) else getattr(cfg, "model", None)
    if model is None and state.get("args") is not None:
        model = state["args"]
    rec = _get(model, KEY) if model is not None else None
    return dict(rec) if rec else None


def stored_languages(state: dict):
    """``(source_lang, target_lang)`` a checkpoint ``state`` was trained with (its ``cfg.task``,
    or the legacy ``args``); ``(None, None)`` when not stored."""
    cfg = state.get("cfg") or {}
    task = cfg.get("task") if isinstance(cfg, dict) else getattr(cfg, "task", None)
    src = _get(task, "source_lang") if task is not None else None
    tgt = _get(task, "target_lang") if task is not None else None
    if (src is None or tgt is None) and state.get("args") is not None:
        src, tgt = getattr(state["args"], "source_lang", src), getattr(state["args"], "target_lang", tgt)
    return src, tgt


def check_languages(state: dict, src: Optional[str], tgt: Optional[str], path: str = "the checkpoint") -> None:
    """Refuse a direction ``src -> tgt`` other than the one checkpoint ``state`` was trained with
    (a None side, or a checkpoint that does not store its languages, is not checked).

    Raises:
        DataMismatchError: naming the checkpoint, both directions and the flags to give.
    """
    s, t = stored_languages(state)
    if s and t and src and tgt and (s, t) != (src, tgt):
        raise DataMismatchError(f"{path} was trained {s}->{t}; it cannot translate {src}->{tgt} (give --src {s} "
                                f"--tgt {t}, i.e. fairseq's --source-lang {s} --target-lang {t})")
