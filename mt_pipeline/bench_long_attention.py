#!/usr/bin/env python
"""Long-sequence attention speed on CPU: fused softmax SDPA vs plain and chunked ReLU attention.

For each length ``T = S`` (B = 1, H = 4, d = 64 by default) it times forward + backward
(``torch.autograd.grad`` w.r.t. q, k, v, fixed upstream gradients) of

* ``sdpa``: ``F.scaled_dot_product_attention`` (torch's fused softmax kernel, the baseline);
* ``plain``: :func:`relu_attention_reference` (``matmul -> relu -> matmul`` autograd path);
* ``kernel``: :func:`relu_attention` as a caller uses it (dispatches to the plain path for
  ``T * S <= SMALL_TS``, chunked kernel above);
* ``kernel+stats``: the same with ``need_stats=True`` (row sum and ``sum s log s`` of
  ReLUFormer eq. 7, with gradients flowing through both);
* causal variants: ``sdpa`` with ``is_causal=True``, ``plain`` and ``kernel`` with ``causal=True``.

Methodology: warm-up calls first, then ``--reps`` rounds; in every round each method is timed
once (``inner`` back-to-back calls, ``inner`` chosen so that one sample takes >= ~25 ms), so
that drift of the machine (e.g. a background job) hits all methods alike; the median over
rounds is reported.  Speed ratios are ``t_baseline / t_method`` (> 1: the method is faster).
``saved MiB`` is the memory autograd keeps for backward (unique storages of the saved tensors,
measured with ``saved_tensors_hooks``), the main term of the peak extra memory of training.

Usage:
    python scripts/bench_long_attention.py [--T 32,64,256,1024,2048] [--batch 1] [--heads 4]
        [--head-dim 64] [--reps 7] [--threads N] [--out results/long_attention_cpu.md]

This is a benchmark, not a test: it prints (and optionally writes) a table; it asserts nothing.
"""

import argparse
import os
import platform
import statistics
import sys
import time

import torch
import torch.nn.functional as F

from .atomic import write_lines_atomic
from .provenance import git_commit, load_average

from fairseq_plugins.attention.kernels import (
    MIN_SCORES,
    SMALL_TS,
    relu_attention,
    relu_attention_reference,
)

ROW_SCALE = 0.05  # any constant r_i: speed does not depend on it


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def make_methods(q, k, v, g, g_row):
    """name -> zero-argument callable running forward + backward once."""
    qkv = (q, k, v)

    def grad(outputs, grads):
        torch.autograd.grad(outputs, qkv, grads)

    def sdpa(causal):
        return lambda: grad(F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=1.0), g)

    def ours(fn, causal, stats=False):
        def run():
            res = fn(q, k, v, ROW_SCALE, need_stats=stats, causal=causal)
            if stats:
                out, (rsum, rslogs) = res
                grad((out, rsum, rslogs), (g, g_row, g_row))
            else:
                grad(res, g)
        return run

    return {
        "sdpa": sdpa(False),
        "plain": ours(relu_attention_reference, False),
        "kernel": ours(relu_attention, False),
        "kernel+stats": ours(relu_attention, False, stats=True),
        "sdpa causal": sdpa(True),
        "plain causal": ours(relu_attention_reference, True),
        "kernel causal": ours(relu_attention, True),
    }


#: (row, baseline for "vs SDPA", baseline for "vs plain")
ROWS = [
    ("sdpa", "sdpa", "plain"),
    ("plain", "sdpa", "plain"),
    ("kernel", "sdpa", "plain"),
    ("kernel+stats", "sdpa", "plain"),
    ("sdpa causal", "sdpa causal", "plain causal"),
    ("plain causal", "sdpa causal", "plain causal"),
    ("kernel causal", "sdpa causal", "plain causal"),
]


def saved_mib(fn) -> float:
    """MiB of unique storages autograd saves for backward during one forward of ``fn``."""
    seen = {}

    def pack(t):
        try:
            key = t.untyped_storage().data_ptr()
            seen[key] = max(seen.get(key, 0), t.untyped_storage().nbytes())
        except RuntimeError:
            pass
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn()
    return sum(seen.values()) / 2**20


def bench_length(T, args):
    torch.manual_seed(0)
    B, H, d = args.batch, args.heads, args.head_dim
    q = (torch.randn(B, H, T, d) * d**-0.5).requires_grad_()
    k = torch.randn(B, H, T, d).requires_grad_()
    v = torch.randn(B, H, T, d).requires_grad_()
    g = torch.randn(B, H, T, d)
    g_row = torch.randn(B, H, T) * 1e-2
    methods = make_methods(q, k, v, g, g_row)
    inner = {}
    for name, fn in methods.items():  # warm-up, then calibrate calls per sample
        for _ in range(args.warmup):
            fn()
        t = time.perf_counter()
        fn()
        one = time.perf_counter() - t
        inner[name] = max(1, int(0.025 / max(one, 1e-6)))
    samples = {name: [] for name in methods}
    for _ in range(args.reps):
        for name, fn in methods.items():
            n = inner[name]
            t = time.perf_counter()
            for _ in range(n):
                fn()
            samples[name].append((time.perf_counter() - t) / n)
    med = {name: statistics.median(x) for name, x in samples.items()}
    saved = {}
    for name in methods:
        fwd = make_forward_only(name, q, k, v)
        saved[name] = saved_mib(fwd)
    return med, saved


def make_forward_only(name, q, k, v):
    causal = name.endswith("causal")
    if name.startswith("sdpa"):
        return lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=1.0)
    fn = relu_attention_reference if name.startswith("plain") else relu_attention
    return lambda: fn(q, k, v, ROW_SCALE, need_stats=name.endswith("stats"), causal=causal)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--T", default="32,64,256,1024,2048", help="comma-separated lengths T = S")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--reps", type=int, default=7, help="interleaved rounds (median reported)")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)")
    p.add_argument("--out", default=None, help="also write the table as markdown (atomically)")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    lengths = [int(x) for x in args.T.split(",") if x]
    command = "python " + " ".join([os.path.relpath(sys.argv[0])] + sys.argv[1:])
    load_before = load_average()

    header = ("| T | method | fwd+bwd ms | speed vs SDPA | speed vs plain | saved MiB |",
              "|---:|---|---:|---:|---:|---:|")
    rows = []
    for T in lengths:
        med, saved = bench_length(T, args)
        for name, base_sdpa, base_plain in ROWS:
            rows.append(f"| {T} | {name} | {med[name] * 1e3:.2f} | {med[base_sdpa] / med[name]:.2f}x | "
                        f"{med[base_plain] / med[name]:.2f}x | {saved[name]:.1f} |")
        print("\n".join(([] if len(rows) > len(ROWS) else list(header)) + rows[-len(ROWS):]), flush=True)
    load_after = load_average()

    info = [
        f"- CPU: {cpu_model()} ({os.cpu_count()} logical CPUs); torch {torch.__version__}, "
        f"{torch.get_num_threads()} intra-op threads",
        f"- load average (1/5/15 min) before: {load_before}; after: {load_after} "
        "(other jobs on the machine slow every method, unevenly: compare the interleaved ratios, "
        "and on a loaded machine expect multi-threaded ops to suffer most)",
        f"- B = {args.batch}, H = {args.heads}, d = {args.head_dim}, T = S, float32; "
        f"median of {args.reps} interleaved rounds after {args.warmup} warm-up calls",
        f"- kernel dispatch: chunked kernel when T*S > {SMALL_TS} and B*H*T*S >= {MIN_SCORES} "
        f"({MIN_SCORES // 2} with stats), plain path otherwise",
        f"- command: `{command}`",
        f"- git commit: `{git_commit()}`",
    ]
    print("\n".join(info))
    if args.out:
        lines = ["# Long-sequence attention on CPU: fused softmax vs ReLU attention (fwd+bwd)", ""]
        lines += info + ["", "speed ratio = t_baseline / t_method (> 1: faster than the baseline); causal rows "
                         "compare with the causal baselines.", ""]
        lines += list(header) + rows
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        write_lines_atomic(args.out, lines)
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
