#!/usr/bin/env python
"""ReLA Table 2 speed benchmark -- entry point of :mod:`mt_pipeline.bench_speed` (console command ``mt-bench-speed``)."""
import runpy

runpy.run_module("mt_pipeline.bench_speed", run_name="__main__", alter_sys=True)
