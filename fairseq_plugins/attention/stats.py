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

from .masks import combined_mask

__all__ = ["valid_keys", "keys_per_query", "row_mass_terms", "RowMassTerms", "entropy_from_terms", "ROW_EPS",
           "ENTROPY_FLOOR",
           "ReluFormerRowTerms", "reluformer_row_terms"]

#: floor of ``sum s`` inside ReLUFormer's eq. 7 terms: ``log(max(sum s, ROW_EPS))``.  Rows above it
#: are exact (the entropy statistics floor it at :data:`ENTROPY_FLOOR` instead:
#: :func:`entropy_from_terms`);
#: null rows (``sum s = 0``) never reach a log unmasked: they are excluded from entropy means and
#: from ReLUFormer's eq. 7 terms and counted by the null rate instead.
ROW_EPS = 1e-6
#: floor of ``sum s`` in the entropy statistics (:func:`entropy_from_terms`): float32's smallest
#: normal number, for every dtype (the Triton kernels use the same constant; half-precision row
#: sums are float32)
ENTROPY_FLOOR = float(torch.finfo(torch.float32).tiny)


def valid_keys(mask: Optional[torch.Tensor], src_len: int, device=None) -> torch.Tensor:
    """Number of keys each query may attend to, ``n_i`` of ReLUFormer (Shen et al. 2023) eq. 6,
    counted from a dense mask (any mask: this scans it; see :func:`keys_per_query` for the
    seam's ``(key_padding_mask, causal)`` pair, which needs no scan of a ``(T, S)`` mask).

    Args:
        mask: bool ``(B|1, H|1, T|1, S)`` (True = blocked) or None.
        src_len: ``S``.
        device: where the result of ``mask=None`` is built (default CPU); ignored with a mask
            (the result is on the mask's device).

    Returns:
        float32 ``(B|1, H|1, T|1, 1)``, or a ``(1, 1, 1, 1)`` tensor holding ``S`` when
        ``mask`` is None.  Padding is not counted; under a causal mask query ``i`` gets
        ``i + 1`` (and during incremental decoding the cache length, which is the same).
    """
    if mask is None:
        return torch.full((1, 1, 1, 1), float(src_len), device=device)
    return (~mask).sum(dim=-1, keepdim=True, dtype=torch.float32)


def keys_per_query(mask: Optional[torch.Tensor], causal: bool, tgt_len: int, src_len: int,
                   device=None) -> torch.Tensor:
    """``n_i`` of ReLUFormer (Shen et al. 2023) eq. 6 for the attention seam's ``(mask, causal)``,
    from key counts and query positions: no ``(T, S)`` mask is scanned, nothing is read back to
    the host, and the result is built on the device.

    * no ``causal`` (or ``T <= 1``: incremental decoding, where the keys are the cache): ``n_i`` =
      the number of non-padding keys, the same for every query;
    * ``causal``: ``n_i`` = the number of non-padding keys ``j <= i + (S - T)``, read from a
      cumulative sum over the key padding at position ``i + (S - T)`` (0 where that is < 0), so
      right- and left-padded keys are both counted right (a left-padded sentence's first
      queries may see no key at all: ``n_i = 0``, a fully masked row).

    Args:
        mask: the key padding ``(B|1, H|1, 1, S)`` bool (True = padding), or a general mask
            ``(B|1, H|1, T, S)`` (then :func:`valid_keys` of its combination with ``causal``),
            or None.
        causal: block keys ``j > i + (S - T)`` for query ``i``.
        tgt_len, src_len: ``T`` and ``S``.
        device: where the result is built without a mask (with one: the mask's device).

    Returns:
        float32 ``(B|1, H|1, T|1, 1)``: equal to ``valid_keys(combined_mask(mask, causal, T, S), S)``.
    """
    T, S = tgt_len, src_len
    if causal and T <= 1:
        causal = False  # the pattern blocks nothing for a single query
    if mask is not None and mask.size(-2) != 1:
        return valid_keys(combined_mask(mask, causal, T, S), S)
    if not causal:
        return valid_keys(mask, S, device=device)
    if mask is not None:
        device = mask.device
    last = torch.arange(T, device=device) + (S - T)  # (T,): the last key query i may see
    if mask is None:
        return (last + 1).clamp_(0, S).to(torch.float32).view(1, 1, T, 1)
    if S == 0:
        return torch.zeros(*mask.shape[:-2], T, 1, device=device)
    seen = (~mask).cumsum(-1, dtype=torch.int32)  # (B|1, H|1, 1, S): non-padding keys <= j
    idx = last.clamp(0, S - 1).view(*([1] * (mask.dim() - 1)), T).expand(*mask.shape[:-2], 1, T)
    n = seen.gather(-1, idx).masked_fill_((last < 0).view(*([1] * (mask.dim() - 1)), T), 0)
    return n.to(torch.float32).transpose(-1, -2)  # (B|1, H|1, T, 1)


class RowMassTerms(torch.autograd.Function):
    """``(sum_j s_ij, sum_j s_ij log s_ij)`` over the last dim of ``s >= 0`` (``0 log 0 = 0``).

    A hand-written backward (``g_sum + g_slogs (log s + 1)`` where ``s > 0``, 0 elsewhere) that
    saves only ``s`` -- which the surrounding attention saves anyway -- instead of autograd's
    chain of ``(T, S)`` intermediates.  ``log`` is taken of ``max(s, tiny)``: exact, NaN-free
    and fast (log of exact zeros takes a ~8x slower path).

    The two row sums are accumulated and returned in at least float32 (float16/bfloat16 ``s`` ->
    float32 sums, float32/float64 kept), with no float32 copy of ``s``: the reduction itself
    writes float32 (``sum(dtype=)``), so half-precision attention gives eq. 7 and the entropy
    statistics float32 row terms (ReLUFormer, Shen et al. 2023, eq. 7); backward casts the
    ``(..)``-shaped incoming gradients to ``s``'s dtype before touching ``(.., S)`` tensors.
    """

    @staticmethod
    def forward(ctx, s):
        ctx.set_materialize_grads(False)
        ctx.save_for_backward(s)
        acc = torch.promote_types(s.dtype, torch.float32)  # half -> float32 sums, no copy of s
        logs = s.clamp(min=torch.finfo(s.dtype).tiny).log_()
        return s.sum(-1, dtype=acc), logs.mul_(s).sum(-1, dtype=acc)

    @staticmethod
    def backward(ctx, g_sum, g_slogs):
        (s,) = ctx.saved_tensors
        if g_sum is None and g_slogs is None:
            return None
        # the row gradients arrive in the sums' dtype (float32 for half s): cast the small
        # (..) tensors, not the (.., S) ones (a no-op for float32/float64 s)
        if g_sum is not None:
            g_sum = g_sum.to(s.dtype)
        if g_slogs is None:
            grad = g_sum.unsqueeze(-1).expand_as(s).clone()
        else:
            grad = s.clamp(min=torch.finfo(s.dtype).tiny).log_().add_(1.0).mul_(g_slogs.to(s.dtype).unsqueeze(-1))
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
    """``H(s_bar) = log z - (sum s log s) / z`` in nats from the two row sums (any shape), with
    ``z = sum s`` floored at :data:`ENTROPY_FLOOR` (1.2e-38), not at ``ROW_EPS``: the entropy of
    ``s_bar = s / sum s`` does not depend on the scale of ``s``, so a live row of tiny mass has its
    true entropy (at ``ROW_EPS`` a one-key row of mass 1e-8 came out as -13.6 nats instead of 0).
    A statistic (no caller differentiates it); meaningless on null rows; float32 for half-precision
    sums, else their dtype."""
    if row_sum.dtype in (torch.float16, torch.bfloat16):  # float16 cannot hold the floor: float32
        row_sum, row_slogs = row_sum.float(), row_slogs.float()
    z = row_sum.clamp_min(ENTROPY_FLOOR)
    return torch.log(z) - row_slogs / z


class ReluFormerRowTerms(torch.autograd.Function):
    """Sums over the live rows of ReLUFormer's (Shen et al. 2023) eq. 7 terms, in few kernels.

    Forward: a row is *live* when it is ``valid`` (counted: it may see a key and is no query
    padding) and has mass (``sum s > 0``: a null row has no distribution).  With
    ``z = max(sum s, ROW_EPS)`` and ``H = log z - (sum s log s) / z`` (the entropy of ``s_bar``
    for rows of mass ``>= ROW_EPS``), returns four float 0-d tensors: ``sum |log z|``,
    ``sum max(H - c log n, 0)`` and ``sum H`` over the live rows, and the number of live rows.
    All four are computed and returned in at least float32: float16/bfloat16 row sums are upcast
    first (``(B, H, T)`` tensors, not ``(.., S)``; their gradients are cast back), because a
    float16 count overflows to ``inf`` from 65,520 live rows (eq. 7 terms then averaged to 0, the
    null rate NaN) and a bfloat16 one is rounded to 8 bits (0.2 % off at 4K rows).
    The logged ``sum H`` takes each row's own entropy (:func:`entropy_from_terms`: ``z`` floored
    at :data:`ENTROPY_FLOOR` instead); the two eq. 7 terms keep the ``ROW_EPS`` floor, so a
    live row of mass below ``ROW_EPS`` (rare: every positive score of the row tiny) enters them
    with ``z = ROW_EPS`` -- its ``|log z|`` capped at ``-log ROW_EPS`` = 13.8 and its margin that of
    ``log ROW_EPS - slogs / ROW_EPS``, below its entropy -- and passes them no gradient on ``sum s``.
    Backward (hand-written, the same derivatives autograd takes through
    ``log(clamp_min(.)).abs()``, ``relu`` and :func:`entropy_from_terms`; ``sum H`` and the count
    are statistics and pass no gradient):

    * ``d/d sum s = live * [g_norm sgn(log z) / z + g_ent_margin [H > c log n] (1 + slogs / z) / z]``
      where ``sum s >= ROW_EPS`` (0 below: the clamp), and
    * ``d/d sum s log s = -live * g_ent_margin [H > c log n] / z``.

    On a GPU each elementwise op on the ``(B, H, T)`` row tensors is a launch of 5-10 µs of host
    time, and the reluformer layer was host-bound (H200 window of 2026-11-26: 91 CUDA launches a
    step against stock's 15, ``mt-bench-gpu --host-profile``), so the forward takes 12 ops (the
    live mask as ``sign(sum s) * valid``, the three sums from one stacked tensor, four outputs
    without ``select``s) and the backward 13; ``mt-bench-gpu --op-counts`` counts a layer's.  The
    Triton backend computes the same sums (and the counts the caller adds) in one kernel each way:
    :func:`fairseq_plugins.attention.triton.stats.reluformer_row_terms`, tested equal to this.
    """

    @staticmethod
    def forward(ctx, row_sum, row_slogs, c_log_n, valid):
        ctx.set_materialize_grads(False)
        # counts and sums over rows in float32 at least (a float16 count is inf from 65,520 rows)
        ctx.in_dtype = row_sum.dtype if row_sum.dtype in (torch.float16, torch.bfloat16) else None
        if ctx.in_dtype is not None:
            row_sum, row_slogs = row_sum.float(), row_slogs.float()
        live_f = row_sum.sign().mul_(valid)  # 1 on live rows (sum s >= 0: sign is 0 or 1), else 0
        z = row_sum.clamp_min(ROW_EPS)
        log_z = z.log()
        ent = torch.addcdiv(log_z, row_slogs, z, value=-1.0)  # H = log z - slogs / z
        over = ent - c_log_n  # H - c log n: the margin's argument
        # the logged entropy: the row's own (z floored at ENTROPY_FLOOR, entropy_from_terms),
        # equal to ent where sum s >= ROW_EPS; slogs of rows that are not live (nonzero where a
        # half-precision sum underflowed) is zeroed first, so that / z stays finite there
        ent_stat = entropy_from_terms(row_sum, row_slogs * live_f).to(log_z.dtype)
        terms = torch.stack([log_z.abs(), over.clamp_min(0.0), ent_stat])  # (3, B, H, T), finite everywhere
        sums = terms.mul_(live_f).flatten(1).sum(1)  # (not a matrix-vector product: autocast would round it)
        count = live_f.sum()
        ctx.save_for_backward(row_sum, row_slogs, z, log_z, over, live_f)
        ctx.mark_non_differentiable(count)
        norm, margin, entropy = sums.unbind(0)
        return norm, margin, entropy, count

    @staticmethod
    def backward(ctx, g_norm, g_margin, g_ent, g_count):
        if g_norm is None and g_margin is None:
            return None, None, None, None
        row_sum, row_slogs, z, log_z, over, live_f = ctx.saved_tensors
        inv_z = live_f / z  # live / z
        if g_margin is not None:
            m = (over > 0).mul(inv_z).mul_(g_margin)  # g_margin [H > c log n] live / z
            d_sum = torch.addcmul(m, m, row_slogs / z)  # m (1 + slogs / z)
            d_slogs = m.neg()
        else:
            d_sum, d_slogs = torch.zeros_like(row_sum), None
        if g_norm is not None:
            d_sum.add_(log_z.sign().mul_(inv_z).mul_(g_norm))
        d_sum = d_sum.mul_(row_sum >= ROW_EPS)
        if ctx.in_dtype is not None:  # half-precision rows: gradients in their dtype
            d_sum = d_sum.to(ctx.in_dtype)
            d_slogs = None if d_slogs is None else d_slogs.to(ctx.in_dtype)
        return d_sum, d_slogs, None, None


def reluformer_row_terms(row_sum: torch.Tensor, row_slogs: torch.Tensor, n: torch.Tensor, valid: torch.Tensor,
                         entropy_c: float) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """ReLUFormer eq. 7 (Shen et al. 2023) summed over the live rows (:class:`ReluFormerRowTerms`):
    four float 0-d tensors ``(sum |log sum s|, sum max(H(s_bar) - c log n, 0), sum H(s_bar), live rows)``;
    the first two are differentiable w.r.t. the row sums, the last two are statistics.

    Args:
        row_sum, row_slogs: ``(B, H, T)`` ``sum_j s_j`` and ``sum_j s_j log s_j``: float32 or
            float64 (kept), or float16/bfloat16 (upcast to float32 here: the sums and the count
            are float32 at least, whatever the rows' dtype).
        n: valid keys per query, broadcastable to ``(B, H, T)`` (``n_i`` of eq. 6).
        valid: ``(B, H, T)`` bool, the counted rows (a key visible, no query padding); the live
            ones among them (``sum s > 0``) enter the sums.
        entropy_c: ``c`` of the entropy bound ``c log n`` (Appendix A: 0.7).
    """
    # in the rows' dtype, at least float32 (as the Triton kernel: float64 rows stay exact)
    c_log_n = n.to(torch.promote_types(row_sum.dtype, torch.float32)).clamp_min(1.0).log().mul_(entropy_c)
    return ReluFormerRowTerms.apply(row_sum, row_slogs, c_log_n, valid)
