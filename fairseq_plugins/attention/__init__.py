"""Attention functions (one registry) and the multi-head attention module that consumes them."""

from .functions import (  # noqa: F401
    ATTENTION_FUNCTIONS,
    AttentionFunction,
    attention_fn_names,
    build_attention_fn,
    register_attention_fn,
)
from .multihead import FunctionalMultiheadAttention  # noqa: F401
