#!/usr/bin/env python
"""Peak memory and time of E-ATT's pairwise L1 scores (eq. 13), forward + backward, on CPU.

Three implementations of ``-||q_i - k_j||_1 / sqrt(d)`` for q, k ``(1, H, L, d)``:

* ``broadcast`` -- ``(q[..., :, None, :] - k[..., None, :, :]).abs().sum(-1)`` (materialises
  ``(1, H, L, L, d)`` and autograd keeps it);
* ``cdist`` -- ``torch.cdist(q, k, p=1)``;
* ``chunked`` -- :func:`fairseq_plugins.attention.l1.l1_scores` (blocks of queries, signs
  recomputed in backward).

Each (implementation, L) runs in a fresh subprocess; peak memory is the process's maximum
resident set size minus the resident size after the inputs were created (so it is the extra
memory of the computation), in MiB.  The ratio column is against ``broadcast`` at the same L,
measured in the same run.  A benchmark, not a test: it asserts nothing.

Usage:  python scripts/bench_eatt_l1.py [--lengths 128 512 1024] [--heads 8] [--dim 64]
            [--out results/eatt/l1_memory_cpu.md]
"""

import argparse
import json
import os
import resource
import subprocess
import sys
import time

from .provenance import ROOT

IMPLS = ("broadcast", "cdist", "chunked")


def _rss_mib():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def child(impl, L, H, d):
    import torch

    from fairseq_plugins.attention.l1 import l1_scores

    torch.manual_seed(0)
    q = torch.randn(1, H, L, d, requires_grad=True)
    k = torch.randn(1, H, L, d, requires_grad=True)
    g = torch.randn(1, H, L, L)
    s = 1.0 / d**0.5
    base = _rss_mib()
    t0 = time.perf_counter()
    if impl == "broadcast":
        out = -(q.unsqueeze(-2) - k.unsqueeze(-3)).abs().sum(-1) * s
    elif impl == "cdist":
        out = -torch.cdist(q, k, p=1) * s
    else:
        out = l1_scores(q, k, s)
    out.backward(g)
    dt = time.perf_counter() - t0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB -> MiB (Linux)
    print(json.dumps({"extra_peak_mib": peak - base, "seconds": dt}))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--lengths", type=int, nargs="+", default=[128, 512, 1024])
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--out", help="write the Markdown table here (atomically)")
    p.add_argument("--_child", nargs=2, help=argparse.SUPPRESS)
    a = p.parse_args()
    if a._child:
        child(a._child[0], int(a._child[1]), a.heads, a.dim)
        return 0
    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
    res = {}
    for L in a.lengths:
        for impl in IMPLS:
            out = subprocess.run([sys.executable, "-m", "mt_pipeline.bench_eatt_l1", "--heads", str(a.heads), "--dim", str(a.dim),
                                  "--_child", impl, str(L)], capture_output=True, text=True, env=env, cwd=ROOT)
            res[(impl, L)] = json.loads(out.stdout.strip().splitlines()[-1]) if out.returncode == 0 else None
            print(f"[l1] L={L} {impl}: {res[(impl, L)]}", flush=True)
    import torch

    lines = [f"# E-ATT L1 scores: extra peak memory and time, forward + backward (CPU, H={a.heads}, d={a.dim})", "",
             f"torch {torch.__version__}, {os.environ.get('OMP_NUM_THREADS')} thread(s). Regenerate: "
             f"`python scripts/bench_eatt_l1.py --lengths {' '.join(map(str, a.lengths))}`.", "",
             "| L | impl | extra peak MiB | × broadcast | seconds | × broadcast |", "|---|---|---|---|---|---|"]
    for L in a.lengths:
        ref = res[("broadcast", L)]
        for impl in IMPLS:
            r = res[(impl, L)]
            if r is None:
                lines.append(f"| {L} | {impl} | failed | | | |")
                continue
            rm = f"{r['extra_peak_mib'] / ref['extra_peak_mib']:.3f}" if ref else "n/a"
            rt = f"{r['seconds'] / ref['seconds']:.2f}" if ref else "n/a"
            lines.append(f"| {L} | {impl} | {r['extra_peak_mib']:.0f} | {rm} | {r['seconds']:.3f} | {rt} |")
    md = "\n".join(lines) + "\n"
    print(md)
    if a.out:
        from .atomic import atomic_path

        os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
        with atomic_path(a.out) as tmp, open(tmp, "w") as f:
            f.write(md)


if __name__ == "__main__":
    main()
