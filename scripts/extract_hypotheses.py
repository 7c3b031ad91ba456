#!/usr/bin/env python
"""Hypotheses of a fairseq-generate log, in corpus order -- entry point of :mod:`mt_pipeline.hypotheses` (console command ``mt-extract-hypotheses``)."""
import runpy

runpy.run_module("mt_pipeline.hypotheses", run_name="__main__", alter_sys=True)
