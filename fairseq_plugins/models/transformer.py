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

Options: every option of the model is declared once, in :class:`AttentionTransformerConfig`
(fairseq's ``TransformerConfig`` plus the plugin's fields, each with its help text and valid
range).  The hyper-parameters of the attention functions are the functions' own option groups
(:class:`~fairseq_plugins.options.OptionGroup`: ``rela_norm``, ``reluformer``, ``eatt``,
``synth``; the FFN's ``ffn``), composed as fields; fairseq generates the flags from the
dataclass (``reluformer.gamma`` -> ``--reluformer-gamma``).  The same flat names are the keys of
``model:`` in a ``fairseq-hydra-train`` YAML (``reluformer_gamma: 1.0``; see ``configs/hydra/``).
The arch presets' families are dataclasses too (:class:`RelaTransformerConfig`,
:class:`ReluFormerTransformerConfig`, :class:`EattTransformerConfig`), which only change defaults.

Why the model stays registered without ``dataclass=`` (fairseq "legacy" model with a dataclass
that generates its flags, as fairseq's own ``transformer``): fairseq's
``convert_namespace_to_omegaconf`` cannot convert a flat ``fairseq-train`` namespace into a
``TransformerConfig``-based dataclass model (its nested ``encoder``/``decoder`` defaults become
unparsable overrides), arch presets other than the model name are never merged with a model
dataclass, and ``fairseq-hydra-train`` merges model dataclasses before ``common.user_dir`` is
imported.  :meth:`AttentionTransformerConfig.from_namespace` reads both a ``Namespace`` and a
hydra ``DictConfig`` (fairseq's ``TransformerConfig.from_namespace`` drops every extra key of a
``DictConfig``, which made every plugin option vanish under ``fairseq-hydra-train``), and
:meth:`AttentionTransformerModel.build_model` refuses ``model:`` keys that are no option.

Only the layer factories are overridden (``build_encoder_layer``/``build_decoder_layer`` and
the layers' ``build_self_attention``/``build_encoder_attention``); fairseq's classes do the rest.
"""

import logging
from argparse import Namespace
from dataclasses import dataclass, field, fields
from typing import Dict, Set, Type

from fairseq.dataclass import ChoiceEnum, FairseqDataclass
from fairseq.dataclass.utils import gen_parser_from_dataclass, interpret_dc_type
from fairseq.distributed import fsdp_wrap
from fairseq.models import register_model, register_model_architecture
from fairseq.models.transformer import (
    TransformerConfig,
    TransformerDecoderBase,
    TransformerEncoderBase,
    TransformerModel,
)
from fairseq.models.transformer.transformer_config import (
    DecoderConfig,
    EncDecBaseConfig,
    QuantNoiseConfig,
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
from fairseq.utils import safe_getattr
from omegaconf import OmegaConf

from ..attention import FunctionalMultiheadAttention, attention_fn_names, build_attention_fn
from ..attention.backend import BACKENDS
from ..attention.eatt import EattOptions, SynthOptions
from ..attention.functions import RelaNormOptions, ReluFormerOptions, attention_fn_options
from ..modules.auxiliary import clear_auxiliary
from ..modules.ffn import FfnOptions, configure_ffn
from ..options import OptionGroup, check_fields, option
from ..trained_data import record_or_check
from ..user_dir import USER_DIR_HINT
from ._config import check_model_keys, config_context, fill_defaults
from .precision import check_precision_flags, training_config
from .ranges import check_training_ranges

__all__ = ["AttentionTransformerModel", "AttentionTransformerConfig", "RelaTransformerConfig",
           "ReluFormerTransformerConfig", "EattTransformerConfig", "ATTENTION_TYPES", "validate_args"]

logger = logging.getLogger(__name__)

#: attention type -> (command-line option, attribute on args/cfg)
ATTENTION_TYPES = {
    "encoder": ("--encoder-attention-fn", "encoder_attention_fn"),
    "decoder": ("--decoder-attention-fn", "decoder_attention_fn"),
    "cross": ("--cross-attention-fn", "cross_attention_fn"),
}

_TYPE_NAMES = {"encoder": "encoder self-attention", "decoder": "decoder self-attention",
               "cross": "encoder-decoder (cross) attention"}


def attention_fn_field(kind: str, default: str = "softmax"):
    """The dataclass field of ``--{kind}-attention-fn`` with default ``default`` (the choices are the
    registry's, set on the flag when the parser is built, so functions registered later count)."""
    return option(default, f"attention function of the {_TYPE_NAMES[kind]}: a registered name "
                           "(fairseq_plugins.attention.attention_fn_names())")


#: fairseq's sub-configs of TransformerConfig (flat prefix -> class)
_FAIRSEQ_SUBCONFIGS = {"encoder": EncDecBaseConfig, "decoder": DecoderConfig, "quant_noise": QuantNoiseConfig}


@dataclass
class AttentionTransformerConfig(TransformerConfig):
    """Every option of ``attention_transformer``: fairseq's ``TransformerConfig`` plus the plugin's.

    Flat names (``args.reluformer_gamma``, the ``model:`` keys of a hydra YAML) map onto the
    option groups (``cfg.reluformer.gamma``) as fairseq maps ``encoder_embed_dim`` onto
    ``cfg.encoder.embed_dim``; reading and writing the flat name works on an instance.

    Where a new model-wide option goes: a field here (as ``attention_backend``) -- the flag, its help, the
    hydra key, the default written into checkpoints by every arch preset and the check at build
    all follow.  A new hyper-parameter of one family of attention functions goes into that
    family's :class:`~fairseq_plugins.options.OptionGroup` (a new family: a new group, composed
    here as a field named like its prefix).
    """

    encoder_attention_fn: str = attention_fn_field("encoder")
    decoder_attention_fn: str = attention_fn_field("decoder")
    cross_attention_fn: str = attention_fn_field("cross")
    # option groups of the attention-function families (field name == the group's prefix)
    rela_norm: RelaNormOptions = field(default_factory=RelaNormOptions)
    reluformer: ReluFormerOptions = field(default_factory=ReluFormerOptions)
    eatt: EattOptions = field(default_factory=EattOptions)
    synth: SynthOptions = field(default_factory=SynthOptions)
    ffn: FfnOptions = field(default_factory=FfnOptions)
    attention_entropy: bool = option(False, "log the mean attention entropy and null rate of every attention "
                                            "in evaluation (validation) mode")
    attention_backend: ChoiceEnum(BACKENDS) = option(
        "auto", "kernels of the fused attention paths: auto (triton on CUDA when triton imports and passes "
                "a start-up parity check, else torch), torch (the PyTorch reference), triton (fused Triton "
                "kernels; on CPU only with TRITON_INTERPRET=1)")

    def __post_init__(self):
        # fairseq's TransformerConfig defaults its sub-configs to the *classes*; writing
        # cfg.encoder_embed_dim on such an instance would change the class for everyone.
        for name, cls in _FAIRSEQ_SUBCONFIGS.items():
            if isinstance(self.__dict__.get(name), type):
                object.__setattr__(self, name, cls())

    # -- flat names ---------------------------------------------------------------------------
    @classmethod
    def groups(cls) -> Dict[str, Type[OptionGroup]]:
        """The composed option groups: field name (== prefix) -> class."""
        out = {}
        for f in fields(cls):
            t = interpret_dc_type(f.type)
            if isinstance(t, type) and issubclass(t, OptionGroup):
                if t.prefix != f.name:
                    raise TypeError(f"{cls.__name__}.{f.name}: option group {t.__name__} has prefix "
                                    f"{t.prefix!r}; the field must be named like it")
                out[f.name] = t
        return out

    @classmethod
    def plugin_keys(cls) -> Dict[str, object]:
        """Flat name -> default of every option the plugin adds to fairseq's (fields of this class
        not in ``TransformerConfig``, option groups flattened): what every arch preset records."""
        base = {f.name for f in fields(TransformerConfig)}
        groups = cls.groups()
        default = cls()
        out = {}
        for f in fields(cls):
            if f.name in base:
                continue
            if f.name in groups:
                g = getattr(default, f.name)
                out.update({g.attr(n): getattr(g, n) for n in g.option_names()})
            else:
                out[f.name] = getattr(default, f.name)
        return out

    @classmethod
    def flat_keys(cls) -> Set[str]:
        """Every flat option name (fairseq's and the plugin's; sub-configs as ``encoder_embed_dim``)."""
        keys = set()
        for f in fields(cls):
            t = interpret_dc_type(f.type)
            if isinstance(t, type) and issubclass(t, FairseqDataclass):
                keys |= {f"{f.name}_{g.name}" for g in fields(t) if not g.name.startswith("_")}
            else:
                keys.add(f.name)
        return keys

    @staticmethod
    def _split(name):
        """``"reluformer_gamma"`` -> ``("reluformer", "gamma")``; ``(None, None)`` if no group option."""
        for prefix, keys in _GROUP_KEYS.items():
            if name.startswith(prefix + "_") and name[len(prefix) + 1:] in keys:
                return prefix, name[len(prefix) + 1:]
        return None, None

    def __getattr__(self, name):  # only called when normal lookup fails
        if not name.startswith("__"):
            group, key = self._split(name)
            if group is not None:
                return getattr(self.__dict__[group], key)
        return super().__getattr__(name)

    def __setattr__(self, name, value):
        if name in _OWN_FIELDS:
            object.__setattr__(self, name, value)
            return
        group, key = self._split(name)
        if group is not None:
            setattr(self.__dict__[group], key, value)
        else:
            super().__setattr__(name, value)

    # -- from fairseq's args ------------------------------------------------------------------
    @classmethod
    def from_namespace(cls, args):
        """The config of a flat ``argparse.Namespace`` (``fairseq-train``, old checkpoints) or a
        flat ``DictConfig`` (``fairseq-hydra-train``, its checkpoints); an instance is returned as is.

        fairseq's ``TransformerConfig.from_namespace`` (prefixed keys go into the
        ``encoder``/``decoder``/``quant_noise`` sub-configs; every other attribute is kept on the
        config, the plugin's flat names landing in their option groups), on a ``Namespace``: a
        ``DictConfig`` is converted first (of a ``DictConfig`` fairseq would keep no extra key).  A
        missing plugin option keeps its default (the arch presets fill every one, :func:`apply_family`).
        """
        if OmegaConf.is_config(args):
            args = Namespace(**OmegaConf.to_container(args, resolve=True))
        return super().from_namespace(args)

    # -- the one check ------------------------------------------------------------------------
    def validate(self) -> None:
        """Check every option at build: the attention functions are registered; every number of
        the config (fairseq's too: ``--dropout nan`` is refused) is finite and in range; every
        choice is valid; each option group checks its own fields (:meth:`OptionGroup.validate`).

        Raises:
            ValueError: naming the flag and the valid choices or range.
        """
        valid = attention_fn_names()
        for flag, attr in ATTENTION_TYPES.values():
            name = getattr(self, attr)
            if name not in valid:
                raise ValueError(f"{flag} {name!r} is not a registered attention function; "
                                 f"valid choices: {', '.join(valid)}. {USER_DIR_HINT}")
        check_fields(self)


_OWN_FIELDS = frozenset(f.name for f in fields(AttentionTransformerConfig)) - \
    frozenset(f.name for f in fields(TransformerConfig))
#: option group prefix -> its field names (the flat names ``<prefix>_<name>`` an instance maps)
_GROUP_KEYS = {p: frozenset(g.option_names()) for p, g in AttentionTransformerConfig.groups().items()}


@dataclass
class RelaTransformerConfig(AttentionTransformerConfig):
    """ReLA (Zhang, Titov & Sennrich 2021, Section 5): ReLA-g (eq. 5) in all three attention types."""

    encoder_attention_fn: str = attention_fn_field("encoder", "rela_g")
    decoder_attention_fn: str = attention_fn_field("decoder", "rela_g")
    cross_attention_fn: str = attention_fn_field("cross", "rela_g")


@dataclass
class ReluFormerTransformerConfig(AttentionTransformerConfig):
    """ReLUFormer (Shen et al. 2023): ReLUFormer attention (eq. 6) in all three attention types;
    train with ``--criterion label_smoothed_cross_entropy_with_reg`` (eq. 7)."""

    encoder_attention_fn: str = attention_fn_field("encoder", "reluformer")
    decoder_attention_fn: str = attention_fn_field("decoder", "reluformer")
    cross_attention_fn: str = attention_fn_field("cross", "reluformer")


@dataclass
class EattTransformerConfig(AttentionTransformerConfig):
    """E-ATT (Section 4.1, App. B): E-ATT (binarised selection + L1 scores, eqs. 7-13) in all three
    attention types -- the paper replaces every attention (its Figure 2 reports rho for
    Enc-Self, Dec-Self and cross attention; the official code's ``E-ATT.py`` decodes its E-ATT
    self-attention incrementally, ``MultiHeadSelfAttention.forward_for_infer``); tau = 1.0 (App. B, :class:`~fairseq_plugins.attention.eatt.EattOptions`)."""

    encoder_attention_fn: str = attention_fn_field("encoder", "eatt")
    decoder_attention_fn: str = attention_fn_field("decoder", "eatt")
    cross_attention_fn: str = attention_fn_field("cross", "eatt")


def apply_family(args, family: Type[AttentionTransformerConfig] = AttentionTransformerConfig) -> None:
    """Fill every plugin option ``args`` lacks (missing or None) with ``family``'s default -- the
    family differs from :class:`AttentionTransformerConfig` only where its dataclass says so (the
    attention functions) -- so ``cfg.model`` in a checkpoint records every function and
    hyper-parameter.  Explicit values (0 included) are kept and reach the check at build.

    Args:
        args: ``Namespace`` or ``DictConfig`` (flat), modified in place.
    """
    fill_defaults(args, family.plugin_keys())


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


def validate_args(args) -> AttentionTransformerConfig:
    """Check the options before the model is built (:meth:`AttentionTransformerConfig.validate`)
    and warn about legal but probably unintended settings.

    Args:
        args: the fairseq-train/-generate namespace or hydra ``model:`` config (after the arch
            preset filled defaults), or an :class:`AttentionTransformerConfig`.

    Returns:
        the :class:`AttentionTransformerConfig` of ``args``.

    Raises:
        ValueError: an unknown ``--*-attention-fn`` (lists the valid choices); a number that is
            not finite or out of range (e.g. ``--reluformer-gamma 0``, ``--eatt-tau nan``,
            ``--dropout inf``), an invalid choice -- the message names the flag.

    Warns (``logger.warning``, training continues) for legal but probably unintended settings:
    a ReLUFormer function trained with a criterion that ignores its eq. 7 regulariser
    (``--criterion`` not in :data:`AUX_CRITERIONS`; use ``--reg-weight 0`` with
    ``label_smoothed_cross_entropy_with_reg`` for the "- reg loss" ablation, which still logs
    the terms); ``--attention-entropy`` with such a criterion (nothing would be logged);
    ``--reluformer-entropy-c >= 1`` (H(s_bar) <= log n, so the entropy term is always 0);
    options of a function family set away from their defaults while no attention type uses
    that family (e.g. ``--reluformer-gamma 2`` with ReLA-g everywhere).
    """
    cfg = AttentionTransformerConfig.from_namespace(args)
    cfg.validate()
    names = [getattr(cfg, attr) for _, attr in ATTENTION_TYPES.values()]
    used = {attention_fn_options(n) for n in names} - {None}
    uses_reluformer = ReluFormerOptions in used
    c = cfg.reluformer.entropy_c
    criterion = safe_getattr(args, "criterion", None)
    if uses_reluformer and c >= 1:
        logger.warning("--reluformer-entropy-c %s >= 1: H(s_bar) <= log n, so the entropy term of "
                       "eq. 7 is always 0", c)
    if isinstance(criterion, str) and criterion not in AUX_CRITERIONS:
        if uses_reluformer:
            logger.warning("attention functions %s record ReLUFormer's eq. 7 regulariser, but "
                           "--criterion %s ignores it (trained without it); use --criterion %s "
                           "(--reg-weight 0 logs the terms without training on them)",
                           sorted(set(n for n in names if attention_fn_options(n) is ReluFormerOptions)),
                           criterion, " or ".join(AUX_CRITERIONS))
        if cfg.attention_entropy:
            logger.warning("--attention-entropy: the statistics are logged by --criterion %s only, "
                           "not by %s", " or ".join(AUX_CRITERIONS), criterion)
    for prefix, group_cls in AttentionTransformerConfig.groups().items():
        if group_cls in attention_fn_options() and group_cls not in used:
            given = getattr(cfg, prefix).given()
            if given:
                logger.warning("%s given but no attention type uses a %s function (functions: %s); "
                               "ignored", ", ".join(given), group_cls.family, ", ".join(names))
    return cfg


@register_model("attention_transformer")
class AttentionTransformerModel(TransformerModel):
    """Transformer (Vaswani et al. 2017) with a selectable attention function per attention type.

    Raises (at start-up, from :meth:`build_model`, via :func:`validate_args`):
        ValueError: an unknown attention function name (the message lists the valid choices)
            or an out-of-range hyper-parameter.
    """

    @classmethod
    def add_args(cls, parser):
        """Flags generated from :class:`AttentionTransformerConfig` (fairseq's Transformer flags plus
        the plugin's), without defaults so that the arch presets fill them; the attention-function
        flags take the registry's names as choices."""
        gen_parser_from_dataclass(parser, AttentionTransformerConfig(), delete_default=True, with_prefix="")
        names = attention_fn_names()
        flags = {attr for _, attr in ATTENTION_TYPES.values()}
        for action in parser._actions:
            if action.dest in flags:
                action.choices, action.metavar = names, "FN"
                action.help = f"{action.help.split(': a registered name')[0]}; one of: {', '.join(names)}"

    @classmethod
    def build_model(cls, args, task):
        """Build from a flat ``Namespace`` or a hydra ``DictConfig`` (``model:``); see :func:`validate_args`.

        Raises:
            ValueError: an invalid option (:func:`validate_args`) or, in a ``DictConfig``, a key
                that is no option.
        """
        check_model_keys(args, AttentionTransformerConfig.flat_keys(), "attention_transformer")
        attention_transformer_base(args)
        cfg = validate_args(args)
        check_precision_flags()  # --fp16/--bf16 this machine cannot train with (fairseq-train only)
        check_training_ranges()  # --lr, --label-smoothing, --dropout ... in their ranges (fairseq-train only)
        # training: record the direction and dictionaries in the stored config; else compare them
        record_or_check(args, task, training=training_config() is not None)
        return super().build_model(cfg, task)

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


@register_model_architecture("attention_transformer", "attention_transformer")
def attention_transformer_base(args):
    """Transformer base with softmax everywhere unless a flag says otherwise."""
    apply_family(args, AttentionTransformerConfig)
    with config_context(args):
        base_architecture(args)


@register_model_architecture("attention_transformer", "rela_transformer")
def rela_transformer(args):
    """ReLA paper setting (Section 5): Transformer base, ReLA-g in all three attention types.
    fairseq's base defaults otherwise: the paper's attention dropout 0.1, the released code's FFN
    dropout 0.1 and its embeddings (separate dictionaries, the target embedding tied to the softmax;
    the paper does not say) come from ``configs/rela/paper_base.yaml`` (by hand: ``--attention-dropout
    0.1 --activation-dropout 0.1 --share-decoder-input-output-embed``)."""
    apply_family(args, RelaTransformerConfig)
    with config_context(args):
        base_architecture(args)


@register_model_architecture("attention_transformer", "rela_transformer_iwslt_de_en")
def rela_transformer_iwslt_de_en(args):
    """fairseq's ``transformer_iwslt_de_en`` sizes (6+6 layers, 4 heads, d 512, FFN 1024), ReLA-g."""
    apply_family(args, RelaTransformerConfig)
    with config_context(args):
        transformer_iwslt_de_en(args)


def small_preset(args):
    """The CPU preset used for results here: 3+3 layers, d 256, 4 heads (d_h 64), FFN 1024,
    all embeddings shared (needs a joined dictionary), dropout 0.1."""
    with config_context(args):
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
    apply_family(args, RelaTransformerConfig)
    small_preset(args)


@register_model_architecture("attention_transformer", "reluformer")
def reluformer(args):
    """ReLUFormer (Shen et al. 2023): Transformer base, ReLUFormer attention (eq. 6) in encoder
    self, decoder self and cross attention, ReLU FFN.  Train with the criterion
    ``label_smoothed_cross_entropy_with_reg`` (eq. 7).  fairseq's base defaults otherwise: App. A's
    attention dropout 0.1 and shared vocabulary and embeddings come from
    ``configs/reluformer/paper_base.yaml`` (``--attention-dropout 0.1 --share-all-embeddings`` by hand)."""
    apply_family(args, ReluFormerTransformerConfig)
    with config_context(args):
        base_architecture(args)


@register_model_architecture("attention_transformer", "reluformer_iwslt_de_en")
def reluformer_iwslt_de_en(args):
    """ReLUFormer at the paper's IWSLT14 size (App. A.2: 6+6 layers, 4 heads, d 512, FFN 1024);
    attention dropout and shared embeddings as :func:`reluformer` says."""
    apply_family(args, ReluFormerTransformerConfig)
    with config_context(args):
        transformer_iwslt_de_en(args)


@register_model_architecture("attention_transformer", "reluformer_small")
def reluformer_small(args):
    """CPU-sized ReLUFormer, same sizes as ``rela_transformer_small`` (see :func:`small_preset`)."""
    apply_family(args, ReluFormerTransformerConfig)
    small_preset(args)


@register_model_architecture("attention_transformer", "eatt_transformer")
def eatt_transformer(args):
    """E-ATT paper setting (Section 4.1, App. B; :class:`EattTransformerConfig`): Transformer base
    with E-ATT in encoder self, decoder self and cross attention, tau = 1.0.  Hybrids (Table 5):
    override any of the three ``--*-attention-fn``."""
    apply_family(args, EattTransformerConfig)
    with config_context(args):
        base_architecture(args)


@register_model_architecture("attention_transformer", "eatt_transformer_iwslt_de_en")
def eatt_transformer_iwslt_de_en(args):
    """E-ATT at fairseq's ``transformer_iwslt_de_en`` sizes (6+6 layers, 4 heads, d 512, FFN 1024)."""
    apply_family(args, EattTransformerConfig)
    with config_context(args):
        transformer_iwslt_de_en(args)


@register_model_architecture("attention_transformer", "eatt_transformer_small")
def eatt_transformer_small(args):
    """CPU-sized E-ATT Transformer, same sizes as ``rela_transformer_small`` (:func:`small_preset`)."""
    apply_family(args, EattTransformerConfig)
    small_preset(args)


@register_model_architecture("transformer", "stock_transformer_small")
def stock_transformer_small(args):
    """fairseq's stock ``transformer`` model at the CPU preset's sizes (the unmodified baseline
    that ``rela_transformer_small`` with ``softmax`` everywhere must equal).

    The model is fairseq's, so the plugin has no build hook there: the arch function itself checks
    fairseq's numeric training options (:func:`.ranges.check_training_ranges` on the flat
    Namespace fairseq-train hands it), as the plugin's own models do at build.

    Raises:
        ValueError: an option outside its range, e.g. ``--label-smoothing 1.5``.
    """
    check_training_ranges(args)
    small_preset(args)
