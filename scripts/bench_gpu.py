#!/usr/bin/env python
"""GPU attention benchmark (fused Triton kernels vs PyTorch, stock fairseq MHA and SDPA flash).

Thin entry point of :mod:`mt_pipeline.bench_gpu` (also installed as ``mt-bench-gpu``); see its
docstring and ``results/gpu/README.md``.  Needs a CUDA GPU: exits with status 2 otherwise.
"""

import sys

from mt_pipeline.bench_gpu import main

if __name__ == "__main__":
    sys.exit(main())
