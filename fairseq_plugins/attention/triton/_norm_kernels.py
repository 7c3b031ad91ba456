"""Triton kernels of ReLA's fused (gated) RMSNorm (ReLA eqs. 4-5): forward and backward.

Loaded by :mod:`fairseq_plugins.attention.triton.norm` (never imported directly): that loader
executes this file once as compiled kernels (CUDA) and once under Triton's interpreter
(``TRITON_INTERPRET=1``, CPU tensors), as two module objects -- the scheme of ``_kernels.py``
(see the package docstring).  As there, everything a kernel calls is defined here, in
``_jit_common.py`` (sums) or is a Triton builtin (no ``tl.sum``, ``tl.sigmoid``, ``tl.zeros``:
Triton's ``@jit`` library functions exist in one mode only).

Layout: ``z`` is ``(M, C)`` rows with unit column stride (row stride ``stride_z``), ``C = G * N``:
``G`` groups (1, or one per head) of ``N`` values.  A program holds a tile of ``BLOCK_M`` rows as
``(BLOCK_M, BLOCK_G, BLOCK_N)`` (``BLOCK_G >= G``, ``BLOCK_N >= N`` powers of two, masked), so a
group's statistic is a reduction over the last axis.  Arithmetic in ``ACC`` (float32; float64 for
float64 inputs)::

    forward:  rstd = 1 / sqrt(mean_N(z^2) + eps)           (M, G), stored for backward
              y    = (z rstd) g [ * sigmoid(w z) ]           (GATE)
    backward: zhat = z rstd;  s = sigmoid(w z) (GATE, else 1);  u = dy s g
              dz   = rstd (u - zhat mean_N(u zhat)) [ + dy g zhat s (1 - s) w ]
              dg  += sum_rows dy s zhat;   dw += sum_rows dy g zhat s (1 - s) z

The backward runs ``P`` programs, program ``p`` taking row blocks ``p, p + P, ...``; it keeps
its partial ``dg``/``dw`` in registers and writes them to row ``p`` of a ``(P, C)`` buffer that
the caller sums (Triton's layer-norm tutorial's scheme, without the locks).
"""

import triton
import triton.language as tl

from . import kernel_mode, load_kernel_module

INTERPRET = kernel_mode()
_common = load_kernel_module("_jit_common.py", INTERPRET)  # tl.sum / tl.max in this file's mode

#: rows per program under the interpreter (small, so tests with a few rows cross tiles)
INTERPRET_BLOCK_M = 4


_sum = _common.rowsum


@triton.jit
def _sigmoid(x):
    return 1.0 / (1.0 + tl.exp(-x))


@triton.jit
def _rsqrt(x, ACC: tl.constexpr):
    """``1 / sqrt(x)`` with the square root correctly rounded (``tl.rsqrt`` is approximate)."""
    if ACC == tl.float64:
        r = 1.0 / tl.sqrt(x)  # float64 square roots are IEEE
    else:
        r = 1.0 / tl.sqrt_rn(x)
    return r


@triton.jit
def _tile(M, N, G, row0, BLOCK_M: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_N: tl.constexpr):
    """Row indices ``(BLOCK_M,)``, columns ``(BLOCK_G, BLOCK_N)`` and their masks."""
    rows = row0 + tl.arange(0, BLOCK_M)
    gi = tl.arange(0, BLOCK_G)
    ji = tl.arange(0, BLOCK_N)
    cols = gi[:, None] * N + ji[None, :]
    cmask = (gi[:, None] < G) & (ji[None, :] < N)
    return rows, gi, cols, rows < M, cmask


@triton.jit
def norm_fwd(Z, W, GT, Y, RSTD, M, N, G, stride_z, stride_y,
             GATE: tl.constexpr, ACC: tl.constexpr, EPS: tl.constexpr, BLOCK_M: tl.constexpr,
             BLOCK_G: tl.constexpr, BLOCK_N: tl.constexpr):
    """One program per ``BLOCK_M`` rows: ``Y`` ``(M, C)`` and ``RSTD`` ``(M, G)`` (ACC dtype)."""
    rows, gi, cols, rmask, cmask = _tile(M, N, G, tl.program_id(0) * BLOCK_M, BLOCK_M, BLOCK_G, BLOCK_N)
    m3 = rmask[:, None, None] & cmask[None, :, :]
    rows64 = rows.to(tl.int64)
    z = tl.load(Z + rows64[:, None, None] * stride_z + cols[None, :, :], mask=m3, other=0.0).to(ACC)
    eps = tl.full([BLOCK_M, BLOCK_G], EPS, ACC)  # a constant in ACC (exact in float64), not a loaded tensor
    rstd = _rsqrt(_sum(z * z, 2) / N + eps, ACC)  # (BLOCK_M, BLOCK_G)
    g = tl.load(W + cols, mask=cmask, other=0.0).to(ACC)
    y = z * rstd[:, :, None] * g[None, :, :]
    if GATE:
        w = tl.load(GT + cols, mask=cmask, other=0.0).to(ACC)
        y = y * _sigmoid(w[None, :, :] * z)
    tl.store(Y + rows64[:, None, None] * stride_y + cols[None, :, :], y.to(Y.dtype.element_ty), mask=m3)
    tl.store(RSTD + rows64[:, None] * G + gi[None, :], rstd, mask=rmask[:, None] & (gi[None, :] < G))


@triton.jit
def norm_bwd(Z, W, GT, DY, RSTD, DZ, DGP, DWP, M, N, G, stride_z, stride_dy, stride_dz, n_blocks,
             GATE: tl.constexpr, ACC: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_G: tl.constexpr,
             BLOCK_N: tl.constexpr):
    """Program ``p`` of ``P``: ``DZ`` of row blocks ``p, p + P, ...`` and its partial sums of ``dg``
    (``DGP[p]``) and ``dw`` (``DWP[p]``, with ``GATE``), ``(P, C)`` in ACC dtype."""
    pid = tl.program_id(0)
    P = tl.num_programs(0)
    _, gi, cols, _, cmask = _tile(M, N, G, 0, BLOCK_M, BLOCK_G, BLOCK_N)
    g = tl.load(W + cols, mask=cmask, other=0.0).to(ACC)[None, :, :]
    if GATE:
        w = tl.load(GT + cols, mask=cmask, other=0.0).to(ACC)[None, :, :]
    zero = tl.full([BLOCK_G, BLOCK_N], 0.0, ACC)
    dg_acc = zero
    dw_acc = zero
    for blk in range(pid, n_blocks, P):
        rows = blk * BLOCK_M + tl.arange(0, BLOCK_M)
        rmask = rows < M
        rows64 = rows.to(tl.int64)
        m3 = rmask[:, None, None] & cmask[None, :, :]
        z = tl.load(Z + rows64[:, None, None] * stride_z + cols[None, :, :], mask=m3, other=0.0).to(ACC)
        dy = tl.load(DY + rows64[:, None, None] * stride_dy + cols[None, :, :], mask=m3, other=0.0).to(ACC)
        rstd = tl.load(RSTD + rows64[:, None] * G + gi[None, :], mask=rmask[:, None] & (gi[None, :] < G),
                       other=0.0)[:, :, None]
        zhat = z * rstd
        if GATE:
            s = _sigmoid(w * z)
            dys = dy * s
            t = dy * g * zhat * s * (1.0 - s)  # gradient w.r.t. w z
            dw_acc += _sum(t * z, 0)
        else:
            dys = dy
        dg_acc += _sum(dys * zhat, 0)
        u = dys * g
        dz = rstd * (u - zhat * (_sum(u * zhat, 2) / N)[:, :, None])
        if GATE:
            dz += t * w
        tl.store(DZ + rows64[:, None, None] * stride_dz + cols[None, :, :], dz.to(DZ.dtype.element_ty), mask=m3)
    C = N * G
    tl.store(DGP + pid.to(tl.int64) * C + cols, dg_acc, mask=cmask)
    if GATE:
        tl.store(DWP + pid.to(tl.int64) * C + cols, dw_acc, mask=cmask)
