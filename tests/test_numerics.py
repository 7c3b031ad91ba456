"""bf16 autocast on CPU: every registered attention function stays finite.

Covers fully padded rows (every key of a batch item masked), null rows (no positive score:
the ReLU family's null attention), sentence-length inputs through the module (forward,
backward, auxiliary terms), and long sequences (L = 2048) through ReLUFormer's attention
(the plain path under autocast and the chunked kernel) with eq. 7's regulariser terms.
"""

import argparse
import math

import pytest
import torch

from fairseq_plugins.attention.functions import attention_fn_names, build_attention_fn
from fairseq_plugins.attention.kernels import relu_attention
from fairseq_plugins.attention.multihead import FunctionalMultiheadAttention
from fairseq_plugins.modules.auxiliary import collect_auxiliary, enable_auxiliary

ALL = attention_fn_names()
C, H = 16, 2
ARGS = argparse.Namespace(reluformer_gamma=1.0, reluformer_entropy_c=0.7, rela_norm_eps=1e-8)


def bf16():
    return torch.autocast("cpu", dtype=torch.bfloat16)


def _finite(*tensors):
    return all(torch.isfinite(t.float()).all().item() for t in tensors if t is not None)


@pytest.mark.parametrize("name", ALL)
def test_normalize_bf16_padded_and_null_rows(name):
    """normalize() on bf16 scores (as autocast's matmul returns them): finite, zero padded rows."""
    fn = build_attention_fn(name, C, H, ARGS)
    g = torch.Generator().manual_seed(0)
    scores = (torch.randn(3, H, 4, 6, generator=g) * 30).bfloat16()  # large: bf16 overflow bait
    scores[0, 1, 2] = -scores[0, 1, 2].abs() - 0.5  # a null row for the ReLU family
    scores[2, 0, 1] = 0  # a row of ties
    mask = torch.zeros(3, 1, 1, 6, dtype=torch.bool)
    mask[1] = True  # every key of batch item 1 is padding
    mask[2, ..., 4:] = True
    with bf16():
        w = fn.normalize(scores, mask)
    assert _finite(w), name
    assert torch.equal(w[1].float(), torch.zeros_like(w[1].float()))


@pytest.mark.parametrize("name", ALL)
def test_module_bf16_autocast_forward_backward_and_aux(name):
    """Self- and cross-attention under autocast, with a fully padded source, in training mode."""
    torch.manual_seed(0)
    self_attn = FunctionalMultiheadAttention(C, H, build_attention_fn(name, C, H, ARGS), self_attention=True)
    cross = FunctionalMultiheadAttention(C, H, build_attention_fn(name, C, H, ARGS),
                                         encoder_decoder_attention=True)
    mods = torch.nn.ModuleList([self_attn, cross]).train()
    enable_auxiliary(mods)
    x = (torch.randn(7, 3, C) * 4).requires_grad_()
    mem = torch.randn(9, 3, C) * 4
    kpm = torch.zeros(3, 9, dtype=torch.bool)
    kpm[1] = True  # all keys padded
    kpm[2, 5:] = True
    causal = torch.triu(torch.full((7, 7), float("-inf")), 1)
    with bf16():
        h, _ = self_attn(x, x, x, attn_mask=causal, need_weights=False)
        out, w = cross(h, mem, mem, key_padding_mask=kpm, need_weights=True)
        aux = collect_auxiliary(mods)
        loss = out.float().pow(2).mean() + sum(m for m, is_loss, _ in aux.values() if is_loss)
    loss.backward()
    assert _finite(h, out, w, x.grad), name
    assert all(_finite(m) for m, _, _ in aux.values()), {k: v[0] for k, v in aux.items()}
    assert all(_finite(p.grad) for p in mods.parameters() if p.grad is not None), name
    # a source with every key padded attends to nothing: zero output for every function at
    # initialisation (out_proj bias 0; the LayerNorm variant's beta 0 -- trained, LN(0) = beta
    # by design of ReLA Table 1 row 8, so this holds at init only)
    assert torch.equal(out[:, 1].float(), torch.zeros_like(out[:, 1].float())), name


@pytest.mark.parametrize("name", ["reluformer", "reluformer_noscale"])
def test_reluformer_long_sequence_bf16(name):
    """L = 2048 self-attention under autocast (plain path), regulariser finite, outputs close to
    float32 (bf16 has 8 mantissa bits: 2**-8 relative per rounding; tolerance 5e-2 relative)."""
    torch.manual_seed(0)
    L = 2048
    m = FunctionalMultiheadAttention(C, H, build_attention_fn(name, C, H, ARGS), self_attention=True).train()
    enable_auxiliary(m)
    x = torch.randn(L, 1, C) * 3
    kpm = torch.zeros(1, L, dtype=torch.bool)
    kpm[0, -100:] = True
    with bf16():
        out, _ = m(x, x, x, key_padding_mask=kpm, need_weights=False)
        aux = collect_auxiliary(m)
    assert out.dtype == torch.bfloat16 and _finite(out)
    for key in ("reluformer_norm", "reluformer_entropy"):
        assert _finite(aux[key][0]), key
    ref, _ = m(x, x, x, key_padding_mask=kpm, need_weights=False)  # float32
    ref_aux = collect_auxiliary(m)
    scale = ref.abs().max().item()
    assert (out.float() - ref).abs().max().item() <= 5e-2 * scale
    assert math.isclose(aux["reluformer_norm"][0].item(), ref_aux["reluformer_norm"][0].item(), rel_tol=5e-2)


def test_relu_kernel_long_sequence_under_autocast():
    """The chunked ReLU kernel (float32 operands) called inside a bf16 autocast region at
    L = 2048, with a padded tail, a null row and a fully masked query row: finite outputs,
    statistics and gradients, equal to the kernel outside autocast (its GEMMs write into
    float32 buffers, so autocast must not change them: tolerance 1e-5 relative)."""
    torch.manual_seed(0)
    B, Hh, L, d = 1, 2, 2048, 8
    q = torch.randn(B, Hh, L, d) / math.sqrt(d)
    q[0, 0, 5] = 0  # null row: no positive score
    k, v = torch.randn(B, Hh, L, d), torch.randn(B, Hh, L, d)
    mask = torch.zeros(B, 1, 1, L, dtype=torch.bool)
    mask[..., -64:] = True
    r = torch.full((B, Hh, L, 1), 1.0 / math.sqrt((L - 64) / 2))
    r[0, 1, 7] = 0.0  # a row with n = 0 (fully masked query)

    def run(autocast):
        qq, kk, vv = (t.clone().requires_grad_() for t in (q, k, v))
        ctx = bf16() if autocast else torch.autocast("cpu", enabled=False)
        with ctx:
            out, (rs, rsl) = relu_attention(qq, kk, vv, r, mask=mask, need_stats=True, chunk_size=256)
            loss = out.sum() + torch.log(rs.clamp_min(1e-6)).abs().sum() + rsl.sum()
        loss.backward()
        return out, rs, rsl, qq.grad, kk.grad, vv.grad

    got, want = run(True), run(False)
    assert "Chunked" in relu_attention(q.requires_grad_(), k, v, r, mask=mask, chunk_size=256).grad_fn.name()
    for a, b in zip(got, want):
        assert a.dtype == torch.float32 and _finite(a)
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    assert torch.equal(got[0][0, 0, 5], torch.zeros(d))
