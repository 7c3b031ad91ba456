#!/usr/bin/env python
"""Attention analyses (sparsity, entropy, AER, ...) -- entry point of :mod:`fairseq_plugins.analysis.cli` (console command ``fairseq-attention-analysis``)."""
import runpy

runpy.run_module("fairseq_plugins.analysis.cli", run_name="__main__", alter_sys=True)
