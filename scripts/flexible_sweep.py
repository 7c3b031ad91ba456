#!/usr/bin/env python
"""Flexible attention tau sweeps and Table 1 -- entry point of :mod:`mt_pipeline.sweeps` (console command ``mt-flexible-sweep``)."""
import runpy

runpy.run_module("mt_pipeline.sweeps", run_name="__main__", alter_sys=True)
