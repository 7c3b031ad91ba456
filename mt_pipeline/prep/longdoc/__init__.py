"""Long-document En->De data (ReLUFormer §4.3.2, Appendix B): documents of at most L BPE tokens.

* :mod:`~mt_pipeline.prep.longdoc.sources` -- the document-bounded sources, read and checked;
* :mod:`~mt_pipeline.prep.longdoc.dedup` -- deduplication of the training pool;
* :mod:`~mt_pipeline.prep.longdoc.pack` -- the packing rule and the statistics;
* :mod:`~mt_pipeline.prep.longdoc.pipeline` -- the stages (``mt-prep long_documents``).
"""
