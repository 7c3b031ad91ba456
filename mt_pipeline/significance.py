"""Are two systems' scores different beyond noise?  Test-set noise by sacreBLEU's paired
bootstrap, seed noise from several training runs.

* :func:`paired_bootstrap`: sacreBLEU's paired bootstrap resampling (Koehn 2004;
  ``sacrebleu.significance.PairedTest`` with ``test_type="bs"``, 1,000 resamples, sacreBLEU's
  fixed seed 12345) of BLEU and chrF between a baseline's and a system's hypotheses of one test
  set.  The p-value is sacreBLEU's (2.x, ``_paired_bs_test``, after Moses'
  ``bootstrap-hypothesis-difference-significance.pl``): with ``a_i = |d_i|`` the absolute
  resampled differences, ``p = (#{a_i - mean_j a_j > |d_obs|} + 1) / (n + 1)``.  Where every
  ``d_i`` has the observed difference's sign, ``a_i - mean a = ±(d_i - mean d)`` and ``p`` counts one
  tail of the centred differences (nearly so where few ``d_i`` cross 0: systems that clearly
  differ): a one-sided test in effect -- close to Koehn's one-sided
  count of resamples against the observed direction, and about half a centred two-sided p
  ``(#{|d_i - mean d| >= |d_obs|} + 1) / (n + 1)`` near 0.05 (ReLA T1 converged, row 7 vs row 1,
  test2016, seeds 1 / 2 / 3: sacreBLEU 0.033 / 0.001 / 0.009, centred two-sided 0.061 / 0.001 /
  0.016: ``python -m mt_pipeline.significance``, :func:`main`).  It measures test-set sampling noise of *one*
  trained model each -- not training noise.
* :func:`testset_sd`: the test-set sampling noise of a *seed mean* difference: one set of
  resampled sentence indices applied to every seed's hypotheses of both systems (a joint paired
  bootstrap, sacreBLEU's seed and resample count), the standard deviation over resamples of the
  seed-mean BLEU difference.  Seeds scored on one test set share its sampling error, which their
  spread over seeds does not contain; the campaign's equivalence test adds it to the seeds'
  standard error.
* :func:`seed_summary` / :func:`verdict`: with scores of several seeds per system, the mean, the
  sample standard deviation, and whether ``|mean_sys - mean_base|`` exceeds twice its standard
  error ``sqrt(sd_sys^2 / n_sys + sd_base^2 / n_base)`` *and* every seed-matched paired bootstrap
  has ``p < 0.05``: "exceeds seed noise".  With one seed the seed noise is unknown and the verdict
  says so.  The 2 is the normal approximation; with three seeds a Student t multiplier (Welch,
  2-4 degrees of freedom: 2.8-4.3, :func:`welch`) is wider, and the campaign's verdicts say when it
  would give another verdict.
"""

import math
import statistics
from typing import Dict, List, Optional, Sequence

__all__ = ["paired_bootstrap", "testset_sd", "seed_summary", "seeds_against", "verdict", "N_SAMPLES", "SEED", "ALPHA"]

N_SAMPLES = 1000
SEED = 12345  # sacreBLEU's fixed bootstrap seed (PairedTest's default)
ALPHA = 0.05


def paired_bootstrap(references: Sequence[str], baseline: Sequence[str], system: Sequence[str],
                     n_samples: int = N_SAMPLES, lowercase: bool = False) -> Dict[str, float]:
    """Paired bootstrap of ``system`` against ``baseline`` on one test set (detokenized text).

    ``lowercase``: BLEU and chrF on lowercased text (sacreBLEU's ``case:lc``), as the runs were
    scored when their recorded signature says so (:func:`mt_pipeline.scoring.score_files`'s
    ``lowercase``: models trained on lowercased data, IWSLT14's recipe).

    Returns:
        ``{"bleu_delta", "bleu_p", "chrf_delta", "chrf_p", "n_samples", "signature"}``: score
        differences (system - baseline, corpus level) and sacreBLEU's p-values.

    Raises:
        ValueError: the three sequences differ in length or are empty.
    """
    from sacrebleu.metrics import BLEU, CHRF
    from sacrebleu.significance import PairedTest

    if not (len(references) == len(baseline) == len(system)) or not references:
        raise ValueError(f"paired bootstrap needs equally many references, baseline and system lines "
                         f"(got {len(references)}, {len(baseline)}, {len(system)})")
    if list(baseline) == list(system):
        # sacreBLEU's p = (#{|d_i| - mean |d| > |d_obs|} + 1) / (n + 1) degenerates to 1 / (n + 1) for
        # two identical outputs (every d_i = 0); there is no difference to test
        return {"n_samples": n_samples, "signature": "identical hypotheses", "bleu_delta": 0.0, "bleu_p": 1.0,
                "chrf_delta": 0.0, "chrf_p": 1.0}
    test = PairedTest([("baseline", list(baseline)), ("system", list(system))],
                      {"BLEU": BLEU(lowercase=lowercase), "chrF": CHRF(lowercase=lowercase)}, [list(references)],
                      test_type="bs", n_samples=n_samples)
    sigs, res = test()
    chrf_key = next(k for k in res if k.startswith("chrF"))
    out = {"n_samples": n_samples, "signature": str(sigs["BLEU"])}
    for key, name in (("BLEU", "bleu"), (chrf_key, "chrf")):
        base, sys_ = res[key]
        out[f"{name}_delta"] = sys_.score - base.score
        out[f"{name}_p"] = float(sys_.p_value)
    return out


def testset_sd(references: Sequence[str], baseline: Sequence[Sequence[str]], system: Sequence[Sequence[str]],
                n_samples: int = N_SAMPLES, seed: int = SEED, lowercase: bool = False) -> Dict[str, float]:
    """Test-set sampling noise of a seed-mean BLEU difference, by a joint paired bootstrap.

    Each of ``n_samples`` resamples draws ``len(references)`` sentence indices with replacement
    (``numpy.random.default_rng(seed)``, the draw of sacreBLEU's paired bootstrap) and applies the
    same indices to every hypothesis list of both systems; on each resample the corpus BLEU of every
    list is recomputed and ``mean_k BLEU(system[k]) - mean_k BLEU(baseline[k])`` taken.  The returned
    ``sd`` is the sample standard deviation (ddof 1) of that difference over the resamples: the
    standard error of the seed-mean difference that comes from which sentences the test set happens
    to hold, which the spread over seeds (all scored on the same sentences) does not include.

    Args:
        references: the test set's reference lines (detokenized), one per sentence.
        baseline, system: one hypothesis list per seed (detokenized, aligned with
            ``references``); ``baseline[k]`` and ``system[k]`` are the same seed's runs.
        n_samples, seed: resamples and RNG seed (sacreBLEU's 1,000 and 12345).
        lowercase: BLEU on lowercased text (``case:lc``), as :func:`paired_bootstrap`.

    Returns:
        ``{"sd", "delta", "p_sacrebleu", "p_two_sided", "n_samples", "n_seeds"}``: ``sd`` and
        ``delta`` (the observed seed-mean difference system - baseline on the full test set) in BLEU
        points (0-100); two p-values of ``delta`` from the same resamples ``d_i``:
        ``p_sacrebleu = (#{|d_i| - mean|d| > |delta|} + 1) / (n + 1)`` (sacreBLEU's / Moses' test:
        with one seed and the default seed it equals :func:`paired_bootstrap`'s ``bleu_p``, the same
        draw) and the centred two-sided ``p_two_sided = (#{|d_i - mean d| >= |delta|} + 1) / (n + 1)``.

    Raises:
        ValueError: no seeds, unequal numbers of seeds on the two sides, no references, or a
            hypothesis list whose length differs from the references'.
    """
    import numpy as np
    from sacrebleu.metrics import BLEU

    refs = list(references)
    if not baseline or len(baseline) != len(system):
        raise ValueError(f"testset_sd needs seed-matched hypothesis lists, at least one a side "
                         f"(got {len(baseline)} baseline and {len(system)} system)")
    if not refs:
        raise ValueError("testset_sd: no references")
    for side, lists in (("baseline", baseline), ("system", system)):
        for k, hyps in enumerate(lists):
            if len(hyps) != len(refs):
                raise ValueError(f"testset_sd: {side} seed {k + 1} has {len(hyps)} lines, the references {len(refs)}")
    metric = BLEU(lowercase=lowercase)
    # sacreBLEU's own sufficient statistics and scoring from them: the private methods its
    # PairedTest (significance._paired_bs_test) uses, so a resample scores exactly as sacreBLEU would
    stats = {side: [np.array(metric._extract_corpus_statistics(list(h), [refs]), dtype="float64") for h in lists]
             for side, lists in (("baseline", baseline), ("system", system))}
    idx = np.random.default_rng(seed).choice(len(refs), size=(n_samples, len(refs)), replace=True)
    # counts[r, j]: how often resample r drew sentence j; counts @ stats sums each resample's statistics
    # (integer counts, exact in float64)
    counts = np.stack([np.bincount(row, minlength=len(refs)) for row in idx]).astype("float64")

    def mean_score(side: str, weights=None) -> np.ndarray:
        per_seed = []
        for st in stats[side]:
            sums = st.sum(0, keepdims=True) if weights is None else weights @ st
            per_seed.append([metric._compute_score_from_stats(list(x)).score for x in sums])
        return np.mean(np.array(per_seed), axis=0)

    delta = float((mean_score("system") - mean_score("baseline"))[0])
    diffs = mean_score("system", counts) - mean_score("baseline", counts)
    sd = float(diffs.std(ddof=1)) if n_samples > 1 else 0.0
    a = np.abs(diffs)
    p_sacrebleu = (int(((a - a.mean()) > abs(delta)).sum()) + 1) / (n_samples + 1)
    p_two_sided = (int((np.abs(diffs - diffs.mean()) >= abs(delta)).sum()) + 1) / (n_samples + 1)
    return {"sd": sd, "delta": delta, "p_sacrebleu": p_sacrebleu, "p_two_sided": p_two_sided,
            "n_samples": n_samples, "n_seeds": len(baseline)}


def main(argv=None) -> int:
    """``python -m mt_pipeline.significance --refs R --baseline A [A ...] --system B [B ...]``: the
    joint paired bootstrap of :func:`testset_sd` over seed-matched hypothesis files (plain or
    ``.gz``, e.g. the committed ``results/runs/.../test.hyp.detok.gz``); prints the seed-mean BLEU
    difference, its test-set sd and both p-values (one seed each side: that seed's sacreBLEU p and
    the centred two-sided p)."""
    import argparse

    from .scoring import read_lines

    p = argparse.ArgumentParser(description=main.__doc__.split(";")[0])
    p.add_argument("--refs", required=True, help="reference file (detokenized)")
    p.add_argument("--baseline", nargs="+", required=True, help="baseline hypotheses, one file per seed")
    p.add_argument("--system", nargs="+", required=True, help="system hypotheses, the same seeds in the same order")
    p.add_argument("--lowercase", action="store_true", help="BLEU on lowercased text (case:lc)")
    p.add_argument("--n-samples", type=int, default=N_SAMPLES)
    a = p.parse_args(argv)
    if len(a.baseline) != len(a.system):
        p.error(f"--baseline has {len(a.baseline)} files, --system {len(a.system)}: give one per seed on each side")
    try:
        out = testset_sd(read_lines(a.refs), [read_lines(f) for f in a.baseline], [read_lines(f) for f in a.system],
                         n_samples=a.n_samples, lowercase=a.lowercase)
    except (OSError, ValueError) as err:
        p.error(str(err))
    print(f"delta {out['delta']:+.2f} BLEU (system - baseline, mean of {out['n_seeds']} seed(s)); test-set sd "
          f"{out['sd']:.3f}; p sacreBLEU {out['p_sacrebleu']:.3f}; p centred two-sided {out['p_two_sided']:.3f} "
          f"({out['n_samples']} resamples, seed {SEED})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())


def seed_summary(scores: Sequence[float]) -> Dict[str, Optional[float]]:
    """``{"mean", "sd", "n"}`` of per-seed scores (``sd`` is the sample standard deviation,
    None for one seed)."""
    scores = list(scores)
    return {"mean": statistics.fmean(scores), "sd": statistics.stdev(scores) if len(scores) > 1 else None,
            "n": len(scores)}


def welch(base: Sequence[float], system: Sequence[float], level: float = 0.95) -> Dict[str, float]:
    """Student t version of the seed test (Welch 1947): ``{"se", "df", "t"}`` -- the unpaired standard
    error ``sqrt(s_sys^2 / n_sys + s_base^2 / n_base)`` (as :func:`verdict`), its Welch-Satterthwaite
    degrees of freedom and the two-sided ``level`` quantile of Student's t with them (2.83 for 3 + 3
    seeds of equal spread; :func:`verdict`'s normal approximation uses 2).  Needs >= 2 seeds a side.

    Raises:
        ValueError: fewer than 2 scores on a side, or both sides without spread.
    """
    from scipy.stats import t as student_t

    b, s = seed_summary(base), seed_summary(system)
    if b["n"] < 2 or s["n"] < 2:
        raise ValueError(f"welch needs at least 2 seeds a side (got {b['n']} and {s['n']})")
    vb, vs = b["sd"] ** 2 / b["n"], s["sd"] ** 2 / s["n"]
    if vb + vs == 0:
        raise ValueError("welch: no spread on either side")
    df = (vb + vs) ** 2 / (vb ** 2 / (b["n"] - 1) + vs ** 2 / (s["n"] - 1))
    return {"se": math.sqrt(vb + vs), "df": df, "t": float(student_t.ppf(0.5 + level / 2, df))}


def seeds_against(base: Sequence[float], system: Sequence[float], p_values: Sequence[float]) -> int:
    """How many seed-matched pairs do *not* back the seed mean's difference: a bootstrap p >= ALPHA,
    or a seed whose own difference ``system[i] - base[i]`` has the other sign (or none).  sacreBLEU's
    p is for ``|Δ|``, so a seed significantly *worse* has a small p too; it must not count towards
    "better beyond seed noise".  ``base``, ``system``, ``p_values``: per seed, in the same order.

    Raises:
        ValueError: the three sequences differ in length.
    """
    if not len(base) == len(system) == len(p_values):
        raise ValueError(f"seeds_against: {len(base)} base, {len(system)} system scores, {len(p_values)} p-values")
    delta = statistics.fmean(system) - statistics.fmean(base)
    return sum(not (p < ALPHA and (s - b) * delta > 0) for b, s, p in zip(base, system, p_values))


def verdict(base: Sequence[float], system: Sequence[float], p_values: Sequence[float]) -> str:
    """Words for a table cell: does ``system`` differ from ``base`` (per-seed scores, same seeds
    order) beyond noise?  ``p_values``: the seed-matched paired-bootstrap p-values.

    Returns one of ``"exceeds seed noise (Δ +d ± 2se, bootstrap p ≤ x in each of n seeds)"``
    (both tests pass), ``"within seed noise (...)"`` (``|Δ| <= 2se``), ``"not beyond seed noise:
    Δ exceeds 2 SE, but bootstrap p ≥ 0.05 in k of n seeds (...)"`` (the seed test passes, k
    seeds' test-set tests do not) -- ``x``: the largest seed-matched p-value; the ``p`` part only when
    there are p-values -- or ``"1 seed: Δ +d, p = x, seed noise unknown"``.  Only the first
    starts with ``"exceeds"``.
    """
    b, s = seed_summary(base), seed_summary(system)
    delta = s["mean"] - b["mean"]
    if b["n"] < 2 or s["n"] < 2:
        p = max(p_values) if p_values else float("nan")
        return f"1 seed: Δ {delta:+.2f}, p = {p:.3f}, seed noise unknown"
    se = math.sqrt(s["sd"] ** 2 / s["n"] + b["sd"] ** 2 / b["n"])
    ps = f", bootstrap p ≤ {max(p_values):.3f} in each of {len(p_values)} seeds" if p_values else ""
    numbers = f"(Δ {delta:+.2f} ± {2 * se:.2f}{ps})"
    if abs(delta) <= 2 * se:
        return f"within seed noise {numbers}"
    if not p_values:
        return f"not beyond seed noise: Δ exceeds 2 SE, but no seed-matched bootstrap {numbers}"
    against = seeds_against(base, system, p_values)
    if not against:
        return f"exceeds seed noise {numbers}"
    high = sum(p >= ALPHA for p in p_values)
    if high:
        return f"not beyond seed noise: Δ exceeds 2 SE, but bootstrap p ≥ {ALPHA:g} in {high} of {len(p_values)} seeds {numbers}"
    other = against  # every p < ALPHA: the seeds against are those of the other sign
    return (f"not beyond seed noise: Δ exceeds 2 SE, but {other} of {len(p_values)} seeds differ significantly the "
            f"other way {numbers}")
