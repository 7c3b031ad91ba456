"""The masks of the attention seam: a compact ``key_padding_mask`` plus a ``causal`` flag.

Shape legend: B batch (of keys), H heads, T query length, S key length.  Masks are bool,
broadcastable to ``(B, H, T, S)``, ``True`` = blocked.

:class:`~fairseq_plugins.attention.multihead.FunctionalMultiheadAttention` hands every attention
function a pair ``(mask, causal)``:

* ``mask``: fairseq's ``key_padding_mask`` as ``(B|1, 1, 1, S)`` (one row per sentence, read once
  per key tile by the fused kernels), a general mask ``(B|1, 1, T|1, S)`` (an ``attn_mask`` that
  is not the causal pattern, combined with the padding), or None;
* ``causal``: additionally block every key ``j > i + (S - T)`` for query ``i`` -- the decoder's
  future mask, aligned bottom-right so that the last query sees every key (``T == S`` in
  training; ``T < S`` when queries continue a cached prefix; a no-op when ``T <= 1``, as in
  incremental decoding, where the cache holds exactly the past).

The fused paths (SDPA's ``is_causal``, the Triton kernels' ``causal=True``, the chunked CPU kernel)
never materialise the ``(T, S)`` pattern; the score/normalize path, the statistics and the analysis
capture take the dense combination :func:`combined_mask`.
"""

from typing import Optional

import torch

__all__ = ["causal_mask", "combined_mask"]


def causal_mask(T: int, S: int, device=None) -> torch.Tensor:
    """``(T, S)`` bool, True where key ``j > i + (S - T)`` lies in query ``i``'s future (bottom-right
    aligned: with ``T == S`` the strict upper triangle, fairseq's ``triu(-inf, 1)``)."""
    i = torch.arange(T, device=device).unsqueeze(1)
    j = torch.arange(S, device=device).unsqueeze(0)
    return j > i + (S - T)


def combined_mask(mask: Optional[torch.Tensor], causal: bool, T: int, S: int,
                  device=None) -> Optional[torch.Tensor]:
    """The dense bool mask equivalent to ``(mask, causal)``: ``mask | causal_mask(T, S)``.

    Args:
        mask: bool ``(B|1, H|1, T|1, S)`` (True = blocked) or None.
        causal: also block keys ``j > i + (S - T)``.
        T, S: query and key lengths; device: where a causal pattern is built (``mask``'s device
            when a mask is given).

    Returns:
        ``mask`` itself when ``causal`` is False or ``T <= 1`` (the pattern blocks nothing then),
        else ``(B|1, H|1, T, S)`` (``(1, 1, T, S)`` without ``mask``).
    """
    if not causal or T <= 1:
        return mask
    c = causal_mask(T, S, mask.device if mask is not None else device).view(1, 1, T, S)
    return c if mask is None else (mask | c)
