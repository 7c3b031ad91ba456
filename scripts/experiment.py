#!/usr/bin/env python
"""One translation experiment, resumable -- entry point of :mod:`mt_pipeline.experiment` (console command ``mt-experiment``)."""
import runpy

runpy.run_module("mt_pipeline.experiment", run_name="__main__", alter_sys=True)
