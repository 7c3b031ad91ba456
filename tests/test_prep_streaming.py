"""The streamed data-prep stages (mt_pipeline.prep: raw, tok, clean / valid carving, tc) give the
bytes the in-memory code gave, with one process and with a worker pool, on real text.

Each file is read in chunks smaller than the file (so chunk boundaries fall inside it and the last
chunk is short); the references are the in-memory functions as they were before the stages
streamed (``old_tokenize``, ``old_clean``, ``old_carve`` below: the committed code, kept here because
they are short) or sacremoses's own ``MosesTruecaser.train``.  The text is Tatoeba De-En, WMT
newstest and the IWSLT14 dev/test XML of ../shared/data, plus lines with U+2028 / U+0085 (the files
are split on ``\\n`` only) and an empty last line.  A stage that fails or is killed midway leaves no
output file, and a pool worker that stops (``SystemExit``) stops the stage instead of hanging it.
"""

import gzip
import io
import os
import signal
import subprocess
import sys
import tarfile
import time
import types

import pytest

from mt_pipeline.prep import raw, sentence, tc, textio, tok
from mt_pipeline.prep import spec as prep_spec
from mt_pipeline.prep.run import PrepRun, remove_run_leftovers

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = os.path.normpath(os.path.join(ROOT, "..", "shared", "data"))
needs_data = pytest.mark.skipif(not os.path.isdir(os.path.join(DATA, "tatoeba_manythings_deu_eng_2018")),
                                reason="../shared/data is not here")
CHUNK = 97  # lines per chunk in these tests: much smaller than the files
# lines the readers must not split (str.splitlines and codecs readers do) and odd whitespace
ODD = {"de": ["Er sagte:\u2028„Nein.“", "Zeile\u0085mit NEL – und ’Apostroph’.", "Tab\tund  Leerzeichen ."],
       "en": ["He said:\u2028\"No.\"", "Line\u0085with NEL - and it’s done.", "Tab\tand  spaces ."],
       "ro": ["Şi\u2028ţara îşi „spune” – ‘da’.", "Linie\u0085cu NEL şi ţ.", "Tab\tşi  spaţii ."]}


def gz_lines(path, n=None):
    with gzip.open(path, "rt", encoding="utf-8", newline="\n") as f:
        lines = f.read().split("\n")[:-1]
    return lines[:n] if n else lines


def real_text(lang, n=600):
    """Real lines of ``lang`` (Tatoeba + newstest; Romanian: newstest2016), the odd lines spread
    inside, and an empty last line."""
    if lang == "ro":
        lines = gz_lines(f"{DATA}/wmt/plain/newstest2016.ro-en.ro.gz", 2 * n)
    else:
        lines = (gz_lines(f"{DATA}/tatoeba_manythings_deu_eng_2018/tatoeba.{lang}.gz", n)
                 + gz_lines(f"{DATA}/wmt/plain/newstest2013.de-en.{lang}.gz", n))
    for i, line in enumerate(ODD[lang]):
        lines.insert(CHUNK * (i + 1) - i, line)  # at / next to chunk boundaries
    return lines + [""]


def write(path, lines):
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        f.write("".join(line + "\n" for line in lines))


def text_of(lines):
    return "".join(line + "\n" for line in lines).encode("utf-8")


# ---------------------------------------------------------------------------------------------
# the reference: the in-memory code before the stages streamed (mt_pipeline/prep/tok.py)
# ---------------------------------------------------------------------------------------------
def old_tokenize(lines, lang, r):
    from sacremoses import MosesPunctNormalizer, MosesTokenizer

    if r.get("pretokenized"):
        return [" ".join(l.split()).lower() if r.get("lowercase") else " ".join(l.split()) for l in lines]
    norm = MosesPunctNormalizer(lang=lang) if r.get("normalize_punct") else None
    mt = MosesTokenizer(lang=lang if lang not in ("zh", "ja") else "en")
    seg = tok._segmenter(lang)
    out = []
    for line in lines:
        if lang == "ro" and r.get("romanian"):
            line = tok.romanian_normalise(line)
        if norm is not None:
            line = norm.normalize(line)
        if r.get("remove_non_printing"):
            line = tok.remove_non_printing(line)
        if r.get("replace_apostrophe"):
            line = line.replace("\u2019", "'")
        if seg is not None:
            line = seg(line)
        t = mt.tokenize(line, escape=r.get("escape", True), return_str=True,
                        aggressive_dash_splits=r.get("aggressive_dash_splits", False))
        if r.get("perl_final_period", True):
            t = tok.moses_final_period(t) if t.strip() else ""
        if r.get("lowercase"):
            t = t.lower()
        out.append(t)
    return out


def old_clean(cols, c):
    keep = [i for i in range(len(cols[0])) if tok.clean_ok([col[i] for col in cols], c)]
    return [[col[i] for i in keep] for col in cols]


def old_carve(lines, every):
    return ([x for i, x in enumerate(lines, 1) if i % every == 0], [x for i, x in enumerate(lines, 1) if i % every != 0])


def read_bytes(path):
    with open(path, "rb") as f:
        return f.read()


# ---------------------------------------------------------------------------------------------
# 1. tok: every recipe option, one process and a pool
# ---------------------------------------------------------------------------------------------
RECIPES = [
    ("de", {}),  # the defaults: escape, perl final period
    ("de", {"normalize_punct": True, "remove_non_printing": True, "aggressive_dash_splits": True}),  # WMT14 train
    ("en", {"replace_apostrophe": True, "escape": False, "perl_final_period": False, "lowercase": True}),
    ("ro", {"romanian": True, "normalize_punct": True, "remove_non_printing": True}),  # WMT16 Ro
    ("en", {"pretokenized": True, "lowercase": True}),
    ("de", {"pretokenized": True}),
]


@needs_data
@pytest.mark.parametrize("lang,r", RECIPES, ids=lambda x: x if isinstance(x, str) else ",".join(x) or "defaults")
def test_tokenize_file_equals_the_in_memory_tokeniser(tmp_path, lang, r):
    """tokenize_file with 1 and 2 workers, chunks of 97 lines: the bytes of the in-memory tokeniser
    on the whole file; one output line per input line (U+2028 / U+0085 lines stay one line)."""
    lines = real_text(lang)
    src = tmp_path / f"raw.{lang}"
    write(src, lines)
    want = text_of(old_tokenize(lines, lang, r))
    assert len(want.split(b"\n")) == len(lines) + 1
    for workers in (1, 2):
        dst = tmp_path / f"tok{workers}.{lang}"
        assert tok.tokenize_file(str(src), str(dst), lang, r, workers, chunk=CHUNK) == len(lines)
        assert read_bytes(dst) == want, f"workers={workers}"
    assert tok.tokenize_lines(lines, lang, r) == old_tokenize(lines, lang, r)


def _fake_segmenters(tmp_path, monkeypatch):
    """Stand-ins for jieba and KyTea (not installed here)."""
    d = tmp_path / "fake"
    d.mkdir()
    (d / "jieba.py").write_text("def cut(s):\n    return iter(s)\n")  # one word per character
    (d / "Mykytea.py").write_text("class Mykytea:\n    def __init__(self, opt):\n        pass\n"  # two characters a word
                                  "    def getWS(self, s):\n        return [s[i:i + 2] for i in range(0, len(s), 2)]\n")
    monkeypatch.syspath_prepend(str(d))
    for mod in ("jieba", "Mykytea"):
        monkeypatch.delitem(sys.modules, mod, raising=False)


@pytest.mark.parametrize("lang", ["zh", "ja"])
def test_segmented_languages_stream_with_a_segmenter_per_process(tmp_path, monkeypatch, lang):
    """zh / ja: segmented first (a stand-in segmenter, created in each worker), then tokenized;
    the same bytes with 1 and 2 workers as in memory."""
    _fake_segmenters(tmp_path, monkeypatch)
    base = ["我们今天去北京，好吗？", "他说：“不。”", "東京に行きます。", "A mixed line, with English.", "价格是 3.5 元。"]
    lines = [f"{base[i % len(base)]} {i}" for i in range(400)] + ["行\u2028分隔", ""]
    src = tmp_path / f"raw.{lang}"
    write(src, lines)
    want = text_of(old_tokenize(lines, lang, {}))
    segmenter = tok._segmenter
    monkeypatch.setattr(tok, "_segmenter", lambda lang: None)
    assert want != text_of(old_tokenize(lines, lang, {}))  # the segmenter does something
    monkeypatch.setattr(tok, "_segmenter", segmenter)
    for workers in (1, 2):
        dst = tmp_path / f"tok{workers}.{lang}"
        tok.tokenize_file(str(src), str(dst), lang, {}, workers, chunk=CHUNK)
        assert read_bytes(dst) == want, f"workers={workers}"


# ---------------------------------------------------------------------------------------------
# 2. clean-corpus-n and the carved valid set
# ---------------------------------------------------------------------------------------------
@needs_data
def test_clean_and_carve_stream_both_sides_together(tmp_path):
    """clean_train and carve_valid on tokenized real text (pairs of every fate: too long, bad
    ratio, empty): the files the in-memory code wrote; unequal files are refused, not misaligned."""
    de = old_tokenize(real_text("de"), "de", {})
    en = old_tokenize(real_text("en"), "en", {})
    en[5], de[7] = " ".join(["w"] * 30), ""  # a ratio and an empty line to clean
    c = {"ratio": 1.5, "min": 1, "max": 20}
    run = PrepRun("t", str(tmp_path))
    for l, lines in (("de", de), ("en", en)):
        write(tmp_path / f"train.{l}", lines)
    tok.clean_train(run, str(tmp_path), ["de", "en"], c)
    cde, cen = old_clean([de, en], c)
    assert 0 < len(cde) < len(de) - 3
    assert read_bytes(tmp_path / "train.de") == text_of(cde) and read_bytes(tmp_path / "train.en") == text_of(cen)
    tok.carve_valid(run, str(tmp_path), ["de", "en"], 23)
    for l, lines in (("de", cde), ("en", cen)):
        valid, train = old_carve(lines, 23)
        assert read_bytes(tmp_path / f"valid.{l}") == text_of(valid) and read_bytes(tmp_path / f"train.{l}") == text_of(train)
    write(tmp_path / "train.en", cen[:-2])
    before = read_bytes(tmp_path / "train.de")
    with pytest.raises(SystemExit):
        tok.clean_train(run, str(tmp_path), ["de", "en"], c)
    assert read_bytes(tmp_path / "train.de") == before and sorted(os.listdir(tmp_path)) == [
        "train.de", "train.en", "valid.de", "valid.en"]


# ---------------------------------------------------------------------------------------------
# 3. truecasing
# ---------------------------------------------------------------------------------------------
@needs_data
def test_truecaser_learned_streamed_equals_sacremoses_train_and_applies_the_same(tmp_path):
    """The model learned line by line is sacremoses ``train``'s (same counts, same file); every split
    truecased with 1 and 2 workers (and a language copied) has the bytes of truecase_lines in memory."""
    from sacremoses import MosesTruecaser

    lines = {l: old_tokenize(real_text(l), l, {}) for l in ("de", "en")}
    tok_dir, run = tmp_path / "tok", PrepRun("t", str(tmp_path))
    tok_dir.mkdir()
    for l, x in lines.items():
        write(tok_dir / f"train.{l}", x)
        write(tok_dir / f"test.{l}", x[::-1])
    ref = MosesTruecaser()
    ref.train((line.split() for line in lines["de"]), possibly_use_first_token=False)
    got = tc.learn_truecaser(textio.iter_lines(str(tok_dir / "train.de")))
    assert got.model == ref.model and list(got.model["casing"]) == list(ref.model["casing"])
    for workers in (1, 2):
        run.workers = workers
        d = tmp_path / f"tc{workers}"
        d.mkdir()
        tc.truecase_files(run, str(tok_dir), str(d), ["train", "test"], ["de", "en"], ["de"])
        ref.save_model(str(tmp_path / "ref-model"))
        assert read_bytes(d / "truecase-model.de") == read_bytes(tmp_path / "ref-model")
        for s, x in (("train", lines["de"]), ("test", lines["de"][::-1])):
            assert read_bytes(d / f"{s}.de") == text_of(tc.truecase_lines(x, ref)), (workers, s)
            assert read_bytes(d / f"{s}.en") == read_bytes(tok_dir / f"{s}.en")  # not truecased: copied
    assert read_bytes(tmp_path / "tc1" / "train.de") != read_bytes(tok_dir / "train.de")  # it did truecase


@needs_data
def test_bpe_and_characters_stream_as_in_memory(tmp_path, monkeypatch):
    """apply_bpe (fairseq's IWSLT14 codes, 1 and 2 workers, chunks of 97 lines) and the character
    split give the bytes of the in-memory segmentation; learn_bpe reads its input streamed."""
    from mt_pipeline.prep import bpe

    monkeypatch.setattr(bpe, "APPLY_BPE_CHUNK", CHUNK)
    codes = str(tmp_path / "codes")
    bpe.copy_codes(f"{DATA}/iwslt14_de_en/bpe10k/code.gz", codes)
    lines = [l.lower() for l in old_tokenize(real_text("de"), "de", {})]
    write(tmp_path / "tok.de", lines)
    want = text_of(bpe.apply_bpe_lines(lines, codes))
    for workers in (1, 2):
        bpe.apply_bpe([(str(tmp_path / "tok.de"), str(tmp_path / f"bpe{workers}.de"))], codes, workers)
        assert read_bytes(tmp_path / f"bpe{workers}.de") == want
    bpe.split_chars_files([(str(tmp_path / "tok.de"), str(tmp_path / "char.de"))])
    assert read_bytes(tmp_path / "char.de") == text_of([bpe.split_chars(l) for l in lines])
    bpe.learn_bpe([str(tmp_path / "tok.de")], str(tmp_path / "learned"), 50, log=str(tmp_path / "log" / "bpe.log"))
    from subword_nmt.learn_bpe import learn_bpe as subword_nmt_learn

    ref = io.StringIO()
    subword_nmt_learn([line + "\n" for line in lines], ref, 50, min_frequency=2)
    assert read_bytes(tmp_path / "learned") == ref.getvalue().encode("utf-8") and bpe.count_merges(
        str(tmp_path / "learned")) == 50


# ---------------------------------------------------------------------------------------------
# 4. raw: sources read line by line
# ---------------------------------------------------------------------------------------------
def _iwslt14_archive(path, n=700):
    """A de-en.tgz in the WIT3 layout: train.tags.de-en.{de,en} built from Tatoeba (with the tag
    lines prepare-iwslt14.sh drops, odd lines and a pair clean-corpus-n drops) and the real
    IWSLT14 dev/test XML files."""
    members = {}
    for lang in ("de", "en"):
        lines = gz_lines(f"{DATA}/tatoeba_manythings_deu_eng_2018/tatoeba.{lang}.gz", n)
        for i, line in enumerate(ODD[lang]):
            lines.insert(CHUNK * (i + 1), line)
        lines[200] = "x " * 40 if lang == "de" else "x"  # ratio: cleaned
        head = ["<url>http://www.ted.com/talks/x.html</url>", "<keywords>talks</keywords>", "<talkid>1</talkid>",
                f"<title>{'Titel' if lang == 'de' else 'Title'}: A talk</title>",
                f"<description>{'Beschreibung' if lang == 'de' else 'Description'} of it.</description>"]
        members[f"de-en/train.tags.de-en.{lang}"] = text_of(head + lines + [""])
        for f in os.listdir(f"{DATA}/iwslt14_de_en/orig_xml"):
            if f.endswith(f".de-en.{lang}.xml.gz"):
                members[f"de-en/{f[:-3]}"] = gzip.decompress(read_bytes(f"{DATA}/iwslt14_de_en/orig_xml/{f}"))
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with tarfile.open(path, "w:gz") as t:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            t.addfile(info, io.BytesIO(data))
    return {k: v.decode("utf-8") for k, v in members.items()}


@needs_data
def test_iwslt14_prep_from_an_archive_equals_the_in_memory_stages(tmp_path, monkeypatch):
    """The raw and tok stages of ``mt-prep iwslt14_de_en --download --workers 2`` on a de-en.tgz already in download/ (members
    streamed from the archive; iwslt_tags and seg formats; lowercase, escaping, ’ -> ' on the test
    sets; clean-corpus-n; valid = every 23rd pair), chunks of 97 lines: raw/ and tok/ are the files
    the in-memory stages write."""
    monkeypatch.setattr(tok, "TOK_CHUNK", CHUNK)
    out = tmp_path / "out"
    members = _iwslt14_archive(str(out / "download" / "de-en.tgz"))
    spec = prep_spec.load_spec("iwslt14_de_en")
    args = types.SimpleNamespace(variant=None, truecase=None, bpe=None, bpe_merges=None, dictionary=None,
                                 word_vocab=None, char_vocab=None, bpe_codes=None, no_checksum=True)
    p = sentence.SentencePrep(spec, args, PrepRun("iwslt14_de_en", str(out), workers=2), "download", None)
    sentence.stage_raw(p)  # (the stages up to tok/: bin/ is fairseq-preprocess's)
    sentence.stage_tok(p)
    r = spec["recipe"]
    rawref, tokref = {}, {}
    for split, srcs in spec["splits"].items():
        for lang in ("de", "en"):
            rawref[split, lang] = [y for x in srcs for y in raw.extract(members[x["file"].format(lang=lang)], x["format"])]
            tokref[split, lang] = old_tokenize(rawref[split, lang], lang, tok.split_recipe(r, split))
            assert read_bytes(out / "raw" / f"{split}.{lang}") == text_of(rawref[split, lang]), (split, lang)
    cleaned = old_clean([tokref["train", "de"], tokref["train", "en"]], r["clean"])
    for lang, lines in zip(("de", "en"), cleaned):
        tokref["valid", lang], tokref["train", lang] = old_carve(lines, r["valid_every"])
    assert len(tokref["valid", "de"]) == len(cleaned[0]) // 23 > 20
    for (split, lang), lines in tokref.items():
        assert read_bytes(out / "tok" / f"{split}.{lang}") == text_of(lines), (split, lang)
    assert any("\u2028" in line for line in rawref["train", "de"]) and len(tokref["train", "de"]) > 600


@needs_data
def test_raw_source_prefix_checksum_and_utf8_errors_as_before(tmp_path, capsys, monkeypatch):
    """``lines: N`` takes a prefix but the recorded sha256 still covers the whole file (the rest is
    read); a checksum mismatch is reported before a UTF-8 error; a UTF-8 error names the line and
    the byte offset in the whole content (as when the file was decoded at once); nothing is written."""
    import hashlib

    monkeypatch.setattr(raw, "READ_BLOCK", 2000)  # blocks of lines much smaller than the file
    lines = real_text("de", 300)
    data = text_of(lines)
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "t.de.gz").write_bytes(gzip.compress(data))
    (tmp_path / "in" / "t.en.gz").write_bytes(gzip.compress(text_of(real_text("en", 300))))
    sha = {"de": hashlib.sha256(data).hexdigest()}
    spec = {"name": "t", "langs": ["de", "en"], "splits": {}, "recipe": {},
            "local": {"splits": {"test": [{"file": "t.{lang}.gz", "lines": 250, "sha256": sha}]}}}
    src = raw.Sources(spec, "local", str(tmp_path / "in"), str(tmp_path / "dl"))
    (x,) = src.of("test")
    assert src.read(x, "de") == lines[:250]
    out = tmp_path / "raw"
    out.mkdir()
    raw.write_splits(PrepRun("t", str(tmp_path)), src, ["test"], str(out))
    assert read_bytes(out / "test.de") == text_of(lines[:250])
    # a change after the prefix: the checksum still sees it
    bad = data[:-40] + b"\xff" + data[-39:]
    (tmp_path / "in" / "t.de.gz").write_bytes(gzip.compress(bad))
    with pytest.raises(SystemExit, match="sha256 mismatch for the content of"):
        src.read(x, "de")
    (tmp_path / "raw2").mkdir()
    with pytest.raises(SystemExit):
        raw.write_splits(PrepRun("t", str(tmp_path)), src, ["test"], str(tmp_path / "raw2"))
    assert "sha256 mismatch" in capsys.readouterr().err and not os.listdir(tmp_path / "raw2")
    # without the checksum and the prefix: the UTF-8 error, where the whole-content decode put it
    x2 = {"file": "t.{lang}.gz"}
    try:
        bad.decode("utf-8")
    except UnicodeDecodeError as err:
        line = bad[:err.start].count(b"\n") + 1
        where = f"{tmp_path}/in/t.de.gz:{line}: invalid UTF-8 at byte {err.start}"
    with pytest.raises(SystemExit) as e:
        src.read(x2, "de")
    assert str(e.value) == where


# ---------------------------------------------------------------------------------------------
# 5. failures: no partial output, no hung pool, bounded memory
# ---------------------------------------------------------------------------------------------
@needs_data
@pytest.mark.parametrize("workers", [1, 2])
def test_a_failing_chunk_stops_the_stage_and_leaves_no_output(tmp_path, monkeypatch, workers):
    """A line whose tokenisation stops (``SystemExit``, as "a line break survived") in the 4th chunk:
    with a pool too the stage stops with the message (the worker does not die and leave the pool
    waiting); the output file is the one from before, and no temp file is left."""
    lines = real_text("en")
    lines[3 * CHUNK + 5] = "BOOM here"
    real = tok.moses_final_period

    def final_period(t):
        if "BOOM" in t:
            raise SystemExit(f"tokenize: a line break survived tokenisation: {t!r}")
        return real(t)

    monkeypatch.setattr(tok, "moses_final_period", final_period)  # (inherited by the forked workers)
    (tmp_path / "raw").mkdir()
    (tmp_path / "tok").mkdir()
    write(tmp_path / "raw" / "train.en", lines)
    (tmp_path / "tok" / "train.en").write_text("the previous output\n")
    run = PrepRun("t", str(tmp_path), workers=workers)
    signal.signal(signal.SIGALRM, lambda *_: pytest.fail("the stage hung"))
    signal.alarm(120)
    try:
        with pytest.raises(SystemExit):
            tok.tokenize_files(run, str(tmp_path / "raw"), str(tmp_path / "tok"), ["train"], ["en"], lambda s: {})
    finally:
        signal.alarm(0)
    assert os.listdir(tmp_path / "tok") == ["train.en"]
    assert (tmp_path / "tok" / "train.en").read_text() == "the previous output\n"


@needs_data
def test_a_killed_stage_leaves_no_partial_output(tmp_path):
    """SIGKILL while tokenize_file is writing (its temp file already holds lines): the output file
    does not exist; the temp file left is what the next run's lock removes."""
    lines = gz_lines(f"{DATA}/tatoeba_manythings_deu_eng_2018/tatoeba.en.gz", 60000)
    write(tmp_path / "raw.en", lines)
    code = ("import sys; from mt_pipeline.prep import tok; "
            "tok.tokenize_file(sys.argv[1], sys.argv[2], 'en', {}, 2, chunk=500)")
    p = subprocess.Popen([sys.executable, "-c", code, str(tmp_path / "raw.en"), str(tmp_path / "tok.en")],
                         cwd=ROOT, start_new_session=True)
    try:
        deadline = time.time() + 120
        while time.time() < deadline and p.poll() is None:
            tmp = [f for f in os.listdir(tmp_path) if f.endswith(".tmp")]
            if tmp and os.path.getsize(tmp_path / tmp[0]) > 0:
                break
            time.sleep(0.02)
        assert p.poll() is None, "finished before it could be killed"
    finally:
        os.killpg(p.pid, signal.SIGKILL)  # the stage and its pool workers
        p.wait()
    assert not (tmp_path / "tok.en").exists()
    assert [f for f in os.listdir(tmp_path) if f.endswith(".tmp")]
    remove_run_leftovers(str(tmp_path))
    assert sorted(os.listdir(tmp_path)) == ["raw.en"]


def test_map_chunks_keeps_few_chunks_in_flight():
    """Over a pool of 2, at most ``ahead`` chunks are read and not yet returned (Pool.imap would
    read the whole input at once), and the results come in input order."""
    read = []

    def chunks():
        for i in range(50):
            read.append(i)
            yield [i] * 3

    with textio.worker_pool(2, int) as pool:  # (int(): a no-op initializer)
        out = []
        for res in textio.map_chunks(sorted, chunks(), pool, ahead=4):
            out.append(res)
            assert len(read) - len(out) <= 4
    assert out == [[i] * 3 for i in range(50)]
    assert list(textio.chunked(range(7), 3)) == [[0, 1, 2], [3, 4, 5], [6]] and list(textio.chunked([], 3)) == []


def _failing_init():
    raise ImportError("No module named 'jieba'")


def test_a_worker_whose_setup_fails_stops_the_stage():
    """An initializer that raises in the workers (a segmenter that cannot load) makes the first
    chunk raise it, instead of a pool that restarts its workers forever."""
    signal.signal(signal.SIGALRM, lambda *_: pytest.fail("the pool hung"))
    signal.alarm(60)
    try:
        with pytest.raises(ImportError, match="jieba"):
            with textio.worker_pool(2, _failing_init) as pool:
                list(textio.map_chunks(sorted, iter([[2, 1]] * 5), pool))
    finally:
        signal.alarm(0)
