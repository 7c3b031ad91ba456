"""Are two systems' scores different beyond noise?  Test-set noise by sacreBLEU's paired
bootstrap, seed noise from several training runs.

* :func:`paired_bootstrap`: sacreBLEU's paired bootstrap resampling (Koehn 2004;
  ``sacrebleu.significance.PairedTest`` with ``test_type="bs"``, 1,000 resamples, sacreBLEU's
  fixed seed 12345) of BLEU and chrF between a baseline's and a system's hypotheses of one test
  set.  The p-value is sacreBLEU's (2.x, ``_paired_bs_test``): a centred two-sided test,
  ``(#{|d_i - mean d| > |d_obs|} + 1) / (n + 1)`` over the resampled differences ``d_i`` -- not
  Koehn's one-sided count of resamples against the observed direction, which gives larger values
  near the threshold (ReLUFormer T5 seed 3: 0.158 here, 0.256 by Koehn's count).  It measures
  test-set sampling noise of *one* trained model each -- not training noise.
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

__all__ = ["paired_bootstrap", "seed_summary", "verdict", "N_SAMPLES", "ALPHA"]

N_SAMPLES = 1000
ALPHA = 0.05


def paired_bootstrap(references: Sequence[str], baseline: Sequence[str], system: Sequence[str],
                     n_samples: int = N_SAMPLES) -> Dict[str, float]:
    """Paired bootstrap of ``system`` against ``baseline`` on one test set (detokenized text).

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
        # sacreBLEU's p = (#{|d_i - mean d| > |d_obs|} + 1) / (n + 1) degenerates to 1 / (n + 1) for
        # two identical outputs (every d_i = 0); there is no difference to test
        return {"n_samples": n_samples, "signature": "identical hypotheses", "bleu_delta": 0.0, "bleu_p": 1.0,
                "chrf_delta": 0.0, "chrf_p": 1.0}
    test = PairedTest([("baseline", list(baseline)), ("system", list(system))],
                      {"BLEU": BLEU(), "chrF": CHRF()}, [list(references)], test_type="bs", n_samples=n_samples)
    sigs, res = test()
    chrf_key = next(k for k in res if k.startswith("chrF"))
    out = {"n_samples": n_samples, "signature": str(sigs["BLEU"])}
    for key, name in (("BLEU", "bleu"), (chrf_key, "chrf")):
        base, sys_ = res[key]
        out[f"{name}_delta"] = sys_.score - base.score
        out[f"{name}_p"] = float(sys_.p_value)
    return out


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
    if p_values and max(p_values) < ALPHA:
        return f"exceeds seed noise {numbers}"
    if not p_values:
        return f"not beyond seed noise: Δ exceeds 2 SE, but no seed-matched bootstrap {numbers}"
    high = sum(p >= ALPHA for p in p_values)
    return f"not beyond seed noise: Δ exceeds 2 SE, but bootstrap p ≥ {ALPHA:g} in {high} of {len(p_values)} seeds {numbers}"
