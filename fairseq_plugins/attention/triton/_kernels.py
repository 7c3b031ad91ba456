"""Triton kernels of the fused attentions: rectified (ReLA eq. 3, ReLUFormer eqs. 6-7) and E-ATT's
L1-distance softmax (E-ATT eq. 13).

Loaded by :mod:`fairseq_plugins.attention.triton` (never imported directly): that loader executes
this file once as compiled kernels (CUDA) and once under Triton's interpreter
(``TRITON_INTERPRET=1``, CPU tensors), as two module objects; the algorithms and the launch
contract are documented there.

Everything a kernel calls is defined here, in ``_jit_common.py`` (loaded in this module's mode)
or is a Triton *builtin* (``tl.dot``, ``tl.load``, ``tl.where``, ``tl.reduce``, ``tl.umulhi``, ...):
Triton's own ``@jit`` library functions (``tl.sum``, ``tl.max``, ``tl.zeros``, ``tl.cdiv``,
``tl.rand``) are created in one mode when triton is first imported, and an interpreted kernel
cannot call compiled ones -- so sums and maxima (``_jit_common``), zeros and the Philox generator
(below) are small local versions made in this module's mode.

Rectified, per program: a tile of ``BLOCK_M`` query rows ``i`` and ``BLOCK_N`` key columns ``j`` of
one ``(b, h)``; ``x_ij = r_i (q_i . k_j)``, ``s_ij = act(x_ij)`` (0 where blocked),
``out_i = sum_j drop(s_ij) v_j``.  No row max and no row sum: a rectified attention has no
normaliser, so every key tile is independent and the loop carries only the output accumulator
(and, with ``STATS``, ``sum_j s_ij`` and ``sum_j s_ij log s_ij``).

L1 softmax: ``x_ij = -scale * sum_d |q_id - k_jd|`` built in registers ``CHUNK`` head dimensions
per step over the constexpr ``BLOCK_D`` (subtraction, absolute value, addition: no tensor cores --
the point of E-ATT; see :func:`_l1`); the backward kernels' sign sums
``sum_j dS_ij sgn(q_id - k_jd)`` go ``CHUNK`` head dimensions per step too, into a float scratch
buffer (see :func:`_l1_sgn`); the softmax is the online
(FlashAttention) one; ``p @ v`` and ``dO @ v^T`` use ``tl.dot``.
"""

import functools

import torch
import triton
import triton.language as tl

from . import kernel_mode, load_kernel_module

INTERPRET = kernel_mode()
_common = load_kernel_module("_jit_common.py", INTERPRET)  # tl.sum / tl.max in this file's mode

#: fixed tiles of the interpreter (small, so tests with T, S ~ 5..40 cross several tiles)
INTERPRET_BLOCKS = {"BLOCK_M": 16, "BLOCK_N": 16}
#: rounds of the dropout's Philox-4x32 (FlashAttention-2: 7; curand / ``tl.randint4x``: 10)
PHILOX_ROUNDS = tl.constexpr(7)
#: compiled (not interpreted): inline assembly is available (see ``_opaque``)
COMPILED = tl.constexpr(not INTERPRET)
#: smallest positive float32 normal: ``log(max(s, TINY))`` is finite, and exact where it matters
TINY = tl.constexpr(1.1754943508222875e-38)
#: lanes of a warp on the summed axis of E-ATT's backward sign sums (``_l1_sgn``)
SGN_LANES = tl.constexpr(8)
#: the same in the fused backward (``l1_bwd``), whose tile is summed over both axes: 16 lanes on
#: the query axis leave 2 lanes x the warps on the key axis that the dQ sums reduce over (sm_90a
#: bf16 d 64 64x64 w8: 1081 SASS per score against 1260 with 8 lanes, 1730 with 4, 1181 with 32;
#: the split pair: 766 + 757 with 8)
SGN_LANES_FUSED = tl.constexpr(16)

# autotuning tables (BLOCK_M, BLOCK_N, num_warps, num_stages) of the compiled kernels
_RECT_FWD = [(128, 64, 4, 3), (128, 64, 8, 3), (128, 128, 8, 3), (64, 64, 4, 3),
             (64, 128, 4, 3), (128, 32, 4, 4), (64, 32, 4, 2), (32, 32, 4, 2), (16, 32, 4, 2)]
# rect_bwd_kv holds dK, dV and the transposed scores: 64x64 with 2 stages spilled with dropout
# (12-84 B, sm_90a d 64, issue 28); one stage does not (ReLA).  The triton fused-attention
# tutorial's backward tiles (dK/dV: 128 keys x 32 queries, dQ: 128 queries x 32 keys, 3 stages;
# issue 28): with 8 warps no spills in the main configurations; 32x128 w4 s3 spills with dropout
# (ReLA 144-212 B) and with the eq. 7 statistics (108-436 B): not tried there (_tried).  4 and 5
# stages: the same code with more shared memory (5 spills with ReLUFormer + dropout): not added
# 128x128 w8 s2 was the last tile: it spilled at d 64 without dropout too (rela_causal 60 B,
# ReLUFormer 280 B), at d 32 with the eq. 7 statistics (60 B), with dropout and at d 128 -- clean
# only for ReLA without dropout at d 32/64 -- and is no longer in the table (--tiles table, below)
_RECT_BWD_KV = [(64, 64, 4, 1), (32, 64, 4, 2), (64, 128, 8, 2), (128, 64, 8, 2), (64, 32, 4, 2),
                (32, 32, 4, 1), (16, 32, 4, 1), (32, 128, 4, 3), (32, 128, 8, 3)]
_RECT_BWD_Q = [(64, 64, 4, 2), (64, 128, 8, 2), (128, 64, 8, 2), (32, 64, 4, 2),
               (64, 32, 4, 2), (32, 32, 4, 1), (16, 32, 4, 1), (128, 32, 4, 3), (128, 32, 8, 3),
               (128, 128, 8, 2)]
# rect_bwd (the fused backward: dK, dV of BLOCK_N keys and the transposed scores in registers,
# dQ by atomic adds): the triton tutorial's dK/dV tile (32 queries x 128 keys) with 8 warps and 2
# stages spills nothing in the main configurations (sm_90a fp16 d 64, ReLUFormer + dropout: 236
# registers); 3 stages spill 8 B there; 64 x 128 w8 s2 spills with dropout (rela_causal 40 B) and
# with the eq. 7 statistics (40-132 B), 64 x 64 w4 too (24-308 B): not in the table; 64 x 128 w8
# with 1 stage spills only with dropout (16-96 B): tried without it (ReLA 21.25 vs 28.06 PTX/score,
# ReLUFormer 53.84 vs 60.0, fp16 d 64; _SPILL_WITH_DROPOUT).  At d 128 with dropout 32x128 w8 s2
# and 32x64 w4 s2 spill (32-156 B; _SPILL_AT_D128_WITH_DROPOUT), 64x128 w8 s1 also without it
# (28-132 B; _SPILL_AT_D128): there 16 queries x 128 keys with 8 warps and 1 stage spills nothing
# (sm_90a fp16/bf16, rela_enc / rela_causal / reluformer_enc: 241-246 registers) at 1.27-1.29x the
# PTX per score of the spilling 32x128 w8 s2 and 0.63-0.65x the split pair's (rela_enc 59.75 vs
# 46.19 and 94.94; 16x128 w8 s2 66.88, 32x64 w8 s1 79.38 (spills 12-84 B with rela_causal /
# ReLUFormer), 16x64 w8 s1 104.5, 32x32 w4 s1 75.38: not added or already there)
_RECT_BWD = [(32, 128, 8, 2), (16, 128, 8, 1), (32, 64, 4, 2), (64, 128, 8, 1), (32, 32, 4, 1), (16, 32, 4, 1)]
#: rectified tiles that spill with ReLUFormer's eq. 7 statistics (``STATS``: ``s log s`` per score),
#: per table; the autotuner does not try them there (``_tried``).  sm_90a d 64: rect_fwd 128x64 w4
#: s3 20-148 B, rect_bwd_kv 64x64 w4 s1 212 B with dropout.
#: Re-measured with ``mt-kernel-report --arch 90 --dtypes fp16 --head-dims 32,64,128 --variants
#: rela_enc,rela_causal,reluformer_enc,eatt_enc,eatt_causal --dropouts 0,0.1 --tiles table``
#: (results/gpu/kernel_report_sm90_excluded_tiles.md, every tile of every table, issue 28):
#: rect_bwd_kv 128x64 w8 s2 24 / 64 B (d 32 / 64, no dropout), 64x32 w4 s2 20 B (d 32) -- ReLA
#: compiles them without spills there.  Before, one set for every table; none is in ``_RECT_BWD_Q``.
_SPILL_WITH_STATS = [
    (_RECT_FWD, {(128, 64, 4, 3)}),
    (_RECT_BWD_KV, {(64, 64, 4, 1), (32, 128, 4, 3), (128, 64, 8, 2), (64, 32, 4, 2)}),
]
#: rectified tiles that spill with attention dropout (``DROPOUT``), per table; the autotuner does
#: not try them there (``_tried``).  Measured with ``mt-kernel-report --arch 90 --dtypes fp16
#: --head-dims 64 --variants rela_enc,rela_causal,reluformer_enc --dropouts 0.1 --tiles all``
#: (results/gpu/kernel_report_sm90_dropout_tiles.md; spill stores, worst variant) after the
#: tensor-core-layout dropout (issue 28): rect_fwd 16x32 w4 s2 16 B (rela_causal); rect_bwd_kv
#: 128x64 w8 s2 84-664 B, 128x128 w8 s2 208-796 B, 64x128 w8 s2 24-68 B, 16x32 w4 s1 4 B
#: (rela_causal); rect_bwd_q 64x128 w8 s2 32-124 B, 128x128 w8 s2 48 B (reluformer_enc); from
#: the earlier measurement, not re-compiled since: rect_bwd_kv 32x128 w4 s3 144-212 B, rect_bwd
#: 64x128 w8 s1 16-96 B.  The first tiles (the main configurations) spill nothing.  The earlier
#: list had only those two: the same tiles spilled with the dropout before the layout change too
#: (c38de16^, rela_enc / reluformer_enc: rect_bwd_kv 128x128 w8 s2 328 / 776 B, rect_bwd_q
#: 128x128 w8 s2 104 / 212 B, reluformer rect_fwd 128x128 w8 s3 64 B and 64x128 w4 s3 68 B, which
#: no longer spill); the layout change moved rect_bwd_q 64x128 w8 s2 from 16 / 80 to 32 / 124 B.
#: Re-measured with ``mt-kernel-report --arch 90 --dtypes fp16 --head-dims 32,64,128 --variants
#: rela_enc,rela_causal,reluformer_enc,eatt_enc,eatt_causal --dropouts 0,0.1 --tiles table``
#: (results/gpu/kernel_report_sm90_excluded_tiles.md, every tile of every table, issue 28): rect_bwd_kv
#: 64x32 w4 s2 spills with dropout at d 32 (rela_enc 44 B, rela_causal 88 B, ReLUFormer 104 B).
_SPILL_WITH_DROPOUT = [
    (_RECT_FWD, {(16, 32, 4, 2)}),
    (_RECT_BWD_KV, {(32, 128, 4, 3), (128, 64, 8, 2), (64, 128, 8, 2), (16, 32, 4, 1), (64, 32, 4, 2)}),
    (_RECT_BWD_Q, {(64, 128, 8, 2), (128, 128, 8, 2)}),
    (_RECT_BWD, {(64, 128, 8, 1)}),
]
# E-ATT's scores live in registers (CUDA cores), the L1 distance in chunks of CHUNK = 2 head
# dimensions (``_l1``; L1_CHUNK in the package).  Measured sm_90a fp16, d 32/64/128, eatt_enc /
# eatt_causal, dropout 0 and 0.1 (issue 28): the first tiles spill nothing (l1_fwd 64x64 w8,
# l1_bwd_kv 32x64 w8, l1_bwd_q 64x64 w8); 32x64 w4 spilled in l1_fwd (164-576 B) and l1_bwd_q
# (108-460 B) at every d and is not in the tables; the spills at d 128 are in _SPILL_AT_D128.
# Since the chunked sign sums (_l1_sgn) l1_bwd_kv 64x64 w8 spills nothing at d 32/64 (sm_90a
# fp16/bf16, eatt_enc/eatt_causal, dropout 0 and 0.1; 200-221 registers) and is its first tile:
# 1102 vs 1381 PTX per score for 32x64 w8 (bf16 d 64 eatt_enc); at d 128 it is not tried
# ``--tiles table`` (results/gpu/kernel_report_sm90_excluded_tiles.md): l1_bwd_kv 32x32 w4 s1 spilled
# 24 B (d 32, eatt_causal, no dropout) and 16x32 w4 s1 8-16 B (d 32 / 64, with and without
# dropout), l1_bwd_q 32x32 w4 s1 4 B (d 64, eatt_causal, no dropout): no longer in the tables;
# l1_fwd 32x32 w4 s1 4 B (d 32, dropout) and 16x32 w4 s1 4 B (d 128, dropout): _SPILL_WITH_DROPOUT
# / _SPILL_AT_D128_WITH_DROPOUT
_L1_FWD = [(64, 64, 8, 2), (64, 32, 4, 2), (32, 32, 4, 1), (16, 32, 4, 1)]
_L1_BWD_KV = [(64, 64, 8, 1), (32, 64, 8, 1), (16, 64, 4, 1)]
_L1_BWD_Q = [(64, 64, 8, 1), (64, 32, 4, 1), (16, 32, 4, 1)]
# the fused backward (l1_bwd: l1_bwd_kv's body with the dQ sums by atomics), sm_90a bf16, d 32/64/128,
# eatt_enc / eatt_causal, dropout 0 and 0.1, every tile: 64x64 w8 spills nothing (202-230 registers)
# and has the fewest SASS per score (d 64: 1081; 32x64 w8 1395, 16x64 w4 2601); 32x32 w4 spilled
# 60 B at d 64 and 16x32 w4 24 B at d 32 with dropout, both at 1.3-2.6x the SASS: not in the table
_L1_BWD = [(64, 64, 8, 1), (32, 64, 8, 1), (16, 64, 4, 1)]
# E-ATT since the chunked sign sums (_l1_sgn): l1_bwd_q 32x32 w4 and 16x32 w4 spill 8 B at d 32 with
# dropout (sm_90a fp16/bf16, eatt_enc / eatt_causal; they did not before; d 64/128: none)
_SPILL_WITH_DROPOUT.append((_L1_BWD_Q, {(16, 32, 4, 1)}))
_SPILL_WITH_DROPOUT.append((_L1_FWD, {(32, 32, 4, 1)}))
#: tiles that spill at head dimension 128 (``BLOCK_D >= 128``), per table; the autotuner does not
#: try them there (``_tried``).  Measured with ``mt-kernel-report --arch 90 --dtypes fp16
#: --head-dims 128 --variants rela_enc,rela_causal,reluformer_enc --tiles all`` (sm_90a, dropout 0
#: and 0.1; bf16 compiles alike), spill stores in bytes, worst variant:
#: rect_fwd 128x64 w4 s3 272, 128x128 w8 132, 64x128 w4 136, 128x32 w4 s4 92 (clean: 128x64 w8,
#: 64x64 w4, 64x32, 32x32, 16x32); rect_bwd_kv every tile with more than 32x32 scores
#: (64x64 w4 s1 212, 32x64 16-104, 64x128 444, 128x64 876, 64x32 60, 32x128 w4 1516, 32x128 w8 140,
#: 128x128 1764; clean: 32x32, 16x32); rect_bwd_q 64x64 w4 44, 64x128 312, 128x64 8, 32x64 28,
#: 32x32 96, 128x32 w4 392, 128x128 428 (clean: 64x32, 16x32, 128x32 w8)
_SPILL_AT_D128 = [
    (_RECT_FWD, {(128, 64, 4, 3), (128, 128, 8, 3), (64, 128, 4, 3), (128, 32, 4, 4)}),
    (_RECT_BWD_KV, {(64, 64, 4, 1), (32, 64, 4, 2), (64, 128, 8, 2), (128, 64, 8, 2), (64, 32, 4, 2),
                    (32, 128, 4, 3), (32, 128, 8, 3)}),
    (_RECT_BWD_Q, {(64, 64, 4, 2), (64, 128, 8, 2), (128, 64, 8, 2), (32, 64, 4, 2), (32, 32, 4, 1),
                   (128, 32, 4, 3), (128, 128, 8, 2)}),
    # rect_bwd (fused): 64x128 w8 s1 28-132 B without dropout (with dropout: _SPILL_WITH_DROPOUT)
    (_RECT_BWD, {(64, 128, 8, 1)}),
    # E-ATT (chunk 2; worst of eatt_enc / eatt_causal): l1_bwd_kv 64x64 w8 248 B, 16x64 w4 320 B,
    # 32x32 w4 20 B; l1_bwd_q 64x32 w4 208 B (l1_fwd: none)
    (_L1_BWD_KV, {(64, 64, 8, 1), (16, 64, 4, 1)}),
    (_L1_BWD_Q, {(64, 32, 4, 1)}),
    # l1_bwd (fused, 16 sign lanes): 16x64 w4 4 B with dropout; 64x64 w8 and 32x64 w8: none
    (_L1_BWD, {(16, 64, 4, 1)}),
]
#: tiles that spill at head dimension 128 only with attention dropout, per table (both
#: conditions; the autotuner does not try them there, ``_tried``).  Measured with ``mt-kernel-report
#: --arch 90 --dtypes fp16,bf16 --head-dims 128 --variants rela_enc,rela_causal,reluformer_enc
#: --dropouts 0.1 --bwd fused --tiles all``, spill stores: rect_bwd 32x128 w8 s2 32 / 48 / 156 B
#: (rela_enc / rela_causal / reluformer_enc), 32x64 w4 s2 132 B (rela_enc); without dropout they
#: spill nothing
_SPILL_AT_D128_WITH_DROPOUT = [
    (_RECT_BWD, {(32, 128, 8, 2), (32, 64, 4, 2)}),
    (_L1_FWD, {(16, 32, 4, 1)}),  # eatt_causal 4 B (--tiles table)
]
_RECT_KEY = ["T_KEY", "S_KEY", "BLOCK_D", "ACT", "MASK_MODE", "CAUSAL", "STATS", "DROPOUT", "PREC"]
_L1_KEY = ["T_KEY", "S_KEY", "BLOCK_D", "MASK_MODE", "CAUSAL", "DROPOUT", "PREC"]


#: the compute capability the spill lists above were measured on (sm_90a, H100/H200); on any other
#: GPU the autotuner tries the whole table and its timing decides (a tile that spills on sm_90a may
#: not elsewhere: on sm_80, d 64, ReLUFormer's dK/dV tile 64x32 w4 s2 with dropout compiles without
#: spills at 1.07x the first tile's PTX per score, where the best tile the sm_90a lists leave is 1.19x;
#: results/gpu/kernel_report_sm80_tiles.md)
SPILL_LISTS_ARCH = 90


def _tried(table, meta, arch=SPILL_LISTS_ARCH):
    """The tiles of ``table`` the autotuner tries for a launch with constexprs ``meta`` on a GPU of
    compute capability ``arch`` (e.g. 90, 80) before the size pruning of :func:`_prune`.  On
    :data:`SPILL_LISTS_ARCH`: none of the table's ``_SPILL_WITH_STATS`` tiles with ``STATS``, none of the
    table's ``_SPILL_WITH_DROPOUT`` tiles with ``DROPOUT``, none of its ``_SPILL_AT_D128`` tiles
    when ``BLOCK_D >= 128``, nor its ``_SPILL_AT_D128_WITH_DROPOUT`` tiles when both hold; never
    empty: the table's last tile stays when all would go.  On any other ``arch``: the whole table."""
    def of(per_table):
        return next((sp for tb, sp in per_table if tb is table), ())

    out = list(table)
    if arch != SPILL_LISTS_ARCH:
        return out
    if meta.get("STATS"):
        out = [t for t in out if tuple(t) not in of(_SPILL_WITH_STATS)]
    if meta.get("DROPOUT"):
        out = [t for t in out if tuple(t) not in of(_SPILL_WITH_DROPOUT)]
    if (meta.get("BLOCK_D") or 0) >= 128:
        out = [t for t in out if tuple(t) not in of(_SPILL_AT_D128)]
        if meta.get("DROPOUT"):
            out = [t for t in out if tuple(t) not in of(_SPILL_AT_D128_WITH_DROPOUT)]
    return out or list(table)[-1:]


@functools.lru_cache(maxsize=None)
def _capability(index):
    """Compute capability of CUDA device ``index`` as one number (9.0 -> 90, 8.0 -> 80)."""
    major, minor = torch.cuda.get_device_capability(index)
    return 10 * major + minor


def _launch_arch(named_args):
    """Compute capability of the GPU a launch runs on (the device of its first CUDA tensor
    argument); :data:`SPILL_LISTS_ARCH` when no argument is a CUDA tensor."""
    for v in named_args.values():
        if isinstance(v, torch.Tensor) and v.is_cuda:
            return _capability(v.device.index if v.device.index is not None else torch.cuda.current_device())
    return SPILL_LISTS_ARCH


def _prune(configs, named_args, table=None, **kwargs):
    """Drop tiles far larger than the problem (decoding: T = 1) and those :func:`_tried` leaves
    out for this launch on its GPU (``table``: the kernel's tile table, bound by :func:`_tuned`, which the
    head-dimension pruning looks up); keeps at least one tried config."""
    t = max(16, named_args.get("T_KEY", kwargs.get("T_KEY", 16)))
    s = max(16, named_args.get("S_KEY", kwargs.get("S_KEY", 16)))
    key = lambda c: (c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"], c.num_warps, c.num_stages)  # noqa: E731
    table = table if table is not None else [key(c) for c in configs]
    tried = set(_tried(table, {k: kwargs.get(k, named_args.get(k)) for k in ("STATS", "DROPOUT", "BLOCK_D")},
                       arch=_launch_arch(named_args)))
    ok = [c for c in configs if key(c) in tried]
    kept = [c for c in ok if c.kwargs["BLOCK_M"] <= 2 * t and c.kwargs["BLOCK_N"] <= 2 * s]
    return kept or ok[-1:] or configs[-1:]


def _quick_bench(kernel_call, quantiles):
    """The autotuner's timing: 5 ms warm-up, 25 ms of repetitions per tile (triton's default is
    25 + 100 ms; training meets every (T, S) bucket and variant once, so tuning cost adds up)."""
    import triton.testing

    return triton.testing.do_bench(kernel_call, warmup=5, rep=25, quantiles=quantiles)


def _tuned(table, key, reset_to_zero=None):
    """``triton.autotune`` over ``table`` (keyed on the power-of-two buckets of T and S and the
    variant) on a GPU; identity under the interpreter (fixed tiles).  ``reset_to_zero``: the
    arguments a kernel accumulates into with atomics (zeroed before each timed run and after
    tuning, so the tuning runs leave no sums behind)."""
    if INTERPRET:
        return lambda fn: fn
    configs = [triton.Config({"BLOCK_M": a, "BLOCK_N": b}, num_warps=w, num_stages=st)
               for a, b, w, st in table]
    return triton.autotune(configs=configs, key=key,
                           prune_configs_by={"early_config_prune": functools.partial(_prune, table=table)},
                           do_bench=_quick_bench, reset_to_zero=reset_to_zero)


# --------------------------------------------------------------------------------------------
# local versions of triton's library functions (see the module docstring)
# --------------------------------------------------------------------------------------------
_rowsum, _rowmax = _common.rowsum, _common.rowmax  # tl.sum / tl.max of a tile along AXIS


@triton.jit
def _philox(seed, c0):
    """Philox-4x32-7 (Salmon et al. 2011; the constants of ``tl.randint4x`` / curand, with
    FlashAttention-2's 7 rounds instead of 10 -- Philox4x32-7 passes TestU01's BigCrush, Salmon
    et al. Table 2) of the counters ``(c0, 0, 0, 0)`` (a uint32 tile) under the key ``seed``:
    four uint32 tiles of independent random bits."""
    seed = seed.to(tl.uint64)
    k0 = (seed & 0xFFFFFFFF).to(tl.uint32)
    k1 = ((seed >> 32) & 0xFFFFFFFF).to(tl.uint32)
    c1 = c0 * 0
    c2 = c1
    c3 = c1
    for _ in tl.static_range(PHILOX_ROUNDS):
        _c0 = c0
        _c2 = c2
        c0 = tl.umulhi(0xCD9E8D57, _c2) ^ c1 ^ k0
        c2 = tl.umulhi(0xD2511F53, _c0) ^ c3 ^ k1
        c1 = tl.mul(0xCD9E8D57, _c2, sanitize_overflow=False)
        c3 = tl.mul(0xD2511F53, _c0, sanitize_overflow=False)
        k0 = tl.add(k0, 0x9E3779B9, sanitize_overflow=False)
        k1 = tl.add(k1, 0xBB67AE85, sanitize_overflow=False)
    return c0, c1, c2, c3


# Attention dropout (issue 28).  The mask is one function of (seed, i, j) -- below -- generated
# three ways, each for the register layout of the kernels that use it, so that no kernel runs
# more than one Philox call per 16 scores or moves more than one byte per score:
#   _keep          per score, in the tensor-core accumulator layout (rect_fwd, rect_bwd_q)
#   _keep_packed   one call per compact tile entry, keys reordered (_key_order: rect_bwd(_kv),
#                  whose scores are transposed, load their key tiles in that order)
#   _keep_compact  _keep_packed put back in natural key order (E-ATT: scores on CUDA cores)
# dropout_keep_mask (the package) writes the mask out with each; tests hold them to a reference.


@triton.jit
def _opaque(x):
    """``x`` (a uint32 tile) unchanged.  Compiled, through an empty ``mov``: LLVM cannot narrow
    the Philox words to the bits each score's byte needs (it re-ran the last rounds' ``mul.lo`` /
    ``xor`` chains once per byte instead of sharing them: +2.3 PTX per score in ``rect_fwd``,
    sm_90a d 64); ptxas drops the ``mov``.  Interpreted (no inline assembly there): ``x`` itself."""
    if COMPILED:
        x = tl.inline_asm_elementwise("mov.b32 $0, $1;", "=r,r", [x], dtype=tl.uint32, is_pure=True, pack=1)
    return x


@triton.jit
def _threshold(dropout_p):
    """``256 p`` as uint32, shape ``[1]``: a score is dropped when its random byte is below it
    (exact: ``p`` is a multiple of 1/256, see ``_dropout_rate``)."""
    return (tl.full([1], 0.0, tl.float32) + dropout_p * 256.0).to(tl.int32).to(tl.uint32)


@triton.jit
def _counter(seed, offs_m, g, c, S):
    """The four Philox words of dropout group ``(i, g, c)`` (query ``offs_m``, 64-key block ``g``,
    column class ``c``; tiles that broadcast): counter ``(i * ceil(S / 64) + g) * 4 + c``, key
    ``seed``.  See :func:`_keep` for which score takes which byte."""
    cnt = (offs_m * ((S + 63) // 64) + g) * 4 + c
    r0, r1, r2, r3 = _philox(seed, cnt.to(tl.uint32))
    return _opaque(r0), _opaque(r1), _opaque(r2), _opaque(r3)


@triton.jit
def _keep(seed, offs_m, n0, S, dropout_p, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """``(BLOCK_M, BLOCK_N)`` bool: score ``(i, j)`` (query ``offs_m[i]``, key ``j = n0 + jj``)
    survives dropout -- *the* definition of the mask.  One Philox-4x32-7 call per 16 scores of
    a row, one byte per score (FlashAttention-2's scheme): key ``j = 64 g + 8 k + 2 c + e``
    (``k < 8``, ``c < 4``, ``e < 2``) draws byte ``2 (k % 2) + e`` of word ``k // 2`` of group
    ``(i, g, c)`` (:func:`_counter`) and is dropped when that byte is ``< 256 p`` (``p`` a
    multiple of 1/256, see ``_dropout_rate``).  A group's keys ``8k + 2c + e`` are the columns
    one thread holds of a row in the ``wgmma`` / ``mma`` accumulator layout, so compiled here,
    per score, each call is shared by the thread's 16 scores and no data moves.  Depends on
    ``(seed, i, j)`` only.  ``n0`` is a multiple of ``BLOCK_N``, which is 16, 32 or a multiple
    of 64."""
    jj = tl.arange(0, BLOCK_N)[None, :]
    offs_m = offs_m[:, None]
    c = (jj % 8) // 2
    if BLOCK_N >= 64:  # n0 % 64 == 0
        r0, r1, r2, r3 = _counter(seed, offs_m, n0 // 64 + jj // 64, c, S)
        k = (jj % 64) // 8
        w = tl.where(k < 4, tl.where(k < 2, r0, r1), tl.where(k < 6, r2, r3))
    elif BLOCK_N == 32:  # words 0, 1 (n0 % 64 = 0) or 2, 3
        r0, r1, r2, r3 = _counter(seed, offs_m, n0 // 64, c, S)
        lo = (n0 % 64) == 0
        w = tl.where(jj < 16, tl.where(lo, r0, r2), tl.where(lo, r1, r3))
    else:  # BLOCK_N == 16: word (n0 % 64) // 16
        r0, r1, r2, r3 = _counter(seed, offs_m, n0 // 64, c, S)
        q = (n0 % 64) // 16
        w = tl.where(q < 2, tl.where(q == 0, r0, r1), tl.where(q == 2, r2, r3))
    byte = (w >> ((((jj // 8) % 2) * 2 + jj % 2) * 8).to(tl.uint32)) & 0xFF
    return byte >= _threshold(dropout_p)


@triton.jit
def _kb(w, b: tl.constexpr, t):
    """Byte ``b`` of the uint32 tile ``w`` is ``>= t``: the score it draws for survives."""
    return (w & (0xFF << (8 * b))) >= (t << (8 * b))  # no shift of w


@triton.jit
def _key_order(BLOCK_N: tl.constexpr):
    """``(BLOCK_N,)`` int32: the key order of :func:`_keep_packed` -- position ``rho`` of a key tile
    holds its key ``64 g + 8 k + 2 c + e`` for ``rho = (g, c, k, e)`` (``g`` the 64-key block,
    ``c < 4``, ``k < min(BLOCK_N, 64) / 8``, ``e < 2``; ``e`` fastest)."""
    KL: tl.constexpr = (BLOCK_N if BLOCK_N < 64 else 64) // 8
    rho = tl.arange(0, BLOCK_N)
    r = rho % (8 * KL)
    return (rho // (8 * KL)) * 64 + ((r % (2 * KL)) // 2) * 8 + (r // (2 * KL)) * 2 + rho % 2


@triton.jit
def _keep_packed(seed, offs_m, n0, S, dropout_p, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """:func:`_keep` with its key columns in :func:`_key_order`: ``(BLOCK_M, BLOCK_N)``, column
    ``rho`` = key ``n0 + _key_order(BLOCK_N)[rho]``.  In that order a group's 16 bytes are
    adjacent: the Philox calls run on a compact ``(BLOCK_M, max(BLOCK_N / 16, 4))`` tile, one per
    call (tiles of 32 or 16 keys use 2 or 1 of each call's 4 words: a call spans 64 keys), and
    joins lay out the words and then their bytes (``tl.join`` appends its axis, so the inner
    joins make the outer axis: ``join(join(a, c), join(b, d))`` is ``a, b, c, d``)."""
    offs_m = offs_m[:, None]
    if BLOCK_N >= 64:
        gc = tl.arange(0, (BLOCK_N // 64) * 4)[None, :]  # (64-key block, column class)
        r0, r1, r2, r3 = _counter(seed, offs_m, n0 // 64 + gc // 4, gc % 4, S)
        w = tl.join(tl.join(r0, r2), tl.join(r1, r3))
    elif BLOCK_N == 32:  # words 0, 1 (n0 % 64 = 0) or 2, 3
        c = tl.arange(0, 4)[None, :]
        r0, r1, r2, r3 = _counter(seed, offs_m, n0 // 64, c, S)
        lo = (n0 % 64) == 0
        w = tl.join(tl.where(lo, r0, r2), tl.where(lo, r1, r3))
    else:  # BLOCK_N == 16: word (n0 % 64) // 16
        c = tl.arange(0, 4)[None, :]
        r0, r1, r2, r3 = _counter(seed, offs_m, n0 // 64, c, S)
        q = (n0 % 64) // 16
        w = tl.where(q < 2, tl.where(q == 0, r0, r1), tl.where(q == 2, r2, r3))
    w = tl.reshape(w, [BLOCK_M, BLOCK_N // 4])
    t = _threshold(dropout_p)
    return tl.reshape(tl.join(tl.join(_kb(w, 0, t), _kb(w, 2, t)), tl.join(_kb(w, 1, t), _kb(w, 3, t))),
                      [BLOCK_M, BLOCK_N])


@triton.jit
def _keep_compact(seed, offs_m, n0, S, dropout_p, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """:func:`_keep` (natural key order) from :func:`_keep_packed`'s compact calls, its columns
    put back in place by a permutation (the bytes move once): for kernels whose scores are in
    neither layout (E-ATT's, on CUDA cores), where per-score generation would repeat each call."""
    G: tl.constexpr = BLOCK_N // 64 if BLOCK_N >= 64 else 1
    KL: tl.constexpr = (BLOCK_N if BLOCK_N < 64 else 64) // 8
    v = tl.reshape(_keep_packed(seed, offs_m, n0, S, dropout_p, BLOCK_M, BLOCK_N), [BLOCK_M, G, 4, KL, 2])
    return tl.reshape(tl.permute(v, (0, 1, 3, 2, 4)), [BLOCK_M, BLOCK_N])


@triton.jit
def keep_mask(OUT, T, S, dropout_p, seed, HOW: tl.constexpr,
              BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """The dropout mask the attention kernels apply, written out: ``OUT (B*H, T, S)`` uint8,
    1 = kept.  One program per ``(b*H + h, query tile, key tile)``; ``HOW`` the generator:
    0 :func:`_keep`, 1 :func:`_keep_packed` (keys in :func:`_key_order`), 2 :func:`_keep_compact`
    -- the same mask, or a kernel's backward would not match its forward."""
    bh = tl.program_id(0)
    offs_m = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
    n0 = tl.program_id(2) * BLOCK_N
    if HOW == 1:
        offs_n = n0 + _key_order(BLOCK_N)
        k = _keep_packed(seed + bh, offs_m, n0, S, dropout_p, BLOCK_M, BLOCK_N)
    elif HOW == 2:
        offs_n = n0 + tl.arange(0, BLOCK_N)
        k = _keep_compact(seed + bh, offs_m, n0, S, dropout_p, BLOCK_M, BLOCK_N)
    else:
        offs_n = n0 + tl.arange(0, BLOCK_N)
        k = _keep(seed + bh, offs_m, n0, S, dropout_p, BLOCK_M, BLOCK_N)
    tl.store(OUT + bh.to(tl.int64) * T * S + offs_m[:, None] * S + offs_n[None, :], k.to(tl.uint8),
             mask=(offs_m[:, None] < T) & (offs_n[None, :] < S))


@triton.jit
def _inv_keep(dropout_p, ACC: tl.constexpr):
    """``1 / (1 - p)`` in the accumulator dtype, shape ``[1]`` (broadcasts)."""
    return 1.0 / (1.0 - (tl.full([1], 0.0, ACC) + dropout_p))


@triton.jit
def _log2e(ACC: tl.constexpr):
    """``log2(e)`` in the accumulator dtype, shape ``[1]`` (a Python float literal would be a
    float32 constant, also in float64 kernels): ``exp(x) = exp2(x log2 e)``.  For row vectors;
    per score the kernels use ``SC[1] = scale log2(e)`` (host-side product in float64)."""
    return tl.full([1], 1.4426950408889634, ACC)


@triton.jit
def _ln2(ACC: tl.constexpr):
    """``ln 2`` in the accumulator dtype, shape ``[1]``: ``log(y) = log2(y) ln 2``."""
    return tl.full([1], 0.6931471805599453, ACC)


@triton.jit
def _log2(x):
    """``log2(x)`` of a positive normal ``x`` (the callers clamp at ``TINY``), per score of the eq. 7
    statistics (``sum s log s`` and its gradient ``log s + 1``).  Compiled float32: PTX
    ``lg2.approx.ftz.f32``, one special-function-unit instruction (absolute error at most 2^-22.6,
    PTX ISA), where ``tl.log`` / ``tl.log2`` compile to libdevice's ``__nv_logf``: about 25
    instructions with 11 FMAs and a branch, per score.  float64 and the interpreter (no inline
    assembly there): ``tl.log2``.  Callers multiply by ``ln 2`` per row, not per score."""
    if COMPILED and x.dtype == tl.float32:
        y = tl.inline_asm_elementwise("lg2.approx.ftz.f32 $0, $1;", "=r,r", [x], dtype=tl.float32,
                                      is_pure=True, pack=1)
    else:
        y = tl.log2(x)
    return y


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
    """0 ReLU, 1 GeLU (erf form, as ``F.gelu``), 2 Leaky ReLU (slope 0.01).  Constants are made
    in x's dtype (a Python float literal would be a float32 constant, also for float64 x)."""
    if ACT == 1:
        y = 0.5 * x * (1.0 + tl.erf(x * tl.full(x.shape, 0.7071067811865476, x.dtype)))
    elif ACT == 2:
        y = tl.where(x > 0, x, x / 100.0)
    else:
        y = tl.maximum(x, 0.0)
    return y

@triton.jit
def _act_grad(x, ACT: tl.constexpr):
    """``act'(x)``; at 0: ReLU 0 (as ``threshold_backward``), Leaky ReLU 0.01 (as torch)."""
    if ACT == 1:
        g = (0.5 * (1.0 + tl.erf(x * tl.full(x.shape, 0.7071067811865476, x.dtype)))
             + x * tl.exp(-0.5 * x * x) * tl.full(x.shape, 0.3989422804014327, x.dtype))
    elif ACT == 2:
        one = tl.full(x.shape, 1.0, x.dtype)
        g = tl.where(x > 0, one, one / 100.0)
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

@triton.jit
def _l1_rows(a0, BLOCK_A: tl.constexpr, T_A: tl.constexpr):
    """Row indices ``a0 + r T_A + t`` of a tile as ``(BLOCK_A // T_A, T_A)``."""
    return a0 + (tl.arange(0, BLOCK_A // T_A)[:, None] * T_A + tl.arange(0, T_A)[None, :])


@triton.jit
def _l1_clamp(rows, LIM, EVEN_D: tl.constexpr):
    """``rows`` clamped to ``LIM - 1`` when ``EVEN_D`` (then :func:`_l1_chunk` loads unmasked):
    a row past the end reads the last row instead.  Safe because such a row's scores never count:
    the forward masks columns ``>= S`` to ``-inf`` and never stores rows ``>= T``, and the sign sums
    get ``dS = 0`` for columns past the end and store no row past it (``_valid`` tests both bounds).
    The kernels call the L1 helpers only for tiles that start inside (``LIM >= 1``)."""
    if EVEN_D:
        rows = tl.minimum(rows, LIM - 1)
    return rows


@triton.jit
def _l1_chunk(base, rows5, LIM, s_t, s_d, dims5, D, ACC: tl.constexpr, EVEN_D: tl.constexpr):
    """``x[row, dim]`` (float ``ACC``) for 5-d index tiles ``rows5``/``dims5``; 0 outside
    ``row < LIM``, ``dim < D``.  ``EVEN_D`` (``D == BLOCK_D``, the usual head dimensions 32/64/128):
    no mask at all -- the caller has clamped ``rows5`` to ``LIM - 1`` (:func:`_l1_clamp`), so every
    load is in bounds; a masked load costs a zeroing ``PRMT`` and a predicate per value."""
    if EVEN_D:
        return tl.load(base + rows5 * s_t + dims5 * s_d).to(ACC)
    return tl.load(base + rows5 * s_t + dims5 * s_d, mask=(rows5 < LIM) & (dims5 < D), other=0.0).to(ACC)


@triton.jit
def _l1(a_base, b_base, a0, b0, A_LIM, B_LIM, s_at, s_ad, s_bt, s_bd, D,
        ACC: tl.constexpr, BLOCK_A: tl.constexpr, BLOCK_B: tl.constexpr, BLOCK_D: tl.constexpr,
        CHUNK: tl.constexpr, EVEN_D: tl.constexpr):
    """``dist_ij = sum_d |a_id - b_jd|`` ``(BLOCK_A, BLOCK_B)`` of rows ``a0 + i < A_LIM`` of ``a``
    and ``b0 + j < B_LIM`` of ``b`` (E-ATT eq. 13 before ``-scale``; ``a, b`` = ``q, k``, or
    ``k, q`` for the transposed tile of ``l1_bwd_kv``).  ``CHUNK`` head dimensions per step,
    ``BLOCK_D // CHUNK`` steps (a loop, not unrolled: unrolled, the compiler kept every query chunk
    in registers across the key loop and spilled; issue 28); dimensions ``>= D`` load as 0 on both
    sides and add nothing.  (Unrolled with the query rows passed through a non-pure ``mov`` inside
    the key loop, so nothing is hoisted, ``l1_fwd`` took 255 instead of 301 SASS per score, sm_90a
    bf16 d 64 64x64 w8, but 247 registers instead of 126: one 8-warp program per SM instead of two.
    Not taken without a GPU to time it.)

    Computed on 5-d tiles ``(CHUNK, R, C, TA, TB)`` (``i = r TA + ta``, ``j = c TB + tb``;
    ``TA = 16``, ``TB = 8``; ``BLOCK_A >= 16`` and ``BLOCK_B >= 8`` multiples of them): triton's
    default layout spreads the threads over ``(TA, TB)`` and keeps the chunk and ``R x C`` scores
    in each thread, so the sum over the chunk needs no shuffle, a thread loads ``R + C`` values per
    dimension for ``R x C`` scores, and nothing ``(A, B, d)``-sized exists.  Returned as
    ``(BLOCK_A, BLOCK_B)`` (a permute and reshape: one layout conversion per tile)."""
    TB: tl.constexpr = 8
    TA: tl.constexpr = 16 if BLOCK_A >= 16 else BLOCK_A
    d5 = tl.arange(0, CHUNK)[:, None, None, None, None]
    ra = _l1_clamp(_l1_rows(a0, BLOCK_A, TA), A_LIM, EVEN_D)[None, :, None, :, None]
    rb = _l1_clamp(_l1_rows(b0, BLOCK_B, TB), B_LIM, EVEN_D)[None, None, :, None, :]
    dist = tl.full([BLOCK_A // TA, BLOCK_B // TB, TA, TB], 0.0, ACC)
    for c0 in range(0, BLOCK_D, CHUNK):
        xa = _l1_chunk(a_base, ra, A_LIM, s_at, s_ad, c0 + d5, D, ACC, EVEN_D)
        xb = _l1_chunk(b_base, rb, B_LIM, s_bt, s_bd, c0 + d5, D, ACC, EVEN_D)
        dist += _rowsum(tl.abs(xa - xb), 0)
    return tl.reshape(tl.permute(dist, (0, 2, 1, 3)), [BLOCK_A, BLOCK_B])


@triton.jit
def _l1_sgn(a_base, b_base, g_base, a0, b0, A_LIM, B_LIM, s_at, s_ad, s_bt, s_bd, D, ds, add, gb_base,
            ACC: tl.constexpr, BLOCK_A: tl.constexpr, BLOCK_B: tl.constexpr, BLOCK_D: tl.constexpr,
            CHUNK: tl.constexpr, TB: tl.constexpr, EVEN_D: tl.constexpr, B_ATOMIC: tl.constexpr):
    """The sign sums of E-ATT's L1 gradient (eq. 13: ``d|a_d - b_d| / d a_d = sgn(a_d - b_d)``,
    ``sgn(0) = 0``): ``g[i, d] = sum_j ds[i, j] sgn(a_id - b_jd)`` for the ``BLOCK_A`` rows
    ``a0 + i < A_LIM`` of ``a`` and ``BLOCK_B`` rows ``b0 + j < B_LIM`` of ``b`` (``ds``:
    ``(BLOCK_A, BLOCK_B)``, 0 outside), every head dimension ``d < BLOCK_D``, added into the
    float ``ACC`` rows ``g_base + (a0 + i) * BLOCK_D + d`` (or stored there when ``add`` is false:
    the first tile of a program's loop).  ``a, b`` = ``q, k`` for dQ (``l1_bwd_q``), ``k, q``
    for dK (``l1_bwd_kv``; ``sgn(k - q) = -sgn(q - k)``).

    ``CHUNK`` head dimensions per step of a loop over ``BLOCK_D`` (as :func:`_l1`), on 4-d tiles
    ``(CHUNK, C, BLOCK_A, TB)`` (``j = c TB + tb``; ``ds`` reshaped once per call): triton's default
    layout puts ``TB`` lanes on ``tb``, the other lanes and the warps on ``i``, and keeps the chunk
    and the ``C`` keys in each thread, so the sum over ``j`` is ``C - 1`` additions in a thread and
    ``log2(TB)`` shuffles, never crosses warps, and a step ends with one ``(CHUNK, BLOCK_A)``
    read-add-write of ``g`` (each element by the one thread that stores it: no race, no atomics,
    deterministic) -- nothing ``(BLOCK_A, BLOCK_D)``-sized is selected per dimension.

    ``B_ATOMIC`` (the fused backward, :data:`l1_bwd`): the same signed terms summed the other way
    too, ``gb[j, d] += sum_i ds[i, j] sgn(a_id - b_jd)`` over this tile's ``a`` rows (a reduction
    across lanes and warps), added into the float ``ACC`` rows ``gb_base + (b0 + j) * BLOCK_D + d``
    of ``b`` with relaxed atomic adds (several programs add into a row: the order varies, not
    bitwise deterministic) -- the dQ sums from the dK program's own sign, so no second kernel
    recomputes the distances, ``P`` and ``dP``.  Without it ``gb_base`` is unused."""
    C: tl.constexpr = BLOCK_B // TB
    d4 = tl.arange(0, CHUNK)[:, None, None, None]
    ra = _l1_clamp(a0 + tl.arange(0, BLOCK_A), A_LIM, EVEN_D)[None, None, :, None]
    rb = _l1_clamp(b0 + tl.arange(0, C)[:, None] * TB + tl.arange(0, TB)[None, :], B_LIM, EVEN_D)[None, :, None, :]
    ds4 = tl.permute(tl.reshape(ds, [BLOCK_A, C, TB]), (1, 0, 2))[None, :, :, :]
    rg = a0 + tl.arange(0, BLOCK_A)[None, :]
    dg = tl.arange(0, CHUNK)[:, None]
    g_ok = rg < A_LIM
    g_add = g_ok & ((rg * 0 + add) != 0)
    if B_ATOMIC:
        rbs = (b0 + tl.arange(0, C)[:, None] * TB + tl.arange(0, TB)[None, :])[None, :, :]  # unclamped
        d3 = tl.arange(0, CHUNK)[:, None, None]
        gb_ok = (rbs < B_LIM) & (d3 < BLOCK_D)
    for c0 in range(0, BLOCK_D, CHUNK):
        xa = _l1_chunk(a_base, ra, A_LIM, s_at, s_ad, c0 + d4, D, ACC, EVEN_D)
        xb = _l1_chunk(b_base, rb, B_LIM, s_bt, s_bd, c0 + d4, D, ACC, EVEN_D)
        diff = xa - xb
        # sgn as (diff > 0) - (diff < 0) in float (FSET: 1.0 / 0.0) times dS: 2 compares, a subtraction and a
        # multiply-add into the sum per score and dimension, where two nested selects took 2 compares
        # and 2 selects before the addition (sm_90a bf16 d 64: l1_bwd_q 789 -> 757 SASS per score)
        t = ds4 * ((diff > 0).to(ACC) - (diff < 0).to(ACC))
        g = _rowsum(_rowsum(t, 1), 2)  # (CHUNK, BLOCK_A)
        ptr = g_base + rg * BLOCK_D + (c0 + dg)
        g += tl.load(ptr, mask=g_add, other=0.0)
        tl.store(ptr, g, mask=g_ok)
        if B_ATOMIC:
            gb = _rowsum(t, 2)  # (CHUNK, C, TB): b row c TB + tb
            tl.atomic_add(gb_base + rbs * BLOCK_D + (c0 + d3), gb, mask=gb_ok, sem="relaxed")


# --------------------------------------------------------------------------------------------
# rectified attention
# --------------------------------------------------------------------------------------------
@_tuned(_RECT_FWD, _RECT_KEY)
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
    num_m = (T + BLOCK_M - 1) // BLOCK_M
    pid_m = pid % num_m
    if CAUSAL:  # longest query tiles (most key tiles) first: a shorter tail
        pid_m = num_m - 1 - pid_m
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
        r = tl.full([BLOCK_M], 0.0, ACC) + r_const
    acc = tl.full([BLOCK_M, BLOCK_D], 0.0, ACC)
    rsum = tl.full([BLOCK_M], 0.0, ACC)
    rlog = tl.full([BLOCK_M], 0.0, ACC)
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
        x = _dot(q, kt, tl.full([BLOCK_M, BLOCK_N], 0.0, ACC), PREC, UPCAST).to(ACC) * r[:, None]
        ok = _valid(offs_m, offs_n, T, S, m_base, s_mt, s_ms, MASK_MODE, CAUSAL)
        s = tl.where(ok, _act(x, ACT), 0.0)
        if STATS:
            rsum += _rowsum(s, 1)
            rlog += _rowsum(s * _log2(tl.maximum(s, TINY)), 1)  # times ln 2 at the store
        if DROPOUT:  # 1 / (1 - p) applied to acc after the loop
            if PREC == "ieee":  # IEEE float32/64 products run on CUDA cores: not the mma layout
                s = tl.where(_keep_compact(seed + bh, offs_m, n0, S, dropout_p, BLOCK_M, BLOCK_N), s, 0.0)
            else:
                s = tl.where(_keep(seed + bh, offs_m, n0, S, dropout_p, BLOCK_M, BLOCK_N), s, 0.0)
        acc = _dot(s.to(v.dtype), v, acc, PREC, UPCAST)
    if DROPOUT:
        acc = acc * _inv_keep(dropout_p, ACC)
    tl.store(O + b * s_ob + h * s_oh + offs_m[:, None] * s_ot + offs_d[None, :] * s_od,
             acc.to(O.dtype.element_ty), mask=row_ok[:, None] & d_ok[None, :])
    if STATS:
        tl.store(RS + bh * T + offs_m, rsum.to(RS.dtype.element_ty), mask=row_ok)
        tl.store(RL + bh * T + offs_m, (rlog * _ln2(ACC)).to(RL.dtype.element_ty), mask=row_ok)

@triton.jit
def _rect_bwd(Q, K, V, R, M, DO, GS, GL, DQ, DK, DV,
              s_qb, s_qh, s_qt, s_qd, s_kb, s_kh, s_ks, s_kd, s_vb, s_vh, s_vs, s_vd,
              s_rb, s_rh, s_rt, s_mb, s_mh, s_mt, s_ms, s_ob, s_oh, s_ot, s_od,
              s_dqb, s_dqh, s_dqt, s_dqd, s_dkb, s_dkh, s_dks, s_dkd, s_dvb, s_dvh, s_dvs, s_dvd,
              H, T, S, D, r_const, dropout_p, seed, T_KEY, S_KEY,
              HAS_R: tl.constexpr, MASK_MODE: tl.constexpr, CAUSAL: tl.constexpr, ACT: tl.constexpr,
              STATS: tl.constexpr, DROPOUT: tl.constexpr, ACC: tl.constexpr, PREC: tl.constexpr, UPCAST: tl.constexpr,
              DQ_ATOMIC: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """The body of both key-tile backwards (:data:`rect_bwd`, :data:`rect_bwd_kv`).  One program:
    ``dK, dV`` of ``BLOCK_N`` keys of one ``(b, h)`` in registers, looping over query tiles
    (causal: skipping those before the key tile's first viewer) with four GEMMs per tile --
    ``x^T = k (r q)^T``, ``dP^T = v dO^T``, ``dV += drop(s)^T dO``, ``dK += (r dX)^T Q`` -- the
    masks, the dropout mask (``_keep``) and, with ``STATS``, the gradients ``GS, GL`` ``(B*H, T)``
    of the eq. 7 row sums (``d/ds_ij = g_sum_i + g_slogs_i (log s_ij + 1)``).

    ``DQ_ATOMIC`` (FlashAttention-2's fused backward, Dao 2023, Alg. 2): a fifth GEMM,
    ``dQ_tile^T = K^T (r dX)^T`` (transposed: the ``d`` rows fill the 64-row wgmma when
    ``BLOCK_M`` is 32), added into ``DQ`` (``(B, H, T, d)`` in the accumulator dtype, zeroed by
    the caller) with relaxed atomic adds (summation order over the key tiles varies run to run:
    not bitwise deterministic).  Without it ``DQ`` and its strides are unused and
    :func:`rect_bwd_q` computes ``dQ`` (seven GEMMs in all: ``x`` and ``dP`` twice, no atomics)."""
    pid = tl.program_id(0)
    num_n = (S + BLOCK_N - 1) // BLOCK_N
    pid_n = pid % num_n  # CAUSAL: the earliest key tiles (most query tiles) already start first
    bh = pid // num_n
    b = (bh // H).to(tl.int64)
    h = (bh % H).to(tl.int64)
    if DROPOUT:  # the tile's keys in _keep_packed's order: its mask needs no reordering
        offs_n = pid_n * BLOCK_N + _key_order(BLOCK_N)
    else:
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    col_ok = offs_n < S
    d_ok = offs_d < D
    kv_mask = col_ok[:, None] & d_ok[None, :]
    k = tl.load(K + b * s_kb + h * s_kh + offs_n[:, None] * s_ks + offs_d[None, :] * s_kd,
                mask=kv_mask, other=0.0)
    v = tl.load(V + b * s_vb + h * s_vh + offs_n[:, None] * s_vs + offs_d[None, :] * s_vd,
                mask=kv_mask, other=0.0)
    dk = tl.full([BLOCK_N, BLOCK_D], 0.0, ACC)
    dv = tl.full([BLOCK_N, BLOCK_D], 0.0, ACC)
    q_base = Q + b * s_qb + h * s_qh
    do_base = DO + b * s_ob + h * s_oh
    if DQ_ATOMIC:
        dq_base = DQ + b * s_dqb + h * s_dqh
    m_base = M + b * s_mb + h * s_mh
    # dropout's 1 / (1 - p): without STATS hoisted out of the score tiles -- dP^T = keep dO V^T / (1 - p)
    # enters dK (and dQ) only through (r dX)^T, so it rides on the per-query r (one multiply per
    # score less; with STATS it fuses into the eq. 7 terms' FMA instead)
    inv_keep = _inv_keep(dropout_p, ACC)
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
            r = tl.full([BLOCK_M], 0.0, ACC) + r_const
        rd = r
        if DROPOUT:
            if not STATS:  # r / (1 - p): scales dX (see inv_keep)
                rd = r * inv_keep
        xt = _dot(k, qt, tl.full([BLOCK_N, BLOCK_M], 0.0, ACC), PREC, UPCAST).to(ACC) * r[None, :]  # GEMM 1
        ok = _valid_t(offs_n, offs_m, T, S, m_base, s_mt, s_ms, MASK_MODE, CAUSAL)
        st = tl.where(ok, _act(xt, ACT), 0.0)
        dpt = _dot(v, tl.trans(do), tl.full([BLOCK_N, BLOCK_M], 0.0, ACC), PREC, UPCAST).to(ACC)  # GEMM 2
        if DROPOUT:  # 1 / (1 - p): dV's after the loop, dX's in rd (STATS: here)
            keep = tl.trans(_keep_packed(seed + bh, offs_m, pid_n * BLOCK_N, S, dropout_p, BLOCK_M, BLOCK_N))
            pt = tl.where(keep, st, 0.0)
            if STATS:
                dpt = tl.where(keep, dpt * inv_keep, 0.0)
            else:
                dpt = tl.where(keep, dpt, 0.0)
        else:
            pt = st
        dv = _dot(pt.to(do.dtype), do, dv, PREC, UPCAST)  # GEMM 3
        if STATS:
            gs = tl.load(GS + bh * T + offs_m, mask=row_ok, other=0.0).to(ACC)
            gl = tl.load(GL + bh * T + offs_m, mask=row_ok, other=0.0).to(ACC)
            # g_sum + g_slogs (log s + 1) = (g_sum + g_slogs) + (g_slogs ln 2) log2 s: per row, then one FMA
            dpt += (gs + gl)[None, :] + (gl * _ln2(ACC))[None, :] * _log2(tl.maximum(st, TINY))
        dxt = (tl.where(ok, dpt * _act_grad(xt, ACT), 0.0) * rd[None, :]).to(k.dtype)  # (r dX)^T
        dk = _dot(dxt, tl.trans(qt), dk, PREC, UPCAST)  # GEMM 4
        if DQ_ATOMIC:
            dqt = _dot(tl.trans(k), dxt, tl.full([BLOCK_D, BLOCK_M], 0.0, ACC), PREC, UPCAST)  # GEMM 5
            tl.atomic_add(dq_base + offs_m[None, :] * s_dqt + offs_d[:, None] * s_dqd, dqt.to(DQ.dtype.element_ty),
                          mask=row_ok[None, :] & d_ok[:, None], sem="relaxed")
    if DROPOUT:
        dv = dv * inv_keep
    tl.store(DK + b * s_dkb + h * s_dkh + offs_n[:, None] * s_dks + offs_d[None, :] * s_dkd,
             dk.to(DK.dtype.element_ty), mask=kv_mask)
    tl.store(DV + b * s_dvb + h * s_dvh + offs_n[:, None] * s_dvs + offs_d[None, :] * s_dvd,
             dv.to(DV.dtype.element_ty), mask=kv_mask)


#: the fused backward: :func:`_rect_bwd` launched with ``DQ_ATOMIC=True`` (5 GEMMs per score tile,
#: ``DQ`` zeroed before each autotuning run); the same JITFunction as :data:`rect_bwd_kv` under
#: its own autotuner (tiles, cache)
rect_bwd = _tuned(_RECT_BWD, _RECT_KEY, reset_to_zero=["DQ"])(_rect_bwd)
#: the split path's ``dK, dV``: :func:`_rect_bwd` launched with ``DQ_ATOMIC=False`` (4 GEMMs;
#: ``DQ`` unused), paired with :func:`rect_bwd_q`
rect_bwd_kv = _tuned(_RECT_BWD_KV, _RECT_KEY)(_rect_bwd)

@_tuned(_RECT_BWD_Q, _RECT_KEY)
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
    num_m = (T + BLOCK_M - 1) // BLOCK_M
    pid_m = pid % num_m
    if CAUSAL:  # longest query tiles (most key tiles) first: a shorter tail
        pid_m = num_m - 1 - pid_m
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
        r = tl.full([BLOCK_M], 0.0, ACC) + r_const
    # dropout's 1 / (1 - p): without STATS applied to dQ after the loop (as in _rect_bwd)
    inv_keep = _inv_keep(dropout_p, ACC)
    if STATS:
        gs = tl.load(GS + bh * T + offs_m, mask=row_ok, other=0.0).to(ACC)
        gl = tl.load(GL + bh * T + offs_m, mask=row_ok, other=0.0).to(ACC)
        g0 = gs + gl  # g_sum + g_slogs (log s + 1) = g0 + g2 log2 s (see _rect_bwd)
        g2 = gl * _ln2(ACC)
    dq = tl.full([BLOCK_M, BLOCK_D], 0.0, ACC)
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
        x = _dot(q, kt, tl.full([BLOCK_M, BLOCK_N], 0.0, ACC), PREC, UPCAST).to(ACC) * r[:, None]
        ok = _valid(offs_m, offs_n, T, S, m_base, s_mt, s_ms, MASK_MODE, CAUSAL)
        dp = _dot(do, vt, tl.full([BLOCK_M, BLOCK_N], 0.0, ACC), PREC, UPCAST).to(ACC)
        if DROPOUT:
            if PREC == "ieee":  # CUDA-core products (see rect_fwd)
                keep = _keep_compact(seed + bh, offs_m, n0, S, dropout_p, BLOCK_M, BLOCK_N)
            else:
                keep = _keep(seed + bh, offs_m, n0, S, dropout_p, BLOCK_M, BLOCK_N)
            if STATS:
                dp = tl.where(keep, dp * inv_keep, 0.0)
            else:
                dp = tl.where(keep, dp, 0.0)
        if STATS:
            s = tl.where(ok, _act(x, ACT), 0.0)
            dp += g0[:, None] + g2[:, None] * _log2(tl.maximum(s, TINY))
        dx = tl.where(ok, dp * _act_grad(x, ACT), 0.0)
        dq = _dot(dx.to(kt.dtype), tl.trans(kt), dq, PREC, UPCAST)
    if DROPOUT:
        if not STATS:
            r = r * inv_keep
    dq = dq * r[:, None]
    tl.store(DQ + b * s_dqb + h * s_dqh + offs_m[:, None] * s_dqt + offs_d[None, :] * s_dqd,
             dq.to(DQ.dtype.element_ty), mask=q_mask)

# --------------------------------------------------------------------------------------------
# E-ATT: L1 scores + online softmax
# --------------------------------------------------------------------------------------------
@_tuned(_L1_FWD, _L1_KEY)
@triton.jit
def l1_fwd(Q, K, V, M, O, LSE,
           s_qb, s_qh, s_qt, s_qd, s_kb, s_kh, s_ks, s_kd, s_vb, s_vh, s_vs, s_vd,
           s_mb, s_mh, s_mt, s_ms, s_ob, s_oh, s_ot, s_od,
           H, T, S, D, SC, dropout_p, seed, T_KEY, S_KEY,
           MASK_MODE: tl.constexpr, CAUSAL: tl.constexpr, DROPOUT: tl.constexpr,
           ACC: tl.constexpr, PREC: tl.constexpr, UPCAST: tl.constexpr,
           BLOCK_D: tl.constexpr, CHUNK: tl.constexpr, EVEN_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """One program: ``BLOCK_M`` queries of one ``(b, h)``; online softmax over key tiles.
    Writes ``O`` and the row log-sum-exp ``LSE`` ``(B*H, T)`` (natural log; 0 on fully masked
    rows).  The loop works in base 2: ``x`` is the score times ``log2 e`` (folded into the scale),
    ``m`` its running max, ``p = exp2(x - m)`` (``tl.exp`` would multiply by ``log2 e`` per score)."""
    pid = tl.program_id(0)
    num_m = (T + BLOCK_M - 1) // BLOCK_M
    pid_m = pid % num_m
    if CAUSAL:  # longest query tiles (most key tiles) first: a shorter tail
        pid_m = num_m - 1 - pid_m
    bh = pid // num_m
    b = (bh // H).to(tl.int64)
    h = (bh % H).to(tl.int64)
    scale2 = tl.load(SC + 1).to(ACC)  # scale * log2(e): scores in base 2 (SC: see _l1_scale)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    row_ok = offs_m < T
    d_ok = offs_d < D
    q_base = Q + b * s_qb + h * s_qh
    k_base = K + b * s_kb + h * s_kh
    v_base = V + b * s_vb + h * s_vh
    m_base = M + b * s_mb + h * s_mh
    m_i = tl.full([BLOCK_M], float("-inf"), ACC)
    l_i = tl.full([BLOCK_M], 0.0, ACC)
    acc = tl.full([BLOCK_M, BLOCK_D], 0.0, ACC)
    hi = S
    if CAUSAL:
        hi = tl.minimum(S, (pid_m + 1) * BLOCK_M + S - T)
    for n0 in range(0, hi, BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        col_ok = offs_n < S
        x = -scale2 * _l1(q_base, k_base, pid_m * BLOCK_M, n0, T, S, s_qt, s_qd, s_ks, s_kd, D,
                          ACC, BLOCK_M, BLOCK_N, BLOCK_D, CHUNK, EVEN_D)
        ok = _valid(offs_m, offs_n, T, S, m_base, s_mt, s_ms, MASK_MODE, CAUSAL)
        x = tl.where(ok, x, float("-inf"))
        m_new = tl.maximum(m_i, _rowmax(x, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # fully masked so far: no NaN
        p = tl.exp2(x - m_safe[:, None])
        alpha = tl.exp2(m_i - m_safe)
        l_i = l_i * alpha + _rowsum(p, 1)
        if DROPOUT:  # 1 / (1 - p) applied to acc after the loop
            p = tl.where(_keep_compact(seed + bh, offs_m, n0, S, dropout_p, BLOCK_M, BLOCK_N), p, 0.0)
        v = tl.load(v_base + offs_n[:, None] * s_vs + offs_d[None, :] * s_vd,
                    mask=col_ok[:, None] & d_ok[None, :], other=0.0)
        acc = acc * alpha[:, None]
        acc = _dot(p.to(v.dtype), v, acc, PREC, UPCAST)
        m_i = m_new
    live = l_i > 0
    if DROPOUT:
        acc = acc * _inv_keep(dropout_p, ACC)
    out = acc / tl.where(live, l_i, 1.0)[:, None]
    lse = tl.where(live, m_i * _ln2(ACC) + tl.log(tl.where(live, l_i, 1.0)), 0.0)  # natural log
    tl.store(O + b * s_ob + h * s_oh + offs_m[:, None] * s_ot + offs_d[None, :] * s_od,
             out.to(O.dtype.element_ty), mask=row_ok[:, None] & d_ok[None, :])
    tl.store(LSE + bh * T + offs_m, lse.to(LSE.dtype.element_ty), mask=row_ok)

@triton.jit
def _l1_bwd_kv(Q, K, V, M, DO, LSE, DELTA, G, DK, DV, DQA,
               s_qb, s_qh, s_qt, s_qd, s_kb, s_kh, s_ks, s_kd, s_vb, s_vh, s_vs, s_vd,
               s_mb, s_mh, s_mt, s_ms, s_ob, s_oh, s_ot, s_od,
               s_dkb, s_dkh, s_dks, s_dkd, s_dvb, s_dvh, s_dvs, s_dvd,
               H, T, S, D, SC, dropout_p, seed, T_KEY, S_KEY,
               MASK_MODE: tl.constexpr, CAUSAL: tl.constexpr, DROPOUT: tl.constexpr,
               ACC: tl.constexpr, PREC: tl.constexpr, UPCAST: tl.constexpr, DQ_ATOMIC: tl.constexpr,
               BLOCK_D: tl.constexpr, CHUNK: tl.constexpr, EVEN_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """The body of both E-ATT key-tile backwards (:data:`l1_bwd`, :data:`l1_bwd_kv`).  One program:
    ``dK, dV`` of ``BLOCK_N`` keys; loops over query tiles.  With ``dS = P (dP - delta)``
    (``delta_i = dO_i . O_i``): ``dV = P_drop^T dO`` and ``dk_jd = scale * sum_i dS_ij sign(q_id - k_jd)``.

    ``DQ_ATOMIC``: the same tile's signed terms also give ``dQ``'s sums
    ``sum_j dS_ij sgn(k_jd - q_id)`` (:func:`_l1_sgn`'s ``B_ATOMIC``), added into ``DQA``
    (``(B*H, T, BLOCK_D)`` float ``ACC``, zeroed by the caller; ``dq = scale * DQA``) with relaxed
    atomic adds: one kernel for the whole backward, the L1 distance, ``P`` and ``dP`` computed once
    per score instead of twice.  Without it ``DQA`` is unused and :func:`l1_bwd_q` computes ``dQ``."""
    pid = tl.program_id(0)
    num_n = (S + BLOCK_N - 1) // BLOCK_N
    pid_n = pid % num_n  # CAUSAL: the earliest key tiles (most query tiles) already start first
    bh = pid // num_n
    b = (bh // H).to(tl.int64)
    h = (bh % H).to(tl.int64)
    scale = tl.load(SC).to(ACC)  # (a tensor: a float argument would be float32)
    scale2 = tl.load(SC + 1).to(ACC)  # scale * log2(e): P = exp2(-scale2 dist - lse log2 e)
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
    g_base = G + bh.to(tl.int64) * S * BLOCK_D  # this (b, h)'s sign sums, (S, BLOCK_D) float ACC
    dqa_base = G  # unused without DQ_ATOMIC
    if DQ_ATOMIC:
        dqa_base = DQA + bh.to(tl.int64) * T * BLOCK_D  # this (b, h)'s dQ sums, (T, BLOCK_D) float ACC
    dv = tl.full([BLOCK_N, BLOCK_D], 0.0, ACC)
    inv_keep = _inv_keep(dropout_p, ACC)  # dropout's rescaling (used if DROPOUT)
    lo = 0
    if CAUSAL:
        lo = (tl.maximum(0, pid_n * BLOCK_N - (S - T)) // BLOCK_M) * BLOCK_M
    for m0 in range(lo, T, BLOCK_M):
        offs_m = m0 + tl.arange(0, BLOCK_M)
        row_ok = offs_m < T
        # transposed tile (keys x queries): P^T = exp(x^T - lse)
        dist = _l1(k_base, q_base, pid_n * BLOCK_N, m0, S, T, s_ks, s_kd, s_qt, s_qd, D,
                   ACC, BLOCK_N, BLOCK_M, BLOCK_D, CHUNK, EVEN_D)
        ok = _valid_t(offs_n, offs_m, T, S, m_base, s_mt, s_ms, MASK_MODE, CAUSAL)
        lse2 = tl.load(LSE + bh * T + offs_m, mask=row_ok, other=0.0).to(ACC) * _log2e(ACC)
        delta = tl.load(DELTA + bh * T + offs_m, mask=row_ok, other=0.0).to(ACC)
        pt = tl.where(ok, tl.exp2(-scale2 * dist - lse2[None, :]), 0.0)
        do = tl.load(do_base + offs_m[:, None] * s_ot + offs_d[None, :] * s_od,
                     mask=row_ok[:, None] & d_ok[None, :], other=0.0)
        dpt = _dot(v, tl.trans(do), tl.full([BLOCK_N, BLOCK_M], 0.0, ACC), PREC, UPCAST).to(ACC)
        if DROPOUT:  # dV's 1 / (1 - p) after the loop
            keep = tl.trans(_keep_compact(seed + bh, offs_m, pid_n * BLOCK_N, S, dropout_p, BLOCK_M, BLOCK_N))
            dv = _dot(tl.where(keep, pt, 0.0).to(do.dtype), do, dv, PREC, UPCAST)
            dpt = tl.where(keep, dpt * inv_keep, 0.0)
        else:
            dv = _dot(pt.to(do.dtype), do, dv, PREC, UPCAST)
        dst = pt * (dpt - delta[None, :])
        # g[j, d] += sum_i dS_ij sgn(k_jd - q_id)  (dk = -scale g)
        if DQ_ATOMIC:  # and dQ's sums over this tile's keys
            _l1_sgn(k_base, q_base, g_base, pid_n * BLOCK_N, m0, S, T, s_ks, s_kd, s_qt, s_qd, D, dst, m0 != lo,
                    dqa_base, ACC, BLOCK_N, BLOCK_M, BLOCK_D, CHUNK, SGN_LANES_FUSED, EVEN_D, True)
        else:
            _l1_sgn(k_base, q_base, g_base, pid_n * BLOCK_N, m0, S, T, s_ks, s_kd, s_qt, s_qd, D, dst, m0 != lo,
                    dqa_base, ACC, BLOCK_N, BLOCK_M, BLOCK_D, CHUNK, SGN_LANES, EVEN_D, False)
    tl.debug_barrier()  # g written by the sign sums' layout, read back in the tile's
    dk = tl.load(g_base + offs_n[:, None] * BLOCK_D + offs_d[None, :], mask=(col_ok & (offs_n * 0 + lo < T))[:, None],
                 other=0.0) * (-scale)
    if DROPOUT:
        dv = dv * inv_keep
    tl.store(DK + b * s_dkb + h * s_dkh + offs_n[:, None] * s_dks + offs_d[None, :] * s_dkd,
             dk.to(DK.dtype.element_ty), mask=kv_mask)
    tl.store(DV + b * s_dvb + h * s_dvh + offs_n[:, None] * s_dvs + offs_d[None, :] * s_dvd,
             dv.to(DV.dtype.element_ty), mask=kv_mask)


#: E-ATT's fused backward: :func:`_l1_bwd_kv` launched with ``DQ_ATOMIC=True`` (``DQA`` zeroed
#: before each autotuning run); the same JITFunction as :data:`l1_bwd_kv` under its own autotuner
l1_bwd = _tuned(_L1_BWD, _L1_KEY, reset_to_zero=["DQA"])(_l1_bwd_kv)
#: the split path's ``dK, dV``: :func:`_l1_bwd_kv` with ``DQ_ATOMIC=False``, paired with :func:`l1_bwd_q`
l1_bwd_kv = _tuned(_L1_BWD_KV, _L1_KEY)(_l1_bwd_kv)

@_tuned(_L1_BWD_Q, _L1_KEY)
@triton.jit
def l1_bwd_q(Q, K, V, M, DO, LSE, DELTA, G, DQ,
             s_qb, s_qh, s_qt, s_qd, s_kb, s_kh, s_ks, s_kd, s_vb, s_vh, s_vs, s_vd,
             s_mb, s_mh, s_mt, s_ms, s_ob, s_oh, s_ot, s_od, s_dqb, s_dqh, s_dqt, s_dqd,
             H, T, S, D, SC, dropout_p, seed, T_KEY, S_KEY,
             MASK_MODE: tl.constexpr, CAUSAL: tl.constexpr, DROPOUT: tl.constexpr,
             ACC: tl.constexpr, PREC: tl.constexpr, UPCAST: tl.constexpr,
             BLOCK_D: tl.constexpr, CHUNK: tl.constexpr, EVEN_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """One program: ``dQ`` of ``BLOCK_M`` queries; ``dq_id = -scale sum_j dS_ij sign(q_id - k_jd)``."""
    pid = tl.program_id(0)
    num_m = (T + BLOCK_M - 1) // BLOCK_M
    pid_m = pid % num_m
    if CAUSAL:  # longest query tiles (most key tiles) first: a shorter tail
        pid_m = num_m - 1 - pid_m
    bh = pid // num_m
    b = (bh // H).to(tl.int64)
    h = (bh % H).to(tl.int64)
    scale = tl.load(SC).to(ACC)  # (a tensor: a float argument would be float32)
    scale2 = tl.load(SC + 1).to(ACC)  # scale * log2(e): P = exp2(-scale2 dist - lse log2 e)
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
    lse2 = tl.load(LSE + bh * T + offs_m, mask=row_ok, other=0.0).to(ACC) * _log2e(ACC)
    delta = tl.load(DELTA + bh * T + offs_m, mask=row_ok, other=0.0).to(ACC)
    g_base = G + bh.to(tl.int64) * T * BLOCK_D  # this (b, h)'s sign sums, (T, BLOCK_D) float ACC
    inv_keep = _inv_keep(dropout_p, ACC)  # dropout's rescaling (used if DROPOUT)
    hi = S
    if CAUSAL:
        hi = tl.minimum(S, (pid_m + 1) * BLOCK_M + S - T)
    for n0 in range(0, hi, BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        col_ok = offs_n < S
        dist = _l1(q_base, k_base, pid_m * BLOCK_M, n0, T, S, s_qt, s_qd, s_ks, s_kd, D,
                   ACC, BLOCK_M, BLOCK_N, BLOCK_D, CHUNK, EVEN_D)
        ok = _valid(offs_m, offs_n, T, S, m_base, s_mt, s_ms, MASK_MODE, CAUSAL)
        p = tl.where(ok, tl.exp2(-scale2 * dist - lse2[:, None]), 0.0)
        vt = tl.load(v_base + offs_n[None, :] * s_vs + offs_d[:, None] * s_vd,
                     mask=col_ok[None, :] & d_ok[:, None], other=0.0)
        dp = _dot(do, vt, tl.full([BLOCK_M, BLOCK_N], 0.0, ACC), PREC, UPCAST).to(ACC)
        if DROPOUT:
            keep = _keep_compact(seed + bh, offs_m, n0, S, dropout_p, BLOCK_M, BLOCK_N)
            dp = tl.where(keep, dp * inv_keep, 0.0)
        ds = p * (dp - delta[:, None])
        # g[i, d] += sum_j dS_ij sgn(q_id - k_jd)  (dq = -scale g)
        _l1_sgn(q_base, k_base, g_base, pid_m * BLOCK_M, n0, T, S, s_qt, s_qd, s_ks, s_kd, D, ds, n0 != 0,
                g_base, ACC, BLOCK_M, BLOCK_N, BLOCK_D, CHUNK, SGN_LANES, EVEN_D, False)
    tl.debug_barrier()  # g written by the sign sums' layout, read back in the tile's
    dq = tl.load(g_base + offs_m[:, None] * BLOCK_D + offs_d[None, :], mask=(row_ok & (offs_m * 0 < hi))[:, None],
                 other=0.0) * (-scale)
    tl.store(DQ + b * s_dqb + h * s_dqh + offs_m[:, None] * s_dqt + offs_d[None, :] * s_dqd,
             dq.to(DQ.dtype.element_ty), mask=q_mask)
