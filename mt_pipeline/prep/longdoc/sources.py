"""Long documents, stage sent: the document-bounded sources read into documents of sentence pairs.

Sources (every one a list of documents, each a list of (en, de) pairs, whitespace-normalised and
with XML entities decoded): the Maruf et al. (2019) document-level dev/test sets (one sentence
per line, a line ``<d>`` starts each document; from ``--data-dir``'s
``docmt_maruf2019_en_de/`` or downloaded), the IWSLT14 TED talks (raw XML, talk boundaries), and
newstest2014 (sgm, ``<doc>`` boundaries); optionally a Maruf-format training set
(``--train-dir``).  Test = Maruf Europarl7 test, valid = Maruf Europarl7 dev, train = the pool of
everything else, deduplicated (:mod:`mt_pipeline.prep.longdoc.dedup`).  Every input's sha256 (of
its *uncompressed* content) is checked against ``data-prep/long_documents/corpus.yaml``.
"""

import functools
import json
import os
import re

from mt_pipeline.prep.fetch import content_sha256, read_content
from mt_pipeline.prep.longdoc.dedup import DUP_DOC_FRACTION, DUP_DOC_MIN_PAIRS, dedup_pool
from mt_pipeline.prep.textio import check_parallel, write_lines_atomic, write_text_atomic

SPLITS = ("train", "valid", "test")
LANGS = ("en", "de")
# IWSLT14 TED talks (raw XML, de-en release; talk boundaries), in the order of fairseq's test set.
IWSLT14_SETS = ("TED.dev2010", "TEDX.dev2012", "TED.tst2010", "TED.tst2011", "TED.tst2012")
#: the folders of the shared data folder (``--data-dir``) the sources are read from: the Maruf et al.
#: dev/test sets (required), the IWSLT14 TED XML and newstest2014's sgm files (each optional)
MARUF_DIR, IWSLT14_XML_DIR, NEWSTEST_DIR = "docmt_maruf2019_en_de", "iwslt14_de_en/orig_xml", "wmt/sgm"
SHARED_INPUTS = (MARUF_DIR, IWSLT14_XML_DIR, NEWSTEST_DIR)


@functools.lru_cache(maxsize=None)
def checksums():
    """``(maruf_subsets, maruf_sha256, other_sha256)`` from the long_documents spec:
    ``{subset: upstream dir}``, ``{(subset, split, lang): sha256}``, ``{path under --data-dir: sha256}``
    (sha256 of the uncompressed content)."""
    from mt_pipeline.prep.spec import load_spec

    spec = load_spec("long_documents")
    maruf = {tuple(d["maruf"]): d["sha256"] for d in spec["downloads"]}
    return dict(spec["maruf_subsets"]), maruf, dict(spec["local_sha256"])


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
    """XML entities decoded, whitespace normalised (every source sentence goes through this)."""
    return norm_ws(unescape_entities(s))


def resolve_input(path):
    """``path`` or ``path.gz``, whichever exists (``path`` is given without .gz)."""
    for p in (path, path + ".gz"):
        if os.path.isfile(p):
            return p
    raise DataError(f"missing input {path}[.gz]")


def read_text(path, expected_sha=None):
    """Decoded UTF-8 text of ``path`` (gunzipped if it ends in .gz); checks the sha256 of
    the uncompressed bytes when ``expected_sha`` is given.

    Raises:
        DataError: the sha256 differs (the message names the file and both values)."""
    data = read_content(path)
    if expected_sha is not None:
        actual = content_sha256(data)
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

    Raises:
        DataError: unequal line counts, a ``<d>`` on one side only, text before the first ``<d>``,
        or no ``<d>`` at all."""
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

    Raises:
        DataError: a ``<doc>`` without docid, or tags that could not all be parsed."""
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
    """Align two parsed XML/sgm files document by document and segment by segment (ids must agree).

    Raises:
        DataError: the document or segment ids differ."""
    if [d for d, _ in docs_en] != [d for d, _ in docs_de]:
        raise DataError(f"{name}: the en and de files have different document ids")
    out = []
    for (docid, se), (_, sd) in zip(docs_en, docs_de):
        if [i for i, _ in se] != [i for i, _ in sd]:
            raise DataError(f"{name}: document {docid}: the en and de files have different <seg> ids")
        out.append((docid, [(e, d) for (_, e), (_, d) in zip(se, sd)]))
    return out


def maruf_paths(data_dir, maruf_dir, subset, split):
    """``{lang: path}`` of one Maruf dev/test pair: under ``maruf_dir`` (the upstream layout) when
    given, else under ``data_dir/docmt_maruf2019_en_de/``.

    Raises:
        DataError: a file is missing."""
    if maruf_dir:
        up = checksums()[0][subset]
        return {lang: resolve_input(os.path.join(maruf_dir, up, f"concatenated_en2de_{split}_{lang}.txt"))
                for lang in LANGS}
    return {lang: resolve_input(os.path.join(data_dir, "docmt_maruf2019_en_de", subset, f"{split}.{lang}"))
            for lang in LANGS}


def load_maruf(data_dir, maruf_dir, subset, split, check=True):
    """One Maruf dev/test set -> documents of (en, de) pairs (sha256 checked unless ``check`` is False)."""
    paths = maruf_paths(data_dir, maruf_dir, subset, split)
    sha = checksums()[1]
    texts = {lang: read_text(p, sha[(subset, split, lang)] if check else None) for lang, p in paths.items()}
    return parse_maruf(texts["en"], texts["de"], f"{subset}/{split}")


def load_iwslt14_xml(data_dir, name, check=True):
    """One IWSLT14 XML set (e.g. ``TED.dev2010``) -> [(talk docid, [(en, de)])]."""
    parsed, sha = {}, checksums()[2]
    for lang in LANGS:
        rel = f"iwslt14_de_en/orig_xml/IWSLT14.{name}.de-en.{lang}.xml"
        parsed[lang] = parse_docs_xml(read_text(resolve_input(os.path.join(data_dir, rel)),
                                                sha[rel] if check else None), rel)
    return pair_docs_xml(parsed["en"], parsed["de"], f"IWSLT14.{name}")


def load_newstest2014(data_dir, check=True):
    """newstest2014 (sgm: src.en with ref.de) -> [(docid, [(en, de)])]."""
    rels, sha = {"en": "wmt/sgm/newstest2014-deen-src.en.sgm", "de": "wmt/sgm/newstest2014-deen-ref.de.sgm"}, checksums()[2]
    parsed = {lang: parse_docs_xml(read_text(resolve_input(os.path.join(data_dir, rel)),
                                             sha[rel] if check else None), rel)
              for lang, rel in rels.items()}
    return pair_docs_xml(parsed["en"], parsed["de"], "newstest2014")


def load_maruf_train(train_dir):
    """A Maruf-format training set ``train_dir/concatenated_en2de_train_{en,de}.txt[.gz]`` -> documents."""
    texts = {lang: read_text(resolve_input(os.path.join(train_dir, f"concatenated_en2de_train_{lang}.txt")))
             for lang in LANGS}
    return parse_maruf(texts["en"], texts["de"], f"{train_dir}/concatenated_en2de_train")


def _has_shared_layout(data_dir, sub):
    return bool(data_dir) and os.path.isdir(os.path.join(data_dir, sub))


def load_all(data_dir=None, maruf_dir=None, train_dir=None, check=True, log=print):
    """All sources -> (valid_docs, test_docs, pool) where every *_docs is a list of
    (docid, [(en, de)]) and pool is a list of (source_name, [(docid, pairs)]) in pool order.

    Raises:
        DataError: no Maruf files, or a bad source."""
    if not maruf_dir and not _has_shared_layout(data_dir, MARUF_DIR):
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
    if _has_shared_layout(data_dir, IWSLT14_XML_DIR):
        for name in IWSLT14_SETS:
            src = f"iwslt14_xml_{name.split('.')[1]}"
            pool.append((src, [(f"{src}:{docid}", p) for docid, p in load_iwslt14_xml(data_dir, name, check)]))
    else:
        log(f"WARNING: no {data_dir}/iwslt14_de_en/orig_xml: the IWSLT14 TED talks are not in the pool")
    if _has_shared_layout(data_dir, NEWSTEST_DIR):
        pool.append(("newstest2014", [(f"newstest2014:{docid}", p) for docid, p in load_newstest2014(data_dir, check)]))
    else:
        log(f"WARNING: no {data_dir}/wmt/sgm: newstest2014 is not in the pool")
    return valid, test, pool


def check_inputs(data_dir, maruf_dir, max_words):
    """Problems of the line-aligned Maruf dev/test inputs (:func:`~mt_pipeline.prep.textio.check_parallel`:
    strict UTF-8, no empty or over-long line, equal line counts), each naming file and line."""
    problems = []
    for subset in checksums()[0]:
        for split in ("dev", "test"):
            try:
                paths = maruf_paths(data_dir, maruf_dir, subset, split)
            except DataError as err:
                problems.append(str(err))
                continue
            problems += check_parallel([paths[lang] for lang in LANGS], max_words)
    return problems


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


def write_sentences(out_dir, data_dir=None, maruf_dir=None, train_dir=None, check=True, log=print):
    """Read every source, split it into test / valid / the deduplicated train pool, and write
    ``out_dir/{train,valid,test}.{en,de}`` (one raw sentence per line), ``out_dir/SPLIT.docids``
    (the document id of every line) and ``out_dir/sources.json`` (counts per source, dedup removals).

    Raises:
        DataError: a bad source, an empty held-out sentence, duplicate document ids, or an empty pool."""
    valid, test, pool = load_all(data_dir, maruf_dir, train_dir, check, log)
    for docid, pairs in valid + test:
        if any(not e or not d for e, d in pairs):
            raise DataError(f"empty sentence in held-out document {docid}")
    ids = [docid for docid, _ in valid + test] + [docid for _, docs in pool for docid, _ in docs]
    if len(set(ids)) != len(ids):
        dup = sorted({i for i in ids if ids.count(i) > 1})[:5]
        raise DataError(f"document ids are not unique: {dup}")
    new_pool, dstats = dedup_pool(pool, valid + test)
    train = [doc for _, docs in new_pool for doc in docs]
    if not train:
        raise DataError("the train pool is empty after deduplication")
    os.makedirs(out_dir, exist_ok=True)
    counts = {}
    for split, docs in (("train", train), ("valid", valid), ("test", test)):
        counts[split] = {"sentences": _write_split(out_dir, split, docs), "documents": len(docs)}
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
    write_text_atomic(os.path.join(out_dir, "sources.json"), json.dumps(info, indent=1))
    for split in SPLITS:
        log(f"{split}: {counts[split]['sentences']} sentences in {counts[split]['documents']} documents")
    log(f"pool dedup removed {total['removed_heldout_overlap']} pairs overlapping valid/test, "
        f"{total['documents_removed_as_duplicate']} duplicate documents ({total['removed_duplicate_document']} pairs), "
        f"{total['removed_duplicate_pair']} further duplicate pairs, {total['removed_empty']} empty pairs")
    return counts
