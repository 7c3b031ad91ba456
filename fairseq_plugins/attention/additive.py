"""Additive (Bahdanau) attention for the RNNsearch model: global, local-p and flexible attention.

Shape legend: B batch (hypotheses), S source length, W window width (max over the batch),
N number of (hypothesis, source position) pairs actually scored, A attention dimension,
C encoder state dimension (2 x encoder hidden size), Q query dimension (decoder hidden size),
E target embedding dimension.  Source positions ``s`` are 0-based and the source is
right-padded (the encoder converts fairseq's left padding), so ``s`` is a position in the
sentence; ``lengths`` ``(B,)`` counts the non-pad positions.

One decoding step ``t`` (Shu & Nakayama 2017, "Reducing Redundant Computations with Flexible
Attention", Section 2-3):

* :meth:`AdditiveAttention.score` -- eq. 3, ``score(h_{t-1}, h̄_s) = v_a^T tanh(W_a [h_{t-1}; h̄_s])``,
  computed as ``v_a^T tanh(W_q h_{t-1} + K_s)`` with ``K_s = W_k h̄_s + b`` precomputed once per
  sentence (:meth:`AdditiveAttention.keys`; the paper caches it too, Section 5.5);
* :meth:`AdditiveAttention.normalize` -- the plugin's registered ``softmax`` normaliser
  (:mod:`fairseq_plugins.attention.functions`), with its masking semantics: ``True`` in the mask
  = not attendable, exact zeros there, zeros (never NaN) on a fully masked row;
* ``global``: eq. 2, softmax over every source position;
* ``flexible``: eqs. 4-8, ``a_t = softmax(score - g(t) (s - p_{t-1})^2 / (2 sigma^2))``,
  ``p_t = sum_s a_t(s) s``, ``g(t) = sigmoid(v_g^T tanh(W_g [h_{t-1}; i_t]) + b_g)``.  With a
  finite threshold ``tau`` only the positions of :func:`flexible_window` are scored (Section 3.1);
  the rest are never passed to :meth:`score`;
* ``local_p``: Luong et al. 2015 (eqs. 10-11 of the paper): ``p_t = (len - 1) sigmoid(v_p^T tanh(W_p h_{t-1}))``
  (0-based form of ``S sigmoid(.)``), softmax over the window ``[p_t - D, p_t + D]`` only (scored by
  gathering it, like the flexible window), multiplied by ``exp(-(s - p_t)^2 / (2 (D/2)^2))``
  after the softmax.  The query is ``h_{t-1}`` (as for every score here), where Luong's
  input-feeding model uses ``h_t``.

Decoding one hypothesis (``B = 1``, e.g. the paper's sentence-by-sentence timing of Table 3) takes a
lean path (:meth:`AdditiveAttention._single_window_step`): the window bounds are Python numbers
(:func:`flexible_bounds` / :func:`local_p_bounds`, equal to the tensor functions), the window is
a slice of the cached keys and values, and no gather / scatter bookkeeping runs, so a step costs
a handful of small tensor ops besides the ``W`` scored positions.

``p_0`` (the flexible focus before the first step) is position 0, the first source word:
translation starts at the beginning of the sentence in most pairs, and with ``g(1)`` learned from
``i_1`` (the BOS embedding, a constant) the model can open the first window as wide as it needs.
"""

import math
from typing import NamedTuple, Optional

import torch
import torch.nn as nn

from ..modules.auxiliary import AuxiliaryBuffer
from .functions import build_attention_fn

__all__ = ["ATTENTION_KINDS", "AdditiveAttention", "AttentionStep", "WindowStats", "flexible_bounds", "flexible_window",
           "local_p_bounds", "local_p_window"]

#: valid values of ``--rnn-attention``
ATTENTION_KINDS = ("global", "local_p", "flexible")


def _clip_window(lo: torch.Tensor, hi: torch.Tensor, centre: torch.Tensor, lengths: torch.Tensor):
    """Clip float bounds to ``[0, len - 1]``; an empty window becomes the position nearest ``centre``."""
    last = (lengths - 1).to(lo.dtype)
    lo = torch.minimum(lo.clamp_min(0.0), last)
    hi = torch.minimum(hi.clamp_min(0.0), last)
    near = torch.minimum(torch.round(centre).clamp_min(0.0), last)
    empty = lo > hi
    lo = torch.where(empty, near, lo)
    hi = torch.where(empty, near, hi)
    return lo.long(), hi.long()


def flexible_window(p_prev: torch.Tensor, g: torch.Tensor, sigma: float, tau: float,
                    lengths: torch.Tensor):
    """Positions whose penalty is below ``tau`` (Flexible Attention, Section 3.1).

    ``penalty(s) = g (s - p_{t-1})^2 / (2 sigma^2) < tau``  <=>
    ``s in (p_{t-1} - sigma sqrt(2 tau / g), p_{t-1} + sigma sqrt(2 tau / g))`` (open interval).

    Args:
        p_prev: ``(B,)`` float, previous focus ``p_{t-1}``.
        g: ``(B,)`` float in (0, 1), penalty strength ``g(t)``; ``g = 0`` gives the whole sentence.
        sigma, tau: positive floats (``tau = inf`` gives the whole sentence).
        lengths: ``(B,)`` long, source lengths (>= 1).

    Returns:
        ``(lo, hi)``: ``(B,)`` long, inclusive integer bounds within ``[0, len - 1]``.  When no
        integer lies inside the open interval (radius <= 0.5) the window is the one position
        nearest ``p_{t-1}``, so every step attends to something.
    """
    # float64, so the bounds equal those of the scalar flexible_bounds (Python floats) exactly
    g = g.double()
    radius = sigma * torch.sqrt(2.0 * tau / g)  # g = 0 -> inf
    p = p_prev.double()
    lo = torch.floor(p - radius) + 1.0  # smallest integer > p - r
    hi = torch.ceil(p + radius) - 1.0  # largest integer < p + r
    return _clip_window(lo, hi, p, lengths)


def local_p_window(p_t: torch.Tensor, d: int, lengths: torch.Tensor):
    """Luong et al.'s local-p window ``[p_t - D, p_t + D]`` as inclusive integer bounds ``(B,)``
    clipped to ``[0, len - 1]`` (the integers ``s`` with ``|s - p_t| <= D``)."""
    p = p_t.float()
    return _clip_window(torch.ceil(p - d), torch.floor(p + d), p, lengths)


def _clip_bounds(lo: float, hi: float, centre: float, length: int):
    """Scalar :func:`_clip_window`: float bounds -> inclusive ints within ``[0, length - 1]``."""
    last = float(length - 1)
    lo, hi = min(max(lo, 0.0), last), min(max(hi, 0.0), last)
    if lo > hi:  # empty: the position nearest the centre (round half to even, as torch.round)
        lo = hi = min(max(float(round(centre)), 0.0), last)
    return int(lo), int(hi)


def flexible_bounds(p_prev: float, g: float, sigma: float, tau: float, length: int):
    """:func:`flexible_window` for one hypothesis, on Python numbers (no tensor op).

    Same open interval ``(p_{t-1} - sigma sqrt(2 tau / g), p_{t-1} + sigma sqrt(2 tau / g))``,
    computed in float64 like :func:`flexible_window`, so both give the same bounds.

    Args:
        p_prev: ``p_{t-1}``; g: ``g(t)`` in [0, 1]; sigma, tau: positive (``tau`` may be inf);
        length: source length (>= 1).

    Returns:
        ``(lo, hi)`` ints, inclusive, within ``[0, length - 1]``.
    """
    if g <= 0.0 or math.isinf(tau):
        return 0, length - 1
    radius = sigma * math.sqrt(2.0 * tau / g)
    if math.isinf(radius):
        return 0, length - 1
    return _clip_bounds(math.floor(p_prev - radius) + 1.0, math.ceil(p_prev + radius) - 1.0, p_prev, length)


def local_p_bounds(p_t: float, d: int, length: int):
    """:func:`local_p_window` for one hypothesis on Python numbers: ``[p_t - D, p_t + D]``."""
    return _clip_bounds(float(math.ceil(p_t - d)), float(math.floor(p_t + d)), p_t, length)


class WindowStats:
    """Counters of the positions scored: ``positions`` (sum of window sizes), ``queries``
    (hypothesis-steps) and ``source`` (sum of source lengths over the same queries).  A plain
    object, so a report hook can hold it after the model is gone."""

    def __init__(self, kind: str, threshold: float):
        self.kind, self.threshold = kind, threshold
        self.positions = self.queries = self.source = 0

    def add(self, window: torch.Tensor, lengths: torch.Tensor) -> None:
        """Add one step: ``window`` and ``lengths`` ``(B,)``."""
        self.positions += int(window.sum())
        self.queries += int(window.numel())
        self.source += int(lengths.sum())

    def add_one(self, window: int, length: int) -> None:
        """Add one step of one hypothesis (Python ints)."""
        self.positions += window
        self.queries += 1
        self.source += length

    def average_window(self) -> float:
        return self.positions / self.queries if self.queries else math.nan

    def report(self) -> str:
        tau = "inf" if math.isinf(self.threshold) else f"{self.threshold:g}"
        return (f"[rnnsearch] {self.kind} attention (tau={tau}): average window {self.average_window():.2f} "
                f"positions per hypothesis-step over {self.queries} hypothesis-steps "
                f"(average source length {self.source / max(self.queries, 1):.2f})")


class AttentionStep(NamedTuple):
    """Result of one attention step.

    context ``(B, C)``; weights ``(B, S)`` (zeros outside the window); focus ``p_t`` ``(B,)``;
    gate ``g(t)`` ``(B,)`` (flexible) or None; window ``(B,)`` long, number of positions scored.
    """

    context: torch.Tensor
    weights: torch.Tensor
    focus: torch.Tensor
    gate: Optional[torch.Tensor]
    window: torch.Tensor


class AdditiveAttention(nn.Module):
    """Bahdanau attention with the global / local-p / flexible variants (see the module docstring).

    Args:
        query_dim: ``Q``, decoder hidden size.
        key_dim: ``C``, encoder state size.
        attn_dim: ``A``, width of ``W_a`` (and of ``W_g`` / ``W_p``).
        embed_dim: ``E``, size of the feedback embedding ``i_t`` (input of the flexible gate).
        kind: one of :data:`ATTENTION_KINDS`.
        sigma: ``sigma`` of the flexible penalty (eq. 6; paper best 1.5).
        threshold: ``tau`` (float, > 0; ``inf`` = no windowing).
        local_d: ``D`` of local-p (window ``2D + 1``, Gaussian ``sigma = D / 2``).

    Raises:
        ValueError: unknown ``kind`` (message lists the valid choices), ``sigma <= 0``,
            ``threshold <= 0`` or ``local_d < 1``.

    Window statistics: when :meth:`forward` is called with ``count=True`` (the decoder does so
    in incremental decoding, i.e. generation), the number of positions scored and the number
    of (hypothesis, step) queries are accumulated in ``self.stats`` (a :class:`WindowStats`);
    :meth:`average_window` is their ratio.
    """

    def __init__(self, query_dim: int, key_dim: int, attn_dim: int, embed_dim: int, kind: str = "global",
                 sigma: float = 1.5, threshold: float = math.inf, local_d: int = 10):
        super().__init__()
        if kind not in ATTENTION_KINDS:
            raise ValueError(f"unknown --rnn-attention {kind!r}; valid choices: {', '.join(ATTENTION_KINDS)}")
        self.kind = kind
        self.sigma = float(sigma)
        self.local_d = int(local_d)
        self.set_threshold(threshold)
        if self.sigma <= 0:
            raise ValueError(f"--flexible-sigma must be > 0, got {sigma}")
        if self.local_d < 1:
            raise ValueError(f"--local-window-d must be >= 1, got {local_d}")
        self.q_proj = nn.Linear(query_dim, attn_dim, bias=False)  # W_a, decoder-state half
        self.k_proj = nn.Linear(key_dim, attn_dim, bias=True)  # W_a, encoder-state half (+ bias)
        self.v = nn.Linear(attn_dim, 1, bias=False)  # v_a
        if kind == "flexible":
            self.gate_hidden = nn.Linear(query_dim + embed_dim, attn_dim, bias=False)  # W_g
            self.gate_out = nn.Linear(attn_dim, 1, bias=True)  # v_g, b_g
        elif kind == "local_p":
            self.pos_hidden = nn.Linear(query_dim, attn_dim, bias=False)  # W_p
            self.pos_out = nn.Linear(attn_dim, 1, bias=False)  # v_p
        # the plugin's softmax normaliser (masking: True = not attendable, zero rows never NaN)
        self.normalizer = build_attention_fn("softmax", 1, 1)
        self.aux = AuxiliaryBuffer()  # the fine-tuning term of eq. 9 (recorded by the decoder)
        self.reset_window_stats()

    # -- configuration and statistics ---------------------------------------------------------
    def set_threshold(self, threshold) -> None:
        """Set ``tau`` (float or a string such as ``"inf"``).

        Raises:
            ValueError: ``tau <= 0`` or not a number.
        """
        try:
            tau = float(threshold)
        except (TypeError, ValueError):
            raise ValueError(f"--flexible-threshold must be a positive number or inf, got {threshold!r}")
        if not tau > 0:
            raise ValueError(f"--flexible-threshold must be > 0 (inf = no threshold), got {threshold!r}")
        self.threshold = tau
        if getattr(self, "stats", None) is not None:
            self.stats.threshold = tau

    def reset_window_stats(self) -> None:
        """Zero the window counters (in place: a report hook holding ``self.stats`` sees it)."""
        if getattr(self, "stats", None) is None:
            self.stats = WindowStats(self.kind, self.threshold)
        self.stats.positions = self.stats.queries = self.stats.source = 0

    @property
    def window_queries(self) -> int:
        return self.stats.queries

    def average_window(self) -> float:
        """Average number of source positions scored per (hypothesis, step); NaN before any step."""
        return self.stats.average_window()

    @property
    def windowed(self) -> bool:
        """True when only a window of the source is scored (local-p, or flexible with finite tau)."""
        return self.kind == "local_p" or (self.kind == "flexible" and math.isfinite(self.threshold))

    # -- the two halves of the attention function ---------------------------------------------
    def keys(self, encoder_out: torch.Tensor) -> torch.Tensor:
        """``K = W_k h̄ + b``: encoder states ``(B, S, C)`` -> ``(B, S, A)``, computed once per sentence."""
        return self.k_proj(encoder_out)

    def score(self, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        """Eq. 3: ``v_a^T tanh(q + k)`` with ``q = W_q h_{t-1}``; ``(..., A)`` x ``(..., A)`` -> ``(...)``."""
        return self.v(torch.tanh(q + k)).squeeze(-1)

    def normalize(self, scores: torch.Tensor, mask: Optional[torch.Tensor]) -> torch.Tensor:
        """Softmax over the last dimension of ``scores`` ``(B, S|W)`` with bool ``mask`` (True =
        excluded): the registry's ``softmax`` normaliser."""
        return self.normalizer.normalize(scores, mask)

    def gate(self, query: torch.Tensor, prev_embed: torch.Tensor) -> torch.Tensor:
        """Eq. 8: ``g(t) = sigmoid(v_g^T tanh(W_g [h_{t-1}; i_t]) + b_g)``; ``(B, Q)``, ``(B, E)`` -> ``(B,)``."""
        return torch.sigmoid(self.gate_out(torch.tanh(self.gate_hidden(torch.cat([query, prev_embed], -1))))).squeeze(-1)

    def penalty(self, positions: torch.Tensor, p_prev: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
        """Eqs. 5-6: ``g (s - p_{t-1})^2 / (2 sigma^2)``; positions ``(B|1, S|W)``, p_prev/g ``(B,)``."""
        return g.unsqueeze(-1) * (positions - p_prev.unsqueeze(-1)) ** 2 / (2.0 * self.sigma ** 2)

    # -- one step -----------------------------------------------------------------------------
    def windowed_scores(self, q: torch.Tensor, keys: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor):
        """Score only the positions ``lo_b <= s <= hi_b`` of each hypothesis ``b``.

        The ``N = sum_b (hi_b - lo_b + 1)`` (hypothesis, position) pairs are gathered into one
        flat batch, so :meth:`score` runs on exactly ``N`` positions (never on ``B x S``).

        Args:
            q: ``(B, A)`` projected queries; keys: ``(B, S, A)``; lo, hi: ``(B,)`` long.

        Returns:
            scores ``(B, W)`` (``-inf`` in unused slots), positions ``(B, W)`` long (clamped
            into the window in unused slots), mask ``(B, W)`` bool (True = unused slot).
            (One hypothesis takes :meth:`_single_window_step`, a plain slice, instead.)
        """
        width = hi - lo + 1  # (B,)
        W = int(width.max())
        offs = torch.arange(W, device=q.device)  # (W,)
        mask = offs.unsqueeze(0) >= width.unsqueeze(1)  # (B, W)
        positions = torch.minimum(lo.unsqueeze(1) + offs.unsqueeze(0), hi.unsqueeze(1))  # (B, W)
        b, o = (~mask).nonzero(as_tuple=True)  # (N,), (N,)
        e = self.score(q[b], keys[b, positions[b, o]])  # (N,)
        scores = q.new_full(mask.shape, float("-inf")).index_put((b, o), e)  # (B, W)
        return scores, positions, mask

    def forward(self, query: torch.Tensor, prev_embed: torch.Tensor, keys: torch.Tensor,
                values: torch.Tensor, padding_mask: Optional[torch.Tensor], lengths: torch.Tensor,
                p_prev: torch.Tensor, count: bool = False) -> AttentionStep:
        """One decoding step.

        Args:
            query: ``h_{t-1}`` ``(B, Q)``; prev_embed: ``i_t`` ``(B, E)``.
            keys: ``(B, S, A)`` from :meth:`keys`; values: encoder states ``h̄`` ``(B, S, C)``.
            padding_mask: ``(B, S)`` bool, True at padding (right-padded), or None.
            lengths: ``(B,)`` long, source lengths; p_prev: ``p_{t-1}`` ``(B,)`` float.
            count: accumulate the window statistics.

        Returns:
            :class:`AttentionStep`.
        """
        B, S, _ = keys.shape
        q = self.q_proj(query)  # (B, A)
        g = self.gate(query, prev_embed) if self.kind == "flexible" else None
        if self.windowed and B == 1:
            return self._single_window_step(q, query, g, keys, values, lengths, p_prev, count)
        if not self.windowed:
            scores = self.score(q.unsqueeze(1), keys)  # (B, S)
            positions = torch.arange(S, device=q.device, dtype=scores.dtype).unsqueeze(0)  # (1, S)
            if g is not None:
                scores = scores - self.penalty(positions, p_prev, g.to(scores.dtype))
            weights = self.normalize(scores, padding_mask)  # (B, S)
            context = torch.bmm(weights.unsqueeze(1), values).squeeze(1)  # (B, C)
            focus = (weights * positions).sum(-1) if g is not None else p_prev
            window = lengths
        else:
            if self.kind == "flexible":
                lo, hi = flexible_window(p_prev.detach(), g.detach(), self.sigma, self.threshold, lengths)
            else:
                p_t = (lengths - 1).to(q.dtype) * torch.sigmoid(
                    self.pos_out(torch.tanh(self.pos_hidden(query)))).squeeze(-1)  # (B,) eq. 10
                lo, hi = local_p_window(p_t.detach(), self.local_d, lengths)
            scores, idx, mask = self.windowed_scores(q, keys, lo, hi)  # (B, W) each (B > 1)
            pos = idx.to(scores.dtype)
            if g is not None:
                scores = scores - self.penalty(pos, p_prev, g.to(scores.dtype))
            w = self.normalize(scores, mask)  # (B, W)
            if self.kind == "local_p":  # eq. 11: Gaussian after the softmax, sigma = D / 2
                w = w * torch.exp(-((pos - p_t.unsqueeze(-1)) ** 2) / (2.0 * (self.local_d / 2.0) ** 2))
                focus = p_t
            else:
                focus = (w * pos).sum(-1)  # eq. 4 over the window (weights are 0 elsewhere)
            vals = values.gather(1, idx.unsqueeze(-1).expand(-1, -1, values.size(-1)))  # (B, W, C)
            context = torch.bmm(w.unsqueeze(1), vals).squeeze(1)  # (B, C)
            weights = w.new_zeros(B, S).scatter_add(1, idx, w)  # (B, S), zeros outside the window
            window = hi - lo + 1
        if count:
            self.stats.add(window, lengths)
        return AttentionStep(context, weights, focus, g, window)

    def _single_window_step(self, q, query, g, keys, values, lengths, p_prev, count) -> AttentionStep:
        """The windowed step for one hypothesis (``B = 1``): same result as the batched path.

        The bounds are Python numbers (:func:`flexible_bounds` / :func:`local_p_bounds`), the
        window ``[lo, hi]`` a slice of ``keys`` ``(1, W, A)`` and ``values`` ``(1, W, C)``; only
        those ``W`` positions are passed to :meth:`score`.

        Args:
            q: ``(1, A)`` projected query; query: ``h_{t-1}`` ``(1, Q)``; g: ``(1,)`` or None;
            the rest as in :meth:`forward`.
        """
        S = keys.size(1)
        length = int(lengths[0])
        if g is not None:
            lo, hi = flexible_bounds(float(p_prev[0]), float(g[0]), self.sigma, self.threshold, length)
        else:
            p_t = (lengths - 1).to(q.dtype) * torch.sigmoid(
                self.pos_out(torch.tanh(self.pos_hidden(query)))).squeeze(-1)  # (1,) eq. 10
            lo, hi = local_p_bounds(float(p_t[0]), self.local_d, length)
        scores = self.score(q.unsqueeze(1), keys[:, lo : hi + 1])  # (1, W)
        pos = torch.arange(lo, hi + 1, device=q.device, dtype=scores.dtype)  # (W,)
        if g is not None:
            scores = scores - self.penalty(pos, p_prev, g.to(scores.dtype))  # (1, W)
        w = self.normalize(scores, None)  # (1, W)
        if g is None:  # eq. 11: Gaussian after the softmax, sigma = D / 2
            w = w * torch.exp(-((pos - p_t.unsqueeze(-1)) ** 2) / (2.0 * (self.local_d / 2.0) ** 2))
            focus = p_t
        else:
            focus = torch.mv(w, pos)  # (1,) eq. 4 over the window
        context = torch.mm(w, values[0, lo : hi + 1])  # (1, C)
        weights = w.new_zeros(1, S)
        weights[:, lo : hi + 1] = w  # (1, S), zeros outside the window
        if count:
            self.stats.add_one(hi - lo + 1, length)
        return AttentionStep(context, weights, focus, g, lengths.new_full((1,), hi - lo + 1))
