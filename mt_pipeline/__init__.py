"""The experiment pipeline around the fairseq plugin: data preparation, training runs, tables,
evaluation, scoring, benchmarks and their provenance.

``fairseq_plugins`` is what fairseq loads (``--user-dir``): attention mechanisms, models,
criterions, analyses.  ``mt_pipeline`` is what a researcher runs around it; each command is a
console entry point (``setup.cfg``) and a module with a ``main(argv)``.  Importing this package
imports nothing heavy (no torch, no fairseq): its modules import those where they need them.

Modules:

* :mod:`mt_pipeline.atomic` -- the one atomic file writer (never a half-written output),
  re-exported from :mod:`fairseq_plugins.atomic` (so importing it imports the plugin, and fairseq);
* :mod:`mt_pipeline.provenance` -- the one provenance record (command, git commit, hardware, ...)
  and its Markdown rendering, re-exported from :mod:`fairseq_plugins.provenance`;
* :mod:`mt_pipeline.prep` -- the data preparation of every corpus (``mt-prep CORPUS``, run by
  ``data-prep/<corpus>/prepare.sh``).
"""

__all__ = ["atomic", "provenance", "prep"]
