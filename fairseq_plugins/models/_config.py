"""What both model families (``attention_transformer``, ``rnnsearch``) do with their flat options:
arch presets fill the defaults a ``Namespace`` or hydra ``DictConfig`` lacks, and a ``DictConfig``
(``model:`` of a ``fairseq-hydra-train`` YAML) is refused when it has a key that is no option."""

from contextlib import nullcontext
from typing import Iterable, Mapping

from fairseq.utils import safe_getattr
from omegaconf import OmegaConf, open_dict

from ..trained_data import KEY as TRAINED_DATA

#: keys of a ``model:`` DictConfig that are no option but always allowed
_NOT_OPTIONS = frozenset({"_name", "arch", TRAINED_DATA})


def config_context(args):
    """``open_dict`` for an omegaconf config (arch presets add keys), else nothing."""
    return open_dict(args) if OmegaConf.is_config(args) else nullcontext()


def fill_defaults(args, defaults: Mapping[str, object]) -> None:
    """Set each option ``args`` lacks (missing or None) to its default; an explicit value (0
    included) is kept, so that it reaches the model's check at build.

    Args:
        args: ``Namespace`` or ``DictConfig`` (flat), modified in place.
    """
    with config_context(args):
        for key, value in defaults.items():
            if safe_getattr(args, key, None) is None:
                setattr(args, key, value)


def check_model_keys(args, valid: Iterable[str], model: str) -> None:
    """Refuse ``model:`` keys of a hydra ``DictConfig`` that are no option (a misspelt key would
    otherwise be ignored silently); nothing for a ``Namespace``.

    Args:
        args: the ``model:`` config (its ``_name`` / ``arch`` is the arch the message names).
        valid: every option name of the model family.
        model: the model family (``attention_transformer``, ``rnnsearch``).

    Raises:
        ValueError: ``unknown model option(s) KEYS for arch ARCH (MODEL); did you mean ...?
        valid keys (N): ...`` -- the whole list, since ``fairseq-train --arch ARCH --help`` prints
        fairseq's help before the arch's flags are added and so lists none of them.
    """
    if not OmegaConf.is_config(args):
        return
    valid = sorted(set(valid))
    unknown = sorted(set(args.keys()) - set(valid) - _NOT_OPTIONS)
    if unknown:
        import difflib

        arch = safe_getattr(args, "_name", None) or safe_getattr(args, "arch", None) or model
        close = {k: difflib.get_close_matches(k, valid, n=2) for k in unknown}
        hint = "; ".join(f"{k}: did you mean {' or '.join(m)}?" for k, m in close.items() if m)
        raise ValueError(f"unknown model option(s) {', '.join(unknown)} for arch {arch} ({model})"
                         + (f"; {hint}" if hint else "")
                         + f"; valid keys (the fairseq-train flags with '_' for '-', {len(valid)}): {', '.join(valid)}")
