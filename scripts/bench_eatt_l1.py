#!/usr/bin/env python
"""E-ATT L1-score memory benchmark -- entry point of :mod:`mt_pipeline.bench_eatt_l1` (console command ``mt-bench-eatt-l1``)."""
import runpy

runpy.run_module("mt_pipeline.bench_eatt_l1", run_name="__main__", alter_sys=True)
