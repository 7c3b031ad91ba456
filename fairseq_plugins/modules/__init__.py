"""Building blocks used by the attention functions (normalisation layers, ...)."""

from .norms import GatedNorm, RMSNorm  # noqa: F401
