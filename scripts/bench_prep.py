#!/usr/bin/env python
"""Data-prep memory vs corpus size benchmark -- entry point of :mod:`mt_pipeline.bench_prep` (console command ``mt-bench-prep``)."""
import runpy

runpy.run_module("mt_pipeline.bench_prep", run_name="__main__", alter_sys=True)
