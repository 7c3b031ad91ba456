"""fairseq's own numeric training options, checked against their ranges at start-up.

fairseq 0.12 parses ``--lr``, ``--label-smoothing``, ``--dropout``, ``--weight-decay``,
``--clip-norm`` ... as plain numbers: ``--label-smoothing 1.5``, ``--lr -1``, ``--dropout -0.5``
or ``--clip-norm nan`` train to exit 0 on a meaningless objective (issue 29.10).  The plugin's
models call :func:`check_training_ranges` when ``fairseq_cli.train.main`` builds them
(:func:`.precision.training_config`), before the Trainer, any checkpoint or "begin training".
fairseq's stock ``transformer`` model gets no such hook: the plugin's ``stock_transformer_small``
arch function checks the flat Namespace fairseq-train hands it (fairseq's own ``transformer``
archs stay unchecked).
"""

from typing import Any, Iterable, Tuple

from ..options import check_number
from .precision import training_config

__all__ = ["RANGES", "check_training_ranges"]

#: (section of the fairseq config, key, bounds, integer): every number found there is checked;
#: a key that is absent or None (e.g. no --max-tokens) is not
RANGES: Tuple[Tuple[str, str, dict, bool], ...] = (
    ("optimization", "lr", {"gt": 0}, False),
    ("optimization", "clip_norm", {"ge": 0}, False),
    ("optimization", "max_update", {"ge": 0}, True),
    ("optimization", "max_epoch", {"ge": 0}, True),
    ("optimization", "update_freq", {"ge": 1}, True),
    ("criterion", "label_smoothing", {"ge": 0, "lt": 1}, False),
    ("criterion", "reg_weight", {"ge": 0}, False),
    ("optimizer", "weight_decay", {"ge": 0}, False),
    ("lr_scheduler", "warmup_updates", {"ge": 0}, True),
    ("model", "dropout", {"ge": 0, "lt": 1}, False),
    ("model", "attention_dropout", {"ge": 0, "lt": 1}, False),
    ("model", "activation_dropout", {"ge": 0, "lt": 1}, False),
    ("dataset", "max_tokens", {"gt": 0}, True),
    ("dataset", "batch_size", {"gt": 0}, True),
    ("checkpoint", "save_interval_updates", {"ge": 0}, True),
)


def _get(obj, key):
    try:
        return getattr(obj, key, None) if not isinstance(obj, dict) else obj.get(key)
    except Exception:  # a struct DictConfig without the key
        return None


def _values(cfg, section: str, key: str) -> Iterable[Any]:
    part = _get(cfg, section)
    value = _get(part, key) if part is not None else None
    if value is None and not hasattr(cfg, "optimization"):  # a flat argparse Namespace
        value = _get(cfg, key)
    if value is None:
        return []
    if isinstance(value, (list, tuple)) or type(value).__name__ == "ListConfig":
        return list(value)
    return [value]


def check_training_ranges(cfg=None) -> None:
    """Refuse fairseq training options outside their ranges (:data:`RANGES`); a no-op outside
    ``fairseq_cli.train.main`` unless ``cfg`` (a fairseq config or flat Namespace) is given.

    Raises:
        ValueError: naming the flag, its range and the value, e.g. ``--label-smoothing must be a
            finite number >= 0 and < 1, got 1.5``.
    """
    cfg = training_config() if cfg is None else cfg
    if cfg is None:
        return
    for section, key, bounds, integer in RANGES:
        for value in _values(cfg, section, key):
            check_number("--" + key.replace("_", "-"), value, integer=integer, **bounds)
