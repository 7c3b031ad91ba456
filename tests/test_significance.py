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
