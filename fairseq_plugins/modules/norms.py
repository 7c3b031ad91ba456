"""Normalisation layers used by rectified linear attention (ReLA).

Shapes: ``(..., C)`` with ``C`` the normalised (model) dimension; every layer here
normalises over the last axis and is shape-preserving.

Source: Zhang, Titov & Sennrich (2021), "Sparse Attention with Linear Units" (ReLA),
Section 4, eqs. 4-5; RMSNorm from Zhang & Sennrich (2019).  The released ReLA code
(bzhangGo/zero, ``modules/rela.py``) computes ``g * x * rsqrt(mean(x^2) + eps) *
sigmoid(w * x)`` with ``eps = 1e-8``: the gate multiplies the *un-normalised* input.
"""

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

__all__ = ["RMSNorm", "GatedNorm"]


class RMSNorm(nn.Module):
    """Root-mean-square layer normalisation, ReLA eq. 4: ``RMSNorm(z) = z / RMS(z) ⊙ g``.

    Args:
        dim: size ``C`` of the last axis.
        eps: added to ``mean(z^2)`` before the reciprocal square root (released ReLA
            code: 1e-8). A zero row (null attention) therefore stays exactly zero.
        gain_init: ``"ones"`` (the usual RMSNorm initialisation, ReLA Table 1 row 5) or
            ``"xavier"``: ``g ~ U(-sqrt(3/fan), sqrt(3/fan))`` (ReLA-i, Section 4, with
            fan_in = fan_out = ``fan``, which the paper sets to ``d_h``).
        fan: the fan used by ``gain_init="xavier"``; required then.

    Shape: input ``(..., C)`` -> output ``(..., C)``.

    Raises:
        ValueError: unknown ``gain_init`` (valid: ``ones``, ``xavier``) or missing ``fan``.
    """

    GAIN_INITS = ("ones", "xavier")

    def __init__(self, dim: int, eps: float = 1e-8, gain_init: str = "ones", fan: int = None):
        super().__init__()
        if gain_init not in self.GAIN_INITS:
            raise ValueError(f"gain_init={gain_init!r}; valid choices: {', '.join(self.GAIN_INITS)}")
        if gain_init == "xavier" and not fan:
            raise ValueError("gain_init='xavier' needs fan (ReLA-i uses fan = d_h)")
        self.dim, self.eps, self.gain_init, self.fan = dim, eps, gain_init, fan
        self.weight = nn.Parameter(torch.empty(dim))
        self.reset_parameters()

    def reset_parameters(self):
        if self.gain_init == "ones":
            nn.init.ones_(self.weight)
        else:
            bound = math.sqrt(3.0 / self.fan)
            nn.init.uniform_(self.weight, -bound, bound)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # statistics in float32 at least, so bf16/fp16 inputs do not under/overflow
        # (torch's fused rms_norm: z * rsqrt(mean(z^2) + eps), exactly the released formula)
        xf = x.float() if x.dtype in (torch.float16, torch.bfloat16) else x
        return F.rms_norm(xf, (self.dim,), eps=self.eps).type_as(x) * self.weight

    def extra_repr(self) -> str:
        return f"{self.dim}, eps={self.eps}, gain_init={self.gain_init}"


class GatedNorm(nn.Module):
    """Gated normalisation of ReLA-g, eq. 5: ``LN(z) = sigmoid(w ⊙ z) ⊙ Norm(z)``.

    ``Norm`` is :class:`RMSNorm` (gain init 1; ReLA-g, Table 1 row 7) or
    ``torch.nn.LayerNorm`` (Table 1 row 8, "7 + LayerNorm").  The gate weight ``w`` is
    initialised ``U(-sqrt(3/C), sqrt(3/C))`` (Glorot for a vector, as in the released code).

    Args:
        dim: size ``C`` of the last axis (``d_model``: ReLA normalises the concatenated heads).
        norm: ``"rmsnorm"`` or ``"layernorm"``.
        eps: epsilon of the inner norm.

    Shape: ``(..., C)`` -> ``(..., C)``.

    Raises:
        ValueError: unknown ``norm`` (valid: ``rmsnorm``, ``layernorm``).
    """

    NORMS = ("rmsnorm", "layernorm")

    def __init__(self, dim: int, norm: str = "rmsnorm", eps: float = 1e-8):
        super().__init__()
        if norm not in self.NORMS:
            raise ValueError(f"norm={norm!r}; valid choices: {', '.join(self.NORMS)}")
        self.norm = RMSNorm(dim, eps=eps) if norm == "rmsnorm" else nn.LayerNorm(dim, eps=max(eps, 1e-5))
        self.gate = nn.Parameter(torch.empty(dim))
        bound = math.sqrt(3.0 / dim)
        nn.init.uniform_(self.gate, -bound, bound)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(self.gate * x) * self.norm(x)
