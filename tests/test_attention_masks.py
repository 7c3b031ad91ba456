"""``attn_mask`` / ``key_padding_mask`` dtypes of FunctionalMultiheadAttention (issue 21, item 4).

fairseq's own MultiheadAttention tests (``tests/test_multihead_attention.py``,
``test_xformers_single_forward_parity``) run every ``attn_mask`` dtype in
``[None, uint8, bool, float]`` and ``key_padding_mask`` dtype in ``[None, uint8, bool]``.  Adapted
to this class (softmax vs stock fairseq), the uint8 ``attn_mask`` cases used to *pass through as
no mask at all* (non-bool masks were read as additive and only -inf blocked).  Now: bool and
0/-inf float masks match stock fairseq exactly; integer masks and finite additive biases raise,
as torch's ``multi_head_attention_forward`` does for integer masks.
"""

import pytest
import torch
from fairseq.modules import MultiheadAttention

from fairseq_plugins.attention import FunctionalMultiheadAttention, build_attention_fn
from fairseq_plugins.attention.multihead import attn_mask_to_bool

C, H, T, B = 16, 4, 12, 5


def _pair(**kw):
    torch.manual_seed(0)
    stock = MultiheadAttention(C, H, dropout=0.0, **kw)
    ours = FunctionalMultiheadAttention(C, H, build_attention_fn("softmax", C, H), **kw)
    ours.load_state_dict(stock.state_dict())
    return stock.eval(), ours.eval()


def _masks(attn_dtype, kpm_dtype, seed=0):
    """Random masks as fairseq's test builds them (``_get_mask``), with key 0 always allowed so
    that no row is fully masked (stock fairseq gives NaN there, this class zeros)."""
    g = torch.Generator().manual_seed(seed)
    attn = kpm = None
    if attn_dtype is not None:
        blocked = torch.randint(0, 2, (T, T), generator=g).bool()
        blocked[:, 0] = False
        attn = (torch.zeros(T, T).masked_fill(blocked, float("-inf")) if attn_dtype == torch.float
                else blocked.to(attn_dtype))
    if kpm_dtype is not None:
        pad = torch.randint(0, 2, (B, T), generator=g).bool()
        pad[:, 0] = False
        kpm = pad.to(kpm_dtype)
    return attn, kpm


@pytest.mark.parametrize("kpm_dtype", [None, torch.uint8, torch.bool])
@pytest.mark.parametrize("attn_dtype", [None, torch.bool, torch.float])
def test_mask_dtypes_match_stock_fairseq(attn_dtype, kpm_dtype):
    """bool (True = blocked) and float 0/-inf attention masks, integer or bool padding masks
    (nonzero = padding): outputs, weights and gradients equal to stock fairseq's."""
    stock, ours = _pair()
    attn, kpm = _masks(attn_dtype, kpm_dtype)
    x = torch.rand(T, B, C)
    xs, xo = x.clone().requires_grad_(), x.clone().requires_grad_()
    a, wa = stock(xs, xs, xs, key_padding_mask=kpm, attn_mask=attn, need_weights=True)
    b, wb = ours(xo, xo, xo, key_padding_mask=kpm, attn_mask=attn, need_weights=True)
    torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(wb, wa, rtol=1e-5, atol=1e-6)
    a.norm().backward()
    b.norm().backward()
    torch.testing.assert_close(xo.grad, xs.grad, rtol=1e-5, atol=1e-6)
    if attn is not None:  # the mask is honoured: blocked pairs get exactly zero weight
        assert (wb[:, attn_mask_to_bool(attn)] == 0).all()


@pytest.mark.parametrize("dtype", [torch.uint8, torch.int8, torch.int32, torch.int64])
def test_integer_attn_mask_is_refused_like_torch(dtype):
    """The probe: a uint8 causal mask used to give exactly the unmasked output.  Now it raises,
    naming the ways to pass a mask; torch's MultiheadAttention (which stock fairseq calls in
    training) refuses it too."""
    stock, ours = _pair(self_attention=True)
    causal = torch.triu(torch.ones(T, T, dtype=dtype), 1)
    x = torch.rand(T, B, C)
    with pytest.raises(ValueError, match=r"attn_mask of dtype torch\.\w+ is ambiguous.*bool mask.*-inf"):
        ours(x, x, x, attn_mask=causal)
    with pytest.raises(AssertionError, match="only bool and floating types of attn_mask"):
        stock(x, x, x, attn_mask=causal)
    # what the user meant, either way, is the bool / -inf future mask, and those agree
    with_bool, _ = ours(x, x, x, attn_mask=causal.bool())
    with_inf, _ = ours(x, x, x, attn_mask=torch.zeros(T, T).masked_fill(causal.bool(), float("-inf")))
    unmasked, _ = ours(x, x, x)
    assert torch.equal(with_bool, with_inf) and not torch.allclose(with_bool, unmasked)


@pytest.mark.parametrize("bias", ["-1e4", "finfo.min", "alibi", "nan", "+inf"])
def test_float_attn_mask_with_a_finite_bias_is_refused(bias):
    """Float entries other than 0 and -inf (an additive bias, or a "large negative" mask) are
    added to the scores by torch / stock fairseq; the attention functions here take a mask, so
    such a mask raises instead of being silently ignored (it used to be: -1e4 behaved as no mask)."""
    _, ours = _pair(self_attention=True)
    upper = torch.ones(T, T).triu(1).bool()
    masks = {"-1e4": torch.zeros(T, T).masked_fill(upper, -1e4),
             "finfo.min": torch.zeros(T, T).masked_fill(upper, torch.finfo(torch.float32).min),
             "alibi": -(torch.arange(T)[None, :] - torch.arange(T)[:, None]).abs().float() * 0.5,
             "nan": torch.zeros(T, T).masked_fill(upper, float("nan")),
             "+inf": torch.zeros(T, T).masked_fill(upper, float("inf"))}
    x = torch.rand(T, B, C)
    with pytest.raises(ValueError, match="entries other than 0 and -inf.*refused rather than ignored"):
        ours(x, x, x, attn_mask=masks[bias])


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64])
def test_half_precision_future_masks_are_accepted(dtype):
    """fairseq's future mask follows the activations' dtype (``.to(tensor)``): fp16/bf16 0/-inf
    masks give the same bool mask as float32 ones."""
    upper = torch.ones(T, T).triu(1).bool()
    m = torch.zeros(T, T, dtype=dtype).masked_fill(upper, float("-inf"))
    assert torch.equal(attn_mask_to_bool(m), upper)


def test_mask_check_is_cached_per_buffer_but_sees_in_place_changes():
    """Views of one buffered future mask (as fairseq's decoder passes to every layer) are checked
    once per shape; an in-place change of the buffer is checked again; a fresh tensor always is."""
    import fairseq_plugins.attention.multihead as mh

    buf = torch.zeros(T, T).masked_fill(torch.ones(T, T).triu(1).bool(), float("-inf"))
    for n in (T, T - 3, T):
        assert torch.equal(attn_mask_to_bool(buf[:n, :n]), torch.ones(n, n).triu(1).bool())
    assert id(buf) in mh._CHECKED_MASKS and len(mh._CHECKED_MASKS[id(buf)][1]) == 2
    buf[T - 1, 0] = -5.0  # the same storage, now holding a bias
    with pytest.raises(ValueError, match="entries other than 0 and -inf"):
        attn_mask_to_bool(buf[:T, :T])
    del buf
    fresh = torch.zeros(T, T)
    fresh[0, 1] = 3.0
    with pytest.raises(ValueError):
        attn_mask_to_bool(fresh)
    with torch.inference_mode():  # inference tensors have no version counter: checked every call
        inf_mask = torch.zeros(T, T)
        attn_mask_to_bool(inf_mask)
        inf_mask[0, 1] = 2.0
        with pytest.raises(ValueError):
            attn_mask_to_bool(inf_mask)


def test_attn_mask_of_the_wrong_shape_is_refused():
    _, ours = _pair(self_attention=True)
    x = torch.rand(T, B, C)
    with pytest.raises(ValueError, match=r"attn_mask must be \(T, S\)"):
        ours(x, x, x, attn_mask=torch.zeros(B * H, T, T))
