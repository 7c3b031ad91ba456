"""Triton kernels of E-ATT's L1-distance softmax attention (E-ATT eq. 13 + softmax).

Loaded by :mod:`fairseq_plugins.attention.triton` (never imported directly), once compiled and
once under the interpreter; the algorithm is documented there.  Scores
``x_ij = -scale * sum_d |q_id - k_jd|`` are built in registers one head dimension at a time
(subtraction, absolute value, addition: no tensor cores -- the point of E-ATT); the softmax is
the online (FlashAttention) one, ``p @ v`` and ``dO @ v^T`` use ``tl.dot``.
"""

import triton
import triton.language as tl

try:  # triton >= 3.4
    INTERPRET = bool(triton.knobs.runtime.interpret)
except AttributeError:  # pragma: no cover
    import os

    INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"

INTERPRET_BLOCKS = {"BLOCK_M": 16, "BLOCK_N": 16}

_FWD_CONFIGS = [(64, 64, 4, 2), (64, 32, 4, 2), (32, 64, 4, 2), (128, 64, 8, 2), (64, 128, 8, 2),
                (32, 32, 4, 1), (16, 32, 4, 1)]
_BWD_CONFIGS = [(64, 64, 4, 1), (32, 64, 4, 1), (64, 32, 4, 1), (32, 32, 4, 1), (64, 64, 8, 1),
                (16, 32, 4, 1)]
_KEY = ["T_KEY", "S_KEY", "BLOCK_D", "MASK_MODE", "CAUSAL", "DROPOUT", "PREC"]


def _prune(configs, named_args, **kwargs):
    t = max(16, named_args.get("T_KEY", kwargs.get("T_KEY", 16)))
    s = max(16, named_args.get("S_KEY", kwargs.get("S_KEY", 16)))
    kept = [c for c in configs if c.kwargs["BLOCK_M"] <= 2 * t and c.kwargs["BLOCK_N"] <= 2 * s]
    return kept or configs[-1:]


def _tuned(table):
    if INTERPRET:
        return lambda fn: fn
    configs = [triton.Config({"BLOCK_M": a, "BLOCK_N": b}, num_warps=w, num_stages=st)
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
def _valid(offs_m, offs_n, T, S, m_base, s_mt, s_ms, MASK_MODE: tl.constexpr, CAUSAL: tl.constexpr):
    """``(BLOCK_M, BLOCK_N)`` bool: inside ``T x S``, not masked (mask bytes nonzero = blocked;
    ``MASK_MODE`` 1: key padding row, 2: general tile), not in the causal future."""
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


@triton.jit
def _l1(q_base, k_base, offs_m, offs_n, row_ok, col_ok, s_qt, s_qd, s_ks, s_kd, D,
        ACC: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """``sum_d |q_id - k_jd|`` ``(BLOCK_M, BLOCK_N)``, one head dimension per step (columns of
    ``q`` and ``k`` come from L1/L2; nothing ``(M, N, d)``-sized is ever formed)."""
    dist = tl.zeros([BLOCK_M, BLOCK_N], dtype=ACC)
    for dd in range(0, D):
        qc = tl.load(q_base + offs_m * s_qt + dd * s_qd, mask=row_ok, other=0.0).to(ACC)
        kc = tl.load(k_base + offs_n * s_ks + dd * s_kd, mask=col_ok, other=0.0).to(ACC)
        dist += tl.abs(qc[:, None] - kc[None, :])
    return dist


@_tuned(_FWD_CONFIGS)
@triton.jit
def l1_fwd(Q, K, V, M, O, LSE,
           s_qb, s_qh, s_qt, s_qd, s_kb, s_kh, s_ks, s_kd, s_vb, s_vh, s_vs, s_vd,
           s_mb, s_mh, s_mt, s_ms, s_ob, s_oh, s_ot, s_od,
           H, T, S, D, scale, dropout_p, seed, T_KEY, S_KEY,
           MASK_MODE: tl.constexpr, CAUSAL: tl.constexpr, DROPOUT: tl.constexpr,
           ACC: tl.constexpr, PREC: tl.constexpr, UPCAST: tl.constexpr,
           BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """One program: ``BLOCK_M`` queries of one ``(b, h)``; online softmax over key tiles.
    Writes ``O`` and the row log-sum-exp ``LSE`` ``(B*H, T)`` (0 on fully masked rows)."""
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
    q_base = Q + b * s_qb + h * s_qh
    k_base = K + b * s_kb + h * s_kh
    v_base = V + b * s_vb + h * s_vh
    m_base = M + b * s_mb + h * s_mh
    m_i = tl.zeros([BLOCK_M], dtype=ACC) - float("inf")
    l_i = tl.zeros([BLOCK_M], dtype=ACC)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=ACC)
    hi = S
    if CAUSAL:
        hi = tl.minimum(S, (pid_m + 1) * BLOCK_M + S - T)
    for n0 in range(0, hi, BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        col_ok = offs_n < S
        x = -scale * _l1(q_base, k_base, offs_m, offs_n, row_ok, col_ok, s_qt, s_qd, s_ks, s_kd, D,
                         ACC, BLOCK_M, BLOCK_N)
        ok = _valid(offs_m, offs_n, T, S, m_base, s_mt, s_ms, MASK_MODE, CAUSAL)
        x = tl.where(ok, x, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(x, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # fully masked so far: no NaN
        p = tl.exp(x - m_safe[:, None])
        alpha = tl.exp(m_i - m_safe)
        l_i = l_i * alpha + tl.sum(p, 1)
        if DROPOUT:
            keep = tl.rand(seed + bh, offs_m[:, None] * S + offs_n[None, :]) >= dropout_p
            p = tl.where(keep, p / (1.0 - dropout_p), 0.0)
        v = tl.load(v_base + offs_n[:, None] * s_vs + offs_d[None, :] * s_vd,
                    mask=col_ok[:, None] & d_ok[None, :], other=0.0)
        acc = acc * alpha[:, None]
        acc = _dot(p.to(v.dtype), v, acc, PREC, UPCAST)
        m_i = m_new
    live = l_i > 0
    out = acc / tl.where(live, l_i, 1.0)[:, None]
    lse = tl.where(live, m_i + tl.log(tl.where(live, l_i, 1.0)), 0.0)
    tl.store(O + b * s_ob + h * s_oh + offs_m[:, None] * s_ot + offs_d[None, :] * s_od,
             out.to(O.dtype.element_ty), mask=row_ok[:, None] & d_ok[None, :])
    tl.store(LSE + bh * T + offs_m, lse.to(LSE.dtype.element_ty), mask=row_ok)


@_tuned(_BWD_CONFIGS)
@triton.jit
def l1_bwd_kv(Q, K, V, M, DO, LSE, DELTA, DK, DV,
              s_qb, s_qh, s_qt, s_qd, s_kb, s_kh, s_ks, s_kd, s_vb, s_vh, s_vs, s_vd,
              s_mb, s_mh, s_mt, s_ms, s_ob, s_oh, s_ot, s_od,
              s_dkb, s_dkh, s_dks, s_dkd, s_dvb, s_dvh, s_dvs, s_dvd,
              H, T, S, D, scale, dropout_p, seed, T_KEY, S_KEY,
              MASK_MODE: tl.constexpr, CAUSAL: tl.constexpr, DROPOUT: tl.constexpr,
              ACC: tl.constexpr, PREC: tl.constexpr, UPCAST: tl.constexpr,
              BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """One program: ``dK, dV`` of ``BLOCK_N`` keys; loops over query tiles.  With
    ``dS = P (dP - delta)`` (``delta_i = dO_i . O_i``): ``dV = P_drop^T dO`` and
    ``dk_jd = scale * sum_i dS_ij sign(q_id - k_jd)``."""
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
    q_base = Q + b * s_qb + h * s_qh
    k_base = K + b * s_kb + h * s_kh
    do_base = DO + b * s_ob + h * s_oh
    m_base = M + b * s_mb + h * s_mh
    v = tl.load(V + b * s_vb + h * s_vh + offs_n[:, None] * s_vs + offs_d[None, :] * s_vd,
                mask=kv_mask, other=0.0)
    dk = tl.zeros([BLOCK_N, BLOCK_D], dtype=ACC)
    dv = tl.zeros([BLOCK_N, BLOCK_D], dtype=ACC)
    lo = 0
    if CAUSAL:
        lo = (tl.maximum(0, pid_n * BLOCK_N - (S - T)) // BLOCK_M) * BLOCK_M
    for m0 in range(lo, T, BLOCK_M):
        offs_m = m0 + tl.arange(0, BLOCK_M)
        row_ok = offs_m < T
        # transposed tile (keys x queries): P^T = exp(x^T - lse)
        dist = _l1(k_base, q_base, offs_n, offs_m, col_ok, row_ok, s_ks, s_kd, s_qt, s_qd, D,
                   ACC, BLOCK_N, BLOCK_M)
        ok = _valid_t(offs_n, offs_m, T, S, m_base, s_mt, s_ms, MASK_MODE, CAUSAL)
        lse = tl.load(LSE + bh * T + offs_m, mask=row_ok, other=0.0).to(ACC)
        delta = tl.load(DELTA + bh * T + offs_m, mask=row_ok, other=0.0).to(ACC)
        pt = tl.where(ok, tl.exp(-scale * dist - lse[None, :]), 0.0)
        do = tl.load(do_base + offs_m[:, None] * s_ot + offs_d[None, :] * s_od,
                     mask=row_ok[:, None] & d_ok[None, :], other=0.0)
        dpt = _dot(v, tl.trans(do), tl.zeros([BLOCK_N, BLOCK_M], dtype=ACC), PREC, UPCAST).to(ACC)
        if DROPOUT:
            keep = tl.rand(seed + bh, offs_m[None, :] * S + offs_n[:, None]) >= dropout_p
            dv = _dot(tl.where(keep, pt / (1.0 - dropout_p), 0.0).to(do.dtype), do, dv, PREC,
                      UPCAST)
            dpt = tl.where(keep, dpt / (1.0 - dropout_p), 0.0)
        else:
            dv = _dot(pt.to(do.dtype), do, dv, PREC, UPCAST)
        dst = pt * (dpt - delta[None, :])
        for dd in range(0, D):  # dk[:, dd] += sum_i dS_ij sign(q_id - k_jd)
            qc = tl.load(q_base + offs_m * s_qt + dd * s_qd, mask=row_ok, other=0.0).to(ACC)
            kc = tl.load(k_base + offs_n * s_ks + dd * s_kd, mask=col_ok, other=0.0).to(ACC)
            diff = qc[None, :] - kc[:, None]
            g = tl.sum(tl.where(diff > 0, dst, tl.where(diff < 0, -dst, 0.0)), 1)
            dk = tl.where(offs_d[None, :] == dd, dk + g[:, None], dk)
    dk = dk * scale
    tl.store(DK + b * s_dkb + h * s_dkh + offs_n[:, None] * s_dks + offs_d[None, :] * s_dkd,
             dk.to(DK.dtype.element_ty), mask=kv_mask)
    tl.store(DV + b * s_dvb + h * s_dvh + offs_n[:, None] * s_dvs + offs_d[None, :] * s_dvd,
             dv.to(DV.dtype.element_ty), mask=kv_mask)


@_tuned(_BWD_CONFIGS)
@triton.jit
def l1_bwd_q(Q, K, V, M, DO, LSE, DELTA, DQ,
             s_qb, s_qh, s_qt, s_qd, s_kb, s_kh, s_ks, s_kd, s_vb, s_vh, s_vs, s_vd,
             s_mb, s_mh, s_mt, s_ms, s_ob, s_oh, s_ot, s_od, s_dqb, s_dqh, s_dqt, s_dqd,
             H, T, S, D, scale, dropout_p, seed, T_KEY, S_KEY,
             MASK_MODE: tl.constexpr, CAUSAL: tl.constexpr, DROPOUT: tl.constexpr,
             ACC: tl.constexpr, PREC: tl.constexpr, UPCAST: tl.constexpr,
             BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """One program: ``dQ`` of ``BLOCK_M`` queries; ``dq_id = -scale sum_j dS_ij sign(q_id - k_jd)``."""
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
    q_base = Q + b * s_qb + h * s_qh
    k_base = K + b * s_kb + h * s_kh
    v_base = V + b * s_vb + h * s_vh
    m_base = M + b * s_mb + h * s_mh
    do = tl.load(DO + b * s_ob + h * s_oh + offs_m[:, None] * s_ot + offs_d[None, :] * s_od,
                 mask=q_mask, other=0.0)
    lse = tl.load(LSE + bh * T + offs_m, mask=row_ok, other=0.0).to(ACC)
    delta = tl.load(DELTA + bh * T + offs_m, mask=row_ok, other=0.0).to(ACC)
    dq = tl.zeros([BLOCK_M, BLOCK_D], dtype=ACC)
    hi = S
    if CAUSAL:
        hi = tl.minimum(S, (pid_m + 1) * BLOCK_M + S - T)
    for n0 in range(0, hi, BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        col_ok = offs_n < S
        dist = _l1(q_base, k_base, offs_m, offs_n, row_ok, col_ok, s_qt, s_qd, s_ks, s_kd, D,
                   ACC, BLOCK_M, BLOCK_N)
        ok = _valid(offs_m, offs_n, T, S, m_base, s_mt, s_ms, MASK_MODE, CAUSAL)
        p = tl.where(ok, tl.exp(-scale * dist - lse[:, None]), 0.0)
        vt = tl.load(v_base + offs_n[None, :] * s_vs + offs_d[:, None] * s_vd,
                     mask=col_ok[None, :] & d_ok[:, None], other=0.0)
        dp = _dot(do, vt, tl.zeros([BLOCK_M, BLOCK_N], dtype=ACC), PREC, UPCAST).to(ACC)
        if DROPOUT:
            keep = tl.rand(seed + bh, offs_m[:, None] * S + offs_n[None, :]) >= dropout_p
            dp = tl.where(keep, dp / (1.0 - dropout_p), 0.0)
        ds = p * (dp - delta[:, None])
        for dd in range(0, D):  # dq[:, dd] += sum_j dS_ij sign(q_id - k_jd)
            qc = tl.load(q_base + offs_m * s_qt + dd * s_qd, mask=row_ok, other=0.0).to(ACC)
            kc = tl.load(k_base + offs_n * s_ks + dd * s_kd, mask=col_ok, other=0.0).to(ACC)
            diff = qc[:, None] - kc[None, :]
            g = tl.sum(tl.where(diff > 0, ds, tl.where(diff < 0, -ds, 0.0)), 1)
            dq = tl.where(offs_d[None, :] == dd, dq + g[:, None], dq)
    dq = dq * (-scale)
    tl.store(DQ + b * s_dqb + h * s_dqh + offs_m[:, None] * s_dqt + offs_d[None, :] * s_dqd,
             dq.to(DQ.dtype.element_ty), mask=q_mask)
