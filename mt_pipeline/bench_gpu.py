"""GPU attention benchmark: the fused Triton kernels vs PyTorch, stock fairseq and SDPA flash.

Four measurements, every ratio against baselines measured *in the same run* (regime
``benchmark``; nothing here is a test and nothing is asserted):

1. **core** -- the attention core alone, ``B*H*T = 2**20`` query rows (``--core-rows``), d_h 64,
   H 8, forward + backward (``torch.autograd.grad`` w.r.t. q, k, v with a fixed upstream
   gradient): ``F.scaled_dot_product_attention`` (FlashAttention backend forced in half precision;
   the default SDPA backend in float32), ReLU attention (``relu_attention_reference``: the torch
   path; ``triton.relu_attention``), ReLUFormer eq. 6 with the eq. 7 row terms (torch:
   ``kernels.relu_attention``; Triton), E-ATT L1 softmax (torch: ``cdist`` + softmax; Triton);
2. **layer** -- one self-attention layer (C 512, H 8, ``--tokens`` 16,384 tokens per batch,
   ``B = tokens / T``), forward + backward: fairseq's stock ``MultiheadAttention`` (fused SDPA)
   and the plugin's ``FunctionalMultiheadAttention`` with every registered function, with
   ``--attention-backend torch`` and, where a fused kernel exists, ``triton``; speed relative to
   stock (> 1 is faster) and peak memory;
3. **decode** -- one incremental decoder self-attention step (one query, ``S`` cached keys, 64
   sentences x beam 5), forward only: stock vs each fused function on torch and Triton (the
   backend for decoding should be the faster one);
4. **train** (optional, ``--train-data DATA_BIN``) -- end-to-end ``fairseq-train`` tokens/s (median
   ``wps`` of the logged intervals after the first) of ``rela_transformer`` (Transformer base) with
   rela_g / reluformer / eatt in all attention types vs fairseq's stock ``transformer``, ``--fp16``
   (fairseq 0.12's ``fairseq-train --bf16`` implies ``--tpu`` and fails on a GPU).

The core section has a second baseline for ReLU attention: torch's FlexAttention
(``torch.compile(flex_attention)``) -- what a user would try first.  A softmax kernel computes
``softmax(score_mod(s)) V``; with ``score_mod(s) = log relu(s)`` (``-inf`` where ``s <= 0``) that is
``relu(s) V / sum relu(s)``, and multiplying by ``exp(lse)`` (``lse = log sum relu(s)``, returned by
FlexAttention) undoes the normalisation: ``relu(s) V`` (ReLA eq. 3 without the norm), null rows 0
(:func:`relu_flex`).

The layer section runs each attention *kind* as fairseq's Transformer calls it (``--layer-kinds``):
``enc`` encoder self-attention with a key padding mask ``(B, S)``; ``dec`` decoder self-attention
with fairseq's future mask (float ``-inf`` above the diagonal, ``(T, T)``) and a key padding mask;
``cross`` encoder-decoder attention (queries ``(T, B, C)``, keys/values the encoder output with its
padding).  Batches are right-padded with up to 1/8 padding per sentence (``B = tokens / T``
sentences, lengths ``T - (b mod 8) * ceil(T / 64)``), like fairseq's length-bucketed batches.
Each kind runs at every ``--attention-dropout`` rate (default 0 and 0.1, the papers' attention
dropout), because dropout and masks are what change a fused kernel's inner loop.

Every time is reported twice: the wall time of a step (``do_bench``: what training sees, launch
overhead and host work included) and the summed time of the GPU kernels the step launched
(``torch.profiler``, CUDA activity only, mean of 3 steps) -- at small T the difference is launch
overhead, not kernel speed.  Beside them: the CPU time to issue a step (``host``, :func:`host_ms`:
a step whose host time reaches its wall time is host-bound) and the host-device synchronisations
one step makes (:func:`sync_count`, shown when not 0).  float32 runs with TF32 matmuls (``--tf32``, default on:
``torch.backends.cuda.matmul.allow_tf32``, which the Triton kernels honour too), as fp32 training
on an Ampere/Hopper GPU would; ``--no-tf32`` measures IEEE fp32.

Timings: ``triton.testing.do_bench`` (CUDA events around synchronised calls; median over
``--rep`` ms of repetitions after ``--warmup`` ms of warm-up -- which also covers Triton's
autotuning).  Peak memory: ``torch.cuda.max_memory_allocated`` during one step minus the memory
allocated before it (inputs and parameters), in MiB.  A case that runs out of memory or fails
is reported as such (``OOM`` / ``error``), not skipped silently.

Writes ``results/gpu/attention_speed_<gpu>.md`` (``--out``) with a provenance section
(:mod:`mt_pipeline.provenance`) atomically (:mod:`mt_pipeline.atomic`).  Without CUDA it stops
with exit status 2 and a message (the numbers are GPU numbers).

Usage::

    mt-bench-gpu [--T 64,256,1024,2048,4096,8192] [--dtypes bf16,fp32] [--sections core,layer,decode]
                 [--layer-kinds enc,dec,cross] [--attention-dropout 0,0.1] [--no-tf32]
                 [--train-data data-bin/multi30k_en_de --src en --tgt de] [--out FILE]
"""

import argparse
import os
import re
import statistics
import subprocess
import sys
import time
from typing import Callable, Dict, List, Optional

import torch
import torch.nn.functional as F

from . import provenance
from .atomic import write_text_atomic
from .curves import progress_stats

__all__ = ["main", "DTYPES", "SECTIONS", "LAYER_KINDS", "FUSED", "core_cases", "layer_cases", "decode_cases",
           "relu_flex", "padding_mask", "measure", "kernel_ms", "host_profile", "count_sync_warnings", "render",
           "op_counts", "render_op_counts", "op_count_report", "NO_KERNEL_OPS",
           "parse_wps"]

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
SECTIONS = ("core", "layer", "decode", "train")
#: attention kinds of the layer section -> description (how fairseq's Transformer calls them)
LAYER_KINDS = {"enc": "encoder self-attention (key padding)",
               "dec": "decoder self-attention (future mask + key padding)",
               "cross": "encoder-decoder attention (key padding)"}
#: functions with a fused Triton kernel (measured on both backends in the layer/decode sections)
FUSED = ("relu", "rela_g", "reluformer", "eatt")
TRAIN_FNS = ("rela_g", "reluformer", "eatt")
Step = Callable[[], None]


# --------------------------------------------------------------------------------------------
# cases: each returns {label: zero-argument step}; steps run forward + backward (or decode)
# --------------------------------------------------------------------------------------------
def _flex_log_relu(score, b, h, q_idx, kv_idx):
    """FlexAttention ``score_mod``: ``log relu(s)``, ``-inf`` where ``s <= 0`` (the clamp keeps the
    gradient of the branch not taken finite: ``0 / 1e-30``, never ``0 / 0``)."""
    return torch.where(score > 0, torch.log(score.clamp_min(1e-30)), float("-inf"))


def relu_flex(q, k, v, scale: float, flex=None):
    """ReLU attention ``relu(scale q k^T) V`` (ReLA eq. 3 without the norm) through torch's
    FlexAttention: ``softmax(log relu(s)) V * exp(lse)`` (see the module docstring).

    Args:
        q ``(B, H, T, d)``, k, v ``(B, H, S, d)``; scale: the score scale (``d^-1/2``);
        flex: the ``flex_attention`` callable (``torch.compile(flex_attention)`` on a GPU; the
            eager one, forward only, on CPU) -- default: the eager one.

    Returns:
        ``(B, H, T, d)`` in the dtype of ``q``; rows without a positive score are 0 (their
        ``lse`` is ``-inf``).
    """
    from torch.nn.attention import flex_attention as fa

    flex = flex or fa.flex_attention
    if hasattr(fa, "AuxRequest"):  # torch >= 2.9: return_aux; return_lse is deprecated
        out, aux = flex(q, k, v, score_mod=_flex_log_relu, scale=scale, return_aux=fa.AuxRequest(lse=True))
        lse = aux.lse
    else:
        out, lse = flex(q, k, v, score_mod=_flex_log_relu, scale=scale, return_lse=True)
    return out * torch.exp(lse).unsqueeze(-1).to(out.dtype)


#: query rows ``B*H*T`` of the core section (``--core-rows``); also the shape of
#: :func:`mt_pipeline.kernel_report.issue_bound`'s lower bounds
CORE_ROWS = 2 ** 20


# the labels core_cases gives its steps (``--core-cases`` selects among them)
CORE_CASES = ("sdpa flash", "sdpa (default)", "relu torch", "reluformer+eq.7 torch", "eatt torch", "relu flex",
              "relu triton", "reluformer+eq.7 triton", "eatt triton")


def core_cases(T: int, dtype: torch.dtype, device, rows: int = CORE_ROWS, heads: int = 8,
               head_dim: int = 64, with_triton: bool = True, with_flex: bool = True) -> Dict[str, Step]:
    """Attention-core steps at ``B*H*T = rows`` (``B = rows / (H T)``, at least 1), ``S = T``;
    ``with_flex`` adds ``relu flex`` (:func:`relu_flex`, compiled; needs CUDA for its backward)."""
    from fairseq_plugins.attention import kernels

    B = max(1, rows // (heads * T))
    g = torch.Generator(device="cpu").manual_seed(0)
    q, k, v, go = (torch.randn(B, heads, T, head_dim, generator=g).to(device, dtype) for _ in range(4))
    for x in (q, k, v):
        x.requires_grad_()
    scale = head_dim ** -0.5
    qs = (q.detach() * scale).requires_grad_()
    r = torch.full((1, 1, T, 1), (2.0 / T) ** 0.5, device=device)  # ReLUFormer 1/sqrt(n/2), n = T

    def step(fn, qq=q):
        def run():
            out = fn(qq)
            if isinstance(out, tuple):  # (out, (row_sum, row_slogs)): eq. 7 terms enter the loss
                out, (rs, rl) = out
                loss = (out * go).sum() + rs.sum() + 1e-3 * rl.sum()
            else:
                loss = (out * go).sum()
            torch.autograd.grad(loss, (qq, k, v))
        return run

    def sdpa(qq):
        if dtype in (torch.float16, torch.bfloat16):
            from torch.nn.attention import SDPBackend, sdpa_kernel

            with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
                return F.scaled_dot_product_attention(qq, k, v)
        return F.scaled_dot_product_attention(qq, k, v)

    def eatt_torch(qq):
        from fairseq_plugins.attention.l1 import l1_scores

        w = torch.softmax(l1_scores(qq, k, scale, impl="auto").float(), -1).to(dtype)
        return w @ v

    r_cast = r.to(dtype)  # outside the timed step (the Triton case takes r as it is)
    cases = {
        "sdpa flash" if dtype != torch.float32 else "sdpa (default)": step(sdpa),
        "relu torch": step(lambda qq: kernels.relu_attention_reference(qq, k, v, 1.0), qs),
        "reluformer+eq.7 torch": step(lambda qq: kernels.relu_attention(qq, k, v, r_cast, need_stats=True), qs),
        "eatt torch": step(eatt_torch),
    }
    if with_flex:
        from torch.nn.attention.flex_attention import flex_attention

        compiled = torch.compile(flex_attention, dynamic=False)
        cases["relu flex"] = step(lambda qq: relu_flex(qq, k, v, 1.0, compiled), qs)
    if with_triton:
        from fairseq_plugins.attention import triton as tk

        cases["relu triton"] = step(lambda qq: tk.relu_attention(qq, k, v, 1.0), qs)
        cases["reluformer+eq.7 triton"] = step(lambda qq: tk.relu_attention(qq, k, v, r, need_stats=True), qs)
        cases["eatt triton"] = step(lambda qq: tk.l1_softmax_attention(qq, k, v, scale))
    return cases


def _module(name: Optional[str], backend: str, C: int, H: int, dtype, device, dropout: float,
            kind: str = "enc"):
    """Stock ``MultiheadAttention`` (``name`` None) or ``FunctionalMultiheadAttention(name)``, as
    self-attention (``kind`` enc / dec) or encoder-decoder attention (``cross``)."""
    from fairseq.modules import MultiheadAttention

    from fairseq_plugins.attention import FunctionalMultiheadAttention, build_attention_fn

    torch.manual_seed(0)
    roles = dict(self_attention=kind != "cross", encoder_decoder_attention=kind == "cross")
    if name is None:
        m = MultiheadAttention(C, H, dropout=dropout, **roles)
    else:
        fn = build_attention_fn(name, C, H, argparse.Namespace(attention_backend=backend))
        m = FunctionalMultiheadAttention(C, H, fn, dropout=dropout, **roles)
        fn.aux.enabled = name.startswith("reluformer")  # eq. 7 terms recorded, as in training
    return m.to(device=device, dtype=dtype).train()


def padding_mask(B: int, T: int, device) -> torch.Tensor:
    """Right padding of a length-bucketed batch: ``(B, T)`` bool, True = padding; sentence ``b`` has
    ``max(1, T - (b mod 8) * ceil(T / 64))`` tokens (about 1/8 padding at most, as in fairseq's
    length-bucketed batches; sentence 0 is unpadded, so the batch is ``T`` long)."""
    step = -(-T // 64)
    lengths = (T - (torch.arange(B) % 8) * step).clamp_min(1)
    return (torch.arange(T).unsqueeze(0) >= lengths.unsqueeze(1)).to(device)


def layer_cases(T: int, dtype, device, tokens: int = 16384, C: int = 512, H: int = 8,
                names=None, backends=("torch", "triton"), dropout: float = 0.0,
                kind: str = "enc") -> Dict[str, Step]:
    """Attention-layer steps (forward + backward) at ``B = tokens / T`` right-padded sentences
    (:func:`padding_mask`): ``stock`` and ``<function> <backend>`` for every function in ``names``
    (default: all registered), Triton only for functions with a kernel.  ``kind`` (one of
    :data:`LAYER_KINDS`) passes the masks fairseq's Transformer passes: ``enc`` key padding,
    ``dec`` future mask ``(T, T)`` (float, ``-inf`` above the diagonal) + key padding, ``cross``
    queries ``x`` and keys/values ``y`` (the encoder output, its padding as key padding).

    Raises:
        ValueError: unknown ``kind`` (the message lists :data:`LAYER_KINDS`).
    """
    from fairseq_plugins.attention import ATTENTION_FUNCTIONS, attention_fn_names

    if kind not in LAYER_KINDS:
        raise ValueError(f"unknown layer kind {kind!r}; valid: {', '.join(LAYER_KINDS)}")
    B = max(1, tokens // T)
    g = torch.Generator(device="cpu").manual_seed(0)
    x = torch.randn(T, B, C, generator=g).to(device, dtype).requires_grad_()
    y = torch.randn(T, B, C, generator=g).to(device, dtype).requires_grad_() if kind == "cross" else x
    go = torch.randn(T, B, C, generator=g).to(device, dtype)
    pad = padding_mask(B, T, device)
    future = torch.triu(torch.full((T, T), float("-inf"), device=device, dtype=dtype), 1) if kind == "dec" else None
    inputs = [x] if y is x else [x, y]

    def step(m):
        def run():
            out, _ = m(x, y, y, key_padding_mask=pad, attn_mask=future, need_weights=False)
            loss = (out * go).sum()
            fn = getattr(m, "attn_fn", None)
            if fn is not None and fn.aux.enabled:
                for total, _count, is_loss in fn.aux.pop().values():
                    if is_loss:
                        loss = loss + total
            torch.autograd.grad(loss, inputs + [p for p in m.parameters() if p.requires_grad])
        return run

    cases = {"stock": step(_module(None, "torch", C, H, dtype, device, dropout, kind))}
    for name in (names or attention_fn_names()):
        has_kernel = ATTENTION_FUNCTIONS[name].kernel_family is not None
        for b in backends:
            if b == "triton" and not has_kernel:
                continue
            label = f"{name} {b}" if has_kernel else name
            cases[label] = step(_module(name, b, C, H, dtype, device, dropout, kind))
    return cases


def decode_cases(S: int, dtype, device, sentences: int = 64, beam: int = 5, C: int = 512, H: int = 8,
                 names=FUSED, backends=("torch", "triton")) -> Dict[str, Step]:
    """One incremental self-attention step with ``S - 1`` cached keys (forward, no grad)."""
    bsz = sentences * beam
    g = torch.Generator(device="cpu").manual_seed(0)
    prefix = torch.randn(S - 1, bsz, C, generator=g).to(device, dtype)
    x = torch.randn(1, bsz, C, generator=g).to(device, dtype)

    def step(m):
        m.eval()
        base: Dict = {}
        with torch.no_grad():
            if S > 1:
                mask = torch.triu(torch.full((S - 1, S - 1), float("-inf"), device=device, dtype=dtype), 1)
                m(prefix, prefix, prefix, incremental_state=base, attn_mask=mask, need_weights=False)

        def run():
            state = {key: dict(val) for key, val in base.items()}  # the cache stays S - 1 long
            with torch.no_grad():
                m(x, x, x, incremental_state=state, need_weights=False)
        return run

    cases = {"stock": step(_module(None, "torch", C, H, dtype, device, 0.0))}
    for name in names:
        for b in backends:
            cases[f"{name} {b}"] = step(_module(name, b, C, H, dtype, device, 0.0))
    return cases


# --------------------------------------------------------------------------------------------
# measuring
# --------------------------------------------------------------------------------------------
def kernel_ms(run: Step, steps: int = 3) -> float:
    """Mean summed duration (ms) of the GPU kernels (and copies) one call of ``run`` launches:
    ``torch.profiler`` with CUDA activity only, over ``steps`` calls after one unprofiled call."""
    from torch.profiler import ProfilerActivity, profile

    run()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            run()
        torch.cuda.synchronize()
    total_us = 0.0
    for evt in prof.key_averages():
        total_us += float(getattr(evt, "self_device_time_total", None)
                          or getattr(evt, "self_cuda_time_total", 0.0) or 0.0)
    return total_us / 1000.0 / steps


def host_ms(run: Step, steps: int = 20) -> float:
    """Mean CPU time (ms) to issue one call of ``run``: ``steps`` calls timed with
    ``time.perf_counter`` after a synchronise, without synchronising between them, so the GPU
    runs behind (``steps`` x a step's launches stays far below CUDA's launch queue).  When it is
    close to the wall time of :func:`measure`, the step is host-bound: the GPU waits for Python,
    launches and autograd, not for kernels.  A synchronising call inside the step adds the GPU
    time before it (:func:`sync_count` finds those)."""
    import time

    cuda = torch.cuda.is_available()
    run()
    if cuda:
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(steps):
        run()
    dt = time.perf_counter() - t0
    if cuda:
        torch.cuda.synchronize()
    return dt * 1000.0 / steps


def sync_count(run: Step) -> int:
    """How many host-device synchronisations one call of ``run`` makes (``.item()``, ``bool()`` of
    a CUDA tensor, a copy to the host, ...): ``torch.cuda.set_sync_debug_mode("warn")`` warns at
    each; they are counted.  A step without any lets the host issue the next layer's work while
    the GPU runs (issue 28: no host sync anywhere in a layer)."""
    import warnings

    torch.cuda.synchronize()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            run()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()
    return count_sync_warnings(str(w.message) for w in caught)


def count_sync_warnings(messages) -> int:
    """How many of the warning ``messages`` (strings) are torch's per-sync warning ("called a
    synchronizing CUDA operation").  Setting the debug mode itself warns once per process that it
    "is a prototype feature" ("Synchronization debug mode ..."): no sync, not counted (the H200
    window of 2026-11-26 counted it in the first call of each pytest worker)."""
    return sum("called a synchronizing CUDA operation" in m for m in messages)


#: aten ops that launch no GPU kernel although their schema is not a view: allocation and
#: storage metadata (views -- ``view``, ``expand``, ``t``, ``detach``, ... -- are recognised by
#: ``OpOverload.is_view``)
NO_KERNEL_OPS = frozenset({"empty", "empty_strided", "empty_like", "new_empty", "new_empty_strided",
                           "resize_", "set_", "lift_fresh", "_unsafe_view"})


def op_counts(run: Step) -> Dict[str, int]:
    """The aten ops one call of ``run`` dispatches, by name (``"add"``, ``"sum"``, ...), forward and
    backward: counted below autograd by a ``TorchDispatchMode`` after one uncounted call, views and
    allocations (:data:`NO_KERNEL_OPS`) left out.  On a GPU each counted op is at least one kernel
    launch of 5-10 µs of host time (the H200 window of 2026-11-26: the reluformer layer was
    host-bound at 91 launches a step against stock's 15), so the count measures launch overhead
    on any device -- on CPU with the torch backend, or the Triton backend under
    ``TRITON_INTERPRET=1``, whose kernels run outside aten and are not counted (nor the copies
    the interpreter makes of their tensors: ops dispatched from ``triton/runtime/interpreter.py``)."""
    import collections

    from torch.utils._python_dispatch import TorchDispatchMode

    counts: "collections.Counter[str]" = collections.Counter()

    def _in_interpreter() -> bool:  # the interpreter copies a kernel's tensors in and out with aten ops
        f = sys._getframe(2)
        while f is not None:
            if f.f_code.co_filename.endswith(os.path.join("triton", "runtime", "interpreter.py")):
                return True
            f = f.f_back
        return False

    class _Count(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            name = func.overloadpacket.__name__
            if not func.is_view and name not in NO_KERNEL_OPS and not _in_interpreter():
                counts[name] += 1
            return func(*args, **(kwargs or {}))

    run()
    with _Count():
        run()
    return dict(counts)


def render_op_counts(rows: Dict[str, Dict[str, Dict[str, int]]], meta: Dict) -> str:
    """Markdown of ``--op-counts``: per layer kind, each case's ops per step, the ratio to stock's
    and its most frequent ops; ``rows`` = ``{kind description: {case label: op_counts(...)}}``."""
    lines = ["# aten ops per attention-layer step (launch overhead, measured without a GPU)", "",
             "**Regime: benchmark** (op counts, no timing): neither smoke, converged nor paper scale; "
             "no translation, no seeds. Generated by `mt-bench-gpu --op-counts` "
             "(`mt_pipeline/bench_gpu.py`: `op_counts`, `layer_cases`).", "",
             f"One forward + backward of one attention layer (C {meta['C']}, H {meta['H']}, T = S = {meta['T']}, "
             f"B {meta['B']}, right padding as in the layer section, attention dropout {meta['dropout']} (one table each); "
             "ReLUFormer's eq. 7 terms recorded and added to the loss, as in training) on "
             f"{meta['device']}: the aten ops dispatched below autograd, views and allocations left out. "
             "On a GPU each is at least one kernel launch (5-10 µs of host time); Triton kernels "
             "(the `triton` rows, run by the interpreter here) are not aten ops and are not counted "
             "-- they add their own launches (forward 1, backward 1-2 per attention, ReLA-g's norm 2).",
             ""]
    for kind, cases in rows.items():
        base = sum(cases["stock"].values()) if "stock" in cases else 0
        lines += [f"## {kind}", "", "| case | ops per step | vs stock | most frequent |", "|---|---:|---:|---|"]
        for label, counts in cases.items():
            n = sum(counts.values())
            top = ", ".join(f"{k} {v}" for k, v in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:8])
            ratio = f"{n / base:.2f}x" if base else "-"
            lines.append(f"| {label} | {n} | {ratio} | {top} |")
        lines.append("")
    lines.append(provenance.markdown(meta["provenance"]))
    return "\n".join(lines)


def host_profile(run: Step, steps: int = 10, top: int = 25) -> str:
    """Where the host time of one call of ``run`` goes (issue 28: every layer row was host-bound at
    16,384 tokens): ``torch.profiler`` (CPU + CUDA activity) ops sorted by self CPU time, then
    ``cProfile``'s Python functions sorted by their own time (autograd, Triton's autotuner and
    launcher, the plugin's Python), both over ``steps`` calls after one unprofiled call, in ms
    per call.  Returns the two tables as text (``--host-profile FILE`` appends them there)."""
    import cProfile
    import io
    import pstats

    from torch.profiler import ProfilerActivity, profile

    cuda = torch.cuda.is_available()
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    run()
    sync()
    with profile(activities=[ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])) as prof:
        for _ in range(steps):
            run()
        sync()
    ops = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=top)
    pr = cProfile.Profile()
    sync()
    pr.enable()
    for _ in range(steps):
        run()
    pr.disable()
    sync()
    buf = io.StringIO()
    st = pstats.Stats(pr, stream=buf)
    st.sort_stats("tottime").print_stats(top)
    total_ms = st.total_tt * 1000.0 / steps
    return (f"torch.profiler over {steps} calls (times are totals over the {steps} calls):\n{ops}\n"
            f"cProfile: {total_ms:.3f} ms of Python per call (profiled, so inflated), top {top} by own time "
            f"over {steps} calls:\n{buf.getvalue()}")


def measure(run: Step, warmup: int, rep: int) -> Dict[str, object]:
    """``{"ms": median wall ms, "kernel_ms": summed kernel ms (:func:`kernel_ms`), "host_ms": CPU ms
    to issue a step (:func:`host_ms`), "syncs": host syncs per step (:func:`sync_count`), "mib":
    peak extra MiB}`` or ``{"error": "OOM" | message}``."""
    import triton.testing

    try:
        run()  # compile / autotune outside the peak-memory measurement
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        run()
        torch.cuda.synchronize()
        mib = (torch.cuda.max_memory_allocated() - before) / 2**20
        ms = triton.testing.do_bench(run, warmup=warmup, rep=rep, return_mode="median")
        return {"ms": float(ms), "kernel_ms": kernel_ms(run), "host_ms": host_ms(run), "syncs": sync_count(run),
                "mib": float(mib)}
    except torch.cuda.OutOfMemoryError:
        return {"error": "OOM"}
    except Exception as e:  # noqa: BLE001 - reported in the table, the benchmark goes on
        return {"error": f"{type(e).__name__}: {str(e).splitlines()[0][:80] if str(e) else ''}"}
    finally:
        torch.cuda.empty_cache()


def parse_wps(log_text: str) -> Optional[float]:
    """Median ``wps`` (target tokens/s) of fairseq's JSON ``train_inner`` log lines (read by
    :func:`mt_pipeline.curves.progress_stats`, the one log reader), the first interval dropped
    (compilation, autotuning, allocator warm-up); None if there are none."""
    values = []
    for line in log_text.splitlines():
        stats = progress_stats(line, "train_inner")
        if stats and isinstance(stats.get("wps"), float):
            values.append(stats["wps"])
    values = values[1:] if len(values) > 1 else values
    return statistics.median(values) if values else None


def train_runs(data_bin, src, tgt, updates, max_tokens, fns=TRAIN_FNS) -> Dict[str, Dict]:
    """End-to-end ``fairseq-train`` tokens/s at ``--fp16`` (``--bf16`` implies ``--tpu`` in fairseq
    0.12): stock ``transformer`` and
    ``rela_transformer`` with each function (auto backend and torch backend)."""
    from fairseq_plugins.attention.functions import ATTENTION_FUNCTIONS

    root = provenance.ROOT
    common = [data_bin, "--task", "translation", "--source-lang", src, "--target-lang", tgt,
              "--user-dir", os.path.join(root, "fairseq_plugins"), "--fp16", "--max-tokens", str(max_tokens),
              "--optimizer", "adam", "--adam-betas", "(0.9, 0.98)", "--lr", "5e-4", "--lr-scheduler",
              "inverse_sqrt", "--warmup-updates", "100", "--dropout", "0.1", "--max-update", str(updates),
              "--no-save", "--disable-validation", "--log-format", "json", "--log-interval", "10",
              "--seed", "1", "--num-workers", "0"]
    runs = {"stock transformer": ["--arch", "transformer", "--criterion", "label_smoothed_cross_entropy",
                                  "--label-smoothing", "0.1"]}
    for fn in fns:
        crit = ("label_smoothed_cross_entropy_with_reg" if fn.startswith("reluformer")
                else "label_smoothed_cross_entropy")
        for b in ("auto", "torch"):
            runs[f"{fn} {b}"] = ["--arch", "rela_transformer", "--encoder-attention-fn", fn,
                                 "--decoder-attention-fn", fn, "--cross-attention-fn", fn,
                                 "--attention-backend", b, "--criterion", crit, "--label-smoothing", "0.1"]
    unknown = [fn for fn in fns if fn not in ATTENTION_FUNCTIONS]
    if unknown:
        raise ValueError(f"unknown attention functions {unknown}")
    out = {}
    for label, extra in runs.items():
        cmd = [sys.executable, "-m", "fairseq_cli.train"] + common + extra
        t0 = time.time()
        proc = subprocess.run(cmd, capture_output=True, text=True)
        wps = parse_wps(proc.stdout + proc.stderr)
        out[label] = {"wps": wps, "wall_s": time.time() - t0, "rc": proc.returncode,
                      "command": provenance.command_line("fairseq-train", cmd[3:])}
        if proc.returncode != 0 or wps is None:
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
            out[label]["error"] = tail[0][:120]
    return out


# --------------------------------------------------------------------------------------------
# rendering
# --------------------------------------------------------------------------------------------
def _cell(res: Dict, base: Optional[Dict], mem: bool = False) -> str:
    if "error" in res:
        return res["error"] if len(res["error"]) < 40 else res["error"][:37] + "..."
    s = f"{res['ms']:.3g} ms"
    if base is not None and "ms" in base:
        s += f" ({base['ms'] / res['ms']:.2f}x)"
    if res.get("kernel_ms") is not None:
        s += f"; kernels {res['kernel_ms']:.3g} ms"
        if base is not None and base.get("kernel_ms"):
            s += f" ({base['kernel_ms'] / res['kernel_ms']:.2f}x)"
    if res.get("host_ms") is not None:
        s += f"; host {res['host_ms']:.3g} ms"
    if res.get("syncs"):
        s += f", {res['syncs']} sync" + ("s" if res["syncs"] > 1 else "")
    if mem:
        s += f", {res['mib']:.0f} MiB"
    return s


#: the regime line of every page :func:`render` writes (what its numbers can claim)
REGIME_LINE = ("**Regime: benchmark** (speed and memory ratios against baselines measured in the same run, on "
               "a GPU): neither smoke, converged nor paper scale; no translation, no seeds (medians of repeated "
               "timings).")


def render(results: Dict, meta: Dict) -> str:
    """Markdown of ``results``: ``{section: {variant: {length: {label: measurement}}}}`` (variant:
    the dtype for core/decode, ``"<dtype>, <kind>, dropout <p>"`` for layer; train:
    ``{label: run}``) with ratios against the section's baseline (``sdpa ...`` for core,
    ``stock`` for layer/decode, ``stock transformer`` for train)."""
    lines = [f"# Attention speed on {meta['gpu']} (regime: benchmark)", "", REGIME_LINE, "",
             "Generated by `mt-bench-gpu` (`mt_pipeline/bench_gpu.py`); see `results/gpu/README.md` "
             "for what is measured and the targets.  Cells: median wall time per step, in parentheses the "
             "speed relative to the row's baseline measured in the same run (> 1 is faster); then the summed "
             "time of the step's GPU kernels (torch.profiler) and its ratio; then the CPU time to issue the step "
             "(host: close to the wall time = host-bound) and its host-device synchronisations, if any; then the "
             "peak extra memory of the step.  float32: TF32 matmuls " + ("on" if meta.get("tf32", True) else "off") + ".", ""]
    if not meta.get("complete", True):
        lines += ["**Incomplete: the run stopped before the end of its grid** (this file is rewritten after "
                  "every length; the provenance's wall time is the time when it was last written).", ""]
    titles = {"core": "Attention core, forward + backward (B*H*T = %s, d_h %s)" % (meta.get("core_rows"), 64),
              "layer": "One attention layer, forward + backward (C 512, H 8, %s tokens per batch)"
                       % meta.get("tokens"),
              "decode": "Incremental decoding, one self-attention step (64 sentences x beam 5, forward)"}
    for section in ("core", "layer", "decode"):
        if section not in results:
            continue
        for dt, per_len in results[section].items():
            lengths = list(per_len)
            labels: List[str] = []
            for res in per_len.values():
                labels += [lab for lab in res if lab not in labels]
            base_label = next((lab for lab in labels if lab.startswith("sdpa") or lab == "stock"), None)
            head = "S (cache)" if section == "decode" else "T"
            lines += [f"## {titles[section]}, {dt}", "",
                      f"| {head} -> | " + " | ".join(str(t) for t in lengths) + " |",
                      "|---|" + "---|" * len(lengths)]
            for lab in labels:
                row = []
                for t in lengths:
                    res = per_len[t].get(lab)
                    base = per_len[t].get(base_label) if lab != base_label else None
                    row.append("-" if res is None else _cell(res, base, mem=section != "decode"))
                lines.append(f"| {lab} | " + " | ".join(row) + " |")
            lines.append("")
    if "train" in results:
        runs = results["train"]
        base = runs.get("stock transformer", {}).get("wps")
        lines += ["## End-to-end fairseq-train, fp16 (tokens/s, median of logged intervals)", "",
                  "| model | tokens/s | vs stock | wall s |", "|---|---|---|---|"]
        for lab, run in runs.items():
            if run.get("wps") is None:
                lines.append(f"| {lab} | {run.get('error', 'no wps')} | - | {run['wall_s']:.0f} |")
                continue
            ratio = f"{run['wps'] / base:.2f}x" if base else "-"
            lines.append(f"| {lab} | {run['wps']:.0f} | {ratio} | {run['wall_s']:.0f} |")
        lines += ["", "Commands:", ""] + [f"- {lab}: `{run['command']}`" for lab, run in runs.items()] + [""]
    lines.append(provenance.markdown(meta["provenance"]))
    return "\n".join(lines)


def op_count_report(out: str, argv, names: Optional[List[str]], kinds: List[str], rates: List[float],
                    T: int = 32, tokens: int = 256) -> int:
    """``--op-counts FILE``: :func:`op_counts` of every :func:`layer_cases` case (``T`` = S, ``tokens``
    per batch) per layer kind and dropout rate, on CUDA (bf16) when there is one, else on CPU
    (float32; the Triton backend too when ``TRITON_INTERPRET=1``); writes :func:`render_op_counts`
    to ``out`` atomically.  Returns 0.

    Raises:
        KeyError: an unknown name in ``names`` (the message lists the registered functions).
    """
    import fairseq_plugins  # noqa: F401  (registers the functions)
    from fairseq_plugins.attention import attention_fn_names
    from fairseq_plugins.attention import triton as tk

    unknown = [n for n in (names or []) if n not in attention_fn_names()]
    if unknown:
        raise KeyError(f"unknown attention functions {unknown}; registered: {', '.join(attention_fn_names())}")
    t0 = time.time()
    cuda = torch.cuda.is_available()
    dev = torch.device("cuda" if cuda else "cpu")
    dtype = torch.bfloat16 if cuda else torch.float32
    backends = ("torch", "triton") if tk.triton_available() and (cuda or tk.interpret_requested()) else ("torch",)
    rows: Dict[str, Dict[str, Dict[str, int]]] = {}
    for kd in kinds:
        for rate in rates:
            cases = layer_cases(T, dtype, dev, tokens=tokens, names=names, backends=backends, dropout=rate, kind=kd)
            rows[f"{LAYER_KINDS[kd]}, dropout {rate:g}"] = {label: op_counts(run) for label, run in cases.items()}
            print(f"[op-counts] {LAYER_KINDS[kd]}, dropout {rate:g}: "
                  + ", ".join(f"{k} {sum(v.values())}" for k, v in rows[f'{LAYER_KINDS[kd]}, dropout {rate:g}'].items()),
                  flush=True)
    device = torch.cuda.get_device_name(0) if cuda else "CPU"
    meta = {"C": 512, "H": 8, "T": T, "B": max(1, tokens // T), "dropout": ", ".join(f"{r:g}" for r in rates),
            "device": f"{device} ({str(dtype).replace('torch.', '')}; backends: {', '.join(backends)})",
            "provenance": provenance.collect(provenance.command_line("mt-bench-gpu", argv), regime="benchmark",
                                             wall_s=round(time.time() - t0, 1))}
    write_text_atomic(out, render_op_counts(rows, meta))
    print(f"wrote {out}")
    return 0


def _slug(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-") or "gpu"


def main(argv=None) -> int:
    """Entry point of ``mt-bench-gpu`` / ``scripts/bench_gpu.py``; returns the exit status
    (2 without CUDA or triton, with a message on stderr)."""
    p = argparse.ArgumentParser(prog="mt-bench-gpu", description=__doc__.split("\n\n")[0])
    p.add_argument("--T", default="64,256,1024,2048,4096,8192", help="sequence lengths (T = S)")
    p.add_argument("--decode-S", default="16,64,256,1024", help="cache lengths of the decode section")
    p.add_argument("--dtypes", default="bf16,fp32", help=f"comma list of {', '.join(DTYPES)}")
    p.add_argument("--sections", default="core,layer,decode",
                   help=f"comma list of {', '.join(SECTIONS)} (train also needs --train-data)")
    p.add_argument("--core-cases", default=None,
                   help=f"core section: comma list of cases to time, '_' for ' ' (default all: {', '.join(CORE_CASES)})")
    p.add_argument("--core-rows", type=int, default=CORE_ROWS, help="B*H*T of the core section")
    p.add_argument("--tokens", type=int, default=16384, help="tokens per batch of the layer section")
    p.add_argument("--functions", default=None,
                   help="layer section: comma list of attention functions (default: all registered)")
    p.add_argument("--layer-kinds", default=",".join(LAYER_KINDS),
                   help=f"layer section: comma list of {', '.join(LAYER_KINDS)}")
    p.add_argument("--attention-dropout", default="0,0.1",
                   help="layer section: comma list of attention dropout rates in [0, 1)")
    p.add_argument("--tf32", action=argparse.BooleanOptionalAction, default=True,
                   help="TF32 matmuls for float32 (torch.backends.cuda.matmul.allow_tf32; default on)")
    p.add_argument("--warmup", type=int, default=25, help="do_bench warm-up, ms")
    p.add_argument("--rep", type=int, default=100, help="do_bench measurement, ms")
    p.add_argument("--train-data", default=None, help="fairseq data-bin for the train section")
    p.add_argument("--src", default="en")
    p.add_argument("--tgt", default="de")
    p.add_argument("--train-updates", type=int, default=300)
    p.add_argument("--train-max-tokens", type=int, default=8192)
    p.add_argument("--out", default=None, help="result file (default results/gpu/attention_speed_<gpu>.md)")
    p.add_argument("--host-profile", default=None, metavar="FILE",
                   help="layer section: also append each cell's host-time profile (torch.profiler ops by "
                        "self CPU time + cProfile by own time: host_profile) to FILE, written as it goes")
    p.add_argument("--op-counts", default=None, metavar="FILE",
                   help="instead of timing: count the aten ops (kernel launches on a GPU) of one layer step "
                        "per function, layer kind and dropout rate (op_counts; T = S = 32, B 8; runs without a "
                        "GPU: torch backend, and triton under TRITON_INTERPRET=1) and write the table to FILE")
    a = p.parse_args(argv)

    dtypes = [x for x in a.dtypes.split(",") if x]
    sections = [x for x in a.sections.split(",") if x]
    bad = [x for x in dtypes if x not in DTYPES] + [x for x in sections if x not in SECTIONS]
    if bad:
        p.error(f"unknown {bad}; valid dtypes: {', '.join(DTYPES)}; valid sections: {', '.join(SECTIONS)}")
    # underscores stand for spaces, so the labels survive an unquoted shell variable (scripts/gpu_window.sh)
    core_only = [x.strip().replace("_", " ") for x in a.core_cases.split(",") if x.strip()] if a.core_cases else None
    if core_only is not None and (not core_only or any(x not in CORE_CASES for x in core_only)):
        p.error(f"unknown core cases {[x for x in core_only if x not in CORE_CASES] or core_only}; "
                f"valid: {', '.join(CORE_CASES)}")
    kinds = [x for x in a.layer_kinds.split(",") if x]
    if not kinds or any(x not in LAYER_KINDS for x in kinds):
        p.error(f"unknown layer kinds {[x for x in kinds if x not in LAYER_KINDS] or kinds}; "
                f"valid: {', '.join(LAYER_KINDS)}")
    try:
        rates = [float(x) for x in a.attention_dropout.split(",") if x]
    except ValueError:
        rates = []
    if not rates or any(not 0.0 <= r < 1.0 for r in rates):
        p.error(f"--attention-dropout {a.attention_dropout!r}: a comma list of rates in [0, 1), e.g. 0,0.1")
    if "train" in sections and not a.train_data:
        p.error("--sections train needs --train-data DATA_BIN (a fairseq-preprocess output)")
    if a.op_counts:
        return op_count_report(a.op_counts, argv, a.functions.split(",") if a.functions else None, kinds, rates)
    if not torch.cuda.is_available():
        print("mt-bench-gpu: no CUDA device (torch.cuda.is_available() is False): this benchmark "
              "measures GPU kernels and writes GPU numbers; run it on a machine with an NVIDIA GPU "
              "(see results/gpu/README.md)", file=sys.stderr)
        return 2
    from fairseq_plugins.attention import triton as tk

    if not tk.triton_available():
        print("mt-bench-gpu: the 'triton' package does not import; pip install -e .[gpu]", file=sys.stderr)
        return 2
    import fairseq_plugins  # noqa: F401  (registers the functions)

    lengths = [int(x) for x in a.T.split(",") if x]
    torch.backends.cuda.matmul.allow_tf32 = a.tf32
    torch.backends.cudnn.allow_tf32 = a.tf32
    gpu = torch.cuda.get_device_name(0)
    dev = torch.device("cuda")
    names = a.functions.split(",") if a.functions else None
    t0 = time.time()
    results: Dict = {}
    out = a.out or os.path.join(provenance.ROOT, "results", "gpu", f"attention_speed_{_slug(gpu)}.md")
    import triton

    def write(complete: bool) -> None:
        meta = {"gpu": gpu, "core_rows": a.core_rows, "tokens": a.tokens, "tf32": a.tf32, "complete": complete,
                "provenance": provenance.collect(provenance.command_line("mt-bench-gpu", argv),
                                                 regime="benchmark", triton=triton.__version__,
                                                 cuda=torch.version.cuda, tf32=a.tf32,
                                                 wall_s=round(time.time() - t0, 1))}
        write_text_atomic(out, render(results, meta))

    for section in sections:
        if section == "train":
            results["train"] = train_runs(a.train_data, a.src, a.tgt, a.train_updates, a.train_max_tokens)
            continue
        results[section] = {}
        for dt in dtypes:
            variants = [(f"{dt}, {LAYER_KINDS[kd]}, dropout {p_}", kd, p_) for kd in kinds for p_ in rates] \
                if section == "layer" else [(dt, None, 0.0)]
            for variant, kind, rate in variants:
                per_len = results[section][variant] = {}
                for t in ([int(x) for x in a.decode_S.split(",") if x] if section == "decode" else lengths):
                    if section == "core":
                        cases = core_cases(t, DTYPES[dt], dev, rows=a.core_rows)
                        if core_only:
                            cases = {k: v for k, v in cases.items() if k in core_only}
                    elif section == "layer":
                        cases = layer_cases(t, DTYPES[dt], dev, tokens=a.tokens, names=names,
                                            dropout=rate, kind=kind)
                    else:
                        cases = decode_cases(t, DTYPES[dt], dev)
                    per_len[t] = {}
                    for label, run in cases.items():
                        per_len[t][label] = res = measure(run, a.warmup, a.rep)
                        print(f"[{section} {variant} {t}] {label}: {res}", flush=True)
                        if a.host_profile and section == "layer" and "error" not in res:
                            with open(a.host_profile, "a") as f:
                                f.write(f"\n\n######## [{section} {variant} {t}] {label}\n{host_profile(run)}")
                    del cases
                    write(complete=False)  # a window cut short still leaves every finished length
    write(complete=True)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
