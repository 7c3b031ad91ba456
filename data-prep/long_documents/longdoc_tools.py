#!/usr/bin/env python3
"""Python helpers for ``data-prep/long_documents/prepare.sh`` (not meant to be run by hand).

Long-document En->De data after ReLUFormer §4.3.2 / Appendix B: sentence-level documents are
read from document-bounded sources, deduplicated, tokenised, BPE'd, and then packed into
documents of at most L BPE tokens.

Subcommands::

    python longdoc_tools.py read-sources --out-dir SENT [--data-dir D] [--maruf-dir M]
                                         [--train-dir T] [--no-checksum]
        Read every source into documents of (en, de) sentence pairs, split them into
        test (Maruf Europarl7 test), valid (Maruf Europarl7 dev) and the train pool
        (everything else), deduplicate the pool, and write SENT/{train,valid,test}.{en,de}
        (one sentence per line, whitespace-normalised, raw/detokenized), SENT/{split}.docids
        (the document id of every sentence line) and SENT/sources.json (counts per source
        and the dedup removals).  Every input's sha256 (of the *uncompressed* content) is
        checked against the values in this file unless --no-checksum.
        --data-dir: the shared/data layout (docmt_maruf2019_en_de/, iwslt14_de_en/orig_xml/,
        wmt/sgm/; files may be .gz or plain).  --maruf-dir: the upstream selective-attn
        layout ({Europarl7,IWSLT2017,NC-2016}/concatenated_en2de_{dev,test}_{en,de}.txt, as
        downloaded by prepare.sh --download); it replaces the Maruf files of --data-dir.
        --train-dir: a directory with concatenated_en2de_train_{en,de}.txt[.gz] (Maruf format)
        added to the pool first.

    python longdoc_tools.py maruf-files
        Print RELPATH<TAB>SHA256 for the 12 upstream Maruf dev/test files (for --download).

    python longdoc_tools.py tokenize --lang {en,de} --input RAW --output TOK
        sacremoses MosesTokenizer(lang).tokenize(line, escape=False, return_str=True).

    python longdoc_tools.py learn-bpe --merges N --output CODES TOK [TOK ...]
    python longdoc_tools.py apply-bpe --codes CODES [--workers N] IN OUT [IN OUT ...]
        subword-nmt learn_bpe (min-frequency 2) / BPE.process_line (separator ``@@``).

    python longdoc_tools.py pack --out OUT --length L
        Pack the sentences of OUT/{bpe,tok}/ and OUT/sent/ into documents of at most L
        tokens (rule below) -> OUT/L{L}/bpe/{train,valid,test}.{en,de},
        OUT/L{L}/{tok,raw}/{valid,test}.{en,de}, OUT/L{L}/{split}.map.

    python longdoc_tools.py stats --out OUT --lengths "L1 L2 ..."
        Write OUT/stats.json and print a short summary.

    python longdoc_tools.py count-bin PREFIX [PREFIX ...]
    python longdoc_tools.py versions

Packing rule (Appendix B): within one original document with sentence lengths l_1..l_K,
take the largest m with l_1 + ... + l_m <= L as the first packed document; the next starts
at sentence m+1.  Packed documents never cross original document boundaries.  l_i is
max(#BPE tokens of the English sentence, #BPE tokens of the German sentence), so *both*
sides of a packed document have at most L tokens.  A single sentence with l_i > L becomes a
one-sentence document of its own (counted as "over_length" in stats.json).
"""

import argparse
import gzip
import hashlib
import json
import os
import re
import sys

# tokenize, learn-bpe, apply-bpe, count-bin, versions and the line reading/writing are shared
# with multi30k/m30k_tools.py: data-prep/common/text_tools.py.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
import text_tools  # noqa: E402
from text_tools import read_lines, write_lines_atomic  # noqa: E402

SPLITS = ("train", "valid", "test")
LANGS = ("en", "de")

# Maruf et al. (2019) document-level sets: shared/data subset name -> upstream directory name.
MARUF_SUBSETS = {"europarl7": "Europarl7", "iwslt2017_ted": "IWSLT2017", "nc2016": "NC-2016"}
# sha256 of the UNCOMPRESSED content (upstream files == zcat of the shared/data copies).
MARUF_SHA256 = {
    ("europarl7", "dev", "de"): "d75378d8f8482c4276e3c77be8f8c48e5577c064c05481b1a05cff1db5c5b0aa",
    ("europarl7", "dev", "en"): "938fde3fccaace0e221e2520dcb11d9b121ca3740308a4c7940692c96955b011",
    ("europarl7", "test", "de"): "60bd6552032d82bfd0fb9597bad8aec4f6cf333918cb56a5cf215003d983850a",
    ("europarl7", "test", "en"): "a82dd0099a1a786b9af99eeb2444bf0ad935d0a534cd883c5d560980fd07859c",
    ("iwslt2017_ted", "dev", "de"): "b22638ac9a98861dbdc81def31472d7d816e64cd7cc06482fb041b69016340b6",
    ("iwslt2017_ted", "dev", "en"): "ab2299d5f254f12128d49aac47614930ed83965e4c3548709ac428aa0a25e8ce",
    ("iwslt2017_ted", "test", "de"): "9a6bb0f3f79879a6af26b3012d584853ba0d53700972ccdb799bb92aeb7d6912",
    ("iwslt2017_ted", "test", "en"): "f8414019291f264368570a60cbc662ea2ac00f07d079624823f6553fa632e3d3",
    ("nc2016", "dev", "de"): "e482a04b2cc1e3015059de851dbb295afea7e79a3d76278561e6e5ad9939e110",
    ("nc2016", "dev", "en"): "bfc32336a5820c95b460a5a4cb715af93c43147bed01f7a6936ed3b0f1d7f719",
    ("nc2016", "test", "de"): "11f7dd3ba475ce6d4fa4b33bb949ed61fa847d46ff2bfbb81ef39d83f30fa110",
    ("nc2016", "test", "en"): "9edec9fe1259b7b4802a6e451cc2a8c0d1bc4851dcad24c91f30b79998f801be",
}
# IWSLT14 TED talks (raw XML, de-en release; talk boundaries), in the order of fairseq's test set.
IWSLT14_SETS = ("TED.dev2010", "TEDX.dev2012", "TED.tst2010", "TED.tst2011", "TED.tst2012")
OTHER_SHA256 = {  # path under --data-dir (without .gz) -> sha256 of the uncompressed content
    "iwslt14_de_en/orig_xml/IWSLT14.TED.dev2010.de-en.de.xml": "6bb2e8272bc49a4f19df2150a482a1b856fa6a2d6b289d3a80ac6b4ff66070fe",
    "iwslt14_de_en/orig_xml/IWSLT14.TED.dev2010.de-en.en.xml": "5c860ebb64d4ecdc65800c7ba59732d27cff8b296fa7eeafbcd4614a2c572700",
    "iwslt14_de_en/orig_xml/IWSLT14.TED.tst2010.de-en.de.xml": "5648c0a3a6e5eb3ab6fbdfbdeca69a20a1637a37361e337ab47418d71972880d",
    "iwslt14_de_en/orig_xml/IWSLT14.TED.tst2010.de-en.en.xml": "fa9ce190959320cb5a5a68358ad793e5863621f87a28e9f4312110ac5b842efc",
    "iwslt14_de_en/orig_xml/IWSLT14.TED.tst2011.de-en.de.xml": "a70163216273ab5622cbbb19fea6dfde42ab6d3ad70374444323e65f71837735",
    "iwslt14_de_en/orig_xml/IWSLT14.TED.tst2011.de-en.en.xml": "d350eac4cb6f0cf3e787c9e82b8074bdc7e58c4ca7d650c9b97de8a677068695",
    "iwslt14_de_en/orig_xml/IWSLT14.TED.tst2012.de-en.de.xml": "edf69bd9e41acd93e13d01f55a2906b7be0f69cd90a46e343294dfd3190db952",
    "iwslt14_de_en/orig_xml/IWSLT14.TED.tst2012.de-en.en.xml": "cd73e997ce078699863278daef06b9a226d1adbec4c3cac91a0894d7eab5c1f8",
    "iwslt14_de_en/orig_xml/IWSLT14.TEDX.dev2012.de-en.de.xml": "e818a77a43e18ec4726a698e5aa9c438e0cd4b82d4edd27286163bee44e85604",
    "iwslt14_de_en/orig_xml/IWSLT14.TEDX.dev2012.de-en.en.xml": "a5de03e0e18cf5ad4b2b4ba66f11510a8576fa1a7c172190860cabfd17bff99a",
    # newstest2014: src.en (English) with ref.de (German).  The four sgm files hold only two
    # distinct texts: src.de == ref.de and src.en == ref.en segment for segment.
    "wmt/sgm/newstest2014-deen-src.en.sgm": "504d07744c489d23aefbd120bebf9720fadcb32891d4370f4fe05732de274099",
    "wmt/sgm/newstest2014-deen-ref.de.sgm": "f10c95d057be397c0718b3c349840709810f4e39deed6906f7beace67af6ea3b",
}


class DataError(Exception):
    """A problem with the input data (message is shown to the user)."""


# ---------------------------------------------------------------------------------------------
# Reading
# ---------------------------------------------------------------------------------------------

def norm_ws(s):
    """Whitespace normalisation: strip, and collapse every run of whitespace to one space.

    ``str.split()`` also splits on \\r, \\x85, \\u2028 etc., so no line break survives.
    """
    return " ".join(s.split())


_ENTITY = re.compile(r"&(amp|lt|gt|quot|apos|#[0-9]+|#[xX][0-9a-fA-F]+);")
_NAMED = {"amp": "&", "lt": "<", "gt": ">", "quot": '"', "apos": "'"}


def unescape_entities(s):
    """Decode the five XML entities and numeric character references (one pass, so
    ``&amp;lt;`` -> ``&lt;``).  Bare ``&`` (as in the WMT sgm files) is left alone."""
    def repl(m):
        name = m.group(1)
        if name in _NAMED:
            return _NAMED[name]
        code = int(name[2:], 16) if name[1] in "xX" else int(name[1:])
        try:
            return chr(code)
        except (ValueError, OverflowError):
            return m.group(0)
    return _ENTITY.sub(repl, s)


def clean(s):
    return norm_ws(unescape_entities(s))


def resolve_input(path):
    """``path`` or ``path.gz``, whichever exists (``path`` is given without .gz)."""
    for p in (path, path + ".gz"):
        if os.path.isfile(p):
            return p
    raise DataError(f"missing input {path}[.gz]")


def read_text(path, expected_sha=None):
    """Decoded UTF-8 text of ``path`` (gunzipped if it ends in .gz); checks the sha256 of
    the uncompressed bytes when ``expected_sha`` is given."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        data = f.read()
    if expected_sha is not None:
        actual = hashlib.sha256(data).hexdigest()
        if actual != expected_sha:
            raise DataError(f"sha256 mismatch for {path} (uncompressed content): expected "
                            f"{expected_sha}, got {actual} (pass --no-checksum to accept other files)")
    return data.decode("utf-8")


def _lines(text):
    """Lines split on \\n only (a final line without newline counts), trailing \\r removed."""
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return [ln[:-1] if ln.endswith("\r") else ln for ln in lines]


def parse_maruf(text_en, text_de, name):
    """Maruf et al. format: one sentence per line, a line ``<d>`` starts each document.

    Returns a list of documents, each a list of (en, de) pairs (whitespace-normalised).
    """
    en, de = _lines(text_en), _lines(text_de)
    if len(en) != len(de):
        raise DataError(f"{name}: en has {len(en)} lines, de has {len(de)}")
    docs = []
    for i, (e, d) in enumerate(zip(en, de)):
        e_mark, d_mark = e.strip() == "<d>", d.strip() == "<d>"
        if e_mark != d_mark:
            raise DataError(f"{name}: line {i + 1}: document marker <d> on one side only")
        if e_mark:
            docs.append([])
            continue
        if not docs:
            raise DataError(f"{name}: line {i + 1}: sentence before the first <d> marker")
        docs[-1].append((clean(e), clean(d)))
    if not docs:
        raise DataError(f"{name}: no <d> document markers found (not a Maruf-format file?)")
    return docs


_DOC_RE = re.compile(r"<doc\b([^>]*)>(.*?)</doc>", re.S)
_DOCID_RE = re.compile(r"""\bdocid\s*=\s*["']([^"']*)["']""")
_SEG_RE = re.compile(r"<seg\b[^>]*?\bid\s*=\s*[\"']?([^\"'\s>]+)[\"']?[^>]*>(.*?)</seg>", re.S)


def parse_docs_xml(text, name):
    """IWSLT XML / WMT sgm: ``<doc docid=..>`` ... ``<seg id=N>text</seg>`` ... ``</doc>``.

    Returns a list of (docid, [(seg_id, text)]) with entities decoded and whitespace normalised.
    """
    docs = []
    for m in _DOC_RE.finditer(text):
        idm = _DOCID_RE.search(m.group(1))
        if idm is None:
            raise DataError(f"{name}: <doc> #{len(docs) + 1} has no docid attribute")
        segs = [(s.group(1), clean(s.group(2))) for s in _SEG_RE.finditer(m.group(2))]
        docs.append((idm.group(1), segs))
    n_open, n_seg = len(re.findall(r"<doc\b", text)), len(re.findall(r"<seg\b", text))
    if not docs or n_open != len(docs) or n_seg != sum(len(s) for _, s in docs):
        raise DataError(f"{name}: could not parse every <doc>/<seg> ({n_open} <doc>, {n_seg} <seg> tags, "
                        f"parsed {len(docs)} docs / {sum(len(s) for _, s in docs)} segs)")
    return docs


def pair_docs_xml(docs_en, docs_de, name):
    """Align two parsed XML/sgm files document by document and segment by segment (ids must agree)."""
    if [d for d, _ in docs_en] != [d for d, _ in docs_de]:
        raise DataError(f"{name}: the en and de files have different document ids")
    out = []
    for (docid, se), (_, sd) in zip(docs_en, docs_de):
        if [i for i, _ in se] != [i for i, _ in sd]:
            raise DataError(f"{name}: document {docid}: the en and de files have different <seg> ids")
        out.append((docid, [(e, d) for (_, e), (_, d) in zip(se, sd)]))
    return out


def _maruf_paths(data_dir, maruf_dir, subset, split):
    if maruf_dir:
        up = MARUF_SUBSETS[subset]
        return {lang: resolve_input(os.path.join(maruf_dir, up, f"concatenated_en2de_{split}_{lang}.txt"))
                for lang in LANGS}
    return {lang: resolve_input(os.path.join(data_dir, "docmt_maruf2019_en_de", subset, f"{split}.{lang}"))
            for lang in LANGS}


def load_maruf(data_dir, maruf_dir, subset, split, check=True):
    paths = _maruf_paths(data_dir, maruf_dir, subset, split)
    texts = {lang: read_text(p, MARUF_SHA256[(subset, split, lang)] if check else None) for lang, p in paths.items()}
    return parse_maruf(texts["en"], texts["de"], f"{subset}/{split}")


def load_iwslt14_xml(data_dir, name, check=True):
    """One IWSLT14 XML set (e.g. ``TED.dev2010``) -> [(talk docid, [(en, de)])]."""
    parsed = {}
    for lang in LANGS:
        rel = f"iwslt14_de_en/orig_xml/IWSLT14.{name}.de-en.{lang}.xml"
        parsed[lang] = parse_docs_xml(read_text(resolve_input(os.path.join(data_dir, rel)),
                                                OTHER_SHA256[rel] if check else None), rel)
    return pair_docs_xml(parsed["en"], parsed["de"], f"IWSLT14.{name}")


def load_newstest2014(data_dir, check=True):
    rels = {"en": "wmt/sgm/newstest2014-deen-src.en.sgm", "de": "wmt/sgm/newstest2014-deen-ref.de.sgm"}
    parsed = {lang: parse_docs_xml(read_text(resolve_input(os.path.join(data_dir, rel)),
                                             OTHER_SHA256[rel] if check else None), rel)
              for lang, rel in rels.items()}
    return pair_docs_xml(parsed["en"], parsed["de"], "newstest2014")


def load_maruf_train(train_dir):
    texts = {lang: read_text(resolve_input(os.path.join(train_dir, f"concatenated_en2de_train_{lang}.txt")))
             for lang in LANGS}
    return parse_maruf(texts["en"], texts["de"], f"{train_dir}/concatenated_en2de_train")


def _has_shared_layout(data_dir, sub):
    return bool(data_dir) and os.path.isdir(os.path.join(data_dir, sub))


def load_all(data_dir=None, maruf_dir=None, train_dir=None, check=True, log=print):
    """All sources -> (valid_docs, test_docs, pool) where every *_docs is a list of
    (docid, [(en, de)]) and pool is a list of (source_name, [(docid, pairs)]) in pool order."""
    if not maruf_dir and not _has_shared_layout(data_dir, "docmt_maruf2019_en_de"):
        raise DataError(f"no Maruf document-level files: neither --data-dir {data_dir!r} has "
                        "docmt_maruf2019_en_de/ nor was --maruf-dir given")

    def maruf_docs(subset, split):
        docs = load_maruf(data_dir, maruf_dir, subset, split, check)
        return [(f"maruf_{subset}_{split}:{i + 1}", pairs) for i, pairs in enumerate(docs)]

    test = maruf_docs("europarl7", "test")
    valid = maruf_docs("europarl7", "dev")
    pool = []
    if train_dir:
        docs = load_maruf_train(train_dir)
        pool.append(("maruf_train", [(f"maruf_train:{i + 1}", p) for i, p in enumerate(docs)]))
    for subset in ("iwslt2017_ted", "nc2016"):
        for split in ("dev", "test"):
            pool.append((f"maruf_{subset}_{split}", maruf_docs(subset, split)))
    if _has_shared_layout(data_dir, "iwslt14_de_en/orig_xml"):
        for name in IWSLT14_SETS:
            src = f"iwslt14_xml_{name.split('.')[1]}"
            pool.append((src, [(f"{src}:{docid}", p) for docid, p in load_iwslt14_xml(data_dir, name, check)]))
    else:
        log(f"WARNING: no {data_dir}/iwslt14_de_en/orig_xml: the IWSLT14 TED talks are not in the pool")
    if _has_shared_layout(data_dir, "wmt/sgm"):
        pool.append(("newstest2014", [(f"newstest2014:{docid}", p) for docid, p in load_newstest2014(data_dir, check)]))
    else:
        log(f"WARNING: no {data_dir}/wmt/sgm: newstest2014 is not in the pool")
    return valid, test, pool


# ---------------------------------------------------------------------------------------------
# Dedup
# ---------------------------------------------------------------------------------------------

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


# ---------------------------------------------------------------------------------------------
# Packing
# ---------------------------------------------------------------------------------------------

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

def _write_split(sent_dir, split, docs):
    en, de, ids = [], [], []
    for docid, pairs in docs:
        for e, d in pairs:
            en.append(e)
            de.append(d)
            ids.append(docid)
    write_lines_atomic(os.path.join(sent_dir, f"{split}.en"), en)
    write_lines_atomic(os.path.join(sent_dir, f"{split}.de"), de)
    write_lines_atomic(os.path.join(sent_dir, f"{split}.docids"), ids)
    return len(en)


def cmd_read_sources(args):
    log = lambda m: print(f"[long_docs] {m}", file=sys.stderr)  # noqa: E731
    try:
        valid, test, pool = load_all(args.data_dir, args.maruf_dir, args.train_dir, not args.no_checksum, log)
    except DataError as e:
        sys.exit(f"read-sources: {e}")
    for docid, pairs in valid + test:
        if any(not e or not d for e, d in pairs):
            sys.exit(f"read-sources: empty sentence in held-out document {docid}")
    ids = [docid for docid, _ in valid + test] + [docid for _, docs in pool for docid, _ in docs]
    if len(set(ids)) != len(ids):
        dup = sorted({i for i in ids if ids.count(i) > 1})[:5]
        sys.exit(f"read-sources: document ids are not unique: {dup}")
    new_pool, dstats = dedup_pool(pool, valid + test)
    train = [doc for _, docs in new_pool for doc in docs]
    if not train:
        sys.exit("read-sources: the train pool is empty after deduplication")
    os.makedirs(args.out_dir, exist_ok=True)
    counts = {}
    for split, docs in (("train", train), ("valid", valid), ("test", test)):
        counts[split] = {"sentences": _write_split(args.out_dir, split, docs), "documents": len(docs)}
    total = {k: sum(s[k] for s in dstats.values()) for k in next(iter(dstats.values()))}
    info = {
        "splits": counts,
        "valid_source": "maruf_europarl7_dev", "test_source": "maruf_europarl7_test",
        "train_pool_sources": dstats, "train_pool_total": total,
        "dedup_rule": ("exact match after whitespace normalisation; per pool document in pool order: drop pairs "
                       "with an empty side; drop pairs whose en side is an en sentence or whose de side is a de "
                       f"sentence of valid/test; drop the whole document if >= {DUP_DOC_FRACTION:.0%} (and >= "
                       f"{DUP_DOC_MIN_PAIRS}) of its remaining pairs were kept from earlier documents (second copy "
                       "of a document); else drop each pair already kept (one copy per pair). Remaining pairs keep "
                       "their document and order."),
        "pool_order": [src for src, _ in pool],
    }
    with open(os.path.join(args.out_dir, "sources.json.tmp"), "w", encoding="utf-8") as f:
        json.dump(info, f, indent=1)
    os.replace(os.path.join(args.out_dir, "sources.json.tmp"), os.path.join(args.out_dir, "sources.json"))
    for split in SPLITS:
        log(f"{split}: {counts[split]['sentences']} sentences in {counts[split]['documents']} documents")
    log(f"pool dedup removed {total['removed_heldout_overlap']} pairs overlapping valid/test, "
        f"{total['documents_removed_as_duplicate']} duplicate documents ({total['removed_duplicate_document']} pairs), "
        f"{total['removed_duplicate_pair']} further duplicate pairs, {total['removed_empty']} empty pairs")
    return 0


def cmd_check_inputs(args):
    """check-parallel (data-prep/common/text_tools.py) on every Maruf-format dev/test input pair:
    strict UTF-8, no empty or over-long line, equal line counts; problems name file and line."""
    problems = []
    for subset in MARUF_SUBSETS:
        for split in ("dev", "test"):
            try:
                paths = _maruf_paths(args.data_dir, args.maruf_dir, subset, split)
            except DataError as err:
                problems.append(str(err))
                continue
            problems += text_tools.check_parallel([paths[lang] for lang in LANGS], args.max_words)
    for msg in problems[:20]:
        print(f"check-inputs: {msg}", file=sys.stderr)
    if len(problems) > 20:
        print(f"check-inputs: ... and {len(problems) - 20} more problems", file=sys.stderr)
    return 1 if problems else 0


def cmd_maruf_files(args):
    """Print ``RELPATH<TAB>SHA256`` for every upstream Maruf dev/test file (download list)."""
    for (subset, split, lang), sha in sorted(MARUF_SHA256.items()):
        print(f"{MARUF_SUBSETS[subset]}/concatenated_en2de_{split}_{lang}.txt\t{sha}")
    return 0


def cmd_pack(args):
    out, limit = args.out, args.length
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
                    sys.exit(f"pack: {d}/{split}.{lang} has {len(text[level, lang])} lines, "
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
    return 0


def _map_rows(path):
    rows = []
    for line in read_lines(path):
        i, docid, s, e, n, ns, nt, over = line.split("\t")
        rows.append((docid, int(s), int(e), int(ns), int(nt), int(over)))
    return rows


def cmd_stats(args):
    out = args.out
    with open(os.path.join(out, "sent", "sources.json"), encoding="utf-8") as f:
        sources = json.load(f)
    lengths = [int(x) for x in args.lengths.split()]
    stats = {"direction": "en-de", "splits": sources["splits"],
             "train_pool_sources": sources["train_pool_sources"],
             "train_pool_total": sources["train_pool_total"], "dedup_rule": sources["dedup_rule"],
             "valid_source": sources["valid_source"], "test_source": sources["test_source"],
             "length_unit": "l_i = max(#BPE tokens en, #BPE tokens de) of sentence i; a packed document "
                            "has at most L BPE tokens on each side unless it is one over-length sentence",
             "packed": {}}
    for split in SPLITS:
        ntok = {lang: sum(len(x.split()) for x in read_lines(os.path.join(out, "bpe", f"{split}.{lang}")))
                for lang in LANGS}
        stats["splits"][split]["bpe_tokens"] = ntok
    summary = []
    for limit in lengths:
        per = {}
        for split in SPLITS:
            rows = _map_rows(os.path.join(out, f"L{limit}", f"{split}.map"))
            n = len(rows)
            src = [r[3] for r in rows]
            tgt = [r[4] for r in rows]
            nsent = [r[2] - r[1] for r in rows]
            per[split] = {
                "documents": n, "sentences": sum(nsent),
                "original_documents": len({r[0] for r in rows}),
                "mean_sentences_per_doc": round(sum(nsent) / n, 2) if n else 0,
                "mean_src_tokens": round(sum(src) / n, 1) if n else 0,
                "mean_tgt_tokens": round(sum(tgt) / n, 1) if n else 0,
                "max_src_tokens": max(src, default=0), "max_tgt_tokens": max(tgt, default=0),
                "over_length_single_sentences": sum(r[5] for r in rows),
            }
        stats["packed"][f"L{limit}"] = per
        summary.append(f"  L={limit:<5d} " + "  ".join(
            f"{s}: {per[s]['documents']:>5d} docs (mean {per[s]['mean_src_tokens']:>6.1f}/{per[s]['mean_tgt_tokens']:>6.1f} "
            f"tok, max {max(per[s]['max_src_tokens'], per[s]['max_tgt_tokens'])}, {per[s]['over_length_single_sentences']} over)"
            for s in SPLITS))
    tmp = os.path.join(out, "stats.json.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(stats, f, indent=1)
        f.write("\n")
    os.replace(tmp, os.path.join(out, "stats.json"))
    sp = stats["splits"]
    tot = stats["train_pool_total"]
    print("[long_docs] sentences/documents: " + ", ".join(
        f"{s} {sp[s]['sentences']}/{sp[s]['documents']}" for s in SPLITS), file=sys.stderr)
    print(f"[long_docs] pool dedup: -{tot['removed_heldout_overlap']} pairs overlapping valid/test, "
          f"-{tot['removed_duplicate_pair']} duplicate pairs, -{tot['documents_removed']} whole documents", file=sys.stderr)
    print("[long_docs] packed documents (mean en/de BPE tokens, max, over-length single sentences):", file=sys.stderr)
    for line in summary:
        print(line, file=sys.stderr)
    return 0


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    names = "{read-sources,check-inputs,maruf-files,tokenize,learn-bpe,apply-bpe,pack,stats,count-bin,versions}"
    sub = parser.add_subparsers(dest="cmd", required=True, metavar=names)
    p = sub.add_parser("read-sources", help="read, split and deduplicate the sources")
    p.add_argument("--out-dir", required=True)
    p.add_argument("--data-dir")
    p.add_argument("--maruf-dir")
    p.add_argument("--train-dir")
    p.add_argument("--no-checksum", action="store_true")
    p.set_defaults(func=cmd_read_sources)
    p = sub.add_parser("check-inputs", help="validate the Maruf dev/test inputs (writes nothing)")
    p.add_argument("--data-dir")
    p.add_argument("--maruf-dir")
    p.add_argument("--max-words", type=int, default=text_tools.MAX_WORDS)
    p.set_defaults(func=cmd_check_inputs)
    p = sub.add_parser("maruf-files", help="list the upstream Maruf files and their sha256")
    p.set_defaults(func=cmd_maruf_files)
    text_tools.add_subcommands(sub, ["tokenize", "learn-bpe", "apply-bpe"])
    p = sub.add_parser("pack", help="pack sentences into documents of at most L tokens")
    p.add_argument("--out", required=True)
    p.add_argument("--length", type=int, required=True)
    p.set_defaults(func=cmd_pack)
    p = sub.add_parser("stats", help="write stats.json and print a summary")
    p.add_argument("--out", required=True)
    p.add_argument("--lengths", required=True)
    p.set_defaults(func=cmd_stats)
    text_tools.add_subcommands(sub, ["count-bin", "versions"])
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
