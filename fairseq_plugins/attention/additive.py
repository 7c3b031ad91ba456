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
* :meth:`AdditiveAttention.normalize` -- a plain normaliser of the plugin's attention registry
  (:func:`fairseq_plugins.attention.functions.normalizer`, ``--rnn-attention-fn``: ``softmax``,
  the paper's, by default; ``sparsemax`` or ``entmax15``), with the registry's masking semantics:
  ``True`` in the mask = not attendable, exact zeros there, zeros (never NaN) on a fully masked
  row.  "softmax" below stands for the chosen normaliser;
* the variant (``--rnn-attention``) is one small class each (:data:`VARIANTS`): its own
  parameters, its per-step state (``g(t)``, ``p_t``), its window, what it does to the scores
  before the normaliser and to the weights after it, and its focus ``p_t``;
* ``global``: eq. 2, softmax over every source position;
* ``flexible``: eqs. 4-8, ``a_t = softmax(score - g(t) (s - p_{t-1})^2 / (2 sigma^2))``,
  ``p_t = sum_s a_t(s) s``, ``g(t) = sigmoid(v_g^T tanh(W_g [h_{t-1}; i_t]) + b_g)``.  With a
  finite threshold ``tau`` only the positions of :func:`flexible_window` are scored (Section 3.1);
  at inference the rest are never passed to :meth:`score` (training masks them instead: below);
* ``local_p``: Luong et al. 2015 (eqs. 10-11 of the paper): ``p_t = (len - 1) sigmoid(v_p^T tanh(W_p h_{t-1}))``
  (0-based form of ``S sigmoid(.)``), softmax over the window ``[p_t - D, p_t + D]`` only (scored by
  gathering it, like the flexible window), multiplied by ``exp(-(s - p_t)^2 / (2 (D/2)^2))``
  after the softmax.  The query is ``h_{t-1}`` (as for every score here), where Luong's
  input-feeding model uses ``h_t``.

The windowed variants score only the window at inference (validation, generation, the decoding
benchmarks): that is the computation the paper saves.  In training (``module.training`` with
gradients on) they score every position and mask those outside the window instead, which gives the
same weights and gradients (``tests/test_flexible.py`` compares the two paths) without the per-step
gather bookkeeping and, on a GPU, without its two host syncs per step (``int(width.max())``,
``nonzero``).

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
import re
from typing import NamedTuple, Optional

import torch
import torch.nn as nn

from ..modules.auxiliary import AuxiliaryBuffer
from ..options import check_choice, check_number
from .functions import normalizer as get_normalizer
from .functions import normalizer_names

__all__ = ["ATTENTION_KINDS", "NORMALIZER_CHOICES", "VARIANTS", "AdditiveAttention", "AttentionStep", "WindowStats",
           "parse_window_report",
           "flexible_bounds", "flexible_window", "local_p_bounds", "local_p_window"]

#: valid values of ``--rnn-attention``
ATTENTION_KINDS = ("global", "local_p", "flexible")
#: valid values of ``--rnn-attention-fn``: the registry's plain normalisers whose weights are a
#: distribution (softmax, sparsemax, entmax15)
NORMALIZER_CHOICES = tuple(normalizer_names(distribution=True))


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
    clipped to ``[0, len - 1]``: the ``2D + 1`` positions ``floor(p_t) - D .. floor(p_t) + D``.

    Luong et al. (2015, §3.2) make the local alignment vector ``a_t in R^{2D+1}`` and Shu & Nakayama
    (2017, §4) read ``D = 10`` as "a window of 21 words"; the integers with ``|s - p_t| <= D`` would be
    only ``2D`` for a non-integer ``p_t`` (almost always, ``p_t = S sigmoid(.)``), so the window is
    centred on ``floor(p_t)`` (OpenNMT's local-p does the same).  The Gaussian of eq. 10 still uses the
    real ``p_t`` (:class:`AdditiveAttention`).

    Args:
        p_t: ``(B,)`` float, predicted centre; d: ``D`` (>= 0); lengths: ``(B,)`` long source lengths.

    Returns:
        ``(lo, hi)``: ``(B,)`` long, inclusive.
    """
    c = torch.floor(p_t.double())
    return _clip_window(c - d, c + d, p_t.double(), lengths)


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
    """:func:`local_p_window` for one hypothesis on Python numbers: ``floor(p_t) -+ D`` (``2D + 1``
    positions before clipping to ``[0, length - 1]``)."""
    c = float(math.floor(p_t))
    return _clip_bounds(c - d, c + d, p_t, length)


class WindowStats:
    """Window-size counters of generation (Shu & Nakayama 2017, §5.2), two averages.

    * **Per sentence** (the paper's, §5.2: "the value of window size is further averaged over the
      number of hypotheses considered in each step"; for Global attention it "equals to the average
      sentence length of the testing data"): at each step the positions scored are averaged over
      the sentence's live hypotheses, those step means over the sentence's steps, and the sentence
      means over the sentences -- :meth:`sentence_average_window`.  ``sentences``,
      ``sentence_windows`` (sum of the per-sentence means) and ``sentence_source`` (sum of their
      source lengths) count it, up to the batch still open (read them after
      :meth:`sentence_average_window`, which closes it); it needs the sentence of each
      hypothesis (:meth:`begin_batch`, ``sentence_ids``), which the RNNsearch decoder passes from
      its encoder output.
    * **Pooled**: ``positions`` (sum of window sizes) over ``queries`` (hypothesis-steps), with
      ``source`` the sum of the source lengths of the same queries -- :meth:`average_window`; long
      sentences weigh more (for Global it is ``sum L^2 / sum L``-like, not the mean length).

    Positions are the encoder positions, the appended EOS included (a source of ``L`` pieces has
    ``L + 1`` positions).  A plain object, so a report hook can hold it after the model is gone.
    Accumulators stay tensors on their device until read: a decoding step on a GPU makes no
    host-device sync for its statistics.
    """

    def __init__(self, kind: str, threshold: float):
        self.kind, self.threshold = kind, threshold
        self.reset()

    def reset(self) -> None:
        """Zero every counter (in place: a report hook holding this object sees it)."""
        self.positions = self.queries = self.source = 0
        self.sentences = self.sentence_windows = self.sentence_source = 0
        self._batch = None  # the open batch: per-sentence sums of step means, step counts, lengths

    def begin_batch(self, sentence_ids: torch.Tensor, lengths: torch.Tensor) -> None:
        """Open a new batch (its first decoding step) and close the previous one.

        Args:
            sentence_ids: ``(B,)`` long, the sentence of each hypothesis row, in ``[0, B)``
                (a sentence's beam shares its id).
            lengths: ``(B,)`` long, the source length of each row.
        """
        self._close_batch()
        n = sentence_ids.numel()
        z = torch.zeros(n, dtype=torch.float64, device=lengths.device)
        self._batch = {"sum": z, "steps": z.clone(),
                       "length": z.clone().index_put_((sentence_ids,), lengths.to(torch.float64)),
                       "py": {}}

    def _step_means(self, window: torch.Tensor, sentence_ids: torch.Tensor) -> None:
        b = self._batch
        w = torch.zeros_like(b["sum"]).index_add_(0, sentence_ids, window.to(torch.float64))
        c = torch.zeros_like(b["sum"]).index_add_(0, sentence_ids, torch.ones_like(window, dtype=torch.float64))
        b["sum"] += w / c.clamp_min(1.0)  # the step's mean over the sentence's live hypotheses
        b["steps"] += (c > 0).to(torch.float64)

    def _close_batch(self) -> None:
        b, self._batch = self._batch, None
        if b is None:
            return
        for s, (tot, steps) in b["py"].items():  # steps of the one-hypothesis path
            b["sum"][s] += tot
            b["steps"][s] += steps
        live = b["steps"] > 0
        self.sentences = self.sentences + live.sum()
        self.sentence_windows = self.sentence_windows + torch.where(live, b["sum"] / b["steps"].clamp_min(1.0), 0.0).sum()
        self.sentence_source = self.sentence_source + torch.where(live, b["length"], 0.0).sum()

    def add(self, window: torch.Tensor, lengths: torch.Tensor, sentence_ids: Optional[torch.Tensor] = None) -> None:
        """Add one step: ``window`` and ``lengths`` ``(B,)``; ``sentence_ids`` ``(B,)`` long (the
        open batch's ids of these rows, reordered with them) or None (pooled counters only)."""
        self.positions = self.positions + window.sum()
        self.queries += window.numel()
        self.source = self.source + lengths.sum()
        if sentence_ids is not None and self._batch is not None:
            self._step_means(window, sentence_ids)

    def add_one(self, window: int, length: int, sentence: Optional[int] = None) -> None:
        """Add one step of one hypothesis (Python ints; ``sentence``: its id in the open batch)."""
        self.positions += window
        self.queries += 1
        self.source += length
        if sentence is not None and self._batch is not None:
            tot, steps = self._batch["py"].get(sentence, (0, 0))
            self._batch["py"][sentence] = (tot + window, steps + 1)

    def average_window(self) -> float:
        """Pooled: positions scored per hypothesis-step; NaN before any step."""
        return float(self.positions) / self.queries if self.queries else math.nan

    def sentence_average_window(self) -> float:
        """The paper's (§5.2): per-sentence means (over steps of the means over hypotheses),
        averaged over sentences; NaN when no step carried sentence ids."""
        self._close_batch()
        n = float(self.sentences)
        return float(self.sentence_windows) / n if n else math.nan

    def report(self) -> str:
        """The line ``fairseq-generate`` ends with (:data:`WINDOW_REPORT_RE`, :func:`parse_window_report`)."""
        # tau is flexible attention's threshold (Section 3.1); global and local-p have none
        tau = ("inf" if math.isinf(self.threshold) else f"{self.threshold:g}") if self.kind == "flexible" else "n/a"
        per_sent = self.sentence_average_window()
        n = int(self.sentences)
        src = float(self.sentence_source) / n if n else math.nan
        return (f"[rnnsearch] {self.kind} attention (tau={tau}): average window {per_sent:.2f} positions per "
                f"sentence over {n} sentences (per step over hypotheses, per sentence over steps; average "
                f"source length {src:.2f}); pooled {self.average_window():.2f} positions per hypothesis-step over "
                f"{self.queries} hypothesis-steps (average source length "
                f"{float(self.source) / max(self.queries, 1):.2f})")


#: the line :meth:`WindowStats.report` writes (one definition: :func:`parse_window_report` reads it)
WINDOW_REPORT_RE = re.compile(
    r"\[rnnsearch\] (\w+) attention \(tau=([^)]+)\): average window ([\d.]+|nan) positions per sentence over "
    r"(\d+) sentences \(per step over hypotheses, per sentence over steps; average source length ([\d.]+|nan)\); "
    r"pooled ([\d.]+|nan) positions per hypothesis-step over (\d+) hypothesis-steps \(average source length "
    r"([\d.]+|nan)\)")


def parse_window_report(text: str) -> Optional[dict]:
    """The last :meth:`WindowStats.report` line in ``text`` (a ``fairseq-generate`` log), or None:
    ``{kind, tau, window, sentences, source_length, pooled_window, hypothesis_steps,
    pooled_source_length}`` -- ``window`` the paper's per-sentence average (§5.2) and
    ``source_length`` the sentences' mean, in encoder positions (EOS included); the ``pooled_*``
    fields are over hypothesis-steps."""
    m = None
    for m in WINDOW_REPORT_RE.finditer(text):
        pass
    if m is None:
        return None
    return {"kind": m.group(1), "tau": m.group(2), "window": float(m.group(3)), "sentences": int(m.group(4)),
            "source_length": float(m.group(5)), "pooled_window": float(m.group(6)),
            "hypothesis_steps": int(m.group(7)), "pooled_source_length": float(m.group(8))}


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


class _Variant:
    """One ``--rnn-attention`` variant: its parameters and the steps in which it differs.

    Every method takes the :class:`AdditiveAttention` ``att`` holding the parameters (their
    names, e.g. ``gate_hidden``, are those of existing checkpoints).  ``state`` is what
    :meth:`prepare` computes once per step (``g(t)`` for flexible, ``p_t`` for local-p).
    The base class is ``global`` (eq. 2): every position, nothing added.
    """

    name = "global"

    def build(self, att: "AdditiveAttention", query_dim: int, embed_dim: int, attn_dim: int) -> None:
        """Add the variant's own parameters to ``att``."""

    def windowed(self, att) -> bool:
        """True when only a window of the source is scored."""
        return False

    def prepare(self, att, query: torch.Tensor, prev_embed: torch.Tensor, lengths: torch.Tensor):
        """Per-step state from ``h_{t-1}`` ``(B, Q)`` and ``i_t`` ``(B, E)``; ``(B,)`` or None."""
        return None

    def window(self, att, state, p_prev: torch.Tensor, lengths: torch.Tensor):
        """Inclusive window bounds ``(lo, hi)``, ``(B,)`` long each (windowed variants)."""
        raise NotImplementedError

    def bounds(self, att, state, p_prev: float, length: int):
        """:meth:`window` of one hypothesis on Python numbers: ``(lo, hi)`` ints."""
        raise NotImplementedError

    def adjust_scores(self, att, scores, positions, p_prev, state):
        """Scores ``(B, S|W)`` before the normaliser; ``positions`` ``(B|1, S|W)`` or ``(W,)``."""
        return scores

    def adjust_weights(self, att, weights, positions, state):
        """Weights ``(B, S|W)`` after the normaliser."""
        return weights

    def focus(self, att, weights, positions, p_prev, state):
        """``p_t`` ``(B,)`` handed to the next step."""
        return p_prev

    def gate(self, state):
        """The ``gate`` of :class:`AttentionStep` (``g(t)`` ``(B,)`` or None)."""
        return None


class _LocalP(_Variant):
    """Luong et al. 2015 local-p (paper eqs. 10-11): ``p_t = (len - 1) sigmoid(v_p^T tanh(W_p h_{t-1}))``,
    window ``[p_t - D, p_t + D]``, weights times ``exp(-(s - p_t)^2 / (2 (D/2)^2))`` after the normaliser."""

    name = "local_p"

    def build(self, att, query_dim, embed_dim, attn_dim):
        att.pos_hidden = nn.Linear(query_dim, attn_dim, bias=False)  # W_p
        att.pos_out = nn.Linear(attn_dim, 1, bias=False)  # v_p

    def windowed(self, att):
        return True

    def prepare(self, att, query, prev_embed, lengths):
        return (lengths - 1).to(query.dtype) * torch.sigmoid(
            att.pos_out(torch.tanh(att.pos_hidden(query)))).squeeze(-1)  # (B,) eq. 10

    def window(self, att, p_t, p_prev, lengths):
        return local_p_window(p_t.detach(), att.local_d, lengths)

    def bounds(self, att, p_t, p_prev, length):
        return local_p_bounds(float(p_t[0]), att.local_d, length)

    def adjust_weights(self, att, weights, positions, p_t):  # eq. 11: Gaussian, sigma = D / 2
        return weights * torch.exp(-((positions - p_t.unsqueeze(-1)) ** 2) / (2.0 * (att.local_d / 2.0) ** 2))

    def focus(self, att, weights, positions, p_prev, p_t):
        return p_t


class _Flexible(_Variant):
    """Flexible attention (Shu & Nakayama 2017, eqs. 4-8): scores minus ``g(t) (s - p_{t-1})^2 /
    (2 sigma^2)``, focus ``p_t = sum_s a_t(s) s``; with a finite ``tau`` only the positions of
    :func:`flexible_window` are scored (Section 3.1)."""

    name = "flexible"

    def build(self, att, query_dim, embed_dim, attn_dim):
        att.gate_hidden = nn.Linear(query_dim + embed_dim, attn_dim, bias=False)  # W_g
        att.gate_out = nn.Linear(attn_dim, 1, bias=True)  # v_g, b_g

    def windowed(self, att):
        return math.isfinite(att.threshold)

    def prepare(self, att, query, prev_embed, lengths):
        return att.gate(query, prev_embed)  # g(t), (B,)

    def window(self, att, g, p_prev, lengths):
        return flexible_window(p_prev.detach(), g.detach(), att.sigma, att.threshold, lengths)

    def bounds(self, att, g, p_prev, length):
        return flexible_bounds(p_prev, float(g[0]), att.sigma, att.threshold, length)

    def adjust_scores(self, att, scores, positions, p_prev, g):
        return scores - att.penalty(positions, p_prev, g.to(scores.dtype))

    def focus(self, att, weights, positions, p_prev, g):  # eq. 4 (over the window: weights are 0 elsewhere)
        return torch.mv(weights, positions) if positions.dim() == 1 else (weights * positions).sum(-1)

    def gate(self, g):
        return g


#: ``--rnn-attention`` value -> variant (the one switch over the variants)
VARIANTS = {v.name: v for v in (_Variant(), _LocalP(), _Flexible())}


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
        normalizer: the map from scores to weights, a plain normaliser of the attention registry
            (:func:`~fairseq_plugins.attention.functions.normalizer`) whose weights are a
            distribution (:data:`NORMALIZER_CHOICES`: softmax -- the paper's --, sparsemax,
            entmax15): the flexible focus ``p_t = sum_s a_t(s) s`` (eq. 4) is a position only
            for weights that sum to 1, and so is local-p's window centre weighting.

    Raises:
        ValueError: unknown ``kind`` or ``normalizer`` (message lists the valid choices),
            ``sigma`` not a finite number > 0, ``threshold`` not > 0 (``inf`` allowed) or
            ``local_d < 1``.

    Window statistics: when :meth:`forward` is called with ``count=True`` (the decoder does so
    in incremental decoding, i.e. generation), the number of positions scored and the number
    of (hypothesis, step) queries are accumulated in ``self.stats`` (a :class:`WindowStats`);
    :meth:`average_window` is their ratio (pooled over hypothesis-steps) and, when the steps carry
    ``sentence_ids``, :meth:`sentence_average_window` the paper's per-sentence average (§5.2).
    """

    def __init__(self, query_dim: int, key_dim: int, attn_dim: int, embed_dim: int, kind: str = "global",
                 sigma: float = 1.5, threshold: float = math.inf, local_d: int = 10,
                 normalizer: str = "softmax"):
        super().__init__()
        self.kind = check_choice("--rnn-attention", kind, ATTENTION_KINDS)
        self.variant = VARIANTS[self.kind]
        self.normalizer_name = check_choice("--rnn-attention-fn", normalizer, NORMALIZER_CHOICES)
        self.sigma = check_number("--flexible-sigma", sigma, gt=0)
        self.local_d = check_number("--local-window-d", local_d, integer=True, ge=1)
        self.set_threshold(threshold)
        self.q_proj = nn.Linear(query_dim, attn_dim, bias=False)  # W_a, decoder-state half
        self.k_proj = nn.Linear(key_dim, attn_dim, bias=True)  # W_a, encoder-state half (+ bias)
        self.v = nn.Linear(attn_dim, 1, bias=False)  # v_a
        self.variant.build(self, query_dim, embed_dim, attn_dim)
        # a plain function (masking: True = not attendable; zero rows, never NaN)
        self._normalize = get_normalizer(self.normalizer_name)
        self.aux = AuxiliaryBuffer()  # the fine-tuning term of eq. 9 (recorded by the decoder)
        self.reset_window_stats()

    # -- configuration and statistics ---------------------------------------------------------
    def set_threshold(self, threshold) -> None:
        """Set ``tau`` (float or a string such as ``"inf"``).

        Raises:
            ValueError: ``tau`` not a number > 0 (``inf`` allowed, ``nan`` refused).
        """
        tau = check_number("--flexible-threshold", threshold, gt=0, allow_inf=True)
        self.threshold = tau
        if getattr(self, "stats", None) is not None:
            self.stats.threshold = tau

    def reset_window_stats(self) -> None:
        """Zero the window counters (in place: a report hook holding ``self.stats`` sees it)."""
        if getattr(self, "stats", None) is None:
            self.stats = WindowStats(self.kind, self.threshold)
        self.stats.reset()

    @property
    def window_queries(self) -> int:
        """Number of (hypothesis, step) queries counted so far (``self.stats.queries``; 0 after a reset)."""
        return self.stats.queries

    def average_window(self) -> float:
        """Average number of source positions scored per (hypothesis, step), pooled; NaN before any step."""
        return self.stats.average_window()

    def sentence_average_window(self) -> float:
        """The paper's average window (§5.2, :meth:`WindowStats.sentence_average_window`); NaN
        when no counted step carried sentence ids."""
        return self.stats.sentence_average_window()

    @property
    def windowed(self) -> bool:
        """True when only a window of the source is scored (local-p, or flexible with finite tau)."""
        return self.variant.windowed(self)

    # -- the two halves of the attention function ---------------------------------------------
    def keys(self, encoder_out: torch.Tensor) -> torch.Tensor:
        """``K = W_k h̄ + b``: encoder states ``(B, S, C)`` -> ``(B, S, A)``, computed once per sentence."""
        return self.k_proj(encoder_out)

    def score(self, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        """Eq. 3: ``v_a^T tanh(q + k)`` with ``q = W_q h_{t-1}``; ``(..., A)`` x ``(..., A)`` -> ``(...)``."""
        return self.v(torch.tanh(q + k)).squeeze(-1)

    def normalize(self, scores: torch.Tensor, mask: Optional[torch.Tensor]) -> torch.Tensor:
        """Weights over the last dimension of ``scores`` ``(B, S|W)`` with bool ``mask`` (True =
        excluded): the registry's plain normaliser ``--rnn-attention-fn`` (softmax by default)."""
        return self._normalize(scores, mask)

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
                p_prev: torch.Tensor, count: bool = False,
                sentence_ids: Optional[torch.Tensor] = None) -> AttentionStep:
        """One decoding step.

        Args:
            query: ``h_{t-1}`` ``(B, Q)``; prev_embed: ``i_t`` ``(B, E)``.
            keys: ``(B, S, A)`` from :meth:`keys`; values: encoder states ``h̄`` ``(B, S, C)``.
            padding_mask: ``(B, S)`` bool, True at padding (right-padded), or None.
            lengths: ``(B,)`` long, source lengths; p_prev: ``p_{t-1}`` ``(B,)`` float.
            count: accumulate the window statistics.
            sentence_ids: ``(B,)`` long, each row's sentence in the batch :meth:`WindowStats.begin_batch`
                opened, or None: with ``count``, the per-sentence window average (§5.2) counts this step.

        Returns:
            :class:`AttentionStep`.
        """
        B, S, _ = keys.shape
        q = self.q_proj(query)  # (B, A)
        variant = self.variant
        state = variant.prepare(self, query, prev_embed, lengths)  # g(t) / p_t (B,) or None
        if self.windowed and B == 1:
            return self._single_window_step(q, state, keys, values, lengths, p_prev, count, sentence_ids)
        gathered = self.windowed and not (self.training and torch.is_grad_enabled())
        if not self.windowed:
            scores = self.score(q.unsqueeze(1), keys)  # (B, S)
            positions = torch.arange(S, device=q.device, dtype=scores.dtype).unsqueeze(0)  # (1, S)
            mask, window = padding_mask, lengths
        elif not gathered:
            # training: every position is scored and those outside the window are masked -- the
            # same weights and gradients as the gathered window below (positions outside it get
            # weight 0 and no gradient either way), without its per-step nonzero / gather /
            # index_put / scatter (and their host syncs on a GPU).  The window still decides
            # what is attended to; only inference scores the window alone.
            lo, hi = variant.window(self, state, p_prev, lengths)  # (B,) each
            scores = self.score(q.unsqueeze(1), keys)  # (B, S)
            s = torch.arange(S, device=q.device)
            mask = (s.unsqueeze(0) < lo.unsqueeze(1)) | (s.unsqueeze(0) > hi.unsqueeze(1))  # (B, S)
            positions = s.to(scores.dtype).unsqueeze(0)  # (1, S)
            window = hi - lo + 1
        else:
            lo, hi = variant.window(self, state, p_prev, lengths)  # (B,) each
            scores, idx, mask = self.windowed_scores(q, keys, lo, hi)  # (B, W) each (B > 1)
            positions = idx.to(scores.dtype)
            window = hi - lo + 1
        scores = variant.adjust_scores(self, scores, positions, p_prev, state)
        w = variant.adjust_weights(self, self.normalize(scores, mask), positions, state)  # (B, S|W)
        focus = variant.focus(self, w, positions, p_prev, state)
        if not gathered:
            weights, context = w, torch.bmm(w.unsqueeze(1), values).squeeze(1)  # (B, S), (B, C)
        else:
            vals = values.gather(1, idx.unsqueeze(-1).expand(-1, -1, values.size(-1)))  # (B, W, C)
            context = torch.bmm(w.unsqueeze(1), vals).squeeze(1)  # (B, C)
            weights = w.new_zeros(B, S).scatter_add(1, idx, w)  # (B, S), zeros outside the window
        if count:
            self.stats.add(window, lengths, sentence_ids)
        return AttentionStep(context, weights, focus, variant.gate(state), window)

    def _single_window_step(self, q, state, keys, values, lengths, p_prev, count, sentence_ids=None) -> AttentionStep:
        """The windowed step for one hypothesis (``B = 1``): same result as the batched path.

        The bounds are Python numbers (:func:`flexible_bounds` / :func:`local_p_bounds`), the
        window ``[lo, hi]`` a slice of ``keys`` ``(1, W, A)`` and ``values`` ``(1, W, C)``; only
        those ``W`` positions are passed to :meth:`score`.

        Args:
            q: ``(1, A)`` projected query; state: the variant's per-step state ``(1,)``;
            the rest as in :meth:`forward`.
        """
        S = keys.size(1)
        length = int(lengths[0])
        variant = self.variant
        lo, hi = variant.bounds(self, state, float(p_prev[0]), length)
        scores = self.score(q.unsqueeze(1), keys[:, lo : hi + 1])  # (1, W)
        pos = torch.arange(lo, hi + 1, device=q.device, dtype=scores.dtype)  # (W,)
        scores = variant.adjust_scores(self, scores, pos, p_prev, state)  # (1, W)
        w = variant.adjust_weights(self, self.normalize(scores, None), pos, state)  # (1, W)
        focus = variant.focus(self, w, pos, p_prev, state)  # (1,)
        context = torch.mm(w, values[0, lo : hi + 1])  # (1, C)
        weights = w.new_zeros(1, S)
        weights[:, lo : hi + 1] = w  # (1, S), zeros outside the window
        if count:
            self.stats.add_one(hi - lo + 1, length, None if sentence_ids is None else int(sentence_ids[0]))
        return AttentionStep(context, weights, focus, variant.gate(state), lengths.new_full((1,), hi - lo + 1))
