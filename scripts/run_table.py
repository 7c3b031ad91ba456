#!/usr/bin/env python
"""Fill a results table row by row -- entry point of :mod:`mt_pipeline.tables` (console command ``mt-table``)."""
import runpy

runpy.run_module("mt_pipeline.tables", run_name="__main__", alter_sys=True)
