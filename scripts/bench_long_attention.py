#!/usr/bin/env python
"""Long-sequence ReLU attention benchmark -- entry point of :mod:`mt_pipeline.bench_long_attention` (console command ``mt-bench-long-attention``)."""
import runpy

runpy.run_module("mt_pipeline.bench_long_attention", run_name="__main__", alter_sys=True)
