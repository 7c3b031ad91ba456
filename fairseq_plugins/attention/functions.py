"""The registry of attention functions: the one seam through which every mechanism enters.

Shape legend: B batch (of keys/values), H heads, T query length, S key length,
d head dimension (d_h), C = H * d model dimension.  Masks are boolean and broadcastable to
``(B, H, T, S)``; ``True`` marks a position that may *not* be attended to.

An attention function splits scaled dot-product attention (Vaswani et al. 2017, eq. 1;
ReLA eq. 1) into the pieces the papers change:

* :meth:`AttentionFunction.score` -- ``f(Q, K^T)``, scaled dot product by default;
* :meth:`AttentionFunction.normalize` -- the map from scores to weights ``alpha``
  (softmax, sparsemax, 1.5-entmax, ReLU, ...), responsible for its own masking;
* :meth:`AttentionFunction.post_aggregate` -- applied to the concatenated heads
  ``[alpha_1 V_1, ..., alpha_H V_H]`` *before* the output projection ``W_o``
  (where ReLA puts its (gated) RMSNorm, eq. 3);
* :meth:`AttentionFunction.fused` -- optional fused kernel computing ``alpha V`` at once,
  used only by the function that owns it (softmax -> ``scaled_dot_product_attention``).

Masks reach a function as the seam's pair (:mod:`~fairseq_plugins.attention.masks`): :meth:`fused`
gets ``mask`` -- fairseq's ``key_padding_mask`` as ``(B|1, 1, 1, S)``, a general
``(B|1, 1, T, S)`` mask, or None -- and ``causal`` (also block keys ``j > i + (S - T)``: the
decoder's future mask, never materialised on the fused paths); :meth:`normalize`, :meth:`observe`
and the analysis :attr:`~AttentionFunction.capture` get the dense combination
(:func:`~fairseq_plugins.attention.masks.combined_mask`), built only on that path.

Every function returns exact zeros for a fully masked (padded) query row -- never NaN --
and the ReLU family returns exact zeros for a row without any positive score
(*null attention*, ReLA Section 4).
"""

import inspect
from dataclasses import dataclass
from typing import Callable, ClassVar, Dict, List, Optional, Tuple, Type

import torch
import torch.nn as nn
import torch.nn.functional as F
from fairseq.dataclass import ChoiceEnum

from ..modules.auxiliary import AuxiliaryBuffer
from ..modules.norms import NORM_SCOPES, GatedNorm, GroupedLayerNorm, RMSNorm
from ..options import OptionGroup, option
from ..user_dir import USER_DIR_HINT
from .backend import check_backend, resolve_backend
from .masks import combined_mask
from .stats import entropy_from_terms, keys_per_query, reluformer_row_terms, row_mass_terms, valid_keys

__all__ = [
    "AttentionFunction",
    "ATTENTION_FUNCTIONS",
    "register_attention_fn",
    "build_attention_fn",
    "attention_fn_names",
    "attention_fn_options",
    "normalizer",
    "normalizer_names",
    "REG_TERMS",
    "RelaNormOptions",
    "ReluFormerOptions",
]

ATTENTION_FUNCTIONS: Dict[str, Type["AttentionFunction"]] = {}
#: name -> plain normaliser ``normalize(scores, mask)`` of the functions registered with ``normalizer=True``
NORMALIZERS: Dict[str, Callable[[torch.Tensor, Optional[torch.Tensor]], torch.Tensor]] = {}


def register_attention_fn(name: str, normalizer: bool = False):
    """Class decorator adding an :class:`AttentionFunction` subclass to the registry.

    Args:
        name: the registry key (the ``--*-attention-fn`` value).
        normalizer: also offer the function's normaliser as a plain function
            ``normalize(scores, mask)`` (:func:`normalizer`), e.g. to the RNN attention.  Only
            for functions that *are* their normaliser (dot-product scores, no input transform,
            no post-aggregation, no options) and whose ``normalize`` is a ``classmethod`` or
            ``staticmethod`` (needs no module, no sizes).

    Raises:
        ValueError: ``name`` is already registered; ``normalizer=True`` with an instance-method
            ``normalize``.
    """

    def deco(cls):
        if name in ATTENTION_FUNCTIONS:
            raise ValueError(f"attention function {name!r} is already registered")
        if normalizer:
            if not isinstance(inspect.getattr_static(cls, "normalize"), (classmethod, staticmethod)):
                raise ValueError(f"attention function {name!r}: normalizer=True needs a classmethod "
                                 "or staticmethod normalize(scores, mask)")
            NORMALIZERS[name] = cls.normalize
        cls.name = name
        ATTENTION_FUNCTIONS[name] = cls
        return cls

    return deco


def attention_fn_names():
    """Sorted names of all registered attention functions (the valid ``--*-attention-fn`` values)."""
    return sorted(ATTENTION_FUNCTIONS)


def attention_fn_options(name: Optional[str] = None):
    """The options dataclass (:class:`~fairseq_plugins.options.OptionGroup`) of function ``name``
    (None if it has none), or, without ``name``, every options class of the registry in
    registration order (the groups a model config must compose)."""
    if name is not None:
        return ATTENTION_FUNCTIONS[name].options_class if name in ATTENTION_FUNCTIONS else None
    groups: List[Type[OptionGroup]] = []
    for cls in ATTENTION_FUNCTIONS.values():
        if cls.options_class is not None and cls.options_class not in groups:
            groups.append(cls.options_class)
    return groups


def normalizer_names(distribution: Optional[bool] = None) -> List[str]:
    """Sorted names of the plain normalisers (:func:`normalizer`); with ``distribution=True``
    only those whose weights are a distribution over the keys (sum to 1)."""
    return sorted(n for n in NORMALIZERS
                  if distribution is None or ATTENTION_FUNCTIONS[n].is_distribution == distribution)


def normalizer(name: str) -> Callable[[torch.Tensor, Optional[torch.Tensor]], torch.Tensor]:
    """The normaliser of registered function ``name`` as a plain function ``normalize(scores, mask)``:
    scores ``(..., S)`` and bool mask broadcastable to them (True = not attendable) -> weights,
    exact zeros where masked and on fully masked rows.  No module and no sizes are needed.

    Raises:
        ValueError: ``name`` has no plain normaliser (the message lists those that do).
    """
    if name not in NORMALIZERS:
        raise ValueError(f"no plain normaliser {name!r}; valid choices: {', '.join(normalizer_names())}")
    return NORMALIZERS[name]


def build_attention_fn(name: str, embed_dim: int, num_heads: int, args=None) -> "AttentionFunction":
    """Instantiate the registered attention function ``name`` for one attention module.

    Args:
        name: registry key, e.g. ``"softmax"`` or ``"rela_g"``.
        embed_dim: model dimension ``C`` (width of the concatenated heads).
        num_heads: ``H``; ``d_h = C / H``.
        args: optional flat namespace (``argparse.Namespace``, hydra ``DictConfig``, the model
            config, any object) holding the function's hyper-parameters under their flat names
            (``reluformer_gamma``); the function reads them through its
            :attr:`AttentionFunction.options_class` (missing -> the declared default).

    Raises:
        ValueError: unknown ``name`` -- the message lists the valid choices; an invalid
            hyper-parameter -- the message names the flag and the valid range or choices.
    """
    if name not in ATTENTION_FUNCTIONS:
        raise ValueError(
            f"unknown attention function {name!r}; valid choices: {', '.join(attention_fn_names())}. {USER_DIR_HINT}"
        )
    return ATTENTION_FUNCTIONS[name](embed_dim, num_heads, args)


def _at_least_float32(x: torch.Tensor) -> torch.Tensor:
    """Upcast half precision to float32 (normalisers are computed at >= float32, as fairseq does)."""
    return x.float() if x.dtype in (torch.float16, torch.bfloat16) else x


def _null_rows(mask: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    """Rows whose every key is masked: ``(B, 1|H, T|1, 1)`` bool, or None if no mask."""
    if mask is None:
        return None
    return mask.all(dim=-1, keepdim=True)


class AttentionFunction(nn.Module):
    """Base class: scaled dot-product scores, softmax-free hooks left to subclasses.

    Args:
        embed_dim: ``C``; num_heads: ``H``; args: namespace of hyper-parameters or None.

    Subclasses override :meth:`normalize` (required) and optionally :meth:`score`,
    :meth:`post_aggregate`, :meth:`fused` and :meth:`observe`.  A function with
    hyper-parameters declares them in one :class:`~fairseq_plugins.options.OptionGroup`
    dataclass, :attr:`options_class` (flags, defaults, help, valid ranges); the constructor reads
    and validates them from ``args`` into :attr:`options`, and the model config composes the
    group, so the flags of ``fairseq-train`` and the keys of ``fairseq-hydra-train`` come from
    it.  Parameters a function owns (norm gains, gates) live in the function module, i.e. under
    ``<attention>.attn_fn.`` in the state dict.

    Statistics and auxiliary losses go to ``self.aux`` (an
    :class:`~fairseq_plugins.modules.auxiliary.AuxiliaryBuffer`), which the criterion
    ``label_smoothed_cross_entropy_with_reg`` collects.  With ``args.attention_entropy`` set
    (``--attention-entropy``) every function logs, in evaluation mode, the mean entropy of its
    (renormalised) weights ``attn_entropy`` (ReLUFormer Tables 3 and 5) and its null-attention
    rate ``attn_null_rate`` (ReLA Section 5.2, Figure 6); the fused path is then skipped so the
    weights exist.  Nothing
    is recorded unless the buffer is enabled (the criterion enables it), so generation is
    not slowed down.

    ``args.attention_backend`` (``--attention-backend``, one of
    :data:`~fairseq_plugins.attention.backend.BACKENDS`, default ``auto``) chooses the kernels of
    :meth:`fused` (:meth:`uses_triton`); an unknown value raises ``ValueError``.
    """

    name = "base"
    #: False for functions whose weights are not a distribution over keys.
    is_distribution = True
    #: True for functions whose weights can be negative (ReLA's GeLU / Leaky ReLU variants, Table 1
    #: rows 9-10): their null rows are then found weight by weight (:meth:`_record_entropy`);
    #: for non-negative weights a zero row sum is the same test, with no pass over the weights.
    signed_weights = False
    #: Padded *query* rows of the current call, ``(B, T)`` bool (True = padding) or None, set by
    #: the attention module while recording is on (training/validation with the criterion):
    #: statistics and eq. 7 terms average over real tokens only (our choice: the papers do not
    #: say how padding is treated).  Key padding
    #: is in the mask; query padding is not (a padded query still sees real keys).
    query_padding = None
    #: Analysis slot: ``None`` (off, the default: no cost) or a callable ``capture(weights, mask)``
    #: set by :class:`fairseq_plugins.analysis.capture.AttentionCapture`.  While set,
    #: :meth:`wants_weights` is True (the fused path is skipped) and :meth:`observe` hands it
    #: the weights ``(B, H, T, S)`` (before dropout) and the bool mask ``(B|1, 1, T|1, S)``.
    capture = None
    #: the :class:`~fairseq_plugins.options.OptionGroup` of this function's hyper-parameters, or None
    options_class: ClassVar[Optional[Type[OptionGroup]]] = None
    #: projections of the attention module whose output the scores never read (the Synthesizer
    #: functions ignore key content): :class:`~fairseq_plugins.attention.multihead.FunctionalMultiheadAttention`
    #: freezes them (``requires_grad=False``; kept in checkpoints), so they get no optimiser state and
    #: torch DDP (fairseq's default ``--ddp-backend pytorch_ddp`` on GPUs) does not fail on parameters
    #: without a gradient -- training is unchanged, they never had one
    unused_projections: ClassVar[Tuple[str, ...]] = ()

    def __init__(self, embed_dim: int, num_heads: int, args=None):
        super().__init__()
        if embed_dim % num_heads:
            raise ValueError(f"embed_dim {embed_dim} is not divisible by num_heads {num_heads}")
        #: the validated hyper-parameters (an :attr:`options_class` instance) or None
        self.options = self.options_class.from_args(args) if self.options_class is not None else None
        self.embed_dim, self.num_heads = embed_dim, num_heads
        self.head_dim = embed_dim // num_heads
        self.set_qk_dim(embed_dim)
        self.track_entropy = bool(getattr(args, "attention_entropy", False)) if args is not None else False
        self.backend = check_backend(getattr(args, "attention_backend", None))
        #: ``{(device, dtype, family): bool}``: :meth:`uses_triton`'s answers (resolved once per
        #: input device, dtype and kernel family, not on every layer call of every decoding step)
        self._uses_triton: Dict[Tuple[torch.device, torch.dtype, Optional[str]], bool] = {}
        self.aux = AuxiliaryBuffer()

    def set_qk_dim(self, qk_dim: int) -> None:
        """Set the width of the query/key projections over all heads, :attr:`qk_dim` (default
        ``C``; E-ATT's ``--eatt-qk-dim``), its per-head part :attr:`qk_head_dim` and the score
        scale :attr:`scaling` ``= qk_head_dim^-1/2`` (Vaswani et al. eq. 1's ``1/sqrt(d_k)``, E-ATT
        eq. 13's ``1/sqrt(d)``).  The attention module sizes ``q_proj`` / ``k_proj`` from it when
        it is built; values keep ``d = C / H`` per head.

        Raises:
            ValueError: ``qk_dim`` is not a positive multiple of ``H``.
        """
        if qk_dim <= 0 or qk_dim % self.num_heads:
            raise ValueError(f"qk_dim {qk_dim} must be a positive multiple of num_heads {self.num_heads}")
        self.qk_dim = qk_dim
        self.qk_head_dim = qk_dim // self.num_heads
        self.scaling = self.qk_head_dim**-0.5

    #: the Triton kernel family of :meth:`fused` (``"rectified"``, ``"l1softmax"``) or None
    kernel_family = None

    def uses_triton(self, x: torch.Tensor, family: Optional[str] = None) -> bool:
        """True when the Triton kernels of ``family`` (default :attr:`kernel_family`, those of
        :meth:`fused`; ``"norm"``: ReLA's fused norm in :meth:`post_aggregate`; ``"stats"``: ReLUFormer's
        eq. 7 row terms) should run on ``x``
        (its device and dtype; :func:`~fairseq_plugins.attention.backend.resolve_backend`, which
        raises ``RuntimeError`` for ``--attention-backend triton`` where Triton cannot run).
        Resolved once per device, dtype and family (the backend and the machine do not change
        during a run)."""
        family = self.kernel_family if family is None else family
        key = (x.device, x.dtype, family)
        use = self._uses_triton.get(key)
        if use is None:
            use = self._uses_triton[key] = \
                resolve_backend(self.backend, x.device, family, x.dtype) == "triton"
        return use

    #: True for functions whose scores depend on token positions (Synthesizer); the attention
    #: module then calls :meth:`score_at` with the query and key positions instead of :meth:`score`.
    uses_positions = False

    def transform_input(self, x: torch.Tensor, role: str) -> torch.Tensor:
        """Hook on the attention *input* before a projection: ``x`` ``(L, B, C)`` about to enter
        ``q_proj`` (``role="query"``) or ``k_proj`` (``role="key"``); never called for
        ``v_proj``.  Identity by default (E-ATT binarises here, eq. 7)."""
        return x

    def score_at(self, q: torch.Tensor, k: torch.Tensor, q_pos: torch.Tensor,
                 k_pos: torch.Tensor, q_bound: Optional[int] = None) -> torch.Tensor:
        """Scores from queries/keys and their positions (only called when :attr:`uses_positions`).

        Args:
            q ``(B, H, T, d)``, k ``(B, H, S, d)``; q_pos ``(B|1, T)`` and k_pos ``(B|1, S)``
            long, 0-based token positions (left padding not counted; the step index when
            decoding incrementally).
            q_bound: a number every entry of ``q_pos`` is known to be below (the caller's
                static bound: ``S`` in self-attention, ``T`` in cross-attention without a cache),
                or None when only reading ``q_pos`` back would tell (cross-attention decoding).
                Lets a function that must check positions skip the host sync.
        """
        return self.score(q, k)

    def score(self, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        """Scaled dot product ``(q d_h^-1/2) k^T``: q ``(B, H, T, d)``, k ``(B, H, S, d)`` -> ``(B, H, T, S)``."""
        return torch.matmul(q * self.scaling, k.transpose(-1, -2))

    def normalize(self, scores: torch.Tensor, mask: Optional[torch.Tensor]) -> torch.Tensor:
        """Scores ``(B, H, T, S)`` and the dense bool mask (broadcastable, True = blocked; the
        causal pattern already combined in) -> weights ``(B, H, T, S)``, zero where masked and
        on fully masked rows.  Implementations must not read values back to the host (no
        ``.item()``/``bool()`` of a tensor): they run in every layer and decoding step."""
        raise NotImplementedError

    def post_aggregate(self, attn: torch.Tensor) -> torch.Tensor:
        """Hook on the concatenated heads ``(T, B, C)`` before ``out_proj``; identity by default."""
        return attn

    def fused(self, q, k, v, mask, dropout_p: float, causal: bool = False) -> Optional[torch.Tensor]:
        """Optional fused ``alpha V`` ``(B, H, T, d)``; ``None`` means "use score/normalize".

        Args:
            q: ``(B, H, T, d)``; k, v: ``(B, H, S, d)``.
            mask: bool, True = blocked: the ``key_padding_mask`` ``(B|1, 1, 1, S)``, a general
                mask ``(B|1, 1, T, S)``, or None.
            dropout_p: attention dropout (0 in evaluation).
            causal: also block keys ``j > i + (S - T)`` for query ``i`` (the decoder's future
                mask, bottom-right aligned; a no-op for ``T <= 1``).  Equivalent to passing
                :func:`~fairseq_plugins.attention.masks.combined_mask` with ``causal=False``.
        """
        return None

    def wants_weights(self) -> bool:
        """True when :meth:`observe` needs the weights, so the caller must not use :meth:`fused`."""
        return self.capture is not None or (self.track_entropy and not self.training and self.aux.enabled)

    def _hand_to_capture(self, weights: torch.Tensor, mask: Optional[torch.Tensor]) -> None:
        """Give the weights to the analysis :attr:`capture` slot, when one is set."""
        if self.capture is not None:
            self.capture(weights, mask)

    def observe(self, weights: torch.Tensor, mask: Optional[torch.Tensor]) -> None:
        """Called by the attention module with the weights ``(B, H, T, S)`` (before dropout).

        The default records ``attn_entropy`` (mean ``H(s_bar)`` over the rows that have one,
        nats) and ``attn_null_rate`` (fraction of attendable rows whose weights are all exactly
        0) when entropy tracking is on and the module is in evaluation mode
        (:meth:`_record_entropy`), and hands the weights to :attr:`capture`.
        """
        self._hand_to_capture(weights, mask)
        if self.track_entropy and not self.training and self.aux.enabled:
            weights = weights.detach()
            row_sum, row_slogs = row_mass_terms(weights)
            n = valid_keys(mask, weights.size(-1), device=weights.device)
            self._record_entropy(row_sum, row_slogs, n, weights if self.signed_weights else None, mask)

    def counted_rows(self, n: torch.Tensor, row_sum: torch.Tensor) -> torch.Tensor:
        """Rows that enter statistics and losses: ``(B, H, T)`` bool, True where the query may
        see at least one key (``n`` ``(B|1, H|1, T|1, 1)`` valid keys) and is not padding
        (:attr:`query_padding`)."""
        valid = (n.squeeze(-1) > 0).expand_as(row_sum)
        qp = self.query_padding_of(row_sum)
        if qp is not None:
            valid = valid & ~qp.to(valid.device).unsqueeze(1)
        return valid

    def query_padding_of(self, row_sum: torch.Tensor) -> Optional[torch.Tensor]:
        """:attr:`query_padding` ``(B, T)`` when it matches the rows ``(B, H, T)``, else None (no
        query is padding: e.g. beam-folded or incremental calls, where none is set)."""
        qp = self.query_padding
        return qp if qp is not None and qp.shape == (row_sum.size(0), row_sum.size(2)) else None

    def _record_entropy(self, row_sum: torch.Tensor, row_slogs: torch.Tensor, n: torch.Tensor,
                        weights: Optional[torch.Tensor] = None, mask: Optional[torch.Tensor] = None) -> None:
        """Record ``attn_entropy`` and ``attn_null_rate`` over the counted rows (:meth:`counted_rows`).

        Args:
            row_sum, row_slogs: ``(B, H, T)`` row sums of the weights clamped at 0
                (:func:`~fairseq_plugins.attention.stats.row_mass_terms`).
            n: ``(B|1, H|1, T|1, 1)`` valid keys per query.
            weights: ``(B, H, T, S)`` the weights themselves, needed only when they can be
                negative (:attr:`signed_weights`), else None; mask: the dense bool mask
                (True = blocked) or None.

        * ``attn_null_rate``: a row is *null* when every weight over its valid keys is exactly 0
          (ReLA Section 5.2's null attention; the same test as the analyses,
          :func:`fairseq_plugins.analysis.metrics.null_terms`).  For non-negative weights that is
          ``sum s = 0`` (no extra pass); with :attr:`signed_weights` each weight is tested (one
          compare over ``(B, H, T, S)``, in evaluation only): a Leaky ReLU row whose scores are all
          negative has weights ``0.01 s != 0`` and is *not* null.
        * ``attn_entropy``: ``H(s_bar)`` in nats of the weights *clamped at 0*, renormalised
          (ReLUFormer Section 4.2), averaged over the counted rows with positive clamped mass.  Our
          choice for signed weights (GeLU, Leaky ReLU): the entropy of their positive part; a row
          with no positive weight (null, or all weights negative) has no such distribution, and
          its entropy is not defined: it is left out of the mean (and, if not null, not counted as
          null either).  For non-negative weights this is the usual entropy of ``s / sum s``.
        """
        valid = self.counted_rows(n, row_sum)
        has_dist = valid & (row_sum > 0)  # a positive (clamped) weight: H(s_bar) is defined
        if weights is None:  # non-negative weights: all zero <=> zero sum
            null = valid & ~has_dist
        else:
            zero = weights == 0
            if mask is not None:
                zero = zero | mask  # only the valid keys count (masked weights are 0 anyway)
            null = valid & zero.all(dim=-1)
        ent = entropy_from_terms(row_sum, row_slogs).detach()
        self.aux.record("attn_entropy", torch.where(has_dist, ent, 0.0).sum(), has_dist.sum(), False)
        self.aux.record("attn_null_rate", null.sum().float(), valid.sum(), False)


@register_attention_fn("softmax", normalizer=True)
class SoftmaxAttention(AttentionFunction):
    """Softmax attention (Vaswani et al. 2017; ReLA Table 1 row 1, eq. 1).

    Numerically equal to fairseq's ``MultiheadAttention``.  When attention weights are not
    requested it runs through ``torch.nn.functional.scaled_dot_product_attention`` -- the
    kernel stock fairseq also reaches in training -- which gives zeros on fully masked rows;
    the decoder's future mask reaches it as ``is_causal=True`` when there is no
    ``key_padding_mask`` and ``T == S`` (SDPA refuses a mask together with ``is_causal``, and
    aligns its causal pattern top-left), else combined with the padding into one mask.
    """

    @classmethod
    def normalize(cls, scores, mask):
        """Masked softmax over the keys (ReLA eq. 1): scores ``(B, H, T, S)`` -> weights ``(B, H, T, S)``.

        Computed in float32 at least and cast back to the scores' dtype; keys where the bool
        ``mask`` is True get weight 0, and a fully masked row is all zeros (never NaN), with no
        host sync.  Also the plain normaliser ``normalizer("softmax")`` for scores ``(..., S)``."""
        if mask is None:
            return F.softmax(_at_least_float32(scores), dim=-1).type_as(scores)
        # fully masked rows are left unmasked (no softmax over all -inf, NaN) and zeroed after:
        # no host-side test of whether there are any (a device sync in every layer)
        dead = _null_rows(mask)
        scores = scores.masked_fill(mask & ~dead, float("-inf"))
        weights = F.softmax(_at_least_float32(scores), dim=-1).type_as(scores)
        return weights.masked_fill(dead, 0.0)

    def fused(self, q, k, v, mask, dropout_p, causal=False):
        """``softmax(q k^T / sqrt(d)) V`` ``(B, H, T, d)`` through ``F.scaled_dot_product_attention``.

        ``is_causal=True`` when ``causal``, ``T == S > 1`` and no ``mask``; otherwise ``mask`` and the
        causal pattern as one ``attn_mask`` (:func:`~fairseq_plugins.attention.masks.combined_mask`),
        with attention dropout ``dropout_p``.  Never returns None."""
        T, S = q.size(2), k.size(2)
        if causal and T > 1 and mask is None and T == S:
            return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, is_causal=True)
        mask = combined_mask(mask, causal, T, S, q.device)
        return F.scaled_dot_product_attention(
            q, k, v, attn_mask=None if mask is None else ~mask, dropout_p=dropout_p
        )


class _EntmaxAttention(AttentionFunction):
    """Shared masking for the ``entmax`` package normalisers (computed in float32).

    ``entmax`` crashes on a row that is entirely ``-inf`` (deep-spin/entmax issue #19) and
    does not support half precision (#30): dead rows are filled with 0 before and zeroed
    after, and the computation is done in float32.
    """

    @staticmethod
    def _transform(x):
        raise NotImplementedError

    @classmethod
    def normalize(cls, scores, mask):
        dead = _null_rows(mask)
        x = _at_least_float32(scores)
        if mask is not None:
            x = x.masked_fill(mask, float("-inf")).masked_fill(dead, 0.0)
        weights = cls._transform(x).type_as(scores)
        return weights if dead is None else weights.masked_fill(dead, 0.0)


@register_attention_fn("sparsemax", normalizer=True)
class SparsemaxAttention(_EntmaxAttention):
    """Sparsemax attention (Martins & Astudillo 2016; ReLA Table 1 row 2) via ``entmax.sparsemax``."""

    @staticmethod
    def _transform(x):
        from entmax import sparsemax

        return sparsemax(x, dim=-1)


@register_attention_fn("entmax15", normalizer=True)
class Entmax15Attention(_EntmaxAttention):
    """1.5-entmax attention (Peters et al. 2019; ReLA Table 1 row 3) via ``entmax.entmax15``."""

    @staticmethod
    def _transform(x):
        from entmax import entmax15

        return entmax15(x, dim=-1)


@dataclass
class RelaNormOptions(OptionGroup):
    """Options of ReLA's norm on the concatenated heads (``--rela-norm-*``; ReLA eqs. 4-5), read by
    every function of the ReLU family (:class:`_RectifiedAttention`)."""

    prefix = "rela_norm"
    family = "ReLU-family (ReLA)"
    eps: float = option(1e-8, "epsilon of ReLA's (gated) RMSNorm / LayerNorm (released code: 1e-8)", gt=0)
    scope: ChoiceEnum(NORM_SCOPES) = option(
        "concat", "statistics of ReLA's (gated) RMSNorm/LayerNorm: over the concatenated heads "
                  "('concat', ReLA section 4 and the released code; default) or per head ('head', "
                  "eq. 4's one-head notation read per head: a variant, not the paper's method)")


class _RectifiedAttention(AttentionFunction):
    """``alpha = act(f(Q, K^T))`` with masked scores set to 0 before the activation.

    ReLA eq. 3.  Masked positions are filled with 0 *before* ``act`` (as the released code
    does multiplicatively), so ``act(0) = 0`` for ReLU, GeLU and Leaky ReLU and no ``-inf``
    ever meets a multiplication.  A row without a positive score is all zeros for ReLU
    (null attention); GeLU / Leaky ReLU give small negative weights there instead.
    Subclasses choose ``act`` and the normalisation of the concatenated heads.

    Hyper-parameters: :class:`RelaNormOptions` -- ``--rela-norm-eps`` (default 1e-8, the
    released code's) and ``--rela-norm-scope`` (:data:`~fairseq_plugins.modules.norms.NORM_SCOPES`;
    default ``concat``): the norm's statistics over the concatenated heads (ReLA section 4's
    method and the released code) or per head (``head``: eq. 4's one-head notation, ``z in
    R^{d_h}``, read per head -- a variant); :attr:`norm_groups` is 1 or ``H`` accordingly.

    Raises:
        ValueError: an invalid option (:meth:`RelaNormOptions.validate`; names the flag and the
            valid range or choices).
    """

    is_distribution = False
    options_class = RelaNormOptions
    #: activation of the fused Triton kernel (:func:`fairseq_plugins.attention.triton.relu_attention`)
    #: matching :meth:`activation` (a subclass with another activation must name its kernel's)
    kernel_activation = "relu"
    kernel_family = "rectified"

    def activation(self, x):
        return F.relu(x)

    def fused(self, q, k, v, mask, dropout_p, causal=False):
        """``act((q d_h^-1/2) k^T) V`` through the fused Triton kernel when the backend is Triton
        (scores never stored; the norm/gate stay in :meth:`post_aggregate`; ``causal`` skips the
        key tiles after the diagonal, a key padding mask is read once per tile); ``None`` (the
        score/normalize path) with the torch backend."""
        if not self.uses_triton(q):
            return None
        from .triton import relu_attention

        return relu_attention(q, k, v, self.scaling, mask=mask, dropout_p=dropout_p, causal=causal,
                              activation=self.kernel_activation)

    def build_norm(self):
        return None

    def __init__(self, embed_dim, num_heads, args=None):
        super().__init__(embed_dim, num_heads, args)
        self.eps = float(self.options.eps)
        self.norm_groups = num_heads if self.options.scope == "head" else 1
        self.norm = self.build_norm()

    def normalize(self, scores, mask):
        if mask is not None:
            scores = scores.masked_fill(mask, 0.0)
        return self.activation(scores)

    def post_aggregate(self, attn):
        """ReLA's norm (eq. 4) or gated norm (eq. 5) of the concatenated heads ``(T, B, C)``.
        The RMSNorm variants run as one fused op
        (:func:`~fairseq_plugins.modules.norms.gated_rms_norm`), with the Triton kernel when the
        backend resolves to Triton for kernel family ``"norm"`` and a row fits one program's tile
        (:func:`fairseq_plugins.attention.triton.norm.fits`: padded width <= 8192); the LayerNorm variant
        on torch."""
        if self.norm is None:
            return attn
        if not (isinstance(self.norm, RMSNorm) or (isinstance(self.norm, GatedNorm) and self.norm.fused)):
            return self.norm(attn)  # GatedNorm with LayerNorm, or a subclass's own module
        use = self.uses_triton(attn, "norm")
        if use:
            from .triton.norm import fits

            use = fits(attn.size(-1), self.norm_groups)
        return self.norm(attn, backend="triton" if use else "torch")


@register_attention_fn("relu")
class ReluAttention(_RectifiedAttention):
    """ReLU alone, no normalisation (ReLA Table 1 row 4: "optimization failed" in the paper)."""


@register_attention_fn("relu_rmsnorm")
class ReluRMSNormAttention(_RectifiedAttention):
    """ReLU + RMSNorm with gain initialised to 1 (ReLA Table 1 row 5, eqs. 3-4)."""

    def build_norm(self):
        """:class:`~fairseq_plugins.modules.norms.RMSNorm`, gain 1 (ReLA eq. 4; Table 1 row 5)."""
        return RMSNorm(self.embed_dim, eps=self.eps, groups=self.norm_groups)


@register_attention_fn("relu_layernorm")
class ReluLayerNormAttention(_RectifiedAttention):
    """ReLU + LayerNorm on the attention output (ReLUFormer Section 4, its opening, repeated in
    Section 4.1: "we add a layer normalization layer succeeding to the SAN results to adjust the
    variance of SAN. Unfortunately, there still occurs performance degradation"): ``LN(ReLU(Q K^T / sqrt(d_h)) V)``
    over the concatenated heads (``--rela-norm-scope head``: per head), no gate, no
    length-dependent scale (compare ``reluformer``, eq. 6).  LayerNorm eps is at least 1e-5."""

    def build_norm(self):
        """:class:`~fairseq_plugins.modules.norms.GroupedLayerNorm`, eps >= 1e-5 (ReLUFormer Section 4)."""
        return GroupedLayerNorm(self.embed_dim, eps=max(self.eps, 1e-5), groups=self.norm_groups)


@register_attention_fn("rela_i")
class RelaIAttention(_RectifiedAttention):
    """ReLA-i: ReLU + RMSNorm, gain ``g ~ U(±sqrt(3/d_h))`` (ReLA Section 4, footnote 4; Table 1 row 6)."""

    def build_norm(self):
        """:class:`~fairseq_plugins.modules.norms.RMSNorm`, xavier gain, fan ``d_h`` (ReLA-i; Table 1 row 6)."""
        return RMSNorm(self.embed_dim, eps=self.eps, gain_init="xavier", fan=self.head_dim,
                       groups=self.norm_groups)


@register_attention_fn("rela_g")
class RelaGAttention(_RectifiedAttention):
    """ReLA-g: ReLU + ``sigmoid(w ⊙ z) ⊙ RMSNorm(z)`` (ReLA eq. 5; Table 1 row 7)."""

    def build_norm(self):
        """:class:`~fairseq_plugins.modules.norms.GatedNorm` over RMSNorm (ReLA-g, eq. 5; Table 1 row 7)."""
        return GatedNorm(self.embed_dim, norm="rmsnorm", eps=self.eps, groups=self.norm_groups)


@register_attention_fn("rela_g_layernorm")
class RelaGLayerNormAttention(_RectifiedAttention):
    """ReLA-g with LayerNorm in place of RMSNorm (ReLA Table 1 row 8)."""

    def build_norm(self):
        """:class:`~fairseq_plugins.modules.norms.GatedNorm` over LayerNorm (ReLA eq. 5; Table 1 row 8)."""
        return GatedNorm(self.embed_dim, norm="layernorm", eps=self.eps, groups=self.norm_groups)


@register_attention_fn("rela_g_gelu")
class RelaGGeluAttention(RelaGAttention):
    """ReLA-g with GeLU in place of ReLU (ReLA Table 1 row 9)."""

    kernel_activation = "gelu"
    signed_weights = True  # GeLU(x) < 0 for x < 0: null rows are tested weight by weight

    def activation(self, x):
        """GeLU (exact, erf form) in place of eq. 3's ReLU (ReLA Table 1 row 9)."""
        return F.gelu(x)


@register_attention_fn("rela_g_leaky_relu")
class RelaGLeakyReluAttention(RelaGAttention):
    """ReLA-g with Leaky ReLU (slope 0.01) in place of ReLU (ReLA Table 1 row 10)."""

    kernel_activation = "leaky_relu"
    signed_weights = True  # 0.01 x for x < 0: a row of negative scores is not null

    def activation(self, x):
        """Leaky ReLU, slope 0.01, in place of eq. 3's ReLU (ReLA Table 1 row 10)."""
        return F.leaky_relu(x, negative_slope=0.01)


#: choices of ``--reluformer-reg-terms``: which terms of ReLUFormer eq. 7 are training losses
REG_TERMS = ("both", "norm", "entropy")


@dataclass
class ReluFormerOptions(OptionGroup):
    """Options of the ReLUFormer functions (``--reluformer-*``; Shen et al. 2023, eqs. 6-7)."""

    prefix = "reluformer"
    family = "ReLUFormer"
    gamma: float = option(1.0, "gamma of ReLUFormer's variance-reduction factor gamma*sqrt(n/2), which "
                               "divides the scores (eq. 6; not given in the paper)", gt=0)
    entropy_c: float = option(0.7, "entropy bound C = c*log(n) of ReLUFormer eq. 7 (App. A: 0.7; "
                                   "c >= 1 makes the entropy term always 0)", ge=0)
    reg_terms: ChoiceEnum(REG_TERMS) = option(
        "both", "which terms of ReLUFormer's eq. 7 regulariser are trained on (the other is still "
                "logged): both, norm (|log sum s|) or entropy (max(H - c log n, 0))")


class _ReluFormerBase(AttentionFunction):
    """ReLU attention with ReLUFormer's variance-reduction factor and regulariser.

    ReLUFormer (Shen et al. 2023), eq. 6: ``s_ij = ReLU(q_i . k_j) / (gamma sqrt(n_i / 2))``
    with ``q`` scaled by ``d_h^-1/2`` (the multi-head reading of the paper's single-head
    ``X W_Q / sqrt(d)``, eq. 3; as ReLU is positively homogeneous, the choice only rescales gamma,
    which the paper does not give) and ``n_i`` the number of keys query ``i`` may attend to
    (padding not counted; ``i + 1`` under the causal mask, also when decoding incrementally,
    where it is the cache length).  ``h_i = sum_j s_ij v_j``; no normalisation follows.
    :meth:`fused` counts ``n_i`` from the ``key_padding_mask`` and the query position
    (:func:`~fairseq_plugins.attention.stats.keys_per_query`: the non-padding keys
    ``j <= i + (S - T)`` under ``causal``; no ``(T, S)`` scan, no host sync); the score path,
    which has the dense mask anyway, uses :func:`~fairseq_plugins.attention.stats.valid_keys`.

    In training it records the two terms of eq. 7 per query row, averaged over rows and
    heads (the criterion then averages over layers):

    * ``reluformer_norm = |log sum_j s_ij|`` -- the absolute value the text describes;
    * ``reluformer_entropy = max(H(s_bar_i) - c log n_i, 0)`` with ``s_bar = s / sum s``
      (Appendix A: ``c = 0.7``).

    Both are means over the rows that have a distribution: real (non-padding) query tokens
    (:attr:`query_padding`) with at least one visible key and ``sum_j s_ij > 0``.  A *null*
    row (no positive score) has no ``s_bar`` and ``log 0`` is undefined; it passes no
    gradient (ReLU) and is counted by the logged null rate ``attn_null_rate`` instead of adding
    a constant to ``reluformer_norm``.  The entropy (nats) and the null rate are logged too, in
    training and evaluation.

    Hyper-parameters: :class:`ReluFormerOptions` -- ``--reluformer-gamma`` (default 1.0; not
    given in the paper), ``--reluformer-entropy-c`` (0.7), ``--reluformer-reg-terms`` (one of
    :data:`REG_TERMS`, default ``both``): which eq. 7 terms are losses; the other is still
    logged, as a statistic.

    Raises:
        ValueError: an invalid option (:meth:`ReluFormerOptions.validate`: ``gamma`` not a
            finite number > 0, ``entropy_c`` not a finite number >= 0, unknown ``reg_terms``).
    """

    is_distribution = False
    #: False for the "- scale factor" ablation (ReLUFormer Table 5).
    use_scale = True
    options_class = ReluFormerOptions
    kernel_family = "rectified"

    def __init__(self, embed_dim, num_heads, args=None):
        super().__init__(embed_dim, num_heads, args)
        self.gamma = float(self.options.gamma)
        self.entropy_c = float(self.options.entropy_c)
        self.reg_terms = str(self.options.reg_terms)

    def row_scale(self, n: torch.Tensor, factor: float = 1.0) -> torch.Tensor:
        """``factor / (gamma sqrt(n / 2))`` (eq. 6; ``factor`` folds d_h^-1/2 in) for ``n``
        ``(B|1, H|1, T|1, 1)``, in three ops (each a kernel launch on a GPU).  A row with ``n = 0``
        sees no key (every score of it is masked, so ``r_i`` multiplies nothing) and gets the value
        of ``n = 1``.  Without the scale (``reluformer_noscale``): ``factor``."""
        if not self.use_scale:
            return torch.full_like(n, factor)
        return n.clamp_min(1.0).mul_(self.gamma ** 2 / (2.0 * factor ** 2)).rsqrt_()

    def normalize(self, scores, mask):
        n = valid_keys(mask, scores.size(-1), device=scores.device)
        if mask is not None:
            scores = scores.masked_fill(mask, 0.0)
        return F.relu(scores) * self.row_scale(n).to(scores.dtype)

    def wants_weights(self):
        return self.capture is not None  # its own statistics are recorded by observe()/fused()

    def fused(self, q, k, v, mask, dropout_p, causal=False):
        """``s V`` through the fused Triton kernel (:func:`fairseq_plugins.attention.triton.relu_attention`,
        backend Triton) or :func:`~fairseq_plugins.attention.kernels.relu_attention` (torch: chunked,
        scores recomputed in backward, for long inputs; the plain path at sentence lengths); both
        also return the row sums eq. 7 needs, so the weights are never materialised.  Both take
        ``causal`` as a flag (future key blocks skipped); eq. 6's ``n_i`` comes from the key
        padding and the query position (:func:`~fairseq_plugins.attention.stats.keys_per_query`:
        no ``(T, S)`` mask scanned, no host sync)."""
        T = q.size(2)
        n = keys_per_query(mask, causal, T, k.size(2), device=q.device)  # (B|1, 1, T|1, 1)
        need = self.aux.enabled
        if self.uses_triton(q):
            from .triton import relu_attention as triton_relu_attention

            r = self.row_scale(n, self.scaling)  # float32; d_h^-1/2 folded into the row scale
            out = triton_relu_attention(q, k, v, r.expand(r.size(0), r.size(1), T, 1), mask=mask,
                                        dropout_p=dropout_p, need_stats=need, causal=causal)
        else:
            from .kernels import relu_attention

            r = self.row_scale(n).to(q.dtype)
            r = r.expand(r.size(0), r.size(1), T, 1)
            out = relu_attention(q * self.scaling, k, v, r, mask=mask, dropout_p=dropout_p, need_stats=need,
                                 causal=causal)
        if need:
            out, (row_sum, row_slogs) = out
            self.record_terms(row_sum, row_slogs, n)
        return out

    def observe(self, weights, mask):
        self._hand_to_capture(weights, mask)
        if not self.aux.enabled:
            return
        row_sum, row_slogs = row_mass_terms(weights)
        self.record_terms(row_sum, row_slogs, valid_keys(mask, weights.size(-1), device=weights.device))

    def record_terms(self, row_sum: torch.Tensor, row_slogs: torch.Tensor, n: torch.Tensor) -> None:
        """Record eq. 7's two terms (differentiable) and the statistics.

        Args:
            row_sum, row_slogs: ``(B, H, T)`` ``sum_j s_j`` and ``sum_j s_j log s_j``, float32 or
                float64 (both attention paths give at least float32; float16/bfloat16 rows are
                accepted and summed in float32 on the torch path).
            n: ``(B|1, H|1, T|1, 1)`` valid keys per query.

        The sums over rows and the row counts are float32 at least (a float16 count overflows
        from 65,520 rows: ReLUFormer's eq. 7 terms would average to 0 and the null rate to NaN).
        """
        if not self.aux.enabled:
            return
        # over the live rows: |log sum s| (clamped: no log 0 on null rows), max(H - c log n, 0), H
        # one kernel each way (the torch path: ~20 ops + 13); the kernel takes float32/float64 rows
        # (both attention paths give those; half rows from other callers stay on the torch path)
        if row_sum.dtype in (torch.float32, torch.float64) and self.uses_triton(row_sum, "stats"):
            from .triton.stats import reluformer_row_terms as triton_row_terms

            norm, margin, ent, count, null, counted = triton_row_terms(
                row_sum, row_slogs, n.squeeze(-1), self.query_padding_of(row_sum), self.entropy_c)
        else:
            valid = self.counted_rows(n, row_sum)
            norm, margin, ent, count = reluformer_row_terms(row_sum, row_slogs, n.squeeze(-1), valid, self.entropy_c)
            counted = valid.sum(dtype=count.dtype)  # count: float32 (float64 rows: float64)
            null = counted - count
        self.aux.record("reluformer_norm", norm, count, self.reg_terms in ("both", "norm"))
        self.aux.record("reluformer_entropy", margin, count, self.reg_terms in ("both", "entropy"))
        self.aux.record("attn_entropy", ent.detach(), count, False)
        self.aux.record("attn_null_rate", null, counted, False)


@register_attention_fn("reluformer")
class ReluFormerAttention(_ReluFormerBase):
    """ReLUFormer attention (Shen et al. 2023, eq. 6, regulariser eq. 7); see :class:`_ReluFormerBase`."""


@register_attention_fn("reluformer_noscale")
class ReluFormerNoScaleAttention(_ReluFormerBase):
    """ReLUFormer without the variance-reduction factor (Table 5 "- scale factor"):
    ``s_ij = ReLU(q_i . k_j)``, regulariser terms still recorded."""

    use_scale = False
