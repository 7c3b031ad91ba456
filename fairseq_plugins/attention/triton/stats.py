"""Fused Triton kernels of ReLUFormer's eq. 7 row terms: kernel family ``"stats"`` of the attention backend.

ReLUFormer (Shen et al. 2023) eq. 7 regularises every query row of every attention layer with
``|log sum_j s_ij|`` and ``max(H(s_bar_i) - c log n_i, 0)``; the model also logs the entropy
``H(s_bar_i)`` and the null rate.  The PyTorch path
(:func:`fairseq_plugins.attention.stats.reluformer_row_terms` with
:meth:`~fairseq_plugins.attention.functions.AttentionFunction.counted_rows`) takes about 20 small
elementwise ops forward and 13 backward on the ``(B, H, T)`` row tensors: on a GPU each is a
launch of 5-10 µs of host time, and the reluformer layer was host-bound (the H200 window of
2026-11-26; ``mt-bench-gpu --op-counts`` counts a layer step's ops).  Here the same terms take
one kernel and one sum forward (``_stats_kernels.row_terms_fwd``: per-program partial sums of a
``(P, 6)`` buffer, added by ``sum(0)``: deterministic, no atomics) and one kernel backward
(``row_terms_bwd``, recomputing the row quantities from the saved row sums).

The attention functions choose the backend per device and dtype
(:meth:`~fairseq_plugins.attention.functions.AttentionFunction.uses_triton` with family
``"stats"``; ``--attention-backend auto`` runs :func:`self_test` first).  As for the attention
kernels, the kernel file is executed lazily, once per mode (compiled on CUDA, interpreted under
``TRITON_INTERPRET=1``), and importing this module does not import triton.
"""

from typing import Optional, Tuple

import torch

from ..stats import ENTROPY_FLOOR, ROW_EPS
from . import _acc_dtype, _mode, first_mismatch
from .norm import _tl_acc  # the ACC constexpr of a torch dtype

__all__ = ["reluformer_row_terms", "self_test", "BLOCK", "NUM_WARPS", "SUMS"]

#: the six sums :func:`reluformer_row_terms` returns, in order (the columns of the kernel's partial sums)
SUMS = ("norm", "margin", "entropy", "live", "null", "counted")

#: rows per program of the compiled kernels, and their warps (8 rows a thread): chosen, not
#: tuned on a GPU (an elementwise pass over ``B H T`` floats; the layer step at 16,384 tokens
#: and 8 heads has 131,072 rows: 128 programs)
BLOCK = 1024
NUM_WARPS = 4


def _stats_kernels(interpret: bool):
    """``_stats_kernels.py`` executed in ``interpret`` mode (cached per mode; see the package
    docstring for why kernels are executed lazily as their own module objects)."""
    from . import load_kernel_module

    return load_kernel_module("_stats_kernels.py", interpret)


def _bht(x: torch.Tensor) -> Tuple[int, int, int]:
    """The ``(b, h, t)`` strides of a ``(B, H, T)`` view."""
    return x.stride(0), x.stride(1), x.stride(2)


def _rows_args(row_sum, row_slogs, n, qp, interpret):
    """``(block, grid, strides, query padding pointer, launch options)`` shared by both kernels:
    the strides run ``row_sum``'s, ``row_slogs``', ``n``'s ``(b, h, t)`` and the padding's ``(b, t)``
    (``row_sum`` stands in for an absent padding, never read: ``HAS_QP`` is False)."""
    block = _stats_kernels(interpret).INTERPRET_BLOCK if interpret else BLOCK
    NR = row_sum.numel()
    qs = (qp.stride(0), qp.stride(1)) if qp is not None else (0, 0)
    strides = (*_bht(row_sum), *_bht(row_slogs), *_bht(n), *qs)
    return block, (-(-NR // block),), strides, (qp if qp is not None else row_sum), \
        ({} if interpret else {"num_warps": NUM_WARPS})


class _RowTerms(torch.autograd.Function):
    """Autograd function of :func:`reluformer_row_terms`; saves the row sums, the valid-key counts
    (a broadcast view) and the query padding, and recomputes everything else in backward."""

    @staticmethod
    def forward(ctx, row_sum, row_slogs, n, qp, entropy_c, interpret):
        ctx.set_materialize_grads(False)
        mod = _stats_kernels(interpret)
        B, H, T = row_sum.shape
        block, grid, strides, q, extra = _rows_args(row_sum, row_slogs, n, qp, interpret)
        part = torch.empty((grid[0], len(SUMS)), dtype=row_sum.dtype, device=row_sum.device)
        if row_sum.numel() > 0:
            mod.row_terms_fwd[grid](row_sum, row_slogs, n, q, part, row_sum.numel(), H, T, *strides,
                                    HAS_QP=qp is not None, ACC=_tl_acc(row_sum.dtype), EPS=ROW_EPS,
                                    C=float(entropy_c), BLOCK=block, TINY=ENTROPY_FLOOR,
                                    **extra)
        sums = part.sum(0)
        ctx.save_for_backward(row_sum, row_slogs, n, qp)
        ctx.cfg = (float(entropy_c), interpret)
        outs = sums.unbind(0)
        ctx.mark_non_differentiable(*outs[2:])
        return outs

    @staticmethod
    def backward(ctx, g_norm, g_margin, *_statistics):
        if g_norm is None and g_margin is None:
            return None, None, None, None, None, None
        row_sum, row_slogs, n, qp = ctx.saved_tensors
        entropy_c, interpret = ctx.cfg
        mod = _stats_kernels(interpret)
        B, H, T = row_sum.shape
        d_sum = torch.empty((B, H, T), dtype=row_sum.dtype, device=row_sum.device)  # contiguous: the kernel's layout
        d_slogs = torch.empty_like(d_sum) if g_margin is not None else None
        if row_sum.numel() > 0:
            block, grid, strides, q, extra = _rows_args(row_sum, row_slogs, n, qp, interpret)
            mod.row_terms_bwd[grid](
                row_sum, row_slogs, n, q, g_norm if g_norm is not None else row_sum,
                g_margin if g_margin is not None else row_sum, d_sum, d_slogs if d_slogs is not None else d_sum,
                row_sum.numel(), H, T, *strides, HAS_QP=qp is not None, HAS_GN=g_norm is not None,
                HAS_GM=g_margin is not None, ACC=_tl_acc(row_sum.dtype), EPS=ROW_EPS, C=entropy_c, BLOCK=block,
                **extra)
        return d_sum, d_slogs, None, None, None, None


def reluformer_row_terms(row_sum: torch.Tensor, row_slogs: torch.Tensor, n: torch.Tensor,
                         query_padding: Optional[torch.Tensor], entropy_c: float):
    """ReLUFormer eq. 7 (Shen et al. 2023) summed over the live rows, with the statistics, in one
    Triton kernel (and one ``sum``) forward and one backward.

    Equal, to rounding, to the PyTorch path: with ``valid = (n > 0) & ~query_padding``,
    ``(norm, margin, entropy, live) = stats.reluformer_row_terms(row_sum, row_slogs, n, valid, c)``,
    ``null = valid.sum() - live`` and ``counted = valid.sum()``.

    Args:
        row_sum, row_slogs: ``(B, H, T)`` float32 (float64) ``sum_j s_ij`` and ``sum_j s_ij log s_ij``
            (any strides); CUDA tensors, or CPU ones under ``TRITON_INTERPRET=1``.
        n: valid keys per query (``n_i`` of eq. 6), broadcastable to ``(B, H, T)`` (e.g. ``(B|1, 1, T|1)``).
        query_padding: ``(B, T)`` bool (True = a padded query: not counted) or None.
        entropy_c: ``c`` of the entropy bound ``c log n`` (Appendix A: 0.7), >= 0.

    Returns:
        six 0-d tensors of ``row_sum``'s dtype: ``sum |log z|`` and ``sum max(H - c log n, 0)`` over
        the live rows (differentiable w.r.t. ``row_sum`` and ``row_slogs``), then the statistics
        ``sum H``, the number of live rows, of null rows (counted, ``sum s = 0``) and of counted rows.

    Raises:
        ValueError: shapes, dtypes or devices that do not match, ``B H T`` near ``2**31`` or a negative
            ``entropy_c``.
        RuntimeError: triton missing, or a non-CUDA tensor without ``TRITON_INTERPRET=1``.
    """
    if row_sum.dim() != 3 or row_slogs.shape != row_sum.shape:
        raise ValueError(f"row_sum and row_slogs must be (B, H, T) of one shape, got {tuple(row_sum.shape)} "
                         f"and {tuple(row_slogs.shape)}")
    if row_sum.dtype not in (torch.float32, torch.float64) or row_slogs.dtype != row_sum.dtype:
        raise ValueError(f"row_sum and row_slogs must be float32 or float64 of one dtype, got {row_sum.dtype} "
                         f"and {row_slogs.dtype}")
    if not (row_sum.device == row_slogs.device == n.device):
        raise ValueError(f"row_sum, row_slogs and n must be on one device, got {row_sum.device}, "
                         f"{row_slogs.device}, {n.device}")
    B, H, T = row_sum.shape
    if B * H * T > 2 ** 31 - 1 - BLOCK:  # int32 row indices, the last program's whole block included
        raise ValueError(f"B * H * T must be < 2**31 - {BLOCK + 1}, got {B * H * T}")
    if not entropy_c >= 0:
        raise ValueError(f"entropy_c must be >= 0, got {entropy_c}")
    try:
        n_b = n.expand(B, H, T)
    except RuntimeError as e:
        raise ValueError(f"n {tuple(n.shape)} does not broadcast to (B, H, T) = {(B, H, T)}") from e
    qp = None
    if query_padding is not None:
        if query_padding.shape != (B, T) or query_padding.dtype != torch.bool:
            raise ValueError(f"query_padding must be bool (B, T) = {(B, T)}, got {query_padding.dtype} "
                             f"{tuple(query_padding.shape)}")
        qp = query_padding.to(row_sum.device).view(torch.uint8)
    interpret = _mode(row_sum)
    return _RowTerms.apply(row_sum, row_slogs, n_b, qp, float(entropy_c), interpret)


def self_test(device, dtype: torch.dtype) -> Optional[str]:
    """Run the kernels (forward + backward; 3 x 4 x 37 rows with null rows, rows below
    ``ROW_EPS``, rows without a key, query padding) against the PyTorch path in float64.

    Returns:
        ``None`` when the six sums and both gradients agree (max error <= 1e-4 of the reference's
        largest magnitude in float32, 1e-10 in float64), else the reason.
    """
    from ..stats import reluformer_row_terms as torch_row_terms

    dtype = _acc_dtype(dtype)  # the row sums are float32 for half-precision attention
    tol = 1e-10 if dtype == torch.float64 else 1e-4
    B, H, T = 3, 4, 37
    g = torch.Generator().manual_seed(0)
    s = torch.rand(B, H, T, generator=g, dtype=torch.float64) * 3
    s[0, 0, :5] = 0.0  # null rows
    s[1, 2, 3] = 1e-8  # below ROW_EPS
    slogs = s * torch.log(s.clamp_min(1e-30)) * torch.rand(B, H, T, generator=g, dtype=torch.float64)
    n = torch.randint(0, 9, (B, 1, T), generator=g).to(torch.float64)  # n = 0: a row without a key
    qp = torch.zeros(B, T, dtype=torch.bool)
    qp[2, -6:] = True
    w = torch.randn(2, generator=g, dtype=torch.float64)
    try:
        with torch.inference_mode(False), torch.enable_grad():
            res = []
            for impl, dt, dev in (("triton", dtype, device), ("reference", torch.float64, "cpu")):
                a, b = (x.to(dt).to(dev).requires_grad_() for x in (s, slogs))
                nn = n.to(dev, torch.float32)
                if impl == "triton":
                    out = reluformer_row_terms(a, b, nn, qp.to(dev), 0.7)
                else:
                    valid = (nn > 0).expand(B, H, T) & ~qp.unsqueeze(1)
                    t4 = torch_row_terms(a, b, nn, valid, 0.7)
                    counted = valid.sum(dtype=a.dtype)
                    out = (*t4, counted - t4[3], counted)
                grads = torch.autograd.grad(out[0] * w[0] + out[1] * w[1], (a, b))
                res.append([t.detach().double().cpu() for t in (*out, *grads)])  # each sum on its own scale
        return first_mismatch((*SUMS, "d row_sum", "d row_slogs"), *res, tol)
    except Exception as e:  # noqa: BLE001 - any failure means "do not use these kernels"
        return f"{type(e).__name__}: {e}"
