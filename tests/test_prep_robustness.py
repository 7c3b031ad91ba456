"""Robustness of the sentence-level data prep (mt_pipeline.prep) on inputs a real run meets.

* control characters in web-crawled WMT training text are replaced by spaces and counted (the
  recipe's remove_non_printing makes them spaces anyway), while dev/test text with one is refused;
* a stage never overwrites or deletes a directory mt-prep did not write (no ``.done`` stamp);
* the sentence pipeline checks fairseq-preprocess's output (joined dictionary, sentence counts);
* the WMT15 De-En recipe filters as Flexible Attention §5.1 says.

The end-to-end tests run ``mt-prep wmt14_en_de`` in process on a tiny synthetic local directory in
the corpus's layout (``plain/train.de-en.LANG.gz``, ``plain/newstest2013.de-en.LANG.gz``,
``sgm/newstest2014-deen-{src,ref}.LANG.sgm.gz``; ``--no-checksum``) with a word vocabulary (no BPE
stage, so no subword-nmt learning) unless a test needs BPE.
"""

import gzip
import os
import types

import pytest

from mt_pipeline.prep import binarize, cli, raw, sentence, tok
from mt_pipeline.prep import spec as prep_spec
from mt_pipeline.prep.run import INCOMPLETE, PrepRun

WORDS = "the house is small and the garden is green while two dogs run down the street".split()
WORTE = "das Haus ist klein und der Garten ist grün während zwei Hunde die Straße hinunter laufen".split()


def _line(words, i, extra=""):
    return " ".join(words[(i + j) % len(words)] for j in range(3 + i % 5)) + extra + " ."


def _gz(path, lines):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with gzip.open(path, "wb") as f:
        f.write(("\n".join(lines) + "\n").encode("utf-8"))


def _sgm(lines):
    return ['<refset setid="newstest2014">', '<doc docid="d1">'] + [
        f'<seg id="{i}">{l}</seg>' for i, l in enumerate(lines, 1)] + ["</doc>", "</refset>"]


def wmt14_local(base, train_de=None, test_de=None, n_train=30, n_valid=6, n_test=8):
    """A synthetic WMT14 En-De local directory; ``train_de`` / ``test_de``: ``{index: line}``
    replacing those German lines.  Returns its path."""
    loc = base / "local"
    de = [_line(WORTE, i) for i in range(n_train)]
    for i, l in (train_de or {}).items():
        de[i] = l
    _gz(str(loc / "plain" / "train.de-en.de.gz"), de)
    _gz(str(loc / "plain" / "train.de-en.en.gz"), [_line(WORDS, i) for i in range(n_train)])
    for lang, words in (("de", WORTE), ("en", WORDS)):
        _gz(str(loc / "plain" / f"newstest2013.de-en.{lang}.gz"), [_line(words, i + 3) for i in range(n_valid)])
    test = [_line(WORTE, i + 7) for i in range(n_test)]
    for i, l in (test_de or {}).items():
        test[i] = l
    _gz(str(loc / "sgm" / "newstest2014-deen-ref.de.sgm.gz"), _sgm(test))
    _gz(str(loc / "sgm" / "newstest2014-deen-src.en.sgm.gz"), _sgm([_line(WORDS, i + 7) for i in range(n_test)]))
    return loc


def mt_prep(loc, out, *extra):
    """``mt-prep wmt14_en_de`` in process (word vocabularies unless ``extra`` says otherwise)."""
    args = ["wmt14_en_de", "--local-dir", str(loc), "--out", str(out), "--no-checksum", "--workers", "1"]
    return cli.main(args + (list(extra) or ["--word-vocab", "100"]))


def read(path):
    with open(path, encoding="utf-8", newline="\n") as f:
        return f.read().split("\n")[:-1]


# ---------------------------------------------------------------------------------------------
# 1. control characters in training text
# ---------------------------------------------------------------------------------------------
def test_control_characters_in_train_become_spaces_and_are_counted(tmp_path, capsys):
    """A BEL and an inner carriage return in two German training lines: the prep runs through
    (bin/ included), the log counts them, raw/ and tok/ have a space where each was, and the other
    lines are untouched."""
    bel, cr = "das Haus\x07ist klein .", "der Garten\rist grün ."
    loc = wmt14_local(tmp_path, train_de={2: bel, 5: cr})
    out = tmp_path / "out"
    assert mt_prep(loc, out) == 0
    log = capsys.readouterr().out
    assert "raw/train.de: replaced 2 control characters in 2 lines by spaces (first: line 3)" in log
    assert "raw/train.en: replaced" not in log
    rawde, tokde = read(out / "raw" / "train.de"), read(out / "tok" / "train.de")
    assert rawde[2] == "das Haus ist klein ." and rawde[5] == "der Garten ist grün ."
    assert "das Haus ist klein ." in tokde and "der Garten ist grün ." in tokde
    assert not any(c in "\x07\r" for l in tokde for c in l)
    assert rawde[0] == _line(WORTE, 0)
    assert (out / "bin" / "dict.de.txt").exists()


def test_a_control_character_in_the_test_set_is_still_refused(tmp_path, capsys):
    """The BLEU reference is not rewritten: a control character in test stops the run at the raw
    stage, naming the split, language and line, and nothing is written."""
    loc = wmt14_local(tmp_path, train_de={2: "das Haus\x07ist klein ."}, test_de={3: "ein\x07Hund ."})
    out = tmp_path / "out"
    with pytest.raises(SystemExit):
        mt_prep(loc, out)
    err = capsys.readouterr().err
    assert "test.de:4: control character '\\x07'" in err and "nothing written" in err
    assert not [f for f in os.listdir(out / "raw") if f != ".done"] and not (out / "tok").exists()
    assert (out / "raw" / ".done").read_text() == INCOMPLETE + "\n"  # not up to date: the next run redoes it


def test_only_train_of_a_recipe_removing_non_printing_characters_is_relaxed():
    """The WMT recipes apply remove_non_printing to train (a list or true): train is relaxed, dev
    and test never; a recipe without it (IWSLT15's pretokenized text) keeps the strict check."""
    wmt14, wmt15, iwslt = (prep_spec.load_spec(c) for c in ("wmt14_en_de", "wmt15_de_en", "iwslt15_en_vi"))
    assert raw.blanks_controls(wmt14, "train") and raw.blanks_controls(wmt15, "train")
    assert not any(raw.blanks_controls(s, split) for s in (wmt14, wmt15) for split in ("valid", "test"))
    assert not raw.blanks_controls(iwslt, "train")
    assert raw.line_problems("train", {"en": ["a\x00b"]}) == [
        "train.en:1: control character '\\x00' (a NUL or control byte in the source; the tokeniser would join "
        "the words around it)"]
    assert raw.line_problems("train", {"en": ["a\tb"]}) == []  # tab is whitespace


# ---------------------------------------------------------------------------------------------
# 2. the WMT15 De-En recipe (Flexible Attention §5.1)
# ---------------------------------------------------------------------------------------------
def test_wmt15_recipe_filters_by_length_only_and_keeps_the_test_punctuation():
    """§5.1 names only the 50-word cut: clean-corpus-n's ratio 9 (as ASPEC, the same paper), so a
    10-word / 4-word pair stays; punctuation is normalised on train and valid, not on newstest2015."""
    spec = prep_spec.load_spec("wmt15_de_en")
    r = prep_spec.effective_recipe(spec)
    assert r["clean"] == {"ratio": 9, "min": 1, "max": 50} == prep_spec.load_spec("aspec_en_ja")["recipe"]["clean"]
    assert tok.clean_ok([" ".join(["w"] * 10), "a b c d"], r["clean"])
    assert not tok.clean_ok([" ".join(["w"] * 51), " ".join(["v"] * 50)], r["clean"])
    assert [tok.split_recipe(r, s)["normalize_punct"] for s in ("train", "valid", "test")] == [True, True, False]
    line = ['"Sie gehen," sagte er.']  # the normaliser moves the comma outside the quotes
    train, test = (tok.tokenize_lines(line, "de", tok.split_recipe(r, s))[0] for s in ("train", "test"))
    assert train != test and test == tok.tokenize_lines(line, "de", dict(r, normalize_punct=False))[0]


# ---------------------------------------------------------------------------------------------
# 3. stages delete or overwrite only what mt-prep wrote
# ---------------------------------------------------------------------------------------------
def test_a_users_tc_directory_is_not_deleted_when_truecasing_is_off(tmp_path, capsys):
    """tc/ without a .done stamp is the user's: the run (truecasing off) stops before any work,
    naming tc/ and what to do, and tc/ keeps its file; one with mt-prep's stamp is removed."""
    loc, out = wmt14_local(tmp_path), tmp_path / "out"
    (out / "tc").mkdir(parents=True)
    (out / "tc" / "mine.txt").write_text("keep me\n")
    with pytest.raises(SystemExit):
        mt_prep(loc, out)
    err = capsys.readouterr().err
    assert f"tc: {out / 'tc'} exists and was not written by mt-prep" in err and "Move it away" in err
    assert (out / "tc" / "mine.txt").read_text() == "keep me\n"
    assert not (out / "raw").exists()  # refused before any work
    # the stage function itself (reached when the directory appears after the check)
    p = types.SimpleNamespace(run=PrepRun("t", str(out)), vout=str(out), tc_langs=[])
    with pytest.raises(SystemExit):
        sentence.stage_tc(p)
    assert (out / "tc" / "mine.txt").exists()
    (out / "tc" / ".done").write_text("stage=tc\n")  # mt-prep's: removed
    assert sentence.stage_tc(p) is True and not (out / "tc").exists()


def test_a_codes_file_the_user_put_into_bpe_is_not_deleted(tmp_path, capsys):
    """bpe/ without a stamp holding the user's codes.en: a joint-BPE run (which removes separate
    codes of an earlier run of its own) refuses to write into it and the file stays."""
    loc, out = wmt14_local(tmp_path), tmp_path / "out"
    (out / "bpe").mkdir(parents=True)
    (out / "bpe" / "codes.en").write_text("#version: 0.2\nt h\n")
    with pytest.raises(SystemExit):
        mt_prep(loc, out, "--bpe-merges", "20")
    err = capsys.readouterr().err
    assert f"bpe: {out / 'bpe'} exists and was not written by mt-prep" in err
    assert (out / "bpe" / "codes.en").read_text() == "#version: 0.2\nt h\n" and sorted(os.listdir(out)) == [".lock", "bpe"]


def test_in_place_stages_write_only_into_their_own_directories(tmp_path, capsys):
    """PrepRun.stage: an in-place stage refuses a non-empty directory without .done (body not
    run); it takes a new or empty one; a killed run's directory (its .done the INCOMPLETE marker)
    is mt-prep's and is redone; a dry run only warns."""
    run, calls = PrepRun("t", str(tmp_path)), []

    def body(d):
        calls.append(d)
        with open(os.path.join(d, "a.txt"), "w") as f:
            f.write("x\n")
    user = tmp_path / "tok"
    user.mkdir()
    (user / "notes.txt").write_text("mine\n")
    with pytest.raises(SystemExit):
        run.stage("tok", str(user), "stage=tok", [], body)
    assert calls == [] and sorted(os.listdir(user)) == ["notes.txt"]
    assert "refusing to write into it" in capsys.readouterr().err
    PrepRun("t", str(tmp_path), dry=True).stage("tok", str(user), "stage=tok", [], lambda d: None)
    assert "a real run stops here" in capsys.readouterr().err
    empty = tmp_path / "bpe"
    empty.mkdir()
    assert run.stage("bpe", str(empty), "stage=bpe", [], body) is True and (empty / ".done").read_text() == "stage=bpe\n"
    killed = tmp_path / "tc"
    killed.mkdir()
    (killed / ".done").write_text(INCOMPLETE + "\n")
    (killed / "a.txt").write_text("half\n")
    assert run.stage("tc", str(killed), "stage=tc", [str(killed / "a.txt")], body) is True
    assert (killed / "a.txt").read_text() == "x\n" and (killed / ".done").read_text() == "stage=tc\n"

    def fails(d):
        raise RuntimeError("boom")
    with pytest.raises(RuntimeError):
        run.stage("tc", str(killed), "stage=tc2", [], fails)
    assert (killed / ".done").read_text() == INCOMPLETE + "\n"  # not up to date, still mt-prep's
    assert not PrepRun.current(str(killed), "stage=tc", [])


# ---------------------------------------------------------------------------------------------
# 4. fairseq-preprocess's output is checked
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("damage,message", [
    ("count", "bin: test.en-de.de has 6 sentences, expected 8 (tok/test.de)"),
    ("dict", "bin: dict.en.txt and dict.de.txt differ in"),
])
def test_binarized_splits_are_checked_after_fairseq_preprocess(tmp_path, capsys, monkeypatch, damage, message):
    """A fairseq-preprocess whose output is wrong (here: the real command, then test's German
    dataset replaced by valid's -- 6 sentences for 8 lines -- or the joined dictionaries made to
    differ) fails the bin stage, and no bin/ is left behind."""
    real = sentence.run_preprocess

    def damaged(run, cmd, logf):
        real(run, cmd, logf)
        dest = cmd[cmd.index("--destdir") + 1]
        if damage == "count":
            for ext in ("bin", "idx"):
                with open(os.path.join(dest, f"valid.en-de.de.{ext}"), "rb") as f:
                    data = f.read()
                with open(os.path.join(dest, f"test.en-de.de.{ext}"), "wb") as f:
                    f.write(data)
        else:
            with open(os.path.join(dest, "dict.de.txt"), "a", encoding="utf-8") as f:
                f.write("extraword 1\n")
    monkeypatch.setattr(sentence, "run_preprocess", damaged)
    loc, out = wmt14_local(tmp_path), tmp_path / "out"
    with pytest.raises(SystemExit):
        mt_prep(loc, out, "--word-vocab", "100", "--dictionary", "joined")
    assert message in capsys.readouterr().err
    assert binarize.count_sentences(str(out / "bin" / "test.en-de.de")) is None and not (out / "bin").exists()


# ---------------------------------------------------------------------------------------------
# 5. sacreBLEU against a tokenized reference is marked
# ---------------------------------------------------------------------------------------------
def test_a_score_against_a_pretokenized_reference_is_marked(tmp_path):
    """IWSLT15 En-Vi (Stanford, pretokenized): the tok stamp says so, and mt-evaluate's score
    record then says ``reference_tokenized`` and its sacreBLEU / chrF signatures end in
    ``|ref:tokenized`` -- tokenized BLEU unchanged; a Moses-tokenized WMT prep is not marked."""
    from mt_pipeline import evaluate, scoring

    for corpus, marked in (("iwslt15_en_vi", True), ("wmt14_en_de", False)):
        spec = prep_spec.load_spec(corpus)
        prep = tmp_path / corpus
        (prep / "tok").mkdir(parents=True)
        stamp, _ = sentence.stamps("tok", upstream="none", recipe=tok.describe(spec["recipe"], spec["langs"]),
                                   versions={})
        (prep / "tok" / ".done").write_text(stamp + "\n", encoding="utf-8")
        assert [evaluate.tokenized_reference(str(prep), l) for l in spec["langs"]] == [marked, marked]
    hyp, ref = tmp_path / "hyp", tmp_path / "ref"
    hyp.write_text("a cat 's toy .\nthe dog runs\n")
    ref.write_text("a cat 's toy .\nthe dog runs away .\n")
    res = scoring.score_files(str(hyp), str(ref), str(hyp), str(ref))
    before = dict(res)
    evaluate.mark_tokenized_reference(res)
    evaluate.mark_tokenized_reference(res)  # once only
    assert res["reference_tokenized"] is True
    assert res["signature"] == before["signature"] + "|ref:tokenized"
    assert res["chrf_signature"] == before["chrf_signature"] + "|ref:tokenized"
    assert res["tok_bleu"] == before["tok_bleu"] and res["bleu"] == before["bleu"]
