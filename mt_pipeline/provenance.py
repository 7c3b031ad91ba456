"""Provenance of every result file for the pipeline: :mod:`fairseq_plugins.provenance`, the one
record and Markdown rendering (it lives in the plugin so that the plugin's analysis CLIs need
nothing from ``mt_pipeline``; the pipeline re-exports it here).
"""

from fairseq_plugins.provenance import *  # noqa: F401,F403  (the one provenance record)
from fairseq_plugins.provenance import __all__  # noqa: F401
