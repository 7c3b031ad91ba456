#!/usr/bin/env python
"""Source reliance (NLL with true vs shuffled sources) -- entry point of :mod:`fairseq_plugins.analysis.source_reliance` (console command ``fairseq-attention-source-reliance``)."""
import runpy

runpy.run_module("fairseq_plugins.analysis.source_reliance", run_name="__main__", alter_sys=True)
