"""Analyses of trained models (pure functions on models / attention tensors)."""

from .ffn_variance import ffn_variance_ratios  # noqa: F401
from . import energy  # noqa: F401
from .source_reliance import source_reliance  # noqa: F401
