"""The chunked ReLU-attention kernel (ReLUFormer eq. 6/7) against the plain autograd reference."""

import pytest
import torch

import fairseq_plugins.attention.kernels as K
from fairseq_plugins.attention.kernels import relu_attention, relu_attention_reference

F64 = torch.float64


@pytest.fixture(params=[1, 2], ids=["1thread", "2threads"])
def threads(request):
    """Run a test with 1 (serial kernel) and 2 (thread-split kernel) intra-op threads."""
    n0 = torch.get_num_threads()
    torch.set_num_threads(request.param)
    yield request.param
    torch.set_num_threads(n0)


def qkv(B, H, T, S, d, dtype=F64, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = (torch.randn(B, H, T, d, generator=g, dtype=dtype) * d**-0.5).requires_grad_()
    k = torch.randn(B, H, S, d, generator=g, dtype=dtype).requires_grad_()
    v = torch.randn(B, H, S, d, generator=g, dtype=dtype).requires_grad_()
    return q, k, v


def masks(B, H, T, S, seed=0):
    """name -> mask: none, key padding, query padding, general (with a fully masked row)."""
    g = torch.Generator().manual_seed(seed)
    kp = torch.zeros(B, 1, 1, S, dtype=torch.bool)
    kp[-1, ..., S - S // 3:] = True  # last sequence padded
    qm = torch.zeros(B, 1, T, 1, dtype=torch.bool)
    qm[0, 0, -2:] = True
    general = torch.rand(B, H, T, S, generator=g) < 0.3
    general[0, 0, 1] = True  # one query row fully masked
    return {"none": None, "key_pad": kp, "query": qm, "general": general}


def run(fn, q, k, v, r, need_stats, upstream, **kw):
    """Forward, a loss through every output, and the grads of q, k, v."""
    res = fn(q, k, v, r, need_stats=need_stats, **kw)
    outs = [res[0], *res[1]] if need_stats else [res]
    loss = sum((o * u).sum() for o, u in zip(outs, upstream))
    grads = torch.autograd.grad(loss, (q, k, v))
    return [o.detach() for o in outs], grads


def upstreams(B, H, T, d, dtype=F64, seed=1):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(B, H, T, d, generator=g, dtype=dtype),
            torch.randn(B, H, T, generator=g, dtype=dtype),
            torch.randn(B, H, T, generator=g, dtype=dtype) * 0.1]


# --------------------------------------------------------------------------------------------
# gradcheck of the chunked path
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("mask_name", ["none", "key_pad", "query", "general"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("need_stats", [False, True])
def test_gradcheck_chunked(mask_name, causal, need_stats, threads):
    B, H, T, S, d = 2, 2, 7, 6, 3
    q, k, v = qkv(B, H, T, S, d, seed=3)
    mask = masks(B, H, T, S)[mask_name]
    r = torch.rand(B, 1, T, 1, dtype=F64) + 0.5

    def fn(q, k, v):
        res = relu_attention(q, k, v, r, mask=mask, need_stats=need_stats, chunk_size=3, causal=causal)
        return (res[0], *res[1]) if need_stats else res

    assert torch.autograd.gradcheck(fn, (q, k, v), atol=1e-6, rtol=1e-4)


def test_gradcheck_single_head_splits_chunks_over_threads(threads):
    """B*H = 1 < threads: query chunks are dealt to threads and dK, dV partials summed."""
    q, k, v = qkv(1, 1, 9, 8, 3, seed=4)

    def fn(q, k, v):
        out, (a, b) = relu_attention(q, k, v, 0.7, need_stats=True, chunk_size=2, causal=True)
        return out, a, b

    assert torch.autograd.gradcheck(fn, (q, k, v), atol=1e-6, rtol=1e-4)


@pytest.mark.parametrize("causal", [False, True])
def test_gradcheck_reference_stats(causal):
    """The plain path's hand-written statistics backward, checked the same way."""
    q, k, v = qkv(2, 1, 6, 5, 3, seed=9)
    mask = masks(2, 1, 6, 5)["key_pad"]

    def fn(q, k, v):
        out, (a, b) = relu_attention_reference(q, k, v, 0.8, mask=mask, need_stats=True, causal=causal)
        return out, a, b

    assert torch.autograd.gradcheck(fn, (q, k, v), atol=1e-6, rtol=1e-4)


# --------------------------------------------------------------------------------------------
# parity with the reference at T = S ~ 300
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("mask_name", ["none", "key_pad", "query", "general"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("block", ["default", "one_head"])
def test_parity_with_reference(mask_name, causal, block, threads, monkeypatch):
    if block == "one_head":  # force one head per GEMM (in-place accumulator path)
        monkeypatch.setattr(K, "BLOCK_ELEMS", 1024)
    B, H, T, S, d = 2, 3, 300, 290, 8
    q, k, v = qkv(B, H, T, S, d, seed=5)
    with torch.no_grad():
        q[1, 2, 10] = 0.0  # a row without any positive score
    mask = masks(B, H, T, S)[mask_name]
    r = torch.rand(B, H, T, 1, dtype=F64) + 0.1
    r[0, 0, 3] = float("inf")  # 1/0 of a row with n_i = 0: counts as 0
    up = upstreams(B, H, T, d)
    outs, grads = run(relu_attention, q, k, v, r, True, up, mask=mask, chunk_size=64, causal=causal)
    ref_outs, ref_grads = run(relu_attention_reference, q, k, v, r, True, up, mask=mask, causal=causal)
    for a, b in zip(outs + list(grads), ref_outs + list(ref_grads)):
        assert torch.isfinite(a).all()
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-9)
    # rows that must be exact zeros: no positive score, scale 1/0, fully masked
    dead = [(1, 2, 10), (0, 0, 3)]
    if mask_name == "general":
        dead.append((0, 0, 1))
    if mask_name == "query":
        dead += [(0, h, T - 1) for h in range(H)]
    if causal:  # S < T: the first T - S queries see no key at all
        dead += [(b, h, t) for b in range(B) for h in range(H) for t in range(T - S)]
    for idx in dead:
        for o in outs:
            assert (o[idx] == 0).all()
        assert (grads[0][idx] == 0).all()


def test_parity_float32_default_chunk():
    B, H, T, S, d = 1, 2, 257, 300, 16
    q, k, v = qkv(B, H, T, S, d, dtype=torch.float32, seed=6)
    kp = torch.zeros(B, 1, 1, S, dtype=torch.bool)
    kp[..., -20:] = True
    up = upstreams(B, H, T, d, dtype=torch.float32)
    outs, grads = run(relu_attention, q, k, v, 0.3, True, up, mask=kp, chunk_size=K._default_chunk(S))
    ref_outs, ref_grads = run(relu_attention_reference, q, k, v, 0.3, True, up, mask=kp)
    for a, b in zip(outs + list(grads), ref_outs + list(ref_grads)):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)


def test_thread_setting_is_restored():
    n0 = torch.get_num_threads()
    q, k, v = qkv(1, 4, 40, 40, 4)
    out = relu_attention(q, k, v, 1.0, chunk_size=16)
    assert torch.get_num_threads() == n0
    out.sum().backward()
    assert torch.get_num_threads() == n0


# --------------------------------------------------------------------------------------------
# dropout
# --------------------------------------------------------------------------------------------
def dropout_mask(seed, B, H, T, S, chunk, causal, p):
    """The kernel's dropout mask (True = dropped), rebuilt from its per-(head, chunk) streams."""
    dropped = torch.zeros(B * H, T, S, dtype=torch.bool)
    for idx, t0 in enumerate(range(0, T, chunk)):
        t1 = min(T, t0 + chunk)
        kend = min(S, max(0, t1 + S - T)) if causal else S
        if kend:
            dropped[:, t0:t1, :kend] = K._dropped(seed, 0, B * H, idx, (t1 - t0, kend), p, "cpu")
    return dropped.view(B, H, T, S)


@pytest.mark.parametrize("causal", [False, True])
def test_dropout_matches_autograd_with_recovered_mask(causal, threads):
    B, H, T, S, d, p, chunk = 2, 2, 50, 45, 4, 0.3, 16
    q, k, v = qkv(B, H, T, S, d, seed=7)
    r = torch.rand(B, 1, T, 1, dtype=F64) + 0.5
    up = upstreams(B, H, T, d)
    torch.manual_seed(123)
    outs, grads = run(relu_attention, q, k, v, r, True, up, dropout_p=p, chunk_size=chunk, causal=causal)
    torch.manual_seed(123)
    outs2, grads2 = run(relu_attention, q, k, v, r, True, up, dropout_p=p, chunk_size=chunk, causal=causal)
    for a, b in zip(outs + list(grads), outs2 + list(grads2)):
        assert torch.equal(a, b)  # same RNG state -> identical forward and backward

    torch.manual_seed(123)
    seed = int(torch.randint(0, 2**62, (1,)).item())  # what the kernel drew
    dropped = dropout_mask(seed, B, H, T, S, chunk, causal, p)
    frac = dropped[..., :S].float().mean().item() if not causal else None
    if frac is not None:
        assert abs(frac - p) < 0.05

    def explicit(q, k, v, r, need_stats, mask=None, causal=False):
        s = torch.relu(q @ k.transpose(-1, -2) * r)
        if causal:
            s = s.masked_fill(K._causal_mask(T, S, "cpu"), 0.0)
        stats = (s.sum(-1), torch.where(s > 0, s * s.clamp(min=1e-300).log(), s.new_zeros(())).sum(-1))
        out = (s.masked_fill(dropped, 0.0) / (1 - p)) @ v
        return out, stats

    ref_outs, ref_grads = run(explicit, q, k, v, r, True, up, causal=causal)
    for a, b in zip(outs + list(grads), ref_outs + list(ref_grads)):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-9)
    # the statistics are taken before dropout
    no_drop, _ = run(relu_attention, q, k, v, r, True, up, chunk_size=chunk, causal=causal)
    torch.testing.assert_close(outs[1], no_drop[1])
    torch.testing.assert_close(outs[2], no_drop[2])


@pytest.mark.parametrize("H", [3, 1], ids=["heads_split", "chunks_dealt"])
def test_dropout_mask_does_not_depend_on_thread_split(H, monkeypatch):
    """Same mask, output and gradients with 1 and 2 threads, in both of _Plan's thread splits:
    B*H >= threads splits the heads; B*H = 1 deals the query chunks out (checked on the plan)."""
    plans = []

    class Recorded(K._Plan):
        def __init__(self, *args):
            super().__init__(*args)
            plans.append(self)

    monkeypatch.setattr(K, "_Plan", Recorded)
    q, k, v = qkv(1, H, 20, 20, 4, seed=8)  # chunks of 8: rows 0:8, 8:16, 16:20
    results = []
    n0 = torch.get_num_threads()
    try:
        for n in (1, 2):
            torch.set_num_threads(n)
            torch.manual_seed(5)
            out = relu_attention(q, k, v, 1.0, dropout_p=0.5, chunk_size=8)
            results.append(torch.autograd.grad(out.sum(), (q, k, v)) + (out,))
    finally:
        torch.set_num_threads(n0)
    tasks = plans[-1].tasks  # the 2-thread backward's
    if H == 1:  # two tasks over all heads, the three chunks dealt out between them
        assert len(tasks) == 2 and all(t[:2] == (0, 1) for t in tasks)
        assert sorted(tasks[0][2] + tasks[1][2]) == [0, 1, 2]
    else:
        assert tasks == [(0, 1, [0, 1, 2]), (1, 3, [0, 1, 2])]
    for a, b in zip(*results):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
    assert not torch.allclose(results[1][-1], relu_attention(q, k, v, 1.0, chunk_size=8))  # dropout applied


# --------------------------------------------------------------------------------------------
# dispatch and errors
# --------------------------------------------------------------------------------------------
def test_dispatch_small_to_plain_large_to_chunked():
    q, k, v = qkv(1, 4, 64, 64, 8, dtype=torch.float32)
    assert "Chunked" not in relu_attention(q, k, v, 1.0).grad_fn.name()
    assert "Chunked" in relu_attention(q, k, v, 1.0, chunk_size=32).grad_fn.name()
    T = 1024  # T*S > SMALL_TS: chunked from B*H*T*S = MIN_SCORES on
    BH = K.MIN_SCORES // (T * T)
    q, k, v = qkv(1, BH, T, T, 2, dtype=torch.float32)
    assert "Chunked" in relu_attention(q, k, v, 1.0).grad_fn.name()
    assert "Chunked" not in relu_attention(q[:, 1:], k[:, 1:], v[:, 1:], 1.0).grad_fn.name()
    T = 128  # T*S = SMALL_TS: plain however many heads
    q, k, v = qkv(1, K.MIN_SCORES // (T * T), T, T, 2, dtype=torch.float32)
    assert "Chunked" not in relu_attention(q, k, v, 1.0).grad_fn.name()
    qb, kb, vb = (x.detach().bfloat16().requires_grad_() for x in (q, k, v))
    assert "Chunked" not in relu_attention(qb, kb, vb, 1.0).grad_fn.name()  # plain for bf16


@pytest.mark.parametrize("case, match", [
    (dict(k=torch.zeros(2, 3, 5, 7)), r"\(B, H, S, d\)"),
    (dict(q=torch.zeros(2, 3, 4)), r"\(B, H, T\|S, d\)"),
    (dict(v=torch.zeros(2, 3, 5, 4, dtype=F64)), "dtype"),
    (dict(q=torch.zeros(2, 3, 4, 4, dtype=torch.long)), "floating point"),
    (dict(row_scale=torch.ones(2, 3, 5, 1)), r"\(B\|1, H\|1, T, 1\)"),
    (dict(row_scale="x"), r"\(B\|1, H\|1, T, 1\)"),
    (dict(mask=torch.zeros(2, 3, 4, 5)), "bool"),
    (dict(mask=torch.zeros(2, 3, 4, 6, dtype=torch.bool)), r"\(B, H, T, S\)"),
    (dict(mask=torch.zeros(3, 1, 1, 5, dtype=torch.bool)), r"\(B, H, T, S\)"),  # B 3 against 2
    (dict(mask=torch.zeros(1, 2, 3, 4, 5, dtype=torch.bool)), r"\(B, H, T, S\)"),  # 5 axes
    (dict(dropout_p=1.0), r"\[0, 1\)"),
    (dict(chunk_size=0), "chunk_size"),
    (dict(chunk_size=8, q=torch.zeros(2, 3, 4, 4, dtype=torch.bfloat16),
          k=torch.zeros(2, 3, 5, 4, dtype=torch.bfloat16), v=torch.zeros(2, 3, 5, 4, dtype=torch.bfloat16)),
     "float32 or float64"),
])
def test_bad_arguments_raise_value_error(case, match):
    args = dict(q=torch.zeros(2, 3, 4, 4), k=torch.zeros(2, 3, 5, 4), v=torch.zeros(2, 3, 5, 4), row_scale=1.0)
    args.update(case)
    with pytest.raises(ValueError, match=match):
        relu_attention(**args)
    if "chunk_size" not in case:
        with pytest.raises(ValueError, match=match):
            relu_attention_reference(**args)
