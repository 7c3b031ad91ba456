"""The one multi-head attention module of the plugin, driven by a registered attention function.

Shape legend: T query length, S key length, B batch, Bk batch of the keys (``B = Bk * beam``
in beam-searched cross-attention), H heads, d head dim, C = H * d.

fairseq's ``MultiheadAttention.forward`` calls the fused softmax kernel
(``F.multi_head_attention_forward``) whenever ``incremental_state is None`` -- i.e. in all of
training -- so overriding only the normaliser would silently train softmax.  This subclass
owns ``forward`` and keeps everything else of the parent: ``q_proj/k_proj/v_proj/out_proj``
names and initialisation (stock checkpoints load), the incremental buffers
(``prev_key``/``prev_value``/``prev_key_padding_mask``), ``reorder_incremental_state`` and
the beam-size trick of cross-attention.
"""

import math
import weakref
from typing import Dict, Optional, Tuple

import torch
from fairseq.modules import MultiheadAttention
from fairseq.modules.quant_noise import quant_noise
from torch import Tensor, nn

from .functions import AttentionFunction
from .masks import causal_mask, combined_mask

__all__ = ["FunctionalMultiheadAttention", "attn_mask_to_bool", "check_attn_mask"]

#: attention masks already checked: ``id(base tensor)`` -> ``(weakref to it, {(shape, stride,
#: offset, version): is_causal})``; the entry goes with the tensor and the weakref is compared, so
#: a freed mask's id or address is never mistaken for a checked one.  fairseq's decoder passes
#: views of one buffered future mask to every layer of every forward, so the check (float
#: entries 0 / -inf; whether the mask is the causal pattern) costs one device sync per new target
#: length, not one per layer and forward.
_CHECKED_MASKS: Dict[int, Tuple["weakref.ref", dict]] = {}


def attn_mask_to_bool(attn_mask: Tensor) -> Tensor:
    """fairseq's / torch's ``attn_mask`` ``(T, S)`` as a bool mask ``(T, S)``, True = blocked.

    Accepted, as ``torch.nn.MultiheadAttention`` and fairseq's ``MultiheadAttention`` define
    them:

    * ``torch.bool``: True = blocked (the ``nn.MultiheadAttention`` convention -- the opposite of
      ``F.scaled_dot_product_attention``, where True = attend);
    * floating point, every entry ``0`` (allowed) or ``-inf`` (blocked): fairseq's future mask
      (``utils.fill_with_neg_inf`` + ``triu``).

    Refused:

    * integer dtypes (``uint8`` ...): torch's ``multi_head_attention_forward`` and
      ``scaled_dot_product_attention`` refuse them too, and the convention is ambiguous (the old
      ByteTensor masks of fairseq and torch < 1.2 block 1, HuggingFace's ``attention_mask``
      keeps 1); reading them as floats would block nothing;
    * floats with finite non-zero entries (an additive bias: ALiBi, a relative-position bias,
      ``torch.finfo(dtype).min`` or ``-1e4`` for blocked keys) or NaN / +inf.  torch and stock
      fairseq add such biases to the scores before the softmax; the attention functions here
      (ReLU, sparsemax, entmax, ...) take a mask, not a bias, so a bias cannot be honoured and
      is refused rather than ignored.

    Raises:
        ValueError: integer dtype, or a float mask with entries other than 0 and -inf; the
            message says how to pass the mask instead.
    """
    return check_attn_mask(attn_mask)[0]


def check_attn_mask(attn_mask: Tensor) -> Tuple[Tensor, bool]:
    """``(attn_mask_to_bool(attn_mask), is_causal)`` for an ``attn_mask`` ``(T, S)``.

    ``is_causal``: ``T <= S`` and the mask blocks exactly the keys ``j > i + (S - T)`` (fairseq's
    future mask ``triu(-inf, 1)`` when ``T == S``; bottom-right aligned when queries continue a
    prefix).  Both checks run together, one device sync, once per mask tensor view and version
    (:data:`_CHECKED_MASKS`; inference tensors, which keep no version counter, every call).

    Raises:
        ValueError: as :func:`attn_mask_to_bool`.
    """
    if attn_mask.dtype == torch.bool:
        blocked = attn_mask
    elif not attn_mask.is_floating_point():
        raise ValueError(
            f"attn_mask of dtype {attn_mask.dtype} is ambiguous and not supported (as in torch's "
            "MultiheadAttention): pass a bool mask (True = blocked, e.g. mask.bool() for an old "
            "fairseq ByteTensor mask where 1 = blocked) or a float mask with -inf at blocked "
            "positions and 0 elsewhere")
    else:
        blocked = torch.isneginf(attn_mask)
    base = attn_mask if attn_mask._base is None else attn_mask._base
    key = None
    if not attn_mask.is_inference():  # inference tensors keep no version counter: always checked
        key = (tuple(attn_mask.shape), attn_mask.stride(), attn_mask.storage_offset(), attn_mask._version)
    entry = _CHECKED_MASKS.get(id(base))
    checked = entry[1] if entry is not None and entry[0]() is base else None
    if key is not None and checked is not None and key in checked:
        return blocked, checked[key]
    flags = [blocked.new_ones(()) if blocked is attn_mask else (blocked | (attn_mask == 0)).all()]
    T, S = (attn_mask.shape if attn_mask.dim() == 2 else (1, 0))
    flags.append((blocked == causal_mask(T, S, blocked.device)).all() if T <= S else blocked.new_zeros(()))
    valid, is_causal = (bool(f) for f in torch.stack(flags).tolist())  # one device sync
    if not valid:
        bad = attn_mask[~(blocked | (attn_mask == 0))]
        raise ValueError(
            f"attn_mask holds {bad.numel()} entries other than 0 and -inf (e.g. "
            f"{bad.flatten()[:3].tolist()}): an additive bias is not supported by "
            "FunctionalMultiheadAttention (its attention functions take a mask, not a bias), "
            "and it is refused rather than ignored; pass a bool mask (True = blocked) or a "
            "float mask with -inf at blocked positions and 0 elsewhere")
    if key is not None:
        if checked is None:
            bid = id(base)
            checked = {}
            _CHECKED_MASKS[bid] = (weakref.ref(base, lambda _, bid=bid: _CHECKED_MASKS.pop(bid, None)),
                                   checked)
        checked[key] = is_causal
    return blocked, is_causal


class FunctionalMultiheadAttention(MultiheadAttention):
    """Multi-head attention whose score/normaliser/post-aggregation come from ``attn_fn``.

    ``MHA(X, Y) = W_o post([alpha_1 V_1, ..., alpha_H V_H])`` with
    ``alpha_h = normalize(score(Q_h, K_h))`` (Vaswani et al. 2017, Section 3.2.2; ReLA eqs. 1-3).

    Args:
        embed_dim, num_heads, kdim, vdim, dropout, bias, self_attention,
        encoder_decoder_attention, q_noise, qn_block_size: as fairseq's ``MultiheadAttention``.
        attn_fn: the :class:`~fairseq_plugins.attention.functions.AttentionFunction` instance
            (registered as the submodule ``attn_fn``).  Its ``qk_dim`` sizes ``q_proj`` /
            ``k_proj`` (``C -> qk_dim``; ``C`` but for E-ATT's ``--eatt-qk-dim``): queries and keys
            are ``(B, H, T, qk_dim / H)``, values ``(B, H, S, d)``.

    Raises:
        ValueError: ``add_bias_kv``/``add_zero_attn``/xformers requested (not supported), or
            ``attn_fn`` is not an ``AttentionFunction``.
    """

    def __init__(self, embed_dim, num_heads, attn_fn: AttentionFunction, kdim=None, vdim=None,
                 dropout=0.0, bias=True, self_attention=False, encoder_decoder_attention=False,
                 q_noise=0.0, qn_block_size=8, add_bias_kv=False, add_zero_attn=False,
                 xformers_att_config=None):
        if add_bias_kv or add_zero_attn or xformers_att_config:
            raise ValueError(
                "FunctionalMultiheadAttention does not support add_bias_kv, add_zero_attn or "
                "xformers_att_config; use the stock 'transformer' arch for those"
            )
        if not isinstance(attn_fn, AttentionFunction):
            raise ValueError(f"attn_fn must be an AttentionFunction, got {type(attn_fn).__name__}")
        super().__init__(
            embed_dim, num_heads, kdim=kdim, vdim=vdim, dropout=dropout, bias=bias,
            self_attention=self_attention, encoder_decoder_attention=encoder_decoder_attention,
            q_noise=q_noise, qn_block_size=qn_block_size,
        )
        if attn_fn.embed_dim != embed_dim or attn_fn.num_heads != num_heads:
            raise ValueError("attn_fn was built for a different embed_dim/num_heads")
        if attn_fn.qk_dim != embed_dim:
            # narrower W_Q / W_K (E-ATT's --eatt-qk-dim, the official code's C/H): rebuilt with
            # fairseq's initialisation of the projections (reset_parameters); the default width
            # keeps the parent's modules, so default models draw the same random numbers as before
            gain = 1 / math.sqrt(2) if self.qkv_same_dim else 1.0
            self.q_proj = quant_noise(nn.Linear(embed_dim, attn_fn.qk_dim, bias=bias), q_noise, qn_block_size)
            self.k_proj = quant_noise(nn.Linear(self.kdim, attn_fn.qk_dim, bias=bias), q_noise, qn_block_size)
            nn.init.xavier_uniform_(self.q_proj.weight, gain=gain)
            nn.init.xavier_uniform_(self.k_proj.weight, gain=gain)
        self.attn_fn = attn_fn
        self._freeze_unused()
        #: ``(B, T)`` bool padding of the *queries* of a cross-attention call, or None; set by
        #: the decoder layer around each forward (self-attention derives it from its keys)
        self.query_padding_mask: Optional[Tensor] = None

    def _freeze_unused(self) -> None:
        """``requires_grad=False`` on the projections the attention function never reads
        (:attr:`AttentionFunction.unused_projections`, e.g. the Synthesizers' ``k_proj``): they
        would get no gradient anyway, and torch DDP refuses parameters without one (fairseq's
        default ``--ddp-backend pytorch_ddp`` on GPUs) unless ``--find-unused-parameters``."""
        for name in self.attn_fn.unused_projections:
            getattr(self, name).requires_grad_(False)

    def _split_heads(self, x: Tensor) -> Tensor:
        # (L, B, C') -> (B, H, L, C'/H): C' = C for values, attn_fn.qk_dim for queries / keys
        L, B, width = x.shape
        return x.view(L, B, self.num_heads, width // self.num_heads).permute(1, 2, 0, 3)

    def forward(
        self,
        query: Tensor,
        key: Optional[Tensor],
        value: Optional[Tensor],
        key_padding_mask: Optional[Tensor] = None,
        incremental_state: Optional[Dict[str, Dict[str, Optional[Tensor]]]] = None,
        need_weights: bool = True,
        static_kv: bool = False,
        attn_mask: Optional[Tensor] = None,
        before_softmax: bool = False,
        need_head_weights: bool = False,
    ) -> Tuple[Tensor, Optional[Tensor]]:
        """Attend from ``query`` to ``key``/``value``.

        Args:
            query: ``(T, B, C)``.  key, value: ``(S, Bk, C)`` or None (self-attention /
                cached cross-attention).
            key_padding_mask: ``(Bk, S)``, nonzero = padding.
            incremental_state: fairseq's decoding cache (beam search).
            need_weights / need_head_weights: return weights averaged over heads
                ``(B, T, S)`` / per head ``(H, B, T, S)`` (fairseq's layout).
            static_kv: keys/values are fixed across steps (cross-attention).
            attn_mask: ``(T, S)`` -- bool (True = blocked) or float with ``-inf`` at blocked
                positions and 0 elsewhere (fairseq's future mask); integer masks and finite
                additive biases raise (:func:`attn_mask_to_bool`).  The causal pattern (keys
                ``j > i + (S - T)`` blocked, ``T <= S``) reaches the attention function as
                ``causal=True`` beside the compact ``key_padding_mask`` ``(Bk, 1, 1, S)``
                (:meth:`_build_mask`); any other mask as a general ``(Bk|1, 1, T, S)`` one.
            before_softmax: not supported (there need not be a softmax).

        Returns:
            ``(attn (T, B, C), weights or None)``.

        Raises:
            ValueError: ``before_softmax=True``; an integer ``attn_mask`` or one with entries
                other than 0 / -inf (:func:`attn_mask_to_bool`).
        """
        if before_softmax:
            raise ValueError(
                f"before_softmax is not supported by attention function {self.attn_fn.name!r}"
            )
        need_weights = need_weights or need_head_weights
        tgt_len, bsz, _ = query.shape

        saved_state = None
        if incremental_state is not None:
            saved_state = self._get_input_buffer(incremental_state)
            if static_kv and "prev_key" in saved_state:
                key = value = None  # cached cross-attention keys/values

        fn = self.attn_fn
        q = self._split_heads(self.q_proj(fn.transform_input(query, "query")))  # (B, H, T, d_qk)
        k = v = None
        if self.self_attention:
            k = self._split_heads(self.k_proj(fn.transform_input(query, "key")))
            v = self._split_heads(self.v_proj(query))
        elif key is not None:
            if self.encoder_decoder_attention and self.beam_size > 1 and bsz == key.size(1):
                # keys are (S, Bk*beam, C) with identical beams: keep one copy, (S, Bk, C)
                key = key.view(key.size(0), -1, self.beam_size, key.size(2))[:, :, 0]
                value = key if value is None else value.view(
                    value.size(0), -1, self.beam_size, value.size(2))[:, :, 0]
                if key_padding_mask is not None:
                    key_padding_mask = key_padding_mask.view(
                        -1, self.beam_size, key_padding_mask.size(1))[:, 0]
            k = self._split_heads(self.k_proj(fn.transform_input(key, "key")))  # (Bk, H, S, d_qk)
            v = self._split_heads(self.v_proj(value))

        if saved_state is not None:
            if "prev_key" in saved_state:  # stored as (Bk, H, S, d)
                prev_k, prev_v = saved_state["prev_key"], saved_state["prev_value"]
                if static_kv:
                    k, v = prev_k, prev_v
                else:
                    k = torch.cat([prev_k, k], dim=2)
                    v = torch.cat([prev_v, v], dim=2)
            key_padding_mask = MultiheadAttention._append_prev_key_padding_mask(
                key_padding_mask=key_padding_mask,
                prev_key_padding_mask=saved_state.get("prev_key_padding_mask"),
                batch_size=k.size(0),
                src_len=k.size(2),
                static_kv=static_kv,
            )
            saved_state["prev_key"], saved_state["prev_value"] = k, v
            saved_state["prev_key_padding_mask"] = key_padding_mask
            self._set_input_buffer(incremental_state, saved_state)
        assert k is not None and v is not None
        kv_bsz, src_len = k.size(0), k.size(2)
        beam = bsz // kv_bsz
        q_pos = k_pos = q_bound = None
        if fn.uses_positions:
            q_pos, k_pos = self._positions(key_padding_mask, incremental_state, saved_state,
                                           kv_bsz, tgt_len, src_len, q.device)
            # a static bound of the query positions (None: only the offset in the cache knows)
            q_bound = src_len if self.self_attention else (tgt_len if saved_state is None else None)
        if beam > 1:
            # beams of one sentence share keys: treat them as extra queries,
            # (B, H, T, d) -> (Bk, beam, H, T, d) -> (Bk, H, beam*T, d)
            dq = q.size(-1)  # attn_fn.qk_head_dim
            q = q.view(kv_bsz, beam, self.num_heads, tgt_len, dq)
            q = q.transpose(1, 2).reshape(kv_bsz, self.num_heads, beam * tgt_len, dq)
            if q_pos is not None:  # (B|1, T) -> (Bk|1, beam*T), as q
                q_pos = q_pos.reshape(-1, beam * tgt_len) if q_pos.size(0) > 1 else q_pos.repeat(1, beam)

        # key padding (Bk, 1, 1, S) or a general mask (Bk|1, 1, T, S), and fairseq's future mask
        # as a flag: every attention function gets the pair (no (T, S) pattern is built here)
        mask, causal = self._build_mask(key_padding_mask, attn_mask, kv_bsz, src_len)
        # padded query rows, for statistics and auxiliary losses only (recording is off in
        # generation): self-attention queries are the keys' positions, cross-attention ones are
        # the decoder's (set by the decoder layer in `query_padding_mask`)
        fn.query_padding = None
        if fn.aux.enabled and incremental_state is None and beam == 1:
            if self.self_attention:
                if key_padding_mask is not None and key_padding_mask.dim() > 0 and src_len == tgt_len:
                    fn.query_padding = key_padding_mask.to(torch.bool)
            else:
                fn.query_padding = self.query_padding_mask
        dropout_p = self.dropout_module.p if (
            self.training or self.dropout_module.apply_during_inference) else 0.0
        # the fused kernels take one head dimension for queries, keys and values
        use_fused = not (need_weights or beam > 1 or fn.wants_weights()) and q.size(-1) == v.size(-1)
        out = fn.fused(q, k, v, mask, dropout_p, causal=causal) if use_fused else None
        weights = None
        if out is None:
            scores = fn.score(q, k) if q_pos is None else fn.score_at(q, k, q_pos, k_pos, q_bound)  # (Bk, H, T', S)
            mask = combined_mask(mask, causal, tgt_len, src_len, q.device)  # (Bk|1, 1, T|1, S)
            if beam > 1 and mask is not None and mask.size(2) > 1:
                mask = mask.repeat(1, 1, beam, 1)
            weights = fn.normalize(scores, mask)  # (Bk, H, T', S)
            fn.observe(weights, mask)
            out = torch.matmul(self.dropout_module(weights), v)  # (Bk, H, T', d)
        if beam > 1:
            out = out.view(kv_bsz, self.num_heads, beam, tgt_len, self.head_dim).transpose(1, 2)
            if weights is not None:
                weights = weights.view(kv_bsz, self.num_heads, beam, tgt_len, src_len).transpose(1, 2)
        # (B, H, T, d) -> (T, B, H, d) -> (T, B, C)
        out = out.reshape(bsz, self.num_heads, tgt_len, self.head_dim).permute(2, 0, 1, 3)
        out = out.reshape(tgt_len, bsz, self.embed_dim)
        out = self.out_proj(fn.post_aggregate(out))

        if not need_weights:
            return out, None
        # fairseq layout: (H, B, T, S), averaged over heads unless need_head_weights
        weights = weights.reshape(bsz, self.num_heads, tgt_len, src_len).transpose(0, 1)
        return out, (weights if need_head_weights else weights.mean(dim=0))

    def _positions(self, key_padding_mask, incremental_state, saved_state, kv_bsz: int, tgt_len: int,
                   src_len: int, device) -> Tuple[Tensor, Tensor]:
        """0-based token positions for functions that score by position (Synthesizer).

        Keys ``(Bk|1, S)``: index among the non-padding keys (left padding not counted).
        Queries ``(B|1, T)``: in self-attention the last ``T`` key positions (the step index
        when decoding with the cache); otherwise ``offset + arange(T)``, where ``offset`` is
        the number of queries seen so far, kept in the incremental state as ``query_offset``
        ``(Bk,)`` (0 without a state; decoder targets are right-padded).
        """
        if key_padding_mask is not None and key_padding_mask.dim() > 0:
            k_pos = ((~key_padding_mask.to(torch.bool)).long().cumsum(1) - 1).clamp_min(0)
        else:
            k_pos = torch.arange(src_len, device=device).unsqueeze(0)
        if self.self_attention:
            return k_pos[:, -tgt_len:], k_pos
        q_pos = torch.arange(tgt_len, device=device).unsqueeze(0)  # (1, T)
        if saved_state is not None:
            # every hypothesis of a beam search is at the same step; the count is stored once
            # per key batch item, (Bk,), so that fairseq's reorder_incremental_state (which
            # reorders cross-attention buffers per Bk) keeps its size right
            prev = saved_state.get("query_offset")
            if prev is not None:
                q_pos = q_pos + prev[:1].unsqueeze(1)
            saved_state["query_offset"] = (q_pos[0, -1] + 1).expand(kv_bsz).clone()
            self._set_input_buffer(incremental_state, saved_state)
        return q_pos, k_pos

    @staticmethod
    def _build_mask(key_padding_mask, attn_mask, kv_bsz: int, src_len: int) -> Tuple[Optional[Tensor], bool]:
        """fairseq's masks as the seam's pair ``(mask, causal)`` (:mod:`~fairseq_plugins.attention.masks`).

        ``key_padding_mask`` ``(Bk, S)``: nonzero = padding, any dtype (fairseq calls ``.bool()``
        on it too).  ``attn_mask`` ``(T, S)``: see :func:`attn_mask_to_bool`.

        Returns:
            ``(mask, causal)``: when ``attn_mask`` is None or exactly the causal pattern
            (:func:`check_attn_mask`: keys ``j > i + (S - T)`` blocked, fairseq's future mask),
            ``mask`` is the key padding ``(Bk, 1, 1, S)`` bool (True = blocked) or None and
            ``causal`` is ``attn_mask is not None``; any other ``attn_mask`` is combined with the
            padding into a general mask ``(Bk|1, 1, T, S)`` and ``causal`` is False.  The causal
            check costs one device sync per new mask tensor, none per layer.

        Raises:
            ValueError: from :func:`attn_mask_to_bool`, or ``attn_mask`` is not ``(T, S)``
                with ``S`` keys.
        """
        mask = None
        if key_padding_mask is not None and key_padding_mask.dim() > 0:
            mask = key_padding_mask.to(torch.bool).view(kv_bsz, 1, 1, src_len)
        if attn_mask is None:
            return mask, False
        if attn_mask.dim() != 2 or attn_mask.size(-1) != src_len:
            raise ValueError(f"attn_mask must be (T, S) = (query length, {src_len} keys), "
                             f"got shape {tuple(attn_mask.shape)}")
        am, is_causal = check_attn_mask(attn_mask)
        if is_causal:
            return mask, True
        am = am.view(1, 1, am.size(-2), am.size(-1))
        return (am if mask is None else (mask | am)), False

    def set_attn_fn(self, attn_fn: AttentionFunction):
        """Replace the attention function (e.g. for analysis); shapes must match.

        Raises:
            ValueError: ``attn_fn`` was built for another ``embed_dim`` / ``num_heads``, or for
                another query/key width than this module's ``q_proj`` (E-ATT's ``--eatt-qk-dim``:
                its scores would be scaled for the wrong head dimension)."""
        if attn_fn.embed_dim != self.embed_dim or attn_fn.num_heads != self.num_heads:
            raise ValueError("attn_fn was built for a different embed_dim/num_heads")
        if attn_fn.qk_dim != self.q_proj.out_features:
            raise ValueError(f"attn_fn has query/key width {attn_fn.qk_dim}, this module's q_proj / k_proj "
                             f"{self.q_proj.out_features} (--eatt-qk-dim)")
        self.attn_fn = attn_fn
        self._freeze_unused()
