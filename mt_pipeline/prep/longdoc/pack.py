"""Long documents, stage pack (ReLUFormer Appendix B) and the statistics of the packed sets.

Packing rule: within one original document with sentence lengths l_1..l_K, take the largest m
with l_1 + ... + l_m <= L as the first packed document; the next starts at sentence m+1.  Packed
documents never cross original document boundaries.  l_i is max(#BPE tokens of the English
sentence, #BPE tokens of the German sentence), so *both* sides of a packed document have at most
L tokens.  A single sentence with l_i > L becomes a one-sentence document of its own (counted as
"over_length" in stats.json).
"""

import json
import os

from mt_pipeline.prep.textio import read_lines, write_lines_atomic, write_text_atomic

SPLITS = ("train", "valid", "test")
LANGS = ("en", "de")


def pack_lengths(lengths, limit):
    """Pack one document's sentence lengths into [(start, end)) ranges (Appendix B).

    Each range is the longest run of consecutive sentences from ``start`` whose lengths sum to
    at most ``limit``; the next range starts where it ends.  A sentence longer than ``limit``
    forms a range of its own.
    """
    if limit <= 0:
        raise ValueError("limit must be positive")
    ranges, i, n = [], 0, len(lengths)
    while i < n:
        j, total = i, 0
        while j < n and total + lengths[j] <= limit:
            total += lengths[j]
            j += 1
        if j == i:  # a single sentence longer than the limit
            j = i + 1
        ranges.append((i, j))
        i = j
    return ranges


def doc_spans(docids):
    """[(docid, start, end)) for runs of equal consecutive doc ids (one per original document)."""
    spans, start = [], 0
    for i in range(1, len(docids) + 1):
        if i == len(docids) or docids[i] != docids[start]:
            if len(docids):
                spans.append((docids[start], start, i))
            start = i
    return spans


def pack_split(docids, src_bpe, tgt_bpe, limit):
    """Pack one split.  Returns [(docid, start, end, src_tokens, tgt_tokens, over_length)],
    sentence indices into the split's sentence-level files."""
    ls = [len(s.split()) for s in src_bpe]
    lt = [len(t.split()) for t in tgt_bpe]
    lengths = [max(a, b) for a, b in zip(ls, lt)]
    out = []
    for docid, start, end in doc_spans(docids):
        for a, b in pack_lengths(lengths[start:end], limit):
            s, e = start + a, start + b
            out.append((docid, s, e, sum(ls[s:e]), sum(lt[s:e]), int(e - s == 1 and lengths[s] > limit)))
    return out


# ---------------------------------------------------------------------------------------------
# Subcommands
# ---------------------------------------------------------------------------------------------


def write_packed(out, limit):
    """Pack the sentences of ``out/{bpe,tok}/`` and ``out/sent/`` into documents of at most
    ``limit`` tokens -> ``out/L{limit}/bpe/{train,valid,test}.{en,de}``,
    ``out/L{limit}/{tok,raw}/{valid,test}.{en,de}`` (one packed document per line, sentences
    joined by a space) and ``out/L{limit}/SPLIT.map`` (tab-separated: index, docid, first and end
    sentence index, #sentences, #en / #de BPE tokens, over-length flag).

    Raises:
        SystemExit: a level's line count differs from ``sent/SPLIT.docids``."""
    ldir = os.path.join(out, f"L{limit}")
    for sub in ("bpe", "tok", "raw"):
        os.makedirs(os.path.join(ldir, sub), exist_ok=True)
    for split in SPLITS:
        docids = read_lines(os.path.join(out, "sent", f"{split}.docids"))
        text = {}
        for level, d in (("bpe", "bpe"), ("tok", "tok"), ("raw", "sent")):
            for lang in LANGS:
                text[level, lang] = read_lines(os.path.join(out, d, f"{split}.{lang}"))
                if len(text[level, lang]) != len(docids):
                    raise SystemExit(f"pack: {d}/{split}.{lang} has {len(text[level, lang])} lines, "
                                     f"sent/{split}.docids has {len(docids)}")
        packed = pack_split(docids, text["bpe", "en"], text["bpe", "de"], limit)
        levels = ("bpe", "tok", "raw") if split != "train" else ("bpe",)
        for level in levels:
            for lang in LANGS:
                lines = text[level, lang]
                write_lines_atomic(os.path.join(ldir, level, f"{split}.{lang}"),
                                   [" ".join(lines[s:e]) for _, s, e, *_ in packed])
        write_lines_atomic(os.path.join(ldir, f"{split}.map"),
                           [f"{i}\t{docid}\t{s}\t{e}\t{e - s}\t{ns}\t{nt}\t{over}"
                            for i, (docid, s, e, ns, nt, over) in enumerate(packed)])


def _map_rows(path):
    rows = []
    for line in read_lines(path):
        i, docid, s, e, n, ns, nt, over = line.split("\t")
        rows.append((docid, int(s), int(e), int(ns), int(nt), int(over)))
    return rows


def _split_stats(rows):
    n = len(rows)
    src, tgt, nsent = [r[3] for r in rows], [r[4] for r in rows], [r[2] - r[1] for r in rows]
    return {
        "documents": n, "sentences": sum(nsent),
        "original_documents": len({r[0] for r in rows}),
        "mean_sentences_per_doc": round(sum(nsent) / n, 2) if n else 0,
        "mean_src_tokens": round(sum(src) / n, 1) if n else 0,
        "mean_tgt_tokens": round(sum(tgt) / n, 1) if n else 0,
        "max_src_tokens": max(src, default=0), "max_tgt_tokens": max(tgt, default=0),
        "over_length_single_sentences": sum(r[5] for r in rows),
    }


def write_stats(out, lengths, log=print):
    """Write ``out/stats.json`` (counts per split, source and L, from ``out/sent/sources.json``,
    ``out/bpe/`` and every ``out/L<L>/SPLIT.map``) and log a short summary."""
    with open(os.path.join(out, "sent", "sources.json"), encoding="utf-8") as f:
        sources = json.load(f)
    stats = {"direction": "en-de", "splits": sources["splits"],
             "train_pool_sources": sources["train_pool_sources"],
             "train_pool_total": sources["train_pool_total"], "dedup_rule": sources["dedup_rule"],
             "valid_source": sources["valid_source"], "test_source": sources["test_source"],
             "length_unit": "l_i = max(#BPE tokens en, #BPE tokens de) of sentence i; a packed document "
                            "has at most L BPE tokens on each side unless it is one over-length sentence",
             "packed": {}}
    for split in SPLITS:
        stats["splits"][split]["bpe_tokens"] = {
            lang: sum(len(x.split()) for x in read_lines(os.path.join(out, "bpe", f"{split}.{lang}"))) for lang in LANGS}
    summary = []
    for limit in lengths:
        per = {split: _split_stats(_map_rows(os.path.join(out, f"L{limit}", f"{split}.map"))) for split in SPLITS}
        stats["packed"][f"L{limit}"] = per
        summary.append(f"  L={limit:<5d} " + "  ".join(
            f"{s}: {per[s]['documents']:>5d} docs (mean {per[s]['mean_src_tokens']:>6.1f}/{per[s]['mean_tgt_tokens']:>6.1f} "
            f"tok, max {max(per[s]['max_src_tokens'], per[s]['max_tgt_tokens'])}, {per[s]['over_length_single_sentences']} over)"
            for s in SPLITS))
    write_text_atomic(os.path.join(out, "stats.json"), json.dumps(stats, indent=1) + "\n")
    sp, tot = stats["splits"], stats["train_pool_total"]
    log("sentences/documents: " + ", ".join(f"{s} {sp[s]['sentences']}/{sp[s]['documents']}" for s in SPLITS))
    log(f"pool dedup: -{tot['removed_heldout_overlap']} pairs overlapping valid/test, "
        f"-{tot['removed_duplicate_pair']} duplicate pairs, -{tot['documents_removed']} whole documents")
    log("packed documents (mean en/de BPE tokens, max, over-length single sentences):")
    for line in summary:
        log(line)
    return stats
