"""Triton kernels of ReLUFormer's eq. 7 row terms (Shen et al. 2023): forward sums and backward.

Loaded by :mod:`fairseq_plugins.attention.triton.stats` (never imported directly): that loader
executes this file once as compiled kernels (CUDA) and once under Triton's interpreter
(``TRITON_INTERPRET=1``, CPU tensors), as two module objects -- the scheme of ``_kernels.py``
(see the package docstring).  As there, everything a kernel calls is defined here, in
``_jit_common.py`` (sums) or is a Triton builtin (no ``tl.sum``, ``tl.zeros``: Triton's ``@jit``
library functions exist in one mode only).

Rows: the ``(B, H, T)`` query rows of one attention call, flattened as ``r = (b H + h) T + t``;
every input is read through its own ``(b, h, t)`` strides (0 for a broadcast axis), so the
valid-key counts ``n`` ``(B|1, 1, T|1)`` and the query padding ``(B, T)`` are never expanded in
memory.  Per row, in ``ACC`` (float32; float64 for float64 inputs), with ``s = sum_j s_ij`` and
``l = sum_j s_ij log s_ij`` from the attention kernel::

    valid  = n > 0 and not query padding      live = valid and s > 0
    z      = max(s, EPS);  H = log z - l / z   (entropy of s / sum s, nats)
    over   = H - C log max(n, 1)               (eq. 7's entropy margin; C is the coefficient c = 0.7 of Appendix A, whose bound is c log n)

    forward:  program p sums, over its BLOCK rows, [live] |log z|, [live] max(over, 0), [live] H,
              [live], [valid and not live] (null rows), [valid]  ->  PART[p, 0:6]
              (a NaN row sum is not live: it enters no term and counts as null, as
              counted - live does on the torch path; the attention output carries the NaN)
    backward: m      = g_margin [over > 0] [live] / z
              d_s    = ( m (1 + l / z) + g_norm sgn(log z) [live] / z ) [s >= EPS]
              d_l    = -m

The backward recomputes the row quantities from ``s``, ``l``, ``n`` and the padding (nothing
row-sized is saved beyond what the attention keeps).  ``EPS`` and ``C`` are constexprs, made
into ``ACC`` constants with ``tl.full`` so that float64 keeps them exact.
"""

import triton
import triton.language as tl

from . import kernel_mode, load_kernel_module

INTERPRET = kernel_mode()
_common = load_kernel_module("_jit_common.py", INTERPRET)  # tl.sum / tl.max in this file's mode

#: rows per program under the interpreter (small, so tests with a few rows cross programs)
INTERPRET_BLOCK = 8


_rowsum = _common.rowsum


@triton.jit
def _rows(RS, RL, NK, QP, rows, NR, H, T, s_rs_b, s_rs_h, s_rs_t, s_rl_b, s_rl_h, s_rl_t,
          s_n_b, s_n_h, s_n_t, s_q_b, s_q_t,
          HAS_QP: tl.constexpr, ACC: tl.constexpr, EPS: tl.constexpr, C: tl.constexpr, BLOCK: tl.constexpr):
    """The row quantities of ``rows`` (BLOCK,): ``s, l, z, log z, H, over, valid, live``."""
    inb = rows < NR
    t = (rows % T).to(tl.int64)
    bh = rows // T
    h = (bh % H).to(tl.int64)
    b = (bh // H).to(tl.int64)
    s = tl.load(RS + b * s_rs_b + h * s_rs_h + t * s_rs_t, mask=inb, other=0.0).to(ACC)
    lg = tl.load(RL + b * s_rl_b + h * s_rl_h + t * s_rl_t, mask=inb, other=0.0).to(ACC)
    n = tl.load(NK + b * s_n_b + h * s_n_h + t * s_n_t, mask=inb, other=0.0).to(ACC)
    valid = inb & (n > 0.0)
    if HAS_QP:
        qp = tl.load(QP + b * s_q_b + t * s_q_t, mask=inb, other=1)
        valid = valid & (qp == 0)
    live = valid & (s > 0.0)
    z = tl.maximum(s, tl.full([BLOCK], EPS, ACC))
    log_z = tl.log(z)
    ent = log_z - lg / z
    over = ent - tl.log(tl.maximum(n, 1.0)) * tl.full([BLOCK], C, ACC)
    return s, lg, z, log_z, ent, over, valid, live


@triton.jit
def row_terms_fwd(RS, RL, NK, QP, PART, NR, H, T, s_rs_b, s_rs_h, s_rs_t, s_rl_b, s_rl_h, s_rl_t,
                  s_n_b, s_n_h, s_n_t, s_q_b, s_q_t,
                  HAS_QP: tl.constexpr, ACC: tl.constexpr, EPS: tl.constexpr, C: tl.constexpr,
                  BLOCK: tl.constexpr, TINY: tl.constexpr):
    """One program per ``BLOCK`` rows: its six sums (``stats.SUMS``' order) into ``PART[pid]`` ``(P, 6)``;
    the entropy statistic takes ``z = max(sum s, TINY)`` (``stats.ENTROPY_FLOOR``) (``H(s_bar)`` is scale-invariant, so a live
    row below ``EPS`` has its true entropy there; the eq. 7 terms keep ``EPS``)."""
    pid = tl.program_id(0)
    rows = pid * BLOCK + tl.arange(0, BLOCK)
    s, lg, z, log_z, ent, over, valid, live = _rows(
        RS, RL, NK, QP, rows, NR, H, T, s_rs_b, s_rs_h, s_rs_t, s_rl_b, s_rl_h, s_rl_t,
        s_n_b, s_n_h, s_n_t, s_q_b, s_q_t, HAS_QP, ACC, EPS, C, BLOCK)
    zero = tl.full([BLOCK], 0.0, ACC)
    one = tl.full([BLOCK], 1.0, ACC)
    out = PART + pid.to(tl.int64) * 6
    tl.store(out + 0, _rowsum(tl.where(live, tl.abs(log_z), zero), 0))
    tl.store(out + 1, _rowsum(tl.where(live, tl.maximum(over, zero), zero), 0))
    zt = tl.maximum(s, tl.full([BLOCK], TINY, ACC))
    ent_stat = tl.log(zt) - lg / zt  # = ent where sum s >= EPS
    tl.store(out + 2, _rowsum(tl.where(live, ent_stat, zero), 0))
    tl.store(out + 3, _rowsum(tl.where(live, one, zero), 0))
    tl.store(out + 4, _rowsum(tl.where(valid & (live == 0), one, zero), 0))  # counted - live (a NaN sum too)
    tl.store(out + 5, _rowsum(tl.where(valid, one, zero), 0))


@triton.jit
def row_terms_bwd(RS, RL, NK, QP, GN, GM, DS, DL, NR, H, T, s_rs_b, s_rs_h, s_rs_t, s_rl_b, s_rl_h, s_rl_t,
                  s_n_b, s_n_h, s_n_t, s_q_b, s_q_t,
                  HAS_QP: tl.constexpr, HAS_GN: tl.constexpr, HAS_GM: tl.constexpr, ACC: tl.constexpr,
                  EPS: tl.constexpr, C: tl.constexpr, BLOCK: tl.constexpr):
    """One program per ``BLOCK`` rows: ``DS`` (d/d sum s) and, with ``HAS_GM``, ``DL`` (d/d sum s log s),
    both contiguous ``(B, H, T)`` in ACC dtype; ``GN``/``GM`` are the 0-d gradients of the norm and
    margin sums (read only with ``HAS_GN``/``HAS_GM``)."""
    pid = tl.program_id(0)
    rows = pid * BLOCK + tl.arange(0, BLOCK)
    s, lg, z, log_z, ent, over, valid, live = _rows(
        RS, RL, NK, QP, rows, NR, H, T, s_rs_b, s_rs_h, s_rs_t, s_rl_b, s_rl_h, s_rl_t,
        s_n_b, s_n_h, s_n_t, s_q_b, s_q_t, HAS_QP, ACC, EPS, C, BLOCK)
    zero = tl.full([BLOCK], 0.0, ACC)
    one = tl.full([BLOCK], 1.0, ACC)
    inv_z = tl.where(live, one / z, zero)
    inb = rows < NR
    d_s = zero
    if HAS_GM:
        m = tl.where(over > 0.0, inv_z, zero) * tl.load(GM).to(ACC)
        d_s = m + m * (lg / z)
        tl.store(DL + rows, -m, mask=inb)
    if HAS_GN:
        sgn = tl.where(log_z > 0.0, one, tl.where(log_z < 0.0, -one, zero))
        d_s = d_s + sgn * inv_z * tl.load(GN).to(ACC)
    d_s = tl.where(s >= tl.full([BLOCK], EPS, ACC), d_s, zero)
    tl.store(DS + rows, d_s, mask=inb)
