"""What the fused Triton attention kernels compile to on the GPUs they target -- without a GPU.

``mt-kernel-report`` compiles every kernel (``rect_fwd``, the fused backward ``rect_bwd`` and the
split pair ``rect_bwd_kv`` + ``rect_bwd_q`` side by side (``--bwd``),
``l1_fwd``, ``l1_bwd_kv``, ``l1_bwd_q`` of :mod:`fairseq_plugins.attention.triton`, and ReLA-g's
fused gated RMSNorm ``norm_fwd``, ``norm_bwd`` of :mod:`fairseq_plugins.attention.triton.norm`, and
ReLUFormer's eq. 7 row terms ``row_terms_fwd``, ``row_terms_bwd`` of
:mod:`fairseq_plugins.attention.triton.stats`) for every
variant the model launches (ReLA encoder self-attention with key padding, decoder
self-attention with the general future+padding mask, the causal flag, ReLUFormer's row scale and
eq. 7 statistics, E-ATT), with and without attention dropout, per dtype (fp16, bf16, fp32) and
head dimension (32, 64, 128), for ``sm_90a`` (H100) and ``sm_80`` (A100), and reads off:

* registers per thread, spill stores/loads (bytes) and ptxas warnings (e.g. ``C7515``: wgmma
  serialized) -- from the ``ptxas -v`` log of the kernel's PTX (the ptxas triton ships, triton's
  own flags);
* shared memory (bytes, triton's allocation: ``metadata.shared``);
* ``wgmma.mma_async`` (sm_90a) and ``mma.sync`` (sm_80) instruction counts, in the kernel and in
  its main loop; GEMMs: the kernel's ``tl.dot`` products (``tt.dot`` ops of its TTIR; in these
  kernels all sit in the main loop: GEMMs per iteration -- fused backward 5, split pair 4 + 3);
* PTX instructions of the main loop's body (one iteration over a key tile -- or query tile in the
  ``*_bwd_kv`` kernels) and that per score: ``loop instructions x threads / (BLOCK_M x BLOCK_N)``
  (each thread runs the body once per iteration; the tile has ``BLOCK_M x BLOCK_N`` scores).
  The norm: per element of its ``BLOCK_M x BLOCK_G x BLOCK_N`` tile.  The row terms (one pass, no
  loop: one program per ``BLOCK`` rows): the whole kernel counts as the "loop", per row
  (``instructions x threads / BLOCK``; a static count: both sides of every branch).
  Loops nested in the main loop (E-ATT's loops over chunks of head dimensions) count their trips.
  Both backward paths visit every (query tile, key tile) pair once per kernel, so the split
  pair's cost per score is the sum of its two kernels' (the report's "fused vs split" table).
* the same main loop in SASS, the machine code ptxas makes of the PTX (``nvdisasm -c``, shipped
  with triton): instructions per score as the GPU issues them (ptxas fuses ``xor`` pairs into
  ``LOP3``, multiplies into ``IMAD``, drops moves); shown where its loop nest matches the PTX's.
* for E-ATT, whose scores run on the CUDA cores (no tensor-core GEMM computes an L1 distance),
  the issue bound (:func:`issue_bound`): the least time an H100 needs just to issue its loops'
  SASS for ``mt-bench-gpu``'s core section, and the same for an ideal kernel -- arithmetic on the
  counts, stated as such.

The compile is the one the JIT does at the first launch: the real entry points
(:func:`~fairseq_plugins.attention.triton.relu_attention`,
:func:`~fairseq_plugins.attention.triton.l1_softmax_attention`, forward and backward) are called
on CPU tensors in the model's layout (``(L, B, H*d)`` viewed as ``(B, H, T, d)``, as
:class:`~fairseq_plugins.attention.FunctionalMultiheadAttention` passes them) with the kernel
launches recorded instead of run; every recorded launch is then specialised by triton's own
binder (``tt.divisibility = 16`` of pointers, strides and sizes divisible by 16, integer
arguments equal to 1 -- the unit strides -- as constants) and compiled for the target with each
autotuning tile asked for (``--tiles first``: the first of the kernel's table that the autotuner
tries for that launch -- ``_tried``: tiles known to spill with ReLUFormer's statistics, with
dropout (``_SPILL_WITH_DROPOUT``, per table), at head dimension 128 (``_SPILL_AT_D128``, per
table, keyed on the launch's ``BLOCK_D``) or at head dimension 128 with dropout
(``_SPILL_AT_D128_WITH_DROPOUT``) are not tried there -- on sm_90a, where they were measured
(``SPILL_LISTS_ARCH``); on other targets (sm_80) the autotuner tries the whole table and its
timing decides; ``--tiles all``: every tile it tries;
``--tiles table``: every tile of the kernel's table, those it leaves out too -- marked "not
tried", outside the targets and the tile choices -- the command that shows why each is left out).
Which tile the autotuner picks on a GPU is not known here.

Writes ``results/gpu/kernel_report.md`` (``--out``; ``--json`` also a JSON list of the rows) with
a provenance section (:mod:`mt_pipeline.provenance`), atomically (:mod:`mt_pipeline.atomic`).
Exit status 2 when triton or its NVIDIA backend is missing.

Usage::

    mt-kernel-report [--arch 90,80] [--dtypes fp16,bf16,fp32] [--head-dims 32,64,128]
                     [--variants rela_enc,...] [--bwd fused,split] [--tiles first|all|table]
                     [--jobs N] [--out FILE] [--json FILE]
"""

import argparse
import contextlib
import os
import re
import subprocess
import sys
import tempfile
import time
from typing import Dict, Iterable, List, Optional, Tuple

from . import provenance
from .atomic import write_json_atomic, write_text_atomic

__all__ = ["main", "VARIANTS", "MAIN", "DTYPES", "HEAD_DIMS", "ARCHS", "KERNELS", "launches",
           "compile_launch", "analyse_ptx", "parse_ptxas_log", "report", "render", "problems", "BWDS",
           "bwd_comparison", "issue_bound", "H100_SXM", "IDEAL_L1_PER_DIM"]

DTYPES = ("fp16", "bf16", "fp32")
HEAD_DIMS = (32, 64, 128)
#: compute capabilities: 90 -> sm_90a (H100, wgmma), 80 -> sm_80 (A100, mma.sync)
ARCHS = (90, 80)
KERNELS = {"rectified": ("rect_fwd", "rect_bwd", "rect_bwd_kv", "rect_bwd_q"),
           "l1softmax": ("l1_fwd", "l1_bwd", "l1_bwd_kv", "l1_bwd_q"),
           "norm": ("norm_fwd", "norm_bwd"),
           "stats": ("row_terms_fwd", "row_terms_bwd")}
#: variant -> (family, mask, causal, row scale tensor + eq. 7 statistics (ReLUFormer)); masks as
#: the attention module builds them: "pad" (B, 1, 1, S) key padding (encoder self-attention and
#: cross-attention; with causal=True, decoder self-attention since the seam change of issue 28),
#: "future" (B, 1, T, S) padding | future mask (decoder self-attention before that change; any
#: attn_mask other than the causal pattern still arrives so).
#: The "norm" family (ReLA-g's gated RMSNorm on the concatenated heads (T, B, H*d), gate on) has
#: the norm's scope in the mask slot: "concat" (groups 1) or "head" (groups H); no dropout.
#: The "stats" family (ReLUFormer's eq. 7 row terms on the (B, H, T) float32 row sums) has the
#: attention call whose rows it reduces: "pad" + causal (decoder self-attention: the valid-key
#: counts n are per query, (B, 1, T); the query padding (B, T)), row scale + statistics on;
#: no dropout, no head dimension (reported under each one asked for, the same compile).
VARIANTS = {
    "rela_enc": ("rectified", "pad", False, False),
    "rela_dec": ("rectified", "future", False, False),
    "rela_causal": ("rectified", "pad", True, False),
    "reluformer_enc": ("rectified", "pad", False, True),
    "reluformer_dec": ("rectified", "future", False, True),
    "eatt_enc": ("l1softmax", "pad", False, False),
    "eatt_dec": ("l1softmax", "future", False, False),
    "eatt_causal": ("l1softmax", "pad", True, False),
    "rela_g_norm": ("norm", "concat", False, False),
    "rela_g_norm_head": ("norm", "head", False, False),
    "reluformer_terms": ("stats", "pad", True, True),
}
#: kernel families with their own fixed tile (the launch's meta), no dropout and no backward path
_FIXED = ("norm", "stats")
#: attention dropout of the variants: off and the papers' 0.1
DROPOUTS = (0.0, 0.1)
#: backward paths of the rectified family (:func:`fairseq_plugins.attention.triton.set_rect_backward`):
#: "fused" (``rect_bwd``, 5 GEMMs, atomic dQ; the default without deterministic algorithms) and
#: "split" (``rect_bwd_kv`` + ``rect_bwd_q``, 7 GEMMs), compiled side by side for comparison
BWDS = ("fused", "split")
#: the main configurations: no spills and no serialized wgmma allowed (tests/test_kernel_report.py);
#: d 32 and 128 since the head-dimension-aware tile pruning and E-ATT's chunked distance (issue 28)
#: ``--tiles``: the first tile the autotuner tries, every tile it tries, every tile of the table
TILES = ("first", "all", "table")
MAIN = dict(arch=90, dtypes=("fp16", "bf16"), head_dims=(32, 64, 128), tiles="first",
            variants=("rela_enc", "rela_causal", "reluformer_enc", "eatt_enc", "eatt_causal"))
#: main configurations known to break the targets, ``(variant, head_dim, dropout) -> (kernel, why)``
#: (sm_90a, :data:`MAIN`'s dtypes): only that kernel may break them there.  The report lists them as
#: known, ``--check`` passes them, and tests/test_kernel_report.py fails when one of them meets the
#: targets (so the list cannot outlive its reason) or another kernel breaks them.  Empty since the
#: fused rectified backward's spill-free tile at d 128 with dropout (16x128 w8 s1; issue 28), which
#: had been the one entry (rect_bwd of rela_enc / rela_causal / reluformer_enc at d 128, p 0.1)
KNOWN: Dict[Tuple[str, int, float], Tuple[str, str]] = {}
#: the H100 SXM5's instruction issue rate: 132 SMs x 4 schedulers x 32 lanes (one warp
#: instruction per scheduler and clock: 128 thread-instructions per SM and clock) x 1.98 GHz boost
#: clock (NVIDIA's H100 datasheet) -- an upper bound no kernel exceeds; :func:`issue_bound`
H100_SXM = dict(sms=132, lanes=128, ghz=1.98)
#: instructions per score *and head dimension* an ideal E-ATT kernel would issue, forward +
#: backward: 2 for the forward's distance (``FADD`` of ``q_d - k_d``, ``FADD`` of its absolute
#: value: ``|.|`` is an operand modifier) and 7-10 for the backward (the distance recomputed, 2,
#: and the two sign sums ``sum_j dS_ij sgn(q_id - k_jd)`` / ``sum_i ...``: 2 compares and a
#: multiply-add each, the second sum's reduction shared) -- an assumption written out, not a count
IDEAL_L1_PER_DIM = (9, 12)
#: sequence lengths (T = S, the core section's) of :func:`issue_bound`
BOUND_T = (1024, 4096)
#: shape of the recorded launches: lengths not multiples of 16 (fairseq batches have any length)
SHAPE = dict(B=4, H=8, T=1000, S=1000)
_SEED = 987654321  # dropout seed of the recorded launches: odd, so never specialised as divisible


# --------------------------------------------------------------------------------------------
# recording the launches of the real entry points
# --------------------------------------------------------------------------------------------
class _Recorder:
    """Stands in for an autotuned kernel: ``kernel[grid](*args, **meta)`` appends a launch."""

    def __init__(self, name: str, sink: list):
        self.name, self.sink = name, sink

    def __getitem__(self, grid):
        return lambda *args, **kwargs: self.sink.append((self.name, args, kwargs))


@contextlib.contextmanager
def _recording(sink: list, bwd: str = "fused"):
    """Patch :mod:`fairseq_plugins.attention.triton` so that its entry points take CPU tensors
    as if they were CUDA tensors (compiled mode), record their kernel launches in ``sink`` and
    take the backward path ``bwd`` (rectified and E-ATT)."""
    import types

    import fairseq_plugins.attention.triton as tk

    real = tk._kernels(False)
    proxy = types.SimpleNamespace(**{n: _Recorder(n, sink) for fam in KERNELS.values() for n in fam})
    saved = (tk._kernels, tk._mode, tk._seed, tk._RECT_BACKWARD, tk._L1_BACKWARD)
    tk._kernels = lambda interpret: proxy
    tk._mode = lambda x: False
    tk._seed = lambda p: _SEED if p > 0 else 0
    tk.set_rect_backward(bwd)
    tk.set_l1_backward(bwd)
    try:
        yield real
    finally:
        tk._kernels, tk._mode, tk._seed, tk._RECT_BACKWARD, tk._L1_BACKWARD = saved


def _model_layout(B, H, L, d, dtype, gen):
    """``(B, H, L, d)`` view of an ``(L, B, H*d)`` tensor, as the attention module passes q/k/v."""
    import torch

    x = torch.randn(L, B, H * d, generator=gen).to(dtype)
    return x.view(L, B, H, d).permute(1, 2, 0, 3).requires_grad_()


def _mask(kind: str, B: int, T: int, S: int):
    """Bool masks (True = blocked): key padding ``(B, 1, 1, S)`` (what
    :meth:`FunctionalMultiheadAttention._build_mask` passes, with ``causal``) or padding | future
    ``(B, 1, T, S)`` (what it passed for the future mask before issue 28; a general mask)."""
    import torch

    pad = torch.zeros(B, 1, 1, S, dtype=torch.bool)
    pad[0, ..., S - S // 5:] = True
    if kind == "pad":
        return pad
    return pad | torch.ones(T, S, dtype=torch.bool).triu(1).view(1, 1, T, S)


def launches(variant: str, dropout_p: float, dtype: str, head_dim: int,
             bwd: str = "fused") -> List[Tuple[str, tuple, dict]]:
    """The kernel launches (name, positional args, keyword meta) of one forward + backward of
    ``variant`` (a key of :data:`VARIANTS`) as the real entry point makes them; the backward
    takes the path ``bwd`` (:data:`BWDS`; ``"fused"``: ``rect_bwd`` / ``l1_bwd``; ``"split"``:
    ``rect_bwd_kv`` + ``rect_bwd_q`` / ``l1_bwd_kv`` + ``l1_bwd_q``; training runs the rectified
    fused and the E-ATT split path by default, see :func:`~fairseq_plugins.attention.triton.set_rect_backward`
    and :func:`~fairseq_plugins.attention.triton.set_l1_backward`).

    Raises:
        ValueError: unknown ``variant``, ``dtype`` or ``bwd``.
    """
    import torch

    import fairseq_plugins.attention.triton as tk

    if variant not in VARIANTS:
        raise ValueError(f"unknown variant {variant!r}; valid choices: {', '.join(VARIANTS)}")
    if dtype not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; valid choices: {', '.join(DTYPES)}")
    if bwd not in BWDS:
        raise ValueError(f"unknown backward {bwd!r}; valid choices: {', '.join(BWDS)}")
    family, mask_kind, causal, reluformer = VARIANTS[variant]
    dt = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}[dtype]
    B, H, T, S = SHAPE["B"], SHAPE["H"], SHAPE["T"], SHAPE["S"]
    gen = torch.Generator().manual_seed(0)
    if family == "norm":
        return _norm_launches(mask_kind == "head", dt, B, H, T, head_dim, gen)
    if family == "stats":
        return _stats_launches(dt, B, H, T, gen)
    q, k, v = (_model_layout(B, H, n, head_dim, dt, gen) for n in (T, S, S))
    mask = _mask(mask_kind, B, T, S)
    sink: list = []
    with _recording(sink, bwd), torch.enable_grad():
        if family == "rectified" and reluformer:
            # ReLUFormer: row scale r (B, 1, T, 1) float32 expanded from (B, 1, T|1, 1); eq. 7 terms
            r = torch.rand(B, 1, T if mask_kind == "future" else 1, 1, generator=gen) + 0.5
            out, (rs, rl) = tk.relu_attention(q, k, v, r.expand(B, 1, T, 1), mask=mask, dropout_p=dropout_p,
                                              need_stats=True, causal=causal)
            loss = out.float().sum() + rs.sum() + rl.sum()
        elif family == "rectified":
            out = tk.relu_attention(q, k, v, head_dim ** -0.5, mask=mask, dropout_p=dropout_p, causal=causal)
            loss = out.float().sum()
        else:
            out = tk.l1_softmax_attention(q, k, v, head_dim ** -0.5, mask=mask, dropout_p=dropout_p,
                                          causal=causal)
            loss = out.float().sum()
        loss.backward()
    return sink


#: streaming multiprocessors assumed for the norm backward's program count (H100 SXM: 132)
_SMS = 132


def _norm_launches(per_head: bool, dt, B: int, H: int, T: int, head_dim: int, gen) -> list:
    """The launches of one forward + backward of the fused gated RMSNorm on ``(T, B, H*d)`` in
    ``dt`` (parameters in ``dt`` too, as a ``--fp16``/``--bf16`` model has them)."""
    import types

    import torch

    import fairseq_plugins.attention.triton.norm as tn

    C = H * head_dim
    z = torch.randn(T, B, C, generator=gen).to(dt).requires_grad_()
    w = torch.ones(C, dtype=dt, requires_grad=True)
    gate = (torch.rand(C, generator=gen) - 0.5).to(dt).requires_grad_()
    sink: list = []
    proxy = types.SimpleNamespace(**{n: _Recorder(n, sink) for n in KERNELS["norm"]})
    saved = (tn._norm_kernels, tn._mode, tn._programs)
    tn._norm_kernels = lambda interpret: proxy
    tn._mode = lambda x: False
    tn._programs = lambda n_blocks, device, interpret: max(1, min(n_blocks, 4 * _SMS))
    try:
        with torch.enable_grad():
            y = tn.gated_rms_norm(z, w, gate, 1e-8, H if per_head else 1)
            y.float().sum().backward()
    finally:
        tn._norm_kernels, tn._mode, tn._programs = saved
    return sink


def _norm_real():
    """The compiled norm kernels, shaped like the autotuned ones (``.fn`` is the JITFunction)."""
    import types

    import fairseq_plugins.attention.triton.norm as tn

    mod = tn._norm_kernels(False)
    return types.SimpleNamespace(**{n: types.SimpleNamespace(fn=getattr(mod, n)) for n in KERNELS["norm"]})


#: ReLUFormer's entropy bound c (Appendix A) in the recorded row-terms launches
_ENTROPY_C = 0.7


def _stats_launches(dt, B: int, H: int, T: int, gen) -> list:
    """The launches of one forward + backward of ReLUFormer's eq. 7 row terms
    (:func:`fairseq_plugins.attention.triton.stats.reluformer_row_terms`) on the rows of a causal
    self-attention call with key padding, as the attention kernel returns them for ``dt``: row sums
    ``(B, H, T)`` float32 (float32 for every report dtype: the attention accumulates in it),
    contiguous; the valid-key counts ``n`` ``(B, 1, T)`` float32 (:func:`keys_per_query` of that
    call, squeezed: per query); the query padding ``(B, T)`` bool (the key padding's pattern);
    ``c = 0.7``.  The loss is ``norm + margin``: both gradients exist (``HAS_GN``, ``HAS_GM``)."""
    import types

    import torch

    import fairseq_plugins.attention.triton.stats as st
    from fairseq_plugins.attention.stats import keys_per_query
    from fairseq_plugins.attention.triton import _acc_dtype

    acc = _acc_dtype(dt)
    row_sum = (torch.rand(B, H, T, generator=gen) * 3).to(acc).requires_grad_()
    row_slogs = (torch.rand(B, H, T, generator=gen) - 0.5).to(acc).requires_grad_()
    pad = _mask("pad", B, T, T)  # (B, 1, 1, T) key padding
    n = keys_per_query(pad, True, T, T).squeeze(-1)  # (B, 1, T) float32
    qp = pad.view(B, T).clone()
    sink: list = []
    proxy = types.SimpleNamespace(**{k: _Recorder(k, sink) for k in KERNELS["stats"]})
    saved = (st._stats_kernels, st._mode)
    st._stats_kernels = lambda interpret: proxy
    st._mode = lambda x: False
    try:
        with torch.enable_grad():
            out = st.reluformer_row_terms(row_sum, row_slogs, n, qp, _ENTROPY_C)
            (out[0] + out[1]).backward()
    finally:
        st._stats_kernels, st._mode = saved
    return sink


def _stats_real():
    """The compiled row-terms kernels, shaped like the autotuned ones (``.fn`` is the JITFunction)."""
    import types

    import fairseq_plugins.attention.triton.stats as st

    mod = st._stats_kernels(False)
    return types.SimpleNamespace(**{n: types.SimpleNamespace(fn=getattr(mod, n)) for n in KERNELS["stats"]})


# --------------------------------------------------------------------------------------------
# compiling one launch as the JIT would
# --------------------------------------------------------------------------------------------
def _ptxas_path(arch: int) -> str:
    from triton.backends.nvidia.compiler import get_ptxas

    try:
        return get_ptxas(arch).path
    except TypeError:  # older triton: get_ptxas() without the arch
        return get_ptxas().path


def compile_launch(real_module, name: str, args: tuple, meta: dict, arch: int, tile) -> dict:
    """Compile one recorded launch for ``sm_<arch>`` with ``tile = (BLOCK_M, BLOCK_N, num_warps,
    num_stages)``, specialised by triton's own binder as the first launch on a GPU would be.
    A kernel with one ``BLOCK`` instead (the row terms: rows per program) takes ``tile[0]`` as it
    (``tile[1]`` must be 1).

    Returns:
        ``{"ptx": str, "shared": bytes, "ptxas_log": str, "target": "sm_90a", "gemms": tl.dot count,
        "sass": the machine code as ``nvdisasm -c`` prints it ("" when triton ships no nvdisasm)}``.

    Raises:
        triton's compilation errors (the kernel does not compile for that target).
    """
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource, make_backend
    from triton.runtime.jit import create_function_from_signature

    fn = getattr(real_module, name).fn  # the JITFunction under the autotuner (rect_bwd, rect_bwd_kv: one, the
    # recorded DQ_ATOMIC tells them apart)
    bm, bn, warps, stages = tile
    if "BLOCK_M" in fn.arg_names:
        kwargs = dict(meta, BLOCK_M=bm, BLOCK_N=bn, num_warps=warps, num_stages=stages)
    elif bn == 1:
        kwargs = dict(meta, BLOCK=bm, num_warps=warps, num_stages=stages)
    else:
        raise ValueError(f"{name} has one BLOCK: tile {tile} must be (BLOCK, 1, warps, stages)")
    target = GPUTarget("cuda", int(arch), 32)
    backend = make_backend(target)
    binder = create_function_from_signature(fn.signature, fn.params, backend)
    bound, specialization, options = binder(*args, **kwargs)
    options, signature, constexprs, attrs = fn._pack_args(backend, kwargs, bound, specialization, options)
    kernel = triton.compile(ASTSource(fn, signature, constexprs, attrs), target=target, options=options.__dict__)
    ptx = kernel.asm["ptx"]
    gpu = "sm_90a" if int(arch) == 90 else f"sm_{arch}"
    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "k.ptx")
        with open(src, "w") as f:
            f.write(ptx)
        cmd = [_ptxas_path(int(arch)), "-lineinfo", "-v", "--regAllocOptLevel=2", f"--gpu-name={gpu}", src,
               "-o", os.path.join(tmp, "k.o")]
        if not options.enable_fp_fusion:
            cmd.insert(2, "--fmad=false")
        res = subprocess.run(cmd, capture_output=True, text=True)
        sass = ""
        nvdisasm = os.path.join(os.path.dirname(cmd[0]), "nvdisasm")
        if res.returncode == 0 and os.path.exists(nvdisasm):
            dis = subprocess.run([nvdisasm, "-c", os.path.join(tmp, "k.o")], capture_output=True, text=True)
            sass = dis.stdout if dis.returncode == 0 else ""
    return {"ptx": ptx, "shared": int(kernel.metadata.shared), "ptxas_log": res.stdout + res.stderr,
            "target": gpu, "gemms": len(_DOT.findall(kernel.asm.get("ttir", ""))), "sass": sass}


# --------------------------------------------------------------------------------------------
# reading PTX and the ptxas log
# --------------------------------------------------------------------------------------------
_DOT = re.compile(r"=\s*tt\.dot\s")  # a GEMM in the TTIR (tl.dot), before lowering to wgmma / mma / FMA
_LABEL = re.compile(r"^\s*(\$?[A-Za-z_][\w$]*):\s*$")
_BRANCH = re.compile(r"\bbra(?:\.uni)?\s+(\$?[A-Za-z_][\w$]*)\s*;")
_NOT_INSTR = re.compile(r"^\s*(?:\.|//|\{|\}|@@|$)")


def _instructions(lines: List[str]) -> List[Tuple[int, str]]:
    """``(line index, text)`` of the PTX instructions among ``lines`` (not directives, labels,
    comments, braces or declarations)."""
    out = []
    for i, line in enumerate(lines):
        s = line.split("//", 1)[0].strip()
        if not s or _NOT_INSTR.match(s) or _LABEL.match(s) or not s.endswith(";"):
            continue
        out.append((i, s))
    return out


#: modifiers kept in an opcode's name (:func:`_opcode`): they change what the instruction costs
_KEPT_MODIFIERS = {"hi", "lo", "wide", "shared", "global", "local", "param", "const", "async", "mma_async"}
_PREDICATE = re.compile(r"^@!?%\w+\s+")


def _opcode(instruction: str) -> str:
    """The opcode of a PTX instruction without its guard predicate and its type/rounding
    modifiers, keeping those of :data:`_KEPT_MODIFIERS`: ``@%p1 mul.hi.u32 %r1, ...`` ->
    ``mul.hi``; ``ld.shared.v4.b32`` -> ``ld.shared``; ``selp.b32`` -> ``selp``."""
    op = _PREDICATE.sub("", instruction).split(None, 1)[0].rstrip(";")
    parts = op.split(".")
    return ".".join([parts[0]] + [m for m in parts[1:] if m in _KEPT_MODIFIERS])


_BLOCK = re.compile(r"^\s*(?:(\$L__BB\d+_\d+):|// (%bb\.\d+):)")
_HEADER = re.compile(r"=>\s*This (?:Inner )?Loop Header: Depth=(\d+)")
_IN_LOOP = re.compile(r"in Loop: Header=(\w+) Depth=(\d+)")
_PARENT = re.compile(r"Parent Loop (\w+) Depth=(\d+)")


def _blocks(lines: List[str]) -> List[dict]:
    """PTX basic blocks with LLVM's loop annotations: ``{"start", "end", "chain"}`` where
    ``chain`` lists the headers of the loops holding the block, outermost first (``[]``: in no
    loop).  Blocks start at ``$L__BB<f>_<n>:`` labels and ``// %bb.<n>:`` comments; LLVM writes
    ``=>This Loop Header: Depth=d``, ``in Loop: Header=BB<f>_<n> Depth=d`` and ``Parent Loop ...``
    under each block's first line."""
    starts = []
    for i, line in enumerate(lines):
        m = _BLOCK.match(line)
        if m:
            starts.append((i, (m.group(1) or m.group(2)).lstrip("$L_")))
    blocks = []
    for n, (i, name) in enumerate(starts):
        end = starts[n + 1][0] - 1 if n + 1 < len(starts) else len(lines) - 1
        parents, inner = {}, None
        for k in range(i, end + 1):
            code, _, comment = lines[k].partition("//")
            if k > i and code.strip():
                break  # the annotations are the comment lines right under the block's start
            for hm in _HEADER.finditer(comment):
                inner = (name, int(hm.group(1)))
            for lm in _IN_LOOP.finditer(comment):
                inner = (lm.group(1), int(lm.group(2)))
            for pm in _PARENT.finditer(comment):
                parents[int(pm.group(2))] = pm.group(1)
        chain = []
        if inner is not None:
            chain = [parents.get(dpt, "?") for dpt in range(1, inner[1])] + [inner[0]]
        blocks.append({"start": i, "end": end, "chain": chain})
    return blocks


def analyse_ptx(ptx: str, inner_trips=1, whole: bool = False) -> dict:
    """Static counts of one kernel's PTX.

    ``whole``: the kernel is one pass without a main loop (the row terms: one program per
    ``BLOCK`` rows): the loop fields count the whole kernel, every instruction once.

    The main loop is the outermost loop (LLVM's loop annotations of the basic blocks) holding the
    most ``wgmma``/``mma`` instructions (ties: the most instructions).  Instructions of loops
    nested in it are counted ``inner_trips`` times in ``loop_dynamic`` (their trip count, e.g. the
    head dimension of E-ATT's per-dimension loop): one int for every nested loop, or a list, one
    per nested loop in the order they appear in the PTX (its last entry for any further loop).

    Returns:
        ``{"instructions", "wgmma", "mma", "loop_instructions" (static, nested loops included),
        "loop_wgmma", "loop_mma", "inner_loops": [static sizes of the nested loops],
        "loop_dynamic", "loop_opcodes": {opcode (:func:`_opcode`): its count in one iteration,
        nested loops x their trips, as loop_dynamic}}``; the loop fields are 0 / [] / {} without a loop.
    """
    lines = ptx.splitlines()
    instr = _instructions(lines)
    blocks = _blocks(lines)

    def count(ranges, pat=None):
        return sum(1 for i, s in instr if any(a <= i <= b for a, b in ranges) and (pat is None or pat in s))

    res = {"instructions": len(instr), "wgmma": count([(0, len(lines))], "wgmma.mma_async"),
           "mma": count([(0, len(lines))], "mma.sync"), "loop_instructions": 0, "loop_wgmma": 0, "loop_mma": 0,
           "inner_loops": [], "loop_dynamic": 0, "loop_opcodes": {}}
    if whole:
        ops: Dict[str, int] = {}
        for _, s in instr:
            ops[_opcode(s)] = ops.get(_opcode(s), 0) + 1
        res.update(loop_instructions=len(instr), loop_wgmma=res["wgmma"], loop_mma=res["mma"],
                   loop_dynamic=len(instr), loop_opcodes=ops)
        return res
    tops = {}
    for b in blocks:
        if b["chain"]:
            tops.setdefault(b["chain"][0], []).append(b)
    if not tops:
        return res

    def span(bs):
        return [(b["start"], b["end"]) for b in bs]

    main = max(tops.values(), key=lambda bs: (count(span(bs), "wgmma.mma_async") + count(span(bs), "mma.sync"),
                                              count(span(bs))))
    nested = {}
    for b in main:
        if len(b["chain"]) > 1:
            nested.setdefault(b["chain"][1], []).append(b)
    sizes = [count(span(bs)) for bs in nested.values()]
    static = count(span(main))
    trips = list(inner_trips) if isinstance(inner_trips, (list, tuple)) else [inner_trips]
    trips = [max(int(t), 1) for t in trips] or [1]
    extra = sum(n * (trips[min(i, len(trips) - 1)] - 1) for i, n in enumerate(sizes))
    weight = {}  # PTX line -> how often it runs per main-loop iteration
    for b in main:
        if len(b["chain"]) == 1:
            weight.update((i, 1) for i in range(b["start"], b["end"] + 1))
    for n, bs in enumerate(nested.values()):
        w = trips[min(n, len(trips) - 1)]
        for b in bs:
            weight.update((i, w) for i in range(b["start"], b["end"] + 1))
    opcodes: Dict[str, int] = {}
    for i, s in instr:
        if i in weight:
            op = _opcode(s)
            opcodes[op] = opcodes.get(op, 0) + weight[i]
    res.update(loop_instructions=static, loop_wgmma=count(span(main), "wgmma.mma_async"),
               loop_mma=count(span(main), "mma.sync"), inner_loops=sizes, loop_dynamic=static + extra,
               loop_opcodes=opcodes)
    return res


_SASS_INSTR = re.compile(r"^\s*/\*[0-9a-f]+\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)")
_SASS_LABEL = re.compile(r"^(\.L_x_\d+):")
_SASS_BRANCH = re.compile(r"\bBRA\s+`\((\.L_x_\d+)\)")


def analyse_sass(sass: str, inner_trips=1, whole: bool = False) -> dict:
    """Static counts of one kernel's machine code (``nvdisasm -c``): what the GPU executes after
    ptxas (which fuses e.g. ``xor``/``xor`` into one ``LOP3`` and ``mul.lo``/``mul.hi`` into
    one ``IMAD.WIDE``, and drops moves), the PTX counts' check.

    Loops are the backward branches (``BRA`` to an earlier label); the main loop is the outermost
    holding the most ``HGMMA``/``HMMA`` (ties: the most instructions); loops inside it count
    ``inner_trips`` times, as :func:`analyse_ptx` (``NOP`` padding is not counted).  ``whole``: the
    kernel is one pass (:func:`analyse_ptx`'s ``whole``): ``sass_loop`` counts every instruction
    once, but the trailing self-branch (``.L_x_n: BRA `(.L_x_n)``, never reached) and ``NOP``.

    Returns:
        ``{"sass_loop": instructions of one main-loop iteration (nested loops x trips; 0 without a
        loop or code), "sass_loops_nested": nested loops found, "sass_opcodes": {opcode (the part
        before the first dot): count per iteration}}``.
    """
    instr, labels, branches = [], {}, []
    for line in sass.splitlines():
        lm = _SASS_LABEL.match(line)
        if lm:
            labels[lm.group(1)] = len(instr)
            continue
        im = _SASS_INSTR.match(line)
        if not im:
            continue
        bm = _SASS_BRANCH.search(line)
        if bm:
            branches.append((len(instr), bm.group(1)))
        instr.append(im.group(1))
    loops = sorted({(labels[t], b) for b, t in branches if t in labels and labels[t] <= b})
    out = {"sass_loop": 0, "sass_loops_nested": 0, "sass_opcodes": {}}
    if whole:
        traps = {b for b, t in branches if labels.get(t) == b}
        ops: Dict[str, int] = {}
        for i, op in enumerate(instr):
            base = op.split(".")[0]
            if base != "NOP" and i not in traps:
                ops[base] = ops.get(base, 0) + 1
        out.update(sass_loop=sum(ops.values()), sass_opcodes=ops)
        return out
    outer = [lp for lp in loops if not any(o != lp and o[0] <= lp[0] and lp[1] <= o[1] for o in loops)]
    if not outer:
        return out

    def mma(lp):
        return sum(1 for op in instr[lp[0]:lp[1] + 1] if op.split(".")[0] in ("HGMMA", "HMMA"))

    main = max(outer, key=lambda lp: (mma(lp), lp[1] - lp[0]))
    nested = [lp for lp in loops if lp != main and main[0] <= lp[0] and lp[1] <= main[1]]
    nested = [lp for lp in nested if not any(o != lp and o in nested and o[0] <= lp[0] and lp[1] <= o[1]
                                             for o in nested)]  # the outermost ones inside main
    trips = list(inner_trips) if isinstance(inner_trips, (list, tuple)) else [inner_trips]
    trips = [max(int(t), 1) for t in trips] or [1]
    weight = [1] * (main[1] - main[0] + 1)
    for n, (a, b) in enumerate(nested):
        for i in range(a, b + 1):
            weight[i - main[0]] = trips[min(n, len(trips) - 1)]
    ops: Dict[str, int] = {}
    for w, op in zip(weight, instr[main[0]:main[1] + 1]):
        base = op.split(".")[0]
        if base != "NOP":
            ops[base] = ops.get(base, 0) + w
    out.update(sass_loop=sum(ops.values()), sass_loops_nested=len(nested), sass_opcodes=ops)
    return out


_REGS = re.compile(r"Used (\d+) registers")
_SPILL = re.compile(r"(\d+) bytes spill stores, (\d+) bytes spill loads")
_STACK = re.compile(r"(\d+) bytes stack frame")


def parse_ptxas_log(log: str) -> dict:
    """``{"registers", "spill_stores", "spill_loads", "stack", "warnings": [lines]}`` of a
    ``ptxas -v`` log (one kernel); the warnings are the lines saying ``warning``, without the
    temporary file's name; ``registers`` is -1 when ptxas failed (its log is then a warning)."""
    regs = _REGS.search(log)
    spill = _SPILL.search(log)
    stack = _STACK.search(log)
    warnings = []
    for line in log.splitlines():
        if "warning" in line.lower() or "error" in line.lower():
            warnings.append(re.sub(r"^ptxas\s*(?:/\S+)?\s*,?\s*", "", line.strip()))
    return {"registers": int(regs.group(1)) if regs else -1,
            "spill_stores": int(spill.group(1)) if spill else 0,
            "spill_loads": int(spill.group(2)) if spill else 0,
            "stack": int(stack.group(1)) if stack else 0, "warnings": warnings}


# --------------------------------------------------------------------------------------------
# the report
# --------------------------------------------------------------------------------------------
def _tables(real_module) -> Dict[str, list]:
    return {"rect_fwd": real_module._RECT_FWD, "rect_bwd": real_module._RECT_BWD, "rect_bwd_kv": real_module._RECT_BWD_KV,
            "rect_bwd_q": real_module._RECT_BWD_Q, "l1_fwd": real_module._L1_FWD,
            "l1_bwd": real_module._L1_BWD, "l1_bwd_kv": real_module._L1_BWD_KV, "l1_bwd_q": real_module._L1_BWD_Q}


def report(archs: Iterable[int] = ARCHS, dtypes: Iterable[str] = DTYPES, head_dims: Iterable[int] = HEAD_DIMS,
           variants: Iterable[str] = tuple(VARIANTS), dropouts: Iterable[float] = DROPOUTS,
           tiles: str = "first", log=None, bwds: Iterable[str] = BWDS, jobs: int = 1) -> List[dict]:
    """One row per (arch, dtype, head dim, variant, dropout, kernel, tile): the compile's
    resources and counts (see the module docstring); a kernel that does not compile is a row
    with ``error`` set; ``tried`` says whether the autotuner tries the tile for that launch
    (``False`` only with ``tiles="table"``).  The attention variants' backward is compiled on each path of ``bwds``
    (:data:`BWDS`; the forward once).  ``jobs > 1`` compiles in that many processes (the rows
    come back in the same order; each compile also lands in triton's cache, ``TRITON_CACHE_DIR``,
    under the key the JIT looks up at the same launch on a GPU of that arch with this triton).

    Raises:
        ValueError: unknown variant/dtype/backward path, ``tiles`` not one of :data:`TILES`, or ``jobs < 1``.
    """
    import fairseq_plugins.attention.triton as tk

    if tiles not in TILES:
        raise ValueError(f"tiles={tiles!r}; valid choices: {', '.join(TILES)}")
    if jobs < 1:
        raise ValueError(f"jobs must be >= 1, got {jobs}")
    real = tk._kernels(False)
    table = _tables(real)
    tasks = []
    for dtype in dtypes:
        for d in head_dims:
            for variant in variants:
                for p in dropouts:
                    family = VARIANTS[variant][0]
                    if family in _FIXED and p > 0:
                        continue  # no dropout in the norm and the row terms
                    recorded, seen = [], set()
                    for bwd in (bwds if family not in _FIXED else BWDS[:1]):
                        for launch in launches(variant, p, dtype, d, bwd):
                            if launch[0] not in seen:
                                seen.add(launch[0])
                                recorded.append(launch)
                    for arch in archs:
                        for name, args, meta in recorded:
                            kind, tried = "kernels", None
                            if name in KERNELS["norm"]:  # fixed tiles: the launch's own
                                kind, meta = "norm", dict(meta)
                                tile_list = [(meta.pop("BLOCK_M"), meta.pop("BLOCK_N"), meta.pop("num_warps", 4), 1)]
                            elif name in KERNELS["stats"]:  # BLOCK rows per program, the launch's own
                                kind, meta = "stats", dict(meta)
                                tile_list = [(meta.pop("BLOCK"), 1, meta.pop("num_warps", 4), 1)]
                            else:
                                tried = real._tried(table[name], meta, arch=arch)  # the autotuner's candidates
                                tile_list = (list(table[name]) if tiles == "table" else
                                             tried if tiles == "all" else tried[:1])
                            for tile in tile_list:
                                shown = tile[:1] + (() if kind == "stats" else  # rows: "1024"
                                                    ((meta["BLOCK_G"],) if "BLOCK_G" in meta else ()) + tile[1:2])
                                row = dict(arch=arch, dtype=dtype, head_dim=d, variant=variant, dropout=p,
                                           kernel=name, tile="x".join(map(str, shown)), warps=tile[2],
                                           stages=tile[3], error=None,
                                           tried=tried is None or tuple(tile) in map(tuple, tried))
                                # detached: the same storage, offsets and strides (the binder's
                                # specialisation), and picklable for the worker processes
                                plain = tuple(x.detach() if hasattr(x, "detach") else x for x in args)
                                tasks.append((row, kind, name, plain, meta, arch, tuple(tile), d))
    rows = []
    if jobs == 1:
        results = map(_compile_row, tasks)
    else:
        import concurrent.futures
        import multiprocessing

        pool = concurrent.futures.ProcessPoolExecutor(max_workers=jobs, mp_context=multiprocessing.get_context("spawn"))
        results = pool.map(_compile_row, tasks, chunksize=1)
    try:
        for row in results:
            rows.append(row)
            if log is not None:
                print(_row_line(row), file=log, flush=True)
    finally:
        if jobs > 1:
            pool.shutdown(cancel_futures=True)
    return rows


_MODULES: Dict[str, object] = {}


def _compile_row(task) -> dict:
    """One task of :func:`report` (``(row, module kind, kernel, args, meta, arch, tile, head dim)``):
    the row with the compile's resources and counts, or with ``error`` set.  Runs in a worker
    process with ``jobs > 1`` (the compiled modules are built once per process)."""
    row, kind, name, args, meta, arch, tile, d = task
    row = dict(row)
    if kind not in _MODULES:
        import fairseq_plugins.attention.triton as tk

        _MODULES[kind] = {"kernels": lambda: tk._kernels(False), "norm": _norm_real, "stats": _stats_real}[kind]()
    t0 = time.time()
    try:
        c = compile_launch(_MODULES[kind], name, args, meta, arch, tile)
    except Exception as e:  # noqa: BLE001 - reported, not hidden
        row["error"] = f"{type(e).__name__}: {str(e).strip().splitlines()[0][:200]}"
    else:
        row.update(target=c["target"], shared=c["shared"], gemms=c["gemms"], **parse_ptxas_log(c["ptxas_log"]))
        trips = _inner_trips(name, meta, d)
        whole = kind == "stats"  # one pass, no loop: the whole kernel is the "loop"
        row.update(analyse_ptx(c["ptx"], inner_trips=trips, whole=whole), inner_trips=trips)
        threads = 32 * tile[2]
        # per score; the norm: per element of its (BLOCK_M, BLOCK_G, BLOCK_N) tile; the row terms:
        # per row (tile (BLOCK, 1))
        per = tile[0] * tile[1] * meta.get("BLOCK_G", 1)
        row["per_score"] = threads / per  # loop counts -> per score
        row["ptx_per_score"] = round(row["loop_dynamic"] * threads / per, 2)
        row.update(analyse_sass(c["sass"], inner_trips=trips, whole=whole))
        # SASS per score only where its loop nest matches the PTX's (ptxas may unroll a loop)
        same_nest = row["sass_loops_nested"] == len(row["inner_loops"])
        row["sass_per_score"] = round(row["sass_loop"] * threads / per, 2) if row["sass_loop"] and same_nest else None
    row["compile_s"] = round(time.time() - t0, 1)
    return row


def _inner_trips(name: str, meta: dict, d: int):
    """Trip counts of the loops nested in a kernel's main loop, in PTX order: E-ATT's L1
    distance runs ``BLOCK_D / CHUNK`` chunk steps (``_kernels._l1``), the backward kernels' sign
    sums then ``BLOCK_D / CHUNK`` chunk steps too (``_kernels._l1_sgn``); the other kernels have no
    nested loop."""
    if not name.startswith("l1"):
        return 1
    return [meta["BLOCK_D"] // meta.get("CHUNK", 1)] * 2


def _row_line(r: dict) -> str:
    head = (f"sm_{r['arch']} {r['dtype']} d{r['head_dim']} {r['variant']} p{r['dropout']:g} {r['kernel']} "
            f"{r['tile']} w{r['warps']} s{r['stages']}")
    if r["error"]:
        return f"{head}: ERROR {r['error']}"
    return (f"{head}: regs {r['registers']} spill {r['spill_stores']}/{r['spill_loads']} smem {r['shared']} "
            f"gemms {r.get('gemms', '?')} wgmma {r['loop_wgmma']}/{r['wgmma']} mma {r['loop_mma']}/{r['mma']} "
            f"loop {r['loop_dynamic']} "
            f"({r['ptx_per_score']}/score) warn {len(r['warnings'])} [{r['compile_s']} s]")


def problems(rows: List[dict]) -> List[str]:
    """The rows that break the targets: a compile error, spills, or a ``wgmma ... serialized``
    warning; one line each (empty: none)."""
    bad = []
    for r in rows:
        if r["error"]:
            bad.append(f"{_row_line(r)}")
        elif r["spill_stores"] or r["spill_loads"] or any("serializ" in w for w in r["warnings"]):
            bad.append("; ".join([_row_line(r)] + r["warnings"]))
    return bad


def _is_main(r: dict) -> bool:
    """A main-configuration row (:data:`MAIN`) of a tile the autotuner tries."""
    return (r["arch"] == MAIN["arch"] and r["dtype"] in MAIN["dtypes"] and r["head_dim"] in MAIN["head_dims"]
            and r["variant"] in MAIN["variants"] and r.get("tried", True))


def known_exception(r: dict) -> Optional[str]:
    """Why a main-configuration row is a :data:`KNOWN` exception to the targets (``None``: it is
    not one; compile errors never are)."""
    known = KNOWN.get((r["variant"], r["head_dim"], r["dropout"]))
    if _is_main(r) and not r["error"] and known and r["kernel"] == known[0]:
        return known[1]
    return None


def main_problems(rows: List[dict]) -> Tuple[List[str], Dict[str, List[str]]]:
    """:func:`problems` of the main-configuration rows, split into ``(new, known)``: ``new`` the
    lines of rows that are no :data:`KNOWN` exception, ``known`` ``{why: [lines]}`` of those that are."""
    new, known = [], {}
    for r in rows:
        if not _is_main(r):
            continue
        for line in problems([r]):
            why = known_exception(r)
            if why:
                known.setdefault(why, []).append(line)
            else:
                new.append(line)
    return new, known


def _warn_codes(ws: List[str]) -> str:
    codes = []
    for w in ws:
        m = re.search(r"\(?(C\d{4})\)?", w)
        code = m.group(1) if m else w[:40]
        if "serializ" in w:
            code += " wgmma serialized"
        if code not in codes:
            codes.append(code)
    return ", ".join(codes)


def _tile_key(r: dict) -> tuple:
    """A compile's configuration without its dropout: arch, dtype, head dim, variant, kernel and
    the whole tile (``BLOCK_M x BLOCK_N``, warps, stages)."""
    return r["arch"], r["dtype"], r["head_dim"], r["variant"], r["kernel"], r["tile"], r["warps"], r["stages"]


def _dropout_overhead(rows: List[dict]) -> List[str]:
    """Markdown rows: PTX (and SASS, where :func:`analyse_sass` counted it) per score of each kernel
    with dropout > 0 vs 0 in the same tile (warps and stages included; a tile tried only with one
    of them has no row)."""
    base = {_tile_key(r): r for r in rows if not r["error"] and r["dropout"] == 0}
    out = []
    for r in rows:
        if r["error"] or r["dropout"] == 0:
            continue
        b = base.get(_tile_key(r))
        if b is None or not b["ptx_per_score"]:
            continue
        extra = 100.0 * (r["ptx_per_score"] / b["ptx_per_score"] - 1.0)
        sa, sb = b.get("sass_per_score"), r.get("sass_per_score")
        sass = f"{sa} | {sb} | {100.0 * (sb / sa - 1.0):+.0f} %" if sa and sb else "n/a | n/a | n/a"
        out.append(f"| sm_{r['arch']} | {r['dtype']} | {r['head_dim']} | {r['variant']} | {r['kernel']} "
                   f"| {r['tile']} {r['warps']}/{r['stages']} | {b['ptx_per_score']} | {r['ptx_per_score']} "
                   f"| {extra:+.0f} % | {sass} | {_opcode_delta(b, r)} |")
    return out


def opcode_delta(base: dict, row: dict, top: int = 6) -> List[Tuple[str, float]]:
    """The ``top`` opcodes whose main-loop count per score changes most from ``base`` to ``row``
    (two rows of :func:`report`, e.g. dropout 0 and 0.1 in the same tile): ``[(opcode, change per
    score)]``, largest absolute change first; [] when either row has no opcode counts."""
    a, b = base.get("loop_opcodes") or {}, row.get("loop_opcodes") or {}
    if not a or not b:
        return []
    delta = {op: b.get(op, 0) * row["per_score"] - a.get(op, 0) * base["per_score"] for op in set(a) | set(b)}
    ranked = sorted(delta.items(), key=lambda kv: (-abs(kv[1]), kv[0]))
    return [(op, round(v, 2)) for op, v in ranked[:top] if round(v, 2)]


def _opcode_delta(base: dict, row: dict) -> str:
    return ", ".join(f"{op} {v:+g}" for op, v in opcode_delta(base, row))


def tile_choices(rows: List[dict]) -> List[dict]:
    """Per launch compiled in several tiles (``--tiles all``): the first tile the autotuner tries
    and the spill-free one with the fewest PTX instructions per score, ``{"first": row, "best":
    row or None, "clean": spill-free count, "tiles": compiled count}`` (first-seen order; tiles
    the autotuner does not try, ``--tiles table``, are left out)."""
    groups: Dict[tuple, List[dict]] = {}
    for r in rows:
        if not r.get("tried", True):
            continue
        groups.setdefault((r["arch"], r["dtype"], r["head_dim"], r["variant"], r["dropout"], r["kernel"]), []).append(r)
    out = []
    for rs in groups.values():
        if len(rs) < 2:
            continue
        clean = [r for r in rs if not r["error"] and not (r["spill_stores"] or r["spill_loads"])]
        best = min(clean, key=lambda r: r["ptx_per_score"]) if clean else None
        out.append(dict(first=rs[0], best=best, clean=len(clean), tiles=len(rs)))
    return out


def _tile_lines(rows: List[dict]) -> List[str]:
    """Markdown section of :func:`tile_choices` (empty when every launch has one tile)."""
    choices = tile_choices(rows)
    if not choices:
        return []
    lines = ["", "## Tiles: the first tried vs the best spill-free one", "",
             "Per launch, all the tiles the autotuner tries (`--tiles all`): the first one (what the targets "
             "check) and the spill-free tile with the fewest PTX instructions per score. On a GPU the autotuner "
             "times every tried tile and keeps the fastest, so a spilling first tile costs only if nothing "
             "faster is tried.", "",
             "| arch | dtype | d | variant | p | kernel | first tile w/s | spill | /score | spill-free tiles "
             "| best spill-free w/s | /score | best / first |",
             "|---|---|---:|---|---:|---|---|---:|---:|---:|---|---:|---:|"]
    for c in choices:
        f, b = c["first"], c["best"]
        head = (f"| sm_{f['arch']} | {f['dtype']} | {f['head_dim']} | {f['variant']} | {f['dropout']:g} | {f['kernel']} "
                f"| {f['tile']} {f['warps']}/{f['stages']} ")
        if f["error"]:
            head += "| error | - "
        else:
            head += f"| {f['spill_stores']}/{f['spill_loads']} | {f['ptx_per_score']} "
        head += f"| {c['clean']} of {c['tiles']} "
        if b is None:
            lines.append(head + "| none | - | - |")
        else:
            ratio = (f"{b['ptx_per_score'] / f['ptx_per_score']:.2f}" if not f["error"] and f["ptx_per_score"]
                     else "-")
            lines.append(head + f"| {b['tile']} {b['warps']}/{b['stages']} | {b['ptx_per_score']} | {ratio} |")
    return lines


#: each family's fused backward kernel and its split pair (:data:`BWDS`)
_FUSED_SPLIT = {"rect_bwd": ("rect_bwd_kv", "rect_bwd_q"), "l1_bwd": ("l1_bwd_kv", "l1_bwd_q")}


def bwd_comparison(rows: List[dict]) -> List[dict]:
    """Each family's two backward paths side by side: per (arch, dtype, head dim, variant,
    dropout) with rows of the fused kernel (``rect_bwd``, ``l1_bwd``) and both of its split
    kernels (the first tile of each, without errors), ``{"arch", "dtype", "head_dim", "variant",
    "dropout", "fused": row, "kv": row, "q": row, "split_per_score": kv + q PTX per score,
    "ratio": fused / split per score, "sass_ratio": the same in SASS (None where a count is
    missing)}``."""
    pair_of = {k: f for f, ks in _FUSED_SPLIT.items() for k in (f, *ks)}
    by: Dict[tuple, Dict[str, dict]] = {}
    for r in rows:
        if not r["error"] and r["kernel"] in pair_of:
            key = (r["arch"], r["dtype"], r["head_dim"], r["variant"], r["dropout"], pair_of[r["kernel"]])
            by.setdefault(key, {}).setdefault(r["kernel"], r)
    out = []
    for key, ks in by.items():
        fused, (kv_name, q_name) = key[-1], _FUSED_SPLIT[key[-1]]
        if fused in ks and kv_name in ks and q_name in ks:
            f, kv, q = ks[fused], ks[kv_name], ks[q_name]
            split = round(kv["ptx_per_score"] + q["ptx_per_score"], 2)
            sass = [x.get("sass_per_score") for x in (f, kv, q)]
            out.append(dict(zip(("arch", "dtype", "head_dim", "variant", "dropout"), key[:-1]), fused=f,
                            kv=kv, q=q, split_per_score=split,
                            ratio=round(f["ptx_per_score"] / split, 3) if split else None,
                            sass_ratio=round(sass[0] / (sass[1] + sass[2]), 3) if all(sass) else None))
    return out


def issue_bound(rows: List[dict], T: int, core_rows: Optional[int] = None, gpu: Dict = H100_SXM) -> List[dict]:
    """A lower bound on E-ATT's attention-core time from its instruction counts alone: the time
    ``gpu`` needs just to *issue* the main loops' SASS of ``l1_fwd`` + the backward (split:
    ``l1_bwd_kv`` + ``l1_bwd_q``; fused: ``l1_bwd``), one forward + backward, for every score of
    ``mt-bench-gpu``'s core section at length ``T``
    (``core_rows x T`` query-key pairs, non-causal), and the same for an ideal kernel issuing
    :data:`IDEAL_L1_PER_DIM` instructions per score and head dimension.  Arithmetic, not a
    measurement: it ignores memory, latency and everything outside the loops, so real kernels are
    slower; a GPU run (``mt-bench-gpu --sections core``) gives the measured time.

    Args:
        rows: report rows (:func:`report`); used: sm_90a ``eatt_enc`` rows of E-ATT's kernels
            (first tile each) with a SASS count.
        T: sequence length (T = S).
        core_rows: ``B*H*T`` (default ``mt-bench-gpu``'s :data:`~mt_pipeline.bench_gpu.CORE_ROWS`).
        gpu: ``{"sms", "lanes", "ghz"}`` (default :data:`H100_SXM`).

    Returns:
        per (dtype, head dim, dropout, backward path) with all of the path's kernels: ``{"dtype",
        "head_dim", "dropout", "bwd"`` (``"split"``/``"fused"``), ``"sass_per_score"`` (the sum),
        ``"ms"`` (the bound, milliseconds), ``"ideal_ms"`` (low, high)``}``.
    """
    if core_rows is None:
        from .bench_gpu import CORE_ROWS as core_rows
    pairs = core_rows * T
    rate = gpu["sms"] * gpu["lanes"] * gpu["ghz"] * 1e9  # thread-instructions per second
    by: Dict[tuple, Dict[str, dict]] = {}
    for r in rows:
        if (r["arch"] == 90 and r["variant"] == "eatt_enc" and not r["error"]
                and r["kernel"] in KERNELS["l1softmax"] and r.get("sass_per_score")):
            by.setdefault((r["dtype"], r["head_dim"], r["dropout"]), {}).setdefault(r["kernel"], r)
    out = []
    for (dtype, d, p), ks in sorted(by.items()):
        for bwd, names in (("split", ("l1_fwd", "l1_bwd_kv", "l1_bwd_q")), ("fused", ("l1_fwd", "l1_bwd"))):
            if not all(k in ks for k in names):
                continue
            sass = sum(ks[k]["sass_per_score"] for k in names)
            out.append({"dtype": dtype, "head_dim": d, "dropout": p, "bwd": bwd, "sass_per_score": round(sass, 1),
                        "ms": sass * pairs / rate * 1e3,
                        "ideal_ms": tuple(n * d * pairs / rate * 1e3 for n in IDEAL_L1_PER_DIM)})
    return out


def _issue_bound_lines(rows: List[dict]) -> List[str]:
    """Markdown section of :func:`issue_bound` at :data:`BOUND_T` (empty without E-ATT's sm_90a rows)."""
    from .bench_gpu import CORE_ROWS

    per_t = {t: issue_bound(rows, t) for t in BOUND_T}
    if not per_t[BOUND_T[0]]:
        return []
    g = H100_SXM
    lines = ["", "## What the CUDA cores allow E-ATT (arithmetic, not a measurement)", "",
             f"Issue bound: the time an H100 SXM needs just to issue the main loops' SASS of `l1_fwd` + the backward "
             f"(split: `l1_bwd_kv` + `l1_bwd_q`; fused: `l1_bwd`), one forward + backward, for every score of `mt-bench-gpu`'s core section (B*H*T = "
             f"{CORE_ROWS}, T = S, non-causal): SASS per score x {CORE_ROWS} x T / ({g['sms']} SMs x {g['lanes']} "
             f"lanes x {g['ghz']} GHz). Ideal: a kernel issuing only the L1 arithmetic, "
             f"{IDEAL_L1_PER_DIM[0]}-{IDEAL_L1_PER_DIM[1]} instructions per score and head dimension "
             "(`IDEAL_L1_PER_DIM` in `mt_pipeline/kernel_report.py`: an assumption). Memory, latency and "
             "everything outside the loops are ignored: a real kernel is slower than its bound. Compare with "
             "a measured core time (`mt-bench-gpu --sections core`, e.g. SDPA flash's).", "",
             "| dtype | d | p | backward | SASS /score (fwd + bwd) | " + " | ".join(
                 f"bound T {t} | ideal T {t}" for t in BOUND_T) + " |",
             "|---|---:|---:|---|---:|" + "---:|---:|" * len(BOUND_T)]
    for i, b in enumerate(per_t[BOUND_T[0]]):
        cells = []
        for t in BOUND_T:
            x = per_t[t][i]
            cells += [f"{x['ms']:.1f} ms", f"{x['ideal_ms'][0]:.1f}-{x['ideal_ms'][1]:.1f} ms"]
        lines.append(f"| {b['dtype']} | {b['head_dim']} | {b['dropout']:g} | {b['bwd']} | {b['sass_per_score']} | "
                     + " | ".join(cells) + " |")
    return lines


def _bwd_lines(rows: List[dict]) -> List[str]:
    """Markdown section of :func:`bwd_comparison` (empty without both paths)."""
    comp = bwd_comparison(rows)
    if not comp:
        return []
    lines = ["", "## Backward: fused vs split", "",
             "Rectified -- fused: `rect_bwd`, one program per key tile, 5 GEMMs per (query tile, key tile), dQ by "
             "atomic adds into float32 (the default unless `torch.use_deterministic_algorithms(True)`); split: "
             "`rect_bwd_kv` + `rect_bwd_q` (4 + 3 GEMMs: x and dP computed in both), deterministic. "
             "E-ATT -- fused: `l1_bwd`, one program per key tile computes the L1 distance, P, dP and the signed "
             "terms once and sums them over queries (dK) and, by atomic adds into float32, over keys (dQ); split "
             "(the default until timed on a GPU): `l1_bwd_kv` + `l1_bwd_q`, each computing the distance, P and dP. "
             "GEMMs: `tl.dot` per main-loop iteration; wgmma: instructions per iteration (kv + q: each kernel's "
             "own tile; + mma: GEMMs lowered to mma.sync, e.g. a 32-row one); /score: PTX per score (split: the "
             "sum of both kernels'); SASS fused / split: the same ratio in machine code.", "",
             "| arch | dtype | d | variant | p | fused tile w/s | regs | spill | smem KiB | GEMMs | wgmma "
             "| /score | split tiles w/s (kv; q) | regs | spill | smem KiB | GEMMs | wgmma | /score | fused / split "
             "| SASS fused / split |",
             "|---|---|---:|---|---:|---|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    def mma(r):
        return f"{r['loop_wgmma']}" + (f" (+{r['loop_mma']} mma)" if r["loop_mma"] else "")

    for c in comp:
        f, kv, q = c["fused"], c["kv"], c["q"]
        lines.append(
            f"| sm_{c['arch']}{'a' if c['arch'] == 90 else ''} | {c['dtype']} | {c['head_dim']} | {c['variant']} | {c['dropout']:g} "
            f"| {f['tile']} {f['warps']}/{f['stages']} | {f['registers']} | {f['spill_stores']}/{f['spill_loads']} "
            f"| {f['shared'] / 1024:.1f} | {f.get('gemms', '?')} | {mma(f)} | {f['ptx_per_score']} "
            f"| {kv['tile']} {kv['warps']}/{kv['stages']}; {q['tile']} {q['warps']}/{q['stages']} "
            f"| {kv['registers']}/{q['registers']} "
            f"| {kv['spill_stores'] + q['spill_stores']}/{kv['spill_loads'] + q['spill_loads']} "
            f"| {kv['shared'] / 1024:.1f}/{q['shared'] / 1024:.1f} | {kv.get('gemms', '?')}+{q.get('gemms', '?')} "
            f"| {mma(kv)}+{mma(q)} | {c['split_per_score']} "
            f"| {c['ratio'] if c['ratio'] is not None else '-'} "
            f"| {c['sass_ratio'] if c.get('sass_ratio') is not None else 'n/a'} |")
    return lines


def render(rows: List[dict], record: dict) -> str:
    """The Markdown report: the targets' verdict, the dropout overhead, one table per arch, and
    the provenance section."""
    gpus = {90: "H100 (sm_90a)", 80: "A100 (sm_80)"}
    archs = sorted({r["arch"] for r in rows}, reverse=True)
    lines = [f"# Fused attention kernels compiled for {' and '.join(gpus.get(a, f'sm_{a}') for a in archs) or 'no GPU'}",
             "",
             "**Regime: benchmark** (compiled-code metrics, no GPU run): neither smoke, converged nor paper "
             "scale; no translation, no seeds.", "",
             "Generated by `mt-kernel-report` (`mt_pipeline/kernel_report.py`: how the numbers are made). "
             "Every kernel launch of one forward + backward, specialised as the JIT does (unit strides "
             "constant, 16-divisible pointers/strides/sizes), compiled offline with triton's ptxas. "
             f"Launch shape B {SHAPE['B']}, H {SHAPE['H']}, T = S = {SHAPE['T']}, q/k/v in the model's layout. "
             "regs: registers per thread; spill: bytes stored/loaded; smem: shared memory (KiB); "
             "wgmma/mma: in the main loop / in the kernel; loop PTX: instructions of one main-loop "
             "iteration (nested loops x their trip counts: E-ATT's L1 distance x d/CHUNK chunks, its backward "
             "sign sums x d/CHUNK chunks too); /score: that x threads / (BLOCK_M x BLOCK_N). "
             "Variants: `*_enc` key padding mask (B,1,1,S); `*_dec` padding | future mask (B,1,T,S) as "
             "decoder self-attention passed it before the seam change (issue 28); `*_causal` key padding + "
             "`causal=True`, as decoder self-attention passes it since; "
             "`rela_g_norm` / `rela_g_norm_head`: ReLA-g's fused gated RMSNorm on (T, B, H*d), statistics over "
             "C / per head, its own fixed tile BLOCK_M x BLOCK_G x BLOCK_N, /score per element, no dropout. "
             "`reluformer_terms`: ReLUFormer's eq. 7 row terms on the float32 (B, H, T) row sums of a causal "
             "key-padded call (n (B, 1, T), query padding (B, T)), one pass of BLOCK rows per program (tile: "
             "BLOCK; loop PTX: the whole kernel), /score per row, no dropout; independent of d and of the "
             "dtype (the same compile under each).", ""]
    bad, known = main_problems(rows)
    lines += ["## Targets", "",
              f"Main configurations (sm_90a, {'/'.join(MAIN['dtypes'])}, d {'/'.join(map(str, MAIN['head_dims']))}, "
              f"{', '.join(MAIN['variants'])}; dropout 0 and 0.1): no spills, no serialized wgmma, everything compiles.", ""]
    if not any(r["arch"] == MAIN["arch"] and r["dtype"] in MAIN["dtypes"] for r in rows):
        lines.append("- not measured in this run")
    else:
        lines += [f"- FAIL: {b}" for b in bad]
        if known:
            n = sum(map(len, known.values()))
            lines.append(f"- {'the rest met' if bad else 'met'}, except {n} known exception(s) "
                         "(`KNOWN` in `mt_pipeline/kernel_report.py`; `--check` passes them):")
            for why, rs in known.items():
                lines.append(f"  - known: {why}:")
                lines += [f"    - {k}" for k in rs]
        elif not bad:
            lines.append("- met")
    for arch in sorted({r["arch"] for r in rows} - {MAIN["arch"]}, reverse=True):
        of = [r for r in rows if r["arch"] == arch and r.get("tried", True)]
        spill = sum(1 for r in of if not r["error"] and (r["spill_stores"] or r["spill_loads"]))
        err = sum(1 for r in of if r["error"])
        lines.append(f"- sm_{arch} (no target: the autotuner times every tried tile there): {spill} of {len(of)} "
                     f"compiles spill, {err} fail to compile")
    left = [r for r in rows if not r.get("tried", True)]
    if left:
        free = [r for r in left if not r["error"] and not (r["spill_stores"] or r["spill_loads"])]
        lines.append(f"- tiles the autotuner leaves out (`--tiles table`, marked \"not tried\"; outside the targets): "
                     f"{len(left)} compiles, {len(left) - len(free)} spill or fail to compile"
                     + ("; spill-free now, so no longer a reason to leave them out: "
                        + "; ".join(f"sm_{r['arch']} {r['dtype']} d {r['head_dim']} {r['variant']} p {r['dropout']:g} "
                                    f"{r['kernel']} {r['tile']} w{r['warps']} s{r['stages']}" for r in free)
                        if free else ""))
    over = _dropout_overhead(rows)
    if over:
        lines += ["", "## Dropout overhead (target: <= +25 % PTX per score)", "",
                  "Largest changes: the main-loop opcodes (type and rounding suffixes dropped) whose count per "
                  "score changes most with dropout -- where the overhead goes (Philox-4x32-7: `mul.hi`, `xor`; "
                  "the keep mask: `setp`, `selp`, `and`; a mask moved between register layouts through shared "
                  "memory: `st.shared`, `ld.shared`, `bar`).  SASS: the same loop in the machine code ptxas "
                  "makes of it (`nvdisasm`; ptxas fuses `xor` pairs into `LOP3` and multiplies into `IMAD`): "
                  "what the GPU issues; the target is stated in PTX.  n/a: ptxas changed the loop nest "
                  "(unrolled a nested loop), so the counts would not compare.", "",
                  "| arch | dtype | d | variant | kernel | tile w/s | /score p=0 | /score p=0.1 | extra "
                  "| SASS /score p=0 | SASS p=0.1 | SASS extra | largest changes /score (PTX) |",
                  "|---|---|---|---|---|---|---:|---:|---:|---:|---:|---:|---|", *over]
    lines += _bwd_lines(rows)
    lines += _issue_bound_lines(rows)
    lines += _tile_lines(rows)
    for arch in sorted({r["arch"] for r in rows}, reverse=True):
        lines += ["", f"## sm_{arch}{'a' if arch == 90 else ''}", "",
                  "| dtype | d | variant | p | kernel | tile w/s | regs | spill | smem KiB | wgmma | mma "
                  "| loop PTX | /score | SASS /score | ptxas warnings |",
                  "|---|---:|---|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
        for r in rows:
            if r["arch"] != arch:
                continue
            head = (f"| {r['dtype']} | {r['head_dim']} | {r['variant']} | {r['dropout']:g} | {r['kernel']} "
                    f"| {r['tile']} {r['warps']}/{r['stages']}{'' if r.get('tried', True) else ' (not tried)'} ")
            if r["error"]:
                lines.append(head + f"| error: {r['error']} | | | | | | | | | |")
                continue
            trips = r.get("inner_trips", 1)
            trips = list(trips) if isinstance(trips, (list, tuple)) else [trips]
            inner = (" (" + ", ".join(f"+{n} x {trips[min(i, len(trips) - 1)]}" for i, n in enumerate(r["inner_loops"]))
                     + ")") if r["inner_loops"] else ""
            lines.append(head + f"| {r['registers']} | {r['spill_stores']}/{r['spill_loads']} "
                         f"| {r['shared'] / 1024:.1f} | {r['loop_wgmma']}/{r['wgmma']} | {r['loop_mma']}/{r['mma']} "
                         f"| {r['loop_instructions']}{inner} | {r['ptx_per_score']} "
                         f"| {r.get('sass_per_score') or 'n/a'} | {_warn_codes(r['warnings'])} |")
    lines += ["", provenance.markdown(record)]
    return "\n".join(lines)


def _csv(text: str, cast=str) -> list:
    return [cast(x) for x in text.split(",") if x.strip()]


def main(argv=None) -> int:
    """Entry point of ``mt-kernel-report`` / ``scripts/kernel_report.py``; returns the exit status
    (2 when triton or its NVIDIA backend is missing, 1 with ``--check`` when a main-configuration
    row breaks the targets)."""
    p = argparse.ArgumentParser(prog="mt-kernel-report", description=__doc__.split("\n\n")[0])
    p.add_argument("--arch", default=",".join(map(str, ARCHS)), help="compute capabilities (90 = sm_90a, 80)")
    p.add_argument("--dtypes", default=",".join(DTYPES), help=f"comma list of {', '.join(DTYPES)}")
    p.add_argument("--head-dims", default=",".join(map(str, HEAD_DIMS)), help="comma list of head dimensions")
    p.add_argument("--variants", default=",".join(VARIANTS), help=f"comma list of {', '.join(VARIANTS)}")
    p.add_argument("--dropouts", default=",".join(map(str, DROPOUTS)), help="attention dropout values")
    p.add_argument("--bwd", default=",".join(BWDS),
                   help=f"rectified backward paths compiled (comma list of {', '.join(BWDS)}; default both)")
    p.add_argument("--tiles", default="first", choices=TILES,
                   help="tiles compiled per launch: the first the autotuner tries, all it tries, or the kernel's "
                        "whole table (those it leaves out as spilling marked 'not tried')")
    p.add_argument("--out", default=os.path.join(provenance.ROOT, "results", "gpu", "kernel_report.md"))
    p.add_argument("--json", default=None, help="also write the rows as JSON here")
    p.add_argument("--jobs", type=int, default=1,
                   help="compile in this many processes (the report is the same; default 1)")
    p.add_argument("--check", action="store_true",
                   help="exit 1 when a main configuration breaks the targets (other than the KNOWN exceptions)")
    a = p.parse_args(argv)
    try:
        archs, dtypes, dims = _csv(a.arch, int), _csv(a.dtypes), _csv(a.head_dims, int)
        variants, dropouts, bwds = _csv(a.variants), _csv(a.dropouts, float), _csv(a.bwd)
    except ValueError as e:
        p.error(str(e))
    bad = ([x for x in dtypes if x not in DTYPES] + [x for x in variants if x not in VARIANTS]
           + [x for x in archs if x not in ARCHS] + [x for x in bwds if x not in BWDS])
    if bad or not bwds:
        p.error(f"unknown {bad}; valid dtypes {', '.join(DTYPES)}; variants {', '.join(VARIANTS)}; "
                f"arch {', '.join(map(str, ARCHS))}; bwd {', '.join(BWDS)}")
    try:
        import triton
        import triton.backends.nvidia.compiler  # noqa: F401
    except Exception as e:  # noqa: BLE001
        print(f"mt-kernel-report: needs triton with its NVIDIA backend ({type(e).__name__}: {e})", file=sys.stderr)
        return 2
    os.environ.pop("TRITON_INTERPRET", None)
    record = provenance.collect(provenance.command_line("mt-kernel-report", argv), triton=triton.__version__)
    t0 = time.time()
    if a.jobs < 1:
        p.error(f"--jobs {a.jobs}: give a number of processes >= 1")
    rows = report(archs, dtypes, dims, variants, dropouts, a.tiles, log=sys.stderr, bwds=bwds, jobs=a.jobs)
    record["wall_s"] = round(time.time() - t0, 1)
    text = render(rows, record)
    write_text_atomic(a.out, text)
    if a.json:
        write_json_atomic(a.json, [{k: v for k, v in r.items()} for r in rows])
    print(f"wrote {provenance.repo_relative(a.out)} ({len(rows)} compiles)", file=sys.stderr)
    main_bad, known = main_problems(rows)
    for why, lines in known.items():
        for line in lines:
            print(f"target broken (known exception: {why}): {line}", file=sys.stderr)
    for line in main_bad:
        print(f"target broken: {line}", file=sys.stderr)
    return 1 if (a.check and main_bad) else 0


if __name__ == "__main__":
    sys.exit(main())
