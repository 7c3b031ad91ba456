"""Data preparation for fairseq: one system for every corpus (``mt-prep CORPUS``,
``data-prep/<corpus>/prepare.sh``).

A corpus is a spec, ``data-prep/<corpus>/corpus.yaml`` (:mod:`~mt_pipeline.prep.spec`): its
official files with checksums, where its files are found locally, its recipe, and the pipeline
that prepares it:

* ``sentence`` (:mod:`~mt_pipeline.prep.sentence`): sentence-level corpora extracted from their
  official archives (IWSLT14/15, WMT14-18, ASPEC), with truecasing, joint or separate BPE and
  per-paper variants;
* ``multi30k`` (:mod:`~mt_pipeline.prep.multi30k`): Multi30k Task 1, with ``--char`` and
  ``--train-lines``;
* ``long_documents`` (:mod:`~mt_pipeline.prep.longdoc`): documents of at most L BPE tokens
  (ReLUFormer Appendix B).

The pipelines share the stages, one module each -- inputs (:mod:`~mt_pipeline.prep.fetch`:
local directory or download, checksums), :mod:`~mt_pipeline.prep.raw`,
:mod:`~mt_pipeline.prep.tok`, :mod:`~mt_pipeline.prep.tc`, :mod:`~mt_pipeline.prep.bpe`,
:mod:`~mt_pipeline.prep.binarize` -- and the run machinery (:mod:`~mt_pipeline.prep.run`: stage
stamps, atomic outputs, the output lock, dry runs).  Output layout:
``<out>/{download,raw,tok,[tc],bpe|char,bin,logs}`` (long documents: ``sent/``, ``dict/``,
``L<L>/``).
"""
