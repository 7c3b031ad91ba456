"""ReLUFormer's eq. 7 row terms in one Triton kernel each way (kernel family "stats", issue 28: the
reluformer layer was host-bound on a GPU): the kernels (under the interpreter on CPU) against the
PyTorch path in value and gradient, their edge cases and errors, the attention function's use of
them, and the aten ops a layer step dispatches with them."""

import argparse

import pytest
import torch

import fairseq_plugins.attention.triton as tk
from fairseq_plugins.attention import FunctionalMultiheadAttention, build_attention_fn
from fairseq_plugins.attention.stats import ROW_EPS, reluformer_row_terms as torch_row_terms
from helpers import needs_cuda, needs_triton

F64, F32 = torch.float64, torch.float32


def rows(B=3, H=2, T=11, dtype=F64, seed=0):
    """Row sums with every branch of eq. 7's derivative present: null rows, a live row below
    ROW_EPS, |log z| on both sides of 0, entropies on both sides of c log n."""
    g = torch.Generator().manual_seed(seed)
    w = torch.rand(B, H, T, 6, generator=g, dtype=F64) * torch.rand(B, H, T, 1, generator=g, dtype=F64) * 4
    w[0, 0, :3] = 0.0  # null rows
    w[0, 1, 0] = 0.0
    w[0, 1, 0, 0] = 1e-8  # live, below ROW_EPS
    s = w.sum(-1)
    slogs = (w * w.clamp_min(1e-300).log()).sum(-1)
    return s.to(dtype), slogs.to(dtype)


def reference(row_sum, row_slogs, n, qp, c):
    """The PyTorch path as the attention function runs it (counted_rows, then the row terms)."""
    B, H, T = row_sum.shape
    valid = (n > 0).expand(B, H, T)
    if qp is not None:
        valid = valid & ~qp.unsqueeze(1)
    norm, margin, ent, live = torch_row_terms(row_sum, row_slogs, n, valid, c)
    counted = valid.sum(dtype=live.dtype)
    return norm, margin, ent, live, counted - live, counted


def both(row_sum, row_slogs, n, qp, c, weights):
    """``[(six sums, d row_sum, d row_slogs)]`` of the Triton path and the reference for the loss
    ``weights[0] norm + weights[1] margin`` (a zero weight leaves that term out: its gradient is None)."""
    out = []
    for f in (tk.stats.reluformer_row_terms, reference):
        a, b = (x.detach().clone().requires_grad_() for x in (row_sum, row_slogs))
        sums = f(a, b, n, qp, c)
        loss = sum(w * t for w, t in zip(weights, sums[:2]) if w)
        grads = torch.autograd.grad(loss, (a, b), allow_unused=True)
        out.append((torch.stack(sums).detach(), *[g if g is not None else torch.zeros_like(a) for g in grads]))
    return out


@needs_triton
@pytest.mark.parametrize("n_shape", ["B1T", "11T", "B11", "111"])
@pytest.mark.parametrize("padding", [False, True])
def test_equals_the_torch_path_float64(interp, n_shape, padding):
    """The six sums and both gradients equal the PyTorch path to 1e-12 in float64, for every
    broadcast of n (rows without a key: n = 0), with and without query padding, at c 0, 0.7 and
    1.5, each term's gradient alone and both together; several programs (interpreter blocks of 8)."""
    import fairseq_plugins.attention.triton.stats  # noqa: F401  (tk.stats)

    B, H, T = 3, 2, 11
    row_sum, row_slogs = rows(B, H, T)
    g = torch.Generator().manual_seed(1)
    shape = {"B1T": (B, 1, T), "11T": (1, 1, T), "B11": (B, 1, 1), "111": (1, 1, 1)}[n_shape]
    n = torch.randint(1, 7, shape, generator=g).to(F32)
    n.view(-1)[-1] = 0.0  # rows without a key (the last query, or the last sentence's)
    if n_shape == "111":
        n.fill_(5.0)
    qp = None
    if padding:
        qp = torch.zeros(B, T, dtype=torch.bool)
        qp[1, -4:] = True
        qp[2, :2] = True
    for c in (0.0, 0.7, 1.5):
        for weights in ([0.3, -1.7], [0.3, 0.0], [0.0, -1.7]):
            (s_t, ds_t, dl_t), (s_r, ds_r, dl_r) = both(row_sum, row_slogs, n, qp, c, weights)
            torch.testing.assert_close(s_t, s_r, rtol=1e-12, atol=1e-12)
            torch.testing.assert_close(ds_t, ds_r, rtol=1e-12, atol=1e-12)
            torch.testing.assert_close(dl_t, dl_r, rtol=1e-12, atol=1e-12)
            if weights == [0.3, 0.0]:  # the norm alone: the live row below ROW_EPS gets no gradient
                assert 0 < row_sum[0, 1, 0] < ROW_EPS and ds_t[0, 1, 0] == 0  # (unclamped: -0.3 / z = -3e7)
        if c == 0.0:  # the margin is active on most rows: its gradients are exercised
            assert ds_t.abs().sum() > 0 and dl_t.abs().sum() > 0
    assert s_t[3] > 0 and s_t[4] > 0  # live and null rows present
    assert bool(s_t[5] < B * H * T) == (padding or n_shape != "111")  # uncounted rows: no key or padding


@needs_triton
def test_float32_layouts_and_gradcheck(interp):
    """float32 rows as the attention kernel returns them, in a strided layout (a transposed view),
    agree with the reference to float32 rounding; gradcheck checks the kernel's backward against
    finite differences in float64 (away from the clamp's and |log z|'s kinks)."""
    import fairseq_plugins.attention.triton.stats as ts

    s64, l64 = rows(4, 3, 9)
    n = torch.randint(1, 9, (4, 1, 9), generator=torch.Generator().manual_seed(2)).to(F32)
    s_t = s64.to(F32).transpose(1, 2).contiguous().transpose(1, 2)  # (B, H, T) with stride(1) == 1
    l_t = l64.to(F32).transpose(1, 2).contiguous().transpose(1, 2)
    assert not s_t.is_contiguous()
    (a, da, dla), (b, db, dlb) = both(s_t, l_t, n, None, 0.7, [1.0, 1.0])
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(da, db, rtol=1e-5, atol=1e-5 * float(db.abs().max()))
    torch.testing.assert_close(dla, dlb, rtol=1e-5, atol=1e-5 * float(dlb.abs().max()))
    keep = s64 > 1e-3
    a = s64.masked_fill(~keep, 2.0).requires_grad_()
    b = l64.clone().requires_grad_()
    torch.autograd.gradcheck(lambda x, y: ts.reluformer_row_terms(x, y, n, None, 0.7)[:2], (a, b))


@needs_triton
def test_empty_rows_and_statistics_without_gradient(interp):
    import fairseq_plugins.attention.triton.stats as ts

    a = torch.zeros(2, 3, 0, dtype=F64, requires_grad=True)
    out = ts.reluformer_row_terms(a, torch.zeros(2, 3, 0, dtype=F64), torch.ones(1, 1, 1), None, 0.7)
    assert [float(t) for t in out] == [0.0] * 6
    (g,) = torch.autograd.grad(out[0] + out[1], a)
    assert g.shape == a.shape
    s, l = rows()
    out = ts.reluformer_row_terms(s.requires_grad_(), l, torch.full((1, 1, 1), 4.0), None, 0.7)
    assert out[0].requires_grad and out[1].requires_grad
    assert not any(t.requires_grad for t in out[2:])  # entropy and counts are statistics


@needs_triton
def test_bad_arguments(interp):
    import fairseq_plugins.attention.triton.stats as ts

    s, l = rows(2, 2, 5)
    n = torch.ones(2, 1, 5)
    with pytest.raises(ValueError, match=r"must be \(B, H, T\)"):
        ts.reluformer_row_terms(s[0], l[0], n, None, 0.7)
    with pytest.raises(ValueError, match="float32 or float64"):
        ts.reluformer_row_terms(s.half(), l.half(), n, None, 0.7)
    with pytest.raises(ValueError, match="does not broadcast"):
        ts.reluformer_row_terms(s, l, torch.ones(3, 1, 5), None, 0.7)
    with pytest.raises(ValueError, match="query_padding must be bool"):
        ts.reluformer_row_terms(s, l, n, torch.zeros(2, 4, dtype=torch.bool), 0.7)
    with pytest.raises(ValueError, match="entropy_c must be >= 0"):
        ts.reluformer_row_terms(s, l, n, None, -0.1)


@needs_triton
def test_needs_the_interpreter_on_cpu(monkeypatch):
    import fairseq_plugins.attention.triton.stats as ts

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    s, l = rows(2, 2, 5)
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET=1"):
        ts.reluformer_row_terms(s, l, torch.ones(2, 1, 5), None, 0.7)


@needs_triton
@pytest.mark.parametrize("name", ["reluformer", "reluformer_noscale"])
def test_attention_function_uses_the_kernel(interp, monkeypatch, name):
    """Backend triton records eq. 7 through the kernel, backend torch through the PyTorch path, and
    the records (sums and counts: norm, margin, entropy, null rate) agree -- self-attention with
    key padding (padded queries not counted) and a decoder's causal pattern."""
    import fairseq_plugins.attention.triton.stats as ts

    calls = []
    orig = ts.reluformer_row_terms
    monkeypatch.setattr(ts, "reluformer_row_terms", lambda *a, **kw: calls.append(1) or orig(*a, **kw))
    C, H = 16, 2
    torch.manual_seed(0)
    x = torch.randn(9, 3, C)
    kpm = torch.zeros(3, 9, dtype=torch.bool)
    kpm[1, -4:] = True
    future = torch.triu(torch.full((9, 9), float("-inf")), 1)
    for mask in (None, future):
        records = {}
        for b in ("triton", "torch"):
            torch.manual_seed(0)
            fn = build_attention_fn(name, C, H, argparse.Namespace(attention_backend=b))
            fn.aux.enabled = True
            m = FunctionalMultiheadAttention(C, H, fn, self_attention=True).train()
            n_calls = len(calls)
            y, _ = m(x, x, x, key_padding_mask=kpm, attn_mask=mask, need_weights=False)
            assert len(calls) == n_calls + (b == "triton")
            rec = fn.aux.pop()
            loss = y.square().sum() + rec["reluformer_norm"][0] + rec["reluformer_entropy"][0]
            loss.backward()
            records[b] = ({k: (float(v[0]), float(v[1])) for k, v in rec.items()}, m.q_proj.weight.grad.clone())
        (rec_t, g_t), (rec_r, g_r) = records["triton"], records["torch"]
        assert rec_t.keys() == rec_r.keys() >= {"reluformer_norm", "reluformer_entropy", "attn_entropy",
                                                 "attn_null_rate"}
        for k in rec_r:
            assert rec_t[k] == pytest.approx(rec_r[k], rel=1e-4, abs=1e-6), k
        assert rec_t["attn_null_rate"][1] == 2 * (27 - 4)  # counted rows: H x the 23 unpadded queries
        torch.testing.assert_close(g_t, g_r, rtol=1e-4, atol=1e-4 * float(g_r.abs().max()))


@needs_triton
def test_reluformer_triton_layer_dispatches_no_more_ops_than_stock(interp):
    """Launch overhead: one reluformer layer step (forward + backward, eq. 7 terms in the loss) on
    the Triton backend dispatches no more aten ops -- each a kernel launch on a GPU -- than fairseq's
    stock attention layer measured in the same run (mt-bench-gpu --op-counts; before the fused
    terms it took 64 against stock's 35); its Triton kernels are not aten ops."""
    from mt_pipeline.bench_gpu import layer_cases, op_counts

    cases = layer_cases(16, F32, "cpu", tokens=64, names=["reluformer"], backends=("triton",), kind="enc")
    stock, ours = (sum(op_counts(cases[k]).values()) for k in ("stock", "reluformer triton"))
    assert ours <= stock, (ours, stock)


@needs_cuda
@pytest.mark.parametrize("dtype", [F32, F64])
def test_cuda_compiled_kernel_matches_torch(dtype, monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    assert tk.self_test("stats", "cuda", dtype) is None
    import fairseq_plugins.attention.triton.stats as ts

    s, l = rows(16, 8, 1000, dtype)  # 128,000 rows: 125 programs
    n = torch.randint(0, 50, (16, 1, 1000), generator=torch.Generator().manual_seed(3)).float()
    qp = torch.rand(16, 1000, generator=torch.Generator().manual_seed(4)) < 0.1
    (a, da, dla), (b, db, dlb) = both(s.cuda(), l.cuda(), n.cuda(), qp.cuda(), 0.7, [1.0, -0.5])
    tol = 1e-10 if dtype == F64 else 1e-4
    for x, y in ((a, b), (da, db), (dla, dlb)):
        torch.testing.assert_close(x, y, rtol=tol, atol=tol * float(y.abs().max()))


@needs_triton
def test_self_test_passes_and_catches_a_wrong_kernel(interp, monkeypatch):
    """--attention-backend auto's start-up check: passes on the interpreter in float32 and float64,
    and names the disagreement when the kernel's output is off (then the torch path is used)."""
    import fairseq_plugins.attention.triton.stats as ts

    assert tk.self_test("stats", "cpu", F32) is None and tk.self_test("stats", "cpu", F64) is None
    apply = ts._RowTerms.apply
    monkeypatch.setattr(ts._RowTerms, "apply", lambda *a: tuple(t * 1.01 for t in apply(*a)))
    assert tk.self_test("stats", "cpu", F32).startswith("norm relative error")
    # each sum is compared on its own scale: an error in a small sum is not hidden by the counts
    monkeypatch.setattr(ts._RowTerms, "apply", lambda *a: tuple(t + 0.03 * (i == 2) for i, t in enumerate(apply(*a))))
    assert tk.self_test("stats", "cpu", F32).startswith("entropy relative error")


@needs_triton
def test_half_row_sums_take_the_torch_path(interp):
    """Half-precision row sums (the torch attention's row sums are float32 since RowMassTerms
    accumulates in float32, but a caller may pass half rows): the kernel takes float32/float64 only,
    so record_terms keeps half rows on the torch path (which counts in float32) instead of failing
    (on a GPU: --attention-backend auto with the rectified kernels refused but the stats kernels not)."""
    import fairseq_plugins.attention.triton.stats as ts

    s, l = rows(2, 2, 5, F32)
    with pytest.raises(ValueError, match="float32 or float64"):
        ts.reluformer_row_terms(s.half(), l.half(), torch.ones(2, 1, 5), None, 0.7)
    recs = []
    for b in ("triton", "torch"):
        fn = build_attention_fn("reluformer", 8, 2, argparse.Namespace(attention_backend=b))
        fn.aux.enabled = True
        fn.record_terms(s.half(), l.half(), torch.full((2, 1, 5, 1), 4.0))
        recs.append({k: (float(v[0]), float(v[1])) for k, v in fn.aux.pop().items()})
    assert recs[0] == recs[1]


@needs_triton
def test_nan_row_sum_counts_as_null(interp):
    """A NaN row sum is not live: it enters no term and is counted null, so null + live = counted
    (the torch path's null is counted - live)."""
    import fairseq_plugins.attention.triton.stats as ts

    s, l = rows(2, 2, 5)
    s[1, 1, 2] = float("nan")
    norm, margin, ent, live, null, counted = ts.reluformer_row_terms(s, l, torch.ones(2, 1, 5), None, 0.7)
    assert torch.isfinite(torch.stack([norm, margin, ent])).all()
    assert float(live + null) == float(counted) == 20 and float(live) == float((s > 0).sum())
