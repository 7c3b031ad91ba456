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

__all__ = ["RMSNorm", "GatedNorm", "GroupedLayerNorm", "NORM_SCOPES"]

#: Where ReLA's norm computes its statistics (``--rela-norm-scope``): ``concat`` over the
#: concatenated heads (``C`` wide; the released code, bzhangGo/zero ``modules/rela.py``) or
#: ``head`` over each head's ``d_h`` values (the paper's text, Section 4: ``z in R^{d_h}``,
#: ``g in R^{d_h}`` per head).  Both have ``C`` gains, so their checkpoints have the same layout.
NORM_SCOPES = ("concat", "head")


def _check_groups(dim: int, groups: int) -> None:
    if not isinstance(groups, int) or isinstance(groups, bool) or groups < 1 or dim % groups:
        raise ValueError(f"groups={groups!r} must be a positive int dividing dim={dim}")


def _grouped(x: torch.Tensor, groups: int) -> torch.Tensor:
    """``(..., C)`` -> ``(..., groups, C / groups)`` (a view)."""
    return x if groups == 1 else x.unflatten(-1, (groups, x.size(-1) // groups))


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
        groups: ``1`` (statistics over all ``C`` values) or ``H``: ``RMS`` per group of
            ``C / H`` values, i.e. per head (``--rela-norm-scope head``, :data:`NORM_SCOPES`).
            The gain has ``C`` entries either way (``g in R^{d_h}`` per head).

    Shape: input ``(..., C)`` -> output ``(..., C)``.

    Raises:
        ValueError: unknown ``gain_init`` (valid: ``ones``, ``xavier``), missing ``fan``, or
            ``groups`` not a positive divisor of ``dim``.
    """

    GAIN_INITS = ("ones", "xavier")

    def __init__(self, dim: int, eps: float = 1e-8, gain_init: str = "ones", fan: int = None,
                 groups: int = 1):
        super().__init__()
        if gain_init not in self.GAIN_INITS:
            raise ValueError(f"gain_init={gain_init!r}; valid choices: {', '.join(self.GAIN_INITS)}")
        if gain_init == "xavier" and not fan:
            raise ValueError("gain_init='xavier' needs fan (ReLA-i uses fan = d_h)")
        _check_groups(dim, groups)
        self.dim, self.eps, self.gain_init, self.fan, self.groups = dim, eps, gain_init, fan, groups
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
        xg = _grouped(xf, self.groups)
        y = F.rms_norm(xg, (xg.size(-1),), eps=self.eps).flatten(-2) if self.groups > 1 else \
            F.rms_norm(xf, (self.dim,), eps=self.eps)
        return y.type_as(x) * self.weight

    def extra_repr(self) -> str:
        return f"{self.dim}, eps={self.eps}, gain_init={self.gain_init}, groups={self.groups}"


class GatedNorm(nn.Module):
    """Gated normalisation of ReLA-g, eq. 5: ``LN(z) = sigmoid(w ⊙ z) ⊙ Norm(z)``.

    ``Norm`` is :class:`RMSNorm` (gain init 1; ReLA-g, Table 1 row 7) or
    ``torch.nn.LayerNorm`` (Table 1 row 8, "7 + LayerNorm").  The gate weight ``w`` is
    initialised ``U(-sqrt(3/C), sqrt(3/C))`` (Glorot for a vector, as in the released code).

    Args:
        dim: size ``C`` of the last axis (``d_model``: ReLA normalises the concatenated heads).
        norm: ``"rmsnorm"`` or ``"layernorm"``.
        eps: epsilon of the inner norm.
        groups: statistics per group of ``C / groups`` values (``H`` = per head, see
            :class:`RMSNorm`); the gate acts elementwise and is the same for every scope.

    Shape: ``(..., C)`` -> ``(..., C)``.

    Raises:
        ValueError: unknown ``norm`` (valid: ``rmsnorm``, ``layernorm``) or bad ``groups``.
    """

    NORMS = ("rmsnorm", "layernorm")

    def __init__(self, dim: int, norm: str = "rmsnorm", eps: float = 1e-8, groups: int = 1):
        super().__init__()
        if norm not in self.NORMS:
            raise ValueError(f"norm={norm!r}; valid choices: {', '.join(self.NORMS)}")
        _check_groups(dim, groups)
        self.norm = RMSNorm(dim, eps=eps, groups=groups) if norm == "rmsnorm" else \
            GroupedLayerNorm(dim, eps=max(eps, 1e-5), groups=groups)
        self.gate = nn.Parameter(torch.empty(dim))
        bound = math.sqrt(3.0 / dim)
        nn.init.uniform_(self.gate, -bound, bound)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(self.gate * x) * self.norm(x)


class GroupedLayerNorm(nn.LayerNorm):
    """``torch.nn.LayerNorm`` over the last axis, or over each of ``groups`` equal slices of it
    (per head: ReLA Table 1 row 8 with ``--rela-norm-scope head``).  Same parameters
    (``weight``, ``bias`` of size ``C``) and state-dict keys as ``nn.LayerNorm(C)``.

    Shape: ``(..., C)`` -> ``(..., C)``.

    Raises:
        ValueError: ``groups`` not a positive divisor of ``dim``.
    """

    def __init__(self, dim: int, eps: float = 1e-5, groups: int = 1):
        super().__init__(dim, eps=eps)
        _check_groups(dim, groups)
        self.groups = groups

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.groups == 1:
            return super().forward(x)
        xg = _grouped(x, self.groups)
        y = F.layer_norm(xg, (xg.size(-1),), eps=self.eps).flatten(-2)
        return y * self.weight + self.bias
