"""The attention seam: every registered function, against fairseq's stock attention."""

import math

import pytest
import torch
from fairseq.modules import MultiheadAttention

from fairseq_plugins.attention import (
    ATTENTION_FUNCTIONS,
    AttentionFunction,
    FunctionalMultiheadAttention,
    attention_fn_names,
    build_attention_fn,
    register_attention_fn,
)

ALL = attention_fn_names()
RELU_FAMILY = ["relu", "relu_rmsnorm", "relu_layernorm", "rela_i", "rela_g", "rela_g_layernorm"]
EXPECTED = {"softmax", "sparsemax", "entmax15", "relu", "relu_rmsnorm", "relu_layernorm", "rela_i", "rela_g",
            "rela_g_layernorm", "rela_g_gelu", "rela_g_leaky_relu"}

C, H = 16, 4


def mha(name, dtype=torch.float32, seed=0, **kw):
    torch.manual_seed(seed)
    m = FunctionalMultiheadAttention(C, H, build_attention_fn(name, C, H), **kw).to(dtype)
    for p in m.parameters():  # make norm gains/gates non-trivial so they are exercised
        if p.dim() == 1 and p.numel() == C and not kw.get("keep_init"):
            p.data.uniform_(0.5, 1.5)
    return m


def test_registry_holds_table1_functions():
    assert EXPECTED <= set(ALL)


def test_unknown_function_lists_choices():
    with pytest.raises(ValueError) as e:
        build_attention_fn("softmaxx", C, H)
    for name in EXPECTED:
        assert name in str(e.value)


@pytest.mark.parametrize("name", ALL)
def test_gradcheck_float64(name):
    m = mha(name, torch.float64, self_attention=True).eval()
    if getattr(m.attn_fn, "is_binarized", False):
        # E-ATT's binarisation has a surrogate gradient by design (eq. 8), which finite
        # differences cannot match: check everything else (tests/test_eatt.py checks eq. 8)
        binarized = m.attn_fn.transform_input
        m.attn_fn.transform_input = lambda x, role: binarized(x, role).detach()
    x = torch.randn(5, 2, C, dtype=torch.float64, requires_grad=True)
    kpm = torch.tensor([[False] * 5, [True, True, False, False, False]])

    def f(x):
        return m(x, x, x, key_padding_mask=kpm, need_weights=False)[0]

    assert torch.autograd.gradcheck(f, (x,), eps=1e-6, atol=1e-5)


@pytest.mark.parametrize("name", ALL)
@pytest.mark.parametrize("need_weights", [False, True])
def test_padding_equals_truncation(name, need_weights):
    """Cross-attention to S keys of which the last P are padding == attention to S-P keys."""
    m = mha(name, encoder_decoder_attention=True).eval()
    q, kv = torch.randn(4, 2, C), torch.randn(6, 2, C)
    kpm = torch.zeros(2, 6, dtype=torch.bool)
    kpm[1, 4:] = True
    out, _ = m(q, kv, kv, key_padding_mask=kpm, need_weights=need_weights)
    ref0, _ = m(q[:, :1], kv[:, :1], kv[:, :1], need_weights=need_weights)
    ref1, _ = m(q[:, 1:], kv[:4, 1:], kv[:4, 1:], need_weights=need_weights)
    torch.testing.assert_close(out[:, :1], ref0, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(out[:, 1:], ref1, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", ALL)
def test_fully_padded_rows_are_exact_zeros(name):
    fn = build_attention_fn(name, C, H)
    scores = torch.randn(2, H, 3, 5)
    mask = torch.zeros(2, 1, 1, 5, dtype=torch.bool)
    mask[1] = True  # every key of batch item 1 is padding
    w = fn.normalize(scores, mask)
    assert torch.isfinite(w).all()
    assert torch.equal(w[1], torch.zeros_like(w[1]))
    assert (w[0] != 0).any()
    # and through the module, fused path included (need_weights False) and backward
    m = mha(name, encoder_decoder_attention=True).train()
    m.dropout_module.p = 0.0
    q = torch.randn(3, 2, C, requires_grad=True)
    kv = torch.randn(5, 2, C)
    out, _ = m(q, kv, kv, key_padding_mask=mask.view(2, 5), need_weights=False)
    out.sum().backward()
    assert torch.isfinite(out).all()
    if name == "synth_random":  # its weights depend on positions only: no gradient reaches q
        assert q.grad is None
    else:
        assert torch.isfinite(q.grad).all()


@pytest.mark.parametrize("name", RELU_FAMILY)
def test_null_attention_rows(name):
    """ReLA: a query with no positive score attends to nothing -- exact zeros, no NaN."""
    fn = build_attention_fn(name, C, H)
    scores = torch.randn(1, H, 4, 6)
    scores[0, 1, 2] = -scores[0, 1, 2].abs() - 0.1  # head 1, query 2: all negative
    w = fn.normalize(scores, None)
    assert torch.equal(w[0, 1, 2], torch.zeros(6))
    assert (w >= 0).all() and torch.isfinite(w).all()
    # the (gated) RMSNorm keeps a zero head-concatenation at zero (eps), no NaN
    z = fn.post_aggregate(torch.zeros(2, 1, C))
    assert torch.isfinite(z).all()
    if name != "rela_g_layernorm":  # LayerNorm(0) = its bias (0 at init)
        assert torch.equal(z, torch.zeros_like(z))


@pytest.mark.parametrize("name", ["sparsemax", "entmax15"] + RELU_FAMILY)
def test_sparse_functions_produce_exact_zeros(name):
    fn = build_attention_fn(name, C, H)
    w = fn.normalize(torch.randn(2, H, 8, 8) * 3, None)
    assert (w == 0).float().mean() > 0.2


def _stock_and_ours(**kw):
    torch.manual_seed(0)
    stock = MultiheadAttention(C, H, **kw)
    ours = FunctionalMultiheadAttention(C, H, build_attention_fn("softmax", C, H), **kw)
    ours.load_state_dict(stock.state_dict())
    return stock.eval(), ours.eval()


@pytest.mark.parametrize("kind", ["self", "cross"])
def test_softmax_parity_with_stock_full(kind):
    kw = {"self_attention": True} if kind == "self" else {"encoder_decoder_attention": True}
    stock, ours = _stock_and_ours(**kw)
    q = torch.randn(5, 3, C)
    kv = q if kind == "self" else torch.randn(7, 3, C)
    kpm = torch.zeros(3, kv.size(0), dtype=torch.bool)
    kpm[2, -2:] = True  # (left padding + causal mask gives all-masked rows: NaN in stock, 0 here)
    am = torch.triu(torch.full((5, 5), float("-inf")), 1) if kind == "self" else None
    for nw in (False, True):
        a, wa = stock(q, kv, kv, key_padding_mask=kpm, attn_mask=am, need_weights=nw)
        b, wb = ours(q, kv, kv, key_padding_mask=kpm, attn_mask=am, need_weights=nw)
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
        if nw:
            torch.testing.assert_close(wa, wb, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("beam", [1, 3])
def test_softmax_parity_with_stock_incremental(beam):
    """Step-by-step decoding (self + cross attention, beam-size trick, reordering) == stock."""
    torch.manual_seed(1)
    mods = {}
    for kind, kw in (("self", {"self_attention": True}), ("cross", {"encoder_decoder_attention": True})):
        mods[kind] = _stock_and_ours(**kw)
    bsz, S, T = 2, 6, 4
    enc = torch.randn(S, bsz, C).repeat_interleave(beam, dim=1)  # (S, bsz*beam, C)
    kpm = torch.zeros(bsz * beam, S, dtype=torch.bool)
    kpm[-beam:, :2] = True
    xs = torch.randn(T, bsz * beam, C)
    outs = []
    for which in (0, 1):
        state = {}
        for m in (mods["self"][which], mods["cross"][which]):
            m.set_beam_size(beam)
        ys = []
        for t in range(T):
            x = xs[t : t + 1]
            h, _ = mods["self"][which](x, x, x, incremental_state=state, need_weights=False)
            y, _ = mods["cross"][which](h, enc, enc, key_padding_mask=kpm, incremental_state=state,
                                        static_kv=True, need_weights=True)
            ys.append(y)
            if beam > 1:  # shuffle hypotheses inside each sentence, as beam search does
                order = torch.arange(bsz * beam).view(bsz, beam).flip(1).reshape(-1)
                for m in (mods["self"][which], mods["cross"][which]):
                    m.reorder_incremental_state(state, order)
        outs.append(torch.cat(ys))
    torch.testing.assert_close(outs[0], outs[1], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", ALL)
def test_incremental_equals_full_decoding(name):
    """Causal self-attention step by step with the cache == one full pass with the future mask."""
    m = mha(name, torch.float64, self_attention=True).eval()
    x = torch.randn(6, 2, C, dtype=torch.float64)
    future = torch.triu(torch.full((6, 6), float("-inf"), dtype=torch.float64), 1)
    full, _ = m(x, x, x, attn_mask=future, need_weights=False)
    state, steps = {}, []
    for t in range(6):
        y, _ = m(x[t : t + 1], x[t : t + 1], x[t : t + 1], incremental_state=state, need_weights=False)
        steps.append(y)
    torch.testing.assert_close(torch.cat(steps), full, rtol=1e-10, atol=1e-12)


def test_rela_i_gain_init_range():
    d_model, heads = 512, 8
    fn = build_attention_fn("rela_i", d_model, heads)
    g = fn.norm.weight
    bound = math.sqrt(3.0 / (d_model // heads))
    assert g.abs().max() <= bound
    assert g.abs().max() > 0.9 * bound and g.min() < 0 < g.max()  # spans the range
    assert abs(g.var().item() - bound**2 / 3) < 0.25 * bound**2 / 3  # variance of U(-b, b)
    assert torch.equal(build_attention_fn("relu_rmsnorm", d_model, heads).norm.weight,
                       torch.ones(d_model))


def test_rela_g_matches_equation_5():
    fn = build_attention_fn("rela_g", C, H)
    z = torch.randn(3, 2, C)
    rms = z.pow(2).mean(-1, keepdim=True).add(1e-8).sqrt()
    expected = torch.sigmoid(fn.norm.gate * z) * (z / rms) * fn.norm.norm.weight
    torch.testing.assert_close(fn.post_aggregate(z), expected)


def _eval_stats(name, scores, mask):
    """``{stat: (total, count)}`` that ``name`` records in evaluation (``--attention-entropy``)
    for ``scores`` ``(1, 1, T, S)`` under ``mask``: the weights of its own normaliser."""
    import argparse

    fn = build_attention_fn(name, C, H, argparse.Namespace(attention_entropy=True)).eval()
    fn.aux.enabled = True
    fn.observe(fn.normalize(scores, mask), mask)
    return {k: (float(t), float(c)) for k, (t, c, _) in fn.aux.pop().items()}


# one row per case: all scores negative; mixed signs; all exactly 0; negative with a padded key
_STAT_SCORES = torch.tensor([[-1.0, -2.0, -0.5], [2.0, -1.0, 2.0], [0.0, 0.0, 0.0], [-1.0, -3.0, 5.0]],
                            dtype=torch.float64).view(1, 1, 4, 3)
_STAT_MASK = torch.tensor([[False, False, False]] * 3 + [[False, False, True]]).view(1, 1, 4, 3)


def test_null_rate_and_entropy_of_relu_rows():
    """ReLU (rela_g): a row without a positive score is all zeros -- null (ReLA Section 5.2) and
    left out of the entropy; [2, 0, 2] has H(s_bar) = log 2.  Null: rows 0, 2 and 3 of 4."""
    st = _eval_stats("rela_g", _STAT_SCORES, _STAT_MASK)
    assert st["attn_null_rate"] == (3.0, 4.0)
    assert st["attn_entropy"][1] == 1.0 and st["attn_entropy"][0] == pytest.approx(math.log(2), abs=1e-12)


def test_leaky_relu_negative_rows_are_not_null():
    """Leaky ReLU (rela_g_leaky_relu, ReLA Table 1 row 10): a row of negative scores has weights
    0.01 s != 0, so it is not null (null = every weight over the valid keys exactly 0, as the
    analyses count it); only the all-zero row is.  The entropy is that of the weights clamped at 0
    ([2, -0.01, 2] -> log 2); rows with no positive weight have none (left out of the mean)."""
    st = _eval_stats("rela_g_leaky_relu", _STAT_SCORES, _STAT_MASK)
    assert st["attn_null_rate"] == (1.0, 4.0)  # only row 2 (scores exactly 0: weights exactly 0)
    assert st["attn_entropy"][1] == 1.0 and st["attn_entropy"][0] == pytest.approx(math.log(2), abs=1e-12)
    # the analyses' definition, on the same weights
    from fairseq_plugins.analysis.metrics import null_terms

    fn = build_attention_fn("rela_g_leaky_relu", C, H)
    null, rows = null_terms(fn.normalize(_STAT_SCORES, _STAT_MASK), _STAT_MASK)
    assert (float(null.sum()), float(rows.sum())) == st["attn_null_rate"]


def _rela_module_by_hand(m, name, q_in, kv_in, kpm):
    """ReLA eqs. 3-5 by hand in float64 for a FunctionalMultiheadAttention ``m``: per head
    ``ReLU(Q_h K_h^T / sqrt(d_h))`` with padded keys' weights 0, times ``V_h``; the heads
    concatenated to ``z`` ``(T, B, C)``; the norm of ``z`` (eq. 4 RMSNorm with gain ``g``, eq. 5 gated
    RMSNorm ``g * z * rsqrt(mean(z^2) + eps) * sigmoid(w * z)`` with the gate on the un-normalised
    ``z``, or LayerNorm); *then* the output projection."""
    T, B, _ = q_in.shape
    S = kv_in.shape[0]
    d = C // H

    def lin(layer, x):
        return x @ layer.weight.t() + layer.bias

    def heads(x, L):  # (L, B, C) -> (B, H, L, d)
        return x.reshape(L, B, H, d).permute(1, 2, 0, 3)

    q, k, v = heads(lin(m.q_proj, q_in), T), heads(lin(m.k_proj, kv_in), S), heads(lin(m.v_proj, kv_in), S)
    alpha = torch.relu(q @ k.transpose(-1, -2) / math.sqrt(d))  # eq. 3
    alpha = alpha.masked_fill(kpm.view(B, 1, 1, S), 0.0)
    z = (alpha @ v).permute(2, 0, 1, 3).reshape(T, B, C)  # heads concatenated
    norm = m.attn_fn.norm
    eps = m.attn_fn.eps
    if name in ("relu_rmsnorm", "rela_i"):  # eq. 4
        y = z * torch.rsqrt(z.square().mean(-1, keepdim=True) + eps) * norm.weight
    elif name == "rela_g":  # eq. 5, the gate on the un-normalised z
        y = norm.norm.weight * z * torch.rsqrt(z.square().mean(-1, keepdim=True) + eps) * torch.sigmoid(z * norm.gate)
    else:  # LayerNorm (relu_layernorm; rela_g_layernorm: gated)
        ln = norm.norm if name == "rela_g_layernorm" else norm
        mu = z.mean(-1, keepdim=True)
        y = (z - mu) / torch.sqrt((z - mu).square().mean(-1, keepdim=True) + ln.eps) * ln.weight + ln.bias
        if name == "rela_g_layernorm":
            y = y * torch.sigmoid(z * norm.gate)
    return lin(m.out_proj, y), alpha  # the norm before W_o (released code; not after it)


@pytest.mark.parametrize("name", ["rela_g", "rela_i", "relu_rmsnorm", "relu_layernorm", "rela_g_layernorm"])
@pytest.mark.parametrize("need_weights", [False, True])
def test_rela_module_equals_equations_3_to_5_by_hand(name, need_weights):
    """The whole cross-attention module (float64, key padding) equals ReLA eqs. 3-5 built by hand:
    the scale 1/sqrt(d_h), padded keys at 0, the norm on the concatenated heads *before* the
    output projection, the gate on the un-normalised input; gains, gates and LayerNorm biases
    randomised so each one's place matters.  (RMSNorm and LayerNorm are invariant to a common
    scale of a row but for eps, so a wrong score scale shows mainly in the returned weights and
    the gate.)"""
    torch.manual_seed(0)
    m = FunctionalMultiheadAttention(C, H, build_attention_fn(name, C, H), encoder_decoder_attention=True)
    m = m.double().eval()
    with torch.no_grad():
        for pname, p in m.attn_fn.named_parameters():
            p.uniform_(-1.5, 1.5)  # gains of both signs, gates, LayerNorm biases
        for layer in (m.q_proj, m.k_proj, m.v_proj, m.out_proj):
            layer.bias.uniform_(-0.5, 0.5)
    T, S, B = 4, 6, 2
    q_in = torch.randn(T, B, C, dtype=torch.float64)
    kv_in = torch.randn(S, B, C, dtype=torch.float64)
    kpm = torch.zeros(B, S, dtype=torch.bool)
    kpm[1, 3:] = True
    kv_pad = kv_in.clone()
    kv_pad[3:, 1] = 1e3  # padded keys/values large: any leak shows
    out, weights = m(q_in, kv_pad, kv_pad, key_padding_mask=kpm, need_weights=need_weights)
    ref, alpha = _rela_module_by_hand(m, name, q_in, kv_pad, kpm)
    torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-10)
    if need_weights:  # the weights themselves (the norms are scale-invariant: only these and
        # the gate show a change of the score scale)
        torch.testing.assert_close(weights, alpha.mean(1), rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("name", ["relu_rmsnorm", "relu_layernorm", "rela_i", "rela_g", "rela_g_layernorm"])
def test_norm_scope_head_normalises_each_head(name):
    """--rela-norm-scope head: statistics per head over d_h (eq. 4's one-head notation read per
    head, a variant), gains of the same C-wide layout as the concat scope (ReLA section 4's method
    and the released code), so checkpoints interchange."""
    import argparse

    torch.manual_seed(0)
    concat = build_attention_fn(name, C, H, argparse.Namespace(rela_norm_scope="concat"))
    head = build_attention_fn(name, C, H, argparse.Namespace(rela_norm_scope="head"))
    head.load_state_dict(concat.state_dict())  # same keys and shapes
    z = torch.randn(3, 2, C, dtype=torch.float64)
    concat.double(), head.double()
    d = C // H
    if name in ("rela_g_layernorm", "relu_layernorm"):
        inner = head.norm.norm if name == "rela_g_layernorm" else head.norm
        zh = z.view(3, 2, H, d)
        ref = ((zh - zh.mean(-1, keepdim=True)) / (zh.var(-1, unbiased=False, keepdim=True) + inner.eps).sqrt())
        ref = ref.view(3, 2, C) * inner.weight + inner.bias
    else:
        zh = z.view(3, 2, H, d)
        ref = (zh / zh.pow(2).mean(-1, keepdim=True).add(head.eps).sqrt()).view(3, 2, C)
        ref = ref * (head.norm.norm.weight if hasattr(head.norm, "gate") else head.norm.weight)
    if hasattr(head.norm, "gate"):
        ref = torch.sigmoid(head.norm.gate * z) * ref
    torch.testing.assert_close(head.post_aggregate(z), ref)
    assert not torch.allclose(concat.post_aggregate(z), head.post_aggregate(z))
    # scaling one head leaves the other heads' outputs unchanged only per head
    z2 = z.clone()
    z2[..., :d] *= 10.0
    torch.testing.assert_close(head.post_aggregate(z2)[..., d:], head.post_aggregate(z)[..., d:])


def test_norm_scope_rejects_unknown():
    import argparse

    with pytest.raises(ValueError, match="concat, head"):
        build_attention_fn("rela_g", C, H, argparse.Namespace(rela_norm_scope="layer"))


@pytest.fixture
def zero_fn():
    @register_attention_fn("_test_zero")
    class ZeroAttention(AttentionFunction):
        calls = 0

        def normalize(self, scores, mask):
            ZeroAttention.calls += 1
            return torch.zeros_like(scores)

    yield ZeroAttention
    del ATTENTION_FUNCTIONS["_test_zero"]


@pytest.mark.parametrize("kind", ["self", "cross"])
def test_chosen_function_runs_in_training(zero_fn, kind):
    """No fused softmax path replaces the chosen function: zero weights => output = out_proj bias."""
    kw = {"self_attention": True} if kind == "self" else {"encoder_decoder_attention": True}
    m = FunctionalMultiheadAttention(C, H, build_attention_fn("_test_zero", C, H), dropout=0.1, **kw)
    m.train()
    x = torch.randn(5, 2, C)
    out, _ = m(x, x, x, need_weights=False)
    assert zero_fn.calls == 1
    torch.testing.assert_close(out, m.out_proj.bias.expand_as(out))


def test_unsupported_options_fail_clearly():
    with pytest.raises(ValueError, match="add_bias_kv"):
        FunctionalMultiheadAttention(C, H, build_attention_fn("softmax", C, H), add_bias_kv=True)
    m = mha("relu", self_attention=True)
    x = torch.randn(2, 1, C)
    with pytest.raises(ValueError, match="before_softmax"):
        m(x, x, x, before_softmax=True)
