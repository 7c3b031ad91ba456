"""ReLUFormer (Shen et al. 2023): eq. 6 scale factor with per-query n, eq. 7 regulariser,
the criterion that collects it, and the FFN key-value-memory variants (Section 3)."""

import argparse
import math

import pytest
import torch
import torch.nn as nn

from fairseq_plugins.attention import FunctionalMultiheadAttention, build_attention_fn
from fairseq_plugins.attention.stats import ROW_EPS, entropy_from_terms, reluformer_row_terms, row_mass_terms, valid_keys
from fairseq_plugins.criterions import LabelSmoothedCrossEntropyWithRegCriterion
from fairseq_plugins.modules import LinearThenLayerNorm, clear_auxiliary, collect_auxiliary, enable_auxiliary
from fairseq_plugins.modules.ffn import softmax_over_slots

from helpers import build, toy_batch

C, H = 8, 2


def fn(name="reluformer", **args):
    f = build_attention_fn(name, C, H, argparse.Namespace(**args))
    f.aux.enabled = True  # as the criterion does
    return f


def captured_n(f):
    """Wrap ``f.row_scale`` to record the ``n`` it is called with."""
    seen = []
    orig = f.row_scale

    def spy(n, *args):
        seen.append(n.detach().clone())
        return orig(n, *args)

    f.row_scale = spy
    return seen


def test_scale_factor_hand_computed():
    """s_j = ReLU(score_j) / (gamma sqrt(n/2)) with n = unmasked keys (padding not counted)."""
    f = fn(reluformer_gamma=2.0)
    scores = torch.tensor([1.0, -1.0, 2.0, 5.0]).view(1, 1, 1, 4)
    mask = torch.tensor([False, False, False, True]).view(1, 1, 1, 4)  # last key is padding
    w = f.normalize(scores, mask)
    denom = 2.0 * math.sqrt(3 / 2)
    torch.testing.assert_close(w.view(-1), torch.tensor([1 / denom, 0.0, 2 / denom, 0.0]))
    no_scale = fn("reluformer_noscale").normalize(scores, mask)
    torch.testing.assert_close(no_scale.view(-1), torch.tensor([1.0, 0.0, 2.0, 0.0]))


def test_n_per_query_encoder_padding_and_cross():
    """Encoder self / cross attention: every query of a sentence sees its non-pad keys."""
    m = FunctionalMultiheadAttention(C, H, fn(), encoder_decoder_attention=True)
    seen = captured_n(m.attn_fn)
    q, kv = torch.randn(3, 2, C), torch.randn(5, 2, C)
    kpm = torch.tensor([[True, False, False, False, False], [False] * 5])  # left padding
    m(q, kv, kv, key_padding_mask=kpm, need_weights=False)
    assert seen[-1].view(2, -1).tolist() == [[4.0], [5.0]]


def test_n_per_query_causal_full_and_incremental():
    """Decoder self-attention: n_i = i + 1, in the full pass and step by step."""
    m = FunctionalMultiheadAttention(C, H, fn(), self_attention=True).eval()
    seen = captured_n(m.attn_fn)
    x = torch.randn(5, 1, C)
    future = torch.triu(torch.full((5, 5), float("-inf")), 1)
    m(x, x, x, attn_mask=future, need_weights=False)
    assert seen[-1].view(-1).tolist() == [1.0, 2.0, 3.0, 4.0, 5.0]
    state = {}
    for t in range(5):
        m(x[t:t + 1], x[t:t + 1], x[t:t + 1], incremental_state=state, need_weights=False)
        assert seen[-1].view(-1).tolist() == [t + 1.0]


def test_valid_keys_shapes():
    assert valid_keys(None, 7).view(-1).tolist() == [7.0]
    mask = torch.tensor([[False, True, False]]).view(1, 1, 1, 3)
    assert valid_keys(mask, 3).shape == (1, 1, 1, 1) and valid_keys(mask, 3).item() == 2.0


def test_entropy_with_zeros():
    """0 log 0 = 0: H([.5, .5, 0]) = log 2; one non-zero weight has entropy 0."""
    s = torch.tensor([[0.5, 0.5, 0.0], [0.0, 0.3, 0.0]])
    row_sum, row_slogs = row_mass_terms(s)
    ent = entropy_from_terms(row_sum, row_slogs)
    torch.testing.assert_close(ent, torch.tensor([math.log(2), 0.0]))
    # renormalised: [0.5, 0.25] and [2/3, 1/3] have the same entropy
    a = entropy_from_terms(*row_mass_terms(torch.tensor([0.5, 0.25])))
    b = entropy_from_terms(*row_mass_terms(torch.tensor([2 / 3, 1 / 3])))
    torch.testing.assert_close(a, b)


def test_entropy_of_a_row_of_tiny_mass_is_its_own():
    """H(s_bar) is scale-invariant: rows whose mass is far below ROW_EPS have the entropy of their
    renormalised weights (0 for one key, log 2 for two equal ones) -- in entropy_from_terms (the
    logged attn_entropy and the analyses) and in the fused eq. 7 function's entropy sum, whose
    two loss terms keep the ROW_EPS floor."""
    for dt in (torch.float32, torch.float64):
        s = torch.tensor([[1e-8, 0.0, 0.0, 0.0], [5e-8, 5e-8, 0.0, 0.0], [1e-30, 3e-30, 0.0, 0.0],
                          [0.25, 0.25, 0.0, 0.0]], dtype=dt)
        row_sum, row_slogs = row_mass_terms(s)
        want = torch.tensor([0.0, math.log(2), -(0.25 * math.log(0.25) + 0.75 * math.log(0.75)), math.log(2)], dtype=dt)
        torch.testing.assert_close(entropy_from_terms(row_sum, row_slogs), want, rtol=1e-5, atol=1e-5)
        valid = torch.ones(1, 1, 4, dtype=torch.bool)
        n = torch.full((1, 1, 4), 4.0, dtype=dt)
        norm, margin, ent, count = reluformer_row_terms(row_sum.view(1, 1, 4), row_slogs.view(1, 1, 4), n, valid, 0.7)
        assert count == 4
        torch.testing.assert_close(ent, want.sum(), rtol=1e-5, atol=1e-5)
        # the norm term keeps the ROW_EPS floor: |log 1e-6| for each of the three tiny rows, |log 0.5|
        torch.testing.assert_close(norm, torch.tensor(3 * -math.log(ROW_EPS) + math.log(2), dtype=dt))


def _terms(f, weights, mask):
    f.aux.pop()
    f.observe(weights, mask)
    return {k: (t, c) for k, (t, c, _) in f.aux.pop().items()}


def test_regulariser_value_hand_computed():
    """eq. 7 on one row s = [0.5, 0.25, 0]: |log 0.75| + max(H([2/3, 1/3]) - c log 3, 0)."""
    f = fn(reluformer_entropy_c=0.1)
    w = torch.tensor([0.5, 0.25, 0.0]).view(1, 1, 1, 3)
    t = _terms(f, w, None)
    h = -(2 / 3) * math.log(2 / 3) - (1 / 3) * math.log(1 / 3)
    assert float(t["reluformer_norm"][0]) == pytest.approx(abs(math.log(0.75)), rel=1e-6)
    assert float(t["reluformer_entropy"][0]) == pytest.approx(h - 0.1 * math.log(3), rel=1e-6)
    assert float(t["attn_entropy"][0]) == pytest.approx(h, rel=1e-6)
    # with c = 0.7 the bound 0.7 log 3 = 0.769 exceeds H = 0.637: the margin term is 0
    assert float(_terms(fn(), w, None)["reluformer_entropy"][0]) == 0.0


def test_regulariser_gradient_matches_finite_differences():
    f = fn(reluformer_entropy_c=0.1)

    def reg(scores):
        w = f.normalize(scores, None)
        t = _terms(f, w, None)
        return (t["reluformer_norm"][0] + t["reluformer_entropy"][0]) / t["reluformer_norm"][1]

    torch.manual_seed(0)
    scores = (torch.rand(1, 2, 3, 4, dtype=torch.float64) + 0.1).requires_grad_()
    assert torch.autograd.gradcheck(reg, (scores,))


def _unfused_row_terms(row_sum, row_slogs, n, valid, c):
    """Eq. 7's sums as plain autograd expressions (the reference of the fused function) and the
    live-row count."""
    live = valid & (row_sum > 0)
    z = row_sum.clamp_min(ROW_EPS)  # eq. 7's terms floor the row mass at ROW_EPS ...
    norm = torch.log(z).abs()
    margin = torch.relu(torch.log(z) - row_slogs / z - c * torch.log(n.clamp_min(1.0)))
    ent = entropy_from_terms(row_sum, row_slogs)  # ... the logged entropy is each row's own
    zero = torch.zeros((), dtype=row_sum.dtype)
    return torch.stack([torch.where(live, norm, zero).sum(), torch.where(live, margin, zero).sum(),
                        torch.where(live, ent, zero).sum(), live.sum().to(row_sum.dtype)])


def test_fused_row_terms_equal_autograd_of_the_unfused_expression():
    """The fused eq. 7 sums (fewer kernels: the reluformer layer was launch-bound on a GPU) equal
    the plain expression in value and gradient, in float64, with every branch of the derivative
    present: rows below ROW_EPS, |log z| on both sides of 0, the margin on both sides of 0,
    null rows and rows that are not counted, each term's gradient alone and together; gradcheck
    checks the hand-written backward against finite differences."""
    g = torch.Generator().manual_seed(0)
    B, Hh, T = 3, 2, 7
    s = torch.rand(B, Hh, T, 5, generator=g, dtype=torch.float64) * torch.rand(B, Hh, T, 1, generator=g,
                                                                               dtype=torch.float64) * 4
    s[0, 0, :3] = 0.0  # null rows (not live)
    s[0, 1, 0] = 0.0
    s[0, 1, 0, 0] = 1e-8  # a live row below ROW_EPS: the clamp stops its gradient
    row_sum, row_slogs = row_mass_terms(s)
    n = torch.randint(1, 6, (B, 1, T), generator=g).to(torch.float64)
    valid = torch.rand(B, Hh, T, generator=g) > 0.2
    valid[0, 1, 0] = True
    live = valid & (row_sum > 0)
    assert live[0, 1, 0] and (valid & ~live).any() and (~valid & (row_sum > 0)).any()
    for c in (0.0, 0.7, 1.5):  # the margin: mostly active, mixed, mostly 0
        a = row_sum.detach().clone().requires_grad_()
        b = row_slogs.detach().clone().requires_grad_()
        ref = _unfused_row_terms(a, b, n, valid, c)
        got = reluformer_row_terms(a, b, n, valid, c)
        torch.testing.assert_close(torch.stack(got), ref, rtol=1e-12, atol=1e-12)
        assert not got[3].requires_grad
        # both terms, each alone (the other's gradient is None), and H, which passes no gradient
        for w in ([0.3, -1.7, 0.0], [0.3, 0.0, 0.0], [0.0, -1.7, 0.0]):
            ga = torch.autograd.grad(sum(x * y for x, y in zip(_unfused_row_terms(a, b, n, valid, c)[:3], w) if y),
                                     (a, b), allow_unused=True)
            gb = torch.autograd.grad(sum(x * y for x, y in zip(reluformer_row_terms(a, b, n, valid, c)[:3], w) if y),
                                     (a, b), allow_unused=True)
            for x, y in zip(gb, ga):
                torch.testing.assert_close(x if x is not None else torch.zeros_like(a),
                                           y if y is not None else torch.zeros_like(a), rtol=1e-12, atol=1e-12)
            if w == [0.3, 0.0, 0.0]:  # the norm alone: the live row below ROW_EPS gets no gradient (clamped),
                u = a.detach()[0, 1, 0].clone().requires_grad_()  # where |log z| unclamped would give -0.3 / z
                unclamped, = torch.autograd.grad(0.3 * torch.log(u).abs(), u)
                assert live[0, 1, 0] and gb[0][0, 1, 0] == 0 and abs(float(unclamped)) > 1e6
        assert ga[0].abs().sum() > 0  # the margin's gradients are exercised (the last weights: the margin alone)
    keep = row_sum > 1e-3  # finite differences away from the kinks of the clamp
    a = row_sum.detach().clone().masked_fill(~keep, 2.0).requires_grad_()  # (not 1: |log z| kinks there)
    b = row_slogs.detach().clone().requires_grad_()
    torch.autograd.gradcheck(lambda x, y: reluformer_row_terms(x, y, n, valid, 0.7)[:2], (a, b))


def _row_stats_float64(row_sum, row_slogs, n, valid, c):
    """ReLUFormer eq. 7's terms and the statistics over ``valid`` rows, from the rows upcast to
    float64 with plain expressions: ``{name: (sum, count)}`` as the functions record them."""
    rs, rl = row_sum.double(), row_slogs.double()
    valid = valid.expand_as(rs)
    live = valid & (rs > 0)
    z = rs.clamp_min(ROW_EPS)
    margin = torch.relu(z.log() - rl / z - c * n.double().clamp_min(1.0).log())
    ent = entropy_from_terms(rs, torch.where(live, rl, 0.0))
    live_n = float(live.sum())
    return {"reluformer_norm": (float(z.log().abs()[live].sum()), live_n),
            "reluformer_entropy": (float(margin.expand_as(rs)[live].sum()), live_n),
            "attn_entropy": (float(ent[live].sum()), live_n),
            "attn_null_rate": (float((valid & ~live).sum()), float(valid.sum()))}


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_rows_over_65536_are_counted_in_float32(dtype):
    """72,000 half-precision rows (more than float16 can count: 65,504 is its largest finite
    number, and bfloat16 rounds 70,000 to a multiple of 512) on the torch path of record_terms:
    the live and counted rows are exact and the eq. 7 sums equal the float64 computation from the
    same rows (before the fix the float16 count was inf -- terms averaged to 0, null rate NaN --
    and the bfloat16 count was rounded)."""
    g = torch.Generator().manual_seed(0)
    B, Hh, T = 2, 4, 9000
    s = torch.rand(B, Hh, T, 6, generator=g, dtype=torch.float64) * torch.rand(B, Hh, T, 1, generator=g,
                                                                               dtype=torch.float64) * 3
    s[:, :, :125] = 0.0  # 1,000 null rows
    row_sum, row_slogs = (x.to(dtype) for x in row_mass_terms(s))
    n = torch.full((B, 1, T, 1), 6.0)
    f = build_attention_fn("reluformer", 8 * Hh, Hh, argparse.Namespace(attention_backend="torch"))
    f.aux.enabled = True
    f.query_padding = torch.zeros(B, T, dtype=torch.bool)
    f.query_padding[1, -500:] = True  # 2,000 padded query rows (of 4 heads)
    f.record_terms(row_sum, row_slogs, n)
    got = {k: (float(t), float(c)) for k, (t, c, _) in f.aux.pop().items()}
    valid = ~f.query_padding.unsqueeze(1)
    want = _row_stats_float64(row_sum, row_slogs, n.squeeze(-1), valid, f.entropy_c)
    assert want["attn_null_rate"] == (1000.0, 70000.0) and want["reluformer_norm"][1] == 69000.0
    for k, (t, c) in want.items():
        assert got[k][1] == c, k  # counts exact
        assert got[k][0] == pytest.approx(t, rel=1e-5, abs=1e-6), k


def test_half_precision_module_counts_more_than_65536_rows():
    """The reported case through FunctionalMultiheadAttention on the torch backend in float16:
    one call with 66,560 query rows x heads (B 130, T = S = 64, H 8, head dim 2), causal (so some
    first-position rows are null).  The recorded terms equal the float64 computation from the
    call's own row sums, and the means and null rate agree with the same module in float32."""
    import fairseq_plugins.attention.functions as functions

    B, T, Cm, Hm = 130, 64, 16, 8
    rows = []
    orig = functions._ReluFormerBase.record_terms

    def spy(self, row_sum, row_slogs, n):
        rows.append((row_sum.detach(), row_slogs.detach(), n))
        return orig(self, row_sum, row_slogs, n)

    recs = {}
    x0 = torch.randn(T, B, Cm, generator=torch.Generator().manual_seed(1))
    future = torch.triu(torch.full((T, T), float("-inf")), 1)
    for dtype in (torch.float16, torch.float32):
        torch.manual_seed(0)
        f = build_attention_fn("reluformer", Cm, Hm, argparse.Namespace(attention_backend="torch"))
        f.aux.enabled = True
        m = FunctionalMultiheadAttention(Cm, Hm, f, self_attention=True)
        with torch.no_grad():
            for i, p in enumerate(m.parameters()):
                p.normal_(generator=torch.Generator().manual_seed(i))
        m = m.half().to(dtype)  # the float32 module: the float16-rounded weights and input
        x = x0.half().to(dtype)
        functions._ReluFormerBase.record_terms = spy
        try:
            m(x, x, x, attn_mask=future.to(dtype), need_weights=False)
        finally:
            functions._ReluFormerBase.record_terms = orig
        recs[dtype] = {k: (float(t), float(c)) for k, (t, c, _) in f.aux.pop().items()}
    row_sum, row_slogs, n = rows[0]
    assert row_sum.numel() == B * Hm * T > 65536
    want = _row_stats_float64(row_sum, row_slogs, n.squeeze(-1), torch.ones(1, 1, 1, dtype=torch.bool), 0.7)
    assert 0 < want["attn_null_rate"][0] < want["attn_null_rate"][1] == B * Hm * T  # some null rows
    half, full = recs[torch.float16], recs[torch.float32]
    for k, (t, c) in want.items():
        assert half[k][1] == c, k
        assert half[k][0] == pytest.approx(t, rel=1e-5, abs=1e-6), k
        # the float32 module: the same statistics to float16 rounding of the scores
        assert half[k][0] / half[k][1] == pytest.approx(full[k][0] / full[k][1], rel=2e-2, abs=2e-3), k


def test_null_and_fully_masked_rows_are_finite():
    f = fn()
    scores = torch.tensor([[-1.0, -2.0, -3.0], [1.0, 2.0, 3.0], [4.0, 5.0, 6.0]]).view(1, 1, 3, 3)
    mask = torch.tensor([False, False, True]).view(1, 1, 3, 1).expand(1, 1, 3, 3)  # row 2 all masked
    scores.requires_grad_()
    w = f.normalize(scores, mask)
    assert torch.equal(w[0, 0, 2], torch.zeros(3))
    t = _terms(f, w, mask)
    # the fully masked row is excluded, and so is the null row (no distribution, log 0): the
    # eq. 7 terms are means over the one live row; the null row is counted by the null rate
    assert int(t["reluformer_norm"][1]) == 1 and int(t["reluformer_entropy"][1]) == 1
    assert float(t["reluformer_norm"][0]) == pytest.approx(abs(math.log(float(w[0, 0, 1].sum()))), rel=1e-6)
    assert float(t["attn_null_rate"][0]) == 1.0 and int(t["attn_null_rate"][1]) == 2
    assert int(t["attn_entropy"][1]) == 1  # entropy averaged over the non-null row only
    (t["reluformer_norm"][0] + t["reluformer_entropy"][0]).backward()
    assert torch.isfinite(scores.grad).all() and torch.equal(scores.grad[0, 0, 0], torch.zeros(3))


def test_padded_query_rows_are_excluded():
    """A padded query still sees real keys; its row must not enter eq. 7's means."""
    f = fn(reluformer_entropy_c=0.1)
    w = torch.tensor([[0.5, 0.25, 0.0], [0.1, 0.2, 0.3], [2.0, 0.0, 0.0]]).view(1, 1, 3, 3)
    full = _terms(f, w, None)
    f.query_padding = torch.tensor([[False, True, False]])  # (B, T): row 1 is padding
    part = _terms(f, w, None)
    assert int(full["reluformer_norm"][1]) == 3 and int(part["reluformer_norm"][1]) == 2
    expect = abs(math.log(0.75)) + abs(math.log(2.0))
    assert float(part["reluformer_norm"][0]) == pytest.approx(expect, rel=1e-6)


def test_model_counts_only_real_tokens_in_every_attention_type():
    """End to end through the model: encoder self rows = real source tokens, decoder self and
    cross rows = real target tokens (the decoder layer hands its padding to the cross-attention)."""
    torch.manual_seed(0)
    model, task = build("reluformer_small", encoder_layers=1, decoder_layers=1)
    src, src_lengths, prev = toy_batch(task, bsz=3, src_len=7, tgt_len=6)
    pad = task.target_dictionary.pad()
    prev[0, 4:] = pad  # right-padded target of sentence 0
    enable_auxiliary(model)
    model(src, src_lengths, prev)
    counts = {}
    for name, m in model.named_modules():
        if isinstance(m, FunctionalMultiheadAttention):
            recs = m.attn_fn.aux.pop()
            counts[name.split(".")[0] + ("_cross" if "encoder_attn" in name else "")] = int(recs["attn_null_rate"][1])
    heads = model.encoder.layers[0].self_attn.num_heads
    assert counts["encoder"] == heads * int(src.ne(pad).sum())
    assert counts["decoder"] == heads * int(prev.ne(pad).sum())
    assert counts["decoder_cross"] == heads * int(prev.ne(pad).sum())


@pytest.mark.parametrize("terms,losses", [("both", {"reluformer_norm", "reluformer_entropy"}),
                                          ("norm", {"reluformer_norm"}), ("entropy", {"reluformer_entropy"})])
def test_reg_terms_choose_the_trained_terms(terms, losses):
    f = fn(reluformer_reg_terms=terms)
    f.observe(torch.tensor([0.5, 0.25, 0.0]).view(1, 1, 1, 3), None)
    recs = f.aux.pop()
    assert {k for k, (_, _, is_loss) in recs.items() if is_loss} == losses
    assert {"reluformer_norm", "reluformer_entropy"} <= set(recs)  # both still logged


def test_bad_reg_terms_name_the_choices():
    with pytest.raises(ValueError, match="both, norm, entropy"):
        fn(reluformer_reg_terms="all")


def test_bad_gamma_is_rejected():
    with pytest.raises(ValueError, match="gamma"):
        fn(reluformer_gamma=-1.0)


def _criterion(task, reg_weight):
    return LabelSmoothedCrossEntropyWithRegCriterion(task, sentence_avg=False, label_smoothing=0.1,
                                                     reg_weight=reg_weight)


def _sample(task):
    src, src_lengths, prev = toy_batch(task, bsz=3, src_len=7, tgt_len=6)
    target = torch.cat([prev[:, 1:], torch.full((3, 1), task.target_dictionary.eos())], 1)
    return {"net_input": {"src_tokens": src, "src_lengths": src_lengths,
                          "prev_output_tokens": prev},
            "target": target, "ntokens": target.numel()}


def test_a_rela_model_under_the_reg_criterion_at_weight_0_trains_fairseqs_loss_and_logs_its_statistics():
    """docs/pipeline.md: ReLA rows train with fairseq's criterion, which logs no attention statistic;
    ``--criterion label_smoothed_cross_entropy_with_reg --reg-weight 0 --attention-entropy`` trains
    the same loss and gradients (ReLA adds no auxiliary loss) and logs ``attn_null_rate`` /
    ``attn_entropy`` on validation."""
    from fairseq.criterions.label_smoothed_cross_entropy import LabelSmoothedCrossEntropyCriterion

    torch.manual_seed(0)
    model, task = build("rela_transformer_small", encoder_layers=1, decoder_layers=1, attention_entropy=True)
    sample = _sample(task)
    stock = LabelSmoothedCrossEntropyCriterion(task, sentence_avg=False, label_smoothing=0.1)
    model.train()
    out = {}
    for name, crit in (("stock", stock), ("reg", _criterion(task, 0.0))):
        torch.manual_seed(1)
        loss, ss, log = crit(model, sample)
        out[name] = loss, ss, torch.autograd.grad(loss, [p for p in model.parameters() if p.requires_grad])
        assert not any(k.startswith("aux_") for k in log)  # training: nothing regularised, nothing tracked
    (ls, ss_s, gs), (lr, ss_r, gr) = out["stock"], out["reg"]
    assert ss_r == ss_s and torch.equal(lr, ls) and all(torch.equal(a, b) for a, b in zip(gs, gr))
    model.eval()
    with torch.no_grad():
        _, ss, log = _criterion(task, 0.0)(model, sample)
        _, _, log_stock = stock(model, sample)
    assert 0 <= float(log["aux_attn_null_rate"]) / ss <= 1 and float(log["aux_attn_entropy"]) / ss >= 0
    assert not any(k.startswith("aux_") for k in log_stock)  # fairseq's criterion never reads them


def test_criterion_adds_weighted_mean_scaled_by_sample_size():
    torch.manual_seed(0)
    model, task = build("reluformer_small", encoder_layers=1, decoder_layers=1)
    model.train()
    sample = _sample(task)
    torch.manual_seed(1)
    loss0, ss0, log0 = _criterion(task, 0.0)(model, sample)
    torch.manual_seed(1)
    loss2, ss2, log2 = _criterion(task, 2.0)(model, sample)
    assert ss0 == ss2 == sample["ntokens"]  # sample_size is not replaced by 1
    for name in ("reluformer_norm", "reluformer_entropy", "attn_entropy", "attn_null_rate", "reg_loss"):
        assert "aux_" + name in log2
    assert all(torch.is_tensor(log2["aux_" + n]) for n in ("reg_loss", "reluformer_norm"))  # no host sync
    reg = float(log2["aux_reg_loss"]) / ss2
    assert reg == pytest.approx(float(log2["aux_reluformer_norm"] + log2["aux_reluformer_entropy"]) / ss2)
    assert float(loss2) == pytest.approx(float(loss0) + 2.0 * reg * ss2, rel=1e-5)
    # one forward pass leaves nothing behind in the buffers
    assert collect_auxiliary(model) == {}


def _module_terms_by_hand(w, mask, query_pad, c=0.7):
    """One attention module's eq. 7 means and statistics from its weights ``(B, H, T, S)``, in
    float64 with plain expressions: rows counted where the query sees a key and is no padding,
    means over the live ones (positive mass), null rate over the counted ones."""
    w = w.double()
    S = w.size(-1)
    n = torch.full(w.shape[:-1], float(S), dtype=torch.float64) if mask is None else \
        (~mask).sum(-1).double().expand(w.shape[:-1])
    valid = (n > 0) & ~query_pad.unsqueeze(1)
    mass = w.sum(-1)
    live = valid & (mass > 0)
    p = w / mass.clamp_min(1e-300).unsqueeze(-1)
    ent = -torch.special.xlogy(p, p).sum(-1)  # H(s_bar), 0 log 0 = 0
    z = mass.clamp_min(ROW_EPS)
    return {"reluformer_norm": float(z.log().abs()[live].mean()),
            "reluformer_entropy": float(torch.relu(ent - c * n.clamp_min(1).log())[live].mean()),
            "attn_entropy": float(ent[live].mean()),
            "attn_null_rate": float((valid & ~live).sum() / valid.sum())}


def test_criterion_terms_are_averaged_over_layers_and_differentiable():
    """collect_auxiliary's value of each term is the mean over the attention modules of each
    module's mean over its live query rows, checked against the terms recomputed by hand from the
    captured weights of every module (float64; query padding taken from the batch itself), and
    the loss terms carry gradients to the projections."""
    torch.manual_seed(0)
    model, task = build("reluformer_small", encoder_layers=2, decoder_layers=1)
    sample = _sample(task)
    pad = task.source_dictionary.pad()
    src, prev = sample["net_input"]["src_tokens"], sample["net_input"]["prev_output_tokens"]
    assert src.eq(pad).any()  # padded source queries: excluded from the encoder's rows
    enable_auxiliary(model)
    model(**sample["net_input"])
    aux = collect_auxiliary(model)
    # 2 encoder self + 1 decoder self + 1 cross attention modules reported
    assert aux["reluformer_norm"][2] == 4 and aux["reluformer_norm"][1] is True
    assert aux["attn_entropy"][1] is False
    # the same forward pass with the weights captured (the score path), each module by hand
    per_module = []
    mods = [(name, m) for name, m in model.named_modules() if isinstance(m, FunctionalMultiheadAttention)]
    for name, m in mods:
        qpad = src.eq(pad) if name.startswith("encoder") else prev.eq(pad)
        m.attn_fn.capture = lambda w, mask, qpad=qpad: per_module.append(_module_terms_by_hand(w.detach(), mask, qpad))
    try:
        with torch.no_grad():
            model(**sample["net_input"])
    finally:
        for _, m in mods:
            m.attn_fn.capture = None
        clear_auxiliary(model)
    assert len(per_module) == 4
    for key in ("reluformer_norm", "reluformer_entropy", "attn_entropy", "attn_null_rate"):
        want = sum(t[key] for t in per_module) / len(per_module)
        assert float(aux[key][0]) == pytest.approx(want, rel=1e-5, abs=1e-6), key
    assert aux["reluformer_entropy"][0] > 0 and aux["reluformer_norm"][0] > 0  # not trivially 0
    aux["reluformer_norm"][0].backward()
    grads = [p.grad for n, p in model.named_parameters() if "q_proj" in n]
    assert all(g is not None and g.abs().sum() > 0 for g in grads)


def test_softmax_model_logs_entropy_only_in_validation():
    model, task = build(
        "rela_transformer_small", encoder_attention_fn="softmax", decoder_attention_fn="softmax",
        cross_attention_fn="softmax", attention_entropy=True)
    sample = _sample(task)
    crit = _criterion(task, 1.0)
    model.train()
    _, _, log_train = crit(model, sample)
    assert "aux_attn_entropy" not in log_train
    model.eval()
    with torch.no_grad():
        _, _, log_eval = crit(model, sample)
    ent = log_eval["aux_attn_entropy"] / log_eval["sample_size"]
    assert 0.0 < ent <= math.log(7) + 1e-6  # softmax entropy is bounded by log(source length)
    assert "aux_reg_loss" not in log_eval


def test_ffn_softmax_activation_and_output_layernorm():
    model, _ = build("reluformer_small", ffn_activation="softmax", ffn_output_layernorm=True)
    layer = model.encoder.layers[0]
    assert layer.activation_fn is softmax_over_slots
    assert isinstance(layer.fc2, LinearThenLayerNorm)
    names = dict(model.named_parameters())
    assert "encoder.layers.0.fc2.norm.weight" in names and "decoder.layers.0.fc2.weight" in names
    h = layer.activation_fn(layer.fc1(torch.randn(3, 2, 16)))
    torch.testing.assert_close(h.sum(-1), torch.ones(3, 2))  # a distribution over the d_ff slots
    out = layer.fc2(h)
    torch.testing.assert_close(out.mean(-1), torch.zeros(3, 2), atol=1e-5, rtol=0)  # LN output
    plain, _ = build("reluformer_small")
    assert type(plain.encoder.layers[0].fc2) is nn.Linear
    assert plain.encoder.layers[0].activation_fn is not softmax_over_slots


def test_ffn_layernorm_keeps_the_linear_parameters():
    lin = nn.Linear(4, 3)
    wrapped = LinearThenLayerNorm.from_linear(lin)
    assert wrapped.weight is lin.weight and wrapped.bias is lin.bias
    x = torch.randn(2, 4)
    torch.testing.assert_close(wrapped(x), torch.nn.functional.layer_norm(lin(x), (3,)))


def test_reluformer_archs_use_reluformer_everywhere():
    for arch in ("reluformer", "reluformer_iwslt_de_en", "reluformer_small"):
        model, _ = build(arch, encoder_layers=1, decoder_layers=1)
        kinds = {type(m.attn_fn).__name__ for m in model.modules()
                 if isinstance(m, FunctionalMultiheadAttention)}
        assert kinds == {"ReluFormerAttention"}, (arch, kinds)


def test_records_do_not_pile_up_without_the_regularised_criterion():
    """Each model forward starts from empty buffers, so a criterion that never collects the
    terms (plain label-smoothed CE) does not keep graphs of earlier steps alive."""
    model, task = build("reluformer_small", encoder_layers=1, decoder_layers=1)
    sample = _sample(task)
    attn = model.encoder.layers[0].self_attn.attn_fn
    enable_auxiliary(model)
    counts = []
    for _ in range(3):
        model(**sample["net_input"])[0].sum().backward()
        counts.append(int(attn.aux._records["reluformer_norm"][1]))
    assert counts[0] > 0 and counts == [counts[0]] * 3


def test_ffn_variance_ratio_matches_direct_computation():
    from fairseq_plugins.analysis import ffn_variance_ratios

    torch.manual_seed(0)
    model, task = build("reluformer_small", encoder_layers=1, decoder_layers=1)
    sample = _sample(task)
    pad = task.source_dictionary.pad()
    res = ffn_variance_ratios(model, [sample], pad)
    assert len(res["encoder"]) == 1 and len(res["decoder"]) == 1
    # direct: run the encoder layer's FFN on its input captured by hand
    layer = model.encoder.layers[0]
    seen = {}
    h = layer.fc1.register_forward_pre_hook(lambda m, i: seen.setdefault("x", i[0]))
    model.eval()
    with torch.no_grad():
        model(**sample["net_input"])
        x = seen["x"]
        y = layer.fc2(layer.activation_fn(layer.fc1(x)))
    h.remove()
    mask = sample["net_input"]["src_tokens"].ne(pad).t()
    expect = (y.var(-1, unbiased=False) / x.var(-1, unbiased=False))[mask].mean()
    assert res["encoder"][0] == pytest.approx(float(expect), rel=1e-5)
    assert res["mean"][0] == pytest.approx((res["encoder"][0] + res["decoder"][0]) / 2)


def _ffn_scores_by_hand(model, sample, pad, layer):
    """The encoder layer's FFN scores act(x W_1) of the non-padding tokens, ``(N, F)``."""
    seen = {}
    h = layer.fc1.register_forward_pre_hook(lambda m, i: seen.setdefault("x", i[0]))
    model.eval()
    with torch.no_grad():
        model(**sample["net_input"])
        s = layer.activation_fn(layer.fc1(seen["x"]))  # (T, B, F)
    h.remove()
    return s[sample["net_input"]["src_tokens"].ne(pad).t()]


@pytest.mark.parametrize("act", [None, "softmax"])
def test_ffn_top_p_score_sum_matches_a_sort_by_hand(act):
    """ReLUFormer Figure 2: renormalise each token's FFN scores, sort, sum the top ceil(p% F)."""
    from fairseq_plugins.analysis.ffn_memory import ffn_top_p_score_sums

    torch.manual_seed(0)
    kw = {"ffn_activation": act} if act else {}
    model, task = build("rela_transformer_small", encoder_layers=1, decoder_layers=1,
                        encoder_ffn_embed_dim=64, decoder_ffn_embed_dim=64, **kw)
    sample = _sample(task)
    pad = task.source_dictionary.pad()
    assert sample["net_input"]["src_tokens"].eq(pad).any()  # padding is present and must be skipped
    res = ffn_top_p_score_sums(model, [sample], pad, ps=(0.2, 10, 100))
    s = _ffn_scores_by_hand(model, sample, pad, model.encoder.layers[0]).double()
    live = s.sum(-1) > 0
    dist = (s[live] / s[live].sum(-1, keepdim=True)).sort(-1, descending=True).values
    for j, k in enumerate((1, 7, 64)):  # ceil(0.2% of 64) = 1, ceil(10% of 64) = 7, all 64
        assert res["encoder"][0][j] == pytest.approx(float(dist[:, :k].sum(-1).mean()), rel=1e-5)
    assert res["encoder"][0][2] == pytest.approx(1.0)
    assert res["dead"]["encoder"][0] == pytest.approx(1 - float(live.double().mean()))
    assert res["d_ff"] == {"encoder": [64], "decoder": [64]}
    assert res["top_0.2"][0] == pytest.approx((res["encoder"][0][0] + res["decoder"][0][0]) / 2)
    if act == "softmax":
        assert res["dead"]["encoder"][0] == 0.0


def test_ffn_top_p_refuses_scores_that_are_no_distribution():
    from fairseq_plugins.analysis.ffn_memory import ffn_top_p_score_sums

    model, task = build("rela_transformer_small", encoder_layers=1, decoder_layers=1, activation_fn="gelu")
    with pytest.raises(ValueError, match="encoder layer 0 uses the activation gelu, valid: relu, softmax"):
        ffn_top_p_score_sums(model, [_sample(task)], task.source_dictionary.pad())
    with pytest.raises(ValueError, match=r"\(0, 100\]"):
        ffn_top_p_score_sums(model, [], 1, ps=(0.0,))


def test_ffn_anisotropies_per_layer_and_mean():
    """ReLUFormer eq. 4 per layer on fc2's columns; identical slots give ANI 1."""
    from fairseq_plugins.analysis.ffn_memory import ffn_anisotropies
    from fairseq_plugins.analysis.metrics import anisotropy

    torch.manual_seed(0)
    model, _ = build("rela_transformer_small", encoder_layers=2, decoder_layers=1)
    with torch.no_grad():
        model.decoder.layers[0].fc2.weight.copy_(torch.ones_like(model.decoder.layers[0].fc2.weight))
    res = ffn_anisotropies(model)
    assert res["encoder"][1] == pytest.approx(anisotropy(model.encoder.layers[1].fc2.weight.t()))
    assert res["decoder"] == [pytest.approx(1.0)]
    assert res["mean"][0] == pytest.approx(sum(res["encoder"] + res["decoder"]) / 3)


@pytest.mark.parametrize("chunked", [False, True])
def test_fused_kernel_path_equals_weights_path(monkeypatch, chunked):
    """need_weights=False (kernel, statistics from row sums) == need_weights=True (weights
    materialised): same output, same recorded eq. 7 terms, same gradients; with padding and
    the causal mask."""
    from fairseq_plugins.attention import kernels

    if chunked:  # force the chunked kernel at this small size
        monkeypatch.setattr(kernels, "SMALL_TS", 0)
        monkeypatch.setattr(kernels, "MIN_SCORES", 0)
    torch.manual_seed(0)
    m = FunctionalMultiheadAttention(C, H, fn(), self_attention=True).double()
    x = torch.randn(9, 2, C, dtype=torch.float64)
    kpm = torch.zeros(2, 9, dtype=torch.bool)
    kpm[1, 6:] = True
    future = torch.triu(torch.full((9, 9), float("-inf"), dtype=torch.float64), 1)
    outs, terms, grads = [], [], []
    for need in (False, True):
        m.zero_grad()
        y, _ = m(x, x, x, key_padding_mask=kpm, attn_mask=future, need_weights=need)
        rec = m.attn_fn.aux.pop()
        (y.square().sum() + rec["reluformer_norm"][0] + rec["reluformer_entropy"][0]).backward()
        outs.append(y.detach())
        terms.append({k: float(v[0]) for k, v in rec.items()})
        grads.append(m.q_proj.weight.grad.clone())
    torch.testing.assert_close(outs[0], outs[1])
    assert terms[0] == pytest.approx(terms[1], rel=1e-9)
    torch.testing.assert_close(grads[0], grads[1])


def test_nothing_is_recorded_without_a_collector():
    """Generation and plain criteria never enable the buffers: no terms, no extra work."""
    model, task = build("reluformer_small", encoder_layers=1, decoder_layers=1, attention_entropy=True)
    model.eval()
    with torch.no_grad():
        model(**_sample(task)["net_input"])
    assert collect_auxiliary(model) == {}


def test_collect_auxiliary_skips_modules_that_counted_nothing_without_reading_counts():
    """Per module sum / count, then the mean over the modules with count > 0 -- computed on the
    device (the criterion calls it after every forward pass; a host sync there would stall the
    backward's launches): a module whose rows were all masked adds nothing, and a name no module
    counted anything for averages to 0.  Python-number counts work too."""
    from fairseq_plugins.modules import AuxiliaryBuffer

    mods = torch.nn.ModuleList([torch.nn.Linear(1, 1) for _ in range(3)])
    for m in mods:
        m.aux = AuxiliaryBuffer()
    enable_auxiliary(mods)
    total = torch.tensor(6.0, requires_grad=True)
    mods[0].aux.record("t", total, torch.tensor(3), True)       # mean 2
    mods[1].aux.record("t", torch.tensor(0.0), torch.tensor(0), True)  # all masked: skipped
    mods[2].aux.record("t", torch.tensor(4.0), 1, True)          # mean 4, a Python count
    mods[0].aux.record("z", torch.tensor(0.0), 0, False)
    aux = collect_auxiliary(mods)
    assert aux["t"][0].item() == pytest.approx(3.0) and aux["t"][1] is True and aux["t"][2] == 3
    assert aux["z"][0].item() == 0.0
    aux["t"][0].backward()
    assert total.grad.item() == pytest.approx(1 / 3 / 2)  # d/d total of (total/3 + 4) / 2
