#!/usr/bin/env python
"""Average the last N fairseq checkpoints -- entry point of :mod:`mt_pipeline.averaging` (console command ``mt-average-checkpoints``)."""
import runpy

runpy.run_module("mt_pipeline.averaging", run_name="__main__", alter_sys=True)
