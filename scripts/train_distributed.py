#!/usr/bin/env python
"""fairseq-train under torchrun / SLURM -- entry point of :mod:`mt_pipeline.launch` (console command ``mt-train-distributed``)."""
import runpy

runpy.run_module("mt_pipeline.launch", run_name="__main__", alter_sys=True)
