"""Pairwise L1 attention scores without materialising the ``(B, H, T, S, d)`` differences.

Shape legend: B batch, H heads, T queries, S keys, d head dimension (the paper's ``k_h``).

E-ATT eq. 13 scores a query/key pair by ``-||q_i - k_j||_1 / sqrt(k_h)``.  Broadcasting
``q[..., :, None, :] - k[..., None, :, :]`` needs ``B*H*T*S*d`` elements -- 64x the score matrix
at ``d = 64`` -- and autograd would keep it for the backward pass.  :func:`l1_scores` processes
blocks of queries so that a block's differences hold at most ``max_elems`` elements, and its
backward recomputes the signs block by block (nothing but ``q`` and ``k`` is saved), so the peak
extra memory is ``O(max_elems)`` whatever T and S are.

``torch.cdist(p=1)`` also avoids the 5-D tensor (a dedicated kernel, forward and backward).
``scripts/bench_eatt_l1.py`` measured on CPU (H 8, d 64, forward + backward, extra peak memory
relative to broadcasting): L=1024: broadcast 6246 MiB / 29.3 s, cdist 202 MiB / 2.1 s, chunked
301 MiB / 4.0 s.  So the attention functions call :func:`l1_scores` with ``impl="cdist"``; the
chunked kernel (the default of :func:`l1_scores`, checked against ``cdist`` in the tests)
bounds memory by ``max_elems`` explicitly on any backend.
"""

import torch

__all__ = ["l1_scores", "DEFAULT_MAX_ELEMS"]

#: elements of one block's (B, H, Tc, S, d) difference tensor (16 MiB in float32)
DEFAULT_MAX_ELEMS = 1 << 22


def _block(B, H, T, S, d, max_elems):
    return max(1, min(T, max_elems // max(1, B * H * S * d)))


class _L1Scores(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, scale, max_elems):
        B, H, T, d = q.shape
        S = k.size(2)
        tc = _block(B, H, T, S, d, max_elems)
        out = q.new_empty(B, H, T, S)
        kk = k.unsqueeze(2)  # (B, H, 1, S, d)
        for t0 in range(0, T, tc):
            diff = q[:, :, t0:t0 + tc].unsqueeze(3) - kk  # (B, H, Tc, S, d)
            out[:, :, t0:t0 + tc] = diff.abs_().sum(-1)
        ctx.save_for_backward(q, k)
        ctx.scale, ctx.tc = scale, tc
        return out.mul_(-scale)

    @staticmethod
    def backward(ctx, grad):
        q, k = ctx.saved_tensors
        scale, tc = ctx.scale, ctx.tc
        T = q.size(2)
        gq = torch.empty_like(q) if ctx.needs_input_grad[0] else None
        gk = torch.zeros_like(k) if ctx.needs_input_grad[1] else None
        kk = k.unsqueeze(2)
        g = grad * (-scale)  # d score / d |q - k|_1
        for t0 in range(0, T, tc):
            sgn = torch.sign(q[:, :, t0:t0 + tc].unsqueeze(3) - kk)  # (B, H, Tc, S, d)
            gc = g[:, :, t0:t0 + tc]  # (B, H, Tc, S)
            if gq is not None:  # sum_j g_ij sign(q_i - k_j)
                gq[:, :, t0:t0 + tc] = torch.einsum("bhts,bhtsd->bhtd", gc, sgn)
            if gk is not None:  # -sum_i g_ij sign(q_i - k_j)
                gk -= torch.einsum("bhts,bhtsd->bhsd", gc, sgn)
        return gq, gk, None, None


def l1_scores(q: torch.Tensor, k: torch.Tensor, scale: float, max_elems: int = DEFAULT_MAX_ELEMS,
              impl: str = "chunked") -> torch.Tensor:
    """``-scale * ||q_i - k_j||_1`` for all pairs (E-ATT eq. 13 with ``scale = k_h^-1/2``).

    Args:
        q: ``(B, H, T, d)``; k: ``(B, H, S, d)`` (same B, H, d, dtype, device).
        scale: positive float.
        max_elems: cap on the elements of one block of differences (memory knob).
        impl: ``"chunked"`` (this module's kernel) or ``"cdist"`` (``torch.cdist(p=1)``).

    Returns:
        ``(B, H, T, S)`` scores in q's dtype.  The gradient uses ``sign(0) = 0`` (as
        ``torch.cdist`` does).  ``cdist`` has no half-precision kernel: float16/bfloat16 inputs
        are computed in float32 and the scores rounded back to q's dtype.

    Raises:
        ValueError: shapes do not match, or unknown ``impl`` (the message lists the choices).
    """
    if impl not in ("chunked", "cdist"):
        raise ValueError(f"unknown impl {impl!r}; valid choices: chunked, cdist")
    if q.dim() != 4 or k.dim() != 4 or q.shape[:2] != k.shape[:2] or q.size(-1) != k.size(-1):
        raise ValueError(f"l1_scores needs q (B, H, T, d) and k (B, H, S, d); got {tuple(q.shape)}, "
                         f"{tuple(k.shape)}")
    if impl == "cdist":
        if q.dtype in (torch.float16, torch.bfloat16):
            return (torch.cdist(q.float(), k.float(), p=1) * (-float(scale))).to(q.dtype)
        return torch.cdist(q, k, p=1) * (-float(scale))
    return _L1Scores.apply(q, k, float(scale), int(max_elems))
