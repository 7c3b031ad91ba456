"""Corpus specs (``data-prep/<corpus>/corpus.yaml``) and the recipe a run uses.

A spec names the corpus (``name``, ``title``, ``langs``), the pipeline that prepares it
(``pipeline``: ``sentence``, the default -- sentence-level corpora extracted from their official
archives, see :mod:`mt_pipeline.prep.sentence`; ``multi30k``; ``long_documents``), its official
files (``downloads``: ``url`` or ``file`` under ``base_url``, sha256 / md5 / ``unverified``), where
its files are found locally and its ``recipe`` (tokenisation, truecasing, BPE settings).  A corpus
shared by several papers names each paper's differing post-tokenisation settings as a ``variant``.
"""

import hashlib
import json
import os

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DATA_PREP = os.path.join(REPO, "data-prep")
SHARED_DATA = os.path.normpath(os.path.join(REPO, "..", "shared", "data"))

PIPELINES = ("sentence", "multi30k", "long_documents")
# What a variant may change: the steps after tokenisation (it shares raw/ and tok/ with the default).
VARIANT_KEYS = {"truecase", "bpe_joint", "bpe_merges"}


def list_corpora():
    """Names of the corpora with a spec (directories of data-prep/ holding corpus.yaml).

    Raises:
        SystemExit: there is no data-prep/ next to the package (an installed copy, not a checkout)."""
    if not os.path.isdir(DATA_PREP):
        raise SystemExit(f"no corpus specs: {DATA_PREP} does not exist (mt-prep reads data-prep/<corpus>/corpus.yaml "
                         "of the checkout it runs from: install it with pip install -e .)")
    return sorted(d for d in os.listdir(DATA_PREP) if os.path.exists(os.path.join(DATA_PREP, d, "corpus.yaml")))


def load_spec(corpus):
    """The spec of ``corpus`` (data-prep/<corpus>/corpus.yaml), with defaults filled in:
    ``entry`` (its shell entry point), ``pipeline`` (``sentence``) and every download's ``url``
    (``base_url``/``file``; the environment variable ``base_url_env`` names a mirror).

    Raises:
        SystemExit: unknown corpus (lists the valid ones), or an unknown pipeline."""
    import yaml

    path = os.path.join(DATA_PREP, corpus, "corpus.yaml")
    if not os.path.exists(path) or corpus.startswith("."):
        raise SystemExit(f"unknown corpus '{corpus}'; valid: {', '.join(list_corpora())}")
    with open(path, encoding="utf-8") as f:
        spec = yaml.safe_load(f)
    spec.setdefault("entry", f"data-prep/{corpus}/prepare.sh")
    if spec.setdefault("pipeline", "sentence") not in PIPELINES:
        raise SystemExit(f"{path}: pipeline '{spec['pipeline']}'; valid: {', '.join(PIPELINES)}")
    base = os.environ.get(spec.get("base_url_env") or "", "") or spec.get("base_url")
    for d in spec.get("downloads", []):
        if "url" not in d:
            d["url"] = f"{base.rstrip('/')}/{d['file']}"
    return spec


def spec_digest(spec):
    """Digest of the spec (recorded in the raw stamp) without its ``variants``: they change nothing
    up to tok/.  (The default ``pipeline: sentence`` is left out too, so that the digest -- and the
    stamps -- of the specs written before pipelines had names stay the same.)"""
    spec = {k: v for k, v in spec.items() if k != "variants"}
    if spec.get("pipeline") == "sentence":
        spec.pop("pipeline")
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:16]


def effective_recipe(spec, variant=None, truecase=None, bpe=None, merges=None):
    """The recipe a run uses: the spec's ``recipe``, updated by the spec's variant ``variant``
    (``variants: {NAME: {about, truecase, bpe_joint, bpe_merges}}``), then by the CLI overrides
    ``truecase`` (bool), ``bpe`` ('joint' / 'separate') and ``merges`` (int); None = not given.

    Raises:
        SystemExit: unknown variant (lists the valid ones), a variant key outside VARIANT_KEYS, or
        an unknown ``bpe`` mode."""
    r = dict(spec.get("recipe") or {})
    if variant:
        known = spec.get("variants") or {}
        if variant not in known:
            raise SystemExit(f"unknown variant '{variant}' of {spec['name']}; valid: "
                             + (", ".join(sorted(known)) or "none (this corpus has no variants)"))
        over = {k: v for k, v in known[variant].items() if k != "about"}
        bad = sorted(set(over) - VARIANT_KEYS)
        if bad:
            raise SystemExit(f"variant '{variant}' of {spec['name']} sets {bad}; a variant may only set "
                             f"{sorted(VARIANT_KEYS)} (it shares raw/ and tok/ with the default recipe)")
        r.update(over)
    if truecase is not None:
        r["truecase"] = bool(truecase)
    if bpe is not None:
        if bpe not in ("joint", "separate"):
            raise SystemExit(f"unknown BPE mode '{bpe}'; valid: joint, separate")
        r["bpe_joint"] = bpe == "joint"
    if merges is not None:
        r["bpe_merges"] = merges
    return r


def truecase_langs(r, langs):
    """Languages recipe ``r`` truecases: ``truecase: true`` -> all of ``langs``; a list -> those.

    Raises:
        SystemExit: a listed language is not one of ``langs``, or a value of another type."""
    tc = r.get("truecase", False)
    if tc is True:
        return list(langs)
    if not tc:
        return []
    if isinstance(tc, list) and all(l in langs for l in tc):
        return [l for l in langs if l in tc]
    raise SystemExit(f"recipe truecase: {tc!r}; valid: true, false, or a list of languages from {list(langs)}")


def bpe_merges_for(r, langs, joint):
    """Merges of recipe ``r``: ``{'*': N}`` for joint BPE, ``{LANG: N}`` for separate BPE
    (``bpe_merges`` a number, used for every language, or ``{LANG: N}`` giving each).

    Raises:
        SystemExit: per-language merges with joint BPE, a language without merges, or a
        non-positive number."""
    m = r.get("bpe_merges")
    if isinstance(m, dict):
        if joint:
            raise SystemExit(f"bpe_merges {m} gives merges per language, which needs separate BPE "
                             "(bpe_joint: false / --bpe separate); joint BPE takes one number")
        if sorted(m) != sorted(langs):
            raise SystemExit(f"bpe_merges {m}: give merges for exactly the languages {list(langs)}")
        out = dict(m)
    else:
        out = {"*": m} if joint else {l: m for l in langs}
    if not all(isinstance(v, int) and v > 0 for v in out.values()):
        raise SystemExit(f"bpe_merges must be positive integers (got {m!r})")
    return out
