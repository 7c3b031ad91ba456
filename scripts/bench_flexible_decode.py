#!/usr/bin/env python
"""Flexible attention decoding-time benchmark -- entry point of :mod:`mt_pipeline.bench_flexible_decode` (console command ``mt-bench-flexible-decode``)."""
import runpy

runpy.run_module("mt_pipeline.bench_flexible_decode", run_name="__main__", alter_sys=True)
