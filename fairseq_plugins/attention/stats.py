"""Per-query-row statistics of attention weights: mass, entropy, null attention, valid keys.

Shape legend: B batch, H heads, T query length, S key length.  Masks are bool, broadcastable
to ``(B, H, T, S)``, ``True`` = blocked.

Everything is computed from two row sums of the (non-negative) weights ``s``:
``row_sum = sum_j s_j`` and ``row_slogs = sum_j s_j log s_j`` (``0 log 0 = 0``), so the
fused ReLU kernel can produce them without materialising ``s``.  With ``s_bar = s / sum s``
(ReLUFormer Section 4.2: ReLU weights are renormalised before measuring entropy),

    H(s_bar) = log(sum s) - (sum_j s_j log s_j) / sum s.

A *null* row (``sum s = 0``: no positive score, ReLA Section 4) has no distribution; its
entropy is undefined and it is excluded from entropy means and counted by the null rate.
"""

from typing import Optional, Tuple

import torch

__all__ = ["valid_keys", "row_mass_terms", "RowMassTerms", "entropy_from_terms", "ROW_EPS"]

#: floor of ``sum s`` inside logarithms: ``log(max(sum s, ROW_EPS))``.  Rows above it are exact;
#: null rows (``sum s = 0``) never reach a log unmasked: they are excluded from entropy means and
#: from ReLUFormer's eq. 7 terms and counted by the null rate instead.
ROW_EPS = 1e-6


def valid_keys(mask: Optional[torch.Tensor], src_len: int) -> torch.Tensor:
    """Number of keys each query may attend to, ``n`` of ReLUFormer eq. 6.

    Args:
        mask: bool ``(B|1, H|1, T|1, S)`` (True = blocked) or None.
        src_len: ``S``.

    Returns:
        float32 ``(B|1, H|1, T|1, 1)``, or a ``(1, 1, 1, 1)`` tensor holding ``S`` when
        ``mask`` is None.  Padding is not counted; under a causal mask query ``i`` gets
        ``i + 1`` (and during incremental decoding the cache length, which is the same).
    """
    if mask is None:
        return torch.full((1, 1, 1, 1), float(src_len))
    return (~mask).sum(dim=-1, keepdim=True, dtype=torch.float32)


class RowMassTerms(torch.autograd.Function):
    """``(sum_j s_ij, sum_j s_ij log s_ij)`` over the last dim of ``s >= 0`` (``0 log 0 = 0``).

    A hand-written backward (``g_sum + g_slogs (log s + 1)`` where ``s > 0``, 0 elsewhere) that
    saves only ``s`` -- which the surrounding attention saves anyway -- instead of autograd's
    chain of ``(T, S)`` intermediates.  ``log`` is taken of ``max(s, tiny)``: exact, NaN-free
    and fast (log of exact zeros takes a ~8x slower path).
    """

    @staticmethod
    def forward(ctx, s):
        ctx.set_materialize_grads(False)
        ctx.save_for_backward(s)
        logs = s.clamp(min=torch.finfo(s.dtype).tiny).log_()
        return s.sum(-1), logs.mul_(s).sum(-1)

    @staticmethod
    def backward(ctx, g_sum, g_slogs):
        (s,) = ctx.saved_tensors
        if g_sum is None and g_slogs is None:
            return None
        if g_slogs is None:
            grad = g_sum.unsqueeze(-1).expand_as(s).clone()
        else:
            grad = s.clamp(min=torch.finfo(s.dtype).tiny).log_().add_(1.0).mul_(g_slogs.unsqueeze(-1))
            if g_sum is not None:
                grad.add_(g_sum.unsqueeze(-1))
        return torch.ops.aten.threshold_backward(grad, s, 0.0)


def row_mass_terms(weights: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """``(row_sum, row_slogs)`` of non-negative weights ``(B, H, T, S)`` -> two ``(B, H, T)``
    tensors of at least float32 precision (half is upcast, float64 kept); negative weights
    (GeLU / Leaky ReLU variants) are clamped to 0 first."""
    s = weights.float() if weights.dtype in (torch.float16, torch.bfloat16) else weights
    return RowMassTerms.apply(s.clamp_min(0.0))


def entropy_from_terms(row_sum: torch.Tensor, row_slogs: torch.Tensor) -> torch.Tensor:
    """``H(s_bar)`` in nats from the two row sums (any shape); meaningless on null rows."""
    z = row_sum.clamp_min(ROW_EPS)
    return torch.log(z) - row_slogs / z
