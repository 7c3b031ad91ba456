"""Tests of data-prep/long_documents (packing rule, parsers on the real files, dedup, CLI errors).

Fast (a few seconds): no tokenisation, BPE or fairseq-preprocess.  The parser tests read
../shared/data and are skipped when it is absent.
"""

import os
import random
import subprocess

import pytest

from mt_pipeline.prep.longdoc import dedup, pack, sources

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PREP_DIR = os.path.join(ROOT, "data-prep", "long_documents")
PREPARE = os.path.join(PREP_DIR, "prepare.sh")
DATA_DIR = os.path.join(ROOT, "..", "shared", "data")

needs_data = pytest.mark.skipif(not os.path.isdir(os.path.join(DATA_DIR, "docmt_maruf2019_en_de")),
                                reason="../shared/data (docmt_maruf2019_en_de) not available")


# ---------------------------------------------------------------------------------------------
# Packing rule (Appendix B)
# ---------------------------------------------------------------------------------------------

def test_pack_lengths_exact_boundaries():
    # 3+4 = 7 <= 7 (equality allowed), +2 would be 9 > 7; then 2+5 = 7; then 1.
    assert pack.pack_lengths([3, 4, 2, 5, 1], 7) == [(0, 2), (2, 4), (4, 5)]
    # 3+3 = 6 <= 7 but 3+3+3 = 9 > 7 -> the next document starts with sentence 3.
    assert pack.pack_lengths([3, 3, 3, 3], 7) == [(0, 2), (2, 4)]
    assert pack.pack_lengths([7], 7) == [(0, 1)]
    assert pack.pack_lengths([], 7) == []


def test_pack_lengths_over_length_sentence_is_its_own_document():
    # 10 > 6: a one-sentence document; the packing then restarts after it.
    assert pack.pack_lengths([2, 10, 3, 2, 1], 6) == [(0, 1), (1, 2), (2, 5)]  # 3+2+1 = 6
    assert pack.pack_lengths([2, 10, 3, 3, 1], 6) == [(0, 1), (1, 2), (2, 4), (4, 5)]  # 3+3+1 > 6
    assert pack.pack_lengths([10, 10], 6) == [(0, 1), (1, 2)]
    assert pack.pack_lengths([2, 3, 10], 6) == [(0, 2), (2, 3)]


def test_pack_lengths_rule_holds_on_random_input():
    rng = random.Random(0)
    for _ in range(300):
        limit = rng.randint(1, 60)
        lengths = [rng.randint(0, 40) for _ in range(rng.randint(0, 30))]
        ranges = pack.pack_lengths(lengths, limit)
        # contiguous cover of all sentences, in order
        assert [i for s, e in ranges for i in range(s, e)] == list(range(len(lengths)))
        for s, e in ranges:
            total = sum(lengths[s:e])
            if total > limit:  # only a single over-length sentence may exceed L
                assert e - s == 1 and lengths[s] > limit
            if e < len(lengths):  # maximal: one more sentence would exceed L
                assert total + lengths[e] > limit


def test_pack_split_never_crosses_documents_and_counts_max_of_both_sides():
    docids = ["a", "a", "a", "b", "b"]
    src = ["x x", "x", "x x x x x x x x", "x", "x"]  # 2 1 8 1 1 BPE tokens
    tgt = ["y", "y y y", "y", "y", "y"]            # 1 3 1 1 1
    # l_i = max(src, tgt) = 2 3 8 1 1; L = 5: doc a -> [0,2) (2+3=5), [2,3) over-length (8 > 5);
    # doc b -> [3,5) even though a's last document had room: documents never cross.
    packed = pack.pack_split(docids, src, tgt, 5)
    assert [(d, s, e) for d, s, e, *_ in packed] == [("a", 0, 2), ("a", 2, 3), ("b", 3, 5)]
    assert [(ns, nt, over) for *_, ns, nt, over in packed] == [(3, 4, 0), (8, 1, 1), (2, 2, 0)]
    # with the source length alone, [0,3) would not fit either, but [0,2) is decided by the
    # target: 1+3 = 4 and the source 2+1 = 3 -> both sides <= L.
    packed = pack.pack_split(docids, src, tgt, 100)
    assert [(d, s, e) for d, s, e, *_ in packed] == [("a", 0, 3), ("b", 3, 5)]


def test_pack_subcommand_writes_aligned_levels(tmp_path):
    out = tmp_path
    sent = {"en": ["A b.", "C d e.", "F.", "G h."], "de": ["A b.", "C d.", "F g h i.", "J."]}
    ids = ["d1", "d1", "d1", "d2"]
    for sub in ("sent", "tok", "bpe"):
        os.makedirs(out / sub)
    for split in pack.SPLITS:
        (out / "sent" / f"{split}.docids").write_text("\n".join(ids) + "\n")
        for lang in sources.LANGS:
            text = "\n".join(sent[lang]) + "\n"
            (out / "sent" / f"{split}.{lang}").write_text(text)
            tok = "\n".join(s.replace(".", " .") for s in sent[lang]) + "\n"
            (out / "tok" / f"{split}.{lang}").write_text(tok)
            (out / "bpe" / f"{split}.{lang}").write_text(tok)
    pack.write_packed(str(out), 6)
    # l = max(3,3)=3, max(4,3)=4, max(2,5)=5, max(3,2)=3 -> d1: [0,1) [1,2) [2,3) (3+4 > 6, 4+5 > 6); d2: [3,4)
    ldir = out / "L6"
    assert (ldir / "raw" / "test.en").read_text().splitlines() == ["A b.", "C d e.", "F.", "G h."]
    pack.write_packed(str(out), 7)
    ldir = out / "L7"
    assert (ldir / "raw" / "test.en").read_text().splitlines() == ["A b. C d e.", "F.", "G h."]
    assert (ldir / "raw" / "valid.de").read_text().splitlines() == ["A b. C d.", "F g h i.", "J."]
    assert (ldir / "tok" / "test.en").read_text().splitlines() == ["A b . C d e .", "F .", "G h ."]
    assert (ldir / "bpe" / "train.de").read_text().splitlines() == ["A b . C d .", "F g h i .", "J ."]
    assert not (ldir / "raw" / "train.en").exists()
    rows = [r.split("\t") for r in (ldir / "test.map").read_text().splitlines()]
    assert [(r[1], r[2], r[3]) for r in rows] == [("d1", "0", "2"), ("d1", "2", "3"), ("d2", "3", "4")]


# ---------------------------------------------------------------------------------------------
# Parsers
# ---------------------------------------------------------------------------------------------

def test_parse_maruf_crlf_and_errors():
    en = "<d>\r\nHello  world.\r\nBye.\r\n<d>\r\nNext &amp; last.\r\n"
    de = "<d>\r\nHallo Welt.\r\nTschüss.\r\n<d>\r\nNächste.\r\n"
    docs = sources.parse_maruf(en, de, "x")
    assert docs == [[("Hello world.", "Hallo Welt."), ("Bye.", "Tschüss.")], [("Next & last.", "Nächste.")]]
    with pytest.raises(sources.DataError, match="one side only"):
        sources.parse_maruf("<d>\na\n<d>\nb\n", "<d>\na\nb\n<d>\n", "x")
    with pytest.raises(sources.DataError, match="lines"):
        sources.parse_maruf("<d>\na\n", "<d>\n", "x")
    with pytest.raises(sources.DataError, match="before the first"):
        sources.parse_maruf("a\n<d>\nb\n", "a\n<d>\nb\n", "x")


def test_parse_docs_xml_and_entities():
    text = ('<refset>\n<doc docid="7" genre="x">\n<talkid>7</talkid>\n<seg id="1"> A &amp; B &lt;3 </seg>\n'
            '<seg id="2">S&P 500</seg>\n</doc>\n<doc sysid="ref" docid="n-2">\n<seg id="1">x</seg>\n</doc>\n</refset>\n')
    assert sources.parse_docs_xml(text, "t") == [("7", [("1", "A & B <3"), ("2", "S&P 500")]), ("n-2", [("1", "x")])]
    assert sources.unescape_entities("&amp;lt; &#65;&#x42; &foo;") == "&lt; AB &foo;"
    with pytest.raises(sources.DataError, match="different <seg> ids"):
        sources.pair_docs_xml([("d", [("1", "a")])], [("d", [("2", "b")])], "t")


def test_train_dir_reader_accepts_gz(tmp_path):
    import gzip
    with gzip.open(tmp_path / "concatenated_en2de_train_en.txt.gz", "wt", encoding="utf-8") as f:
        f.write("<d>\nA.\nB.\n<d>\nC.\n")
    (tmp_path / "concatenated_en2de_train_de.txt").write_text("<d>\nA.\nB.\n<d>\nC.\n", encoding="utf-8")
    assert sources.load_maruf_train(str(tmp_path)) == [[("A.", "A."), ("B.", "B.")], [("C.", "C.")]]


def _counts(docs):
    return sum(len(p) for p in docs), len(docs)


@needs_data
@pytest.mark.parametrize("subset,split,n_sent,n_docs", [
    ("europarl7", "test", 5134, 360), ("europarl7", "dev", 3587, 240),
    ("iwslt2017_ted", "dev", 8967, 93), ("iwslt2017_ted", "test", 2271, 23),
    ("nc2016", "dev", 2169, 81), ("nc2016", "test", 2999, 155),
])
def test_maruf_files_match_manifest(subset, split, n_sent, n_docs):
    docs = sources.load_maruf(DATA_DIR, None, subset, split)  # also checks the sha256
    assert _counts(docs) == (n_sent, n_docs)
    assert all(e and d and "\r" not in e + d for p in docs for e, d in p)


@needs_data
@pytest.mark.parametrize("name,n_sent,n_docs", [
    ("TED.dev2010", 887, 8), ("TEDX.dev2012", 1165, 7), ("TED.tst2010", 1565, 11),
    ("TED.tst2011", 1433, 16), ("TED.tst2012", 1700, 15),
])
def test_iwslt14_xml_matches_manifest(name, n_sent, n_docs):
    docs = sources.load_iwslt14_xml(DATA_DIR, name)
    assert _counts([p for _, p in docs]) == (n_sent, n_docs)
    assert len({d for d, _ in docs}) == n_docs


@needs_data
def test_newstest2014_sgm_matches_manifest():
    docs = sources.load_newstest2014(DATA_DIR)
    assert _counts([p for _, p in docs]) == (3003, 164)
    first = docs[0][1][0]
    assert first == ("Gutach: Increased safety for pedestrians", "Gutach: Noch mehr Sicherheit für Fußgänger")


@needs_data
def test_checksum_mismatch_is_reported(tmp_path):
    import gzip
    d = tmp_path / "docmt_maruf2019_en_de" / "europarl7"
    d.mkdir(parents=True)
    for lang in sources.LANGS:
        with gzip.open(d / f"test.{lang}.gz", "wt") as f:
            f.write("<d>\nx\n")
    with pytest.raises(sources.DataError, match="sha256 mismatch"):
        sources.load_maruf(str(tmp_path), None, "europarl7", "test")
    assert _counts(sources.load_maruf(str(tmp_path), None, "europarl7", "test", check=False)) == (1, 1)


# ---------------------------------------------------------------------------------------------
# Dedup
# ---------------------------------------------------------------------------------------------

def test_dedup_removes_heldout_sentences_and_duplicates():
    heldout = [("test:1", [("Held out.", "Zurückgehalten."), ("Thanks.", "Danke.")])]
    talk = [(f"S{i}.", f"T{i}.") for i in range(10)]
    pool = [
        ("a", [("a:1", [("New 1.", "Neu 1."), ("Held out.", "Anders."),      # en side in test
                        ("Other.", "Danke."),                               # de side in test
                        ("Thank you.", "Vielen Dank."), ("New 2.", "Neu 2.")]),
               ("a:2", talk)]),
        ("b", [("b:1", [("Thank you.", "Vielen Dank."), ("B.", "B."), ("B2.", "B2."),  # generic repeat
                        ("B3.", "B3."), ("B4.", "B4."), ("B.", "B.")]),                # in-doc repeat
               ("b:2", talk[:8] + [("S8 revised.", "T8 überarbeitet.")]),  # second copy of a:2
               ("b:3", [("", "Leer."), ("Zählt.", "Counts.")]),
               ("b:4", [("New 1.", "Neu 1.")])]),                            # only a duplicate pair
    ]
    new_pool, st = dedup.dedup_pool(pool, heldout)
    docs = {docid: pairs for _, ds in new_pool for docid, pairs in ds}
    assert docs["a:1"] == [("New 1.", "Neu 1."), ("Thank you.", "Vielen Dank."), ("New 2.", "Neu 2.")]
    assert docs["a:2"] == talk
    # one copy per pair; the document keeps its other sentences, in order
    assert docs["b:1"] == [("B.", "B."), ("B2.", "B2."), ("B3.", "B3."), ("B4.", "B4.")]
    assert "b:2" not in docs  # 8 of 9 pairs already kept -> duplicate document, dropped whole
    assert docs["b:3"] == [("Zählt.", "Counts.")]
    assert "b:4" not in docs
    held_en = {e for _, p in heldout for e, _ in p}
    held_de = {d for _, p in heldout for _, d in p}
    for pairs in docs.values():
        assert not any(e in held_en or d in held_de for e, d in pairs)
    assert st["a"]["removed_heldout_overlap"] == 2
    assert st["b"]["removed_duplicate_pair"] == 3        # "Thank you." in b:1, "B." in b:1, b:4
    assert st["b"]["removed_duplicate_document"] == 9
    assert st["b"]["documents_removed_as_duplicate"] == 1
    assert st["b"]["removed_empty"] == 1
    assert (st["b"]["documents_in"], st["b"]["documents"], st["b"]["documents_removed"]) == (4, 2, 2)


def test_dedup_is_whitespace_normalised_via_readers():
    # the readers normalise whitespace, so " Held  out. " in a pool file matches "Held out."
    docs = sources.parse_maruf("<d>\n Held  out. \n", "<d>\nZ.\n", "x")
    _, st = dedup.dedup_pool([("p", [("p:1", docs[0])])], [("t", [("Held out.", "Q.")])])
    assert st["p"]["removed_heldout_overlap"] == 1 and st["p"]["documents"] == 0


# ---------------------------------------------------------------------------------------------
# prepare.sh command line
# ---------------------------------------------------------------------------------------------

def _prepare(*args, **kw):
    return subprocess.run(["bash", PREPARE, *args], capture_output=True, text=True, timeout=60, **kw)


def test_bad_option_names_valid_options():
    r = _prepare("--lenghts", "128")
    assert r.returncode != 0
    assert "unknown option '--lenghts'" in r.stderr
    for opt in ("--data-dir", "--download", "--train-dir", "--out", "--lengths", "--bpe-merges", "--workers", "--dry-run"):
        assert opt in r.stderr


@pytest.mark.parametrize("args,msg", [
    (("--lengths", "128 abc"), "--lengths must be positive integers"),
    (("--lengths", "0"), "--lengths must be positive integers"),
    (("--bpe-merges", "-5"), "--bpe-merges must be a positive integer"),
    (("--workers", "two"), "--workers must be a positive integer"),
    (("--data-dir", "/nonexistent/dir"), "is not a directory"),
    (("--train-dir", "/nonexistent/dir"), "is not a directory: give the directory that holds Maruf et al. (2019)'s "
                                          "Europarl7 training set, concatenated_en2de_train_{en,de}.txt[.gz]"),
    (("--out",), "needs a value"),
])
def test_bad_values_are_rejected(args, msg):
    r = _prepare(*args)
    assert r.returncode != 0 and msg in r.stderr


def test_help():
    r = _prepare("--help")
    assert r.returncode == 0
    assert "--train-dir" in r.stdout and "no stable official URL" in r.stdout


@needs_data
def test_dry_run_writes_nothing(tmp_path):
    out = tmp_path / "out"
    r = _prepare("--dry-run", "--out", str(out), "--lengths", "256,128 256")
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[-1] == str(out)
    assert "would pack L=128" in r.stdout and "would pack L=256" in r.stdout and "L=512" not in r.stdout
    assert "selective-attn/b30c31c8b1014f9cb1ec190658fc2369a6fd015c" in r.stdout
    assert not out.exists()
