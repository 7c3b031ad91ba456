"""The compiled Triton kernels on a CUDA GPU: every autotune tile, causal with T != S, dropout,
head dims 32/64/128, decoding (T = 1) and the attention module's strided layout (issue 28); the
rectified backward on both paths (``tk.set_rect_backward``: the fused 5-GEMM ``rect_bwd`` with
atomic dQ, and the split ``rect_bwd_kv`` + ``rect_bwd_q``).

Each check is a function of the device and the run mode, so the same code runs:

* on CUDA, compiled, at realistic sizes (T, S in the hundreds, several tiles per row) -- the tests
  marked ``needs_cuda``, skipped on a machine without a GPU;
* on CPU under Triton's interpreter at tiny sizes (``test_checks_hold_under_the_interpreter``),
  so CI proves the checks themselves right (a check that cannot fail would pass there too, but
  one that is wrong fails there first).

References are the PyTorch path in float64 (:func:`relu_attention_reference`, an L1 softmax from
``torch.cdist``).  float32 runs with TF32 off (IEEE products), so it is held to 1e-4 relative to the
largest entry; bf16/fp16 to 2e-2.
"""

import contextlib

import pytest
import torch

import fairseq_plugins.attention.triton as tk
from fairseq_plugins.attention.kernels import relu_attention_reference
from helpers import needs_cuda, needs_triton

F64 = torch.float64
TOL = {torch.float32: 1e-4, torch.bfloat16: 2e-2, torch.float16: 2e-2, F64: 1e-9}
RECT_KERNELS = ("rect_fwd", "rect_bwd", "rect_bwd_kv", "rect_bwd_q")
#: the backward path that launches each rectified kernel (rect_fwd: either)
RECT_PATH = {"rect_fwd": None, "rect_bwd": "fused", "rect_bwd_kv": "split", "rect_bwd_q": "split"}
L1_KERNELS = ("l1_fwd", "l1_bwd", "l1_bwd_kv", "l1_bwd_q")
#: the backward path that launches each kernel of a family (the forward: either)
PATH = dict(RECT_PATH, l1_fwd=None, l1_bwd="fused", l1_bwd_kv="split", l1_bwd_q="split")


@contextlib.contextmanager
def backward(mode):
    """Both families' backward path inside the block (``relu_attention``'s and
    ``l1_softmax_attention``'s; None: the defaults, ``auto``)."""
    tk.set_rect_backward(mode)
    tk.set_l1_backward(mode)
    try:
        yield
    finally:
        tk.set_rect_backward(None)
        tk.set_l1_backward(None)


@pytest.fixture
def compiled(monkeypatch):
    """Compiled kernels on CUDA tensors, IEEE float32 (no TF32)."""
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", False)


def inputs(B, H, T, S, d, dtype, device, layout="contiguous", seed=0):
    """q ``(B, H, T, d)`` (scaled by ``d^-1/2``), k, v ``(B, H, S, d)``, leaf tensors.

    ``layout="module"``: views of ``(L, B, H*d)`` tensors permuted to ``(B, H, L, d)``, the
    strides ``FunctionalMultiheadAttention`` hands the kernels (no copy)."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, T, d, generator=g, dtype=F64) * d ** -0.5
    k = torch.randn(B, H, S, d, generator=g, dtype=F64)
    v = torch.randn(B, H, S, d, generator=g, dtype=F64)
    out = []
    for x in (q, k, v):
        x = x.to(device, dtype)
        if layout == "module":  # (B, H, L, d) -> (L, B, H, d) contiguous -> the module's permuted view
            L = x.size(2)
            x = x.permute(2, 0, 1, 3).contiguous().view(L, B, H * d).view(L, B, H, d).permute(1, 2, 0, 3)
            assert not x.is_contiguous()
        out.append(x.detach().requires_grad_())
    return out


def key_padding(B, S, device):
    """``(B, 1, 1, S)`` bool: item 0 right-padded by S/4, the last left-padded by S/3."""
    kp = torch.zeros(B, 1, 1, S, dtype=torch.bool)
    kp[0, ..., S - S // 4:] = True
    kp[-1, ..., : S // 3] = True
    return kp.to(device)


def upstream(shapes, device, seed=1):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(s, generator=g, dtype=F64) * sc).to(device) for s, sc in zip(shapes, (1.0, 1.0, 0.1))]


def grads(outs, ups, xs):
    return torch.autograd.grad(sum((o.double() * u).sum() for o, u in zip(outs, ups)), xs)


def close(a, b, dtype, what):
    """``|a - b| <= tol * max|b|`` (relative to the largest entry: half-precision rounding)."""
    a, b = a.detach().double().cpu(), b.detach().double().cpu()
    scale = max(float(b.abs().max()), 1e-30)
    err = float((a - b).abs().max())
    assert err <= TOL[dtype] * scale, f"{what}: max error {err:.3g} > {TOL[dtype]} x {scale:.3g}"


def l1_reference(q, k, v, scale, mask=None, causal=False):
    """E-ATT eq. 13 in float64: ``softmax(-scale ||q_i - k_j||_1) V``, exact zeros on fully blocked rows."""
    x = -torch.cdist(q, k, p=1) * scale
    T, S = x.shape[-2:]
    blocked = torch.zeros(T, S, dtype=torch.bool, device=x.device)
    if causal:
        blocked = torch.ones(T, S, dtype=torch.bool, device=x.device).triu(S - T + 1)
    if mask is not None:
        blocked = blocked | mask
    blocked = blocked.expand_as(x)
    dead = blocked.all(-1, keepdim=True)
    w = torch.softmax(x.masked_fill(blocked, float("-inf")).masked_fill(dead, 0.0), -1).masked_fill(dead, 0.0)
    return w @ v


def check_rectified(device, dtype, B, H, T, S, d, causal, layout="contiguous", stats=True, bwd=None):
    """Fused ReLU attention (row scale, key padding, ``causal``, eq. 7 statistics) and its gradients
    (backward path ``bwd``: ``"fused"``, ``"split"``, None = the default) vs the float64 reference."""
    q, k, v = inputs(B, H, T, S, d, dtype, device, layout)
    mask = key_padding(B, S, device)
    r = (torch.rand(B, 1, T, 1, generator=torch.Generator().manual_seed(3), dtype=F64) + 0.5).to(device)
    ups = upstream([(B, H, T, d), (B, H, T), (B, H, T)], device)
    with backward(bwd):
        res = tk.relu_attention(q, k, v, r.float(), mask=mask, need_stats=stats, causal=causal)
    outs = [res[0], *res[1]] if stats else [res]
    g_t = grads(outs, ups, (q, k, v))
    q64, k64, v64 = (x.detach().double().requires_grad_() for x in (q, k, v))
    ref = relu_attention_reference(q64, k64, v64, r, mask=mask, need_stats=stats, causal=causal)
    refs = [ref[0], *ref[1]] if stats else [ref]
    g_r = grads(refs, ups, (q64, k64, v64))
    assert outs[0].stride() == q.stride(), "the output keeps q's layout"
    for name, a, b in zip(["out", "row_sum", "row_slogs"][:len(outs)] + ["dq", "dk", "dv"],
                          outs + list(g_t), refs + list(g_r)):
        close(a, b, dtype, f"rectified {name} (T {T}, S {S}, d {d}, causal {causal}, {layout}, bwd {bwd})")


def check_l1(device, dtype, B, H, T, S, d, causal, layout="contiguous", bwd=None):
    """Fused E-ATT L1 softmax attention (key padding, ``causal``) and its gradients (backward
    path ``bwd``) vs float64 cdist."""
    q, k, v = inputs(B, H, T, S, d, dtype, device, layout)
    mask = key_padding(B, S, device)
    ups = upstream([(B, H, T, d)], device)
    with backward(bwd):
        out = tk.l1_softmax_attention(q, k, v, d ** -0.5, mask=mask, causal=causal)
    g_t = grads([out], ups, (q, k, v))
    q64, k64, v64 = (x.detach().double().requires_grad_() for x in (q, k, v))
    ref = l1_reference(q64, k64, v64, d ** -0.5, mask, causal)
    g_r = grads([ref], ups, (q64, k64, v64))
    for name, a, b in zip(["out", "dq", "dk", "dv"], [out, *g_t], [ref, *g_r]):
        close(a, b, dtype, f"l1 {name} (T {T}, S {S}, d {d}, causal {causal}, {layout}, bwd {bwd})")


def check_dropout(device, T, S, d, p=0.3, bwd=None):
    """Attention dropout of the rectified kernel: with ``v = I`` the output *is* the dropped,
    rescaled weights, so the mask is visible; the rate is about ``p``; the gradients (backward
    path ``bwd``) equal autograd's through that explicit mask (the backward regenerates it); the
    same seed gives the same mask.  Needs ``S <= d``."""
    assert S <= d
    q, k, _ = inputs(1, 2, T, S, d, torch.float32, device)
    v = torch.eye(S, d, dtype=torch.float32, device=device).expand(1, 2, S, d).clone().requires_grad_()
    torch.manual_seed(0)
    seed = int(torch.randint(0, 2**30, (1,)).item())  # the draw relu_attention makes
    torch.manual_seed(0)
    with backward(bwd):
        out = tk.relu_attention(q, k, v, 1.0, dropout_p=p)
    rate = tk._dropout_rate(p)
    s = torch.relu(q.double() @ k.double().transpose(-1, -2)).detach()
    kept = out.detach()[..., :S] != 0
    live = s > 0
    # the mask the kernel applied is the one dropout_keep_mask defines (tested against numpy on CPU)
    assert torch.equal(kept[live], tk.dropout_keep_mask(2, T, S, p, seed, device=device).view(1, 2, T, S)[live])
    close(out.detach()[..., :S] * kept, (s / (1 - rate)) * kept, torch.float32, "survivors rescaled")
    dropped = 1 - kept[live].double().mean()
    assert abs(float(dropped) - rate) < 0.1, f"dropped {float(dropped):.3f} of the positive weights, rate {rate}"
    ups = upstream([(1, 2, T, d)], device)
    g_t = grads([out], ups, (q, k, v))
    q64, k64, v64 = (x.detach().double().requires_grad_() for x in (q, k, v))
    ref = (torch.relu(q64 @ k64.transpose(-1, -2)) * kept / (1 - rate)) @ v64
    for name, a, b in zip(["dq", "dk", "dv"], g_t, grads([ref], ups, (q64, k64, v64))):
        close(a, b, torch.float32, f"dropout {name} (bwd {bwd})")
    torch.manual_seed(0)
    assert torch.equal(tk.relu_attention(q, k, v, 1.0, dropout_p=p).detach(), out.detach()), "same seed, same mask"
    return out.detach()


def check_fused_equals_split(device, dtype, T, S, d, p=0.1):
    """Both backward paths from one forward's seed (dropout ``p``, key padding, causal, row scale,
    eq. 7 terms): same forward, gradients equal up to summation order (the fused path's dQ is a
    sum of atomic adds: ``tol`` relative to the largest entry)."""
    q, k, v = inputs(2, 3, T, S, d, dtype, device)
    mask = key_padding(2, S, device)
    r = (torch.rand(2, 1, T, 1, generator=torch.Generator().manual_seed(3), dtype=F64) + 0.5).to(device)
    ups = upstream([(2, 3, T, d), (2, 3, T), (2, 3, T)], device)
    res = []
    for bwd in ("fused", "split"):
        torch.manual_seed(7)
        with backward(bwd):
            out, (rs, rl) = tk.relu_attention(q, k, v, r.float(), mask=mask, dropout_p=p, need_stats=True,
                                              causal=True)
        res.append((out.detach(), grads([out, rs, rl], ups, (q, k, v))))
    (o_f, g_f), (o_s, g_s) = res
    assert torch.equal(o_f, o_s), "one seed, one forward"
    for name, a, b in zip(["dq", "dk", "dv"], g_f, g_s):
        close(a, b, dtype, f"fused vs split {name} (T {T}, S {S}, d {d}, p {p})")


@contextlib.contextmanager
def forced_config(kernel, config):
    """Run ``kernel`` (a ``triton.autotune`` object) with ``config`` only: its config list is that
    one tile and its cache of tuned choices is emptied; both are restored afterwards."""
    configs, cache = kernel.configs, dict(kernel.cache)
    kernel.configs = [config]
    kernel.cache.clear()
    try:
        yield
    finally:
        kernel.configs = configs
        kernel.cache.clear()
        kernel.cache.update(cache)


def _tiles(names):
    """Every (kernel name, config) of the compiled kernel module's autotune tables."""
    mod = tk._kernels(False)
    return [(n, c) for n in names for c in getattr(mod, n).configs]


# ---------------------------------------------------------------------------------------------
# CPU: the checks themselves, under the interpreter (tiny sizes)
# ---------------------------------------------------------------------------------------------
@needs_triton
def test_checks_hold_under_the_interpreter(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    for bwd in ("fused", "split"):
        check_rectified("cpu", torch.float32, 2, 2, 9, 21, 16, causal=True, layout="module", bwd=bwd)
        check_rectified("cpu", torch.float32, 2, 2, 1, 21, 32, causal=False, stats=False, bwd=bwd)
        check_dropout("cpu", 20, 16, 16, bwd=bwd)
    check_fused_equals_split("cpu", torch.float32, 9, 21, 16)
    check_l1("cpu", torch.float32, 2, 2, 9, 21, 16, causal=True, layout="module")
    check_l1("cpu", torch.float32, 2, 2, 1, 21, 16, causal=False)


@needs_triton
def test_forced_config_sets_and_restores_the_autotuner(monkeypatch):
    """On the compiled module's real autotuners (built here without a GPU): one tile while
    forced, the table and the tuned choices back afterwards."""
    mod = tk._kernels(False)
    kernel = mod.rect_fwd
    table = list(kernel.configs)
    kernel.cache["probe"] = table[0]
    try:
        with forced_config(kernel, table[-1]):
            assert kernel.configs == [table[-1]] and "probe" not in kernel.cache
        assert kernel.configs == table and kernel.cache["probe"] is table[0]
    finally:
        kernel.cache.pop("probe", None)
    assert len(_tiles(RECT_KERNELS)) == sum(len(getattr(mod, n).configs) for n in RECT_KERNELS) > len(table)


# ---------------------------------------------------------------------------------------------
# CUDA
# ---------------------------------------------------------------------------------------------
@needs_cuda
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("family", ["rectified", "l1"])
def test_cuda_every_autotune_tile_matches_the_reference(compiled, family, d):
    """Each tile of each kernel's table, alone (the others autotuned), on a shape with partial
    tiles (T 300, S 333), key padding and causal masking, float32 and bf16; at d 128 the tiles
    the autotuner tries there (``_tried``: the ``_SPILL_AT_D128`` tiles are not)."""
    mod = tk._kernels(False)
    names = RECT_KERNELS if family == "rectified" else L1_KERNELS
    check = check_rectified if family == "rectified" else check_l1
    tables = {n: getattr(mod, "_" + n.upper()) for n in names}
    failures = []
    for name, config in _tiles(names):
        kw = {"bwd": PATH[name]}  # the path that launches it
        tile = (config.kwargs["BLOCK_M"], config.kwargs["BLOCK_N"], config.num_warps, config.num_stages)
        if tile not in mod._tried(tables[name], {"BLOCK_D": d}):
            continue
        for dtype in (torch.float32, torch.bfloat16):
            with forced_config(getattr(mod, name), config):
                try:
                    check("cuda", dtype, 2, 3, 300, 333, d, causal=True, **kw)
                except AssertionError as err:
                    failures.append(f"{name} {config} {dtype}: {err}")
    assert not failures, "\n".join(failures)


@needs_cuda
@pytest.mark.parametrize("d", [32, 64, 128])
@pytest.mark.parametrize("T,S", [(257, 257), (100, 300), (300, 100), (1, 300)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_cuda_causal_and_head_dims(compiled, d, T, S, dtype):
    """Causal masking with T != S (keys ``j > i + S - T`` blocked; T > S leaves fully blocked rows),
    decoding (T = 1), head dims 32 / 64 / 128, both kernel families."""
    for bwd in ("fused", "split"):
        check_rectified("cuda", dtype, 2, 3, T, S, d, causal=True, bwd=bwd)
        check_l1("cuda", dtype, 2, 3, T, S, d, causal=True, bwd=bwd)
        if T == S:
            check_rectified("cuda", dtype, 2, 3, T, S, d, causal=False, bwd=bwd)
            check_l1("cuda", dtype, 2, 3, T, S, d, causal=False, bwd=bwd)


@needs_cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cuda_module_layout(compiled, dtype):
    """The strided ``(B, H, L, d)`` views the attention module passes (no copy): same results."""
    check_rectified("cuda", dtype, 4, 8, 200, 200, 64, causal=True, layout="module")
    for bwd in ("fused", "split"):
        check_l1("cuda", dtype, 4, 8, 200, 200, 64, causal=False, layout="module", bwd=bwd)


@needs_cuda
def test_cuda_dropout_is_regenerated_and_tile_independent(compiled):
    """Dropout on the GPU: visible mask, rate, backward through the same mask, same seed same mask;
    and the mask is the same whichever forward tile runs (a function of seed, b, h, i, j only)."""
    mod = tk._kernels(False)
    outs = []
    for config in (mod.rect_fwd.configs[0], mod.rect_fwd.configs[-1]):
        with forced_config(mod.rect_fwd, config):
            for bwd in ("fused", "split"):
                outs.append(check_dropout("cuda", 200, 128, 128, bwd=bwd))
    assert all(torch.equal(outs[0], o) for o in outs[1:])


@needs_cuda
def test_cuda_dropout_mask_generators_agree(compiled, monkeypatch):
    """The three compiled mask generators (per score, packed, compact; inline-assembly barrier
    included) at every key-tile width give one mask, the interpreter's (which
    test_triton_attention holds to a numpy Philox)."""
    BH, T, S, p, seed = 3, 300, 333, 0.3, 4321
    masks = {(how, blocks): tk.dropout_keep_mask(BH, T, S, p, seed, device="cuda", blocks=blocks, how=how).cpu()
             for how in tk.KEEP_GENERATORS for blocks in ((16, 16), (32, 32), (64, 64), (128, 128))}
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    ref = tk.dropout_keep_mask(BH, T, S, p, seed, blocks=(64, 64))
    for key, m in masks.items():
        assert torch.equal(m, ref), key


@needs_cuda
@pytest.mark.parametrize("d", [32, 64, 128])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_cuda_fused_backward_equals_split_and_survives_autotuning(compiled, d, dtype):
    """The fused backward's first call tunes (its timed runs add into dQ: ``reset_to_zero``
    must leave nothing behind), then matches the reference and the split path under dropout."""
    mod = tk._kernels(False)
    mod.rect_bwd.cache.clear()
    check_rectified("cuda", dtype, 2, 3, 300, 333, d, causal=True, bwd="fused")
    check_fused_equals_split("cuda", dtype, 257, 300, d)


@needs_cuda
@pytest.mark.parametrize("name", ["rela_g", "reluformer", "eatt"])
@pytest.mark.parametrize("kind", ["enc", "dec"])
def test_cuda_attention_layer_makes_no_host_sync(name, kind):
    """Issue 28: no host-device synchronisation anywhere in an attention layer on the Triton
    backend (forward + backward, key padding, the decoder's future mask, dropout 0.1, bf16):
    torch's sync debug mode reports any (``.item()``, a host-to-device copy of a Python list, a
    ``bool()`` of a CUDA tensor), counted by ``mt-bench-gpu``'s ``sync_count``.  The first call compiles and checks the kernels
    (``auto``'s start-up self-test reads results back), so the second call is the one checked."""
    from mt_pipeline.bench_gpu import _module, padding_mask, sync_count

    m = _module(name, "triton", 512, 8, torch.bfloat16, "cuda", 0.1, kind)
    T, B = 64, 4
    x = torch.randn(T, B, 512, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    kpm = padding_mask(B, T, "cuda")
    am = torch.triu(torch.full((T, T), float("-inf"), device="cuda"), 1) if kind == "dec" else None

    def step():
        out, _ = m(x, x, x, key_padding_mask=kpm, attn_mask=am, need_weights=False)
        out.float().sum().backward()

    step()
    assert sync_count(step) == 0, "run step() under torch.cuda.set_sync_debug_mode('error') to see where"
