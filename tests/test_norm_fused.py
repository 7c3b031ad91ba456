"""ReLA's fused (gated) RMSNorm (eqs. 4-5; issue 28 item 3): the autograd op
:func:`fairseq_plugins.modules.norms.gated_rms_norm` against the unfused modules it replaced, its
gradients, its Triton kernel (under the interpreter on CPU; compiled on CUDA when there is one),
and what one rela_g attention layer keeps for backward."""

import argparse
import math
import re

import pytest
import torch
import torch.nn.functional as F

import fairseq_plugins.attention.triton as tk
from fairseq_plugins.attention import FunctionalMultiheadAttention, build_attention_fn
from fairseq_plugins.modules.norms import GatedNorm, RMSNorm, gated_rms_norm
from helpers import needs_cuda, needs_triton

F64, F32, BF16 = torch.float64, torch.float32, torch.bfloat16


# --------------------------------------------------------------------------------------------
# the modules as they were before the fused op (the reference)
# --------------------------------------------------------------------------------------------
def old_rmsnorm(x, weight, eps, groups):
    """``RMSNorm.forward`` before issue 28 item 3 (autograd through torch's ``rms_norm``)."""
    xf = x.float() if x.dtype in (torch.float16, torch.bfloat16) else x
    if groups > 1:
        xg = xf.unflatten(-1, (groups, xf.size(-1) // groups))
        y = F.rms_norm(xg, (xg.size(-1),), eps=eps).flatten(-2)
    else:
        y = F.rms_norm(xf, (xf.size(-1),), eps=eps)
    return y.type_as(x) * weight


def old_gated(x, weight, gate, eps, groups):
    """``GatedNorm.forward`` (RMSNorm variant) before issue 28 item 3."""
    return torch.sigmoid(gate * x) * old_rmsnorm(x, weight, eps, groups)


def inputs(shape=(7, 3, 32), dtype=F64, seed=0, zero_rows=True, pdtype=None):
    g = torch.Generator().manual_seed(seed)
    C = shape[-1]
    z = torch.randn(*shape, generator=g, dtype=F64) * 2.0
    if zero_rows:
        z[1, 0] = 0.0  # null attention: the whole row is zero
        z[-1, -1, : C // 2] = 0.0  # a zero head (per-head scope: a zero group)
    w = torch.rand(C, generator=g, dtype=F64) + 0.5
    gt = torch.randn(C, generator=g, dtype=F64) * math.sqrt(3.0 / C) * 3
    dy = torch.randn(*shape, generator=g, dtype=F64)
    pdtype = dtype if pdtype is None else pdtype
    return (z.to(dtype).requires_grad_(), w.to(pdtype).requires_grad_(), gt.to(pdtype).requires_grad_(),
            dy.to(torch.promote_types(dtype, pdtype)))


def run(fn, z, w, gt, dy, gated):
    y = fn(z, w, gt) if gated else fn(z, w)
    grads = torch.autograd.grad(y, (z, w, gt) if gated else (z, w), dy)
    return y.detach(), [g.detach() for g in grads]


def ours(eps, groups, backend="torch"):
    return lambda z, w, gt=None: gated_rms_norm(z, w, gt, eps, groups, backend)


def old(eps, groups):
    return lambda z, w, gt=None: old_gated(z, w, gt, eps, groups) if gt is not None else old_rmsnorm(z, w, eps, groups)


# --------------------------------------------------------------------------------------------
# the PyTorch path
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("gated", [True, False])
@pytest.mark.parametrize("groups", [1, 4])
def test_gradcheck_float64(groups, gated):
    z, w, gt, _ = inputs((5, 2, 16))
    args = (z, w, gt) if gated else (z, w)
    assert torch.autograd.gradcheck(ours(1e-8, groups), args)


@pytest.mark.parametrize("gated", [True, False])
@pytest.mark.parametrize("groups", [1, 4])
def test_equals_the_unfused_modules_in_float64(groups, gated):
    z, w, gt, dy = inputs()
    y_new, g_new = run(ours(1e-8, groups), z, w, gt, dy, gated)
    y_old, g_old = run(old(1e-8, groups), z, w, gt, dy, gated)
    torch.testing.assert_close(y_new, y_old, rtol=1e-13, atol=1e-13)
    for a, b in zip(g_new, g_old):
        torch.testing.assert_close(a, b, rtol=1e-11, atol=1e-11)  # zero rows: rstd = 1e4


@pytest.mark.parametrize("gated", [True, False])
@pytest.mark.parametrize("groups", [1, 4])
def test_parity_with_the_unfused_modules_float32_bfloat16(groups, gated):
    z64, w64, gt64, dy64 = inputs()
    y_ref, g_ref = run(old(1e-8, groups), z64, w64, gt64, dy64, gated)
    z, w, gt, dy = inputs(dtype=F32)
    y_new, g_new = run(ours(1e-8, groups), z, w, gt, dy, gated)
    y_old, g_old = run(old(1e-8, groups), z, w, gt, dy, gated)
    torch.testing.assert_close(y_new, y_old)
    for a, b in zip(g_new, g_old):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
    # bfloat16: one rounding instead of several; never further from float64 than the old modules
    z, w, gt, dy = inputs(dtype=BF16)
    y_new, g_new = run(ours(1e-8, groups), z, w, gt, dy, gated)
    y_old, g_old = run(old(1e-8, groups), z, w, gt, dy, gated)
    assert y_new.dtype == y_old.dtype == BF16
    torch.testing.assert_close(y_new.double(), y_old.double(), rtol=2e-2, atol=2e-2)
    err_new = (y_new.double() - y_ref).abs().max()
    err_old = (y_old.double() - y_ref).abs().max()
    assert err_new <= err_old, (float(err_new), float(err_old))
    for a, b, r in zip(g_new, g_old, g_ref):
        scale = float(r.abs().max())
        torch.testing.assert_close(a.double() / scale, b.double() / scale, rtol=0, atol=3e-2)


def test_zero_rows_stay_zero_with_finite_gradients():
    for dtype in (F64, F32, BF16):
        for groups in (1, 4):
            z, w, gt, dy = inputs(dtype=dtype)
            for gated in (True, False):
                y, grads = run(ours(1e-8, groups), z, w, gt, dy, gated)
                assert torch.equal(y[1, 0], torch.zeros_like(y[1, 0]))
                assert torch.equal(y[-1, -1, :16], torch.zeros_like(y[-1, -1, :16])) or groups == 1
                assert all(bool(torch.isfinite(g).all()) for g in grads)


def test_output_dtype_and_mixed_precision_parameters():
    z, w, gt, dy = inputs(dtype=BF16, pdtype=F32)  # bf16 activations, fp32 parameters (amp)
    y_new, g_new = run(ours(1e-8, 1), z, w, gt, dy, True)
    y_old, g_old = run(old(1e-8, 1), z, w, gt, dy, True)
    assert y_new.dtype == y_old.dtype == F32
    assert [g.dtype for g in g_new] == [BF16, F32, F32]
    torch.testing.assert_close(y_new, y_old, rtol=2e-2, atol=2e-2)


def test_saves_only_the_input_and_the_row_statistics():
    T, B, C, Hh = 9, 4, 32, 4
    for groups in (1, Hh):
        for dtype in (F32, BF16):
            z, w, gt, _ = inputs((T, B, C), dtype=dtype)
            saved = []
            with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
                gated_rms_norm(z, w, gt, 1e-8, groups)
            shapes = sorted((tuple(t.shape), t.dtype) for t in saved)
            assert shapes == sorted([((T, B, C), dtype), ((T, B, groups), F32), ((C,), dtype), ((C,), dtype)])


def test_modules_keep_their_parameter_names_and_use_the_op():
    assert set(dict(RMSNorm(8).named_parameters())) == {"weight"}
    assert set(dict(GatedNorm(8).named_parameters())) == {"gate", "norm.weight"}
    assert set(dict(GatedNorm(8, norm="layernorm").named_parameters())) == {"gate", "norm.weight", "norm.bias"}
    fn = build_attention_fn("rela_g", 16, 4)
    assert set(fn.state_dict()) == {"norm.gate", "norm.norm.weight"}
    assert set(build_attention_fn("relu_rmsnorm", 16, 4).state_dict()) == {"norm.weight"}
    z = torch.randn(3, 2, 16, dtype=F64)
    fn.double()
    torch.testing.assert_close(fn.post_aggregate(z), old_gated(z, fn.norm.norm.weight, fn.norm.gate, 1e-8, 1),
                               rtol=1e-13, atol=1e-13)


def test_bad_arguments():
    z = torch.randn(2, 8)
    w = torch.ones(8)
    with pytest.raises(ValueError, match="valid choices: torch, triton"):
        gated_rms_norm(z, w, backend="cuda")
    with pytest.raises(ValueError, match=r"weight must be .* shape \(8,\)"):
        gated_rms_norm(z, torch.ones(4))
    with pytest.raises(ValueError, match=r"gate must be .* shape \(8,\)"):
        gated_rms_norm(z, w, torch.ones(3))
    with pytest.raises(ValueError, match="groups=3 must be a positive int dividing dim=8"):
        gated_rms_norm(z, w, groups=3)
    with pytest.raises(ValueError, match="eps must be a finite number > 0"):
        gated_rms_norm(z, w, eps=0.0)
    with pytest.raises(ValueError, match="floating-point"):
        gated_rms_norm(torch.ones(2, 8, dtype=torch.long), w)


# --------------------------------------------------------------------------------------------
# the Triton kernel (interpreter on CPU)
# --------------------------------------------------------------------------------------------
@needs_triton
@pytest.mark.parametrize("C,groups", [(32, 1), (32, 4), (48, 3), (40, 2)])  # 3 groups, 20-wide groups: padded
def test_triton_matches_torch_float64(interp, C, groups):
    z, w, gt, dy = inputs((7, 3, C))  # 21 rows: 6 row blocks of 4, 2 programs in backward
    for gated in (True, False):
        y_t, g_t = run(ours(1e-8, groups, "triton"), z, w, gt, dy, gated)
        y_r, g_r = run(ours(1e-8, groups), z, w, gt, dy, gated)
        torch.testing.assert_close(y_t, y_r, rtol=1e-13, atol=1e-13)
        for a, b in zip(g_t, g_r):
            torch.testing.assert_close(a, b, rtol=1e-11, atol=1e-11)
        assert torch.equal(y_t[1, 0], torch.zeros_like(y_t[1, 0]))


@needs_triton
@pytest.mark.parametrize("dtype,pdtype", [(F32, F32), (BF16, BF16), (BF16, F32), (torch.float16, torch.float16)])
def test_triton_matches_torch_low_precision(interp, dtype, pdtype):
    z, w, gt, dy = inputs((5, 3, 32), dtype=dtype, pdtype=pdtype)
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == F32 else dict(rtol=1e-2, atol=1e-2)
    for groups in (1, 4):
        y_t, g_t = run(ours(1e-8, groups, "triton"), z, w, gt, dy, True)
        y_r, g_r = run(ours(1e-8, groups), z, w, gt, dy, True)
        assert y_t.dtype == y_r.dtype and [g.dtype for g in g_t] == [g.dtype for g in g_r]
        torch.testing.assert_close(y_t, y_r, **tol)
        for a, b in zip(g_t, g_r):
            scale = float(b.abs().max())
            torch.testing.assert_close(a.double() / scale, b.double() / scale, **tol)


@needs_triton
def test_triton_layouts_and_empty_input(interp):
    z, w, gt, dy = inputs((6, 4, 32))
    zt = z.detach().transpose(0, 1).requires_grad_()  # rows not in memory order
    y_t, g_t = run(ours(1e-8, 4, "triton"), zt, w, gt, dy.transpose(0, 1), True)
    y_r, g_r = run(ours(1e-8, 4), zt, w, gt, dy.transpose(0, 1), True)
    torch.testing.assert_close(y_t, y_r, rtol=1e-13, atol=1e-13)
    for a, b in zip(g_t, g_r):
        torch.testing.assert_close(a, b, rtol=1e-11, atol=1e-11)
    zc = z.detach()[..., ::2].requires_grad_()  # last axis not contiguous
    w2, gt2 = w.detach()[:16].requires_grad_(), gt.detach()[:16].requires_grad_()
    torch.testing.assert_close(gated_rms_norm(zc, w2, gt2, 1e-8, 2, "triton"), gated_rms_norm(zc, w2, gt2, 1e-8, 2))
    e = torch.zeros(0, 3, 32, dtype=F64, requires_grad=True)
    y = gated_rms_norm(e, w, gt, 1e-8, 1, "triton")
    dz, dg, dw = torch.autograd.grad(y.sum(), (e, w, gt))
    assert y.shape == e.shape and dz.shape == e.shape and not dg.any() and not dw.any()


@needs_triton
def test_triton_too_wide_rows_are_refused(interp):
    from fairseq_plugins.attention.triton import norm

    assert norm.fits(512, 1) and norm.fits(512, 8) and norm.fits(8192, 1) and not norm.fits(16384, 1)
    with pytest.raises(ValueError, match="padded width of 8192"):
        gated_rms_norm(torch.zeros(1, 16384), torch.ones(16384), backend="triton")


def test_triton_backend_errors_without_interpreter(monkeypatch):
    """The exact error of tk._mode: no interpreter on a CPU tensor, or (without triton) the package."""
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    if tk.triton_available():
        msg = ("the Triton attention backend runs compiled kernels on CUDA tensors only; got a cpu tensor.  "
               "Set TRITON_INTERPRET=1 to run Triton's interpreter on cpu")
    else:
        msg = "the Triton attention backend needs the 'triton' package (pip install -e .[gpu])"
    with pytest.raises(RuntimeError, match=re.escape(msg)):
        gated_rms_norm(torch.randn(2, 8), torch.ones(8), backend="triton")


@needs_triton
@pytest.mark.parametrize("name", ["rela_g", "relu_rmsnorm", "rela_i", "rela_g_layernorm"])
def test_attention_function_uses_the_triton_norm(interp, monkeypatch, name):
    import fairseq_plugins.attention.triton.norm as tn

    calls = []
    real = tn.apply_checked  # what modules.norms.gated_rms_norm(backend="triton") calls
    monkeypatch.setattr(tn, "apply_checked", lambda *a: calls.append(a[3:]) or real(*a))
    for scope, groups in (("concat", 1), ("head", 4)):
        args = argparse.Namespace(attention_backend="triton", rela_norm_scope=scope)
        fn = build_attention_fn(name, 16, 4, args).double()
        ref = build_attention_fn(name, 16, 4, argparse.Namespace(rela_norm_scope=scope)).double()
        ref.load_state_dict(fn.state_dict())
        z = torch.randn(5, 3, 16, dtype=F64)
        torch.testing.assert_close(fn.post_aggregate(z), ref.post_aggregate(z), rtol=1e-13, atol=1e-13)
        if name == "rela_g_layernorm":
            assert calls == []  # LayerNorm stays on torch
        else:
            assert calls[-1] == (1e-8, groups)


# --------------------------------------------------------------------------------------------
# what one attention layer keeps for backward
# --------------------------------------------------------------------------------------------
def saved_activations(name, backend, T=20, B=4, C=64, H=4, dtype=F32):
    """Unique storages (not parameters) with at least ``T*B*C`` elements that autograd keeps for
    backward in one forward of a self-attention layer (no dropout, no weights returned)."""
    torch.manual_seed(0)
    args = argparse.Namespace(attention_backend=backend)
    m = FunctionalMultiheadAttention(C, H, build_attention_fn(name, C, H, args), self_attention=True).to(dtype)
    params = {p.untyped_storage().data_ptr() for p in m.parameters()}
    x = torch.randn(T, B, C, dtype=dtype, requires_grad=True)
    seen = {}

    def pack(t):
        s = t.untyped_storage()
        if s.data_ptr() not in params:
            seen[s.data_ptr()] = max(seen.get(s.data_ptr(), 0), s.nbytes() // t.element_size())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        m(x, x, x, need_weights=False)
    return sum(1 for n in seen.values() if n >= T * B * C)


@needs_triton
@pytest.mark.parametrize("dtype", [F32, BF16])
def test_rela_g_layer_saves_at_most_six_activations(interp, dtype):
    """Issue 28 item 3: the rela_g layer (fused attention + fused gated norm) keeps <= 6
    activation-sized tensors: x, q, k, v, the norm's input z and out_proj's input."""
    rela_g = saved_activations("rela_g", "triton", dtype=dtype)
    softmax = saved_activations("softmax", "torch", dtype=dtype)
    relu = saved_activations("relu", "triton", dtype=dtype)
    msg = f"rela_g saves {rela_g} activation-sized tensors (stock softmax {softmax}, relu without norm {relu})"
    print(msg)
    assert rela_g <= 6, msg
    assert rela_g == relu + 1, msg  # the norm adds its input only


def test_torch_path_norm_adds_only_its_input():
    """On the PyTorch path the (gated) norm keeps one activation-sized tensor, its input."""
    relu = saved_activations("relu", "torch")
    for name in ("rela_g", "relu_rmsnorm", "rela_i"):
        assert saved_activations(name, "torch") == relu + 1, name


# --------------------------------------------------------------------------------------------
# CUDA: the compiled kernel (skipped without a GPU)
# --------------------------------------------------------------------------------------------
@needs_cuda
@pytest.mark.parametrize("dtype", [BF16, torch.float16, F32])
def test_cuda_compiled_kernel_matches_torch(dtype):
    z, w, gt, dy = (t.detach().cuda() for t in inputs((64, 33, 512), dtype=dtype))
    z, w, gt = (t.requires_grad_() for t in (z, w, gt))
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == F32 else dict(rtol=2e-2, atol=2e-2)
    for groups in (1, 8):
        y_t, g_t = run(ours(1e-8, groups, "triton"), z, w, gt, dy, True)
        y_r, g_r = run(ours(1e-8, groups), z, w, gt, dy, True)
        torch.testing.assert_close(y_t, y_r, **tol)
        for a, b in zip(g_t, g_r):
            scale = float(b.abs().max())
            torch.testing.assert_close(a.double() / scale, b.double() / scale, **tol)
    assert tk.self_test("norm", "cuda", dtype) is None


# --------------------------------------------------------------------------------------------
# the inference path (no gradient wanted): torch's rms_norm and the gate, no autograd node
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype,tol", [(F64, 1e-13), (F32, 2e-6)])
@pytest.mark.parametrize("gated", [True, False])
@pytest.mark.parametrize("groups", [1, 4])
def test_inference_path_equals_the_training_op(groups, gated, dtype, tol):
    from fairseq_plugins.modules import norms

    z, w, gt, _ = inputs(dtype=dtype)
    gate = gt if gated else None
    trained = norms._GatedRMSNorm.apply(z, w, gate, 1e-8, groups)  # the op with autograd
    with torch.no_grad():
        y = gated_rms_norm(z, w, gate, 1e-8, groups)
    assert y.grad_fn is None and y.dtype == dtype and not y.requires_grad
    torch.testing.assert_close(y, trained.detach(), rtol=tol, atol=tol)
    assert (y[1, 0] == 0).all()  # null attention stays exactly zero
    # the same without no_grad, for inputs that require no gradient
    y2 = gated_rms_norm(z.detach(), w.detach(), None if gate is None else gate.detach(), 1e-8, groups)
    assert y2.grad_fn is None
    torch.testing.assert_close(y2, y, rtol=0, atol=0)


def test_inference_path_only_when_no_gradient_is_wanted_and_dtypes_agree(monkeypatch):
    from fairseq_plugins.modules import norms

    calls = []
    real = norms._gated_rms_norm_inference
    monkeypatch.setattr(norms, "_gated_rms_norm_inference", lambda *a: calls.append(1) or real(*a))
    z, w, gt, _ = inputs(dtype=F32)
    y = gated_rms_norm(z, w, gt)  # training: the autograd op
    assert calls == [] and type(y.grad_fn).__name__.startswith("_GatedRMSNorm")
    zb, wb, gb, _ = inputs(dtype=BF16)
    with torch.no_grad():
        gated_rms_norm(zb, wb, gb)  # bfloat16: float32 statistics, the op's path
        gated_rms_norm(z, w.double(), gt)  # mixed dtypes: promoted by the op
        assert calls == []
        gated_rms_norm(z, w, gt)
    assert calls == [1]
