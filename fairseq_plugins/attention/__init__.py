"""Attention functions (one registry) and the multi-head attention module that consumes them."""

from .functions import (  # noqa: F401
    ATTENTION_FUNCTIONS,
    AttentionFunction,
    attention_fn_names,
    build_attention_fn,
    register_attention_fn,
)
from .multihead import FunctionalMultiheadAttention  # noqa: F401
from . import eatt  # noqa: F401,E402  (registers eatt, eatt_select_dot, eatt_l1, synth_dense, synth_random)
