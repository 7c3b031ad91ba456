"""RNNsearch with global / local-p / flexible attention (Shu & Nakayama 2017).

Closed-form windows, limit cases (tau = inf, g = 0), local-p against a hand computation,
incremental vs full decoding, beam search with reordering, windowed scoring that really skips
positions, the fine-tuning term of eq. 9 through the criterion, and an end-to-end train +
generate (+ fine-tune) on a slice of real Multi30k.
"""

import argparse
import json
import math
import os
import re
import statistics
import subprocess
import sys

import pytest
import torch
from fairseq.models import ARCH_CONFIG_REGISTRY, ARCH_MODEL_REGISTRY
from fairseq.sequence_generator import SequenceGenerator

from fairseq import utils
from fairseq_plugins.attention.additive import (AdditiveAttention, flexible_bounds, flexible_window, local_p_bounds,
                                                local_p_window, parse_window_report)
from fairseq_plugins.criterions import LabelSmoothedCrossEntropyWithRegCriterion
from helpers import toy_batch, toy_task

KINDS = ("global", "local_p", "flexible")


def build(kind, seed=0, task=None, **over):
    torch.manual_seed(seed)
    task = task or toy_task()
    args = argparse.Namespace(encoder_embed_dim=8, encoder_hidden_size=8, decoder_embed_dim=8,
                              decoder_hidden_size=12, attention_dim=10, decoder_out_embed_dim=8,
                              dropout=0.0, rnn_attention=kind, **{"local_window_d": 2, **over})
    ARCH_CONFIG_REGISTRY["rnnsearch_small"](args)
    return ARCH_MODEL_REGISTRY["rnnsearch_small"].build_model(args, task), task


def long_batch(task, bsz=3, src_len=14, tgt_len=6, seed=0):
    return toy_batch(task, bsz=bsz, src_len=src_len, tgt_len=tgt_len, seed=seed)


# -- windows ----------------------------------------------------------------------------------
def test_flexible_window_matches_closed_form():
    g_ = torch.Generator().manual_seed(0)
    n = 500
    p = torch.rand(n, generator=g_) * 30
    g = torch.rand(n, generator=g_).clamp_min(1e-3)
    lengths = torch.randint(1, 40, (n,), generator=g_)
    p = torch.minimum(p, (lengths - 1).float())
    for sigma, tau in [(1.5, 1.2), (1.5, 0.3), (3.0, 0.05), (0.7, 8.0)]:
        lo, hi = flexible_window(p, g, sigma, tau, lengths)
        for i in range(n):
            s = torch.arange(int(lengths[i])).double()
            r = sigma * math.sqrt(2 * tau / float(g[i]))
            inside = ((s > float(p[i]) - r) & (s < float(p[i]) + r)).nonzero().flatten()
            # ... which is exactly the set with penalty < tau
            pen = float(g[i]) * (s - float(p[i])) ** 2 / (2 * sigma ** 2)
            assert torch.equal(inside, (pen < tau).nonzero().flatten())
            if len(inside):
                assert (int(lo[i]), int(hi[i])) == (int(inside[0]), int(inside[-1]))
            else:  # empty open interval -> the nearest position
                assert int(lo[i]) == int(hi[i]) == min(round(float(p[i])), int(lengths[i]) - 1)
    # tau = inf and g -> 0 give the whole sentence
    lo, hi = flexible_window(p, g, 1.5, math.inf, lengths)
    assert torch.equal(lo, torch.zeros_like(lo)) and torch.equal(hi, lengths - 1)
    lo, hi = flexible_window(p, torch.zeros_like(g), 1.5, 1.2, lengths)
    assert torch.equal(lo, torch.zeros_like(lo)) and torch.equal(hi, lengths - 1)


def test_scalar_bounds_equal_tensor_windows():
    """The one-hypothesis path's Python-number bounds equal the batched tensor windows, also on
    interval ends that fall exactly on integers (open interval: excluded) and in the limits."""
    g_ = torch.Generator().manual_seed(1)
    n = 400
    lengths = torch.randint(1, 60, (n,), generator=g_)
    p = torch.minimum(torch.rand(n, generator=g_) * 60, (lengths - 1).float())
    p[:100] = p[:100].round()  # integer focus ...
    g = torch.rand(n, generator=g_).clamp_min(1e-4)
    g[:50] = 0.5  # ... with sigma 1, tau 1: radius exactly 2, the ends p +- 2 are integers
    g[50:60] = 0.0
    for sigma, tau in [(1.0, 1.0), (1.5, 1.2), (0.5, 0.1), (2.0, 8.0), (1.5, math.inf)]:
        lo, hi = flexible_window(p, g, sigma, tau, lengths)
        got = [flexible_bounds(float(p[i]), float(g[i]), sigma, tau, int(lengths[i])) for i in range(n)]
        assert got == list(zip(lo.tolist(), hi.tolist()))
    lo, hi = flexible_window(p[:50], g[:50], 1.0, 1.0, lengths[:50])
    assert (hi - lo <= 2).all()  # p - 2 and p + 2 are not in the window
    for d in (1, 4, 10):
        lo, hi = local_p_window(p, d, lengths)
        assert [local_p_bounds(float(p[i]), d, int(lengths[i])) for i in range(n)] == list(zip(lo.tolist(), hi.tolist()))


@pytest.mark.parametrize("kind,tau", [("flexible", 1.2), ("flexible", 0.3), ("local_p", math.inf)])
def test_one_hypothesis_step_equals_batched_step(kind, tau):
    """The lean one-hypothesis path (Python bounds, slices) gives what the batched path (gather,
    per-hypothesis windows) gives for that hypothesis, and scores only its window."""
    torch.manual_seed(0)
    att = AdditiveAttention(6, 5, 7, 3, kind=kind, threshold=tau, local_d=3).eval()
    if kind == "flexible":
        torch.nn.init.constant_(att.gate_out.bias, 1.0)
    B, S = 4, 25
    lengths = torch.tensor([25, 18, 9, 22])
    pad = torch.arange(S).unsqueeze(0) >= lengths.unsqueeze(1)  # (B, S) right padding
    vals = torch.randn(B, S, 5).masked_fill(pad.unsqueeze(-1), 0.0)
    keys = att.keys(vals)
    q, e = torch.randn(B, 6), torch.randn(B, 3)
    p = torch.tensor([3.2, 10.0, 8.0, 21.4])
    both = att(q, e, keys, vals, pad, lengths, p)
    seen = []
    orig = att.score
    att.score = lambda q_, k_: seen.append(k_.shape[-2]) or orig(q_, k_)
    for i in range(B):
        n = int(lengths[i])
        one = att(q[i : i + 1], e[i : i + 1], keys[i : i + 1, :n], vals[i : i + 1, :n], None, lengths[i : i + 1],
                  p[i : i + 1])
        torch.testing.assert_close(one.context, both.context[i : i + 1])
        torch.testing.assert_close(one.weights, both.weights[i : i + 1, :n])
        torch.testing.assert_close(one.focus, both.focus[i : i + 1])
        assert one.window.tolist() == both.window[i : i + 1].tolist() and seen[-1] == int(one.window[0])
    assert (both.window < lengths).any()


@pytest.mark.parametrize("kind,tau", [("local_p", math.inf), ("flexible", 0.8), ("flexible", 2.0)])
def test_training_masks_the_window_with_the_gathered_windows_results(kind, tau):
    """In training the windowed variants score every position and mask the window (no gather);
    context, weights, focus, window and every gradient equal those of the gathered window that
    inference scores, and weights stay exactly zero outside the window."""
    torch.manual_seed(0)
    att = AdditiveAttention(6, 5, 7, 3, kind=kind, threshold=tau, local_d=2)
    if kind == "flexible":
        torch.nn.init.constant_(att.gate_out.bias, 1.0)
    B, S = 4, 25
    lengths = torch.tensor([25, 18, 9, 22])
    pad = torch.arange(S).unsqueeze(0) >= lengths.unsqueeze(1)
    vals0 = torch.randn(B, S, 5).masked_fill(pad.unsqueeze(-1), 0.0)
    q0, e0, p = torch.randn(B, 6), torch.randn(B, 3), torch.tensor([3.2, 10.0, 8.0, 21.4])
    go = torch.randn(B, 5)
    results = {}
    for training in (True, False):
        att.train(training)
        att.zero_grad()
        vals, q, e = (x.clone().requires_grad_() for x in (vals0, q0, e0))
        seen = []
        orig = att.score
        att.score = lambda q_, k_: seen.append(k_.shape[:-1].numel()) or orig(q_, k_)
        step = att(q, e, att.keys(vals), vals, pad, lengths, p)
        del att.score
        loss = (step.context * go).sum() + (step.focus * torch.arange(1.0, B + 1)).sum()
        loss.backward()
        grads = [vals.grad, q.grad, e.grad] + [w.grad if w.grad is not None else torch.zeros_like(w)
                                                for w in att.parameters()]
        results[training] = (step, grads, sum(seen))
    (dense, g_dense, n_dense), (gathered, g_gathered, n_gathered) = results[True], results[False]
    assert n_dense == B * S and n_gathered == int(gathered.window.sum()) < B * S
    assert torch.equal(dense.window, gathered.window)
    for a, b in zip(dense[:4], gathered[:4]):
        if a is not None:
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    outside = dense.weights[gathered.weights == 0]
    assert float(outside.abs().max()) == 0.0
    for a, b in zip(g_dense, g_gathered):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_local_p_window_hand_example():
    """2D + 1 = 21 positions around floor(p_t) ("a window of 21 words", Flexible §4), clipped to the
    sentence: p_t = 12.3 -> [2, 22] (the |s - p_t| <= 10 integers would be only 20: [3, 22])."""
    lo, hi = local_p_window(torch.tensor([12.3, 12.3, 0.4, 29.0, 12.0]), 10, torch.tensor([30, 15, 30, 30, 30]))
    assert lo.tolist() == [2, 2, 0, 19, 2] and hi.tolist() == [22, 14, 10, 29, 22]
    assert [local_p_bounds(12.3, 10, 30), local_p_bounds(12.999, 10, 30)] == [(2, 22), (2, 22)]


def test_local_p_gaussian_hand_example():
    """sigmoid(0) = 0.5 -> p_t = (31 - 1) / 2 = 15; D = 4: window [11, 19], softmax over it,
    times exp(-(s - 15)^2 / (2 * 2^2))."""
    torch.manual_seed(0)
    att = AdditiveAttention(6, 5, 7, 3, kind="local_p", local_d=4)
    torch.nn.init.zeros_(att.pos_out.weight)
    S = 31
    q, e = torch.randn(2, 6), torch.randn(2, 3)
    vals = torch.randn(2, S, 5)
    keys = att.keys(vals)
    lengths = torch.tensor([S, S])
    step = att(q, e, keys, vals, torch.zeros(2, S, dtype=torch.bool), lengths, torch.zeros(2))
    full = att.score(att.q_proj(q).unsqueeze(1), keys)  # (2, S)
    s = torch.arange(S).float()
    ref = torch.zeros(2, S)
    ref[:, 11:20] = torch.softmax(full[:, 11:20], -1) * torch.exp(-(s[11:20] - 15.0) ** 2 / 8.0)
    torch.testing.assert_close(step.weights, ref)
    torch.testing.assert_close(step.context, torch.einsum("bs,bsc->bc", ref, vals))
    assert step.window.tolist() == [9, 9] and torch.allclose(step.focus, torch.tensor([15.0, 15.0]))


# -- limit cases ------------------------------------------------------------------------------
def test_tau_inf_equals_huge_finite_tau():
    """The gathered (windowed) path with a window covering everything equals the unthresholded one."""
    m_inf, task = build("flexible")
    m_big, _ = build("flexible", flexible_threshold=1e9)
    m_big.load_state_dict(m_inf.state_dict())
    assert not m_inf.decoder.attention.windowed and m_big.decoder.attention.windowed
    src, lens, prev = long_batch(task)
    a, xa = m_inf.eval()(src, lens, prev)
    b, xb = m_big.eval()(src, lens, prev)
    torch.testing.assert_close(a, b)
    torch.testing.assert_close(xa["attn"][0], xb["attn"][0])
    assert torch.equal(xa["window"], xb["window"])


def test_gate_zero_equals_global_attention():
    glob, task = build("global")
    flex, _ = build("flexible")
    missing, unexpected = flex.load_state_dict(glob.state_dict(), strict=False)
    assert not unexpected and all("attention.gate" in k for k in missing)
    torch.nn.init.zeros_(flex.decoder.attention.gate_out.weight)
    torch.nn.init.constant_(flex.decoder.attention.gate_out.bias, -1e4)  # g(t) = 0 exactly
    src, lens, prev = long_batch(task)
    a, _ = glob.eval()(src, lens, prev)
    b, xb = flex.eval()(src, lens, prev)
    assert float(xb["gate"].abs().max()) == 0.0
    torch.testing.assert_close(a, b)
    # and the penalty does change the output when g > 0
    torch.nn.init.constant_(flex.decoder.attention.gate_out.bias, 3.0)
    c, _ = flex(src, lens, prev)
    assert not torch.allclose(a, c, atol=1e-4)


def test_unknown_attention_kind_lists_choices():
    with pytest.raises(ValueError, match="global, local_p, flexible"):
        build("bahdanau")
    with pytest.raises(ValueError, match="flexible-threshold"):
        build("flexible", flexible_threshold=0.0)
    # an explicit 0 is refused, not silently replaced by the default
    with pytest.raises(ValueError, match="flexible-sigma"):
        build("flexible", flexible_sigma=0.0)
    with pytest.raises(ValueError, match="local-window-d"):
        build("local_p", local_window_d=0)


# -- decoding ---------------------------------------------------------------------------------
def _sharpen(model):
    for p in model.parameters():
        p.data.mul_(3.0)
    return model.eval()


@pytest.mark.parametrize("kind,tau", [("global", math.inf), ("local_p", math.inf),
                                      ("flexible", math.inf), ("flexible", 0.5)])
def test_incremental_equals_full_decoding(kind, tau):
    model, task = build(kind, flexible_threshold=tau)
    _sharpen(model)
    src, lens, prev = long_batch(task, bsz=4)
    full, xf = model(src, lens, prev)
    enc = model.encoder(src, lens)
    state = {}
    steps = [model.decoder(prev[:, : t + 1], enc, incremental_state=state) for t in range(prev.size(1))]
    inc = torch.cat([o for o, _ in steps], 1)
    torch.testing.assert_close(full, inc, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(xf["window"], torch.cat([x["window"] for _, x in steps], 1))
    if kind == "flexible" and tau < 10:  # the windows really are narrower than the sentence
        assert (xf["window"] < enc["src_lengths"][0].unsqueeze(1)).any()



def _generate(model, task, src, lens, beam):
    gen = SequenceGenerator([model], task.target_dictionary, beam_size=beam, max_len_b=10)
    return gen.forward({"net_input": {"src_tokens": src, "src_lengths": lens}})


def test_global_window_per_sentence_is_the_mean_source_length():
    """§5.2: "for the conventional attention mechanism ... the average window size equals to the
    average sentence length of the testing data" -- the per-sentence average does, over two
    batches (sentences of 12-14 positions, EOS included), while the pooled one weighs each
    sentence by its hypothesis-steps and differs."""
    model, task = build("global", seed=1)
    _sharpen(model)
    with torch.no_grad():  # some sentences end after 3 steps, others run to max_len_b: steps differ
        model.decoder.output_projection.bias[task.target_dictionary.eos()] += 3.3
    att = model.decoder.attention
    att.reset_window_stats()
    lengths, steps = [], set()
    for seed in (3, 4):
        src, lens, _ = long_batch(task, bsz=5, seed=seed)
        steps |= {len(h[0]["tokens"]) for h in _generate(model, task, src, lens, beam=3)}
        lengths += lens.tolist()
    assert att.sentence_average_window() == pytest.approx(sum(lengths) / len(lengths), abs=1e-12)
    assert len(set(lengths)) == 3 and len(steps) > 1 and int(att.stats.sentences) == 10
    assert float(att.stats.sentence_source) / 10 == pytest.approx(sum(lengths) / len(lengths))
    assert att.average_window() != pytest.approx(att.sentence_average_window(), abs=1e-3)
    line = att.stats.report()
    assert line.startswith("[rnnsearch] global attention (tau=n/a): ")  # no threshold in global attention
    assert parse_window_report(line)["tau"] == "n/a"
    assert f"average window {sum(lengths) / len(lengths):.2f} positions per sentence over 10 sentences" in line
    assert f"pooled {att.average_window():.2f} positions per hypothesis-step" in line


@pytest.mark.parametrize("kind,tau,beam", [("flexible", 0.8, 3), ("local_p", math.inf, 2), ("flexible", 0.8, 1)])
def test_window_per_sentence_is_the_mean_over_steps_of_the_mean_over_hypotheses(kind, tau, beam):
    """Each sentence decoded alone, its windows captured step by step: the mean over steps of
    the step's mean over the live hypotheses; the batched decode's per-sentence average is the
    mean of those (beam 1 with one sentence takes the one-hypothesis path, add_one)."""
    model, task = build(kind, seed=2, flexible_threshold=tau)
    _sharpen(model)
    att = model.decoder.attention
    src, lens, _ = long_batch(task, bsz=4, seed=5)
    att.reset_window_stats()
    batched = _generate(model, task, src, lens, beam)
    got = att.sentence_average_window()
    assert int(att.stats.sentences) == 4
    steps, forward = [], att.forward

    def capture(*args, **kwargs):
        out = forward(*args, **kwargs)
        steps.append(out.window.double().mean().item())  # every row is the one sentence's
        return out

    means = []
    for i in range(4):
        keep = lens[i]
        one_src = src[i : i + 1, src.size(1) - keep:]  # without its left padding
        steps.clear()
        att.forward = capture
        try:
            alone = _generate(model, task, one_src, lens[i : i + 1], beam)
        finally:
            att.forward = forward
        assert [h["tokens"].tolist() for h in alone[0]] == [h["tokens"].tolist() for h in batched[i]]
        means.append(sum(steps) / len(steps))
    assert got == pytest.approx(sum(means) / 4, rel=1e-12)
    if kind == "flexible":
        assert got < float(att.stats.sentence_source) / 4  # windowed: narrower than the sentences

@pytest.mark.parametrize("kind,tau", [("global", math.inf), ("local_p", math.inf), ("flexible", 0.8)])
def test_beam_search_scores_equal_teacher_forcing(kind, tau):
    """Beam search (incremental state reordered every step, per-hypothesis windows) scores each
    hypothesis as a teacher-forced forward pass does, and counts its windows."""
    model, task = build(kind, seed=1, flexible_threshold=tau)
    _sharpen(model)
    src, lens, _ = long_batch(task, bsz=4, seed=3)
    gen = SequenceGenerator([model], task.target_dictionary, beam_size=3, max_len_b=10)
    hyps = gen.forward({"net_input": {"src_tokens": src, "src_lengths": lens}})
    att = model.decoder.attention
    assert att.window_queries > 0 and 1 <= att.average_window() <= src.size(1)
    eos = task.target_dictionary.eos()
    for i, beams in enumerate(hyps):
        assert len(beams) == 3
        for h in beams:
            toks = h["tokens"]
            prev = torch.cat([toks.new_tensor([eos]), toks[:-1]]).unsqueeze(0)
            logits, _ = model(src[i : i + 1], lens[i : i + 1], prev)
            lp = torch.log_softmax(logits.float(), -1)[0].gather(-1, toks.unsqueeze(-1)).squeeze(-1)
            torch.testing.assert_close(lp, h["positional_scores"], rtol=1e-4, atol=1e-4)


def test_windowed_scoring_evaluates_only_the_window():
    """The score function sees exactly sum(window) positions -- far fewer than B x S per step --
    and each window is the closed-form one for the (g, p_{t-1}) of that step."""
    model, task = build("flexible", flexible_threshold=0.5)
    att = model.decoder.attention
    torch.nn.init.constant_(att.gate_out.bias, 4.0)  # g ~ 1: narrow windows
    model.eval()
    seen, focus = [], []
    orig_score, orig_forward = att.score, att.forward

    def counting_score(q, k):
        out = orig_score(q, k)
        seen.append(out.numel())
        return out

    def recording_forward(*a, **kw):
        focus.append(a[6].clone())  # p_{t-1}
        return orig_forward(*a, **kw)

    att.score, att.forward = counting_score, recording_forward
    src, lens, prev = long_batch(task, bsz=3, src_len=20)
    _, extra = model(src, lens, prev)
    lengths = model.encoder(src, lens)["src_lengths"][0]
    assert sum(seen) == int(extra["window"].sum())
    assert sum(seen) < 0.5 * int(lengths.sum()) * prev.size(1)
    for t in range(prev.size(1)):
        lo, hi = flexible_window(focus[t], extra["gate"][:, t], att.sigma, 0.5, lengths)
        assert torch.equal(extra["window"][:, t], hi - lo + 1)
        w = extra["attn"][0][:, t]  # zero outside [lo, hi], a distribution inside
        s = torch.arange(w.size(1)) - (w.size(1) - lengths).unsqueeze(1)  # word index of each src_tokens column
        outside = (s < lo.unsqueeze(1)) | (s > hi.unsqueeze(1))
        assert float(w[outside].abs().max()) == 0.0
        torch.testing.assert_close(w.sum(-1), torch.ones(3))


@pytest.mark.parametrize("kind,tau", [("global", math.inf), ("flexible", 0.8)])
def test_attention_is_indexed_like_left_padded_src_tokens(kind, tau):
    """``attn`` columns are the columns of fairseq's left-padded ``src_tokens`` (what
    --print-alignment / --replace-unk index): a padded sentence's attention equals the sentence's
    own, shifted by its padding, zero on the padding, and the hard alignments agree."""
    model, task = build(kind, flexible_threshold=tau)
    _sharpen(model)
    d = task.source_dictionary
    src, lens, prev = long_batch(task, bsz=3, src_len=12)
    assert src.eq(d.pad()).any()
    _, extra = model(src, lens, prev)
    enc = model.encoder(src, lens)
    state = {}
    inc = torch.cat([model.decoder(prev[:, : t + 1], enc, incremental_state=state)[1]["attn"][0]
                     for t in range(prev.size(1))], 1)
    torch.testing.assert_close(inc, extra["attn"][0])
    for i in range(src.size(0)):
        shift = int(src[i].eq(d.pad()).sum())
        alone = src[i : i + 1, shift:]
        _, x1 = model(alone, lens[i : i + 1], prev[i : i + 1])
        a, a1 = extra["attn"][0][i], x1["attn"][0][0]  # (T, S), (T, len)
        torch.testing.assert_close(a[:, shift:], a1)
        assert float(a[:, :shift].abs().sum()) == 0.0
        tgt = prev[i]
        hard = utils.extract_hard_alignment(a, src[i], tgt, d.pad(), d.eos())
        assert hard == utils.extract_hard_alignment(a1, alone[0], tgt, d.pad(), d.eos()) and hard


# -- fine-tuning loss (eq. 9) -----------------------------------------------------------------
@pytest.mark.parametrize("sentence_avg", [False, True])
def test_finetune_term_through_criterion(sentence_avg):
    """loss(β) - loss(0) = -β sum_i mean_t g_i(t): the paper's β against the summed NLL."""
    model, task = build("flexible", sentence_avg=sentence_avg)
    model.eval()
    src, lens, prev = long_batch(task, bsz=3)
    pad = task.target_dictionary.pad()
    prev[0, -2:] = pad  # one shorter target
    target = torch.cat([prev[:, 1:], prev.new_full((3, 1), task.target_dictionary.eos())], 1)
    target[0, -3:] = pad
    prev[0, -3:] = pad
    sample = {"net_input": {"src_tokens": src, "src_lengths": lens, "prev_output_tokens": prev},
              "target": target, "ntokens": int(target.ne(pad).sum()), "nsentences": 3}
    _, extra = model(src, lens, prev)
    live = prev.ne(pad).float()
    expected = -((extra["gate"] * live).sum(1) / live.sum(1)).sum()
    losses = {}
    for beta in (0.0, 0.1):
        crit = LabelSmoothedCrossEntropyWithRegCriterion(task, sentence_avg, 0.1, reg_weight=beta)
        loss, sample_size, log = crit(model, sample)
        losses[beta] = loss
        assert sample_size == (3 if sentence_avg else sample["ntokens"])
        assert "aux_flexible_gate_loss" in log and "aux_flexible_gate" in log
        torch.testing.assert_close(torch.tensor(log["aux_flexible_gate"] / sample_size),
                                   (extra["gate"] * live).sum() / live.sum())
    torch.testing.assert_close(losses[0.1] - losses[0.0], 0.1 * expected)
    # the gradient pushes g(t) up: the β term is -β sum_i mean_t g_i(t) with g = sigmoid(... + b_g)
    # (additive.py), so d(loss(β) - loss(0))/d b_g = -β sum_i mean_t g(1 - g) (+ the small indirect
    # effect of g(t) on later steps through the window) < 0, and a descent step raises b_g, i.e. g
    bias = model.decoder.attention.gate_out.bias
    (grad,) = torch.autograd.grad(losses[0.1] - losses[0.0], bias)
    assert float(grad) < 0
    g = extra["gate"].detach()
    direct = -0.1 * ((g * (1 - g) * live).sum(1) / live.sum(1)).sum()
    torch.testing.assert_close(grad[0], direct, rtol=0.05, atol=0)  # dominated by the direct term


# -- end to end on real data ------------------------------------------------------------------
from helpers import MULTI30K_RAW as RAW, ROOT, VENV_BIN as BIN, run_cli as sh  # noqa: E402


@pytest.mark.skipif(not os.path.isdir(RAW), reason=f"real data not found at {RAW}")
def test_end_to_end_train_generate_finetune(tmp_path):
    data = tmp_path / "m30k"
    sh(["bash", "data-prep/multi30k/prepare.sh", "--raw-dir", RAW, "--out", str(data),
        "--train-lines", "2000", "--bpe-merges", "500"])
    common = [str(data / "bin"), "--user-dir", "fairseq_plugins", "--source-lang", "en", "--target-lang", "de",
              "--cpu", "--num-workers", "0", "--log-format", "simple"]
    train = [os.path.join(BIN, "fairseq-train"), *common, "--arch", "rnnsearch_small", "--rnn-attention",
             "flexible", "--encoder-embed-dim", "64", "--encoder-hidden-size", "64", "--decoder-embed-dim", "64",
             "--decoder-hidden-size", "64", "--attention-dim", "64", "--decoder-out-embed-dim", "64",
             "--optimizer", "adam", "--lr", "0.003", "--clip-norm", "3", "--max-tokens", "3000",
             "--no-epoch-checkpoints", "--log-interval", "10", "--seed", "1"]
    ck = tmp_path / "ck"
    log = sh(train + ["--criterion", "label_smoothed_cross_entropy", "--label-smoothing", "0.1",
                      "--max-update", "60", "--save-dir", str(ck)])
    valid = [float(l.split("| loss ")[1].split()[0]) for l in log.splitlines() if "| valid |" in l]
    assert valid and all(math.isfinite(v) for v in valid)
    # fine-tune with eq. 9 (β = 0.1) from the trained model
    ft = tmp_path / "ft"
    log = sh(train + ["--criterion", "label_smoothed_cross_entropy_with_reg", "--reg-weight", "0.1",
                      "--max-update", "10", "--save-dir", str(ft),
                      "--finetune-from-model", str(ck / "checkpoint_last.pt")])
    assert "flexible_gate_loss" in log and re.search(r"flexible_gate[ =]0\.\d", log)
    # source reliance (scripts/source_reliance.py): NLL with true vs shuffled sources on valid
    rel = tmp_path / "reliance.json"
    sh([sys.executable, "scripts/source_reliance.py", "--checkpoint", str(ck / "checkpoint_last.pt"),
        "--data-bin", str(data / "bin"), "--src", "en", "--tgt", "de", "--json", str(rel)])
    r = json.loads(rel.read_text())
    n_valid_sents = sum(1 for _ in open(data / "raw" / "valid.de"))
    assert r["n_sentences"] + r["skipped_sentences"] == n_valid_sents and r["skipped_sentences"] <= 1
    assert math.isfinite(r["nll_true"][0]) and r["delta_nll"][0] == pytest.approx(r["nll_shuffled"][0] - r["nll_true"][0])
    # decode with a threshold: only a window is scored, and its average size is reported
    n_valid = sum(1 for _ in open(data / "raw" / "valid.de"))
    reports = {}
    for tau in ("1.2", "inf"):
        out = sh([sys.executable, "-m", "fairseq_cli.generate", *common, "--path", str(ft / "checkpoint_last.pt"),
                  "--gen-subset", "valid", "--beam", "3", "--batch-size", "200", "--required-batch-size-multiple",
                  "1", "--remove-bpe", "--model-overrides", "{'flexible_threshold': '%s'}" % tau])
        assert sum(1 for l in out.splitlines() if l.startswith("H-")) == n_valid
        rep = parse_window_report(out)
        assert rep and rep["kind"] == "flexible" and rep["tau"] == tau, out[-2000:]
        assert rep["sentences"] == n_valid  # every sentence counted once, whatever its batch
        reports[tau] = (rep["window"], rep["source_length"], rep["pooled_window"], rep["pooled_source_length"])
    win, src_len, pooled, pooled_src = reports["1.2"]
    assert 1.0 <= win < src_len and 1.0 <= pooled < pooled_src  # windowed
    win_all, src_len_all, pooled_all, pooled_src_all = reports["inf"]
    assert win_all == pytest.approx(src_len_all) and pooled_all == pytest.approx(pooled_src_all)  # every position
    # the mean length of the valid sources in positions (BPE pieces + EOS): what tau = inf's window is
    mean_len = statistics.mean(len(l.split()) + 1 for l in open(data / "bpe" / "valid.en"))
    assert src_len_all == pytest.approx(mean_len, abs=0.006)
    # the decode-time benchmark (Table 3) on the same checkpoint, two input lengths in one run
    md = tmp_path / "bench" / "table3.md"
    out = sh([sys.executable, "scripts/bench_flexible_decode.py", "--flexible", str(ft / "checkpoint_last.pt"),
              "--data-bin", str(data / "bin"), "--src", "en", "--tgt", "de", "--subset", "valid",
              "--concat", "2,4", "--min-len", "20", "--n", "2", "--rounds", "1", "--out", str(md)])
    rows = [l for l in md.read_text().splitlines() if re.match(r"\| [24] \| ", l)]
    assert len(rows) == 2, md.read_text()
    src_pos = [float(r.split("|")[2]) for r in rows]
    assert src_pos[0] >= 20 and src_pos[1] > src_pos[0]  # 4 joined sentences are longer than 2
    for r, n in zip(rows, src_pos):  # windows: tau = inf scores every position, tau = 1.2 at most that
        inf_win, flex_win = (float(c.split("(")[1].rstrip(") ")) for c in r.split("|")[4:6])
        assert inf_win == pytest.approx(n, rel=0.05) and 1.0 <= flex_win <= inf_win
    assert "speed-up flex_inf/flexible" in out
    text = md.read_text()  # the page says what its models are and whether their evidence is committed
    assert "**Regime: unstated**" in text and "### Model flex: `" in text and "- checkpoint sha256: `" in text
    assert "**Evidence: none committed.**" in text  # a checkpoint outside any table run
    assert re.search(r"load average \(1/5/15 min\) [\d.]+ [\d.]+ [\d.]+ at the start, [\d.]+ [\d.]+ [\d.]+ at the end "
                     r"\(\d+ cores", text), text  # timed beside other jobs, the page says so


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")
def test_bench_flexible_decode_gpu_refused_without_cuda(tmp_path):
    """``--device cuda`` (the paper's GPU remark, Table 3) without a CUDA device: a clear error
    naming the other choice before any model is loaded, and no output file; an unknown device is
    refused by argparse with the valid choices."""
    from mt_pipeline import bench_flexible_decode as bfd

    ck = tmp_path / "flex.pt"
    ck.write_bytes(b"not loaded")  # the device is checked before the checkpoint is read
    out = tmp_path / "t3_gpu.md"
    args = ["--flexible", str(ck), "--data-bin", str(tmp_path), "--src", "en", "--tgt", "de", "--out", str(out)]
    with pytest.raises(SystemExit) as e:
        bfd.main(args + ["--device", "cuda"])
    assert "--device cuda" in str(e.value) and "--device cpu" in str(e.value)
    assert not out.exists()
    res = subprocess.run([sys.executable, "-m", "mt_pipeline.bench_flexible_decode", *args, "--device", "tpu"],
                         capture_output=True, text=True, cwd=ROOT)
    assert res.returncode == 2 and "'cpu', 'cuda'" in res.stderr, res.stderr
    assert not out.exists()


def test_bench_flexible_decode_takes_the_tau_table1_selected(tmp_path, capsys):
    """``--tau-from sweep.json``: the threshold the selection rule chose (Table 3 is timed at Table
    1's tau, issue 27); a sweep where no tau met the rule, an unreadable file or both options are
    refused before any model is loaded, with no output file."""
    import argparse
    import json

    from mt_pipeline import bench_flexible_decode as bfd

    p = argparse.ArgumentParser()
    sw = tmp_path / "sweep.json"
    sw.write_text(json.dumps({"selected_tau": 1.6, "select_from": [0.8, 1.6]}))
    tau, where = bfd.selected_tau(p, None, str(sw))
    assert tau == 1.6 and "selected by Table 1's rule" in where and "sweep.json" in where
    assert bfd.selected_tau(p, None, None) == (1.2, "default") and bfd.selected_tau(p, 0.9, None) == (0.9, "--tau")
    ck = tmp_path / "flex.pt"
    ck.write_bytes(b"not loaded")
    out = tmp_path / "t3.md"
    args = ["--flexible", str(ck), "--data-bin", str(tmp_path), "--src", "en", "--tgt", "de", "--out", str(out)]
    sw.write_text(json.dumps({"selected_tau": None}))
    for extra, msg in ((["--tau-from", str(sw)], "no tau met the selection rule in that sweep; pass --tau"),
                       (["--tau-from", str(tmp_path / "nope.json")], "cannot read a sweep.json"),
                       (["--tau", "1.0", "--tau-from", str(sw)], "not allowed with argument")):
        with pytest.raises(SystemExit):
            bfd.main(args + extra)
        assert msg in capsys.readouterr().err
        assert not out.exists()


@pytest.mark.skipif(not os.path.isdir(RAW), reason=f"real data not found at {RAW}")
def test_char_level_prep_round_trips(tmp_path):
    """prepare.sh --char (the long character-level inputs of Table 3): one symbol per character,
    word ends marked as BPE marks them, so removing "@@ " gives the tokenised text back."""
    out = tmp_path / "m30k_char"
    log = sh(["bash", "data-prep/multi30k/prepare.sh", "--raw-dir", RAW, "--out", str(out), "--train-lines", "300",
              "--char"])
    assert "segmentation=char" in (out / "bin" / ".done").read_text() and not (out / "bpe").exists()
    for split in ("train", "test"):
        for lang in ("en", "de"):
            tok = (out / "tok" / f"{split}.{lang}").read_text().splitlines()
            char = (out / "char" / f"{split}.{lang}").read_text().splitlines()
            assert [l.replace("@@ ", "") for l in char] == tok
            assert all(len(sym.replace("@@", "")) == 1 for l in char[:50] for sym in l.split())
    n_dict = sum(1 for _ in open(out / "bin" / "dict.de.txt"))
    assert 50 < n_dict < 400, n_dict  # characters (+ their "@@" forms), not words
    assert "char: up to date" in sh(["bash", "data-prep/multi30k/prepare.sh", "--raw-dir", RAW, "--out", str(out),
                                     "--train-lines", "300", "--char"]) and log


def test_tradeoff_figure_is_rerendered_from_the_rendered_table(tmp_path):
    """mt-flexible-sweep replot reads the sweep tables of a Table 1 file: tau = inf stays inf,
    a finite tau equal to it (999) is drawn once, as inf."""
    import math

    from mt_pipeline import sweeps

    table = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "results", "flexible",
                         "table1_multi30k.md")
    tables = sweeps.read_sweep_tables(table)
    assert [d for d, _, _ in tables][::len(tables) // 2] == ["en-de", "de-en"]
    points = next(p for d, m, p in tables if d == "de-en" and m == "flexible")
    assert math.inf in points and 999.0 in points
    # the parsed values are the page's cells (read here with plain string splits, not the parser)
    with open(table, encoding="utf-8") as f:
        section = f.read().split("## de-en")[1].split("| tau | valid window")[1].splitlines()[2:]
    for tau in (0.3, 1.2):
        cells = [c.strip() for c in next(l for l in section if l.startswith(f"| {tau:g} |")).strip("|").split("|")]
        assert points[tau]["valid"]["window"] == float(cells[1])
        assert points[tau]["test"]["tok_bleu"] == float(cells[4].split("(")[1].rstrip(")"))
    sweeps.main(["replot", "--table", table, "--figure", str(tmp_path / "f.png")])
    assert os.path.getsize(tmp_path / "f.png") > 10_000
    with pytest.raises(SystemExit):
        sweeps.main(["replot", "--table", table, "--direction", "xx-yy", "--figure", str(tmp_path / "g.png")])


def _fake_flexible_table(tmp_path, monkeypatch, export_training=True):
    """Four finished ``rnnsearch`` runs of one direction (rows 1-4 of Flexible Table 1) whose decodes
    are made by a stand-in for ``scripts/evaluate.sh``: the hypotheses are the references with the
    last word of every ``k``-th line dropped (``k`` grows with tau), scored by the real
    :func:`mt_pipeline.scoring.score_files`, so re-scoring the committed evidence is a real check."""
    import json as _json
    import types

    from mt_pipeline import evaluate, evidence, scoring, sweeps

    monkeypatch.setenv("MT_EVIDENCE_ROOT", str(tmp_path / "evidence"))
    ref = tmp_path / "ref.en"
    ref.write_text("".join(f"a man rides a bike number {i} down the road\n" for i in range(40)))

    def write_decode(out, subset, tau, ckpt):
        k = 2 if tau in ("0.3", "0.5", "0.8", "1") else 20 if tau == "1.2" else 40  # 1.2: within 0.5 of inf
        os.makedirs(out, exist_ok=True)
        lines = ref.read_text().splitlines()
        hyp = os.path.join(out, f"{subset}.hyp.detok")
        with open(hyp, "w") as f:
            f.write("".join((" ".join(l.split()[:-1]) if i % k == 0 else l) + "\n" for i, l in enumerate(lines)))
        res = scoring.score_files(hyp, str(ref), hyp, str(ref))
        res.update(subset=subset, checkpoint=ckpt, checkpoint_sha256="c" * 64)
        window = {2: 3.0, 20: 5.0}.get(k, 16.0)
        log = os.path.join(out, f"{subset}.generate.log")
        with open(log, "w") as f:  # the plugin's report line, kept in S.json as mt-evaluate keeps it
            f.write(f"[rnnsearch] flexible attention (tau={tau}): average window {window} positions per sentence "
                    "over 40 sentences (per step over hypotheses, per sentence over steps; average source length "
                    f"12.00); pooled {window + 0.5} positions per hypothesis-step over 100 hypothesis-steps "
                    "(average source length 12.50)\n")
        res["window"] = evaluate.window_report(log)
        with open(os.path.join(out, f"{subset}.json"), "w") as f:
            _json.dump(res, f)
        return res

    def fake_run(cmd, check, cwd, env):
        arg = lambda f: cmd[cmd.index(f) + 1]  # noqa: E731
        tau = re.search(r"'flexible_threshold':'([^']+)'", arg("--extra")).group(1)
        for s in arg("--subsets").split(","):
            write_decode(arg("--out"), s, tau, arg("--checkpoint"))

    monkeypatch.setattr(sweeps, "subprocess", types.SimpleNamespace(run=fake_run))  # sweeps' own calls only
    monkeypatch.setattr(sweeps, "decode_checkpoint", lambda budget, run_dir: (os.path.join(run_dir, "average_last3.pt"),))
    rdir = tmp_path / "runs" / "flexible_table1_de_en"
    for i in (1, 2, 3, 4):
        row = rdir / f"row{i}"
        (row / "eval").mkdir(parents=True)
        (row / "average_last3.pt").write_bytes(b"ckpt")
        own = write_decode(str(row / "eval"), "test", "inf", str(row / "average_last3.pt"))
        with open(row / "result.json", "w") as f:
            _json.dump({"status": "done", "regime": "smoke", "seed": 1, "direction": "de-en", "git_commit": "abc",
                        "config": {"budget": {"generate": {"beam": 4, "lenpen": 1, "batch-size": 8}}},
                        "data": {"prep_dir": "data-bin/x"}, "scores": {"test": own}}, f)
        if export_training:
            evidence.export(str(row), "smoke")
    return rdir


def test_table1_commits_every_decode_and_names_each_rows_evidence(tmp_path, monkeypatch):
    """Flexible Table 1 (issue 27): the tau decodes of the flexible and fine-tuned rows are committed
    as evidence beside the runs' own (``decodes/tau_X/``), every model row has a page-wide ID and a
    ``### Row`` section naming evidence whose recorded BLEU is the cell -- the results audit's
    check, run here on the rendered page -- and every committed decode re-scores."""
    import importlib.util

    from mt_pipeline import evidence, sweeps

    rdir = _fake_flexible_table(tmp_path, monkeypatch)
    out = tmp_path / "table1.md"
    sweeps.table1([str(rdir)], "tok_bleu", 0.5, str(out))
    md = out.read_text()
    spec = importlib.util.spec_from_file_location("audit", os.path.join(os.path.dirname(__file__), "test_results_audit.py"))
    audit = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(audit)
    cells, ev = audit._score_cells(md), audit._evidence_by_row(md)
    assert [r for r, _ in cells] == ["de-en/1", "de-en/2", "de-en/3", "de-en/3-tau", "de-en/4-tau"]
    assert "**Regime: smoke**" in md and evidence.NO_EVIDENCE not in md
    windows = dict(audit._window_cells(md))
    assert sorted(windows) == sorted(r for r, _ in cells)
    for row, cell in cells:
        (d,), = [ev[row]]
        res = json.load(open(os.path.join(d, "result.json")))  # absolute: the evidence root is in tmp_path
        score = res["scores"][next(iter(res["scores"]))]
        assert f"{score['bleu']:.2f}" == cell.split()[0], (row, cell)
        assert f"{score['window']['window']:.2f}" == windows[row], (row, windows[row])  # the audit's window check
    assert windows["de-en/1"] == "16.00" and windows["de-en/3-tau"] == "5.00"  # per-sentence, not pooled (+0.5)
    assert "Test sources: 12.00 positions a sentence on average" in md
    assert "/row3/decodes/tau_1.2" in ev["de-en/3-tau"][0] and "/row4/decodes/tau_1.2" in ev["de-en/4-tau"][0]
    committed = evidence.committed_results()
    decodes = [p for p in committed if "/decodes/" in p]
    # rows 3 and 4 each swept: 10 paper taus + inf (row 4's is Figure 3, §5.3; its tau row reads it)
    assert sorted(p.split("/decodes/")[0][-4:] for p in decodes) == ["row3"] * 11 + ["row4"] * 11
    for p in committed:
        rows = evidence.rescore(p)
        assert rows and all(abs(r["bleu"] - r["recorded_bleu"]) < 0.005 for r in rows)
    rec = json.load(open([p for p in decodes if "row4/decodes/tau_1.2/" in p][0]))
    assert rec["kind"] == "decode" and rec["settings"] == {"flexible_threshold": "1.2"}
    assert "'flexible_threshold':'1.2'" in rec["command"] and rec["decoded_checkpoint_sha256"] == "c" * 64
    # replot reads the page: the flexible row's sweep (tau selection) and the fine-tuned row's (Figure 3)
    assert [(d, m) for d, m, _ in sweeps.read_sweep_tables(str(out))] == [("de-en", "flexible"), ("de-en", "fine-tuned")]
    assert "### BLEU vs window over tau, fine-tuned row (Figure 3" in md
    assert "### BLEU vs window over tau, flexible row, where tau is selected\n" in md
    assert "Selected tau: 1.2\n" in md


def test_table1_without_the_training_evidence_says_so_and_names_none(tmp_path, monkeypatch):
    from mt_pipeline import evidence, sweeps

    rdir = _fake_flexible_table(tmp_path, monkeypatch, export_training=False)
    out = tmp_path / "table1.md"
    sweeps.table1([str(rdir)], "tok_bleu", 0.5, str(out))
    md = out.read_text()
    assert evidence.NO_EVIDENCE in md and "Rows de-en/1, de-en/2 have no committed evidence" in md  # 3: the sweep committed it
    assert "mt-campaign run --plan configs/campaign/smoke.yaml" in md
    assert "- committed evidence" not in md


def test_no_candidate_within_the_rule_decodes_at_the_one_losing_least(tmp_path, monkeypatch, capsys):
    """§5.2's rule finds no tau of 0.8-1.6 within 0.5 validation BLEU of tau = inf: Table 1 and Table
    3's benchmark use the candidate losing least (the largest validation BLEU; the smaller tau on a
    tie), and the page and sweep.md say so -- no constant stands in."""
    import argparse

    from mt_pipeline import bench_flexible_decode as bfd
    from mt_pipeline import sweeps

    pts = {t: {"valid": {"tok_bleu": b}} for t, b in ((0.8, 10.0), (1.0, 12.0), (1.2, 12.5), (1.4, 12.5), (1.6, 12.1),
                                                      (5.0, 14.0), (math.inf, 14.0))}
    assert sweeps.select_tau(pts, "tok_bleu", 0.5) is None
    assert sweeps.least_loss_tau(pts, "tok_bleu") == 1.2  # 5.0 loses nothing but is not a candidate
    pts[1.6]["valid"]["tok_bleu"] = 13.6
    assert sweeps.select_tau(pts, "tok_bleu", 0.5) == 1.6 and sweeps.least_loss_tau(pts, "tok_bleu") == 1.6
    # through the table, the rule made to find none: the fake decodes of 1.4 and 1.6 equal inf's, so
    # the candidate losing least is 1.4 (the smaller of the tie), which the page and Table 3 then use
    rdir = _fake_flexible_table(tmp_path, monkeypatch)
    monkeypatch.setattr(sweeps, "select_tau", lambda *a, **k: None)
    out = tmp_path / "table1.md"
    sweeps.table1([str(rdir)], "tok_bleu", 0.5, str(out))
    md = out.read_text()
    sw = json.loads((rdir / "row3" / "sweep" / "sweep.json").read_text())
    assert sw["selected_tau"] is None and sw["least_loss_tau"] == 1.4
    assert "Selected tau: 1.4 (no candidate of [0.8, 1.0, 1.2, 1.4, 1.6] met the rule" in md
    assert "tau = 1.4, the candidate losing least (0.00), used" in md and "de-en/4-tau | + fine-tuning (tau=1.4)" in md
    assert "(no candidate of" in (rdir / "row3" / "sweep" / "sweep.md").read_text()
    p = argparse.ArgumentParser()
    tau, where = bfd.selected_tau(p, None, str(rdir / "row3" / "sweep" / "sweep.json"))
    assert tau == 1.4 and "the candidate losing least" in where


def test_replot_draws_the_fine_tuned_rows_sweep(tmp_path, monkeypatch):
    """Figure 3 (§5.3) is the fine-tuned model's sweep: replot takes it over the flexible row's."""
    from mt_pipeline import sweeps

    rdir = _fake_flexible_table(tmp_path, monkeypatch)
    out = tmp_path / "table1.md"
    sweeps.table1([str(rdir)], "tok_bleu", 0.5, str(out))
    drawn = []
    monkeypatch.setattr(sweeps, "plot", lambda points, path, title: drawn.append((points, title)))
    sweeps.main(["replot", "--table", str(out), "--figure", str(tmp_path / "f.png")])
    tables = sweeps.read_sweep_tables(str(out))
    (points, title), = drawn
    # (the fake decodes do not depend on the checkpoint, so the two tables hold equal numbers: the title tells)
    assert title.startswith("Fine-tuned flexible attention, de-en") and tables[1][1] == "fine-tuned"
    assert points == tables[1][2]


def test_flexible_step_equals_equations_3_to_8_by_hand():
    """One flexible step (tau = inf) against eqs. 3-8 written out from the parameters in float64 --
    not through the module's own score / gate / penalty: e = v_a^T tanh(W_q h_{t-1} + W_k h̄_s + b),
    g(t) = sigmoid(v_g^T tanh(W_g [h_{t-1}; i_t]) + b_g), a_t = softmax(e - g (s - p_{t-1})^2 / (2 sigma^2)),
    p_t = sum_s a_t(s) s, c_t = sum_s a_t(s) h̄_s; padded positions get weight 0."""
    torch.manual_seed(3)
    att = AdditiveAttention(6, 5, 7, 3, kind="flexible", sigma=1.5).double()
    with torch.no_grad():
        for p in att.parameters():
            p.copy_(torch.randn_like(p))
    B, S = 3, 11
    h, i_t, hbar = torch.randn(B, 6).double(), torch.randn(B, 3).double(), torch.randn(B, S, 5).double()
    lengths = torch.tensor([11, 8, 5])
    pad = torch.arange(S).unsqueeze(0) >= lengths.unsqueeze(1)
    p_prev = torch.tensor([2.3, 6.0, 0.0]).double()
    step = att(h, i_t, att.keys(hbar), hbar, pad, lengths, p_prev)

    sd = {k: v.detach() for k, v in att.state_dict().items()}
    lin = lambda x, name: x @ sd[f"{name}.weight"].T + (sd[f"{name}.bias"] if f"{name}.bias" in sd else 0)  # noqa: E731
    e = lin(torch.tanh(lin(h, "q_proj").unsqueeze(1) + lin(hbar, "k_proj")), "v").squeeze(-1)  # (B, S)
    g = torch.sigmoid(lin(torch.tanh(lin(torch.cat([h, i_t], -1), "gate_hidden")), "gate_out")).squeeze(-1)  # (B,)
    s = torch.arange(S).double()
    logits = e - g.unsqueeze(1) * (s.unsqueeze(0) - p_prev.unsqueeze(1)) ** 2 / (2 * 1.5 ** 2)
    a = torch.softmax(logits.masked_fill(pad, float("-inf")), -1)
    torch.testing.assert_close(step.gate, g)
    torch.testing.assert_close(step.weights, a)
    torch.testing.assert_close(step.focus, (a * s).sum(-1))
    torch.testing.assert_close(step.context, torch.einsum("bs,bsc->bc", a, hbar))
    assert step.weights[pad].abs().max() == 0 and (g > 0).all() and (g < 1).all()
