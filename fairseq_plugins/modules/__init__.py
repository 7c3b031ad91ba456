"""Building blocks used by the attention functions and layers (norms, FFN variants, auxiliary
loss buffers)."""

from .auxiliary import AuxiliaryBuffer, clear_auxiliary, collect_auxiliary, enable_auxiliary  # noqa: F401
from .ffn import FFN_ACTIVATIONS, LinearThenLayerNorm, configure_ffn  # noqa: F401
from .norms import GatedNorm, RMSNorm  # noqa: F401
