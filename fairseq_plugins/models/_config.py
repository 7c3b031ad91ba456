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


def check_model_keys(args, valid: Iterable[str], model: str, valid_text: str) -> None:
    """Refuse ``model:`` keys of a hydra ``DictConfig`` that are no option (a misspelt key would
    otherwise be ignored silently); nothing for a ``Namespace``.

    Raises:
        ValueError: ``unknown model option(s) KEYS for MODEL; VALID_TEXT``.
    """
    if not OmegaConf.is_config(args):
        return
    unknown = sorted(set(args.keys()) - set(valid) - _NOT_OPTIONS)
    if unknown:
        raise ValueError(f"unknown model option(s) {', '.join(unknown)} for {model}; {valid_text}")
