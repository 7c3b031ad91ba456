#!/usr/bin/env python
"""FFN variance ratio (ReLUFormer Table 1) -- entry point of :mod:`fairseq_plugins.analysis.ffn_variance` (console command ``fairseq-attention-ffn-variance``)."""
import runpy

runpy.run_module("fairseq_plugins.analysis.ffn_variance", run_name="__main__", alter_sys=True)
