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
