"""mt_pipeline.significance.testset_sd: the joint paired bootstrap of a seed-mean BLEU difference."""

import random

import numpy as np
import pytest
from sacrebleu.metrics import BLEU

from mt_pipeline import significance
from mt_pipeline.significance import SEED


WORDS = "a man in a blue shirt is riding a red bike down the street while two dogs watch".split()


def _corpus(n=40, seed=0):
    rng = random.Random(seed)
    return [" ".join(rng.sample(WORDS, 8)) for _ in range(n)]


def _drop(lines, subset, k):
    """``lines`` with the last ``k`` words dropped on the sentences in ``subset``."""
    return [" ".join(l.split()[:-k]) if i in subset else l for i, l in enumerate(lines)]


def test_identical_systems_have_no_test_set_noise():
    refs = _corpus()
    hyps = [_drop(refs, {1, 5}, 1), _drop(refs, {2, 7, 9}, 2)]  # two seeds, not perfect
    out = significance.testset_sd(refs, hyps, [list(h) for h in hyps], n_samples=100)
    assert out["sd"] == 0.0 and out["delta"] == 0.0
    assert out["n_samples"] == 100 and out["n_seeds"] == 2


def test_the_sd_is_that_of_the_seed_mean_difference_over_shared_resampled_sentences():
    """A system that drops words on a fixed subset of sentences: the sd equals a direct recomputation
    (sacreBLEU's public corpus_score on each resample, the same indices for every list)."""
    refs = _corpus()
    base = [_drop(refs, {3}, 1), _drop(refs, {4, 11}, 1)]
    system = [_drop(base[0], set(range(0, 40, 3)), 3), _drop(base[1], set(range(1, 40, 4)), 2)]
    n = 150
    out = significance.testset_sd(refs, base, system, n_samples=n)
    idx = np.random.default_rng(SEED).choice(len(refs), size=(n, len(refs)), replace=True)
    bleu = BLEU()

    def score(hyps, rows):
        return bleu.corpus_score([hyps[j] for j in rows], [[refs[j] for j in rows]]).score

    diffs = [np.mean([score(s, rows) - score(b, rows) for s, b in zip(system, base)]) for rows in idx]
    full = range(len(refs))
    assert out["sd"] > 0
    assert out["sd"] == pytest.approx(float(np.std(diffs, ddof=1)), rel=1e-9, abs=1e-9)
    assert out["delta"] == pytest.approx(np.mean([score(s, full) - score(b, full) for s, b in zip(system, base)]))
    assert out["delta"] < 0


def test_unmatched_or_misaligned_hypotheses_are_refused():
    refs = _corpus(10)
    with pytest.raises(ValueError, match="seed-matched"):
        significance.testset_sd(refs, [refs, refs], [refs])
    with pytest.raises(ValueError, match="seed-matched"):
        significance.testset_sd(refs, [], [])
    with pytest.raises(ValueError, match="system seed 2 has 9 lines, the references 10"):
        significance.testset_sd(refs, [refs, refs], [refs, refs[:9]])
    with pytest.raises(ValueError, match="no references"):
        significance.testset_sd([], [[]], [[]])


def test_lowercase_runs_are_bootstrapped_on_lowercased_text():
    """Runs scored with ``case:lc`` (models trained on lowercased data) are compared as scored: a
    system that differs from the baseline only in case has no BLEU / chrF difference then, and does
    in the cased test; the campaign and the tables pass the flag from the runs' signatures."""
    from mt_pipeline import evidence

    rng = random.Random(0)
    refs = [" ".join(rng.choice(["The", "cat", "Sat", "on", "a", "Mat", "today"]) for _ in range(8)) for _ in range(30)]
    base = [r.lower() for r in refs]
    cased = significance.paired_bootstrap(refs, base, refs, n_samples=50)
    lc = significance.paired_bootstrap(refs, base, refs, n_samples=50, lowercase=True)
    assert cased["bleu_delta"] > 10 and cased["chrf_delta"] > 1
    assert lc["bleu_delta"] == 0.0 and lc["chrf_delta"] == 0.0 and "case:lc" in lc["signature"]
    assert significance.testset_sd(refs, [base], [refs], n_samples=20, lowercase=True)["sd"] == 0.0
    assert significance.testset_sd(refs, [base], [refs], n_samples=20)["sd"] > 0.0
    assert evidence.lowercased({"signature": "nrefs:1|case:lc|eff:no|tok:13a"})
    assert not evidence.lowercased({"signature": "nrefs:1|case:mixed|eff:no|tok:13a"}) and not evidence.lowercased({})


def test_tables_bootstrap_follows_the_runs_case_setting(tmp_path):
    """tables._significance reads ``case:lc`` from the runs' signatures (and caches per setting)."""
    from mt_pipeline import tables

    refs = ["The Cat sat on the Mat", "A Dog ran Home today", "Birds Fly over the Sea"] * 10
    (tmp_path / "ref").write_text("\n".join(refs) + "\n")
    (tmp_path / "a").write_text("\n".join(r.lower() for r in refs) + "\n")
    (tmp_path / "b").write_text("\n".join(refs) + "\n")

    def run(hyp, sig):
        return {"_dir": str(tmp_path), "scores": {"test": {"hyp": str(tmp_path / hyp), "ref": str(tmp_path / "ref"),
                                                            "signature": sig, "checkpoint_sha256": hyp}}}

    mixed, lc = "nrefs:1|case:mixed|eff:no|tok:13a", "nrefs:1|case:lc|eff:no|tok:13a"
    assert tables._significance(run("a", lc), run("b", lc), "test")["bleu_delta"] == 0.0
    assert tables._significance(run("a", mixed), run("b", mixed), "test")["bleu_delta"] > 10


def test_one_seed_p_values_are_sacrebleus_and_the_centred_two_sided_one(capsys, tmp_path):
    """With one seed a side, testset_sd's ``p_sacrebleu`` is paired_bootstrap's ``bleu_p`` (the same
    draw, the same statistic) and ``p_two_sided`` counts |d_i - mean d| >= |delta| over sacreBLEU's
    public corpus_score on the same resamples; the CLI prints both from files."""
    refs = _corpus()
    base = _drop(refs, {3, 7}, 1)
    system = _drop(base, set(range(0, 40, 5)), 2)
    n = 200
    out = significance.testset_sd(refs, [base], [system], n_samples=n)
    assert out["p_sacrebleu"] == pytest.approx(significance.paired_bootstrap(refs, base, system, n_samples=n)["bleu_p"])
    idx = np.random.default_rng(SEED).choice(len(refs), size=(n, len(refs)), replace=True)
    bleu = BLEU()
    d = np.array([bleu.corpus_score([system[j] for j in r], [[refs[j] for j in r]]).score
                  - bleu.corpus_score([base[j] for j in r], [[refs[j] for j in r]]).score for r in idx])
    assert out["p_two_sided"] == pytest.approx((int((np.abs(d - d.mean()) >= abs(out["delta"]) - 1e-9).sum()) + 1) / (n + 1))
    files = {}
    for name, lines in (("r", refs), ("b", base), ("s", system)):
        files[name] = tmp_path / name
        files[name].write_text("\n".join(lines) + "\n")
    assert significance.main(["--refs", str(files["r"]), "--baseline", str(files["b"]), "--system", str(files["s"]),
                              "--n-samples", str(n)]) == 0
    printed = capsys.readouterr().out
    assert f"p sacreBLEU {out['p_sacrebleu']:.3f}" in printed and f"p centred two-sided {out['p_two_sided']:.3f}" in printed
    with pytest.raises(SystemExit):
        significance.main(["--refs", str(files["r"]), "--baseline", str(files["b"]), "--system", str(files["s"]), str(files["s"])])
