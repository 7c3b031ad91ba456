"""A fairseq Transformer whose three attention types each take a registered attention function.

One model, ``attention_transformer``; the papers' settings are architecture presets
(``rela_transformer``, ``rela_transformer_iwslt_de_en``, ``rela_transformer_small``,
``reluformer*``, ``eatt_transformer``, ``eatt_transformer_iwslt_de_en``, ``eatt_transformer_small``).
The attention function is chosen per attention type:

* ``--encoder-attention-fn`` (encoder self-attention),
* ``--decoder-attention-fn`` (decoder self-attention),
* ``--cross-attention-fn`` (encoder-decoder attention),

each one of :func:`fairseq_plugins.attention.attention_fn_names`.  With all three set to
``softmax`` the model is numerically fairseq's stock ``transformer`` (same parameter names,
shapes and initialisation order), which is the baseline of ReLA Table 1 row 1.

Only the layer factories are overridden (``build_encoder_layer``/``build_decoder_layer`` and
the layers' ``build_self_attention``/``build_encoder_attention``); fairseq's classes do the rest.
"""

import logging
import math

from fairseq.distributed import fsdp_wrap
from fairseq.models import register_model, register_model_architecture
from fairseq.models.transformer import (
    TransformerDecoderBase,
    TransformerEncoderBase,
    TransformerModel,
)
from fairseq.models.transformer.transformer_legacy import (
    base_architecture,
    transformer_iwslt_de_en,
)
from fairseq.modules.transformer_layer import (
    TransformerDecoderLayerBase,
    TransformerEncoderLayerBase,
)
from fairseq.modules.checkpoint_activations import checkpoint_wrapper

from ..attention import FunctionalMultiheadAttention, attention_fn_names, build_attention_fn
from ..attention.backend import BACKENDS
from ..attention.functions import REG_TERMS
from ..modules.auxiliary import clear_auxiliary
from ..modules.ffn import FFN_ACTIVATIONS, configure_ffn
from ..modules.norms import NORM_SCOPES

__all__ = ["AttentionTransformerModel", "ATTENTION_TYPES", "validate_args"]

logger = logging.getLogger(__name__)

#: attention type -> (command-line option, attribute on args/cfg)
ATTENTION_TYPES = {
    "encoder": ("--encoder-attention-fn", "encoder_attention_fn"),
    "decoder": ("--decoder-attention-fn", "decoder_attention_fn"),
    "cross": ("--cross-attention-fn", "cross_attention_fn"),
}


def _attention(cfg, kind: str, embed_dim: int, num_heads: int, quant_noise, qn_block_size, **kw):
    """Build the :class:`FunctionalMultiheadAttention` for attention type ``kind``."""
    fn = build_attention_fn(getattr(cfg, ATTENTION_TYPES[kind][1]), embed_dim, num_heads, cfg)
    return FunctionalMultiheadAttention(
        embed_dim, num_heads, fn, dropout=cfg.attention_dropout,
        q_noise=quant_noise, qn_block_size=qn_block_size, **kw,
    )


class AttentionEncoderLayer(TransformerEncoderLayerBase):
    """fairseq's encoder layer with the self-attention built from ``cfg.encoder_attention_fn``
    and the FFN options of :func:`~fairseq_plugins.modules.ffn.configure_ffn`."""

    def __init__(self, cfg, return_fc=False):
        super().__init__(cfg, return_fc=return_fc)
        configure_ffn(self, cfg)

    def build_self_attention(self, embed_dim, cfg):
        return _attention(cfg, "encoder", embed_dim, cfg.encoder.attention_heads,
                          self.quant_noise, self.quant_noise_block_size, self_attention=True)


class AttentionDecoderLayer(TransformerDecoderLayerBase):
    """fairseq's decoder layer with self- and cross-attention built from the chosen functions
    and the FFN options of :func:`~fairseq_plugins.modules.ffn.configure_ffn`."""

    def __init__(self, cfg, no_encoder_attn=False, add_bias_kv=False, add_zero_attn=False):
        super().__init__(cfg, no_encoder_attn=no_encoder_attn, add_bias_kv=add_bias_kv,
                         add_zero_attn=add_zero_attn)
        configure_ffn(self, cfg)

    def forward(self, x, encoder_out=None, encoder_padding_mask=None, incremental_state=None,
                prev_self_attn_state=None, prev_attn_state=None, self_attn_mask=None,
                self_attn_padding_mask=None, need_attn=False, need_head_weights=False):
        """fairseq's decoder layer, with the target padding ``(B, T)`` handed to the
        cross-attention as its query padding (statistics and auxiliary losses of the
        attention functions average over real target tokens only)."""
        cross = self.encoder_attn
        if cross is not None:
            cross.query_padding_mask = self_attn_padding_mask
        try:
            return super().forward(
                x, encoder_out=encoder_out, encoder_padding_mask=encoder_padding_mask,
                incremental_state=incremental_state, prev_self_attn_state=prev_self_attn_state,
                prev_attn_state=prev_attn_state, self_attn_mask=self_attn_mask,
                self_attn_padding_mask=self_attn_padding_mask, need_attn=need_attn,
                need_head_weights=need_head_weights)
        finally:
            if cross is not None:
                cross.query_padding_mask = None

    def build_self_attention(self, embed_dim, cfg, add_bias_kv=False, add_zero_attn=False):
        return _attention(cfg, "decoder", embed_dim, cfg.decoder.attention_heads,
                          self.quant_noise, self.quant_noise_block_size,
                          add_bias_kv=add_bias_kv, add_zero_attn=add_zero_attn,
                          self_attention=not cfg.cross_self_attention)

    def build_encoder_attention(self, embed_dim, cfg):
        return _attention(cfg, "cross", embed_dim, cfg.decoder.attention_heads,
                          self.quant_noise, self.quant_noise_block_size,
                          kdim=cfg.encoder.embed_dim, vdim=cfg.encoder.embed_dim,
                          encoder_decoder_attention=True)


def _wrap(layer, cfg):
    """Activation checkpointing and FSDP wrapping exactly as fairseq's layer factories do."""
    if cfg.checkpoint_activations:
        layer = checkpoint_wrapper(layer, offload_to_cpu=cfg.offload_activations)
    min_params_to_wrap = cfg.min_params_to_wrap if not cfg.checkpoint_activations else 0
    return fsdp_wrap(layer, min_num_params=min_params_to_wrap)


class AttentionTransformerEncoder(TransformerEncoderBase):
    """Transformer encoder whose layers are :class:`AttentionEncoderLayer`."""

    def build_encoder_layer(self, cfg):
        return _wrap(AttentionEncoderLayer(cfg, return_fc=self.return_fc), cfg)


class AttentionTransformerDecoder(TransformerDecoderBase):
    """Transformer decoder whose layers are :class:`AttentionDecoderLayer`."""

    def build_decoder_layer(self, cfg, no_encoder_attn=False):
        return _wrap(AttentionDecoderLayer(cfg, no_encoder_attn), cfg)


#: criterions that train on (and log) the auxiliary terms modules record
AUX_CRITERIONS = ("label_smoothed_cross_entropy_with_reg",)


def validate_args(args):
    """Check the attention functions and their hyper-parameters before the model is built.

    Args:
        args: the fairseq-train/-generate namespace (after the arch preset filled defaults).

    Raises:
        ValueError: an unknown ``--*-attention-fn`` (lists the valid choices); a non-finite or
            non-positive ``--reluformer-gamma`` or ``--rela-norm-eps``; a non-finite or negative
            ``--reluformer-entropy-c``.

    Warns (``logger.warning``, training continues) for legal but probably unintended settings:
    a ReLUFormer function trained with a criterion that ignores its eq. 7 regulariser
    (``--criterion`` not in :data:`AUX_CRITERIONS`; use ``--reg-weight 0`` with
    ``label_smoothed_cross_entropy_with_reg`` for the "- reg loss" ablation, which still logs
    the terms); ``--attention-entropy`` with such a criterion (nothing would be logged);
    ``--reluformer-entropy-c >= 1`` (H(s_bar) <= log n, so the entropy term is always 0);
    ``--reluformer-*`` given while no attention type uses a ReLUFormer function.
    """
    valid = attention_fn_names()
    names = []
    for kind, (flag, attr) in ATTENTION_TYPES.items():
        name = getattr(args, attr)
        if name not in valid:
            raise ValueError(f"{flag} {name!r} is not a registered attention function; "
                             f"valid choices: {', '.join(valid)}")
        names.append(name)
    gamma = getattr(args, "reluformer_gamma", None)
    if gamma is not None and not (math.isfinite(gamma) and gamma > 0):
        raise ValueError(f"--reluformer-gamma must be a finite number > 0 (the factor gamma*sqrt(n/2) "
                         f"divides the scores, ReLUFormer eq. 6), got {gamma}")
    c = getattr(args, "reluformer_entropy_c", None)
    if c is not None and not (math.isfinite(c) and c >= 0):
        raise ValueError(f"--reluformer-entropy-c must be a finite number >= 0 (bound c*log n of "
                         f"ReLUFormer eq. 7; the paper uses 0.7), got {c}")
    eps = getattr(args, "rela_norm_eps", None)
    if eps is not None and not (math.isfinite(eps) and eps > 0):
        raise ValueError(f"--rela-norm-eps must be a finite number > 0, got {eps}")
    uses_reluformer = any(n.startswith("reluformer") for n in names)
    criterion = getattr(args, "criterion", None)
    if uses_reluformer and c is not None and c >= 1:
        logger.warning("--reluformer-entropy-c %s >= 1: H(s_bar) <= log n, so the entropy term of "
                       "eq. 7 is always 0", c)
    if criterion is not None and criterion not in AUX_CRITERIONS:
        if uses_reluformer:
            logger.warning("attention functions %s record ReLUFormer's eq. 7 regulariser, but "
                           "--criterion %s ignores it (trained without it); use --criterion %s "
                           "(--reg-weight 0 logs the terms without training on them)",
                           sorted(set(n for n in names if n.startswith("reluformer"))), criterion,
                           " or ".join(AUX_CRITERIONS))
        if getattr(args, "attention_entropy", False):
            logger.warning("--attention-entropy: the statistics are logged by --criterion %s only, "
                           "not by %s", " or ".join(AUX_CRITERIONS), criterion)
    if not uses_reluformer:
        given = [f for f, a in (("--reluformer-gamma", "reluformer_gamma"),
                                ("--reluformer-entropy-c", "reluformer_entropy_c"),
                                ("--reluformer-reg-terms", "reluformer_reg_terms"))
                 if getattr(args, a, None) is not None]
        if given:
            logger.warning("%s given but no attention type uses a ReLUFormer function "
                           "(functions: %s); ignored", ", ".join(given), ", ".join(names))


@register_model("attention_transformer")
class AttentionTransformerModel(TransformerModel):
    """Transformer (Vaswani et al. 2017) with a selectable attention function per attention type.

    Raises (at start-up, from :meth:`build_model`, via :func:`validate_args`):
        ValueError: an unknown attention function name (the message lists the valid choices)
            or an out-of-range hyper-parameter.
    """

    @classmethod
    def add_args(cls, parser):
        super().add_args(parser)
        names = attention_fn_names()
        for kind, (flag, _) in ATTENTION_TYPES.items():
            parser.add_argument(
                flag, choices=names, metavar="FN",
                help=f"attention function of the {kind} attention; one of: {', '.join(names)}",
            )
        parser.add_argument("--rela-norm-eps", type=float, metavar="EPS",
                            help="epsilon of ReLA's (gated) RMSNorm (released code: 1e-8)")
        parser.add_argument("--rela-norm-scope", choices=NORM_SCOPES,
                            help="statistics of ReLA's (gated) RMSNorm/LayerNorm: over the "
                                 "concatenated heads ('concat', the released code; default) or "
                                 "per head ('head', the paper's text: z, g in R^{d_h})")
        parser.add_argument("--reluformer-reg-terms", choices=REG_TERMS,
                            help="which terms of ReLUFormer's eq. 7 regulariser are trained on "
                                 "(the other is still logged): both (default), norm "
                                 "(|log sum s|) or entropy (max(H - c log n, 0))")
        parser.add_argument("--reluformer-gamma", type=float, metavar="G",
                            help="gamma of ReLUFormer's variance-reduction factor "
                                 "gamma*sqrt(n/2) (eq. 6; default 1.0)")
        parser.add_argument("--reluformer-entropy-c", type=float, metavar="C",
                            help="entropy bound C = c*log(n) of ReLUFormer eq. 7 (default 0.7)")
        parser.add_argument("--eatt-tau", type=float, metavar="TAU",
                            help="E-ATT binarisation threshold tau of f(x) = 1[x > tau] (eq. 7) "
                                 "and centre of the surrogate gradient (eq. 8); default 1.0 "
                                 "(the paper's appendix; the official code uses 0.0)")
        parser.add_argument("--synth-max-len", type=int, metavar="L",
                            help="maximum token position + 1 of the Synthesizer functions "
                                 "synth_dense / synth_random (default 256)")
        parser.add_argument("--synth-random-fixed", action="store_true",
                            help="keep synth_random's score matrix fixed at its random "
                                 "initialisation (default: trained, the paper's RandInit)")
        parser.add_argument("--attention-backend", choices=BACKENDS,
                            help="kernels of the fused attention paths: auto (default: triton on "
                                 "CUDA when triton imports, else torch), torch (the PyTorch "
                                 "reference), triton (fused Triton kernels; on CPU only with "
                                 "TRITON_INTERPRET=1)")
        parser.add_argument("--attention-entropy", action="store_true",
                            help="log the mean attention entropy and null rate of every "
                                 "attention in evaluation (validation) mode")
        parser.add_argument("--ffn-activation", choices=sorted(FFN_ACTIVATIONS),
                            help="FFN activation over the d_ff slots (ReLUFormer Table 1); "
                                 "default: --activation-fn")
        parser.add_argument("--ffn-output-layernorm", action="store_true",
                            help="LayerNorm on the FFN output, LN(act(X W1) W2) "
                                 "(ReLUFormer Section 3.2)")

    @classmethod
    def build_model(cls, args, task):
        attention_transformer_base(args)
        validate_args(args)
        return super().build_model(args, task)

    def forward(self, *args, **kwargs):
        """fairseq's forward, after dropping the auxiliary records of any earlier pass, so that
        terms recorded with a graph never pile up across steps when the criterion does not
        collect them (e.g. plain ``label_smoothed_cross_entropy``)."""
        clear_auxiliary(self)
        return super().forward(*args, **kwargs)

    @classmethod
    def build_encoder(cls, cfg, src_dict, embed_tokens):
        return AttentionTransformerEncoder(cfg, src_dict, embed_tokens)

    @classmethod
    def build_decoder(cls, cfg, tgt_dict, embed_tokens):
        return AttentionTransformerDecoder(
            cfg, tgt_dict, embed_tokens, no_encoder_attn=cfg.no_cross_attention)


def _set_attention_fns(args, default: str):
    for _, attr in ATTENTION_TYPES.values():
        if getattr(args, attr, None) is None:
            setattr(args, attr, default)
    if getattr(args, "rela_norm_eps", None) is None:
        args.rela_norm_eps = 1e-8


@register_model_architecture("attention_transformer", "attention_transformer")
def attention_transformer_base(args):
    """Transformer base with softmax everywhere unless a flag says otherwise."""
    _set_attention_fns(args, "softmax")
    base_architecture(args)


@register_model_architecture("attention_transformer", "rela_transformer")
def rela_transformer(args):
    """ReLA paper setting (Section 5): Transformer base, ReLA-g in all three attention types."""
    _set_attention_fns(args, "rela_g")
    base_architecture(args)


@register_model_architecture("attention_transformer", "rela_transformer_iwslt_de_en")
def rela_transformer_iwslt_de_en(args):
    """fairseq's ``transformer_iwslt_de_en`` sizes (6+6 layers, 4 heads, d 512, FFN 1024), ReLA-g."""
    _set_attention_fns(args, "rela_g")
    transformer_iwslt_de_en(args)


def small_preset(args):
    """The CPU preset used for results here: 3+3 layers, d 256, 4 heads (d_h 64), FFN 1024,
    all embeddings shared (needs a joined dictionary), dropout 0.1."""
    args.encoder_embed_dim = getattr(args, "encoder_embed_dim", 256)
    args.encoder_ffn_embed_dim = getattr(args, "encoder_ffn_embed_dim", 1024)
    args.encoder_attention_heads = getattr(args, "encoder_attention_heads", 4)
    args.encoder_layers = getattr(args, "encoder_layers", 3)
    args.decoder_embed_dim = getattr(args, "decoder_embed_dim", 256)
    args.decoder_ffn_embed_dim = getattr(args, "decoder_ffn_embed_dim", 1024)
    args.decoder_attention_heads = getattr(args, "decoder_attention_heads", 4)
    args.decoder_layers = getattr(args, "decoder_layers", 3)
    args.share_all_embeddings = getattr(args, "share_all_embeddings", True)
    base_architecture(args)


@register_model_architecture("attention_transformer", "rela_transformer_small")
def rela_transformer_small(args):
    """CPU-sized ReLA-g Transformer (see :func:`small_preset`)."""
    _set_attention_fns(args, "rela_g")
    small_preset(args)


def _reluformer(args):
    _set_attention_fns(args, "reluformer")
    if getattr(args, "reluformer_gamma", None) is None:  # (not `or`: 0 must reach the check)
        args.reluformer_gamma = 1.0
    if getattr(args, "reluformer_entropy_c", None) is None:
        args.reluformer_entropy_c = 0.7


@register_model_architecture("attention_transformer", "reluformer")
def reluformer(args):
    """ReLUFormer (Shen et al. 2023): Transformer base, ReLUFormer attention (eq. 6) in encoder
    self, decoder self and cross attention, ReLU FFN.  Train with the criterion
    ``label_smoothed_cross_entropy_with_reg`` (eq. 7)."""
    _reluformer(args)
    base_architecture(args)


@register_model_architecture("attention_transformer", "reluformer_iwslt_de_en")
def reluformer_iwslt_de_en(args):
    """ReLUFormer at the paper's IWSLT14 size (App. A.2: 6+6 layers, 4 heads, d 512, FFN 1024)."""
    _reluformer(args)
    transformer_iwslt_de_en(args)


@register_model_architecture("attention_transformer", "reluformer_small")
def reluformer_small(args):
    """CPU-sized ReLUFormer, same sizes as ``rela_transformer_small`` (see :func:`small_preset`)."""
    _reluformer(args)
    small_preset(args)


def _eatt(args):
    _set_attention_fns(args, "eatt")
    if getattr(args, "eatt_tau", None) is None:
        args.eatt_tau = 1.0


@register_model_architecture("attention_transformer", "eatt_transformer")
def eatt_transformer(args):
    """E-ATT paper setting (Section 4.1, App. B): Transformer base with E-ATT (binarised
    selection + L1 scores, eqs. 7-13) in encoder self, decoder self and cross attention --
    the paper replaces every attention (its Figure 2 reports rho for Enc-Self, Dec-Self and
    cross attention; the official code has an incremental E-ATT decoder self-attention);
    tau = 1.0 (App. B).  Hybrids (Table 5): override any of the three ``--*-attention-fn``."""
    _eatt(args)
    base_architecture(args)


@register_model_architecture("attention_transformer", "eatt_transformer_iwslt_de_en")
def eatt_transformer_iwslt_de_en(args):
    """E-ATT at fairseq's ``transformer_iwslt_de_en`` sizes (6+6 layers, 4 heads, d 512, FFN 1024)."""
    _eatt(args)
    transformer_iwslt_de_en(args)


@register_model_architecture("attention_transformer", "eatt_transformer_small")
def eatt_transformer_small(args):
    """CPU-sized E-ATT Transformer, same sizes as ``rela_transformer_small`` (:func:`small_preset`)."""
    _eatt(args)
    small_preset(args)


@register_model_architecture("transformer", "stock_transformer_small")
def stock_transformer_small(args):
    """fairseq's stock ``transformer`` model at the CPU preset's sizes (the unmodified baseline
    that ``rela_transformer_small`` with ``softmax`` everywhere must equal)."""
    small_preset(args)
