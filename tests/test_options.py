"""Options declared once (dataclasses) and checked once: flags, hydra configs, ranges, nan/inf.

* every option group an attention function declares is composed into the model config, and its
  fields are the flags of ``fairseq-train`` and reach the functions;
* a hydra ``DictConfig`` (``fairseq-hydra-train``'s ``model:``) builds the same model as the
  ``fairseq-train`` namespace; a misspelt key is refused;
* every float option of the Transformer, the RNNsearch and the criterion refuses ``nan`` and
  ``inf`` at build (issue 21 item 3), naming the flag;
* the RNN attention takes the registry's normalisers as plain functions.
"""

import argparse
import math
from dataclasses import fields

import pytest
import torch
from fairseq import options
from fairseq.dataclass.utils import interpret_dc_type
from fairseq.models import ARCH_CONFIG_REGISTRY, ARCH_MODEL_REGISTRY
from fairseq.models import build_model as fairseq_build_model
from omegaconf import OmegaConf

from fairseq_plugins.attention import attention_fn_names, build_attention_fn
from fairseq_plugins.attention.additive import NORMALIZER_CHOICES, AdditiveAttention
from fairseq_plugins.attention.functions import attention_fn_options, normalizer, normalizer_names
from fairseq_plugins.criterions import LabelSmoothedCrossEntropyWithRegCriterion
from fairseq_plugins.models.rnnsearch import RNNsearchConfig
from fairseq_plugins.models.transformer import (
    AttentionTransformerConfig,
    EattTransformerConfig,
    RelaTransformerConfig,
    ReluFormerTransformerConfig,
)
from fairseq_plugins.options import OptionGroup
from helpers import ROOT, build, toy_batch, toy_task

TINY = dict(encoder_embed_dim=16, decoder_embed_dim=16, encoder_ffn_embed_dim=32, decoder_ffn_embed_dim=32,
            encoder_layers=1, decoder_layers=1, encoder_attention_heads=2, decoder_attention_heads=2,
            dropout=0.0, attention_dropout=0.0, activation_dropout=0.0, share_all_embeddings=True)


def _parse(arch, *extra):
    parser = options.get_training_parser()
    return options.parse_args_and_arch(parser, ["/nonexistent", "--arch", arch, "--task", "translation",
                                                "--user-dir", f"{ROOT}/fairseq_plugins", *extra])


def _fns(model):
    return ({l.self_attn.attn_fn.name for l in model.encoder.layers},
            {l.self_attn.attn_fn.name for l in model.decoder.layers},
            {l.encoder_attn.attn_fn.name for l in model.decoder.layers})


# -- declaration ------------------------------------------------------------------------------
def test_every_function_option_group_is_composed_into_the_model_config():
    groups = AttentionTransformerConfig.groups()
    for name in attention_fn_names():
        cls = attention_fn_options(name)
        if cls is not None:
            assert issubclass(cls, OptionGroup) and groups.get(cls.prefix) is cls, (name, cls)
    assert set(attention_fn_options()) <= set(groups.values())


def test_flags_come_from_the_dataclasses_and_reach_the_functions():
    args = _parse("reluformer_small", "--reluformer-gamma", "2.5", "--reluformer-reg-terms", "norm",
                  "--eatt-tau", "0.25", "--rela-norm-scope", "head", "--synth-max-len", "12",
                  "--synth-random-fixed", "--ffn-activation", "softmax", "--attention-entropy",
                  "--encoder-attention-fn", "rela_g", "--cross-attention-fn", "eatt",
                  "--decoder-attention-fn", "synth_random")
    for k, v in TINY.items():
        setattr(args, k, v)
    model = ARCH_MODEL_REGISTRY["reluformer_small"].build_model(args, toy_task())
    assert _fns(model) == ({"rela_g"}, {"synth_random"}, {"eatt"})
    enc, dec = model.encoder.layers[0], model.decoder.layers[0]
    assert enc.self_attn.attn_fn.norm_groups == 2  # --rela-norm-scope head: one group per head
    assert dec.encoder_attn.attn_fn.tau == 0.25
    assert dec.self_attn.attn_fn.max_len == 12 and not dec.self_attn.attn_fn.r.requires_grad
    assert enc.self_attn.attn_fn.track_entropy
    assert enc.activation_fn.__name__ == "softmax_over_slots"
    # the unused ReLUFormer options were parsed and kept (recorded), not lost
    assert (args.reluformer_gamma, args.reluformer_reg_terms) == (2.5, "norm")


@pytest.mark.parametrize("arch,family", [("attention_transformer", AttentionTransformerConfig),
                                         ("rela_transformer_small", RelaTransformerConfig),
                                         ("reluformer_iwslt_de_en", ReluFormerTransformerConfig),
                                         ("eatt_transformer", EattTransformerConfig)])
def test_presets_record_every_plugin_option_and_differ_only_where_the_family_does(arch, family):
    """The arch preset writes every plugin option into args (what checkpoints store), with the
    family's defaults; families change only the attention functions."""
    base = AttentionTransformerConfig.plugin_keys()
    own = family.plugin_keys()
    assert set(own) == set(base)
    assert {k for k in own if own[k] != base[k]} <= {"encoder_attention_fn", "decoder_attention_fn",
                                                     "cross_attention_fn"}
    args = _parse(arch)
    assert {k: getattr(args, k) for k in own} == own


def test_flat_names_map_onto_the_option_groups():
    cfg = AttentionTransformerConfig()
    cfg.reluformer_gamma = 3.0
    cfg.encoder_embed_dim = 8
    assert cfg.reluformer.gamma == 3.0 and cfg.encoder.embed_dim == 8
    fresh = AttentionTransformerConfig()  # no class-level default was changed
    assert fresh.reluformer_gamma == 1.0 and fresh.encoder_embed_dim == 512
    with pytest.raises(AttributeError):
        cfg.reluformer_gama  # noqa: B018


# -- hydra DictConfig ---------------------------------------------------------------------------
def _dictconfig(arch, **over):
    cfg = OmegaConf.create({"_name": arch, **TINY, **over})
    OmegaConf.set_struct(cfg, True)
    return cfg


def test_hydra_dictconfig_builds_the_same_model_as_the_namespace():
    """fairseq-hydra-train hands the model a flat DictConfig; fairseq's own
    TransformerConfig.from_namespace dropped every plugin key of it ("unknown attention function
    None").  Same seed -> same parameters, same functions, same hyper-parameters, same output."""
    over = dict(encoder_attention_fn="relu_rmsnorm", cross_attention_fn="reluformer", reluformer_gamma=2.0,
                rela_norm_scope="head")
    task = toy_task()
    cfg = _dictconfig("rela_transformer_small", **over)
    torch.manual_seed(0)
    from_hydra = fairseq_build_model(cfg, task)
    torch.manual_seed(0)
    from_cli, _ = build("rela_transformer_small", task=task, encoder_layers=1, decoder_layers=1, **over)
    assert _fns(from_hydra) == ({"relu_rmsnorm"}, {"rela_g"}, {"reluformer"})
    assert from_hydra.decoder.layers[0].encoder_attn.attn_fn.gamma == 2.0
    assert from_hydra.encoder.layers[0].self_attn.attn_fn.norm_groups == 2
    sd_h, sd_c = from_hydra.state_dict(), from_cli.state_dict()
    assert list(sd_h) == list(sd_c) and all(torch.equal(sd_h[k], sd_c[k]) for k in sd_h)
    src, lens, prev = toy_batch(task)
    torch.testing.assert_close(from_hydra.eval()(src, lens, prev)[0], from_cli.eval()(src, lens, prev)[0])
    # the arch preset recorded every option in the config (what the checkpoint stores)
    assert cfg.decoder_attention_fn == "rela_g" and cfg.eatt_tau == 1.0 and cfg.reluformer_entropy_c == 0.7


@pytest.mark.parametrize("arch,key,meant", [("rela_transformer_small", "reluformer_gama", "reluformer_gamma"),
                                            ("rnnsearch_small", "flexible_sigmaa", "flexible_sigma")])
def test_hydra_unknown_model_key_is_refused(arch, key, meant):
    """The message names the arch asked for, the likely key and every valid key (``fairseq-train --arch
    ARCH --help`` lists none of the arch's flags in fairseq 0.12, so it cannot be the pointer)."""
    cfg = OmegaConf.create({"_name": arch, key: 1.0})
    OmegaConf.set_struct(cfg, True)
    with pytest.raises(ValueError, match=f"unknown model option\\(s\\) {key} for arch {arch} ") as err:
        fairseq_build_model(cfg, toy_task())
    msg = str(err.value)
    assert f"{key}: did you mean {meant}" in msg
    valid = msg.split("valid keys", 1)[1]
    assert f" {meant}," in valid or valid.endswith(f" {meant}")


# -- every float option refuses nan and inf at build (issue 21 item 3) --------------------------
def _float_options(dc_cls, prefix=""):
    """(flat name, flag, allow_inf) of every float field, sub-configs and option groups included."""
    out = []
    for f in fields(dc_cls):
        t = interpret_dc_type(f.type)
        if f.name.startswith("_"):
            continue
        if isinstance(t, type) and hasattr(t, "__dataclass_fields__"):
            out += _float_options(t, f"{prefix}{f.name}_")
        elif t is float:
            name = prefix + f.name
            out.append((name, "--" + name.replace("_", "-"), (f.metadata or {}).get("allow_inf", False)))
    return out


TRANSFORMER_FLOATS = _float_options(AttentionTransformerConfig)


def test_the_float_options_are_found():
    names = {n for n, _, _ in TRANSFORMER_FLOATS}
    assert {"dropout", "attention_dropout", "encoder_layerdrop", "rela_norm_eps", "reluformer_gamma",
            "reluformer_entropy_c", "eatt_tau"} <= names


@pytest.mark.parametrize("bad", ["nan", "inf", "-inf"])
@pytest.mark.parametrize("name,flag,allow_inf", TRANSFORMER_FLOATS, ids=[n for n, _, _ in TRANSFORMER_FLOATS])
def test_transformer_float_option_must_be_finite(name, flag, allow_inf, bad):
    assert not allow_inf
    with pytest.raises(ValueError, match=f"{flag} must be a finite number"):
        build("eatt_transformer_small", **{name: float(bad)})


@pytest.mark.parametrize("name,value,ok", [
    ("flexible_sigma", "nan", False), ("flexible_sigma", "inf", False), ("flexible_threshold", "nan", False),
    ("flexible_threshold", "-inf", False), ("flexible_threshold", "inf", True), ("dropout", "nan", False),
    ("dropout", "inf", False)])
def test_rnnsearch_float_options(name, value, ok):
    assert name in {n for n, _, _ in _float_options(RNNsearchConfig)}
    args = argparse.Namespace(encoder_embed_dim=8, encoder_hidden_size=8, decoder_embed_dim=8, decoder_hidden_size=8,
                              rnn_attention="flexible", **{name: float(value)})
    ARCH_CONFIG_REGISTRY["rnnsearch_small"](args)
    if ok:
        ARCH_MODEL_REGISTRY["rnnsearch_small"].build_model(args, toy_task())
    else:
        with pytest.raises(ValueError, match="--" + name.replace("_", "-")):
            ARCH_MODEL_REGISTRY["rnnsearch_small"].build_model(args, toy_task())


@pytest.mark.parametrize("kw,flag", [({"reg_weight": math.nan}, "--reg-weight"),
                                     ({"reg_weight": math.inf}, "--reg-weight"),
                                     ({"label_smoothing": math.nan}, "--label-smoothing")])
def test_criterion_float_options_must_be_finite(kw, flag):
    with pytest.raises(ValueError, match=f"{flag} must be a finite number"):
        LabelSmoothedCrossEntropyWithRegCriterion(toy_task(), False, **{"label_smoothing": 0.1, **kw})


def test_eatt_tau_inf_no_longer_trains_on_all_zero_inputs():
    """--eatt-tau inf made every binarised input 0 (1[x > inf]); it is refused now, also for a
    function built directly."""
    with pytest.raises(ValueError, match="--eatt-tau must be a finite number, got inf"):
        build_attention_fn("eatt", 8, 2, argparse.Namespace(eatt_tau=math.inf))


# -- the RNN attention reuses the registry's normalisers ----------------------------------------
def _sparsemax_row(z):
    """Sparsemax of a 1-D float64 row by sorting (Martins & Astudillo 2016, Algorithm 1)."""
    zs, _ = torch.sort(z, descending=True)
    k = torch.arange(1, len(z) + 1, dtype=z.dtype)
    cum = zs.cumsum(0)
    k_z = int((1 + k * zs > cum).sum())  # the support size (the condition holds for a prefix)
    tau = (cum[k_z - 1] - 1) / k_z
    return (z - tau).clamp(min=0)


def _entmax15_row(z, iters=200):
    """1.5-entmax of a 1-D float64 row by bisection on tau: p_i = [z_i / 2 - tau]_+^2, sum 1
    (Peters et al. 2019, alpha = 1.5); tau lies in [max z / 2 - 1, max z / 2]."""
    x = z / 2
    lo, hi = x.max() - 1, x.max()
    for _ in range(iters):
        tau = (lo + hi) / 2
        if float(((x - tau).clamp(min=0) ** 2).sum()) >= 1:
            lo = tau
        else:
            hi = tau
    return (x - (lo + hi) / 2).clamp(min=0) ** 2


_ROW_REFERENCES = {"softmax": lambda z: torch.softmax(z, dim=-1), "sparsemax": _sparsemax_row,
                   "entmax15": _entmax15_row}


def test_plain_normalisers_equal_the_registered_functions():
    """normalizer(name)(scores, mask) is the function's normalize without any module, and equals
    an independent reference (torch.softmax, sort-based sparsemax, bisection 1.5-entmax) over the
    unmasked keys of each row: zeros where masked, all zeros on a fully masked row."""
    assert set(normalizer_names(distribution=True)) == {"softmax", "sparsemax", "entmax15"} == set(NORMALIZER_CHOICES)
    g = torch.Generator().manual_seed(0)
    scores = torch.randn(2, 3, 4, 6, generator=g) * 3
    mask = torch.zeros(2, 1, 4, 6, dtype=torch.bool)
    mask[0, :, :, 4:] = True
    mask[1, :, 2] = True  # a fully masked row
    full_mask = mask.expand_as(scores)
    for name in NORMALIZER_CHOICES:
        w = normalizer(name)(scores, mask)
        assert w.dtype == scores.dtype and w.shape == scores.shape
        assert torch.equal(w, build_attention_fn(name, 12, 3).normalize(scores, mask))
        ref = torch.zeros(scores.shape, dtype=torch.float64)
        for idx in torch.cartesian_prod(*[torch.arange(n) for n in scores.shape[:-1]]).tolist():
            keep = ~full_mask[tuple(idx)]
            if keep.any():
                ref[tuple(idx)][keep] = _ROW_REFERENCES[name](scores[tuple(idx)][keep].double())
        torch.testing.assert_close(w.double(), ref, rtol=1e-5, atol=1e-6, msg=lambda m: f"{name}: {m}")
        if name != "softmax":  # the sparse ones really leave unmasked keys at zero here
            assert bool(((ref == 0) & ~full_mask).any())
        assert float(w[mask.expand_as(w)].abs().max()) == 0.0 and torch.isfinite(w).all()
        sums = w.sum(-1)
        torch.testing.assert_close(sums[0], torch.ones_like(sums[0]))
        assert float(sums[1, :, 2].abs().max()) == 0.0
    with pytest.raises(ValueError, match="valid choices: .*softmax"):
        normalizer("reluformer")


def _rnn(kind, fn, tau=math.inf, seed=0):
    torch.manual_seed(seed)
    att = AdditiveAttention(6, 5, 7, 3, kind=kind, threshold=tau, local_d=3, normalizer=fn).eval()
    torch.nn.init.normal_(att.v.weight, std=3.0)  # sharper scores: sparsemax leaves zeros
    return att


@pytest.mark.parametrize("kind,tau", [("global", math.inf), ("flexible", math.inf), ("flexible", 0.8),
                                      ("local_p", math.inf)])
def test_rnn_attention_with_sparsemax_is_sparse_and_batched_equals_one_hypothesis(kind, tau):
    """The variant switch is independent of the normaliser: with sparsemax the weights are a
    sparse distribution, the focus is its mean position, and the lean one-hypothesis path gives
    the batched path's result."""
    att = _rnn(kind, "sparsemax", tau)
    if kind == "flexible":
        torch.nn.init.constant_(att.gate_out.bias, 1.0)
    B, S = 3, 16
    lengths = torch.tensor([16, 11, 7])
    pad = torch.arange(S).unsqueeze(0) >= lengths.unsqueeze(1)
    vals = torch.randn(B, S, 5).masked_fill(pad.unsqueeze(-1), 0.0) * 4
    keys = att.keys(vals)
    q, e, p = torch.randn(B, 6) * 4, torch.randn(B, 3), torch.tensor([2.0, 5.5, 3.0])
    step = att(q, e, keys, vals, pad, lengths, p)
    w = step.weights
    assert float(w[pad].abs().max()) == 0.0
    if kind != "local_p":  # (local-p multiplies by a Gaussian after the normaliser)
        torch.testing.assert_close(w.sum(-1), torch.ones(B))
    assert (w == 0).logical_and(~pad).any()  # sparsemax: some real positions get exactly 0
    if kind == "flexible":
        torch.testing.assert_close(step.focus, (w * torch.arange(S).float()).sum(-1))
    for i in range(B):
        n = int(lengths[i])
        one = att(q[i : i + 1], e[i : i + 1], keys[i : i + 1, :n], vals[i : i + 1, :n], None, lengths[i : i + 1],
                  p[i : i + 1])
        torch.testing.assert_close(one.weights, w[i : i + 1, :n])
        torch.testing.assert_close(one.context, step.context[i : i + 1])


def test_rnn_attention_softmax_default_is_unchanged_and_fn_changes_the_weights():
    a, b = _rnn("flexible", "softmax"), _rnn("flexible", "entmax15")
    b.load_state_dict(a.state_dict())
    B, S = 2, 9
    vals = torch.randn(B, S, 5) * 4
    args = (torch.randn(B, 6) * 4, torch.randn(B, 3), a.keys(vals), vals, None, torch.tensor([S, S]), torch.zeros(B))
    sa, sb = a(*args), b(*args)
    scores = a.score(a.q_proj(args[0]).unsqueeze(1), args[2]) - a.penalty(
        torch.arange(S).float().unsqueeze(0), args[6], sa.gate)
    torch.testing.assert_close(sa.weights, torch.softmax(scores, -1))  # eq. 2 with the eq. 5 penalty
    assert not torch.allclose(sa.weights, sb.weights)


def test_rnnsearch_flag_chooses_the_normaliser_and_refuses_the_others():
    args = _parse("rnnsearch_small", "--rnn-attention", "flexible", "--rnn-attention-fn", "entmax15")
    assert args.rnn_attention_fn == "entmax15"
    for k, v in dict(encoder_embed_dim=8, encoder_hidden_size=8, decoder_embed_dim=8, decoder_hidden_size=8,
                     attention_dim=8, decoder_out_embed_dim=8).items():
        setattr(args, k, v)
    model = ARCH_MODEL_REGISTRY["rnnsearch_small"].build_model(args, toy_task())
    assert model.decoder.attention.normalizer_name == "entmax15"
    assert _parse("rnnsearch_small").rnn_attention_fn == "softmax"  # the default, recorded
    with pytest.raises(ValueError, match="--rnn-attention-fn 'relu' is not a valid choice; valid choices: "
                                         "entmax15, softmax, sparsemax"):
        AdditiveAttention(6, 5, 7, 3, kind="global", normalizer="relu")
