"""Fused Triton kernel of ReLA's (gated) RMSNorm: kernel family ``"norm"`` of the attention backend.

ReLA (Zhang, Titov & Sennrich 2021), eq. 4 ``RMSNorm(z) = z / RMS(z) ⊙ g`` and eq. 5 (ReLA-g)
``sigmoid(w ⊙ z) ⊙ RMSNorm(z)``, on the concatenated heads ``z`` ``(..., C)`` with statistics
over all ``C`` values or per group of ``C / groups`` (per head).  One pass each way
(``_norm_kernels.py``: one program per block of rows; the backward's ``dg``/``dw`` are per-program
partial sums added up here).  Only ``z`` and ``rstd`` ``(rows, groups)`` are kept for backward.

The PyTorch path and the public entry point are
:func:`fairseq_plugins.modules.norms.gated_rms_norm` (``backend="triton"`` comes here); the
attention functions choose the backend per device and dtype
(:meth:`~fairseq_plugins.attention.functions.AttentionFunction.uses_triton` with family
``"norm"``).  As for the attention kernels, the kernel file is executed lazily, once per mode
(compiled on CUDA, interpreted under ``TRITON_INTERPRET=1``), and importing this module does not
import triton.
"""

import functools
from typing import Optional

import torch

from ...modules.norms import _check_norm_args, _out_dtype, _stat_dtype
from . import _mode, _pow2, first_mismatch, interpret_requested  # noqa: F401  (re-exported for the tests)

__all__ = ["gated_rms_norm", "apply_checked", "fits", "self_test", "MAX_WIDTH"]

#: widest padded row tile (``next_pow2(groups) * next_pow2(C / groups)``) a program holds
MAX_WIDTH = 8192


def _norm_kernels(interpret: bool):
    """``_norm_kernels.py`` executed in ``interpret`` mode (cached per mode; see the package
    docstring for why the kernels are executed lazily as their own module objects)."""
    from . import load_kernel_module

    return load_kernel_module("_norm_kernels.py", interpret)


def fits(dim: int, groups: int) -> bool:
    """True when rows of ``dim`` values in ``groups`` groups fit one program's tile (padded
    width ``next_pow2(groups) * next_pow2(dim / groups) <= MAX_WIDTH``)."""
    return _pow2(groups) * _pow2(dim // groups) <= MAX_WIDTH


def _meta(dim: int, groups: int, interpret: bool, backward: bool = False):
    """Constexprs and launch options: ``BLOCK_G x BLOCK_N`` covers a row, ``BLOCK_M`` rows per
    program (step): about 2048 values forward, 1024 backward (C = 512: 4 and 2 rows, 4 warps).
    Not tuned on a GPU: chosen from the offline compile (sm_90a, C 512, bf16/fp16: forward 48
    registers, backward 96, no spills; backward with 4 rows needs 136)."""
    bg, bn = _pow2(groups), _pow2(dim // groups)
    width = bg * bn
    bm = max(1, min(16, (1024 if backward else 2048) // width))
    meta = dict(BLOCK_M=_norm_kernels(True).INTERPRET_BLOCK_M if interpret else bm, BLOCK_G=bg, BLOCK_N=bn)
    if not interpret:
        meta["num_warps"] = 4 if width * bm <= 4096 else 8
    return meta


def _tl_acc(dtype: torch.dtype):
    import triton.language as tl

    return tl.float64 if dtype == torch.float64 else tl.float32


def _rows(x: torch.Tensor) -> torch.Tensor:
    """``(..., C)`` -> ``(M, C)`` with unit column stride (a view when possible)."""
    x2 = x.reshape(-1, x.size(-1))
    return x2 if x2.stride(-1) == 1 or x2.size(-1) == 1 else x2.contiguous()


def _programs(n_blocks: int, device: torch.device, interpret: bool) -> int:
    """Programs of the backward: a few waves of the GPU (each reduces its share of rows into one
    partial ``dg``/``dw`` row), 2 under the interpreter (so the tests loop over row blocks)."""
    if interpret:
        return max(1, min(n_blocks, 2))
    return max(1, min(n_blocks, 4 * _sm_count(torch.device(device).index)))


@functools.lru_cache(maxsize=None)
def _sm_count(index: Optional[int]) -> int:
    return torch.cuda.get_device_properties(torch.cuda.current_device() if index is None else index).multi_processor_count


class _FusedGatedRMSNorm(torch.autograd.Function):
    """Autograd function of :func:`gated_rms_norm`; saves ``z`` ``(M, C)`` (a view of the input),
    ``rstd`` ``(M, groups)`` (float32; float64 for float64) and the parameters."""

    @staticmethod
    def forward(ctx, z, weight, gate, eps, groups, out_dtype, interpret):
        mod = _norm_kernels(interpret)
        shape, C = z.shape, z.size(-1)
        z2 = _rows(z)
        M = z2.size(0)
        acc = _stat_dtype(z.dtype)
        y = torch.empty((M, C), dtype=out_dtype, device=z.device)
        rstd = torch.empty((M, groups), dtype=acc, device=z.device)
        w = weight.contiguous()
        gt = w if gate is None else gate.contiguous()
        meta = _meta(C, groups, interpret)
        if M > 0:
            grid = (-(-M // meta["BLOCK_M"]),)
            mod.norm_fwd[grid](z2, w, gt, y, rstd, M, C // groups, groups, z2.stride(0), y.stride(0),
                               GATE=gate is not None, ACC=_tl_acc(z.dtype), EPS=float(eps), **meta)
        ctx.save_for_backward(z2, rstd, weight, gate)
        ctx.cfg = (shape, groups, interpret)
        return y.view(shape)

    @staticmethod
    def backward(ctx, dy):
        z2, rstd, weight, gate = ctx.saved_tensors
        shape, groups, interpret = ctx.cfg
        mod = _norm_kernels(interpret)
        M, C = z2.shape
        acc = rstd.dtype
        dy2 = _rows(dy)
        dz = torch.empty((M, C), dtype=z2.dtype, device=z2.device)
        meta = _meta(C, groups, interpret, backward=True)
        n_blocks = -(-M // meta["BLOCK_M"])
        P = _programs(n_blocks, z2.device, interpret) if M > 0 else 1
        # every program writes its whole partial row: no fill (a launch on a GPU) unless none runs
        new = torch.empty if M > 0 else torch.zeros
        dgp = new((P, C), dtype=acc, device=z2.device)
        dwp = new((P, C), dtype=acc, device=z2.device) if gate is not None else dgp
        if M > 0:
            w = weight.contiguous()
            gt = w if gate is None else gate.contiguous()
            mod.norm_bwd[(P,)](z2, w, gt, dy2, rstd, dz, dgp, dwp, M, C // groups, groups, z2.stride(0),
                               dy2.stride(0), dz.stride(0), n_blocks, GATE=gate is not None,
                               ACC=_tl_acc(z2.dtype), **meta)
        dg = dgp.sum(0).to(weight.dtype) if ctx.needs_input_grad[1] else None
        dw = dwp.sum(0).to(gate.dtype) if gate is not None and ctx.needs_input_grad[2] else None
        return dz.view(shape), dg, dw, None, None, None, None


def gated_rms_norm(z: torch.Tensor, weight: torch.Tensor, gate: Optional[torch.Tensor] = None,
                   eps: float = 1e-8, groups: int = 1) -> torch.Tensor:
    """The Triton backend of :func:`fairseq_plugins.modules.norms.gated_rms_norm` (ReLA eqs. 4-5):
    ``y = [sigmoid(w z)] (z rstd) g``, ``rstd = 1 / sqrt(mean_group(z^2) + eps)``.

    Args:
        z: ``(..., C)``, float16/bfloat16/float32/float64, any layout (rows are viewed as
            ``(M, C)``; copied only when the last axis is not contiguous).
        weight: gain ``g`` ``(C,)``; gate: gate weight ``w`` ``(C,)`` or None; eps: > 0;
        groups: statistics per group of ``C / groups`` values.

    Returns:
        ``y`` ``(..., C)`` in ``z``'s dtype promoted with the parameters'; arithmetic in float32
        (float64 for float64 ``z``).  Differentiable w.r.t. ``z``, ``weight`` and ``gate``.

    Raises:
        ValueError: the checks of :func:`~fairseq_plugins.modules.norms.gated_rms_norm`; a row
            wider than one tile (:func:`fits`: ``next_pow2(groups) * next_pow2(C / groups) > 8192``).
        RuntimeError: triton missing, or a non-CUDA tensor without ``TRITON_INTERPRET=1``.
    """
    _check_norm_args(z, weight, gate, eps, groups)
    return apply_checked(z, weight, gate, eps, groups)


def apply_checked(z: torch.Tensor, weight: torch.Tensor, gate: Optional[torch.Tensor], eps: float,
                  groups: int) -> torch.Tensor:
    """:func:`gated_rms_norm` after the argument checks (which the caller has done: the public
    :func:`fairseq_plugins.modules.norms.gated_rms_norm` checks once per call, not twice).

    Raises:
        ValueError: a row wider than one tile (:func:`fits`).
        RuntimeError: triton missing, or a non-CUDA tensor without ``TRITON_INTERPRET=1``.
    """
    C = z.size(-1)
    if not fits(C, groups):
        raise ValueError(f"the Triton norm kernel takes rows up to a padded width of {MAX_WIDTH} "
                         f"(C={C}, groups={groups}); use --attention-backend torch")
    interpret = _mode(z)
    return _FusedGatedRMSNorm.apply(z, weight, gate, float(eps), groups, _out_dtype(z, weight, gate), interpret)


def self_test(device, dtype: torch.dtype) -> Optional[str]:
    """Run the kernels (forward + backward, groups 1 and 4, gate on and off; 37 rows of 64) against
    the PyTorch path in float64 on the same rounded inputs.

    Returns:
        ``None`` when output and gradients agree (max error <= 3e-2 of the reference's largest
        magnitude in half precision, 1e-4 in float32, 1e-10 in float64), else the reason.
    """
    from ...modules.norms import _GatedRMSNorm

    tol = {torch.float64: 1e-10, torch.float32: 1e-4}.get(dtype, 3e-2)
    g = torch.Generator().manual_seed(0)
    z0 = torch.randn(37, 64, generator=g, dtype=torch.float64)
    z0[3] = 0.0  # a null-attention row
    w0, gt0 = (torch.randn(64, generator=g, dtype=torch.float64) for _ in range(2))
    dy0 = torch.randn(37, 64, generator=g, dtype=torch.float64)
    try:
        with torch.inference_mode(False), torch.enable_grad():
            for groups in (1, 4):
                for gated in (False, True):
                    res = []
                    for impl, dt, dev in (("triton", dtype, device), ("reference", torch.float64, "cpu")):
                        z, w, gt = (x.to(dtype).to(dev, dt).requires_grad_() for x in (z0, w0, gt0))
                        args = (z, w, gt if gated else None, 1e-8, groups)
                        y = gated_rms_norm(*args) if impl == "triton" else _GatedRMSNorm.apply(*args)
                        grads = torch.autograd.grad(y, (z, w, gt) if gated else (z, w), dy0.to(dev, y.dtype))
                        res.append([t.detach().double().cpu() for t in (y, *grads)])
                    bad = first_mismatch(("y", "dz", "dg", "dw"), *res, tol)
                    if bad is not None:
                        return f"groups {groups} gate {gated}: {bad}"
    except Exception as e:  # noqa: BLE001 - any failure means "do not use these kernels"
        return f"{type(e).__name__}: {e}"
    return None
