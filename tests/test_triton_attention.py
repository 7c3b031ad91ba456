"""The fused Triton kernels (``fairseq_plugins.attention.triton``) against the PyTorch path.

On CPU the kernels run under Triton's interpreter (``TRITON_INTERPRET=1``, set per test: the
kernel modules are built once per mode, see the package docstring), so shapes are tiny; T and S
are chosen not to be multiples of the interpreter's 16-wide tiles.  The CUDA tests (compiled
kernels, bf16/fp16) are skipped without a GPU.  Tests that need triton skip with a reason when it
is not installed (``pip install -e .[gpu]``); the backend-selection errors are tested without it.
"""

import argparse
import logging

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import fairseq_plugins.attention.backend as backend
import fairseq_plugins.attention.triton as tk
from fairseq_plugins.attention import FunctionalMultiheadAttention, attention_fn_names, build_attention_fn
from fairseq_plugins.attention.kernels import relu_attention_reference
from helpers import needs_cuda, needs_triton

F64, F32 = torch.float64, torch.float32


@pytest.fixture(params=["split", "fused"])
def l1_bwd(request):
    """E-ATT's backward path (``tk.set_l1_backward``): the two deterministic kernels, or the fused
    one with the dQ sums by atomic adds; reset to the default afterwards."""
    tk.set_l1_backward(request.param)
    yield request.param
    tk.set_l1_backward(None)


@pytest.fixture(params=["fused", "split"])
def bwd(request):
    """The rectified backward path (``tk.set_rect_backward``): the fused 5-GEMM kernel with
    atomic dQ, or the two deterministic kernels; reset to the default afterwards."""
    tk.set_rect_backward(request.param)
    yield request.param
    tk.set_rect_backward(None)


def qkv(B, H, T, S, d, dtype=F64, seed=0, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, T, d, generator=g, dtype=F64) * d ** -0.5
    k = torch.randn(B, H, S, d, generator=g, dtype=F64)
    v = torch.randn(B, H, S, d, generator=g, dtype=F64)
    return [x.to(device, dtype).requires_grad_() for x in (q, k, v)]


def make_mask(kind, B, H, T, S, seed=0):
    """Bool masks as the attention module builds them, ``(B|1, 1, T|1, S)``, True = blocked."""
    g = torch.Generator().manual_seed(seed)
    if kind == "none":
        return None
    kp = torch.zeros(B, 1, 1, S, dtype=torch.bool)
    if kind in ("left", "causal_left", "dead"):
        kp[-1, ..., : S // 3] = True  # left padding (fairseq sources)
    if kind in ("right", "dead"):
        kp[0, ..., S - S // 4:] = True  # right padding (targets)
    if kind == "dead":
        kp[0] = True  # batch item 0: every key padded -> fully masked rows
    if kind == "causal_left":  # fairseq's future mask combined with padding: a general mask
        return kp | torch.ones(T, S, dtype=torch.bool).triu(S - T + 1)
    if kind == "general":
        m = torch.rand(B, 1, T, S, generator=g) < 0.3
        m[0, 0, 1] = True  # one fully masked row
        return m
    return kp


def grads_of(outs, ups, inputs):
    loss = sum((o.double() * u).sum() for o, u in zip(outs, ups))
    return torch.autograd.grad(loss, inputs)


def upstream(shapes, seed=1):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(s, generator=g, dtype=F64) * sc for s, sc in zip(shapes, (1.0, 1.0, 0.1))]


def assert_close(a, b, dtype):
    tol = dict(rtol=1e-9, atol=1e-10) if dtype == F64 else dict(rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(a.double(), b.double(), **tol)


# --------------------------------------------------------------------------------------------
# rectified kernel vs relu_attention_reference (the torch path's contract)
# --------------------------------------------------------------------------------------------
CASES = [  # (T, S, d, mask, causal, need_stats, row_scale, dtype)
    (5, 37, 16, "none", False, True, "tensor", F32),
    (21, 21, 16, "left", False, True, "tensor", F64),
    (21, 21, 12, "right", False, False, "float", F32),
    (19, 19, 16, "causal_left", False, True, "tensor", F32),
    (19, 19, 16, "left", True, True, "tensor", F64),
    (7, 23, 16, "none", True, False, "float", F32),
    (40, 21, 16, "left", True, True, "tensor", F64),  # causal T > S: reversed query tiles, dead rows
    (33, 18, 16, "dead", False, True, "tensor", F32),
    (17, 40, 16, "general", False, True, "tensor", F64),
]


@needs_triton
@pytest.mark.parametrize("T,S,d,mask_kind,causal,need_stats,rs,dtype", CASES)
def test_rectified_parity_with_torch(interp, bwd, T, S, d, mask_kind, causal, need_stats, rs, dtype):
    B, H = 2, 2
    q, k, v = qkv(B, H, T, S, d, dtype)
    mask = make_mask(mask_kind, B, H, T, S)
    g = torch.Generator().manual_seed(3)
    r = (torch.rand(B, 1, T, 1, generator=g, dtype=F64) * 2).to(dtype) if rs == "tensor" else 0.7
    ups = upstream([(B, H, T, d), (B, H, T), (B, H, T)])
    res = []
    for fn in (tk.relu_attention, relu_attention_reference):
        out = fn(q, k, v, r, mask=mask, need_stats=need_stats, causal=causal)
        outs = [out[0], *out[1]] if need_stats else [out]
        res.append(([o.detach() for o in outs], grads_of(outs, ups, (q, k, v))))
    (o_t, g_t), (o_r, g_r) = res
    for a, b in zip(o_t + list(g_t), o_r + list(g_r)):
        assert_close(a, b, dtype)
    if need_stats:
        assert o_t[1].dtype == (F64 if dtype == F64 else F32)
    if mask_kind == "dead":  # fully padded rows: exact zeros in output, statistics and gradients
        assert torch.equal(o_t[0][0], torch.zeros_like(o_t[0][0]))
        assert torch.equal(o_t[1][0], torch.zeros_like(o_t[1][0]))
        assert torch.equal(g_t[0][0], torch.zeros_like(g_t[0][0]))


@needs_triton
def test_rectified_null_rows_are_exact_zeros(interp, bwd):
    """ReLA's null attention: a query with no positive score gives exact zeros, gradients too."""
    B, H, T, S, d = 1, 2, 6, 20, 16
    q, k, v = qkv(B, H, T, S, d, F32)
    with torch.no_grad():
        k.abs_()
        q[0, 1, 2] = -q[0, 1, 2].abs() - 0.1  # all of k >= 0, this query <= 0: every score <= 0
    out, (rs, rl) = tk.relu_attention(q, k, v, 1.0, need_stats=True)
    (gq,) = torch.autograd.grad(out.sum() + rs.sum() + rl.sum(), (q,))
    assert torch.equal(out[0, 1, 2], torch.zeros(d))
    assert rs[0, 1, 2] == 0 and rl[0, 1, 2] == 0
    assert torch.equal(gq[0, 1, 2], torch.zeros(d))
    assert (out[0, 0] != 0).any() and torch.isfinite(gq).all()


@needs_triton
@pytest.mark.parametrize("activation,act", [("gelu", F.gelu),
                                            ("leaky_relu", lambda x: F.leaky_relu(x, 0.01))])
def test_rectified_activation_variants(interp, bwd, activation, act):
    """ReLA Table 1 rows 9-10: GeLU / Leaky ReLU on scores with masked scores set to 0 first."""
    B, H, T, S, d = 2, 2, 9, 21, 16
    q, k, v = qkv(B, H, T, S, d, F64)
    mask = make_mask("left", B, H, T, S)
    ups = upstream([(B, H, T, d)])
    out = tk.relu_attention(q, k, v, 1.0, mask=mask, activation=activation)
    ref = act((q @ k.transpose(-1, -2)).masked_fill(mask, 0.0)) @ v
    assert_close(out, ref, F64)
    for a, b in zip(grads_of([out], ups, (q, k, v)), grads_of([ref], ups, (q, k, v))):
        assert_close(a, b, F64)


@needs_triton
def test_rectified_bfloat16_and_float16_close_to_float32(interp, bwd):
    B, H, T, S, d = 2, 2, 13, 29, 16
    mask = make_mask("left", B, H, T, S)
    ref_q, ref_k, ref_v = qkv(B, H, T, S, d, F64)
    ref, (rs_ref, _) = relu_attention_reference(ref_q, ref_k, ref_v, 0.5, mask=mask, need_stats=True)
    for dt in (torch.bfloat16, torch.float16):
        q, k, v = qkv(B, H, T, S, d, dt)
        out, (rs, rl) = tk.relu_attention(q, k, v, 0.5, mask=mask, need_stats=True)
        assert out.dtype == dt and rs.dtype == F32
        torch.testing.assert_close(out.double(), ref.detach(), rtol=3e-2, atol=3e-2)
        torch.testing.assert_close(rs.double(), rs_ref.detach(), rtol=3e-2, atol=3e-2)
        grads = torch.autograd.grad(out.float().sum() + rs.sum() + rl.sum(), (q, k, v))
        assert all(torch.isfinite(x).all() for x in grads)


@needs_triton
@pytest.mark.parametrize("stats", [True, False], ids=["stats", "plain"])
@pytest.mark.parametrize("T,S,d", [(20, 16, 16), (21, 37, 40)])
def test_rectified_dropout_mask_is_regenerated_in_backward(interp, bwd, T, S, d, stats):
    """With ``v = I`` the output *is* the dropped, rescaled weights: the mask is visible, and
    the gradients must equal autograd's through that explicit mask (backward regenerates it,
    in transposed tiles too; several key tiles, S not a multiple of 16).  With and without the
    eq. 7 statistics: the kernels apply dropout's ``1 / (1 - p)`` per score with them and once
    per query row (hoisted, on the row scale ``r``) without them."""
    B, H, p = 1, 2, 0.3
    q, k, _ = qkv(B, H, T, S, d, F64)
    v = torch.eye(S, d, dtype=F64).expand(B, H, S, d).clone().requires_grad_()
    torch.manual_seed(0)
    if stats:
        out, (rs, rl) = tk.relu_attention(q, k, v, 0.7, dropout_p=p, need_stats=True)
    else:
        out = tk.relu_attention(q, k, v, 0.7, dropout_p=p)
    p = 77 / 256  # the rate applied: 0.3 rounded to a multiple of 1/256 (one random byte per score)
    s = torch.relu(0.7 * q @ k.transpose(-1, -2)).detach()
    kept = out.detach()[..., :S] != 0
    live = s > 0
    torch.testing.assert_close(out.detach()[..., :S][kept], (s / (1 - p))[kept])  # survivors rescaled
    rate = 1 - kept[live].double().mean()
    assert 0.2 < rate < 0.4  # ~p of the positive weights dropped
    s_ref = torch.relu(0.7 * q @ k.transpose(-1, -2))
    out_ref = (s_ref * kept / (1 - p)) @ v
    if stats:
        torch.testing.assert_close(rs.detach(), s.sum(-1))  # statistics before dropout
        ups = upstream([(B, H, T, d), (B, H, T), (B, H, T)])
        g_t = grads_of([out, rs, rl], ups, (q, k, v))
        rs_ref, rl_ref = s_ref.sum(-1), torch.xlogy(s_ref, s_ref).sum(-1)
        g_r = grads_of([out_ref, rs_ref, rl_ref], ups, (q, k, v))
    else:
        ups = upstream([(B, H, T, d)])
        g_t = grads_of([out], ups, (q, k, v))
        g_r = grads_of([out_ref], ups, (q, k, v))
    for a, b in zip(g_t, g_r):
        assert_close(a, b, F64)
    torch.manual_seed(0)  # same seed, same mask
    again = tk.relu_attention(q, k, v, 0.7, dropout_p=0.3)
    assert torch.equal(again.detach(), out.detach())


class _Spy:
    """Stands in for a kernel of the interpreted module: records ``kernel[grid](...)`` calls."""

    def __init__(self, name, kernel, calls):
        self.name, self.kernel, self.calls = name, kernel, calls

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            self.calls.append(self.name)
            return self.kernel[grid](*args, **kwargs)
        return launch


@needs_triton
@pytest.mark.parametrize("T,S,d,causal,dtype", [
    (9, 37, 32, True, F64), (37, 9, 64, True, F32), (21, 21, 128, True, F32), (13, 29, 40, False, F64),
    (1, 23, 64, False, F64), (1, 23, 32, True, F32)])
def test_rectified_fused_backward_head_dims(interp, T, S, d, causal, dtype, monkeypatch):
    """The fused backward (one ``rect_bwd`` launch, no ``rect_bwd_kv``/``rect_bwd_q``) vs the
    torch path: head dims 32/64/128 and 40 (not a power of two), T != S both ways, causal (T > S
    leaves fully blocked rows), decoding (T = 1), key padding with a fully padded batch item,
    row scale and the eq. 7 terms."""
    B, H = 2, 2
    mod = tk._kernels(True)
    calls = []
    for name in ("rect_bwd", "rect_bwd_kv", "rect_bwd_q"):
        monkeypatch.setattr(mod, name, _Spy(name, getattr(mod, name), calls))
    tk.set_rect_backward("fused")
    try:
        q, k, v = qkv(B, H, T, S, d, dtype)
        mask = make_mask("dead", B, H, T, S)
        r = (torch.rand(B, 1, T, 1, generator=torch.Generator().manual_seed(3), dtype=F64) * 2).to(dtype)
        ups = upstream([(B, H, T, d), (B, H, T), (B, H, T)])
        res = []
        for fn in (tk.relu_attention, relu_attention_reference):
            out, (rs, rl) = fn(q, k, v, r, mask=mask, need_stats=True, causal=causal)
            res.append(grads_of([out, rs, rl], ups, (q, k, v)))
    finally:
        tk.set_rect_backward(None)
    assert calls == ["rect_bwd"]
    for a, b in zip(*res):
        assert_close(a, b, dtype)
    assert torch.equal(res[0][0][0], torch.zeros_like(res[0][0][0]))  # fully padded item: dQ exactly 0


@needs_triton
@pytest.mark.parametrize("activation", ["relu", "gelu"])
def test_fused_and_split_backward_agree_under_dropout(interp, activation, monkeypatch):
    """Same seed, same dropout mask in both backward paths (``_keep`` regenerated per tile): the
    fused and the split gradients agree to the last bits of summation order (float64), with the
    general mask (mode 2), causal skipping and, for ReLU, the eq. 7 terms."""
    B, H, T, S, d = 2, 2, 19, 35, 16
    q, k, v = qkv(B, H, T, S, d, F64)
    mask = make_mask("general", B, H, T, S)
    stats = activation == "relu"
    ups = upstream([(B, H, T, d), (B, H, T), (B, H, T)])
    res = []
    for mode in ("fused", "split"):
        tk.set_rect_backward(mode)
        try:
            torch.manual_seed(5)
            out = tk.relu_attention(q, k, v, 0.8, mask=mask, dropout_p=0.25, need_stats=stats, causal=True,
                                    activation=activation)
        finally:
            tk.set_rect_backward(None)
        outs = [out[0], *out[1]] if stats else [out]
        res.append(([o.detach() for o in outs], grads_of(outs, ups[:len(outs)], (q, k, v))))
    (o_f, g_f), (o_s, g_s) = res
    assert all(torch.equal(a, b) for a, b in zip(o_f, o_s))  # same forward, same mask
    for a, b in zip(g_f, g_s):
        assert_close(a, b, F64)
    assert (g_f[0] != 0).any() and (g_f[1] != 0).any()


@needs_triton
@pytest.mark.parametrize("B,T,S", [(2, 0, 5), (2, 5, 0), (0, 5, 5)])
def test_rectified_empty_shapes(interp, bwd, B, T, S):
    """No queries, no keys or no batch: zero gradients of the right shapes on both paths."""
    q, k, v = qkv(B, 2, T, S, 16, F32)
    out, (rs, rl) = tk.relu_attention(q, k, v, 1.0, need_stats=True)
    grads = torch.autograd.grad(out.sum() + rs.sum() + rl.sum(), (q, k, v))
    for g, x in zip(grads, (q, k, v)):
        assert g.shape == x.shape and g.dtype == x.dtype and not g.any()


@needs_triton
def test_fused_backward_tiles_tried(monkeypatch):
    """The fused backward's autotuning candidates: its 64x128 one-stage tile only without dropout
    (it spills with it); decoding (T = 1) keeps the tiles of at most 32 queries."""
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    mod = tk._kernels(False)
    table = mod._RECT_BWD
    assert (64, 128, 8, 1) in mod._tried(table, {"STATS": True, "DROPOUT": False})
    assert mod._tried(table, {"STATS": True, "DROPOUT": True}) == [t for t in table if t != (64, 128, 8, 1)]
    configs = mod.rect_bwd.configs
    kept = mod._prune(configs, {"T_KEY": 1, "S_KEY": 1024, "STATS": False, "DROPOUT": True})
    assert kept and all(c.kwargs["BLOCK_M"] <= 32 for c in kept)


def test_rect_backward_selection(monkeypatch):
    """``auto`` is ``fused`` unless torch's deterministic algorithms are requested; the setting
    wins over ``MT_RECT_BACKWARD``; unknown names are refused with the valid ones."""
    monkeypatch.delenv("MT_RECT_BACKWARD", raising=False)
    tk.set_rect_backward(None)
    assert tk.rect_backward() == "fused"
    was = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        assert tk.rect_backward() == "split"
        tk.set_rect_backward("fused")
        assert tk.rect_backward() == "fused"  # asked for explicitly
    finally:
        torch.use_deterministic_algorithms(was)
        tk.set_rect_backward(None)
    monkeypatch.setenv("MT_RECT_BACKWARD", "split")
    assert tk.rect_backward() == "split"
    tk.set_rect_backward("auto")
    try:
        assert tk.rect_backward() == "fused"
    finally:
        tk.set_rect_backward(None)
    monkeypatch.setenv("MT_RECT_BACKWARD", "atomic")
    with pytest.raises(ValueError, match="valid choices: auto, fused, split"):
        tk.rect_backward()
    with pytest.raises(ValueError, match="valid choices: auto, fused, split"):
        tk.set_rect_backward("fast")


def _philox7(seed, c0):
    """Philox-4x32-7 (Salmon et al. 2011) in numpy, written from the paper -- the kernels' is
    checked against it: key ``(seed, 0)``, counters ``(c0, 0, 0, 0)``."""
    m32 = np.uint64(0xFFFFFFFF)
    c0 = c0.astype(np.uint64)
    c1, c2, c3 = (np.zeros_like(c0) for _ in range(3))
    k0, k1 = np.uint64(seed & 0xFFFFFFFF), np.uint64(seed >> 32)
    for _ in range(7):
        p0, p1 = np.uint64(0xCD9E8D57) * c2, np.uint64(0xD2511F53) * c0  # < 2**64: exact
        c0, c1, c2, c3 = ((p0 >> np.uint64(32)) ^ c1 ^ k0) & m32, p0 & m32, ((p1 >> np.uint64(32)) ^ c3 ^ k1) & m32, p1 & m32
        k0, k1 = (k0 + np.uint64(0x9E3779B9)) & m32, (k1 + np.uint64(0xBB67AE85)) & m32
    return c0, c1, c2, c3


def reference_keep(BH, T, S, p, seed):
    """The dropout mask as the package docstring defines it, ``(BH, T, S)`` bool (True = kept):
    key ``j = 64 g + 8 k + 2 c + e`` of query ``i`` takes byte ``2 (k % 2) + e`` of word ``k // 2``
    of the Philox call with counter ``(i * ceil(S / 64) + g) * 4 + c`` and key ``seed + bh``."""
    i, j = np.arange(T)[:, None], np.arange(S)[None, :]
    g, k, c, e = j // 64, (j % 64) // 8, (j % 8) // 2, j % 2
    cnt = (i * ((S + 63) // 64) + g) * 4 + c
    byte_shift = (8 * (2 * (k % 2) + e)).astype(np.uint64)
    out = []
    for bh in range(BH):
        word = np.choose(np.broadcast_to(k // 2, cnt.shape), _philox7(seed + bh, cnt))
        out.append(((word >> byte_shift) & np.uint64(255)) >= round(p * 256))
    return torch.from_numpy(np.stack(out))


@needs_triton
@pytest.mark.parametrize("how", tk.KEEP_GENERATORS)
@pytest.mark.parametrize("blocks", [(16, 16), (16, 32), (32, 64), (16, 128)])
def test_dropout_mask_matches_its_definition(interp, how, blocks):
    """Each of the kernels' three mask generators (per score for the tensor-core layout; packed
    with reordered keys for the transposed backward; compact for E-ATT), at every key-tile width
    they support, writes exactly the mask the docstring defines (numpy Philox); S = 150 is not a
    multiple of 64, T = 37 not of the query tile."""
    BH, T, S, p, seed = 3, 37, 150, 0.3, 12345
    mask = tk.dropout_keep_mask(BH, T, S, p, seed, blocks=blocks, how=how)
    ref = reference_keep(BH, T, S, tk._dropout_rate(p), seed)
    assert torch.equal(mask, ref)
    assert 0.27 < 1 - ref.double().mean() < 0.33  # 77/256 = 0.301 dropped


def test_dropout_keep_mask_bad_arguments(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    with pytest.raises(ValueError, match="how must be one of mma, packed, compact"):
        tk.dropout_keep_mask(1, 4, 4, 0.1, 1, how="transposed")
    with pytest.raises(ValueError, match="BLOCK_N 16, 32 or a power of two >= 64"):
        tk.dropout_keep_mask(1, 4, 4, 0.1, 1, blocks=(16, 48))
    with pytest.raises(ValueError, match=r"dropout_p must be in \[0, 1\)"):
        tk.dropout_keep_mask(1, 4, 4, 1.0, 1)
    with pytest.raises(ValueError, match=r"seed must be in \[0, 2\*\*30\)"):
        tk.dropout_keep_mask(1, 4, 4, 0.1, -1)


@needs_triton
@pytest.mark.parametrize("dtype", [F64, torch.float16], ids=["f64", "f16"])
@pytest.mark.parametrize("stats", [True, False], ids=["stats", "plain"])
@pytest.mark.parametrize("blocks,S", [((32, 64), 100), ((16, 128), 150)], ids=["32x64", "16x128"])
def test_rectified_dropout_against_its_mask_with_wide_key_tiles(interp, bwd, monkeypatch, stats, dtype, blocks, S):
    """Output and gradients against autograd through the mask :func:`dropout_keep_mask` writes,
    with 64- and 128-wide key tiles: the transposed backward kernels then load each key tile in
    the reordered (packed) order -- K, V, dK, dV, the key padding and the causal test all follow
    it; the forward and dQ kernels generate the mask per score (float16: the tensor-core path) or
    compactly (float64: IEEE products).  Causal + left padding, S = 100 / 150 (a partial second
    key tile), T = 40 (T != S); 16 x 128 is the fused backward's first tile at d 128 with dropout
    (issue 28), 8 query tiles per key tile."""
    monkeypatch.setattr(tk._kernels(True), "INTERPRET_BLOCKS", {"BLOCK_M": blocks[0], "BLOCK_N": blocks[1]})
    B, H, T, d, p = 2, 2, 40, 16, 0.25
    tol = {} if dtype == F64 else dict(rtol=2e-2, atol=2e-2)
    q, k, v = qkv(B, H, T, S, d, dtype, seed=4)
    mask = make_mask("left", B, H, T, S)  # (B, 1, 1, S): the key-padding mode, with causal=True
    torch.manual_seed(11)
    seed = int(torch.randint(0, 2**30, (1,)).item())  # the draw relu_attention makes (_seed)
    torch.manual_seed(11)
    res = tk.relu_attention(q, k, v, 0.7, mask=mask, dropout_p=p, need_stats=stats, causal=True)
    out = res[0] if stats else res
    keep = tk.dropout_keep_mask(B * H, T, S, p, seed).view(B, H, T, S)
    blocked = mask | torch.ones(T, S, dtype=torch.bool).triu(S - T + 1)
    q64, k64, v64 = (x.detach().double().requires_grad_() for x in (q, k, v))
    s = torch.relu(0.7 * q64 @ k64.transpose(-1, -2)).masked_fill(blocked, 0.0)
    ref = (s * keep / (1 - tk._dropout_rate(p))) @ v64
    torch.testing.assert_close(out.double(), ref, **tol)
    up = ref.detach().cos()
    loss_ref = (ref * up).sum() + (s.sum(-1).sum() if stats else 0)
    loss = (out.double() * up).sum() + (res[1][0].double().sum() if stats else 0)
    for g, g_ref in zip(torch.autograd.grad(loss, (q, k, v)), torch.autograd.grad(loss_ref, (q64, k64, v64))):
        torch.testing.assert_close(g.double(), g_ref, **tol)


@needs_triton
def test_dropout_mask_does_not_depend_on_the_tiles(interp, monkeypatch):
    """The mask is a function of (seed, b, h, i, j) only: other tile sizes, same mask."""
    B, H, T, S, d = 2, 2, 33, 50, 64
    q, k, _ = qkv(B, H, T, S, d, F64)
    v = torch.eye(S, d, dtype=F64).expand(B, H, S, d)  # out = the dropped weights: no sums
    res = []
    for blocks in ({"BLOCK_M": 16, "BLOCK_N": 16}, {"BLOCK_M": 32, "BLOCK_N": 64}):
        monkeypatch.setattr(tk._kernels(True), "INTERPRET_BLOCKS", blocks)
        torch.manual_seed(3)
        out = tk.relu_attention(q, k, v, 1.0, dropout_p=0.5)
        res.append(out.detach())
    assert torch.equal(res[0], res[1])
    live = (q @ k.transpose(-1, -2)).detach() > 0
    assert 0.4 < float((res[0][..., :S][live] == 0).double().mean()) < 0.6  # p = 0.5 of the positive weights


def test_bad_arguments(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    q, k, v = qkv(1, 1, 4, 5, 8, F32)
    with pytest.raises(ValueError, match="valid choices: relu, gelu, leaky_relu"):
        tk.relu_attention(q, k, v, 1.0, activation="tanh")
    with pytest.raises(ValueError, match="need_stats needs non-negative weights"):
        tk.relu_attention(q, k, v, 1.0, need_stats=True, activation="gelu")
    with pytest.raises(ValueError, match=r"\(B, H, S, d\)"):
        tk.relu_attention(q, k[:, :, :, :4], v, 1.0)
    with pytest.raises(ValueError, match="scale must be a finite number > 0"):
        tk.l1_softmax_attention(q, k, v, 0.0)
    with pytest.raises(ValueError, match="d <= 256"):
        big = torch.zeros(1, 1, 2, 300)
        tk.relu_attention(big, big, big, 1.0)


# --------------------------------------------------------------------------------------------
# E-ATT: L1 scores + softmax vs torch.cdist
# --------------------------------------------------------------------------------------------
def l1_reference(q, k, v, scale, mask=None, causal=False, keep=None, p=0.0):
    x = -torch.cdist(q, k, p=1) * scale
    T, S = x.shape[-2:]
    blocked = torch.zeros(T, S, dtype=torch.bool)
    if causal:
        blocked = torch.ones(T, S, dtype=torch.bool).triu(S - T + 1)
    if mask is not None:
        blocked = blocked | mask
    blocked = blocked.expand_as(x)
    dead = blocked.all(-1, keepdim=True)
    w = torch.softmax(x.masked_fill(blocked, float("-inf")).masked_fill(dead, 0.0), -1).masked_fill(dead, 0.0)
    if keep is not None:
        w = w * keep / (1 - p)
    lse = torch.logsumexp(x.masked_fill(blocked, float("-inf")), -1).masked_fill(dead[..., 0], 0.0)
    return w @ v, lse


@needs_triton
@pytest.mark.parametrize("T,S,mask_kind,causal,dtype", [
    (5, 19, "left", False, F64), (18, 18, "causal_left", False, F64), (17, 17, "none", True, F32),
    (20, 11, "dead", False, F64), (9, 37, "left", True, F64), (40, 21, "none", True, F64)])
def test_eatt_scores_and_gradients_vs_cdist(interp, l1_bwd, T, S, mask_kind, causal, dtype):
    """The row log-sum-exp checks the L1 scores themselves; output and gradients vs
    ``softmax(-cdist(q, k, p=1) / sqrt(d)) V`` (float64 on CPU)."""
    B, H, d = 2, 2, 8
    q, k, v = qkv(B, H, T, S, d, dtype)
    with torch.no_grad():
        q.mul_(d ** 0.5)  # E-ATT scales after the distance: keep q, k on one scale
    mask = make_mask(mask_kind, B, H, T, S)
    out, lse = tk.l1_softmax_attention(q, k, v, d ** -0.5, mask=mask, causal=causal, return_lse=True)
    ref, lse_ref = l1_reference(q, k, v, d ** -0.5, mask, causal)
    assert_close(out, ref, dtype)
    assert_close(lse, lse_ref, dtype)
    ups = upstream([(B, H, T, d)])
    for a, b in zip(grads_of([out], ups, (q, k, v)), grads_of([ref], ups, (q, k, v))):
        assert_close(a, b, dtype)
    if mask_kind == "dead":
        assert torch.equal(out[0].detach(), torch.zeros_like(out[0]))


@needs_triton
@pytest.mark.parametrize("B,T,S", [(2, 0, 5), (2, 5, 0), (0, 5, 5)])
def test_eatt_backward_paths_launch_their_kernels_and_handle_empty_shapes(interp, B, T, S, monkeypatch):
    """``fused``: one ``l1_bwd`` launch (no ``l1_bwd_kv`` / ``l1_bwd_q``); ``split``: the pair; the
    default is ``split`` (``MT_L1_BACKWARD`` unset).  Empty batch, queries or keys: zero gradients
    of the right shapes on both paths; the full shape matches the split path to rounding."""
    mod = tk._kernels(True)
    calls = []
    for name in ("l1_bwd", "l1_bwd_kv", "l1_bwd_q"):
        monkeypatch.setattr(mod, name, _Spy(name, getattr(mod, name), calls))
    monkeypatch.delenv("MT_L1_BACKWARD", raising=False)
    assert tk.l1_backward() == "split"
    monkeypatch.setenv("MT_L1_BACKWARD", "fused")
    assert tk.l1_backward() == "fused"
    monkeypatch.setenv("MT_L1_BACKWARD", "fast")
    with pytest.raises(ValueError, match="MT_L1_BACKWARD='fast': valid choices: auto, fused, split"):
        tk.l1_backward()
    monkeypatch.delenv("MT_L1_BACKWARD")
    with pytest.raises(ValueError, match="valid choices: auto, fused, split"):
        tk.set_l1_backward("atomic")
    res = {}
    for mode, (b, t, s_) in (("fused", (B, T, S)), ("split", (B, T, S)), ("fused", (2, 7, 9)), ("split", (2, 7, 9))):
        tk.set_l1_backward(mode)
        try:
            calls.clear()
            q, k, v = qkv(b, 2, t, s_, 16, F64)
            out = tk.l1_softmax_attention(q, k, v, 0.25)
            grads = grads_of([out], upstream([(b, 2, t, 16)]), (q, k, v))
        finally:
            tk.set_l1_backward(None)
        for gr, x in zip(grads, (q, k, v)):
            assert gr.shape == x.shape
        if (b, t, s_) == (B, T, S):
            assert all(torch.count_nonzero(gr) == 0 for gr in grads)
        else:
            assert calls == (["l1_bwd"] if mode == "fused" else ["l1_bwd_kv", "l1_bwd_q"])
            res[mode] = grads
    for a, b in zip(res["fused"], res["split"]):
        assert_close(a, b, F64)
    assert (res["fused"][0] != 0).any()


@needs_triton
def test_eatt_dropout_mask_is_regenerated_in_backward(interp, l1_bwd):
    B, H, T, S, d, p = 1, 2, 18, 16, 16, 0.25
    q, k, _ = qkv(B, H, T, S, d, F64)
    v = torch.eye(S, d, dtype=F64).expand(B, H, S, d).clone().requires_grad_()
    torch.manual_seed(1)
    out = tk.l1_softmax_attention(q, k, v, d ** -0.5, dropout_p=p)
    keep = (out.detach() != 0).double()
    assert 0.15 < 1 - keep.mean() < 0.35
    ref, _ = l1_reference(q, k, v, d ** -0.5, keep=keep, p=p)
    assert_close(out, ref, F64)
    ups = upstream([(B, H, T, d)])
    for a, b in zip(grads_of([out], ups, (q, k, v)), grads_of([ref], ups, (q, k, v))):
        assert_close(a, b, F64)


@needs_triton
@pytest.mark.parametrize("d,case", [(d, case) for d in (20, 32, 64)
                                     for case in ("causal", "causal_t_gt_s", "decode", "dropout")]
                         + [(128, "causal_t_gt_s"), (128, "dropout")])
def test_eatt_head_dims_chunked_distance(interp, l1_bwd, d, case):
    """The L1 distance runs over ``BLOCK_D // CHUNK`` chunks of the head dimension on 5-d tiles
    (issue 28): output, row log-sum-exp and gradients vs cdist at d 20 (padded to BLOCK_D 32: the
    dimensions >= d must add nothing), 32, 64, 128; causal with T < S and T > S (fully blocked
    rows) under key padding, decoding (T = 1), attention dropout (the mask is read off the output
    with ``v = I``, S <= d).  d 128 (more chunks of the same loop, ~20 s a case under the
    interpreter) runs the two cases with the most paths: blocked rows, and dropout."""
    B, H, p, keep = 2, 2, 0.0, None
    T, S, mask_kind, causal = {"causal": (9, 21, "left", True), "causal_t_gt_s": (21, 9, "right", True),
                               "decode": (1, 21, "right", False), "dropout": (18, 16, "none", False)}[case]
    q, k, v = qkv(B, H, T, S, d, F64, seed=d)
    with torch.no_grad():
        q.mul_(d ** 0.5)
    mask = make_mask(mask_kind, B, H, T, S)
    if case == "dropout":
        p = 0.25
        v = torch.eye(S, d, dtype=F64).expand(B, H, S, d).clone().requires_grad_()
        torch.manual_seed(d)
    out, lse = tk.l1_softmax_attention(q, k, v, d ** -0.5, mask=mask, dropout_p=p, causal=causal, return_lse=True)
    if case == "dropout":
        keep = (out.detach()[..., :S] != 0).double()
        assert 0.1 < 1 - keep.mean() < 0.4
    ref, lse_ref = l1_reference(q, k, v, d ** -0.5, mask, causal, keep=keep, p=p)
    assert_close(out, ref, F64)
    assert_close(lse, lse_ref, F64)
    ups = upstream([(B, H, T, d)])
    for a, b in zip(grads_of([out], ups, (q, k, v)), grads_of([ref], ups, (q, k, v))):
        assert_close(a, b, F64)


def test_eatt_torch_path_in_half_precision_on_cpu():
    """cdist has no bfloat16/float16 kernel: the scores are computed in float32 (pure bf16 model,
    no autocast), close to the float32 result, finite gradients.  Measured (seed 0): max error /
    max |ref| ~5e-3 in bfloat16, <= 1e-3 in float16.  The values cannot tell float32 scores from
    half-precision ones (a scratch run computing the L1 sums in bf16/fp16 stayed within 1.5x of the
    float32 error: the half projections dominate and the scores are rounded to the dtype anyway);
    what the test catches is cdist being called on half tensors (it raises on CPU)."""
    torch.manual_seed(0)
    C, H = 16, 2
    tol = {torch.bfloat16: 2e-2, torch.float16: 5e-3}  # x max |ref|
    for name in ("eatt", "eatt_l1"):
        args = argparse.Namespace(attention_backend="torch")
        m32 = FunctionalMultiheadAttention(C, H, build_attention_fn(name, C, H, args), self_attention=True)
        x = torch.randn(7, 2, C)
        ref, _ = m32(x, x, x, need_weights=False)
        for dt in (torch.bfloat16, torch.float16):
            m = FunctionalMultiheadAttention(C, H, build_attention_fn(name, C, H, args), self_attention=True)
            m.load_state_dict(m32.state_dict())
            m = m.to(dt)
            xh = x.to(dt).requires_grad_()
            out, _ = m(xh, xh, xh, need_weights=False)
            out.float().sum().backward()
            assert out.dtype == dt and torch.isfinite(xh.grad).all()
            torch.testing.assert_close(out.float(), ref, rtol=0, atol=tol[dt] * float(ref.detach().abs().max()))


# --------------------------------------------------------------------------------------------
# the attention module: backend triton == backend torch, every function with a fused kernel
# --------------------------------------------------------------------------------------------
FUSED = ["relu", "relu_rmsnorm", "relu_layernorm", "rela_i", "rela_g", "rela_g_layernorm", "rela_g_gelu",
         "rela_g_leaky_relu", "reluformer", "reluformer_noscale", "eatt", "eatt_l1"]


def module_pair(name, C=16, H=2, **kw):
    mods = []
    for b in ("triton", "torch"):
        torch.manual_seed(0)
        fn = build_attention_fn(name, C, H, argparse.Namespace(attention_backend=b))
        fn.aux.enabled = name.startswith("reluformer")  # record eq. 7 terms, as the criterion does
        mods.append(FunctionalMultiheadAttention(C, H, fn, **kw).train())
    return mods


@needs_triton
@pytest.mark.parametrize("name", FUSED)
def test_module_triton_equals_torch(interp, name):
    """Decoder self-attention (left padding + future mask) and cross-attention with a fully
    padded source: outputs, eq. 7 terms and their row counts (ReLUFormer: the Triton backend
    records them with the "stats" kernels) and parameter gradients to 1e-4."""
    C = 16
    torch.manual_seed(1)
    x = torch.randn(11, 2, C)
    kpm = torch.zeros(2, 11, dtype=torch.bool)
    kpm[1, :3] = True
    future = torch.triu(torch.full((11, 11), float("-inf")), 1)
    src = torch.randn(13, 2, C)
    src_pad = torch.zeros(2, 13, dtype=torch.bool)
    src_pad[0] = True
    results = []
    for self_attn in (True, False):
        per_backend = []
        for m in module_pair(name, C, self_attention=self_attn, encoder_decoder_attention=not self_attn):
            if self_attn:
                y, _ = m(x, x, x, key_padding_mask=kpm, attn_mask=future, need_weights=False)
            else:
                y, _ = m(x, src, src, key_padding_mask=src_pad, need_weights=False)
            loss = y.square().sum()
            rec = m.attn_fn.aux.pop()
            terms = {k: v[0] for k, v in rec.items()}
            for key in ("reluformer_norm", "reluformer_entropy"):
                if key in terms:
                    loss = loss + terms[key]
            loss.backward()
            grads = [p.grad.clone() for p in (m.q_proj.weight, m.k_proj.weight, m.v_proj.weight)]
            counts = {f"{k} count": float(v[1]) for k, v in rec.items()}  # the rows each term is averaged over
            per_backend.append((y.detach(), {**{k: float(v) for k, v in terms.items()}, **counts}, grads))
        results.append(per_backend)
    for (y_t, terms_t, g_t), (y_r, terms_r, g_r) in results:
        for a, b in zip([y_t, *g_t], [y_r, *g_r]):  # float32: 1e-4 of the largest magnitude
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4 * float(b.abs().max()))
        assert terms_t.keys() == terms_r.keys()
        assert terms_t == pytest.approx(terms_r, rel=1e-4, abs=1e-6)


@needs_triton
@pytest.mark.parametrize("name", ["rela_g", "reluformer", "eatt"])
def test_module_incremental_equals_full_decoding(interp, name):
    """One query at a time with the cache (the decoding path) == the full causal pass."""
    C = 16
    torch.manual_seed(0)
    fn = build_attention_fn(name, C, 2, argparse.Namespace(attention_backend="triton"))
    m = FunctionalMultiheadAttention(C, 2, fn, self_attention=True).eval().double()
    x = torch.randn(5, 2, C, dtype=F64)
    future = torch.triu(torch.full((5, 5), float("-inf"), dtype=F64), 1)
    full, _ = m(x, x, x, attn_mask=future, need_weights=False)
    state, steps = {}, []
    for t in range(5):
        y, _ = m(x[t:t + 1], x[t:t + 1], x[t:t + 1], incremental_state=state, need_weights=False)
        steps.append(y)
    torch.testing.assert_close(torch.cat(steps), full, rtol=1e-10, atol=1e-12)


def test_every_function_runs_in_bfloat16_and_float16_on_cpu():
    """Every registered function, forward + backward through the module in pure half precision
    (torch backend on CPU): finite outputs and gradients."""
    C, H = 16, 2
    for name in attention_fn_names():
        for dt in (torch.bfloat16, torch.float16):
            torch.manual_seed(0)
            fn = build_attention_fn(name, C, H, argparse.Namespace(attention_backend="torch"))
            m = FunctionalMultiheadAttention(C, H, fn, self_attention=True).to(dt).train()
            x = torch.randn(6, 2, C, dtype=dt, requires_grad=True)
            kpm = torch.zeros(2, 6, dtype=torch.bool)
            kpm[1, :2] = True
            y, _ = m(x, x, x, key_padding_mask=kpm, need_weights=False)
            y.float().sum().backward()
            assert y.dtype == dt and torch.isfinite(y).all(), (name, dt)
            assert x.grad is not None and torch.isfinite(x.grad).all(), (name, dt)  # x feeds v_proj at least


# --------------------------------------------------------------------------------------------
# backend selection
# --------------------------------------------------------------------------------------------
def test_backend_names_are_checked():
    assert backend.check_backend(None) == "auto"
    with pytest.raises(ValueError, match="valid choices: auto, torch, triton"):
        backend.check_backend("cuda")
    with pytest.raises(ValueError, match="valid choices: auto, torch, triton"):
        build_attention_fn("rela_g", 16, 2, argparse.Namespace(attention_backend="flash"))


def test_backend_resolution_on_cpu(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    cpu = torch.device("cpu")
    assert backend.resolve_backend("auto", cpu) == "torch"
    assert backend.resolve_backend("torch", cpu) == "torch"
    monkeypatch.setattr(tk, "_AVAILABLE", True)
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET=1"):
        backend.resolve_backend("triton", cpu)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert backend.resolve_backend("triton", cpu) == "triton"
    assert backend.resolve_backend("auto", cpu) == "torch"  # auto never interprets on CPU
    monkeypatch.setattr(tk, "_AVAILABLE", False)
    with pytest.raises(RuntimeError, match=r"pip install -e \.\[gpu\]"):
        backend.resolve_backend("triton", cpu)
    assert backend.resolve_backend("auto", torch.device("cuda")) == "torch"


def test_triton_kernels_on_cpu_without_the_interpreter_name_the_variable(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setattr(tk, "_AVAILABLE", True)
    q, k, v = qkv(1, 1, 3, 4, 8, F32)
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET=1"):
        tk.relu_attention(q, k, v, 1.0)
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET=1"):
        tk.l1_softmax_attention(q, k, v, 1.0)
    fn = build_attention_fn("rela_g", 16, 2, argparse.Namespace(attention_backend="triton"))
    m = FunctionalMultiheadAttention(16, 2, fn, self_attention=True)
    x = torch.randn(3, 1, 16)
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET=1"):
        m(x, x, x, need_weights=False)
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET=1"):
        m(x, x, x, need_weights=True)  # ReLA-g's gated RMSNorm is a Triton kernel too (family "norm")
    relu = FunctionalMultiheadAttention(16, 2, build_attention_fn("relu", 16, 2, argparse.Namespace(
        attention_backend="triton")), self_attention=True)
    relu(x, x, x, need_weights=True)  # the weights path of the attention itself never needs a kernel


def test_auto_falls_back_to_torch_when_the_start_up_check_fails(monkeypatch, caplog):
    calls = []

    def failing(family, device, dtype):
        calls.append((family, str(device), dtype))
        return "CompilationError: boom"

    monkeypatch.setattr(tk, "_AVAILABLE", True)
    monkeypatch.setattr(tk, "self_test", failing)
    monkeypatch.setattr(backend, "_CHECKED", {})
    cuda = torch.device("cuda")
    with caplog.at_level(logging.WARNING, logger=backend.__name__):
        for _ in range(3):
            assert backend.resolve_backend("auto", cuda, "rectified", torch.bfloat16) == "torch"
    assert calls == [("rectified", "cuda", torch.bfloat16)]  # checked once, remembered
    assert "boom" in caplog.text and caplog.text.count("start-up check") == 1
    monkeypatch.setattr(tk, "self_test", lambda *a: None)
    assert backend.resolve_backend("auto", cuda, "l1softmax", torch.bfloat16) == "triton"
    assert backend.resolve_backend("triton", cuda, "rectified", torch.bfloat16) == "triton"


def test_chosen_backend_is_logged_once(monkeypatch, caplog):
    monkeypatch.setattr(backend, "_LOGGED", set())
    with caplog.at_level(logging.INFO, logger=backend.__name__):
        for _ in range(3):
            backend.resolve_backend("torch", torch.device("cpu"))
    assert caplog.text.count("attention backend: torch on cpu (--attention-backend torch)") == 1


@needs_triton
def test_self_test_passes_under_the_interpreter(interp):
    for family in tk.FAMILIES:
        assert tk.self_test(family, "cpu", F32) is None
    with pytest.raises(ValueError, match="valid choices: rectified, l1softmax, norm, stats"):
        tk.self_test("softmax", "cpu", F32)


def test_cli_option():
    from fairseq import options

    import fairseq_plugins  # noqa: F401

    parser = options.get_training_parser()
    argv = ["data", "--arch", "rela_transformer", "--task", "translation", "--attention-backend", "triton"]
    args = options.parse_args_and_arch(parser, argv)
    assert args.attention_backend == "triton"
    with pytest.raises(SystemExit):
        options.parse_args_and_arch(options.get_training_parser(), argv[:-1] + ["cuda"])


# --------------------------------------------------------------------------------------------
# CUDA: compiled kernels, half precision (skipped without a GPU)
# --------------------------------------------------------------------------------------------
@needs_cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_cuda_rectified_half_parity(dtype, monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    B, H, T, S, d = 2, 4, 200, 333, 64
    mask = make_mask("causal_left", B, H, T, S).cuda()
    q, k, v = qkv(B, H, T, S, d, dtype, device="cuda")
    r = torch.rand(B, 1, T, 1, device="cuda") + 0.5
    ups = [u.cuda() for u in upstream([(B, H, T, d), (B, H, T), (B, H, T)])]
    out, (rs, rl) = tk.relu_attention(q, k, v, r, mask=mask, need_stats=True)
    g_t = grads_of([out, rs, rl], ups, (q, k, v))
    q64, k64, v64 = (x.detach().double().requires_grad_() for x in (q, k, v))
    ref, (rs_r, rl_r) = relu_attention_reference(q64, k64, v64, r.double(), mask=mask, need_stats=True)
    g_r = grads_of([ref, rs_r, rl_r], ups, (q64, k64, v64))
    for a, b in zip([out, rs, rl, *g_t], [ref, rs_r, rl_r, *g_r]):
        scale = float(b.abs().max())
        assert float((a.double() - b.double()).abs().max()) <= 2e-2 * scale


@needs_cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_cuda_eatt_parity(dtype, monkeypatch):
    """The compiled L1 kernel against float64 cdist, held to test_triton_cuda's TOL: 1e-4 x max|ref|
    in IEEE float32 (TF32 off: the P @ V products would use it), 2e-2 in half precision."""
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", False)
    tol = {torch.float32: 1e-4, torch.bfloat16: 2e-2, torch.float16: 2e-2}[dtype]
    B, H, T, S, d = 2, 4, 150, 170, 64
    mask = make_mask("left", B, H, T, S).cuda()
    q, k, v = qkv(B, H, T, S, d, dtype, device="cuda")
    out = tk.l1_softmax_attention(q, k, v, d ** -0.5, mask=mask)
    ups = [upstream([(B, H, T, d)])[0].cuda()]
    g_t = grads_of([out], ups, (q, k, v))
    q64, k64, v64 = (x.detach().double().cpu().requires_grad_() for x in (q, k, v))
    ref, _ = l1_reference(q64, k64, v64, d ** -0.5, mask.cpu())
    g_r = grads_of([ref], [u.cpu() for u in ups], (q64, k64, v64))
    for a, b in zip([out, *g_t], [ref, *g_r]):
        scale = float(b.abs().max())
        assert float((a.double().cpu() - b).abs().max()) <= tol * scale


@needs_cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_cuda_every_function_half_precision(dtype, monkeypatch):
    """Every registered function on CUDA in half precision (backend auto -> Triton where a
    fused kernel exists): finite outputs and gradients."""
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    C, H = 64, 4
    for name in attention_fn_names():
        torch.manual_seed(0)
        fn = build_attention_fn(name, C, H, argparse.Namespace(attention_backend="auto"))
        m = FunctionalMultiheadAttention(C, H, fn, self_attention=True).cuda().to(dtype).train()
        x = torch.randn(40, 3, C, device="cuda", dtype=dtype, requires_grad=True)
        kpm = torch.zeros(3, 40, dtype=torch.bool, device="cuda")
        kpm[1, :7] = True
        y, _ = m(x, x, x, key_padding_mask=kpm, need_weights=False)
        y.float().sum().backward()
        assert torch.isfinite(y).all(), name
        assert x.grad is not None and torch.isfinite(x.grad).all(), name  # x feeds v_proj at least


@needs_triton
@pytest.mark.parametrize("arch", [90, 80])
def test_kernels_compile_for_the_gpu_without_one(arch, monkeypatch):
    """The interpreter cannot see what only the compiler rejects: compile every kernel to a
    cubin for sm_90 (H100) and sm_80 (A100) in bf16, every feature on, within shared memory."""
    pytest.importorskip("triton.backends.nvidia", reason="triton without its NVIDIA backend")
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    shared = tk.compile_offline(arch, torch.bfloat16)
    assert len(shared) == 8 and any(n.startswith("rect_bwd ") for n in shared) and any(n.startswith("l1_bwd ") for n in shared)
    assert all(0 < v <= 227 * 1024 for v in shared.values()), shared


@needs_triton
@pytest.mark.parametrize("arch", ["rela_transformer", "reluformer", "eatt_transformer"])
def test_whole_model_triton_equals_torch(interp, arch, monkeypatch):
    """A tiny model of each paper preset (encoder self-attention with left padding, decoder
    self-attention with the future mask, cross-attention), training mode without dropout:
    the output and every parameter gradient agree between --attention-backend triton and torch,
    and the Triton backend really ran its kernels (5 of the 6 attentions of 2 + 2 layers)."""
    from helpers import build, toy_batch, toy_task

    calls = []
    for name in ("relu_attention", "l1_softmax_attention"):
        orig = getattr(tk, name)
        monkeypatch.setattr(tk, name, lambda *a, _orig=orig, **kw: calls.append(1) or _orig(*a, **kw))
    task = toy_task()
    src, src_lengths, prev = toy_batch(task, bsz=3, src_len=9, tgt_len=7)
    res = []
    for b in ("triton", "torch"):
        torch.manual_seed(0)
        model, _ = build(arch, task, attention_backend=b)
        model.train()
        calls.clear()
        out, _ = model(src, src_lengths, prev)
        # 6 attentions; fairseq asks the last decoder layer's cross-attention for its weights
        # (alignment_layer), also in training: that one takes the weights path
        assert len(calls) == (5 if b == "triton" else 0)
        out.float().square().mean().backward()
        res.append((out.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}))
    (o_t, g_t), (o_r, g_r) = res
    torch.testing.assert_close(o_t, o_r, rtol=1e-4, atol=1e-4 * float(o_r.abs().max()))
    assert g_t.keys() == g_r.keys() and len(g_t) > 10
    for name in g_r:
        torch.testing.assert_close(g_t[name], g_r[name], rtol=1e-4, atol=1e-4 * float(g_r[name].abs().max()) + 1e-12,
                                   msg=name)
