"""Long documents: deduplication of the training pool against valid/test and within itself.

Exact matching of whitespace-normalised sentences.  Besides single pairs, a pool document that
is mostly a second copy of an earlier one (e.g. the same TED talk in the IWSLT17 set of Maruf
et al. and in the IWSLT14 XML release, where some segments differ in spelling or segmentation)
is dropped whole, so that its differing segments do not survive as an incoherent fragment.
"""

# A pool document is a duplicate of earlier pool material (e.g. the same TED talk in the
# IWSLT17 set of Maruf et al. and in the IWSLT14 XML release, where some segments differ in
# spelling or segmentation) when at least this fraction of its pairs, and at least
# DUP_DOC_MIN_PAIRS of them, were already kept from earlier documents.  Measured on the real
# pool: documents sharing a talk overlap by 49-100%, unrelated documents by <= 8% ("Thank you.").
DUP_DOC_FRACTION = 0.25
DUP_DOC_MIN_PAIRS = 5


def dedup_pool(pool, heldout_docs):
    """Deduplicate the train pool.

    ``pool``: [(source, [(docid, pairs)])] in priority order (earlier copies are kept);
    ``heldout_docs``: the valid and test documents [(docid, pairs)].  Exact matching of the
    whitespace-normalised sentences.  For each pool document, in order:
      1. drop pairs with an empty side                                   -> "removed_empty"
      2. drop pairs whose English side is an English sentence of valid/test or whose German
         side is a German sentence of valid/test                         -> "removed_heldout_overlap"
      3. if >= DUP_DOC_FRACTION of the remaining pairs (and >= DUP_DOC_MIN_PAIRS) were already
         kept from earlier documents, drop the whole document (a second copy of the same
         document; its differing segments would otherwise survive as an incoherent fragment)
                                                                         -> "removed_duplicate_document"
      4. else drop each pair already kept (earlier in the pool or earlier in this document):
         one copy of every (en, de) pair is kept                         -> "removed_duplicate_pair"
    The remaining pairs keep their document and their order; a document left with no pair is
    dropped.  Returns (new_pool, stats) with per-source counts before/after.
    """
    held_en = {e for _, pairs in heldout_docs for e, _ in pairs}
    held_de = {d for _, pairs in heldout_docs for _, d in pairs}
    seen = set()
    new_pool, stats = [], {}
    for source, docs in pool:
        st = {"documents_in": len(docs), "sentences_in": sum(len(p) for _, p in docs),
              "removed_empty": 0, "removed_heldout_overlap": 0, "removed_duplicate_document": 0,
              "removed_duplicate_pair": 0, "documents_removed": 0, "documents_removed_as_duplicate": 0,
              "documents_trimmed": 0}
        kept_docs = []
        for docid, pairs in docs:
            cand = []
            for e, d in pairs:
                if not e or not d:
                    st["removed_empty"] += 1
                elif e in held_en or d in held_de:
                    st["removed_heldout_overlap"] += 1
                else:
                    cand.append((e, d))
            n_seen = sum(1 for p in cand if p in seen)
            if cand and n_seen >= DUP_DOC_MIN_PAIRS and n_seen >= DUP_DOC_FRACTION * len(cand):
                st["removed_duplicate_document"] += len(cand)
                st["documents_removed_as_duplicate"] += 1
                cand = []
            kept = []
            for p in cand:
                if p in seen:
                    st["removed_duplicate_pair"] += 1
                else:
                    seen.add(p)
                    kept.append(p)
            if not kept:
                st["documents_removed"] += 1
                continue
            if len(kept) < len(pairs):
                st["documents_trimmed"] += 1
            kept_docs.append((docid, kept))
        st["documents"] = len(kept_docs)
        st["sentences"] = sum(len(p) for _, p in kept_docs)
        stats[source] = st
        new_pool.append((source, kept_docs))
    return new_pool, stats
