"""The decoder's future mask through the attention seam (issue 28, "causal and padding through
the seam").

FunctionalMultiheadAttention hands every attention function the compact ``key_padding_mask``
``(B, 1, 1, S)`` plus ``causal=True`` when fairseq's ``attn_mask`` is exactly the causal pattern
(keys ``j > i + (S - T)`` blocked), instead of one dense ``(B, 1, T, S)`` mask: the fused paths use
SDPA's ``is_causal`` / the Triton kernels' ``causal`` with mask mode 1, ReLUFormer's eq. 6 ``n_i``
comes from key counts and positions, and no layer reads a value back to the host.  Here:

* the new path equals the old one (the dense combined mask) for every registered function to
  float64 precision -- outputs, weights, eq. 7 terms, gradients -- for right- and left-padded keys,
  ``T == S`` and ``T < S`` (queries continuing a cached prefix), fully masked rows exactly zero;
* the Triton entry points get ``causal=True`` and a mode-1 mask (spied, under the interpreter);
* ``keys_per_query`` equals ``valid_keys`` of the combined mask;
* no host sync inside an attention forward (spied Tensor methods on CPU; meta tensors, which
  refuse every read-back), the ``attn_mask`` check runs once per new mask, not per layer.
"""

import argparse
import contextlib

import pytest
import torch

import fairseq_plugins.attention.multihead as mh
import fairseq_plugins.attention.triton as tk
from fairseq_plugins.attention import FunctionalMultiheadAttention, attention_fn_names, build_attention_fn
from fairseq_plugins.attention.masks import causal_mask, combined_mask
from fairseq_plugins.attention.stats import keys_per_query, valid_keys

from helpers import build, toy_batch

C, H, B = 16, 2, 3
F64 = torch.float64
NAMES = attention_fn_names()
needs_triton = pytest.mark.skipif(not tk.triton_available(),
                                  reason="triton is not installed (pip install -e .[gpu])")


def padding(kind, bsz, S):
    """``(B, S)`` key_padding_mask: right- or left-padded sentences 0 and 1, sentence 2 all padding."""
    kp = torch.zeros(bsz, S, dtype=torch.bool)
    if kind == "right":
        kp[0, S - 2:] = True
        kp[1, S - 1:] = True
    elif kind == "left":
        kp[0, :2] = True
        kp[1, :1] = True
    if kind != "none":
        kp[2] = True
    return kp


def future(T, S, dtype=F64):
    """fairseq's float future mask, bottom-right aligned: ``-inf`` at keys ``j > i + (S - T)``."""
    return torch.zeros(T, S, dtype=dtype).masked_fill(causal_mask(T, S), float("-inf"))


# --------------------------------------------------------------------------------------------
# ReLUFormer eq. 6: n_i from key counts and positions
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["none", "right", "left", "general"])
@pytest.mark.parametrize("T,S", [(6, 6), (3, 7), (1, 5), (7, 4), (0, 3)])
@pytest.mark.parametrize("causal", [False, True])
def test_keys_per_query_equals_valid_keys_of_the_combined_mask(kind, T, S, causal):
    if kind == "general":
        mask = torch.rand(B, 1, T, S, generator=torch.Generator().manual_seed(0)) < 0.4
    else:
        mask = None if kind == "none" else padding(kind, B, S).view(B, 1, 1, S)
    n = keys_per_query(mask, causal, T, S)
    ref = valid_keys(combined_mask(mask, causal, T, S), S)
    assert n.dtype == torch.float32 and n.shape == ref.shape
    assert torch.equal(n, ref)


def test_keys_per_query_hand_computed():
    """Causal with left padding: query i sees the non-padding keys j <= i (+ S - T)."""
    kp = torch.tensor([[True, True, False, False, False], [False, False, False, False, True]])
    n = keys_per_query(kp.view(2, 1, 1, 5), True, 5, 5)
    assert n.view(2, 5).tolist() == [[0, 0, 1, 2, 3], [1, 2, 3, 4, 4]]
    n = keys_per_query(kp.view(2, 1, 1, 5), True, 2, 5)  # the last two queries of the five
    assert n.view(2, 2).tolist() == [[2, 3], [4, 4]]
    assert keys_per_query(None, True, 3, 4).view(-1).tolist() == [2, 3, 4]
    assert keys_per_query(None, False, 3, 4).view(-1).tolist() == [4]


def test_reluformer_n_from_the_seam_equals_valid_keys_of_the_dense_mask():
    """The fused path's n_i (key padding + causal, no T x S scan) equals valid_keys of the dense
    combined mask, per query; and it is built on the inputs' device, never copied there."""
    f = build_attention_fn("reluformer", C, H)
    seen = []
    orig = f.row_scale
    f.row_scale = lambda n, *args: (seen.append(n), orig(n, *args))[1]
    m = FunctionalMultiheadAttention(C, H, f, self_attention=True)
    x = torch.randn(6, B, C)
    for kind in ("right", "left"):
        kp = padding(kind, B, 6)
        m(x, x, x, key_padding_mask=kp, attn_mask=future(6, 6, torch.float32), need_weights=False)
        ref = valid_keys(combined_mask(kp.view(B, 1, 1, 6), True, 6, 6), 6)
        assert torch.equal(seen[-1], ref)


# --------------------------------------------------------------------------------------------
# the module: which masks become the causal flag, checked once per mask
# --------------------------------------------------------------------------------------------
def test_future_mask_reaches_the_functions_as_a_flag():
    build_mask = FunctionalMultiheadAttention._build_mask
    kp = padding("right", B, 5)
    mask, causal = build_mask(kp, future(5, 5), B, 5)
    assert causal and mask.shape == (B, 1, 1, 5) and torch.equal(mask.view(B, 5), kp)
    assert build_mask(None, causal_mask(3, 7), 1, 7) == (None, True)  # bool, bottom-right, T < S
    assert build_mask(None, future(3, 7), 1, 7) == (None, True)
    for other in (torch.ones(3, 7, dtype=torch.bool).triu(1),  # top-left aligned
                  future(5, 5).t().contiguous(),  # past blocked
                  future(7, 4)):  # T > S
        S = other.size(1)
        m, c = build_mask(padding("left", B, S), other, B, S)
        dense = padding("left", B, S).view(B, 1, 1, S) | mh.attn_mask_to_bool(other)
        assert not c and torch.equal(m, dense)


@contextlib.contextmanager
def counting(method="tolist"):
    calls = []
    orig = getattr(torch.Tensor, method)

    def spy(self, *a, **kw):
        calls.append(method)
        return orig(self, *a, **kw)

    setattr(torch.Tensor, method, spy)
    try:
        yield calls
    finally:
        setattr(torch.Tensor, method, orig)


def test_mask_check_is_one_sync_per_new_mask():
    buf = future(8, 8, torch.float32)
    with counting() as calls:
        for _ in range(3):  # layers and forwards reuse views of the decoder's buffered mask
            assert mh.check_attn_mask(buf[:6, :6])[1]
    assert len(calls) == 1
    with counting() as calls:
        assert mh.check_attn_mask(buf[:8, :8])[1] and mh.check_attn_mask(buf[:8, :8])[1]
    assert len(calls) == 1  # a new length: one more


# --------------------------------------------------------------------------------------------
# new path == old path (dense mask), every registered function, float64
# --------------------------------------------------------------------------------------------
def module(name, backend="torch", dtype=F64):
    torch.manual_seed(0)
    fn = build_attention_fn(name, C, H, argparse.Namespace(attention_backend=backend))
    fn.aux.enabled = True  # eq. 7 terms recorded, as the criterion does
    m = FunctionalMultiheadAttention(C, H, fn, self_attention=True).to(dtype).train()
    with torch.no_grad():
        m.out_proj.bias.zero_()  # a fully masked row then gives an exactly zero output
    return m


def decoder_self_attention(m, x, kp, prefix, need_weights):
    """Decoder self-attention with fairseq's future mask: all of ``x`` at once (``prefix=0``,
    ``T == S``), or the first ``prefix`` tokens and then the rest with the cache (``T < S``, the
    mask aligned bottom-right).  Returns ``(out, weights)`` of the last call."""
    L = x.size(0)
    if prefix == 0:  # (without key padding, softmax's fused path is SDPA with is_causal=True)
        return m(x, x, x, key_padding_mask=kp, attn_mask=future(L, L, x.dtype), need_weights=need_weights)
    state = {}
    p = x[:prefix]
    m(p, p, p, key_padding_mask=None if kp is None else kp[:, :prefix], attn_mask=future(prefix, prefix, x.dtype),
      incremental_state=state, need_weights=False)
    r = x[prefix:]
    return m(r, r, r, key_padding_mask=None if kp is None else kp[:, prefix:], attn_mask=future(L - prefix, L, x.dtype),
             incremental_state=state, need_weights=need_weights)


def run(name, kind, prefix, need_weights, backend="torch"):
    m = module(name, backend)
    L = 7
    x = torch.randn(L, B, C, dtype=F64, generator=torch.Generator().manual_seed(1)).requires_grad_()
    kp = padding(kind, B, L)
    y, w = decoder_self_attention(m, x, None if kind == "none" else kp, prefix, need_weights)
    terms = {k: v[0] for k, v in m.attn_fn.aux.pop().items()}
    loss = (y * torch.randn(y.shape, dtype=F64, generator=torch.Generator().manual_seed(2))).sum()
    for key in ("reluformer_norm", "reluformer_entropy"):
        if key in terms:
            loss = loss + terms[key]
    loss.backward()
    grads = {n: p.grad for n, p in m.named_parameters() if p.grad is not None}
    grads["x"] = x.grad
    return y.detach(), w, {k: v.detach() for k, v in terms.items()}, grads, kp


@pytest.mark.parametrize("need_weights", [False, True], ids=["fused", "weights"])
@pytest.mark.parametrize("prefix", [0, 4], ids=["T==S", "T<S"])
@pytest.mark.parametrize("kind", ["none", "right", "left"])
@pytest.mark.parametrize("name", NAMES)
def test_causal_flag_equals_the_dense_mask(name, kind, prefix, need_weights, monkeypatch):
    new = run(name, kind, prefix, need_weights)
    with monkeypatch.context() as mp:
        check = mh.check_attn_mask
        mp.setattr(mh, "check_attn_mask", lambda am: (check(am)[0], False))
        old = run(name, kind, prefix, need_weights)
    (y, w, terms, grads, kp), (y0, w0, terms0, grads0, _) = new, old
    torch.testing.assert_close(y, y0, rtol=1e-12, atol=1e-12)
    if need_weights:
        torch.testing.assert_close(w, w0, rtol=1e-12, atol=1e-12)
    assert terms.keys() == terms0.keys()
    for k in terms:
        torch.testing.assert_close(terms[k].double(), terms0[k].double(), rtol=1e-12, atol=1e-12)
    assert grads.keys() == grads0.keys()
    for k in grads:
        torch.testing.assert_close(grads[k], grads0[k], rtol=1e-10, atol=1e-12, msg=k)
    # fully masked rows (sentence 2; a left-padded sentence's first queries) are exactly zero
    L, T = kp.size(1), y.size(0)
    dead = combined_mask(kp.view(B, 1, 1, L), True, T, L).all(-1).view(B, T).t()  # (T, B)
    assert dead[:, 2].all() == (kind != "none")
    assert torch.equal(y[dead], torch.zeros_like(y[dead])) and torch.isfinite(grads["x"]).all()


# --------------------------------------------------------------------------------------------
# Triton entry points: causal=True and a mode-1 (key padding) mask
# --------------------------------------------------------------------------------------------
@needs_triton
@pytest.mark.parametrize("name", ["rela_g", "reluformer", "eatt"])
def test_triton_gets_causal_and_a_key_padding_mask(name, monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    calls, modes = [], []
    mask_args = tk._mask_args

    def spy_mask_args(*a):
        res = mask_args(*a)
        modes.append(res[2])
        return res

    monkeypatch.setattr(tk, "_mask_args", spy_mask_args)
    for entry in ("relu_attention", "l1_softmax_attention"):
        def spy(*a, _orig=getattr(tk, entry), _entry=entry, **kw):
            calls.append((_entry, kw.get("causal"), kw.get("mask")))
            return _orig(*a, **kw)

        monkeypatch.setattr(tk, entry, spy)
    y, _, terms, grads, kp = run(name, "left", 0, False, backend="triton")
    assert len(calls) == 1
    entry, causal, mask = calls[0]
    assert entry == ("l1_softmax_attention" if name == "eatt" else "relu_attention")
    assert causal is True and mask.shape == (B, 1, 1, 7) and torch.equal(mask.view(B, 7), kp)
    assert modes and set(modes) == {1}  # forward and backward read the mask once per key tile
    # the torch backend (checked against the dense mask above); ReLUFormer's row scale r_i (eq. 6)
    # is float32 in both backends, folded with d_h^-1/2 before rounding on the Triton path only
    y0, _, terms0, grads0, _ = run(name, "left", 0, False, backend="torch")
    rel = 1e-7 if name == "reluformer" else 1e-11  # of the largest magnitude

    def close(a, b, msg=None):
        torch.testing.assert_close(a, b, rtol=rel, atol=rel * max(1.0, float(b.abs().max())), msg=msg)

    close(y, y0)
    for k in terms0:
        close(terms[k].double(), terms0[k].double(), msg=k)
    for k in grads0:
        close(grads[k], grads0[k], msg=k)


# --------------------------------------------------------------------------------------------
# no host sync in a layer forward
# --------------------------------------------------------------------------------------------
#: Tensor methods that read values back to the host (a device sync on a GPU)
SYNCS = ("item", "tolist", "__bool__", "__int__", "__float__", "__index__", "cpu", "numpy", "nonzero")
# synth_random checks its query positions against --synth-max-len: a read-back where no static
# bound is known, i.e. in cross-attention while decoding with a cache (the query offset lives in
# the incremental state); in training and in self-attention the bound is S or T (q_bound)


@contextlib.contextmanager
def sync_spy(model, also=()):
    """Record the read-backs made while any FunctionalMultiheadAttention of ``model`` runs, or
    any of the methods ``also`` (``(object, name)`` pairs, e.g. the decoder's reorder of its
    incremental state, which is no forward)."""
    active, hits = [0], []
    saved = {}
    for meth in SYNCS:
        orig = saved[meth] = getattr(torch.Tensor, meth)

        def spy(self, *a, _orig=orig, _meth=meth, **kw):
            if active[0]:
                hits.append(_meth)
            return _orig(self, *a, **kw)

        setattr(torch.Tensor, meth, spy)
    orig_equal = torch.equal

    def equal(*a):
        if active[0]:
            hits.append("torch.equal")
        return orig_equal(*a)

    torch.equal = equal
    handles = []
    for m in model.modules():
        if isinstance(m, FunctionalMultiheadAttention):
            handles.append(m.register_forward_pre_hook(lambda *_: active.__setitem__(0, active[0] + 1)))
            handles.append(m.register_forward_hook(lambda *_: active.__setitem__(0, active[0] - 1)))
    for obj, attr in also:

        def counted(*a, _orig=getattr(obj, attr), **kw):
            active[0] += 1
            try:
                return _orig(*a, **kw)
            finally:
                active[0] -= 1

        setattr(obj, attr, counted)  # an instance attribute, shadowing the method
    try:
        yield hits
    finally:
        for meth, orig in saved.items():
            setattr(torch.Tensor, meth, orig)
        torch.equal = orig_equal
        for h in handles:
            h.remove()
        for obj, attr in also:
            delattr(obj, attr)


@pytest.mark.parametrize("name", NAMES)
def test_no_host_sync_in_training_and_beam_decoding(name):
    """A whole model: the first training forward checks the future mask once (one read-back for
    all decoder layers); a second forward of the same length and every step of beam-searched
    incremental decoding (cross-attention folding the beams, the last layer's weights for
    alignment, and before every step but the first the decoder's reorder of its incremental
    state by a non-trivial beam order, as SequenceGenerator does) read nothing back inside the
    attention modules or the reorder."""
    torch.manual_seed(0)
    model, task = build("attention_transformer", encoder_attention_fn=name, decoder_attention_fn=name,
                        cross_attention_fn=name, attention_backend="torch", attention_dropout=0.1)
    src, src_lengths, prev = toy_batch(task, bsz=3, src_len=7, tgt_len=6)
    prev[0, 4:] = task.target_dictionary.pad()
    for m in model.modules():
        if isinstance(m, FunctionalMultiheadAttention):
            m.attn_fn.aux.enabled = True
    model.train()
    with sync_spy(model) as hits:
        model(src, src_lengths, prev)
    assert hits == ["tolist"]  # check_attn_mask: once, for the first decoder layer
    with sync_spy(model) as hits:
        model(src, src_lengths, prev)[0].sum().backward()
    assert hits == []
    model.eval()
    beam = 2
    with torch.no_grad():
        enc = model.encoder(src, src_lengths=src_lengths)
        enc = model.encoder.reorder_encoder_out(enc, torch.arange(3).repeat_interleave(beam))
        model.decoder.set_beam_size(beam)
        state, tokens = {}, prev.repeat_interleave(beam, 0)
        offsets = (torch.arange(3) * beam).repeat_interleave(beam)
        parents = (torch.tensor([1, 0]), torch.tensor([1, 1]))  # beams swapped / both from beam 1
        with sync_spy(model, also=[(model.decoder, "reorder_incremental_state_scripting")]) as hits:
            for t in range(tokens.size(1)):
                if t:  # the hypotheses of every sentence continue other beams of it
                    order = offsets + parents[t % 2].repeat(3)
                    model.decoder.reorder_incremental_state_scripting(state, order)
                    enc = model.encoder.reorder_encoder_out(enc, order)
                    tokens = tokens.index_select(0, order)
                model.decoder(tokens[:, :t + 1], encoder_out=enc, incremental_state=state)
    if name == "synth_random":  # one max() per cross-attention layer and step, nothing else
        assert hits == ["__int__"] * (len(model.decoder.layers) * tokens.size(1))
    else:
        assert hits == []


@pytest.mark.parametrize("name", NAMES)
def test_no_host_sync_or_host_tensor_on_a_device(name, monkeypatch):
    """The layer on the meta device (no data: every read-back raises), training mode with
    dropout, key padding + causal: nothing is read back and no host tensor is copied to the
    device (``valid_keys(None)`` used to build ``n`` on the CPU and ``.to(device)`` it in every
    layer).  The attn_mask check itself is the one permitted sync and is stubbed here."""
    torch.manual_seed(0)
    fn = build_attention_fn(name, C, H)
    fn.aux.enabled = True
    m = FunctionalMultiheadAttention(C, H, fn, self_attention=True, dropout=0.1).train().to("meta")
    monkeypatch.setattr(mh, "check_attn_mask", lambda am: (torch.isneginf(am), True))
    copies = []
    to = torch.Tensor.to

    def spy_to(self, *a, **kw):
        out = to(self, *a, **kw)
        if self.device.type == "cpu" and out.device.type != "cpu":
            copies.append(tuple(self.shape))
        return out

    monkeypatch.setattr(torch.Tensor, "to", spy_to)
    x = torch.randn(6, B, C, device="meta", requires_grad=True)
    kp = torch.zeros(B, 6, dtype=torch.bool, device="meta")
    am = torch.zeros(6, 6, device="meta")
    for pad in (kp, None):
        for mask in (am, None):
            for need_weights in (False, True):
                y, _ = m(x, x, x, key_padding_mask=pad, attn_mask=mask, need_weights=need_weights)
                assert y.device.type == "meta"
        state = {}
        for t in range(3):  # incremental decoding, T = 1
            y, _ = m(x[t:t + 1], x[t:t + 1], x[t:t + 1], key_padding_mask=None if pad is None else pad[:, :1],
                     incremental_state=state, need_weights=False)
    assert copies == []
