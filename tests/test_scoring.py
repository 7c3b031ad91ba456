"""scripts/score.py: SacreBLEU, tokenized BLEU and RIBES, and the line-count guard."""

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
from mt_pipeline import scoring as score
from mt_pipeline import tables as run_table


def _write(path, lines):
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return str(path)


def test_ribes_matches_a_hand_computation(tmp_path):
    """hyp "a b d c" vs ref "a b c d": word ranks (0, 1, 3, 2) give 5 of 6 pairs in order, so
    Kendall tau = 2*5/6 - 1 = 2/3 and NKT = (tau + 1)/2 = 5/6; unigram precision 1 and equal
    lengths (BP = 1) leave RIBES = NKT * 1^0.25 * 1^0.10 = 5/6.  A reversed hypothesis has
    tau = -1, so RIBES = 0; an identical one scores 1.  The corpus score is the sentence mean."""
    ref = _write(tmp_path / "ref", ["a b c d", "e f g h", "i j k l"])
    hyp = _write(tmp_path / "hyp", ["a b d c", "h g f e", "i j k l"])
    res = score.score_files(hyp, ref, hyp, ref, ribes=True)
    assert res["tok_ribes"] == pytest.approx((5 / 6 + 0.0 + 1.0) / 3, abs=1e-12)


def test_ribes_is_opt_in_and_needs_tokenized_files(tmp_path):
    """RIBES (slow on long sentences) only when asked; asking without tokens is an error."""
    ref = _write(tmp_path / "ref", ["a b c d"])
    hyp = _write(tmp_path / "hyp", ["a b d c"])
    res = score.score_files(hyp, ref, hyp, ref)
    assert res["tok_ribes"] is None and res["tok_bleu"] is not None
    with pytest.raises(ValueError, match="tokenized"):
        score.score_files(hyp, ref, ribes=True)
    p = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "score.py"), "--hyp", hyp, "--ref", ref,
                        "--ribes"], capture_output=True, text=True)
    assert p.returncode == 2 and "--ribes needs --tokenized-hyp" in p.stderr


def test_ribes_is_absent_without_tokenized_files(tmp_path):
    ref = _write(tmp_path / "ref", ["a b c d"])
    res = score.score_files(ref, ref)
    assert res["tok_ribes"] is None and res["tok_bleu"] is None
    assert res["bleu"] == pytest.approx(100.0)


def test_cli_prints_and_stores_ribes_and_refuses_a_short_hypothesis(tmp_path):
    ref = _write(tmp_path / "ref", ["a b c d", "e f g h"])
    hyp = _write(tmp_path / "hyp", ["a b d c", "e f g h"])
    out = tmp_path / "s.json"
    cmd = [sys.executable, os.path.join(ROOT, "scripts", "score.py"), "--hyp", hyp, "--ref", ref,
           "--tokenized-hyp", hyp, "--tokenized-ref", ref, "--ribes", "--json", str(out)]
    p = subprocess.run(cmd, capture_output=True, text=True, check=True)
    assert "RIBES = 0.9167" in p.stdout
    assert json.loads(out.read_text())["tok_ribes"] == pytest.approx((5 / 6 + 1) / 2)
    short = _write(tmp_path / "short", ["a b d c"])
    out.unlink()
    p = subprocess.run(cmd[:2] + ["--hyp", short, "--ref", ref, "--json", str(out)], capture_output=True, text=True)
    assert p.returncode == 1 and "line count mismatch" in p.stderr and not out.exists()


def test_table_cell_shows_ribes_only_when_the_spec_asks():
    scored = {"bleu": 20.0, "tok_bleu": 21.5, "tok_ribes": 0.8125, "hyp": "h"}
    assert run_table._score_cell(scored, {}) == "20.00 (21.50)"
    assert run_table._score_cell(scored, {"ribes": True}) == "20.00 (21.50) / 0.8125"
    with pytest.raises(ValueError, match="re-score"):
        run_table._score_cell({**scored, "tok_ribes": None}, {"ribes": True})


def test_a_lowercasing_recipe_is_scored_case_insensitively(tmp_path):
    """IWSLT14 De-En's recipe lowercases: its models write lowercase, so mt-evaluate reads that from
    the prep's tok stamp and sacreBLEU compares lowercased text (case:lc); Multi30k's stamp keeps
    case; a re-score of the committed evidence scores as the signature says."""
    from mt_pipeline import evaluate
    from mt_pipeline.prep import tok
    from mt_pipeline.prep.run import stamp_text
    from mt_pipeline.prep.spec import load_spec

    for corpus, want in (("iwslt14_de_en", True), ("wmt14_en_de", False)):
        prep = tmp_path / corpus
        (prep / "tok").mkdir(parents=True)
        (prep / "tok" / ".done").write_text(stamp_text("tok", upstream="x", recipe=tok.describe(
            load_spec(corpus)["recipe"], ["de", "en"])) + "\n")
        assert evaluate.lowercased(str(prep), "en") is want and evaluate.lowercased(str(prep), "de") is want
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    assert not evaluate.lowercased(os.path.join(root, "data-bin", "multi30k_en_de"), "de")  # its own stamp format
    assert not evaluate.lowercased(str(tmp_path / "nowhere"), "en")
    ref, hyp = tmp_path / "ref", tmp_path / "hyp"
    ref.write_text("A Man rides a Bike in Paris .\nThe Cat sat on the Mat today .\n")
    hyp.write_text("a man rides a bike in paris .\nthe cat sat on the mat today .\n")
    cased, lower = score.score_files(str(hyp), str(ref)), score.score_files(str(hyp), str(ref), lowercase=True)
    assert lower["bleu"] == pytest.approx(100.0) and cased["bleu"] < 60
    assert "case:lc" in lower["signature"] and "case:mixed" in cased["signature"] and "lc" in lower["chrf_signature"]
    # a committed record scored case:lc re-scores as it was scored (and the cased score would not match)
    from mt_pipeline import evidence

    rec = tmp_path / "result.json"
    rec.write_text(json.dumps({"scores": {"test": dict(lower, hyp=str(hyp), ref=str(ref))}}))
    assert evidence.rescore(str(rec))[0]["bleu"] == pytest.approx(100.0)
    rec.write_text(json.dumps({"scores": {"test": dict(cased, hyp=str(hyp), ref=str(ref), bleu=lower["bleu"])}}))
    with pytest.raises(evidence.RescoreError):
        evidence.rescore(str(rec))


def test_compound_split_tokenized_bleu_is_fairseqs(tmp_path):
    """fairseq's compound_split_bleu.sh (WMT14 En-De): ``(\\S)-(\\S)`` -> ``$1 ##AT##-##AT## $2`` on
    both tokenized files, then BLEU on tokens; recorded as tok_bleu_compound for a prep tokenized
    with -a (the WMT recipes), not for one without."""
    import sacrebleu

    from mt_pipeline import evaluate
    from mt_pipeline.prep import tok
    from mt_pipeline.prep.run import stamp_text
    from mt_pipeline.prep.spec import load_spec

    assert score.compound_split("das Know @-@ how , e-mail") == "das Know @ ##AT##-##AT## @ how , e ##AT##-##AT## mail"
    assert score.compound_split("a-b-c") == "a ##AT##-##AT## b-c"  # as perl's s///g: matches do not overlap
    hyp, ref = tmp_path / "h", tmp_path / "r"
    hyp.write_text("ein Know @-@ how Test für alle\nder Bundes @-@ staat ist groß\n")
    ref.write_text("das Know @-@ how Test für alle\nein Bundes @-@ land ist groß\n")
    res = score.score_files(str(hyp), str(ref), str(hyp), str(ref), compound=True)
    h = [score.compound_split(l) for l in hyp.read_text().splitlines()]
    r = [score.compound_split(l) for l in ref.read_text().splitlines()]
    want = sacrebleu.corpus_bleu(h, [r], tokenize="none", force=True).score
    assert res["tok_bleu_compound"] == pytest.approx(want) and res["tok_bleu_compound"] > res["tok_bleu"]
    assert "tok_bleu_compound" not in score.score_files(str(hyp), str(ref), str(hyp), str(ref))
    for corpus, want_split in (("wmt14_en_de", True), ("iwslt14_de_en", False)):
        prep = tmp_path / corpus
        (prep / "tok").mkdir(parents=True)
        (prep / "tok" / ".done").write_text(stamp_text("tok", upstream="x", recipe=tok.describe(
            load_spec(corpus)["recipe"], ["de", "en"])) + "\n")
        assert evaluate.dash_split(str(prep), "de") is want_split
