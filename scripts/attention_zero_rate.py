#!/usr/bin/env python
"""Fraction of exactly-zero attention weights (ReLA sparsity rate; ReLUFormer Section 4.2) -- entry point of :mod:`fairseq_plugins.analysis.zero_weights` (console command ``fairseq-attention-zero-rate``)."""
import runpy

runpy.run_module("fairseq_plugins.analysis.zero_weights", run_name="__main__", alter_sys=True)
