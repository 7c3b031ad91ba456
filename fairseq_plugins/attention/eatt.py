"""E-ATT (Attention with Energy-Friendly Operations), its ablations, and the Synthesizer baselines.

Shape legend: B batch (of keys), H heads, T queries, S keys, d head dimension (the paper's
``k_h``), C = H * d model dimension, L ``--synth-max-len``.  Masks: bool, True = blocked.

Registered attention functions (all normalised by the usual masked softmax):

==================  ============================  =====================================
name                Q, K                          scores
==================  ============================  =====================================
``eatt``            binarised input selects rows  ``-||q - k||_1 / sqrt(d)`` (eq. 13)
                    of W_Q / W_K (eqs. 7-12)
``eatt_select_dot`` binarised selection           ``q . k / sqrt(d)`` (Table 3 row 2)
``eatt_l1``         full-precision projections    ``-||q - k||_1 / sqrt(d)`` (Table 3 row 3)
``synth_dense``     --                            ``W2_h ReLU(W1 x_i)`` over key positions
``synth_random``    --                            ``R_h[i, j]``, a learned L x L matrix
==================  ============================  =====================================

E-ATT's binarisation happens in :meth:`transform_input` (the attention module calls it on
the input right before ``q_proj`` / ``k_proj``; ``v_proj`` and ``out_proj`` stay full
precision, as in the paper and the official code).  ``q_proj`` then runs as a matmul on the
0/1 input, which equals the addition-only selection of eqs. 9-12
(:func:`~fairseq_plugins.modules.binarize.select_add`; tests prove it).

Threshold ``tau`` (``--eatt-tau``): default **1.0**, the value the paper's appendix states for
all its experiments; the official code uses 0.0 (``snn_threshold``).  We follow the paper
because the tables we reproduce are the paper's; 0.0 is one flag away.  Note the official
code also shrinks Q/K to ``C / H`` dimensions (``factor = num_heads``); here Q/K keep
fairseq's ``C`` by default (the paper's ``W_Q in R^{d x k}`` with ``k = d`` in Transformer base);
``--eatt-qk-dim C/H`` trains the official code's width (``q_proj`` / ``k_proj`` of ``C x C/H``, each
head's L1 distance over ``C/H^2`` dimensions, eq. 13's ``sqrt(d)`` then ``sqrt(C/H^2)``, as the
official self-attention's ``attention_norm_factor``; its cross-attention divides by ``sqrt(C/H)``
instead, which we do not copy).  ``V`` and ``out_proj`` keep width ``C`` in both readings.

Synthesizer (Tay et al. 2021, ICML):

* Dense: ``B_i = W2 ReLU(W1 x_i + b1) + b2`` per head; here ``W1 x_i + b1`` is the head's slice
  of ``q_proj`` (so layer 1 is ``d x d`` over all heads) and ``W2_h`` is ``d_h x L``.  Column ``j``
  is key *position* ``j``.  Cost: the energy accounting
  (:func:`fairseq_plugins.analysis.energy.score_ops`, ``"dense"``) counts only the ``l_k`` key
  positions a query needs, ``l_q d^2 + l_q l_k d`` MACs (Table 2's ``l d^2 + l^2 d``); this code
  computes all ``L`` logits of each query and gathers the ``l_k`` it needs, ``l_q d^2 + l_q L d``
  MACs (``L`` = ``--synth-max-len``), plus the unused ``k_proj`` (``l_k d^2``, below), so its
  run time is not the counted cost.
* Random: ``R_h in R^{L x L}``, ``N(0, 1)`` initialised, trained (the paper's "RandInit"), or
  frozen with ``--synth-random-fixed``.  Row ``i`` is query position ``i``.

Both ignore key *content* (``k_proj`` is computed but unused: the attention module freezes it,
``requires_grad=False``, so that torch DDP does not fail on a parameter without gradient; Random's
``q_proj`` too).  Positions come from the attention module (``score_at``): keys are numbered among
non-padding tokens (fairseq left-pads sources, so key ``j`` of every sentence is its ``j``-th
token), queries likewise in self-attention -- also when decoding step by step (the step
index), and, beam search folding hypotheses into extra queries, each copy keeps its position.
In cross-attention the query position is the target position (the step index when decoding,
counted in the incremental state) and the key position the source position: Random's alignment is
a fixed pattern over (target position, source position); Dense's depends on the query's content
(the decoder state, through ``q_proj``) but on the source only through key positions.  Neither
can align by source content, which is why the paper (and Tay et al.) find them poor there.
A position >= L raises a ``ValueError`` naming ``--synth-max-len`` (default 256;
``fairseq-generate``'s default ``--max-len-b 200`` stays below it).
"""

import math
from dataclasses import dataclass
from typing import Dict, List, Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..modules.binarize import binarize
from ..options import OptionGroup, option
from .functions import SoftmaxAttention, register_attention_fn
from .l1 import l1_scores

__all__ = [
    "EattAttention", "EattSelectDotAttention", "EattL1Attention",
    "SynthDenseAttention", "SynthRandomAttention", "DEFAULT_EATT_TAU", "DEFAULT_SYNTH_MAX_LEN",
    "EattOptions", "SynthOptions",
]

DEFAULT_EATT_TAU = 1.0
DEFAULT_SYNTH_MAX_LEN = 256


@dataclass
class EattOptions(OptionGroup):
    """Options of the binarised E-ATT functions ``eatt`` / ``eatt_select_dot`` (``--eatt-*``)."""

    prefix = "eatt"
    family = "binarised E-ATT"
    tau: float = option(DEFAULT_EATT_TAU,
                        "E-ATT binarisation threshold tau of f(x) = 1[x > tau] (eq. 7) and centre of the "
                        "surrogate gradient (eq. 8); default 1.0 (the paper's appendix; the official "
                        "code uses 0.0)")
    qk_dim: int = option(0, "E-ATT width of the query/key projections W_Q, W_K over all heads (each head's L1 "
                            "distance runs over qk_dim / heads dimensions); a multiple of the number of heads. "
                            "0 (default): the model dimension, the paper's Transformer base (k = d); the "
                            "official code uses model dimension / heads (e.g. 64 at d 512, h 8)", ge=0)


@dataclass
class SynthOptions(OptionGroup):
    """Options of the Synthesizer functions ``synth_dense`` / ``synth_random`` (``--synth-*``)."""

    prefix = "synth"
    family = "Synthesizer"
    max_len: int = option(DEFAULT_SYNTH_MAX_LEN, "maximum token position + 1 of the Synthesizer functions "
                                                 "synth_dense / synth_random (default 256)", ge=1)
    random_fixed: bool = option(False, "keep synth_random's score matrix fixed at its random initialisation "
                                       "(default: trained, the paper's RandInit)")


class _BinarizedInput:
    """Mixin: binarise the query/key inputs (E-ATT eq. 7, surrogate gradient eq. 8).

    ``rho_meter`` -- set to ``{}`` to accumulate, per role, ``[ones, elements]`` of the binary
    inputs (the ratio of nonzero values ``rho`` of the paper's Figure 2); ``None`` (default)
    records nothing.  Padding tokens are counted, so measure with batches without padding.
    """

    is_binarized = True
    options_class = EattOptions

    def _init_binarized(self, args):
        self.tau = float(self.options.tau)
        self.rho_meter: Optional[Dict[str, List[float]]] = None
        qk_dim = int(self.options.qk_dim) or self.embed_dim
        if qk_dim % self.num_heads:
            raise ValueError(
                f"{EattOptions.flag('qk_dim')} {qk_dim} is not a multiple of the {self.num_heads} heads; valid "
                f"choices: 0 (the model dimension {self.embed_dim}) or a positive multiple of {self.num_heads} "
                f"(the official code's {self.embed_dim // self.num_heads} = model dimension / heads among them)")
        self.set_qk_dim(qk_dim)

    def transform_input(self, x, role):
        xb = binarize(x, self.tau)
        if self.rho_meter is not None:
            acc = self.rho_meter.setdefault(role, [0.0, 0.0])
            acc[0] += float(xb.detach().sum())
            acc[1] += float(xb.numel())
        return xb


class _L1Score:
    """Mixin: E-ATT eq. 13 scores ``-||q_i - k_j||_1 / sqrt(d)`` via :func:`l1_scores` with
    ``impl="auto"``: the chunked kernel where a CUDA backward will run (bounded memory; cdist's CUDA
    backward materialises the ``(B, H, T, S, d)`` tensor and overflows 32-bit indices: see
    :mod:`~fairseq_plugins.attention.l1`), ``torch.cdist(p=1)`` otherwise; half precision is
    computed in float32.  The fused path is the Triton kernel
    :func:`fairseq_plugins.attention.triton.l1_softmax_attention` (scores and softmax tile by tile,
    ``O(T)`` memory) when the backend is Triton; with the torch backend ``None`` (the
    score/normalize path: the softmax fused kernel would compute dot products)."""

    kernel_family = "l1softmax"

    def score(self, q, k):
        return l1_scores(q, k, self.scaling, impl="auto")

    def fused(self, q, k, v, mask, dropout_p, causal=False):
        if not self.uses_triton(q):
            return None
        from .triton import l1_softmax_attention

        return l1_softmax_attention(q, k, v, self.scaling, mask=mask, dropout_p=dropout_p, causal=causal)


@register_attention_fn("eatt")
class EattAttention(_BinarizedInput, _L1Score, SoftmaxAttention):
    """E-ATT (eqs. 7-13): binarised selection for Q and K, L1-distance scores, masked softmax.

    Hyper-parameters: :class:`EattOptions` -- ``--eatt-tau`` (default 1.0, see the module
    docstring; a finite number) and ``--eatt-qk-dim`` (default 0 = ``C``; the official code's
    ``C/H``; ``ValueError`` at construction when not a multiple of ``H``).
    """

    def __init__(self, embed_dim, num_heads, args=None):
        super().__init__(embed_dim, num_heads, args)
        self._init_binarized(args)


@register_attention_fn("eatt_select_dot")
class EattSelectDotAttention(_BinarizedInput, SoftmaxAttention):
    """E-ATT ablation (Table 3 "replace with discrete selection"): binarised selection for Q
    and K, scaled dot-product scores, softmax (the fused kernel is used)."""

    def __init__(self, embed_dim, num_heads, args=None):
        super().__init__(embed_dim, num_heads, args)
        self._init_binarized(args)


@register_attention_fn("eatt_l1")
class EattL1Attention(_L1Score, SoftmaxAttention):
    """E-ATT ablation (Table 3 "replace with L1 distance"): full-precision projections,
    L1-distance scores (eq. 13), softmax."""


class _Synthesizer(SoftmaxAttention):
    """Shared parts of the Synthesizer functions: positions, maximum length, no fused path."""

    uses_positions = True
    options_class = SynthOptions

    def __init__(self, embed_dim, num_heads, args=None):
        super().__init__(embed_dim, num_heads, args)
        self.max_len = int(self.options.max_len)

    def _check(self, *positions, src_len=None):
        """Raise when a position is >= ``max_len``.  ``src_len``: a static bound of the positions
        (key positions count non-padding keys, so they are < ``S`` by construction; query
        positions: the caller's ``q_bound``); with ``src_len <= max_len`` the check (a host sync:
        it reads the maximum back) is skipped.

        Raises:
            ValueError: a position ``>= max_len`` (the message names ``--synth-max-len``)."""
        if src_len is not None and src_len <= self.max_len:
            return
        for p in positions:
            if p.numel() and int(p.max()) >= self.max_len:
                raise ValueError(
                    f"{self.name}: position {int(p.max())} is beyond --synth-max-len {self.max_len}; "
                    "raise --synth-max-len or lower --max-source-positions/--max-len-b")

    def score(self, q, k):
        S, T = k.size(2), q.size(2)
        dev = q.device
        return self.score_at(q, k, torch.arange(T, device=dev)[None], torch.arange(S, device=dev)[None], q_bound=T)

    def fused(self, q, k, v, mask, dropout_p, causal=False):
        return None


@register_attention_fn("synth_dense")
class SynthDenseAttention(_Synthesizer):
    """Dense Synthesizer (Tay et al. 2021, eq. for ``B_i = F(X_i)``): scores
    ``W2_h ReLU(q_i) + b2_h`` ``(B, H, T, L)`` gathered at the key positions.  ``q_i`` is
    ``q_proj``'s head slice (the first layer ``W1 x + b1``).  Parameters ``w2`` ``(H, d, L)``
    (Xavier-uniform over ``d -> L``) and ``b2`` ``(H, L)`` (zeros); the module's ``k_proj`` is
    unused (frozen: :attr:`~fairseq_plugins.attention.functions.AttentionFunction.unused_projections`)."""

    unused_projections = ("k_proj",)

    def __init__(self, embed_dim, num_heads, args=None):
        super().__init__(embed_dim, num_heads, args)
        bound = math.sqrt(6.0 / (self.head_dim + self.max_len))
        self.w2 = nn.Parameter(torch.empty(num_heads, self.head_dim, self.max_len).uniform_(-bound, bound))
        self.b2 = nn.Parameter(torch.zeros(num_heads, self.max_len))

    def score_at(self, q, k, q_pos, k_pos, q_bound=None):
        """Dense Synthesizer scores ``(B, H, T, S)``: logits ``W2_h ReLU(q_i) + b2_h`` ``(B, H, T, L)``
        gathered at the key positions ``k_pos`` ``(B|1, S)``; ``k``'s content and ``q_pos`` are unused.

        Raises:
            ValueError: a key position ``>= --synth-max-len`` (checked only when ``S > L``)."""
        self._check(k_pos, src_len=k.size(2))
        B, H, T, _ = q.shape
        S = k.size(2)
        logits = torch.einsum("bhtd,hdl->bhtl", F.relu(q), self.w2.to(q.dtype)) + self.b2.to(q.dtype)[:, None]
        idx = k_pos.view(k_pos.size(0), 1, 1, S).expand(B, H, T, S)  # (B, H, T, S)
        return logits.gather(-1, idx)


@register_attention_fn("synth_random")
class SynthRandomAttention(_Synthesizer):
    """Random Synthesizer (Tay et al. 2021; "RandInit" in E-ATT Table 2/5): scores
    ``R_h[pos(i), pos(j)]`` from a parameter ``r`` ``(H, L, L)`` ~ ``N(0, 1)``; trained unless
    ``--synth-random-fixed`` (then ``requires_grad=False``, still saved in checkpoints).  The
    module's ``q_proj`` and ``k_proj`` are unused (frozen, as ``k_proj`` of :class:`SynthDenseAttention`)."""

    unused_projections = ("q_proj", "k_proj")

    def __init__(self, embed_dim, num_heads, args=None):
        super().__init__(embed_dim, num_heads, args)
        fixed = bool(self.options.random_fixed)
        self.r = nn.Parameter(torch.randn(num_heads, self.max_len, self.max_len), requires_grad=not fixed)

    def score_at(self, q, k, q_pos, k_pos, q_bound=None):
        """Random Synthesizer scores ``R_h[q_pos_i, k_pos_j]`` ``(B, H, T, S)`` in ``q``'s dtype;
        ``q_pos`` ``(B|1, T)``, ``k_pos`` ``(B|1, S)``; the content of ``q`` and ``k`` is unused.

        Raises:
            ValueError: a query or key position ``>= --synth-max-len`` (skipped when ``q_bound`` /
                ``S`` is at most ``L``)."""
        # query positions: a host sync only without a static bound (cross-attention decoding)
        self._check(q_pos, src_len=q_bound)
        self._check(k_pos, src_len=k.size(2))
        B, T, S = q.size(0), q.size(2), k.size(2)
        qi = q_pos.view(q_pos.size(0), T, 1).expand(B, T, S)
        kj = k_pos.view(k_pos.size(0), 1, S).expand(B, T, S)
        return self.r[:, qi, kj].permute(1, 0, 2, 3).to(q.dtype)  # (H, B, T, S) -> (B, H, T, S)
