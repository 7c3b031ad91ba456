"""Criterions: cross-entropy plus auxiliary terms reported by modules."""

from .label_smoothed_cross_entropy_with_reg import (  # noqa: F401
    LabelSmoothedCrossEntropyWithRegCriterion,
)
