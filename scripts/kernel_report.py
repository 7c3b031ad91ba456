#!/usr/bin/env python
"""Compile report of the fused Triton attention kernels for sm_90a / sm_80 (no GPU needed).

Thin entry point of :mod:`mt_pipeline.kernel_report` (also installed as ``mt-kernel-report``);
see its docstring and ``results/gpu/kernel_report.md``.  Exits with status 2 without triton.
"""

import sys

from mt_pipeline.kernel_report import main

if __name__ == "__main__":
    sys.exit(main())
