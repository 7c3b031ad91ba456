"""Triton kernels of the rectified attentions (ReLA eq. 3 core, ReLUFormer eq. 6 + eq. 7 rows).

Loaded by :mod:`fairseq_plugins.attention.triton` (never imported directly): that loader executes
this file once as compiled kernels (CUDA) and once under Triton's interpreter
(``TRITON_INTERPRET=1``, CPU tensors), as two module objects.  The algorithm and the launch
contract are documented there; this file holds only the ``@triton.jit`` code.

Notation per program: a tile of ``BLOCK_M`` query rows ``i`` and ``BLOCK_N`` key columns ``j`` of
one ``(b, h)``; ``x_ij = r_i (q_i . k_j)``, ``s_ij = act(x_ij)`` (0 where blocked),
``out_i = sum_j drop(s_ij) v_j``.  No row max and no row sum: a rectified attention has no
normaliser, so every key tile is independent and the loop carries only the output accumulator
(and, with ``STATS``, ``sum_j s_ij`` and ``sum_j s_ij log s_ij``).
"""

import triton
import triton.language as tl

try:  # triton >= 3.4
    INTERPRET = bool(triton.knobs.runtime.interpret)
except AttributeError:  # pragma: no cover - older triton reads the variable directly
    import os

    INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"

#: fixed tiles of the interpreter (small, so tests with T, S ~ 5..40 cross several tiles)
INTERPRET_BLOCKS = {"BLOCK_M": 16, "BLOCK_N": 16}
#: smallest positive float32 normal: ``log(max(s, TINY))`` is finite, and exact where it matters
TINY = 1.1754943508222875e-38

_FWD_CONFIGS = [(128, 64, 4, 3), (128, 64, 8, 3), (128, 128, 8, 3), (64, 64, 4, 3),
                (64, 128, 4, 3), (128, 32, 4, 4), (64, 32, 4, 2), (32, 32, 4, 2), (16, 32, 4, 2)]
_BWD_CONFIGS = [(64, 64, 4, 2), (64, 128, 8, 2), (128, 64, 8, 2), (32, 64, 4, 2),
                (64, 32, 4, 2), (32, 32, 4, 1), (16, 32, 4, 1), (128, 128, 8, 2)]
_KEY = ["T_KEY", "S_KEY", "BLOCK_D", "ACT", "MASK_MODE", "CAUSAL", "STATS", "DROPOUT", "PREC"]


def _prune(configs, named_args, **kwargs):
    """Drop tiles far larger than the problem (decoding: T = 1); always keeps one config."""
    t = max(16, named_args.get("T_KEY", kwargs.get("T_KEY", 16)))
    s = max(16, named_args.get("S_KEY", kwargs.get("S_KEY", 16)))
    kept = [c for c in configs if c.kwargs["BLOCK_M"] <= 2 * t and c.kwargs["BLOCK_N"] <= 2 * s]
    return kept or configs[-1:]


def _tuned(table, rows_name, cols_name):
    """``triton.autotune`` over ``table`` on a GPU; identity under the interpreter (fixed tiles)."""
    if INTERPRET:
        return lambda fn: fn
    configs = [triton.Config({rows_name: a, cols_name: b}, num_warps=w, num_stages=st)
               for a, b, w, st in table]
    return triton.autotune(configs=configs, key=_KEY, prune_configs_by={"early_config_prune": _prune})


@triton.jit
def _dot(a, b, acc, PREC: tl.constexpr, UPCAST: tl.constexpr):
    """``acc + a @ b`` (``tl.dot``); ``UPCAST``: operands in float32 first (set only under the
    interpreter for bfloat16, whose ``tl.dot`` it gets wrong)."""
    if UPCAST:
        res = tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision=PREC)
    else:
        res = tl.dot(a, b, acc, input_precision=PREC)
    return res


@triton.jit
def _act(x, ACT: tl.constexpr):
    """0 ReLU, 1 GeLU (erf form, as ``F.gelu``), 2 Leaky ReLU (slope 0.01)."""
    if ACT == 1:
        y = 0.5 * x * (1.0 + tl.erf(x * 0.7071067811865476))
    elif ACT == 2:
        y = tl.where(x > 0, x, 0.01 * x)
    else:
        y = tl.maximum(x, 0.0)
    return y


@triton.jit
def _act_grad(x, ACT: tl.constexpr):
    """``act'(x)``; at 0: ReLU 0 (as ``threshold_backward``), Leaky ReLU 0.01 (as torch)."""
    if ACT == 1:
        g = 0.5 * (1.0 + tl.erf(x * 0.7071067811865476)) + x * tl.exp(-0.5 * x * x) * 0.3989422804014327
    elif ACT == 2:
        g = tl.where(x > 0, 1.0, 0.01)
    else:
        g = tl.where(x > 0, 1.0, 0.0)
    return g


@triton.jit
def _valid(offs_m, offs_n, T, S, m_base, s_mt, s_ms, MASK_MODE: tl.constexpr, CAUSAL: tl.constexpr):
    """``(BLOCK_M, BLOCK_N)`` bool: inside ``T x S``, not masked, not in the causal future.

    ``MASK_MODE`` 0: no mask; 1: one key-padding row per ``(b, h)`` (``s_mt == 0``); 2: a general
    ``(T, S)`` slice read tile by tile.  Mask bytes are nonzero where blocked.
    """
    ok = (offs_m[:, None] < T) & (offs_n[None, :] < S)
    if MASK_MODE == 1:
        km = tl.load(m_base + offs_n * s_ms, mask=offs_n < S, other=1)
        ok = ok & (km == 0)[None, :]
    elif MASK_MODE == 2:
        mm = tl.load(m_base + offs_m[:, None] * s_mt + offs_n[None, :] * s_ms,
                     mask=(offs_m[:, None] < T) & (offs_n[None, :] < S), other=1)
        ok = ok & (mm == 0)
    if CAUSAL:
        ok = ok & (offs_n[None, :] <= offs_m[:, None] + (S - T))
    return ok


@triton.jit
def _valid_t(offs_n, offs_m, T, S, m_base, s_mt, s_ms, MASK_MODE: tl.constexpr, CAUSAL: tl.constexpr):
    """:func:`_valid` transposed: ``(BLOCK_N, BLOCK_M)``."""
    ok = (offs_n[:, None] < S) & (offs_m[None, :] < T)
    if MASK_MODE == 1:
        km = tl.load(m_base + offs_n * s_ms, mask=offs_n < S, other=1)
        ok = ok & (km == 0)[:, None]
    elif MASK_MODE == 2:
        mm = tl.load(m_base + offs_m[None, :] * s_mt + offs_n[:, None] * s_ms,
                     mask=(offs_n[:, None] < S) & (offs_m[None, :] < T), other=1)
        ok = ok & (mm == 0)
    if CAUSAL:
        ok = ok & (offs_n[:, None] <= offs_m[None, :] + (S - T))
    return ok


@_tuned(_FWD_CONFIGS, "BLOCK_M", "BLOCK_N")
@triton.jit
def rect_fwd(Q, K, V, R, M, O, RS, RL,
             s_qb, s_qh, s_qt, s_qd, s_kb, s_kh, s_ks, s_kd, s_vb, s_vh, s_vs, s_vd,
             s_rb, s_rh, s_rt, s_mb, s_mh, s_mt, s_ms, s_ob, s_oh, s_ot, s_od,
             H, T, S, D, r_const, dropout_p, seed, T_KEY, S_KEY,
             HAS_R: tl.constexpr, MASK_MODE: tl.constexpr, CAUSAL: tl.constexpr, ACT: tl.constexpr,
             STATS: tl.constexpr, DROPOUT: tl.constexpr, ACC: tl.constexpr, PREC: tl.constexpr, UPCAST: tl.constexpr,
             BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """One program: ``BLOCK_M`` query rows of one ``(b, h)``; loops over key tiles."""
    pid = tl.program_id(0)
    num_m = tl.cdiv(T, BLOCK_M)
    pid_m = pid % num_m
    bh = pid // num_m
    b = (bh // H).to(tl.int64)
    h = (bh % H).to(tl.int64)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    row_ok = offs_m < T
    d_ok = offs_d < D
    q = tl.load(Q + b * s_qb + h * s_qh + offs_m[:, None] * s_qt + offs_d[None, :] * s_qd,
                mask=row_ok[:, None] & d_ok[None, :], other=0.0)
    if HAS_R:
        r = tl.load(R + b * s_rb + h * s_rh + offs_m * s_rt, mask=row_ok, other=0.0).to(ACC)
    else:
        r = tl.zeros([BLOCK_M], dtype=ACC) + r_const
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=ACC)
    rsum = tl.zeros([BLOCK_M], dtype=ACC)
    rlog = tl.zeros([BLOCK_M], dtype=ACC)
    k_base = K + b * s_kb + h * s_kh
    v_base = V + b * s_vb + h * s_vh
    m_base = M + b * s_mb + h * s_mh
    hi = S
    if CAUSAL:  # keys after the block's last query are never visited
        hi = tl.minimum(S, (pid_m + 1) * BLOCK_M + S - T)
    for n0 in range(0, hi, BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        col_ok = offs_n < S
        kt = tl.load(k_base + offs_n[None, :] * s_ks + offs_d[:, None] * s_kd,
                     mask=col_ok[None, :] & d_ok[:, None], other=0.0)
        v = tl.load(v_base + offs_n[:, None] * s_vs + offs_d[None, :] * s_vd,
                    mask=col_ok[:, None] & d_ok[None, :], other=0.0)
        x = _dot(q, kt, tl.zeros([BLOCK_M, BLOCK_N], dtype=ACC), PREC, UPCAST).to(ACC) * r[:, None]
        ok = _valid(offs_m, offs_n, T, S, m_base, s_mt, s_ms, MASK_MODE, CAUSAL)
        s = tl.where(ok, _act(x, ACT), 0.0)
        if STATS:
            rsum += tl.sum(s, 1)
            rlog += tl.sum(s * tl.log(tl.maximum(s, TINY)), 1)
        if DROPOUT:
            keep = tl.rand(seed + bh, offs_m[:, None] * S + offs_n[None, :]) >= dropout_p
            s = tl.where(keep, s / (1.0 - dropout_p), 0.0)
        acc = _dot(s.to(v.dtype), v, acc, PREC, UPCAST)
    tl.store(O + b * s_ob + h * s_oh + offs_m[:, None] * s_ot + offs_d[None, :] * s_od,
             acc.to(O.dtype.element_ty), mask=row_ok[:, None] & d_ok[None, :])
    if STATS:
        tl.store(RS + bh * T + offs_m, rsum.to(RS.dtype.element_ty), mask=row_ok)
        tl.store(RL + bh * T + offs_m, rlog.to(RL.dtype.element_ty), mask=row_ok)


@_tuned(_BWD_CONFIGS, "BLOCK_M", "BLOCK_N")
@triton.jit
def rect_bwd_kv(Q, K, V, R, M, DO, GS, GL, DK, DV,
                s_qb, s_qh, s_qt, s_qd, s_kb, s_kh, s_ks, s_kd, s_vb, s_vh, s_vs, s_vd,
                s_rb, s_rh, s_rt, s_mb, s_mh, s_mt, s_ms, s_ob, s_oh, s_ot, s_od,
                s_dkb, s_dkh, s_dks, s_dkd, s_dvb, s_dvh, s_dvs, s_dvd,
                H, T, S, D, r_const, dropout_p, seed, T_KEY, S_KEY,
                HAS_R: tl.constexpr, MASK_MODE: tl.constexpr, CAUSAL: tl.constexpr, ACT: tl.constexpr,
                STATS: tl.constexpr, DROPOUT: tl.constexpr, ACC: tl.constexpr, PREC: tl.constexpr, UPCAST: tl.constexpr,
                BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """One program: ``dK, dV`` of ``BLOCK_N`` keys of one ``(b, h)``; loops over query tiles,
    recomputing the transposed scores ``x^T = k (r q)^T``.  ``STATS``: the eq. 7 row sums have
    gradients ``GS, GL`` ``(B*H, T)`` (``d/ds_ij = g_sum_i + g_slogs_i (log s_ij + 1)``)."""
    pid = tl.program_id(0)
    num_n = tl.cdiv(S, BLOCK_N)
    pid_n = pid % num_n
    bh = pid // num_n
    b = (bh // H).to(tl.int64)
    h = (bh % H).to(tl.int64)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    col_ok = offs_n < S
    d_ok = offs_d < D
    kv_mask = col_ok[:, None] & d_ok[None, :]
    k = tl.load(K + b * s_kb + h * s_kh + offs_n[:, None] * s_ks + offs_d[None, :] * s_kd,
                mask=kv_mask, other=0.0)
    v = tl.load(V + b * s_vb + h * s_vh + offs_n[:, None] * s_vs + offs_d[None, :] * s_vd,
                mask=kv_mask, other=0.0)
    dk = tl.zeros([BLOCK_N, BLOCK_D], dtype=ACC)
    dv = tl.zeros([BLOCK_N, BLOCK_D], dtype=ACC)
    q_base = Q + b * s_qb + h * s_qh
    do_base = DO + b * s_ob + h * s_oh
    m_base = M + b * s_mb + h * s_mh
    lo = 0
    if CAUSAL:  # queries before the first one that sees key pid_n * BLOCK_N are skipped
        lo = (tl.maximum(0, pid_n * BLOCK_N - (S - T)) // BLOCK_M) * BLOCK_M
    for m0 in range(lo, T, BLOCK_M):
        offs_m = m0 + tl.arange(0, BLOCK_M)
        row_ok = offs_m < T
        qt = tl.load(q_base + offs_m[None, :] * s_qt + offs_d[:, None] * s_qd,
                     mask=row_ok[None, :] & d_ok[:, None], other=0.0)
        do = tl.load(do_base + offs_m[:, None] * s_ot + offs_d[None, :] * s_od,
                     mask=row_ok[:, None] & d_ok[None, :], other=0.0)
        if HAS_R:
            r = tl.load(R + b * s_rb + h * s_rh + offs_m * s_rt, mask=row_ok, other=0.0).to(ACC)
        else:
            r = tl.zeros([BLOCK_M], dtype=ACC) + r_const
        xt = _dot(k, qt, tl.zeros([BLOCK_N, BLOCK_M], dtype=ACC), PREC, UPCAST).to(ACC) * r[None, :]
        ok = _valid_t(offs_n, offs_m, T, S, m_base, s_mt, s_ms, MASK_MODE, CAUSAL)
        st = tl.where(ok, _act(xt, ACT), 0.0)
        dpt = _dot(v, tl.trans(do), tl.zeros([BLOCK_N, BLOCK_M], dtype=ACC), PREC, UPCAST).to(ACC)
        if DROPOUT:
            keep = tl.rand(seed + bh, offs_m[None, :] * S + offs_n[:, None]) >= dropout_p
            pt = tl.where(keep, st / (1.0 - dropout_p), 0.0)
            dpt = tl.where(keep, dpt / (1.0 - dropout_p), 0.0)
        else:
            pt = st
        dv = _dot(pt.to(do.dtype), do, dv, PREC, UPCAST)
        if STATS:
            gs = tl.load(GS + bh * T + offs_m, mask=row_ok, other=0.0).to(ACC)
            gl = tl.load(GL + bh * T + offs_m, mask=row_ok, other=0.0).to(ACC)
            dpt += gs[None, :] + gl[None, :] * (tl.log(tl.maximum(st, TINY)) + 1.0)
        dxt = tl.where(ok, dpt * _act_grad(xt, ACT), 0.0) * r[None, :]
        dk = _dot(dxt.to(qt.dtype), tl.trans(qt), dk, PREC, UPCAST)
    tl.store(DK + b * s_dkb + h * s_dkh + offs_n[:, None] * s_dks + offs_d[None, :] * s_dkd,
             dk.to(DK.dtype.element_ty), mask=kv_mask)
    tl.store(DV + b * s_dvb + h * s_dvh + offs_n[:, None] * s_dvs + offs_d[None, :] * s_dvd,
             dv.to(DV.dtype.element_ty), mask=kv_mask)


@_tuned(_BWD_CONFIGS, "BLOCK_M", "BLOCK_N")
@triton.jit
def rect_bwd_q(Q, K, V, R, M, DO, GS, GL, DQ,
               s_qb, s_qh, s_qt, s_qd, s_kb, s_kh, s_ks, s_kd, s_vb, s_vh, s_vs, s_vd,
               s_rb, s_rh, s_rt, s_mb, s_mh, s_mt, s_ms, s_ob, s_oh, s_ot, s_od,
               s_dqb, s_dqh, s_dqt, s_dqd,
               H, T, S, D, r_const, dropout_p, seed, T_KEY, S_KEY,
               HAS_R: tl.constexpr, MASK_MODE: tl.constexpr, CAUSAL: tl.constexpr, ACT: tl.constexpr,
               STATS: tl.constexpr, DROPOUT: tl.constexpr, ACC: tl.constexpr, PREC: tl.constexpr, UPCAST: tl.constexpr,
               BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """One program: ``dQ`` of ``BLOCK_M`` queries of one ``(b, h)``; loops over key tiles."""
    pid = tl.program_id(0)
    num_m = tl.cdiv(T, BLOCK_M)
    pid_m = pid % num_m
    bh = pid // num_m
    b = (bh // H).to(tl.int64)
    h = (bh % H).to(tl.int64)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    row_ok = offs_m < T
    d_ok = offs_d < D
    q_mask = row_ok[:, None] & d_ok[None, :]
    q = tl.load(Q + b * s_qb + h * s_qh + offs_m[:, None] * s_qt + offs_d[None, :] * s_qd,
                mask=q_mask, other=0.0)
    do = tl.load(DO + b * s_ob + h * s_oh + offs_m[:, None] * s_ot + offs_d[None, :] * s_od,
                 mask=q_mask, other=0.0)
    if HAS_R:
        r = tl.load(R + b * s_rb + h * s_rh + offs_m * s_rt, mask=row_ok, other=0.0).to(ACC)
    else:
        r = tl.zeros([BLOCK_M], dtype=ACC) + r_const
    if STATS:
        gs = tl.load(GS + bh * T + offs_m, mask=row_ok, other=0.0).to(ACC)
        gl = tl.load(GL + bh * T + offs_m, mask=row_ok, other=0.0).to(ACC)
    dq = tl.zeros([BLOCK_M, BLOCK_D], dtype=ACC)
    k_base = K + b * s_kb + h * s_kh
    v_base = V + b * s_vb + h * s_vh
    m_base = M + b * s_mb + h * s_mh
    hi = S
    if CAUSAL:
        hi = tl.minimum(S, (pid_m + 1) * BLOCK_M + S - T)
    for n0 in range(0, hi, BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        col_ok = offs_n < S
        kt = tl.load(k_base + offs_n[None, :] * s_ks + offs_d[:, None] * s_kd,
                     mask=col_ok[None, :] & d_ok[:, None], other=0.0)
        vt = tl.load(v_base + offs_n[None, :] * s_vs + offs_d[:, None] * s_vd,
                     mask=col_ok[None, :] & d_ok[:, None], other=0.0)
        x = _dot(q, kt, tl.zeros([BLOCK_M, BLOCK_N], dtype=ACC), PREC, UPCAST).to(ACC) * r[:, None]
        ok = _valid(offs_m, offs_n, T, S, m_base, s_mt, s_ms, MASK_MODE, CAUSAL)
        dp = _dot(do, vt, tl.zeros([BLOCK_M, BLOCK_N], dtype=ACC), PREC, UPCAST).to(ACC)
        if DROPOUT:
            keep = tl.rand(seed + bh, offs_m[:, None] * S + offs_n[None, :]) >= dropout_p
            dp = tl.where(keep, dp / (1.0 - dropout_p), 0.0)
        if STATS:
            s = tl.where(ok, _act(x, ACT), 0.0)
            dp += gs[:, None] + gl[:, None] * (tl.log(tl.maximum(s, TINY)) + 1.0)
        dx = tl.where(ok, dp * _act_grad(x, ACT), 0.0)
        dq = _dot(dx.to(kt.dtype), tl.trans(kt), dq, PREC, UPCAST)
    dq = dq * r[:, None]
    tl.store(DQ + b * s_dqb + h * s_dqh + offs_m[:, None] * s_dqt + offs_d[None, :] * s_dqd,
             dq.to(DQ.dtype.element_ty), mask=q_mask)
