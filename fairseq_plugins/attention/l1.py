"""Pairwise L1 attention scores without materialising the ``(B, H, T, S, d)`` differences.

Shape legend: B batch, H heads, T queries, S keys, d head dimension (the paper's ``k_h``).

E-ATT eq. 13 scores a query/key pair by ``-||q_i - k_j||_1 / sqrt(k_h)``.  Broadcasting
``q[..., :, None, :] - k[..., None, :, :]`` needs ``B*H*T*S*d`` elements -- 64x the score matrix
at ``d = 64`` -- and autograd would keep it for the backward pass.  :func:`l1_scores` processes
blocks of queries so that a block's differences hold at most ``max_elems`` elements, and its
backward recomputes the signs block by block (nothing but ``q`` and ``k`` is saved), so the peak
extra memory is ``O(max_elems)`` whatever T and S are.

``torch.cdist(p=1)`` avoids the 5-D tensor on CPU (a dedicated kernel, forward and backward).
``scripts/bench_eatt_l1.py`` measured on CPU (H 8, d 64, forward + backward, extra peak memory
relative to broadcasting): L=1024: broadcast 6246 MiB / 29.3 s, cdist 202 MiB / 2.1 s, chunked
301 MiB / 4.0 s.  Its CUDA backward does not: it writes every ``sign(q_i - k_j) g_ij`` into a
``(B*H, S, T, d)`` buffer -- the 5-D tensor -- and sums it (ATen ``DistanceKernel.cu``,
``cdist_backward_kernel_impl``), indexing that buffer with 32-bit ints, so past ``2**31``
elements it writes out of bounds.  Seen on an H200 (torch 2.11, 2026-11-26): the core section of
``mt-bench-gpu`` (B*H 4096, T = S = 256, d 64: a 2**34-element buffer) died with "an illegal
memory access", which poisons the process's CUDA context.  So the attention functions call
:func:`l1_scores` with ``impl="auto"``: the chunked kernel, in blocks of
:data:`DEFAULT_MAX_ELEMS_CUDA` elements, where a CUDA backward will run; ``cdist`` everywhere else
(CPU, and the forward alone on a GPU -- every step of beam search -- where it writes only the scores).
Its CUDA forward launches one thread block per score, and a grid holds at most ``2**31 - 1``
blocks: past that, the launch fails with "invalid argument" (H100, 2026-11-26: ``mt-bench-gpu``'s
decode section, a prefill of 320 hypotheses x 8 heads x 1023 x 1023 scores), so on CUDA
:func:`l1_scores` calls cdist on blocks of queries below that limit.  The chunked kernel (the default of
:func:`l1_scores`, checked against ``cdist`` in the tests) bounds memory by ``max_elems``
explicitly on any backend.
"""

from typing import Optional

import torch

__all__ = ["l1_scores", "resolve_impl", "DEFAULT_MAX_ELEMS", "DEFAULT_MAX_ELEMS_CUDA", "IMPLS"]

#: elements of one block's (B, H, Tc, S, d) difference tensor (16 MiB in float32)
DEFAULT_MAX_ELEMS = 1 << 22
#: the block size ``impl="auto"`` uses on a GPU (256 MiB of float32 differences: 16x fewer blocks)
DEFAULT_MAX_ELEMS_CUDA = 1 << 26
#: the values of ``l1_scores(impl=...)``
IMPLS = ("auto", "chunked", "cdist")
#: ``torch.cdist``'s CUDA backward indexes its ``(B*H, S, T, d)`` buffer with 32-bit ints
_CDIST_CUDA_BACKWARD_LIMIT = 2 ** 31
#: ``torch.cdist``'s CUDA forward launches one block per score (``dim3 grid(result.numel())``);
#: a grid's x dimension holds at most ``2**31 - 1`` blocks, so larger calls are split over queries
_CDIST_CUDA_GRID_LIMIT = 2 ** 31 - 1


def resolve_impl(impl: str, device_type: str, buffer_elems: int = 0, needs_grad: bool = False) -> str:
    """The implementation :func:`l1_scores` runs: ``"auto"`` is ``"chunked"`` on CUDA when a backward
    will run (cdist's CUDA backward: see the module docstring) and ``"cdist"`` otherwise -- on CPU,
    and for the forward alone (decoding, evaluation), where cdist writes only the scores.

    Args:
        impl: one of :data:`IMPLS`.
        device_type: ``q.device.type`` (``"cpu"``, ``"cuda"``, ...).
        buffer_elems: ``B*H*T*S*d``, the elements of cdist's CUDA backward buffer.
        needs_grad: whether a backward will run.

    Raises:
        ValueError: unknown ``impl`` (the message lists :data:`IMPLS`), or ``impl="cdist"`` on
            CUDA with a backward whose buffer would exceed ``2**31`` elements (it would write out of
            bounds; the message names ``auto`` / ``chunked``).
    """
    if impl not in IMPLS:
        raise ValueError(f"unknown impl {impl!r}; valid choices: {', '.join(IMPLS)}")
    if impl == "auto":
        return "chunked" if device_type == "cuda" and needs_grad else "cdist"
    if impl == "cdist" and device_type == "cuda" and needs_grad and buffer_elems >= _CDIST_CUDA_BACKWARD_LIMIT:
        raise ValueError(f"impl='cdist' on CUDA: torch.cdist's backward would index a {buffer_elems}-element "
                         f"(B*H, S, T, d) buffer with 32-bit ints (>= 2**31: out of bounds); "
                         f"use impl='auto' or 'chunked'")
    return impl


def _block(B, H, T, S, d, max_elems):
    return max(1, min(T, max_elems // max(1, B * H * S * d)))


def _cdist_l1(q: torch.Tensor, k: torch.Tensor, grid_limit: Optional[int] = None) -> torch.Tensor:
    """``torch.cdist(q, k, p=1)``, ``(B, H, T, S)``, on CUDA in blocks of queries whose
    ``B*H*Tc*S`` scores (cdist's thread blocks) stay within ``grid_limit`` (default
    :data:`_CDIST_CUDA_GRID_LIMIT`); one call elsewhere.  Autograd flows through each block."""
    B, H, T, d = q.shape
    S = k.size(2)
    limit = _CDIST_CUDA_GRID_LIMIT if grid_limit is None else grid_limit
    if (q.device.type != "cuda" and grid_limit is None) or B * H * T * S <= limit:
        return torch.cdist(q, k, p=1)
    if B * H * S > limit:
        raise ValueError(f"torch.cdist on CUDA: even one query row has B*H*S = {B * H * S} scores, past the "
                         f"grid limit {limit}; use impl='chunked'")
    tc = limit // (B * H * S)
    return torch.cat([torch.cdist(q[:, :, t0:t0 + tc], k, p=1) for t0 in range(0, T, tc)], dim=2)


class _L1Scores(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, scale, max_elems):
        B, H, T, d = q.shape
        S = k.size(2)
        tc = _block(B, H, T, S, d, max_elems)
        out = q.new_empty(B, H, T, S)
        kk = k.unsqueeze(2)  # (B, H, 1, S, d)
        for t0 in range(0, T, tc):
            diff = q[:, :, t0:t0 + tc].unsqueeze(3) - kk  # (B, H, Tc, S, d)
            out[:, :, t0:t0 + tc] = diff.abs_().sum(-1)
        ctx.save_for_backward(q, k)
        ctx.scale, ctx.tc = scale, tc
        return out.mul_(-scale)

    @staticmethod
    def backward(ctx, grad):
        q, k = ctx.saved_tensors
        scale, tc = ctx.scale, ctx.tc
        T = q.size(2)
        gq = torch.empty_like(q) if ctx.needs_input_grad[0] else None
        gk = torch.zeros_like(k) if ctx.needs_input_grad[1] else None
        kk = k.unsqueeze(2)
        g = grad * (-scale)  # d score / d |q - k|_1
        for t0 in range(0, T, tc):
            sgn = torch.sign(q[:, :, t0:t0 + tc].unsqueeze(3) - kk)  # (B, H, Tc, S, d)
            gc = g[:, :, t0:t0 + tc]  # (B, H, Tc, S)
            if gq is not None:  # sum_j g_ij sign(q_i - k_j)
                gq[:, :, t0:t0 + tc] = torch.einsum("bhts,bhtsd->bhtd", gc, sgn)
            if gk is not None:  # -sum_i g_ij sign(q_i - k_j)
                gk -= torch.einsum("bhts,bhtsd->bhsd", gc, sgn)
        return gq, gk, None, None


def l1_scores(q: torch.Tensor, k: torch.Tensor, scale: float, max_elems: Optional[int] = None,
              impl: str = "chunked") -> torch.Tensor:
    """``-scale * ||q_i - k_j||_1`` for all pairs (E-ATT eq. 13 with ``scale = k_h^-1/2``).

    Args:
        q: ``(B, H, T, d)``; k: ``(B, H, S, d)`` (same B, H, d, dtype, device).
        scale: positive float.
        max_elems: cap on the elements of one block of differences (memory knob; default
            :data:`DEFAULT_MAX_ELEMS`, or :data:`DEFAULT_MAX_ELEMS_CUDA` when ``impl="auto"`` chose it).
        impl: ``"chunked"`` (this module's kernel), ``"cdist"`` (``torch.cdist(p=1)``) or ``"auto"``
            (``chunked`` on CUDA with a backward, else ``cdist``: :func:`resolve_impl`).

    Returns:
        ``(B, H, T, S)`` scores in q's dtype.  The gradient uses ``sign(0) = 0`` (as
        ``torch.cdist`` does).  float16/bfloat16 inputs are computed in float32 (``cdist`` has
        no half-precision kernel; the chunked kernel follows it) and the scores rounded back to
        q's dtype.

    Raises:
        ValueError: shapes do not match, unknown ``impl`` (the message lists the choices), or
            ``impl="cdist"`` on CUDA past its backward's 32-bit indexing (:func:`resolve_impl`).
    """
    if q.dim() != 4 or k.dim() != 4 or q.shape[:2] != k.shape[:2] or q.size(-1) != k.size(-1):
        raise ValueError(f"l1_scores needs q (B, H, T, d) and k (B, H, S, d); got {tuple(q.shape)}, "
                         f"{tuple(k.shape)}")
    B, H, T, d = q.shape
    needs_grad = torch.is_grad_enabled() and (q.requires_grad or k.requires_grad)
    chosen = resolve_impl(impl, q.device.type, B * H * T * k.size(2) * d, needs_grad)
    half = q.dtype in (torch.float16, torch.bfloat16)
    qf, kf = (q.float(), k.float()) if half else (q, k)
    if chosen == "cdist":
        out = _cdist_l1(qf, kf) * (-float(scale))
    else:
        if max_elems is None:
            max_elems = DEFAULT_MAX_ELEMS_CUDA if impl == "auto" else DEFAULT_MAX_ELEMS  # auto: CUDA only
        out = _L1Scores.apply(qf, kf, float(scale), int(max_elems))
    return out.to(q.dtype) if half else out
