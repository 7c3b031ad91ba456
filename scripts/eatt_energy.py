#!/usr/bin/env python
"""E-ATT energy accounting and rho -- entry point of :mod:`fairseq_plugins.analysis.energy_cli` (console command ``fairseq-attention-energy``)."""
import runpy

runpy.run_module("fairseq_plugins.analysis.energy_cli", run_name="__main__", alter_sys=True)
