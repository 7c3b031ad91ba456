"""E-ATT: binarisation (eqs. 7-8), addition-only selection (eqs. 9-12), L1 scores (eq. 13),
Synthesizer positions, hybrids, energy accounting, and a short end-to-end run on Multi30k."""

import argparse
import json
import math
import os
import sys

import pytest
import torch
import torch.nn.functional as F

import fairseq_plugins.attention.triton as tk
from fairseq_plugins.analysis import energy as E
from fairseq_plugins.attention import FunctionalMultiheadAttention, build_attention_fn
from fairseq_plugins.attention.l1 import l1_scores
from fairseq_plugins.modules.binarize import binarize, select_add, select_add_count, select_matmul
from helpers import build, toy_batch

C, H = 16, 4
NEW = ["eatt", "eatt_select_dot", "eatt_l1", "synth_dense", "synth_random"]
#: the binarised functions at the official code's Q/K width C/H (--eatt-qk-dim): "name@qk"
QK = ["eatt@qk", "eatt_select_dot@qk"]


def _fn(name):
    """``build_attention_fn`` of ``name``; ``name@qk``: with ``--eatt-qk-dim C/H`` (the official code)."""
    name, _, qk = name.partition("@")
    return build_attention_fn(name, C, H, argparse.Namespace(eatt_qk_dim=C // H) if qk else None)


@pytest.mark.parametrize("tau", [0.0, 1.0, -0.3])
def test_binarize_forward_and_surrogate_gradient_eq8(tau):
    x = torch.randn(50, 7, dtype=torch.float64, requires_grad=True)
    y = binarize(x, tau)
    assert torch.equal(y, (x > tau).double())
    g = torch.randn_like(x)
    y.backward(g)
    expected = g * math.sqrt(2 / math.pi) * torch.exp(-2 * (x.detach() - tau) ** 2)
    torch.testing.assert_close(x.grad, expected, rtol=0, atol=1e-15)
    # eq. 8 is a density (of N(tau, 1/4)): the smoothed step rises by exactly 1
    u = torch.linspace(tau - 6, tau + 6, 20001, dtype=torch.float64, requires_grad=True)
    binarize(u, tau).sum().backward()
    assert abs(torch.trapezoid(u.grad, u.detach()).item() - 1.0) < 1e-6


def test_select_add_equals_matmul_values_and_gradients():
    torch.manual_seed(0)
    x = torch.randn(3, 5, C, dtype=torch.float64, requires_grad=True)
    lin = torch.nn.Linear(C, 12).double()
    w1, b1 = lin.weight.detach().clone().requires_grad_(), lin.bias.detach().clone().requires_grad_()
    w2, b2 = lin.weight.detach().clone().requires_grad_(), lin.bias.detach().clone().requires_grad_()
    x2 = x.detach().clone().requires_grad_()
    a = select_add(binarize(x, 0.3), w1, b1)  # additions only
    b = select_matmul(binarize(x2, 0.3), w2, b2)  # the fast path the model runs
    torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
    g = torch.randn_like(a)
    a.backward(g)
    b.backward(g)
    for u, v in ((x.grad, x2.grad), (w1.grad, w2.grad), (b1.grad, b2.grad)):
        torch.testing.assert_close(u, v, rtol=1e-12, atol=1e-12)
    # the literal path is a sum of selected rows: check one token by hand
    xb = binarize(x, 0.3).detach()
    sel = xb[1, 2].nonzero().flatten()
    torch.testing.assert_close(a[1, 2], lin.bias + lin.weight[:, sel].sum(1))
    assert select_add_count(xb, 12) == int(xb.sum()) * 12
    with pytest.raises(ValueError, match="binary"):
        select_add(x.detach(), w1)


@pytest.mark.parametrize("max_elems", [1, 50, 1 << 22])  # block of 1 query ... everything at once
def test_l1_scores_equal_cdist(max_elems):
    torch.manual_seed(1)
    q = torch.randn(2, 3, 7, 5, dtype=torch.float64, requires_grad=True)
    k = torch.randn(2, 3, 9, 5, dtype=torch.float64, requires_grad=True)
    q2, k2 = (t.detach().clone().requires_grad_() for t in (q, k))
    s = l1_scores(q, k, 0.4, max_elems=max_elems)
    ref = -0.4 * torch.cdist(q2, k2, p=1)
    torch.testing.assert_close(s, ref)
    g = torch.randn_like(s)
    s.backward(g)
    ref.backward(g)
    torch.testing.assert_close(q.grad, q2.grad)
    torch.testing.assert_close(k.grad, k2.grad)
    assert torch.autograd.gradcheck(lambda a, b: l1_scores(a, b, 0.4, max_elems), (q2.detach().requires_grad_(),
                                                                                   k2.detach().requires_grad_()))
    torch.testing.assert_close(l1_scores(q, k, 0.4, impl="cdist"), s)
    torch.testing.assert_close(l1_scores(q, k, 0.4, impl="auto"), s)  # the path the model takes
    with pytest.raises(ValueError, match="auto, chunked, cdist"):
        l1_scores(q, k, 0.4, impl="naive")


def test_l1_impl_auto_avoids_cdist_backward_on_cuda():
    """impl="auto" avoids cdist only where its CUDA backward runs: that backward materialises
    (B*H, S, T, d) and indexes it with 32-bit ints (an illegal memory access on an H200 at 2**34
    elements); the forward alone (beam search) keeps cdist.  An explicit "cdist" that would cross
    2**31 with a backward is refused before any launch."""
    from fairseq_plugins.attention.l1 import resolve_impl

    assert resolve_impl("auto", "cpu") == "cdist"
    assert resolve_impl("auto", "cpu", 2 ** 34, True) == "cdist"
    assert resolve_impl("auto", "cuda", 2 ** 34, True) == "chunked"
    assert resolve_impl("auto", "cuda", 2 ** 34, False) == "cdist"  # forward only: no buffer
    assert resolve_impl("auto", "meta", 2 ** 34, True) == "cdist"
    assert resolve_impl("cdist", "cuda", 2 ** 31 - 1, True) == "cdist"
    assert resolve_impl("cdist", "cuda", 2 ** 34, False) == "cdist"  # forward only: no buffer
    assert resolve_impl("cdist", "cpu", 2 ** 34, True) == "cdist"
    with pytest.raises(ValueError, match="out of bounds.*'auto' or 'chunked'"):
        resolve_impl("cdist", "cuda", 2 ** 31, True)
    with pytest.raises(ValueError, match="valid choices: auto, chunked, cdist"):
        resolve_impl("naive", "cpu")


def test_cdist_split_over_queries_below_the_cuda_grid_limit():
    """cdist's CUDA forward launches one thread block per score, at most 2**31 - 1 of them (a decode
    prefill of 320 x 8 x 1023 x 1023 failed with "invalid argument" on an H100): past the limit the
    queries are split into blocks.  Here a limit of 50 scores forces 3 blocks of 2 queries: values
    and gradients equal one cdist call, and a limit below one query row is refused."""
    from fairseq_plugins.attention.l1 import _cdist_l1

    torch.manual_seed(5)
    q = torch.randn(2, 2, 5, 8, dtype=torch.float64, requires_grad=True)
    k = torch.randn(2, 2, 6, 8, dtype=torch.float64, requires_grad=True)
    out = _cdist_l1(q, k, grid_limit=50)  # B*H*S = 24 scores per query row -> 2 rows per block
    ref = torch.cdist(q, k, p=1)
    assert torch.equal(out, ref)
    g = torch.randn_like(ref)
    gq, gk = torch.autograd.grad(out, (q, k), g)
    rq, rk = torch.autograd.grad(ref, (q, k), g)
    torch.testing.assert_close(gq, rq, rtol=0, atol=1e-12)
    torch.testing.assert_close(gk, rk, rtol=0, atol=1e-12)
    with pytest.raises(ValueError, match="impl='chunked'"):
        _cdist_l1(q, k, grid_limit=23)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_l1_forward_past_the_cdist_grid_limit():
    """A forward of 2 x 32768 x 32769 > 2**31 - 1 scores (cdist alone: "invalid argument"): the
    query-blocked cdist runs, and its last rows match cdist on those rows alone."""
    torch.manual_seed(6)
    q = torch.randn(1, 2, 32768, 4, device="cuda")
    k = torch.randn(1, 2, 32769, 4, device="cuda")
    with torch.no_grad():
        s = l1_scores(q, k, 0.5, impl="auto")
        ref = -0.5 * torch.cdist(q[:, :, -8:], k, p=1)
    assert s.shape == (1, 2, 32768, 32769)
    torch.testing.assert_close(s[:, :, -8:], ref)


@pytest.mark.parametrize("impl", ["chunked", "cdist", "auto"])
def test_l1_scores_half_precision_is_computed_in_float32(impl):
    """bfloat16 inputs: the scores of every impl are the float32 scores rounded once, and the
    gradients are the float32 gradients rounded (no bf16 differences summed over d)."""
    torch.manual_seed(3)
    q = torch.randn(2, 2, 5, 64).bfloat16().requires_grad_()
    k = torch.randn(2, 2, 6, 64).bfloat16().requires_grad_()
    s = l1_scores(q, k, 0.125, impl=impl)
    q32, k32 = (t.detach().float().requires_grad_() for t in (q, k))
    ref = -0.125 * torch.cdist(q32, k32, p=1)
    assert s.dtype == torch.bfloat16
    assert torch.equal(s, ref.bfloat16())
    g = torch.randn_like(ref)
    s.backward(g.bfloat16())
    ref.backward(g.bfloat16().float())
    torch.testing.assert_close(q.grad, q32.grad.bfloat16())
    torch.testing.assert_close(k.grad, k32.grad.bfloat16())


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_l1_auto_backward_past_cdist_int32_limit():
    """The size that crashed cdist's CUDA backward in mt-bench-gpu (B*H*T*S*d = 2**34 there; 2**31
    here, the first size past its 32-bit indexing): impl="auto" runs, and a slice of the batch
    matches cdist on that slice alone (small enough for cdist's buffer)."""
    torch.manual_seed(4)
    q = torch.randn(64, 8, 256, 64, device="cuda", requires_grad=True)  # 64*8*256*256*64 = 2**31
    k = torch.randn(64, 8, 256, 64, device="cuda", requires_grad=True)
    g = torch.randn(64, 8, 256, 256, device="cuda")
    s = l1_scores(q, k, 0.125, impl="auto")
    s.backward(g)
    q1, k1 = (t.detach()[:1].clone().requires_grad_() for t in (q, k))
    ref = -0.125 * torch.cdist(q1, k1, p=1)
    ref.backward(g[:1])
    torch.testing.assert_close(s[:1], ref)
    torch.testing.assert_close(q.grad[:1], q1.grad)
    torch.testing.assert_close(k.grad[:1], k1.grad)


def test_eatt_module_equals_equations():
    """eatt in the module: Q, K from the binarised inputs, -L1/sqrt(d_h), softmax; V full precision."""
    torch.manual_seed(2)
    fn = build_attention_fn("eatt", C, H)
    m = FunctionalMultiheadAttention(C, H, fn, encoder_decoder_attention=True).double().eval()
    x, y = torch.randn(4, 1, C, dtype=torch.float64), torch.randn(6, 1, C, dtype=torch.float64)
    out, w = m(x, y, y, need_head_weights=True)
    xb, yb = (x > 1.0).double(), (y > 1.0).double()  # tau = 1.0 (the paper's default)
    Q = select_add(xb, m.q_proj.weight, m.q_proj.bias).view(4, H, C // H).transpose(0, 1)
    K = select_add(yb, m.k_proj.weight, m.k_proj.bias).view(6, H, C // H).transpose(0, 1)
    V = F.linear(y, m.v_proj.weight, m.v_proj.bias).view(6, H, C // H).transpose(0, 1)
    A = torch.softmax(-torch.cdist(Q, K, p=1) / math.sqrt(C // H), -1)  # (H, T, S)
    torch.testing.assert_close(w[:, 0], A)
    ref = m.out_proj((A @ V).transpose(0, 1).reshape(4, 1, C))
    torch.testing.assert_close(out, ref)
    assert fn.tau == 1.0


@pytest.mark.parametrize("tau", [1.0, 0.0])  # the paper's appendix / the official code
def test_eatt_module_backward_uses_the_eq8_surrogate_centred_at_tau(tau):
    """The module's gradient w.r.t. its query/key inputs is eq. 8: ``grad_in = grad_out(binary input)
    * sqrt(2/pi) * exp(-2 (x - tau)^2)``, centred at ``tau``.  In cross-attention the query reaches
    the output only through ``Q = W_Q f(x)``; the key input through ``K = W_K f(y)`` and through the
    full-precision ``V``.  Reference: the equations on *detached* 0/1 inputs with ``requires_grad``
    (their gradients are the ``grad_out`` of eq. 8); a straight-through estimator (``grad_in =
    grad_out``) or a bump centred at 0 instead of ``tau`` (the official code) fails."""
    torch.manual_seed(12)
    fn = build_attention_fn("eatt", C, H, argparse.Namespace(eatt_tau=tau))
    assert fn.tau == tau
    m = FunctionalMultiheadAttention(C, H, fn, encoder_decoder_attention=True).double().eval()
    x = (torch.randn(4, 1, C, dtype=torch.float64) + tau).requires_grad_()  # around tau: a mix of 0 and 1
    y = (torch.randn(6, 1, C, dtype=torch.float64) + tau).requires_grad_()
    g = torch.randn(4, 1, C, dtype=torch.float64)
    m(x, y, y, need_weights=False)[0].backward(g)

    xb = (x.detach() > tau).double().requires_grad_()
    yb = (y.detach() > tau).double().requires_grad_()
    yv = y.detach().clone().requires_grad_()  # V's full-precision path
    Q = F.linear(xb, m.q_proj.weight, m.q_proj.bias).view(4, H, C // H).transpose(0, 1)
    K = F.linear(yb, m.k_proj.weight, m.k_proj.bias).view(6, H, C // H).transpose(0, 1)
    V = F.linear(yv, m.v_proj.weight, m.v_proj.bias).view(6, H, C // H).transpose(0, 1)
    A = torch.softmax(-torch.cdist(Q, K, p=1) / math.sqrt(C // H), -1)  # (H, T, S)
    m.out_proj((A @ V).transpose(0, 1).reshape(4, 1, C)).backward(g)
    assert xb.grad.abs().min() > 0 and yb.grad.abs().sum() > 0  # the check below is not vacuous

    def eq8(u):  # written out, not imported
        return math.sqrt(2 / math.pi) * torch.exp(-2 * (u.detach() - tau) ** 2)

    torch.testing.assert_close(x.grad, xb.grad * eq8(x), rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(y.grad, yb.grad * eq8(y) + yv.grad, rtol=1e-10, atol=1e-12)


def test_eatt_qk_dim_module_equals_the_official_width():
    """``--eatt-qk-dim C/H`` (NLP2CT/E-Att ``E-ATT.py``: ``linear_in_weight`` of ``C x 2C/H``): W_Q, W_K
    map C -> C/H, each head's L1 distance runs over C/H^2 dimensions scaled by sqrt(C/H^2) (eq. 13
    with the official self-attention's ``attention_norm_factor``); V and out_proj keep C."""
    torch.manual_seed(2)
    fn = _fn("eatt@qk")
    assert (fn.qk_dim, fn.qk_head_dim, fn.head_dim) == (C // H, C // H // H, C // H)
    m = FunctionalMultiheadAttention(C, H, fn, encoder_decoder_attention=True).double().eval()
    assert m.q_proj.weight.shape == m.k_proj.weight.shape == (C // H, C)
    assert m.v_proj.weight.shape == m.out_proj.weight.shape == (C, C)
    x, y = torch.randn(4, 1, C, dtype=torch.float64), torch.randn(6, 1, C, dtype=torch.float64)
    out, w = m(x, y, y, need_head_weights=True)
    xb, yb = (x > 1.0).double(), (y > 1.0).double()
    dq = C // H // H
    Q = select_add(xb, m.q_proj.weight, m.q_proj.bias).view(4, H, dq).transpose(0, 1)
    K = select_add(yb, m.k_proj.weight, m.k_proj.bias).view(6, H, dq).transpose(0, 1)
    V = F.linear(y, m.v_proj.weight, m.v_proj.bias).view(6, H, C // H).transpose(0, 1)
    A = torch.softmax(-torch.cdist(Q, K, p=1) / math.sqrt(dq), -1)  # (H, T, S)
    torch.testing.assert_close(w[:, 0], A)
    torch.testing.assert_close(out, m.out_proj((A @ V).transpose(0, 1).reshape(4, 1, C)))
    # the fused path (no weights asked) gives the same output: it falls back to score/normalize,
    # the kernels taking one head dimension for Q, K and V
    torch.testing.assert_close(m(x, y, y, need_weights=False)[0], out)
    # W_Q / W_K keep fairseq's initialisation: xavier_uniform with gain 1/sqrt(2) over (C, C/H)
    bound = math.sqrt(6.0 / (C + C // H)) / math.sqrt(2)
    assert 0.8 * bound < float(m.q_proj.weight.abs().max()) <= bound


@pytest.mark.skipif(not tk.triton_available(), reason="triton is not installed (pip install -e .[gpu])")
@pytest.mark.parametrize("name", ["eatt", "eatt@qk"])
def test_eatt_triton_backend_equals_torch_at_both_qk_widths(name, interp):
    """``--attention-backend triton`` (the interpreter): at width C the fused L1 kernel runs and
    equals the torch path; at the official width C/H (Q/K head dimension != V's) the module must
    not hand the kernel mismatched heads (it refuses them) and takes score/normalize."""
    torch.manual_seed(9)
    out = {}
    for backend in ("torch", "triton"):
        torch.manual_seed(9)
        n, _, qk = name.partition("@")
        args = argparse.Namespace(attention_backend=backend, eatt_qk_dim=C // H if qk else 0)
        m = FunctionalMultiheadAttention(C, H, build_attention_fn(n, C, H, args), self_attention=True).eval()
        x = torch.randn(5, 2, C) * 2
        calls = []
        real = tk.l1_softmax_attention
        tk.l1_softmax_attention = lambda *a, **k: calls.append(1) or real(*a, **k)
        try:
            out[backend] = m(x, x, x, need_weights=False)[0]
        finally:
            tk.l1_softmax_attention = real
        assert len(calls) == (1 if backend == "triton" and not qk else 0)
    torch.testing.assert_close(out["triton"], out["torch"], rtol=1e-5, atol=1e-5)


def test_set_attn_fn_refuses_another_query_key_width():
    m = FunctionalMultiheadAttention(C, H, _fn("eatt@qk"), self_attention=True)
    with pytest.raises(ValueError, match=f"query/key width {C}, this module's q_proj / k_proj {C // H}"):
        m.set_attn_fn(build_attention_fn("softmax", C, H))
    m.set_attn_fn(_fn("eatt_select_dot@qk"))  # the same width: accepted
    assert m.attn_fn.name == "eatt_select_dot"


def test_eatt_qk_dim_is_checked_against_the_heads():
    with pytest.raises(ValueError, match=r"--eatt-qk-dim 6 is not a multiple of the 4 heads; valid choices: 0 "):
        build_attention_fn("eatt", C, H, argparse.Namespace(eatt_qk_dim=6))
    with pytest.raises(ValueError, match=r"--eatt-qk-dim must be an integer >= 0, got -4"):
        build_attention_fn("eatt_select_dot", C, H, argparse.Namespace(eatt_qk_dim=-4))
    assert build_attention_fn("eatt", C, H, argparse.Namespace(eatt_qk_dim=0)).qk_dim == C  # 0 = C


@pytest.mark.parametrize("name", NEW + QK)
def test_left_padding_equals_unpadded(name):
    """Encoder self-attention over a left-padded sentence == the sentence alone (positions of
    the Synthesizer functions count non-padding tokens)."""
    torch.manual_seed(3)
    m = FunctionalMultiheadAttention(C, H, _fn(name), self_attention=True).eval()
    x = torch.randn(5, 1, C)
    padded = torch.cat([torch.randn(2, 1, C), x])
    kpm = torch.tensor([[True, True] + [False] * 5])
    out, _ = m(padded, padded, padded, key_padding_mask=kpm, need_weights=False)
    ref, _ = m(x, x, x, need_weights=False)
    torch.testing.assert_close(out[2:], ref, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", NEW + QK)
@pytest.mark.parametrize("beam", [1, 3])
def test_cross_attention_incremental_equals_full(name, beam):
    """Cross-attention step by step (query position counted in the incremental state, beams
    folded into extra queries, reordering) == one full pass over each hypothesis's own queries.
    Every hypothesis gets its own query stream and every sentence its own encoder output and
    left padding; between steps the state is reordered as beam search does (each hypothesis
    continues a parent of its sentence), and once with a batch reduction that drops sentence 1
    and swaps sentences 2 and 0: a reorder that does nothing, picks the wrong sentences or loses
    the query offset (synth_random's positions) fails."""
    torch.manual_seed(4)
    m = FunctionalMultiheadAttention(C, H, _fn(name), encoder_decoder_attention=True).eval()
    bsz, S, T = 3, 6, 5
    enc = torch.randn(S, bsz, C)
    kpm = torch.zeros(bsz, S, dtype=torch.bool)
    kpm[1, :2] = True  # left padding, of a different length in every sentence
    kpm[2, :1] = True
    m.set_beam_size(beam)
    sent = torch.arange(bsz).repeat_interleave(beam)  # the sentence of every hypothesis
    hyps = [([], []) for _ in range(bsz * beam)]  # per hypothesis: its queries, its outputs
    done, state = [], {}
    for t in range(T):
        x = torch.randn(1, sent.numel(), C)  # a query of its own for every hypothesis
        e = enc[:, sent]  # (S, B, C), identical beams, as reorder_encoder_out gives them
        y, _ = m(x, e, e, key_padding_mask=kpm[sent], incremental_state=state, static_kv=True, need_weights=True)
        for i, (qs, ys) in enumerate(hyps):
            qs.append(x[0, i])
            ys.append(y[0, i])
        if t == T - 1:
            break
        n = sent.numel() // beam  # sentences still decoded
        keep = torch.tensor([2, 0]) if t == 1 else torch.arange(n)  # t == 1: sentence 1 finished
        if t == 1:
            done += [(int(sent[i]), hyps[i]) for i in range(sent.numel()) if int(sent[i]) == 1]
        parents = torch.randint(beam, (keep.numel(), beam))  # beam search: any parent, repeats too
        order = (keep.unsqueeze(1) * beam + parents).reshape(-1)
        m.reorder_incremental_state(state, order)
        sent = sent[order]
        hyps = [(list(hyps[o][0]), list(hyps[o][1])) for o in order.tolist()]
    assert sent.tolist() == [2] * beam + [0] * beam
    m.set_beam_size(1)
    for s, (qs, ys) in [(int(s), h) for s, h in zip(sent, hyps)] + done:
        e = enc[:, s:s + 1]
        full, _ = m(torch.stack(qs).unsqueeze(1), e, e, key_padding_mask=kpm[s:s + 1], need_weights=False)
        torch.testing.assert_close(torch.stack(ys), full[:, 0], rtol=1e-5, atol=1e-6)


def test_synth_max_len_error_names_the_flag():
    args = type("A", (), {"synth_max_len": 4})()
    m = FunctionalMultiheadAttention(C, H, build_attention_fn("synth_random", C, H, args), self_attention=True)
    x = torch.randn(5, 1, C)
    with pytest.raises(ValueError, match="--synth-max-len 4"):
        m(x, x, x)


@pytest.mark.parametrize("self_fn", ["softmax", "synth_dense", "synth_random", "eatt"])
@pytest.mark.parametrize("cross_fn", ["softmax", "synth_dense", "synth_random", "eatt"])
def test_all_16_hybrids_build_and_train(self_fn, cross_fn):
    """Table 5: every self x cross pair is one flag each; a training step gives finite gradients."""
    torch.manual_seed(5)
    model, task = build("eatt_transformer_small", encoder_attention_fn=self_fn, decoder_attention_fn=self_fn,
                        cross_attention_fn=cross_fn)
    assert model.encoder.layers[0].self_attn.attn_fn.name == self_fn
    assert model.decoder.layers[0].self_attn.attn_fn.name == self_fn
    assert model.decoder.layers[0].encoder_attn.attn_fn.name == cross_fn
    src, lens, prev = toy_batch(task)
    out, _ = model.train()(src, lens, prev)
    out.sum().backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
    # every trainable parameter gets a gradient (torch DDP's condition without --find-unused-parameters);
    # the frozen ones are exactly the projections the Synthesizers never read
    assert [n for n, p in model.named_parameters() if p.requires_grad and p.grad is None] == []
    unused = {"synth_dense": {"k_proj"}, "synth_random": {"q_proj", "k_proj"}}
    frozen = {n for n, p in model.named_parameters() if not p.requires_grad}
    want = {f"{side}.layers.{i}.{attn}.{proj}.{w}" for side, attn, fn in
            (("encoder", "self_attn", self_fn), ("decoder", "self_attn", self_fn), ("decoder", "encoder_attn", cross_fn))
            for i in range(len(model.encoder.layers)) for proj in unused.get(fn, ()) for w in ("weight", "bias")}
    assert frozen == want


@pytest.mark.parametrize("cross_fn", ["synth_dense", "synth_random"])
def test_synthesizer_hybrid_trains_under_torch_ddp_without_find_unused_parameters(cross_fn, tmp_path):
    """fairseq's default ``--ddp-backend pytorch_ddp`` wraps the model in torch DDP with
    ``find_unused_parameters=False``: a parameter without a gradient fails the second step
    ("Expected to have finished reduction in the prior iteration"); the Synthesizers' unread
    projections are frozen, so E-ATT Table 5's rows train on several GPUs (gloo here, one rank)."""
    import torch.distributed as dist

    torch.manual_seed(3)
    model, task = build("eatt_transformer_small", encoder_attention_fn="softmax", decoder_attention_fn="softmax",
                        cross_attention_fn=cross_fn)
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'pg'}", rank=0, world_size=1)
    try:
        ddp = torch.nn.parallel.DistributedDataParallel(model.train(), find_unused_parameters=False)
        src, lens, prev = toy_batch(task)
        for _ in range(2):
            out, _ = ddp(src, lens, prev)
            out.sum().backward()
    finally:
        dist.destroy_process_group()


def test_eatt_arch_defaults():
    model, _ = build("eatt_transformer_small")
    names = {(l.self_attn.attn_fn.name) for l in model.encoder.layers} | \
        {l.self_attn.attn_fn.name for l in model.decoder.layers} | \
        {l.encoder_attn.attn_fn.name for l in model.decoder.layers}
    assert names == {"eatt"} and model.encoder.layers[0].self_attn.attn_fn.tau == 1.0
    model, _ = build("eatt_transformer_small", eatt_tau=0.0)
    assert model.decoder.layers[0].encoder_attn.attn_fn.tau == 0.0


def test_eatt_qk_dim_model_trains_decodes_incrementally_and_counts_its_energy():
    """A model with ``--eatt-qk-dim`` = d/h (the official width): its W_Q / W_K shrink by exactly
    the expected parameters, a training step gives finite gradients everywhere, incremental
    decoding equals the full decoder pass, and the energy count uses the narrower width for its
    binarised modules only."""
    torch.manual_seed(7)
    base, task = build("eatt_transformer_small", cross_attention_fn="softmax")
    model, _ = build("eatt_transformer_small", task, cross_attention_fn="softmax", eatt_qk_dim=8)
    d, n_eatt = 16, 2 + 2  # tiny sizes of helpers.build: d 16, 2 heads, 2 + 2 eatt self-attention modules
    n = lambda m: sum(p.numel() for p in m.parameters())  # noqa: E731
    assert n(base) - n(model) == n_eatt * 2 * (d * d + d - (d * 8 + 8))  # W_Q, W_K and biases, d -> 8
    sa = model.encoder.layers[0].self_attn
    assert sa.q_proj.weight.shape == (8, d) and sa.attn_fn.qk_head_dim == 4
    assert model.decoder.layers[0].encoder_attn.q_proj.weight.shape == (d, d)  # softmax cross keeps d
    src, lens, prev = toy_batch(task)
    out, _ = model.train()(src, lens, prev)
    out.sum().backward()
    grads = {k: p.grad for k, p in model.named_parameters()}
    assert all(g is not None and torch.isfinite(g).all() for k, g in grads.items() if "q_proj" in k or "k_proj" in k)
    model.eval()
    with torch.no_grad():
        enc = model.encoder(src, src_lengths=lens)
        full, _ = model.decoder(prev, encoder_out=enc)
        state, steps = {}, []
        for t in range(prev.size(1)):
            o, _ = model.decoder(prev[:, : t + 1], encoder_out=enc, incremental_state=state)
            steps.append(o)
    torch.testing.assert_close(torch.cat(steps, 1), full, rtol=1e-5, atol=1e-5)
    fns = {"encoder": "eatt", "decoder": "eatt", "cross": "softmax"}
    rho = {(t, i, r): 0.5 for t in ("encoder", "decoder") for i in range(2) for r in ("query", "key")}
    ops = E.model_ops(fns, {"encoder": 2, "decoder": 2}, 5, 4, d, 2, rho, qk_width=8)
    assert ops[("encoder", 0)] == E.score_ops("eatt", 5, 5, d, 2, 0.5, 0.5, qk_width=8)
    assert ops[("cross", 1)] == E.score_ops("vanilla", 4, 5, d, 2)
    assert E.model_ops(fns, {"encoder": 2, "decoder": 2}, 5, 4, d, 2, rho, qk_width=0)[("decoder", 1)] == \
        E.score_ops("eatt", 4, 4, d, 2, 0.5, 0.5)


def test_measure_rho_counts_ones():
    torch.manual_seed(6)
    model, task = build("eatt_transformer_small", cross_attention_fn="softmax")
    src, lens, prev = toy_batch(task, bsz=1)
    l0 = model.encoder.layers[1].self_attn
    x_in = {}
    l0.register_forward_pre_hook(lambda mod, args, kw: x_in.update(x=kw["query"].detach()),
                                 with_kwargs=True)
    rho = E.measure_rho(model, [{"net_input": {"src_tokens": src, "src_lengths": lens, "prev_output_tokens": prev}}])
    assert set(k[0] for k in rho) == {"encoder", "decoder"}  # cross is softmax here
    torch.testing.assert_close(rho[("encoder", 1, "query")], (x_in["x"] > 1.0).double().mean().item())
    assert rho[("encoder", 1, "query")] == rho[("encoder", 1, "key")]
    assert l0.attn_fn.rho_meter is None  # switched off afterwards


def test_energy_counts_against_hand_count():
    """l = 3, d = 4, h = 2 (d_h = 2), rho = 0.5, counted by hand."""
    l, d, h = 3, 4, 2
    # vanilla: Q, K projections 3*4*4 MACs each = 48 + 48; QK^T 3*3 pairs * 2 heads * 2 = 36
    assert E.score_ops("vanilla", l, l, d, h) == E.OpCount(132, 132)
    # exact: projections 3*4 outputs * 3 adds each = 36 (x2); dot products 18 * 1 add
    assert E.score_ops("vanilla", l, l, d, h, convention="exact") == E.OpCount(36 * 2 + 18, 132)
    # dense: W1 3*4*4 = 48 MACs; W2 per head: 3 queries * 2 heads * d_h 2 * 3 keys = 36
    assert E.score_ops("dense", l, l, d, h) == E.OpCount(84, 84)
    assert E.score_ops("random", l, l, d, h) == E.OpCount(0, 0)
    # eatt: each token selects rho*d = 2 rows of width 4: 3*2*4 = 24 (x2); L1: 18 pairs-heads * 2 = 36
    assert E.score_ops("eatt", l, l, d, h, 0.5, 0.5) == E.OpCount(84, 0)
    assert E.score_ops("eatt", l, l, d, h, 0.5, 0.5, l1_adds_per_element=2) == E.OpCount(120, 0)
    # exact: sum of 2 rows = 1 addition per output (3*4 outputs, x2); L1: 18 * (2*2 - 1)
    assert E.score_ops("eatt", l, l, d, h, 0.5, 0.5, convention="exact") == E.OpCount(24 + 54, 0)
    # block adds V (48), AV (3*3*4 = 36), out (48) MACs
    assert E.block_ops("eatt", l, l, d, h, 0.5, 0.5) == E.OpCount(84 + 132, 132)
    # Table 2: Dense's 51.10 % (hardware-free) at l = 23, d = 512
    r = E.table2(23, 512, 8, 0.2, "fpga")
    assert [x["model"] for x in r] == ["Vanilla", "Dense", "RandInit", "E-ATT"]
    assert round(r[1]["ratio_pct"], 2) == 51.10 and r[2]["ratio_pct"] == 0.0
    assert abs(E.implied_length(0.5110, 512) - 23.0) < 0.05
    rho = E.implied_rho(0.0044, 23, 512, 8, "fpga")
    assert abs(E.table2(23, 512, 8, rho, "fpga")[3]["ratio_pct"] - 0.44) < 1e-9
    with pytest.raises(ValueError, match="asic, fpga"):
        E.energy_pj(E.OpCount(1, 1), "gpu")
    with pytest.raises(ValueError, match="rho"):
        E.score_ops("eatt", l, l, d, h)
    # the official code's Q/K width d/h = 2 (NLP2CT/E-Att linear_in_weight d x 2d/h): each token
    # selects rho*d = 2 rows of width 2: 3*2*2 = 12 (x2); L1: 9 pairs x 2 heads x 1 dim = 18
    assert E.score_ops("eatt", l, l, d, h, 0.5, 0.5, qk_width=2) == E.OpCount(42, 0)
    assert E.score_ops("vanilla", l, l, d, h, qk_width=2) == E.OpCount(132, 132)  # vanilla keeps d
    assert E.block_ops("eatt", l, l, d, h, 0.5, 0.5, qk_width=2) == E.OpCount(42 + 132, 132)
    rho2 = E.implied_rho(0.0044, 23, 512, 8, "asic", qk_width=64)
    assert abs(E.table2(23, 512, 8, rho2, "asic", qk_width=64)[3]["ratio_pct"] - 0.44) < 1e-9
    with pytest.raises(ValueError, match="qk_width = 3 must be a positive multiple of h = 2"):
        E.score_ops("eatt", l, l, d, h, 0.5, 0.5, qk_width=3)


def test_mean_model_ops_is_the_mean_over_sentences_not_the_count_at_mean_lengths():
    """Two one-layer-encoder sentences of l = 1 and 3 (d = 4, h = 2), vanilla, by hand:
    ``2 l d^2 + l^2 d`` = 36 and 132 MACs, mean 84; at the mean length l = 2 it is 80 (the gap is
    ``d Var(l)`` = 4).  A whole E-ATT model (cross-attention's ``l_q l_k``, rho, Q/K width d/h)
    equals the average of :func:`model_ops` over its sentences, module by module."""
    enc = {"encoder": "softmax", "decoder": "softmax", "cross": "softmax"}
    m = E.mean_model_ops(enc, {"encoder": 1, "decoder": 0}, [(1, 7), (3, 9)], 4, 2)
    assert m == {("encoder", 0): E.OpCount(84, 84)}
    assert E.model_ops(enc, {"encoder": 1, "decoder": 0}, 2, 8, 4, 2) == {("encoder", 0): E.OpCount(80, 80)}
    fns, layers = {"encoder": "eatt", "decoder": "eatt", "cross": "eatt"}, {"encoder": 2, "decoder": 2}
    rho = {(t, i, r): 0.1 + 0.05 * i + (0.02 if r == "key" else 0.0)
           for t in ("encoder", "decoder", "cross") for i in range(2) for r in ("query", "key")}
    lengths = [(5, 9), (12, 4), (5, 9), (20, 22)]
    for part in ("scores", "block"):
        got = E.mean_model_ops(fns, layers, lengths, 8, 2, rho, part, qk_width=4)
        each = [E.model_ops(fns, layers, ls, lt, 8, 2, rho, part, qk_width=4) for ls, lt in lengths]
        assert set(got) == set(each[0])
        for key in got:
            assert got[key].adds == pytest.approx(sum(e[key].adds for e in each) / 4, rel=1e-12)
            assert got[key].muls == pytest.approx(sum(e[key].muls for e in each) / 4, rel=1e-12)
    mean = E.total(E.mean_model_ops(fns, layers, lengths, 8, 2, rho, qk_width=4).values())
    at_mean = E.total(E.model_ops(fns, layers, 10.5, 11.0, 8, 2, rho, qk_width=4).values())
    assert mean.adds > 1.1 * at_mean.adds  # E[l^2] > E[l]^2, and E[l_q l_k] > E[l_q] E[l_k] here
    with pytest.raises(ValueError, match="at least one sentence"):
        E.mean_model_ops(fns, layers, [], 8, 2, rho)


def test_printed_eatt_cell_against_hand_count_and_the_cli_page(tmp_path):
    """The garbled E-ATT cell of Table 2 read as printed: 1/2 l d rho + l^2 d additions against
    vanilla's 2 l d^2 + l^2 d MACs.  l = 3, d = 4, rho = 0.5 by hand: 3 + 36 = 39 additions
    (35.1 pJ on ASIC) against 132 MACs (607.2 pJ); at the l implied by Dense's 51.10 % the ASIC
    reading spans 0.430-0.440 % (results/README.md), and the CLI page prints that range."""
    assert E.printed_eatt_cell(3, 4, 0.5, "asic") == pytest.approx(100 * 39 * 0.9 / (132 * 4.6))
    assert E.printed_eatt_cell(3, 4, 0.5, "fpga") == pytest.approx(100 * 39 * 0.4 / (132 * 19.2))
    l = E.implied_length(0.5110, 512)
    lo, hi = (E.printed_eatt_cell(l, 512, r, "asic") for r in (0.0, 1.0))
    assert (round(lo, 3), round(hi, 3)) == (0.430, 0.440)
    mid = E.printed_eatt_cell(l, 512, 0.5, "asic")
    assert mid == pytest.approx((lo + hi) / 2)  # linear in rho
    with pytest.raises(ValueError, match=r"rho must be in \[0, 1\]"):
        E.printed_eatt_cell(l, 512, 1.5, "asic")
    with pytest.raises(ValueError, match="asic, fpga"):
        E.printed_eatt_cell(l, 512, 0.5, "gpu")
    from fairseq_plugins.analysis import energy_cli

    md = tmp_path / "t2.md"
    energy_cli.main(["--md", str(md)])
    text = md.read_text()
    assert "ASIC 0.430 % (ρ = 0) to 0.440 % (ρ = 1); FPGA 0.046 % (ρ = 0) to 0.047 % (ρ = 1)" in text
    assert ("each head's L1 distance runs over d/h² = 8 dimensions; not in the paper): E-ATT ASIC 0.53 %; "
            "FPGA 0.06 % of vanilla's scores at ρ = 0.2; 0.44 % needs ρ = 0.1615 (ASIC) / 1.7051 (FPGA).") in text
    assert "- command: `fairseq-attention-energy --md " in text
    assert text.startswith("# Attention energy in the form of E-ATT Table 2\n\n**Regime: accounting**")


# ---- end to end on real data (short) ---------------------------------------------------------

from helpers import MULTI30K_RAW as RAW, ROOT, VENV_BIN as BIN, run_cli as _sh  # noqa: E402


@pytest.mark.skipif(not os.path.isdir(RAW), reason=f"real data not found at {RAW}")
def test_end_to_end_train_generate_energy(tmp_path):
    """eatt_transformer_small (tiny) on a 1,000-pair Multi30k slice: fairseq-train learns,
    fairseq-generate (beam 4) translates the test set, the energy CLI measures rho."""
    prep = tmp_path / "m30k"
    _sh(["bash", "data-prep/multi30k/prepare.sh", "--raw-dir", RAW, "--out", str(prep),
         "--train-lines", "1000", "--bpe-merges", "500"])
    ck = tmp_path / "ck"
    log = _sh([os.path.join(BIN, "fairseq-train"), str(prep / "bin"), "--user-dir", os.path.join(ROOT, "fairseq_plugins"),
               "--arch", "eatt_transformer_small", "--encoder-layers", "2", "--decoder-layers", "2",
               "--encoder-embed-dim", "32", "--decoder-embed-dim", "32", "--encoder-ffn-embed-dim", "64",
               "--decoder-ffn-embed-dim", "64", "--encoder-attention-heads", "2", "--decoder-attention-heads", "2",
               "--source-lang", "en", "--target-lang", "de", "--optimizer", "adam", "--lr", "0.003",
               "--lr-scheduler", "inverse_sqrt", "--warmup-updates", "20", "--criterion", "label_smoothed_cross_entropy",
               "--label-smoothing", "0.1", "--max-tokens", "2000", "--max-update", "60", "--save-dir", str(ck), "--cpu",
               "--no-epoch-checkpoints", "--log-format", "simple", "--num-workers", "0", "--seed", "1"])
    valid = [float(l.split("| loss ")[1].split()[0]) for l in log.splitlines() if "| valid |" in l]
    assert valid and math.isfinite(valid[-1])
    train = [float(l.split(" loss ")[1].split()[0]) for l in log.replace("=", " ").splitlines()
             if "| train_inner |" in l or "| train |" in l]
    assert train[-1] < train[0] - 1.0, train  # it learns
    out = _sh([os.path.join(BIN, "fairseq-generate"), str(prep / "bin"), "--user-dir", os.path.join(ROOT, "fairseq_plugins"),
               "--path", str(ck / "checkpoint_last.pt"), "--source-lang", "en", "--target-lang", "de", "--gen-subset",
               "test", "--beam", "4", "--batch-size", "200", "--cpu", "--remove-bpe"])
    assert sum(1 for l in out.splitlines() if l.startswith("H-")) == 1000
    js = tmp_path / "energy.json"
    _sh([sys.executable, "scripts/eatt_energy.py", "--checkpoint", str(ck / "checkpoint_last.pt"), "--data-bin",
         str(prep / "bin"), "--src", "en", "--tgt", "de", "--max-sentences", "50", "--json", str(js),
         "--plot", str(tmp_path / "rho.png"), "--md", str(tmp_path / "energy.md")])
    res = json.load(open(js))
    assert set(res["attention_fns"].values()) == {"eatt"}
    assert len(res["rho"]) == 2 * 2 + 2 * 2 + 2 * 2  # enc/dec self (query, key) + cross (query, key)
    assert all(0.0 <= v <= 1.0 for v in res["rho"].values())
    assert 0.0 < res["energy_scores_asic_pct"][0] < 100.0
    for part in ("scores", "block"):  # the absolute energies (E-ATT Figure 1) are the same counts in µJ
        for hw in ("asic", "fpga"):
            assert res[f"energy_{part}_{hw}_uJ"] == [pytest.approx(res[f"energy_{part}_{hw}_pJ_per_sentence"] / 1e6)]
    # µJ: the mean over the 50 sentences of each one's energy at its own lengths (fairseq's sizes,
    # EOS included), counted here sentence by sentence; the % column: the ratio at the mean lengths
    from fairseq.data import indexed_dataset

    sizes = []
    for lang in ("en", "de"):  # copy the sizes while the memory-mapped dataset is open
        ds = indexed_dataset.make_dataset(str(prep / "bin" / f"valid.en-de.{lang}"), impl="mmap")
        sizes.append([int(x) for x in ds.sizes[:50]])
        del ds
    lengths = list(zip(*sizes))
    assert res["l_src"] == pytest.approx(sum(a for a, _ in lengths) / 50)
    rho = {tuple(int(p) if p.isdigit() else p for p in k.split("/")): v for k, v in res["rho"].items()}
    fns, layers, van = res["attention_fns"], res["layers"], {k: "softmax" for k in res["attention_fns"]}
    for part in ("scores", "block"):
        for hw in ("asic", "fpga"):
            each = [E.energy_pj(E.total(E.model_ops(fns, layers, a, b, 32, 2, rho, part).values()), hw) for a, b in lengths]
            assert res[f"energy_{part}_{hw}_uJ"][0] == pytest.approx(sum(each) / 50 / 1e6, rel=1e-9)
            at_mean = [E.energy_pj(E.total(E.model_ops(f, layers, res["l_src"], res["l_tgt"], 32, 2, r, part).values()), hw)
                       for f, r in ((fns, rho), (van, None))]
            assert res[f"energy_{part}_{hw}_pJ_at_mean_lengths"] == pytest.approx(at_mean[0], rel=1e-9)
            assert res[f"energy_{part}_{hw}_pct"][0] == pytest.approx(100 * at_mean[0] / at_mean[1], rel=1e-9)
            assert abs(res[f"energy_{part}_{hw}_uJ"][0] * 1e6 / at_mean[0] - 1) > 1e-4  # the two differ
            # the gap between them, in % of the mean, for ours and vanilla attention (docs/eatt.md)
            each_van = [E.energy_pj(E.total(E.model_ops(van, layers, a, b, 32, 2, None, part).values()), hw)
                        for a, b in lengths]
            gap = res[f"energy_{part}_at_mean_lengths_below_mean_pct"]
            for key, per, at in ((hw, each, at_mean[0]), (f"vanilla_{hw}", each_van, at_mean[1])):
                mean = sum(per) / 50
                assert gap[key] == pytest.approx(100 * (mean - at) / mean, rel=1e-6, abs=1e-9)
    assert os.path.getsize(tmp_path / "rho.png") > 0
    md = (tmp_path / "energy.md").read_text()  # the Markdown names how to regenerate it
    assert "## Provenance" in md and "--max-sentences 50" in md and "- git commit: `" in md
    g = res["energy_scores_at_mean_lengths_below_mean_pct"]
    assert f"scores {g['asic']:.2f} % (ASIC) / {g['fpga']:.2f} % (FPGA) below the mean" in md
    # a checkpoint trained outside mt-experiment has no training record: the page says so
    assert res["model"]["run_dir"] is None and res["model"]["evidence"] is None
    assert res["provenance"]["git_commit"] and "--max-sentences 50" in res["provenance"]["command"]
    assert "**Regime: unstated**" in md and "**Evidence: none committed.**" in md
    assert "### Model model: `" in md and "- training run: none found" in md


def test_l1_scale_holds_scale_and_its_base_2_form():
    """The L1 kernels' SC argument, built with fills on the tensor's device (no host copy)."""
    import math

    from fairseq_plugins.attention.triton import _l1_scale

    sc = _l1_scale(0.125, torch.zeros(1, dtype=torch.float64))
    assert sc.dtype == torch.float64 and sc.tolist() == [0.125, 0.125 * math.log2(math.e)]
    assert _l1_scale(0.125, torch.zeros(1, dtype=torch.bfloat16)).dtype == torch.float32
