"""The position-wise FFN viewed as a key-value memory (ReLUFormer Section 3, Table 1, Figure 1).

Shape legend: T length, B batch, C model dim, F = d_ff FFN slots (``encoder_ffn_embed_dim``).

``FFN(X) = act(X W_1) W_2`` reads ``W_1`` as keys and ``W_2`` as values (Geva et al. 2020).
The key-value-memory reading replaces ``act = ReLU`` by ``softmax`` over the ``F`` slots
(ReLUFormer eq. 2) and, to restore the output variance, adds a LayerNorm on the FFN output:
``H = LN(softmax(X K^T) V)`` (Section 3.2).  The fairseq layer keeps its residual and its own
pre/post LayerNorm around this block.
"""

from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn as nn
import torch.nn.functional as F
from fairseq.dataclass import ChoiceEnum
from fairseq.modules import LayerNorm

from ..options import OptionGroup, option

__all__ = ["FFN_ACTIVATIONS", "FfnOptions", "softmax_over_slots", "LinearThenLayerNorm", "configure_ffn"]


def softmax_over_slots(x: torch.Tensor) -> torch.Tensor:
    """Softmax over the last dim (the ``F`` memory slots), computed in float32: ``(T, B, F)``."""
    return F.softmax(x.float(), dim=-1).type_as(x)


#: ``--ffn-activation`` choices; ``None`` keeps fairseq's ``--activation-fn``.
FFN_ACTIVATIONS = {"relu": F.relu, "softmax": softmax_over_slots}


@dataclass
class FfnOptions(OptionGroup):
    """Options of the FFN viewed as a key-value memory (``--ffn-*``; ReLUFormer Section 3)."""

    prefix = "ffn"
    family = "FFN"
    activation: Optional[ChoiceEnum(sorted(FFN_ACTIVATIONS))] = option(
        None, "FFN activation over the d_ff slots (ReLUFormer Table 1); default: --activation-fn")
    output_layernorm: bool = option(False, "LayerNorm on the FFN output, LN(act(X W1) W2) (ReLUFormer Section 3.2)")


class LinearThenLayerNorm(nn.Linear):
    """``LN(x W^T + b)``: the FFN's second projection followed by a LayerNorm over ``C``.

    Parameter names are those of the ``nn.Linear`` (``weight``, ``bias``) plus ``norm.*``, so a
    layer built with it differs from the stock one only by the extra LayerNorm.
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = True):
        super().__init__(in_features, out_features, bias=bias)
        self.norm = LayerNorm(out_features)

    @classmethod
    def from_linear(cls, linear: nn.Linear) -> "LinearThenLayerNorm":
        """Wrap an existing ``nn.Linear`` keeping its very parameters (same init, same RNG use)."""
        new = cls.__new__(cls)
        nn.Module.__init__(new)
        new.in_features, new.out_features = linear.in_features, linear.out_features
        new.weight, new.bias = linear.weight, linear.bias
        new.norm = LayerNorm(linear.out_features)
        return new

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``(T, B, F) -> (T, B, C)``."""
        return self.norm(super().forward(x))


def configure_ffn(layer: nn.Module, cfg) -> None:
    """Apply ``--ffn-activation`` / ``--ffn-output-layernorm`` (:class:`FfnOptions`, read from
    ``cfg``) to a fairseq Transformer layer.

    Raises:
        ValueError: unknown ``ffn_activation`` (the message lists the valid choices), or
            ``--ffn-output-layernorm`` on a layer whose ``fc2`` is not an ``nn.Linear``.
    """
    opts = FfnOptions.from_args(cfg)
    if opts.activation is not None:
        layer.activation_fn = FFN_ACTIVATIONS[str(opts.activation)]
    if opts.output_layernorm:
        if type(layer.fc2) is not nn.Linear or layer.fc2._forward_pre_hooks:
            raise ValueError("--ffn-output-layernorm needs a plain nn.Linear fc2 "
                             "(quantization noise on the FFN is not supported with it)")
        layer.fc2 = LinearThenLayerNorm.from_linear(layer.fc2)
