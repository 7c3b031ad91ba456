#!/usr/bin/env python
"""ReLA Figure 2 decoding-speed-vs-source-length benchmark -- entry point of :mod:`mt_pipeline.bench_decode_length` (console command ``mt-bench-decode-length``)."""
import runpy

runpy.run_module("mt_pipeline.bench_decode_length", run_name="__main__", alter_sys=True)
