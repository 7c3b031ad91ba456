"""Fused Triton kernels for the rectified attentions and E-ATT's L1 softmax attention.

Shape legend: B batch (of keys), H heads, T queries, S keys, d head dimension (d_h).  Masks are
bool, broadcastable to ``(B, H, T, S)``, ``True`` = blocked.

Two entry points, each a drop-in for the PyTorch path (same contract, same zeros):

* :func:`relu_attention` -- ``s_ij = act(r_i q_i . k_j)`` (0 where blocked),
  ``out_i = sum_j dropout(s_ij) v_j``; with ``need_stats`` also ReLUFormer's eq. 7 row terms
  ``sum_j s_ij`` and ``sum_j s_ij log s_ij``.  ``act`` is ReLU (ReLA eq. 3; ReLUFormer eq. 6 with
  ``r_i = 1 / (gamma sqrt(n_i / 2))``), GeLU or Leaky ReLU (ReLA Table 1 rows 9-10).  Same
  signature as :func:`fairseq_plugins.attention.kernels.relu_attention`.
* :func:`l1_softmax_attention` -- E-ATT (eq. 13): ``x_ij = -scale ||q_i - k_j||_1``,
  ``out = dropout(softmax(x)) V``.

ReLA's fused (gated) RMSNorm of the concatenated heads (eqs. 4-5), kernel family ``"norm"``, lives
in :mod:`fairseq_plugins.attention.triton.norm` (kernels in ``_norm_kernels.py``, loaded the same way);
ReLUFormer's eq. 7 row terms, kernel family ``"stats"``, in :mod:`fairseq_plugins.attention.triton.stats`
(``_stats_kernels.py``).

Algorithm (FlashAttention-2 style, Dao 2023), per program one tile of ``BLOCK_M`` queries of one
``(b, h)``; ``BLOCK_N`` keys per step; nothing of size ``T x S`` is ever stored::

    forward (rectified)                      forward (L1 softmax)
    acc = 0                                  m = -inf, l = 0, acc = 0
    for each key tile j:                     for each key tile j:
      x   = r * (Q_i K_j^T)     [tl.dot]       x = -scale * sum_d |Q_id - K_jd|   [registers]
      s   = act(x) * valid                     m' = max(m, rowmax x); p = exp(x - m')
      rows += sum s, sum s log s  (stats)      l = l e^(m-m') + rowsum p
      acc += drop(s) V_j        [tl.dot]       acc = acc e^(m-m') + drop(p) V_j   [tl.dot]
    O_i = acc                                O_i = acc / l;  LSE_i = m + log l
                                             (in base 2: x log2 e, exp2; LSE natural log)

A rectified attention has no normaliser, hence no running max, no rescaling and no second
statistic to carry: the loop is two GEMMs and one elementwise pass (the reason it can beat fused
softmax; FlashSigmoid reports +17 % forward over FlashAttention-2 on H100).  E-ATT's scores
cost ``3 d`` additions per pair on the CUDA cores (that is the paper's mechanism: no
multiplication in ``f(Q, K)``); only ``p V`` runs on tensor cores.

Backward recomputes the score tiles (memory ``O(T)``: only ``Q, K, V, O`` and, for E-ATT, the
row log-sum-exp ``(B, H, T)`` are kept)::

    rectified: dS = drop(dO V^T) + g_sum + g_slogs (log s + 1);  dX = dS act'(x) valid
               dV = drop(s)^T dO;  dK = (r dX)^T Q;  dQ = r (dX K)
    L1:        dP = drop(dO V^T);  dS = P (dP - delta),  delta_i = dO_i . O_i
               dV = drop(P)^T dO;  dk_jd = scale sum_i dS_ij sgn(q_id - k_jd);
               dq_id = -scale sum_j dS_ij sgn(q_id - k_jd)   (sgn(0) = 0, as torch.cdist)

The rectified backward has two paths (:func:`set_rect_backward`, ``MT_RECT_BACKWARD``):

* ``fused`` (the default unless ``torch.use_deterministic_algorithms(True)``): FlashAttention-2's
  one kernel ``rect_bwd``, one program per key tile holding ``dK, dV`` in registers, looping over
  the query tiles with five GEMMs per tile pair (``x``, ``dP``, ``dV``, ``dK``, ``dQ``) and adding
  each ``dQ`` tile into a float32 (float64) ``(B, H, T, d)`` buffer with relaxed atomic adds
  (``red.global.add``), cast to the input dtype after the kernel.  The order of the atomic sums
  varies from run to run: ``dQ`` is reproducible to rounding, not bitwise.
* ``split``: two kernels without atomics, bitwise deterministic: ``rect_bwd_kv`` (one program per
  key tile accumulates ``dK, dV`` over query tiles) and ``rect_bwd_q`` (one per query tile
  accumulates ``dQ`` over key tiles): seven GEMMs per tile pair (``x`` and ``dP`` in both).

``rect_bwd`` and ``rect_bwd_kv`` are one kernel body (``_kernels._rect_bwd``) under two autotuners
(own tile tables); the constexpr ``DQ_ATOMIC`` adds the fifth GEMM and the atomic ``dQ``.

E-ATT's backward has the same two paths (:func:`set_l1_backward`, ``MT_L1_BACKWARD``; default
``split``, the path the GPU windows measured, until ``fused`` is timed): ``split`` is ``l1_bwd_kv``
+ ``l1_bwd_q`` without atomics (deterministic), each recomputing the L1 distance, ``P`` and ``dP``;
``fused`` is one kernel ``l1_bwd`` (``l1_bwd_kv``'s body with ``DQ_ATOMIC``) that sums each
tile's signed terms over queries (dK) and over keys (dQ, atomic adds into a float32 (float64)
``(B*H, T, BLOCK_D)`` buffer): 0.63-0.73x the split pair's SASS per score at sm_90a (d 128 - 32;
``results/gpu/kernel_report_eatt.md``).
The sign sums ``sum dS sgn(q - k)`` run ``CHUNK`` head dimensions per step on register tiles and
are added, step by step, into a float32 (float64) scratch buffer ``(B*H, max(T, S), BLOCK_D)``
that each program owns rows of (``_kernels._l1_sgn``), read back once at the program's end.

Masks reach the kernels as bytes with their broadcast strides: a key-padding mask
``(B|1, 1, 1, S)`` is read as one row per tile (mask mode 1), a general mask ``(B|1, 1, T, S)``
tile by tile (mode 2) -- any mask the PyTorch path accepts, no fallback.  ``causal=True``
additionally blocks keys ``j > i + (S - T)`` and skips the key tiles after a query tile's last
query (and query tiles before a key tile's first viewer); within each ``(b, h)`` the programs
start longest first (query tiles from the last one, key tiles from the first one: a shorter
tail, as FlashAttention schedules causal tiles).  The attention module passes the
decoder's future mask this way (``causal=True`` with the key padding, mode 1), not as a general
mask (:mod:`fairseq_plugins.attention.masks`).  Fully masked rows give exact zeros (output, statistics,
gradients), as do rows without a positive score (null attention).  Attention dropout draws
one Philox-4x32-7 call (7 rounds, as FlashAttention-2; key ``seed + b*H + h``) per 16 scores of a
row, one byte per score, and drops score ``(i, j)`` when its byte is below ``256 p``
(FlashAttention-2's scheme; ``p`` is rounded to a multiple of 1/256, see ``_dropout_rate``).  The
16 keys of a call are ``j = 64 g + 8 k + 2 c + e`` for fixed ``(i, g, c)`` -- the columns one thread
holds of a row in the tensor-core accumulator layout, so the forward and ``dQ`` kernels share
each call among a thread's scores with no data movement; the backward kernels that hold the
scores transposed load their key tiles in an order where a call's bytes are adjacent
(``_keep_packed``), E-ATT's permute them once (``_kernels.py``: ``_keep``;
:func:`dropout_keep_mask` writes the mask out).  The backward regenerates the forward's mask
without storing it; ``seed`` comes from torch's default generator (``torch.manual_seed`` makes a
call reproducible).  Requires ``T * S < 2**31``.

Precision: tiles are loaded in the input dtype (bf16/fp16/fp32/fp64); scores, statistics and
accumulators are float32 (float64 for float64 inputs); ``s``/``p`` are rounded to the input
dtype before the ``@ V`` product (as FlashAttention does).  float32 inputs use IEEE products
unless ``torch.backends.cuda.matmul.allow_tf32`` is set (then TF32, like torch's matmul).

Compiled vs interpreted: on CUDA tensors the kernels are compiled and autotuned (tile sizes
keyed on the power-of-two buckets of T and S, so variable sentence lengths do not re-tune per
batch).  On CPU tensors they run under Triton's interpreter, which needs ``TRITON_INTERPRET=1``
in the environment (slow; that is how CI tests them without a GPU) -- otherwise a
``RuntimeError`` names the variable.  Triton reads that variable when a ``@triton.jit``
function is *defined*, so the kernel file ``_kernels.py`` (and ``_jit_common.py``, the helpers
the kernel files share) is executed lazily, once per mode, as its own module object: both modes can live in one process (CPU interpreter tests and CUDA tests
in one pytest run; the kernels call no ``@jit`` function of triton's own library, which exists in
one mode only), and importing this package never imports triton.
"""

import importlib.util
import math
import os
import sys
import threading
from typing import Optional

import torch

__all__ = ["relu_attention", "l1_softmax_attention", "triton_available", "interpret_requested",
           "self_test", "first_mismatch", "compile_offline", "set_rect_backward", "rect_backward", "set_l1_backward",
           "l1_backward", "ACTIVATIONS",
           "MAX_HEAD_DIM", "FAMILIES", "RECT_BACKWARDS", "dropout_keep_mask", "KEEP_GENERATORS"]

#: activations of :func:`relu_attention` -> kernel code (0 ReLU, 1 GeLU, 2 Leaky ReLU 0.01)
ACTIVATIONS = {"relu": 0, "gelu": 1, "leaky_relu": 2}
#: largest head dimension d the kernels take (one ``(BLOCK, d)`` tile lives in registers)
MAX_HEAD_DIM = 256

_MODULES = {}
_LOCK = threading.RLock()  # reentrant: a kernel file loads _jit_common.py while it is loaded
_AVAILABLE: Optional[bool] = None


def triton_available() -> bool:
    """True when the ``triton`` package imports (``pip install -e .[gpu]``)."""
    global _AVAILABLE
    if _AVAILABLE is None:
        try:
            import triton  # noqa: F401
            import triton.language  # noqa: F401

            _AVAILABLE = True
        except Exception:  # ImportError, or a broken install
            _AVAILABLE = False
    return _AVAILABLE


def interpret_requested() -> bool:
    """True when ``TRITON_INTERPRET`` is set to a true value (``1``, ``true``, ``on``, ``yes``)."""
    return os.environ.get("TRITON_INTERPRET", "0").strip().lower() in ("1", "true", "on", "yes")


def kernel_mode() -> bool:
    """The mode triton runs ``@triton.jit`` functions in as they are defined: True = interpreter
    (read by the kernel files while :func:`load_kernel_module` executes them; it sets
    ``TRITON_INTERPRET`` for that)."""
    import triton

    try:  # triton >= 3.4
        return bool(triton.knobs.runtime.interpret)
    except AttributeError:  # pragma: no cover - older triton reads the variable directly
        return os.environ.get("TRITON_INTERPRET", "0") == "1"


def load_kernel_module(filename: str, interpret: bool):
    """The kernel file ``filename`` of this package executed in ``interpret`` mode, as its own
    module object (cached per file and mode; see the module docstring for why kernels are
    executed lazily).

    Raises:
        RuntimeError: triton forces the other mode (``triton.knobs.runtime.interpret``).
    """
    key = (filename, interpret)
    mod = _MODULES.get(key)
    if mod is not None:
        return mod
    with _LOCK:
        mod = _MODULES.get(key)
        if mod is not None:
            return mod
        path = os.path.join(os.path.dirname(os.path.abspath(__file__)), filename)
        modname = f"{__name__}.{filename[:-3]}_{'interpreted' if interpret else 'compiled'}"
        spec = importlib.util.spec_from_file_location(modname, path)
        mod = importlib.util.module_from_spec(spec)
        old = os.environ.get("TRITON_INTERPRET")
        os.environ["TRITON_INTERPRET"] = "1" if interpret else "0"
        try:
            sys.modules[modname] = mod
            spec.loader.exec_module(mod)
        except BaseException:
            sys.modules.pop(modname, None)
            raise
        finally:
            if old is None:
                os.environ.pop("TRITON_INTERPRET", None)
            else:
                os.environ["TRITON_INTERPRET"] = old
        if mod.INTERPRET != interpret:
            sys.modules.pop(modname, None)
            raise RuntimeError(f"could not build the {'interpreted' if interpret else 'compiled'} "
                               f"Triton kernels of {filename}: triton.knobs.runtime.interpret is forced to "
                               f"{mod.INTERPRET}")
        _MODULES[key] = mod
        return mod


def _kernels(interpret: bool):
    """The attention kernel module ``_kernels.py`` executed in ``interpret`` mode (cached per mode)."""
    return load_kernel_module("_kernels.py", interpret)


def _mode(x: torch.Tensor) -> bool:
    """``True`` = run under the interpreter, ``False`` = compiled; raises when neither is possible.

    Raises:
        RuntimeError: triton is not installed; or ``x`` is not a CUDA tensor and
            ``TRITON_INTERPRET=1`` is not set.
    """
    if not triton_available():
        raise RuntimeError("the Triton attention backend needs the 'triton' package "
                           "(pip install -e .[gpu]); or use --attention-backend torch")
    if interpret_requested():
        return True
    if x.device.type == "cuda":
        return False
    raise RuntimeError(f"the Triton attention backend runs compiled kernels on CUDA tensors only; "
                       f"got a {x.device.type} tensor.  Set TRITON_INTERPRET=1 to run Triton's "
                       f"interpreter on {x.device.type} (slow: for tests), or use "
                       f"--attention-backend torch")


def _dtypes(dtype: torch.dtype, interpret: bool):
    """``(ACC, PREC)`` constexprs: accumulator dtype and ``tl.dot`` input precision."""
    import triton.language as tl

    if dtype == torch.float64:
        return tl.float64, "ieee"
    if dtype == torch.float32:
        tf32 = (not interpret) and torch.backends.cuda.matmul.allow_tf32
        return tl.float32, ("tf32" if tf32 else "ieee")
    return tl.float32, "tf32"  # bf16 / fp16 operands: the precision flag does not apply


def _upcast(dtype: torch.dtype, interpret: bool) -> bool:
    """Triton's interpreter computes ``tl.dot`` of bfloat16 tiles wrongly (numpy has no bfloat16):
    there the kernels convert the operands to float32 first (the rounding of ``s``/``p`` to
    bfloat16 before ``@ V`` is kept).  Compiled kernels use bfloat16 tensor-core products."""
    return bool(interpret and dtype == torch.bfloat16)


def _acc_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def _check_common(q, k, v, dropout_p):
    """Shape/dtype/device checks shared by both entry points (after kernels._check)."""
    if q.dtype not in (torch.float16, torch.bfloat16, torch.float32, torch.float64):
        raise ValueError(f"the Triton kernels take float16, bfloat16, float32 or float64, got {q.dtype}")
    if not (q.device == k.device == v.device):
        raise ValueError(f"q, k, v must be on one device, got {q.device}, {k.device}, {v.device}")
    if q.shape[-1] > MAX_HEAD_DIM:
        raise ValueError(f"the Triton kernels take head dimensions d <= {MAX_HEAD_DIM}, got "
                         f"{q.shape[-1]}; use --attention-backend torch")
    if q.shape[2] * k.shape[2] >= 2**31:
        raise ValueError(f"T * S must be < 2**31 (dropout offsets), got T {q.shape[2]}, S {k.shape[2]}")


def _mask_args(mask, x, B, H, T, S):
    """``(tensor, (s_b, s_h, s_t, s_s), MASK_MODE)`` for a bool mask or None (mode 0)."""
    if mask is None:
        return x, (0, 0, 0, 0), 0
    while mask.dim() < 4:
        mask = mask.unsqueeze(0)
    m = mask.to(x.device).view(torch.uint8).expand(B, H, T, S)
    mode = 1 if (m.stride(2) == 0 or T == 1) else 2
    return m, tuple(m.stride()), mode


def _strides(x):
    return tuple(x.stride())


# host-side arithmetic in plain Python: triton >= 3.5 makes ``triton.cdiv`` / ``next_power_of_2``
# constexpr functions whose Python call unwraps its arguments (µs per call, several per layer call)
def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _pow2(n: int) -> int:
    """The smallest power of two >= ``n`` (1 for ``n <= 1``), as ``triton.next_power_of_2``."""
    return 1 << max(int(n) - 1, 0).bit_length()


def _grid(n_rows: int, BH: int, interpret: bool, blocks, axis: str):
    if interpret:
        return (_cdiv(n_rows, blocks[axis]) * BH,)
    return lambda meta: (_cdiv(n_rows, meta[axis]) * BH,)


def _block_d(d: int) -> int:
    return max(16, _pow2(d))


def _keys(T: int, S: int):
    return _pow2(max(T, 1)), _pow2(max(S, 1))


def _scalar(value: float, like: torch.Tensor) -> torch.Tensor:
    """A one-element tensor in the accumulator dtype (Triton passes Python floats as float32)."""
    return torch.full((1,), float(value), dtype=_acc_dtype(like.dtype), device=like.device)


def _l1_scale(scale: float, like: torch.Tensor) -> torch.Tensor:
    """The L1 kernels' ``SC``: ``[scale, scale * log2(e)]`` in the accumulator dtype (the kernels
    exponentiate with ``exp2``: ``exp(-scale d) = exp2(-scale log2(e) d)``; products in float64 here)."""
    # two fills, not torch.tensor([...], device=cuda): that copies from the host and synchronises
    # the stream, in every E-ATT layer call
    out = torch.full((2,), float(scale), dtype=_acc_dtype(like.dtype), device=like.device)
    out[1:].fill_(float(scale) * math.log2(math.e))
    return out


def _dropout_rate(dropout_p: float) -> float:
    """The dropout rate the kernels apply: ``dropout_p`` rounded to a multiple of 1/256 (at most
    255/256; 0 below 1/512).  The kernels draw one random byte per score (one Philox call per 16
    scores, as FlashAttention-2) and drop it when the byte is ``< 256 p``; survivors are scaled
    by ``1 / (1 - p)`` with this ``p``, so the dropout is unbiased."""
    return min(round(float(dropout_p) * 256), 255) / 256.0


def _seed(dropout_p: float) -> int:
    # < 2**30: seed + b*H + h stays inside int32 in the kernels
    return int(torch.randint(0, 2**30, (1,)).item()) if dropout_p > 0 else 0


#: the dropout-mask generators of the kernels (:func:`dropout_keep_mask`)
KEEP_GENERATORS = ("mma", "packed", "compact")


def dropout_keep_mask(BH: int, T: int, S: int, dropout_p: float, seed: int, device="cpu",
                      blocks=(16, 16), how: str = "mma") -> torch.Tensor:
    """The attention-dropout mask the fused kernels apply for ``seed``, as a ``(BH, T, S)`` bool
    tensor (True = kept; ``BH`` = batch x heads).  It depends on ``(seed, b*H + h, i, j)`` and
    ``dropout_p`` only -- not on the tiles, their orientation or the kernel (forward, backward):
    ``blocks = (BLOCK_M, BLOCK_N)`` (``BLOCK_N`` 16, 32 or a multiple of 64) and ``how`` select
    how it is generated, for tests of exactly that: one of :data:`KEEP_GENERATORS` (``mma``:
    per score, for the tensor-core accumulator layout; ``packed``: one Philox call per compact
    tile entry, keys reordered, as the transposed backward kernels load them; ``compact``: the
    same put back in key order, as E-ATT's kernels use it).  ``dropout_p`` is applied as
    :func:`_dropout_rate` rounds it.  Compiled on CUDA, interpreted elsewhere (``TRITON_INTERPRET=1``).

    Raises:
        ValueError: ``dropout_p`` outside ``[0, 1)``, ``T * S >= 2**31``, ``seed`` outside
            ``[0, 2**30)``, ``blocks`` not one of the shapes above or ``how`` not one of
            :data:`KEEP_GENERATORS`.
        RuntimeError: as :func:`relu_attention` (no triton; not CUDA and no ``TRITON_INTERPRET=1``).
    """
    if not 0.0 <= float(dropout_p) < 1.0:
        raise ValueError(f"dropout_p must be in [0, 1), got {dropout_p}")
    if T * S >= 2**31:
        raise ValueError(f"T * S must be < 2**31 (dropout offsets), got T {T}, S {S}")
    if not 0 <= int(seed) < 2**30:
        raise ValueError(f"seed must be in [0, 2**30), got {seed}")
    bm, bn = (int(b) for b in blocks)
    if bm < 16 or bm & (bm - 1) or not (bn in (16, 32) or (bn >= 64 and bn & (bn - 1) == 0)):
        raise ValueError(f"blocks must be (BLOCK_M, BLOCK_N) with BLOCK_M a power of two >= 16 and "
                         f"BLOCK_N 16, 32 or a power of two >= 64, got {blocks}")
    if how not in KEEP_GENERATORS:
        raise ValueError(f"how must be one of {', '.join(KEEP_GENERATORS)}, got {how!r}")
    out = torch.zeros(BH, T, S, dtype=torch.uint8, device=device)
    interpret = _mode(out)
    grid = (BH, -(-T // bm), -(-S // bn))
    _kernels(interpret).keep_mask[grid](out, T, S, _dropout_rate(dropout_p), int(seed), HOW=KEEP_GENERATORS.index(how),
                                        BLOCK_M=bm, BLOCK_N=bn)
    return out.bool()


# --------------------------------------------------------------------------------------------
# rectified attention
# --------------------------------------------------------------------------------------------
def _rect_meta(mod, q, interpret, act, mask_mode, causal, stats, dropout, has_r):
    acc, prec = _dtypes(q.dtype, interpret)
    meta = dict(HAS_R=has_r, MASK_MODE=mask_mode, CAUSAL=bool(causal), ACT=act, STATS=bool(stats),
                DROPOUT=bool(dropout), ACC=acc, PREC=prec, UPCAST=_upcast(q.dtype, interpret),
                BLOCK_D=_block_d(q.shape[-1]))
    if interpret:
        meta.update(mod.INTERPRET_BLOCKS)
    return meta


def _rect_inputs(q, k, v, r_t, mask):
    B, H, T, d = q.shape
    S = k.shape[2]
    if r_t is None:
        r_arg, r_str = q, (0, 0, 0)
    else:
        r_arg = r_t.expand(B, H, T, 1)
        r_str = tuple(r_arg.stride()[:3])
    m_arg, m_str, mode = _mask_args(mask, q, B, H, T, S)
    return (B, H, T, S, d), r_arg, r_str, m_arg, m_str, mode


#: backward paths of :func:`relu_attention` (see :func:`set_rect_backward`)
RECT_BACKWARDS = ("auto", "fused", "split")
_RECT_BACKWARD: Optional[str] = None


def set_rect_backward(mode: Optional[str]) -> None:
    """Choose the backward of :func:`relu_attention` for the calls that follow.

    * ``"fused"``: one kernel (``rect_bwd``), FlashAttention-2's five GEMMs per score tile
      (``x = r Q K^T``, ``dP = dO V^T``, ``dV += drop(s)^T dO``, ``dK += (r dX)^T Q``,
      ``dQ += r dX K``): one program per key tile loops over the query tiles and adds its
      ``dQ`` tile into a float32 (float64) buffer with atomic adds.  The order of those sums varies
      from run to run, so ``dQ`` is not bitwise reproducible (last bits).
    * ``"split"``: two kernels without atomics (``rect_bwd_kv``: ``dK, dV`` per key tile;
      ``rect_bwd_q``: ``dQ`` per query tile), seven GEMMs (``x`` and ``dP`` computed in both):
      bitwise deterministic.
    * ``"auto"`` (the default): ``"split"`` when ``torch.are_deterministic_algorithms_enabled()``
      (``torch.use_deterministic_algorithms(True)``), else ``"fused"``.
    * ``None``: the environment variable ``MT_RECT_BACKWARD`` (one of the above), else ``"auto"``.

    The choice is read at each forward call (:func:`rect_backward`) and kept for its backward.

    Raises:
        ValueError: ``mode`` not in :data:`RECT_BACKWARDS` (nor None).
    """
    global _RECT_BACKWARD
    _RECT_BACKWARD = _checked_mode(mode, "rectified")


def _checked_mode(mode: Optional[str], family: str) -> Optional[str]:
    """``mode`` if it is None or one of :data:`RECT_BACKWARDS`; raises ValueError naming them."""
    if mode is not None and mode not in RECT_BACKWARDS:
        raise ValueError(f"unknown {family} backward {mode!r}; valid choices: {', '.join(RECT_BACKWARDS)}")
    return mode


def _backward_mode(setting: Optional[str], env: str, auto: str) -> str:
    """``setting``, else ``$env``, else ``"auto"``; ``"auto"`` resolved to ``"split"`` under
    deterministic algorithms, else to ``auto``.

    Raises:
        ValueError: ``$env`` names no mode of :data:`RECT_BACKWARDS`.
    """
    mode = setting
    if mode is None:
        mode = os.environ.get(env, "auto").strip().lower() or "auto"
        if mode not in RECT_BACKWARDS:
            raise ValueError(f"{env}={mode!r}: valid choices: {', '.join(RECT_BACKWARDS)}")
    if mode == "auto":
        return "split" if torch.are_deterministic_algorithms_enabled() else auto
    return mode


def rect_backward() -> str:
    """The backward path the next :func:`relu_attention` call takes: ``"fused"`` or ``"split"``
    (the setting of :func:`set_rect_backward`, else ``$MT_RECT_BACKWARD``, else ``"auto"``, resolved).

    Raises:
        ValueError: ``MT_RECT_BACKWARD`` names no mode of :data:`RECT_BACKWARDS`.
    """
    return _backward_mode(_RECT_BACKWARD, "MT_RECT_BACKWARD", "fused")


_L1_BACKWARD: Optional[str] = None


def set_l1_backward(mode: Optional[str]) -> None:
    """Choose the backward of :func:`l1_softmax_attention` (E-ATT) for the calls that follow.

    * ``"fused"``: one kernel (``l1_bwd``): one program per key tile computes the L1 distance,
      ``P``, ``dP`` and the signed terms ``dS_ij sgn(q_id - k_jd)`` once and sums them both ways,
      over queries into ``dK`` (in the program) and over keys into a float32 (float64) ``dQ``
      buffer with atomic adds: not bitwise reproducible (last bits of ``dQ``).  0.63-0.73x the
      split pair's SASS per score at sm_90a (``results/gpu/kernel_report_eatt.md``); not yet timed
      on a GPU.
    * ``"split"``: ``l1_bwd_kv`` + ``l1_bwd_q``, each recomputing the distances, ``P`` and ``dP``;
      no atomics, bitwise deterministic.
    * ``"auto"`` (the default): ``"split"`` -- the path the GPU windows have measured -- until the
      fused kernel has been timed against it (issue 28, docs/gpu.md).
    * ``None``: the environment variable ``MT_L1_BACKWARD`` (one of the above), else ``"auto"``.

    The choice is read at each forward call (:func:`l1_backward`) and kept for its backward.

    Raises:
        ValueError: ``mode`` not in :data:`RECT_BACKWARDS` (nor None).
    """
    global _L1_BACKWARD
    _L1_BACKWARD = _checked_mode(mode, "E-ATT")


def l1_backward() -> str:
    """The backward path the next :func:`l1_softmax_attention` call takes: ``"fused"`` or
    ``"split"`` (the setting of :func:`set_l1_backward`, else ``$MT_L1_BACKWARD``, else ``"auto"``).

    Raises:
        ValueError: ``MT_L1_BACKWARD`` names no mode of :data:`RECT_BACKWARDS`.
    """
    return _backward_mode(_L1_BACKWARD, "MT_L1_BACKWARD", "split")


class _RectifiedAttention(torch.autograd.Function):
    """Autograd function of :func:`relu_attention`; saves ``q, k, v, r, mask`` and the seed;
    the backward takes the path :func:`rect_backward` names at the forward."""

    @staticmethod
    def forward(ctx, q, k, v, r_t, mask, r_c, dropout_p, need_stats, causal, act, seed, interpret):
        ctx.set_materialize_grads(False)
        mod = _kernels(interpret)
        (B, H, T, S, d), r_arg, r_str, m_arg, m_str, mode = _rect_inputs(q, k, v, r_t, mask)
        out = torch.empty_like(q)
        acc_dt = _acc_dtype(q.dtype)
        # the statistics: every row is stored by the program of its query tile (no fill needed)
        rs = q.new_empty((B, H, T) if need_stats else (1,), dtype=acc_dt)
        rl = q.new_empty((B, H, T), dtype=acc_dt) if need_stats else rs
        meta = _rect_meta(mod, q, interpret, act, mode, causal, need_stats, dropout_p > 0, r_t is not None)
        if B * H * T > 0:
            grid = _grid(T, B * H, interpret, meta, "BLOCK_M")
            mod.rect_fwd[grid](q, k, v, r_arg, m_arg, out, rs, rl, *_strides(q), *_strides(k),
                               *_strides(v), *r_str, *m_str, *_strides(out),
                               H, T, S, d, float(r_c), float(dropout_p), seed, *_keys(T, S), **meta)
        ctx.save_for_backward(q, k, v, r_t, mask)
        ctx.cfg = (r_c, dropout_p, causal, act, seed, interpret)
        ctx.bwd = rect_backward()  # chosen at the forward: one call, one backward path
        if need_stats:
            return out, rs, rl
        return out

    @staticmethod
    def backward(ctx, g_out, g_sum=None, g_slogs=None):
        q, k, v, r_t, mask = ctx.saved_tensors
        r_c, dropout_p, causal, act, seed, interpret = ctx.cfg
        mod = _kernels(interpret)
        (B, H, T, S, d), r_arg, r_str, m_arg, m_str, mode = _rect_inputs(q, k, v, r_t, mask)
        acc_dt = _acc_dtype(q.dtype)
        stats = g_sum is not None or g_slogs is not None
        if g_out is None:
            g_out = torch.zeros_like(q)
        if stats:
            g_sum = (q.new_zeros((B, H, T), dtype=acc_dt) if g_sum is None
                     else g_sum.to(acc_dt).expand(B, H, T).contiguous())
            g_slogs = (q.new_zeros((B, H, T), dtype=acc_dt) if g_slogs is None
                       else g_slogs.to(acc_dt).expand(B, H, T).contiguous())
        else:
            g_sum = g_slogs = q.new_empty(1, dtype=acc_dt)
        dk, dv = torch.empty_like(k), torch.empty_like(v)
        meta = _rect_meta(mod, q, interpret, act, mode, causal, stats, dropout_p > 0, r_t is not None)
        common = (*_strides(q), *_strides(k), *_strides(v), *r_str, *m_str, *_strides(g_out))
        tail = (H, T, S, d, float(r_c), float(dropout_p), seed, *_keys(T, S))
        fused = ctx.bwd == "fused"  # one kernel, 5 GEMMs; dQ summed by atomic adds in acc_dt
        dq = torch.zeros_like(q, dtype=acc_dt) if fused else torch.empty_like(q)
        if B * H * S > 0:
            if T == 0:
                dk.zero_(), dv.zero_()
            else:  # the same kernel body; split: DQ unused, dQ by rect_bwd_q below
                grid = _grid(S, B * H, interpret, meta, "BLOCK_N")
                kernel = mod.rect_bwd if fused else mod.rect_bwd_kv
                kernel[grid](q, k, v, r_arg, m_arg, g_out, g_sum, g_slogs, dq, dk, dv, *common, *_strides(dq),
                             *_strides(dk), *_strides(dv), *tail, DQ_ATOMIC=fused, **meta)
        if not fused and B * H * T > 0:
            grid = _grid(T, B * H, interpret, meta, "BLOCK_M")
            mod.rect_bwd_q[grid](q, k, v, r_arg, m_arg, g_out, g_sum, g_slogs, dq, *common,
                                 *_strides(dq), *tail, **meta)
        return dq.to(q.dtype), dk, dv, None, None, None, None, None, None, None, None, None


def relu_attention(q, k, v, row_scale, mask=None, dropout_p=0.0, need_stats=False, chunk_size=None,
                   causal=False, activation="relu"):
    """Fused rectified attention: ReLA eq. 3's core, ReLUFormer eq. 6 and eq. 7's row terms.

    ``s_ij = act(r_i q_i . k_j)`` (0 where blocked), ``out_i = sum_j dropout(s_ij) v_j``.
    Same contract as :func:`fairseq_plugins.attention.kernels.relu_attention`.  The backward takes
    the path :func:`rect_backward` names at this call (``fused``: one 5-GEMM kernel, dQ summed by
    atomic adds, reproducible to rounding; ``split``: two deterministic kernels, 7 GEMMs).

    Args:
        q: ``(B, H, T, d)`` queries (any scale, e.g. ``d^-1/2``, may be folded into ``row_scale``).
        k, v: ``(B, H, S, d)``; q, k, v of one
            dtype (float16, bfloat16, float32, float64), any strides, ``d <= 256``.
        row_scale: ``r_i``: a float or a constant tensor ``(B|1, H|1, T, 1)`` (non-finite -> 0).
        mask: bool, broadcastable to ``(B, H, T, S)``, True = blocked, or None.
        dropout_p: attention dropout on ``s`` after the statistics, in ``[0, 1)``; applied as the
            nearest multiple of 1/256 (``_dropout_rate``: one random byte per score), survivors
            scaled by ``1 / (1 - that rate)``.
        need_stats: also return ``(row_sum, row_slogs)``, ``(B, H, T)`` float32 (float64 for
            float64 inputs), ``sum_j s_ij`` and ``sum_j s_ij log s_ij``, differentiable.
        chunk_size: ignored (tiles are autotuned); accepted for interchangeability.
        causal: additionally block keys ``j > i + (S - T)`` (tiles after the diagonal are skipped).
        activation: ``"relu"`` (default), ``"gelu"`` or ``"leaky_relu"`` (ReLA Table 1 rows 9-10).

    Returns:
        ``out`` ``(B, H, T, d)`` in q's dtype and memory layout, or ``(out, (row_sum, row_slogs))``.
        Fully masked rows and null rows are exact zeros in outputs, statistics and gradients.

    Raises:
        ValueError: the checks of the PyTorch path (shapes, dtypes, mask, dropout_p, row_scale);
            an unknown ``activation``; ``need_stats`` with an activation other than ReLU (the
            terms need ``s >= 0``); ``d > 256``; ``T * S >= 2**31``; ``MT_RECT_BACKWARD`` naming
            no backward path.
        RuntimeError: triton missing, or a non-CUDA tensor without ``TRITON_INTERPRET=1``.
    """
    from ..kernels import _check

    _check(q, k, v, row_scale, mask, dropout_p, clean=False)
    _check_common(q, k, v, dropout_p)
    if activation not in ACTIVATIONS:
        raise ValueError(f"unknown activation {activation!r}; valid choices: {', '.join(ACTIVATIONS)}")
    if need_stats and activation != "relu":
        raise ValueError(f"need_stats needs non-negative weights: activation 'relu', got {activation!r}")
    if chunk_size is not None and (isinstance(chunk_size, bool) or not isinstance(chunk_size, int)
                                   or chunk_size <= 0):
        raise ValueError(f"chunk_size must be a positive int or None, got {chunk_size!r}")
    interpret = _mode(q)
    if torch.is_tensor(row_scale):
        r_t = torch.nan_to_num(row_scale.detach().to(device=q.device, dtype=_acc_dtype(q.dtype)),
                               nan=0.0, posinf=0.0, neginf=0.0)
        r_c = 1.0
    else:
        r_t, r_c = None, (float(row_scale) if math.isfinite(float(row_scale)) else 0.0)
        if q.dtype == torch.float64 and r_c != 1.0:  # float arguments reach the kernel as float32
            r_t, r_c = torch.full((1, 1, 1, 1), r_c, dtype=torch.float64, device=q.device), 1.0
    if mask is not None:
        mask = mask.to(q.device)
    res = _RectifiedAttention.apply(q, k, v, r_t, mask, r_c, _dropout_rate(dropout_p), bool(need_stats),
                                    bool(causal), ACTIVATIONS[activation], _seed(dropout_p), interpret)
    if need_stats:
        out, rs, rl = res
        return out, (rs, rl)
    return res


# --------------------------------------------------------------------------------------------
# E-ATT: L1-distance scores + softmax
# --------------------------------------------------------------------------------------------
#: head dimensions per step of E-ATT's L1 distance (``_kernels._l1``: 5-d tiles
#: ``(CHUNK, R, C, TA, TB)``, ``BLOCK_D // CHUNK`` steps).  2 is the chunk without spills in the
#: first tiles of all three kernels (sm_90a, fp16, d 32/64/128, eatt_enc/eatt_causal, dropout 0
#: and 0.1; issue 28); 4 and 8 spilled 28-1436 B in 64x64 w8 (8: fewer PTX per score in 16x64 /
#: 32x64 w4 tiles, 365-390 vs 449-463 forward at d 64)
L1_CHUNK = 2


def _l1_meta(mod, q, interpret, mask_mode, causal, dropout):
    acc, prec = _dtypes(q.dtype, interpret)
    meta = dict(MASK_MODE=mask_mode, CAUSAL=bool(causal), DROPOUT=bool(dropout), ACC=acc, PREC=prec,
                UPCAST=_upcast(q.dtype, interpret), BLOCK_D=_block_d(q.shape[-1]))
    meta["CHUNK"] = min(L1_CHUNK, meta["BLOCK_D"])
    meta["EVEN_D"] = q.shape[-1] == meta["BLOCK_D"]
    if interpret:
        meta.update(mod.INTERPRET_BLOCKS)
    return meta


class _L1SoftmaxAttention(torch.autograd.Function):
    """Autograd function of :func:`l1_softmax_attention`; saves ``q, k, v, mask, out, lse``."""

    @staticmethod
    def forward(ctx, q, k, v, mask, scale, dropout_p, causal, seed, interpret):
        mod = _kernels(interpret)
        B, H, T, d = q.shape
        S = k.shape[2]
        m_arg, m_str, mode = _mask_args(mask, q, B, H, T, S)
        out = torch.empty_like(q)
        lse = q.new_zeros((B, H, T), dtype=_acc_dtype(q.dtype))
        meta = _l1_meta(mod, q, interpret, mode, causal, dropout_p > 0)
        if B * H * T > 0:
            grid = _grid(T, B * H, interpret, meta, "BLOCK_M")
            mod.l1_fwd[grid](q, k, v, m_arg, out, lse, *_strides(q), *_strides(k), *_strides(v), *m_str,
                             *_strides(out), H, T, S, d, _l1_scale(scale, q), float(dropout_p), seed,
                             *_keys(T, S), **meta)
        ctx.save_for_backward(q, k, v, mask, out, lse)
        ctx.cfg = (scale, dropout_p, causal, seed, interpret)
        ctx.bwd = l1_backward()  # chosen at the forward: one call, one backward path
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx, g_out, g_lse=None):
        q, k, v, mask, out, lse = ctx.saved_tensors
        scale, dropout_p, causal, seed, interpret = ctx.cfg
        mod = _kernels(interpret)
        B, H, T, d = q.shape
        S = k.shape[2]
        m_arg, m_str, mode = _mask_args(mask, q, B, H, T, S)
        acc_dt = _acc_dtype(q.dtype)
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        if g_out is None:
            return None, None, None, None, None, None, None, None, None
        # the kernels' sign sums (_kernels._l1_sgn), (B*H, max(T, S), BLOCK_D) float32 (float64):
        # l1_bwd_kv's for dK, then l1_bwd_q's for dQ (no zeroing: a program's first tile stores)
        g = q.new_empty((B * H * max(T, S) * _block_d(d),), dtype=acc_dt)
        delta = (g_out.to(acc_dt) * out.to(acc_dt)).sum(-1).contiguous()  # (B, H, T), dO_i . O_i
        meta = _l1_meta(mod, q, interpret, mode, causal, dropout_p > 0)
        common = (*_strides(q), *_strides(k), *_strides(v), *m_str, *_strides(g_out))
        tail = (H, T, S, d, _l1_scale(scale, q), float(dropout_p), seed, *_keys(T, S))
        fused = ctx.bwd == "fused"
        # fused: dQ's sums by atomic adds, (B*H, T, BLOCK_D) float32 (float64), zeroed; dq = scale * dqa
        # (split: the kernel ignores the argument; g stands in, nothing is allocated or zeroed)
        dqa = q.new_zeros((B * H * T * _block_d(d),), dtype=acc_dt) if fused else g
        if B * H * S > 0:
            if T == 0:
                dk.zero_(), dv.zero_()
            else:
                grid = _grid(S, B * H, interpret, meta, "BLOCK_N")
                kernel = mod.l1_bwd if fused else mod.l1_bwd_kv
                kernel[grid](q, k, v, m_arg, g_out, lse, delta, g, dk, dv, dqa, *common, *_strides(dk),
                             *_strides(dv), *tail, DQ_ATOMIC=fused, **meta)
        if fused:
            dq = (dqa.view(B, H, T, _block_d(d))[..., :d] * scale).to(q.dtype)
        elif B * H * T > 0:
            grid = _grid(T, B * H, interpret, meta, "BLOCK_M")
            mod.l1_bwd_q[grid](q, k, v, m_arg, g_out, lse, delta, g, dq, *common, *_strides(dq), *tail, **meta)
        return dq, dk, dv, None, None, None, None, None, None


def l1_softmax_attention(q, k, v, scale, mask=None, dropout_p=0.0, causal=False, return_lse=False):
    """Fused E-ATT attention (Wan et al., E-ATT eq. 13): ``dropout(softmax(-scale ||q_i - k_j||_1)) V``.

    Args:
        q: ``(B, H, T, d)``; k, v: ``(B, H, S, d)``; one dtype (float16, bfloat16, float32,
            float64), any strides, ``d <= 256``.
        scale: positive float, ``d^-1/2`` in E-ATT.
        mask: bool, broadcastable to ``(B, H, T, S)``, True = blocked, or None.
        dropout_p: dropout on the softmax weights, in ``[0, 1)``; applied as the nearest multiple
            of 1/256 (as in :func:`relu_attention`).
        causal: additionally block keys ``j > i + (S - T)``.
        return_lse: also return the row log-sum-exp ``(B, H, T)`` of the scores (float32; float64
            for float64 inputs; 0 on fully masked rows; not differentiable) -- for tests.

    Returns:
        ``out`` ``(B, H, T, d)`` in q's dtype and layout (exact zeros on fully masked rows), or
        ``(out, lse)``.  Differentiable w.r.t. q, k, v (``sgn(0) = 0`` in the L1 gradient).

    Raises:
        ValueError: bad shapes/dtypes/mask/dropout_p (the PyTorch path's checks), ``scale`` not
            finite and > 0, ``d > 256``, ``T * S >= 2**31``.
        RuntimeError: triton missing, or a non-CUDA tensor without ``TRITON_INTERPRET=1``.
    """
    from ..kernels import _check

    _check(q, k, v, 1.0, mask, dropout_p)
    _check_common(q, k, v, dropout_p)
    if not (isinstance(scale, (int, float)) and math.isfinite(scale) and scale > 0):
        raise ValueError(f"scale must be a finite number > 0, got {scale!r}")
    interpret = _mode(q)
    if mask is not None:
        mask = mask.to(q.device)
    out, lse = _L1SoftmaxAttention.apply(q, k, v, mask, float(scale), _dropout_rate(dropout_p), bool(causal),
                                         _seed(dropout_p), interpret)
    return (out, lse) if return_lse else out


# --------------------------------------------------------------------------------------------
# start-up check (used by --attention-backend auto)
# --------------------------------------------------------------------------------------------
#: kernel families and the attention functions they serve ("norm": ReLA's fused (gated) RMSNorm,
#: :mod:`fairseq_plugins.attention.triton.norm`, used by the ReLU family's post-aggregation;
#: "stats": ReLUFormer's eq. 7 row terms, :mod:`fairseq_plugins.attention.triton.stats`)
FAMILIES = ("rectified", "l1softmax", "norm", "stats")


def self_test(family: str, device, dtype: torch.dtype) -> Optional[str]:
    """Compile and run one family's kernels on a small input against the PyTorch reference.

    ``B 2, H 2, T 24, S 40, d 32``, key padding, forward + backward on both backward paths, fused
    and split: either may run later (:func:`set_rect_backward`, :func:`set_l1_backward`); the
    rectified family with a row scale and the eq. 7 statistics.  Used by ``--attention-backend auto`` before the first
    Triton call per (family, device, dtype), so that a kernel that does not compile or disagrees
    on an untested GPU/triton version falls back to the PyTorch path instead of failing training.

    Returns:
        ``None`` when outputs and gradients agree (max error <= 3e-2 of the reference's largest
        magnitude in half precision, 2e-3 in float32 (TF32 possible), 1e-6 in float64), else the
        reason (an exception message or the error found).

    Raises:
        ValueError: unknown ``family`` (lists :data:`FAMILIES`).
    """
    if family not in FAMILIES:
        raise ValueError(f"unknown kernel family {family!r}; valid choices: {', '.join(FAMILIES)}")
    if family == "norm":  # its own check: 37 rows of 64, groups 1 and 4, with and without the gate
        from .norm import self_test as norm_self_test

        return norm_self_test(device, dtype)
    if family == "stats":  # its own check: 3 x 4 x 37 rows, null rows, no key, query padding
        from .stats import self_test as stats_self_test

        return stats_self_test(device, dtype)
    tol = {torch.float64: 1e-6, torch.float32: 2e-3}.get(dtype, 3e-2)
    g = torch.Generator().manual_seed(0)
    B, H, T, S, d = 2, 2, 24, 40, 32
    base = [torch.randn(B, H, n, d, generator=g, dtype=torch.float64) for n in (T, S, S)]
    mask = torch.zeros(B, 1, 1, S, dtype=torch.bool)
    mask[1, ..., -5:] = True
    r = torch.rand(B, 1, T, 1, generator=g, dtype=torch.float64) + 0.5
    go = torch.randn(B, H, T, d, generator=g, dtype=torch.float64)
    dev_type = torch.device(device).type
    try:
        with torch.inference_mode(False), torch.enable_grad(), \
                torch.autocast(dev_type if dev_type in ("cuda", "cpu") else "cpu", enabled=False):
            return _self_test(family, device, dtype, tol, base, mask, r, go, d)
    except Exception as e:  # noqa: BLE001 - any failure means "do not use these kernels"
        return f"{type(e).__name__}: {e}"


def _self_test(family, device, dtype, tol, base, mask, r, go, d):
    """:func:`self_test` after setup: run the Triton path with each backward (fused and split)
    and the reference, compare."""
    setter = set_rect_backward if family == "rectified" else set_l1_backward
    for bwd in ("fused", "split"):
        saved = _RECT_BACKWARD if family == "rectified" else _L1_BACKWARD
        setter(bwd)
        try:
            err = _self_test_one(family, device, dtype, tol, base, mask, r, go, d)
        finally:
            setter(saved)
        if err is not None:
            return f"{bwd} backward: {err}"
    return None


def _self_test_one(family, device, dtype, tol, base, mask, r, go, d):
    """One comparison of :func:`_self_test`."""
    results = []
    for impl, dt, dev in (("triton", dtype, device), ("reference", torch.float64, "cpu")):
        # the reference sees the same (rounded) inputs, in float64
        q, k, v = (x.to(dtype).to(dev, dt).requires_grad_() for x in base)
        m = mask.to(dev)
        if family == "rectified":
            if impl == "triton":
                out, (rs, rl) = relu_attention(q, k, v, r.to(dev, dt), m, need_stats=True)
            else:
                from ..kernels import relu_attention_reference

                out, (rs, rl) = relu_attention_reference(q, k, v, r, m, need_stats=True)
            loss = (out.double() * go.to(dev)).sum() + rs.double().sum() + 0.1 * rl.double().sum()
        else:
            if impl == "triton":
                out = l1_softmax_attention(q, k, v, d ** -0.5, m)
            else:
                w = torch.softmax((-torch.cdist(q, k, p=1) * d ** -0.5).masked_fill(m, float("-inf")), -1)
                out = w @ v
            loss = (out.double() * go.to(dev)).sum()
        grads = torch.autograd.grad(loss, (q, k, v))
        results.append([t.detach().double().cpu() for t in (out, *grads)])
    return first_mismatch(("out", "dq", "dk", "dv"), *results, tol)


def first_mismatch(names, got, ref, tol: float) -> Optional[str]:
    """The self-tests' comparison: for each named pair of tensors, the largest absolute error
    relative to ``ref``'s largest magnitude; the first above ``tol`` as ``"<name> relative error
    <err> > <tol>"`` (NaN fails too), or None when all agree."""
    for name, a, b in zip(names, got, ref):
        err = float((a - b).abs().max()) / max(float(b.abs().max()), 1e-12)
        if not err <= tol:
            return f"{name} relative error {err:.3g} > {tol:g}"
    return None


# --------------------------------------------------------------------------------------------
# ahead-of-time compilation (no GPU needed)
# --------------------------------------------------------------------------------------------
_PTR_TYPES = {torch.bfloat16: "*bf16", torch.float16: "*fp16", torch.float32: "*fp32", torch.float64: "*fp64"}


def compile_offline(arch: int = 90, dtype: torch.dtype = torch.bfloat16, tiles: str = "first") -> dict:
    """Compile every kernel for CUDA ``sm_<arch>`` without a GPU (Triton front end -> TTIR ->
    TTGIR -> LLVM -> PTX -> cubin with the ``ptxas`` the triton wheel ships).

    The interpreter checks the numerics on CPU but not what only the compiler rejects (non-constexpr
    globals, layouts, shared memory); this checks that.  One variant per kernel with every feature
    on (row scale, general mask, causal, dropout, eq. 7 statistics; GeLU), with the first
    (``tiles="first"``) or every (``"all"``) autotuning tile.

    Returns:
        ``{"<kernel> <BLOCK_M>x<BLOCK_N>": shared memory bytes}``.

    Raises:
        ValueError: unknown ``dtype`` or ``tiles``.
        triton.compiler.errors.CompilationError (or the backend's error): a kernel does not compile.
    """
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    if dtype not in _PTR_TYPES:
        raise ValueError(f"dtype must be one of {list(_PTR_TYPES)}, got {dtype}")
    if tiles not in ("first", "all"):
        raise ValueError(f"tiles must be 'first' or 'all', got {tiles!r}")
    mod = _kernels(False)
    acc, prec = _dtypes(dtype, False)
    acc_ptr = _PTR_TYPES[_acc_dtype(dtype)]
    ptrs = {n: _PTR_TYPES[dtype] for n in ("Q", "K", "V", "O", "DO", "DK", "DV", "DQ")}
    ptrs.update({n: acc_ptr for n in ("R", "RS", "RL", "GS", "GL", "LSE", "DELTA", "SC", "G", "DQA")}, M="*u8")
    fused_ptrs = dict(ptrs, DQ=acc_ptr)  # rect_bwd adds dQ into an accumulator-dtype buffer
    common = dict(MASK_MODE=2, CAUSAL=True, DROPOUT=True, ACC=acc, PREC=prec, UPCAST=False, BLOCK_D=64)
    rect = dict(common, HAS_R=True, ACT=1, STATS=True)
    l1 = dict(common, CHUNK=L1_CHUNK, EVEN_D=True)
    plan = [("rect_fwd", mod._RECT_FWD, rect), ("rect_bwd", mod._RECT_BWD, dict(rect, DQ_ATOMIC=True)),
            ("rect_bwd_kv", mod._RECT_BWD_KV, dict(rect, DQ_ATOMIC=False)),
            ("rect_bwd_q", mod._RECT_BWD_Q, rect), ("l1_fwd", mod._L1_FWD, l1),
            ("l1_bwd", mod._L1_BWD, dict(l1, DQ_ATOMIC=True)), ("l1_bwd_kv", mod._L1_BWD_KV, dict(l1, DQ_ATOMIC=False)),
            ("l1_bwd_q", mod._L1_BWD_Q, l1)]
    target = GPUTarget("cuda", int(arch), 32)
    shared = {}
    for name, table, constexprs in plan:
        fn = getattr(mod, name).fn  # the JITFunction under the autotuner
        table = mod._tried(table, constexprs)
        for bm, bn, warps, stages in (table if tiles == "all" else table[:1]):
            cx = dict(constexprs, BLOCK_M=bm, BLOCK_N=bn)
            types = fused_ptrs if name == "rect_bwd" else ptrs
            sig = {a: ("constexpr" if a in cx else types.get(a, "fp32" if a in ("r_const", "dropout_p") else "i32"))
                   for a in fn.arg_names}
            kernel = triton.compile(ASTSource(fn, sig, cx), target=target,
                                    options={"num_warps": warps, "num_stages": stages})
            shared[f"{name} {bm}x{bn}"] = int(kernel.metadata.shared)
    return shared
