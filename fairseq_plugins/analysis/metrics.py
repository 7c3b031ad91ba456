"""The papers' attention metrics, as pure functions on weight tensors.

Shape legend: B batch, H heads, T query length, S key length, P number of top-p values.
Every function takes the weights ``w`` ``(B, H, T, S)`` and a bool ``mask`` broadcastable to
``(B, H, T, S)``, True where the (query, key) pair is *not* valid (padded key, future
position, padded query) -- what :class:`~fairseq_plugins.analysis.capture.AttentionCapture`
returns.  A *valid query row* has at least one valid key.  Positions under the mask are
ignored whatever their value.

Streaming: the ``*_terms`` functions return a numerator and a denominator (per head ``(H,)``
or scalar) that add up over batches; the rate/mean functions divide them for one batch.
Units: rates are fractions in [0, 1]; entropies and divergences are in nats.
"""

from typing import Optional, Sequence, Tuple

import torch
import torch.nn.functional as F

from ..attention.stats import entropy_from_terms, row_mass_terms

__all__ = [
    "sparsity_terms", "sparsity_rate",
    "null_terms", "null_rate", "sentence_null_rate",
    "js_divergence_terms", "js_divergence", "head_distributions",
    "entropy_terms", "attention_entropy",
    "top_p_terms", "top_p_score_sum",
    "anisotropy", "ffn_anisotropy",
]


def _prep(w: torch.Tensor, mask: Optional[torch.Tensor]):
    """float weights zeroed under the mask, the full mask ``(B, H, T, S)`` and valid rows ``(B, H, T)``."""
    if w.dim() != 4:
        raise ValueError(f"weights must be (B, H, T, S), got shape {tuple(w.shape)}")
    w = w.float()
    if mask is None:
        mask = torch.zeros_like(w, dtype=torch.bool)
    mask = mask.to(torch.bool).expand_as(w)
    w = w.masked_fill(mask, 0.0)
    valid_row = (~mask).any(dim=-1)
    return w, mask, valid_row


def _ratio(terms):
    num, den = terms
    return num / den.clamp_min(1)


def sparsity_terms(w: torch.Tensor, mask: Optional[torch.Tensor]) -> Tuple[torch.Tensor, torch.Tensor]:
    """Zero count and valid-position count per head: two ``(H,)`` float64 tensors.

    Sparsity rate (ReLA Section 5.2, Figure 3): the fraction of attention weights exactly equal
    to 0 among the valid (query, key) positions; ReLA averages it over the heads of a layer.
    """
    w, mask, _ = _prep(w, mask)
    valid = ~mask
    zeros = (valid & (w == 0)).sum(dim=(0, 2, 3), dtype=torch.float64)
    return zeros, valid.sum(dim=(0, 2, 3), dtype=torch.float64)


def sparsity_rate(w, mask) -> torch.Tensor:
    """Sparsity rate per head ``(H,)`` (see :func:`sparsity_terms`)."""
    return _ratio(sparsity_terms(w, mask))


def null_terms(w: torch.Tensor, mask: Optional[torch.Tensor]) -> Tuple[torch.Tensor, torch.Tensor]:
    """Null-row count and valid-row count per head: two ``(H,)`` float64 tensors.

    Null rate (ReLA Section 5.2, Figure 6): the fraction of valid query rows whose weights are
    all exactly 0 ("null attention": the head is switched off for that query).  Softmax-type
    functions have a null rate of 0 by construction.
    """
    w, mask, valid_row = _prep(w, mask)
    null = valid_row & (w == 0).all(dim=-1)
    return null.sum(dim=(0, 2), dtype=torch.float64), valid_row.sum(dim=(0, 2), dtype=torch.float64)


def null_rate(w, mask) -> torch.Tensor:
    """Null rate per head ``(H,)`` (see :func:`null_terms`)."""
    return _ratio(null_terms(w, mask))


def sentence_null_rate(w: torch.Tensor, mask: Optional[torch.Tensor]) -> torch.Tensor:
    """Null rate of each sentence ``(B,)``: null rows / valid rows over all heads and queries
    of that sentence (ReLA Section 5.2 ranks corpus pairs by it, averaged over cross layers).
    A sentence without any valid row gets NaN."""
    w, mask, valid_row = _prep(w, mask)
    null = (valid_row & (w == 0).all(dim=-1)).sum(dim=(1, 2), dtype=torch.float64)
    n = valid_row.sum(dim=(1, 2), dtype=torch.float64)
    return torch.where(n > 0, null / n.clamp_min(1), torch.full_like(n, float("nan")))


def head_distributions(w: torch.Tensor, mask: Optional[torch.Tensor], renormalize: bool,
                       tau: float = 1.0) -> Tuple[torch.Tensor, torch.Tensor]:
    """Per-head distributions over ``S + 1`` positions (the last one a dummy), ``(B, H, T, S+1)``,
    and the valid rows ``(B, H, T)``.

    ``renormalize=False`` (softmax, sparsemax, entmax): the weights themselves, dummy mass 0.
    ``renormalize=True`` (ReLA and other non-distributions; ReLA Section 5.2, Table 6):
    ``softmax(alpha^tau)`` over the valid keys, and a null row (all weights 0) becomes a one-hot
    on the dummy position (entropy 0).  ``alpha^tau`` is read literally from the paper as a
    power (smaller ``tau`` -> smoother distribution, as the paper says); negative weights
    (GeLU / Leaky-ReLU variants) are clamped to 0 first.

    Raises:
        ValueError: ``tau <= 0``.
    """
    if tau <= 0:
        raise ValueError(f"tau must be > 0, got {tau}")
    w, mask, valid_row = _prep(w, mask)
    if renormalize:
        a = w.clamp_min(0.0)
        null = valid_row & (a == 0).all(dim=-1)
        x = a.pow(tau).masked_fill(mask, float("-inf"))
        x = x.masked_fill(~valid_row.unsqueeze(-1), 0.0)  # rows without keys: avoid NaN
        p = F.softmax(x, dim=-1).masked_fill(mask, 0.0)
        p = p.masked_fill(null.unsqueeze(-1), 0.0)
        dummy = null.to(p.dtype).unsqueeze(-1)
    else:
        p = w
        dummy = torch.zeros_like(w[..., :1])
    return torch.cat([p, dummy], dim=-1), valid_row


def _entropy(p: torch.Tensor) -> torch.Tensor:
    """``-sum p log p`` over the last dim with ``0 log 0 = 0``."""
    return -(p * p.clamp_min(torch.finfo(p.dtype).tiny).log()).sum(-1)


def js_divergence_terms(w: torch.Tensor, mask: Optional[torch.Tensor], renormalize: bool,
                        tau: float = 1.0) -> Tuple[torch.Tensor, torch.Tensor]:
    """Sum over valid query rows of the heads' generalized JS divergence, and the row count
    (two float64 scalars).

    Head diversity (Correia et al. 2019, Section 5.2, following ReLA Section 5.2, Figure 5 and
    Table 6): for a query with per-head distributions ``p_1..p_H``,
    ``JS = H(1/H sum_h p_h) - 1/H sum_h H(p_h)`` (nats; 0 for one head or identical heads,
    at most ``log H``).  Distributions come from :func:`head_distributions`.  A query counts
    when it is valid in every head (masks do not depend on the head).
    """
    p, valid_row = head_distributions(w, mask, renormalize, tau)  # (B, H, T, S+1)
    js = _entropy(p.mean(dim=1)) - _entropy(p).mean(dim=1)  # (B, T)
    rows = valid_row.all(dim=1)
    return js.double()[rows].sum(), rows.sum(dtype=torch.float64)


def js_divergence(w, mask, renormalize: bool, tau: float = 1.0) -> torch.Tensor:
    """Mean JS divergence over heads (scalar, nats); see :func:`js_divergence_terms`."""
    return _ratio(js_divergence_terms(w, mask, renormalize, tau))


def entropy_terms(w: torch.Tensor, mask: Optional[torch.Tensor]) -> Tuple[torch.Tensor, torch.Tensor]:
    """Sum of ``H(s_bar)`` over valid non-null rows and their count, per head: ``(H,)`` float64.

    ReLUFormer Section 4.2 (Tables 3 and 5): ``H(s) = -sum_i s_i log s_i`` of the weights
    renormalised to sum 1, ``s_bar = s / sum s`` (a no-op for softmax-type functions); null
    rows have no distribution and are left out.  Computed by
    :func:`fairseq_plugins.attention.stats.row_mass_terms`, as the in-training log is.
    """
    w, mask, valid_row = _prep(w, mask)
    row_sum, row_slogs = row_mass_terms(w)
    live = valid_row & (row_sum > 0)
    ent = torch.where(live, entropy_from_terms(row_sum, row_slogs), 0.0)
    return ent.sum(dim=(0, 2), dtype=torch.float64), live.sum(dim=(0, 2), dtype=torch.float64)


def attention_entropy(w, mask) -> torch.Tensor:
    """Mean entropy per head ``(H,)`` in nats (see :func:`entropy_terms`)."""
    return _ratio(entropy_terms(w, mask))


def top_p_terms(w: torch.Tensor, mask: Optional[torch.Tensor], ps: Sequence[float]
                ) -> Tuple[torch.Tensor, torch.Tensor]:
    """Sum over valid non-null rows of the top-p % score sum, ``(P, H)`` float64, and the row
    count ``(H,)``.

    ReLUFormer Section 3.4 (Figures 2 and 4): sort a row's renormalised weights
    ``s_bar = s / sum s`` in descending order and sum the largest ``k = ceil(p/100 * n)``
    (at least 1) of them, ``n`` the row's number of valid keys.  Higher = more centralized.

    Raises:
        ValueError: a ``p`` outside ``(0, 100]``.
    """
    for p in ps:
        if not 0 < p <= 100:
            raise ValueError(f"top-p percentages must be in (0, 100], got {p}")
    w, mask, valid_row = _prep(w, mask)
    w = w.clamp_min(0.0)
    total = w.sum(-1, keepdim=True)
    live = valid_row & (total.squeeze(-1) > 0)
    s = torch.where(total > 0, w / total.clamp_min(torch.finfo(w.dtype).tiny), 0.0)
    s = s.masked_fill(mask, -1.0)  # masked keys sort last
    cum = s.sort(dim=-1, descending=True).values.clamp_min(0.0).cumsum(-1)  # (B, H, T, S)
    n = (~mask).sum(-1)  # (B, H, T)
    out = []
    for p in ps:
        k = torch.ceil(n.double() * (p / 100.0)).long().clamp(min=1, max=w.size(-1))
        v = cum.gather(-1, (k - 1).unsqueeze(-1)).squeeze(-1)
        out.append(torch.where(live, v, 0.0).sum(dim=(0, 2), dtype=torch.float64))
    return torch.stack(out), live.sum(dim=(0, 2), dtype=torch.float64)


def top_p_score_sum(w, mask, ps) -> torch.Tensor:
    """Mean top-p % score sum ``(P, H)`` (see :func:`top_p_terms`)."""
    num, den = top_p_terms(w, mask, ps)
    return num / den.clamp_min(1)


def anisotropy(values: torch.Tensor) -> float:
    """Anisotropy of value slots (ReLUFormer eq. 4, Figure 3; Ethayarajh 2019).

    ``ANI = 1/(d (d-1)) sum_{i != j} cos(V_i, V_j)`` over the ``d`` slots ``V_i``.

    Args:
        values: ``(d, C)`` -- one value slot per row (for an FFN, the columns of ``fc2.weight``,
            i.e. ``fc2.weight.t()``: slot ``i`` is what hidden unit ``i`` adds to the output).

    Raises:
        ValueError: fewer than two slots.
    """
    if values.dim() != 2 or values.size(0) < 2:
        raise ValueError(f"values must be (d, C) with d >= 2, got shape {tuple(values.shape)}")
    v = F.normalize(values.double(), dim=-1)
    cos = v @ v.t()
    d = v.size(0)
    return float((cos.sum() - cos.diagonal().sum()) / (d * (d - 1)))


def ffn_anisotropy(model) -> dict:
    """ANI (eq. 4) of every FFN's value slots: ``{"encoder": [per layer], "decoder": [...]}``.

    Layers as in :mod:`fairseq_plugins.analysis.ffn_variance` (``model.encoder.layers``,
    ``model.decoder.layers``); slot ``i`` of a layer is column ``i`` of ``fc2.weight``
    ``(C, d_ff)``.
    """
    out = {}
    for kind, part in (("encoder", model.encoder), ("decoder", model.decoder)):
        out[kind] = [anisotropy(layer.fc2.weight.detach().t()) for layer in getattr(part, "layers", [])]
    return out
