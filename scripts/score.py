#!/usr/bin/env python
"""Score translations (sacreBLEU, chrF, tokenized BLEU, RIBES) -- entry point of :mod:`mt_pipeline.scoring` (console command ``mt-score``)."""
import runpy

runpy.run_module("mt_pipeline.scoring", run_name="__main__", alter_sys=True)
