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
VARIANT_KEYS = {"truecase", "bpe_joint", "bpe_merges", "dictionary", "word_vocab", "char_vocab"}
#: the recipe key ``dictionary``: fairseq-preprocess's dictionaries (default: joined with joint BPE,
#: separate otherwise, and separate for word and character vocabularies)
DICTIONARIES = ("joined", "separate")


#: the keys a corpus.yaml may hold, per part (see the module docstring)
SPEC_KEYS = ("name", "title", "langs", "pipeline", "downloads", "splits", "split_names", "local", "recipe",
             "variants", "obtain", "licensed", "default_out", "upstream", "base_url", "base_url_env",
             "maruf_subsets", "local_sha256")
DOWNLOAD_KEYS = ("file", "url", "sha256", "md5", "checksum_source", "note", "maruf")
SOURCE_KEYS = ("file", "archive", "format", "src_lang", "sha256", "columns", "optional", "bom", "lines")
SPLIT_KEYS = ("name", "upstream", "pairs")  # the multi30k pipeline's list of splits
LOCAL_KEYS = ("default_dir", "splits", "missing")
RECIPE_KEYS = ("bpe_merges", "bpe_joint", "escape", "aggressive_dash_splits", "clean", "normalize_punct",
               "remove_non_printing", "replace_apostrophe", "perl_final_period", "truecase", "lengths",
               "pretokenized", "lowercase", "valid_every", "shipped_codes", "romanian", "dictionary",
               "word_vocab", "char_vocab")
#: source formats (``{lang}``/``{col}`` are filled per language); bars:N and tsv:N take a column number
FORMAT_NAMES = ("plain", "seg", "sgm", "iwslt_tags")


def _nearest(word, valid):
    import difflib

    close = difflib.get_close_matches(str(word), list(valid), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _check_format(fmt, columns):
    """The problem with a source ``format`` (None when valid)."""
    if not isinstance(fmt, str):
        return f"format {fmt!r} is not a string"
    if fmt in FORMAT_NAMES or fmt.startswith("tmx:"):
        return None
    for kind in ("bars", "tsv"):
        if fmt.startswith(kind + ":"):
            col = fmt.split(":", 1)[1]
            if col == "{col}":
                if not isinstance(columns, dict) or not all(isinstance(v, int) and v >= 0 for v in columns.values()):
                    return f"format {fmt!r} needs `columns: {{LANG: N}}` with column numbers >= 0, got {columns!r}"
                return None
            if col.isdigit():
                return None
            return f"format {fmt!r}: {kind}: takes a column number >= 0 (e.g. {kind}:1) or {{col}} with `columns:`"
    return f"unknown format {fmt!r}{_nearest(fmt, FORMAT_NAMES)}; valid: plain, seg, sgm, iwslt_tags, tmx:LANG, bars:N, tsv:N"


def check_spec(spec, path):
    """Check a corpus spec against its schema before any work: a mapping with ``name``,
    ``title``, ``langs`` (two language codes) and ``downloads`` (a list of mappings); every key
    known in every part (an unknown one names the nearest valid key -- a misspelt ``fromat:``
    would otherwise be ignored and the whole TSV line taken as both sides); lists where lists are
    expected (``langs: [en, de]``, not the string ``en de``); valid source formats.

    Raises:
        SystemExit: every problem found, each naming the part of the spec and the valid choices.
    """
    if not isinstance(spec, dict):
        raise SystemExit(f"{path}: a corpus spec is a YAML mapping (name:, title:, langs:, downloads:, ...), "
                         f"got {'an empty file' if spec is None else type(spec).__name__}")
    problems = []

    def keys(where, mapping, valid):
        if not isinstance(mapping, dict):
            problems.append(f"{where} must be a mapping (of {', '.join(valid)}), got {mapping!r}")
            return False
        for k in mapping:
            if k not in valid:
                problems.append(f"unknown key {where}.{k}{_nearest(k, valid)}; valid: {', '.join(valid)}")
        return True

    def string_list(where, value):
        if not (isinstance(value, list) and value and all(isinstance(x, str) and x for x in value)):
            problems.append(f"{where} must be a list of names (e.g. [en, de]), got {value!r}")

    def sources(where, srcs):
        if not isinstance(srcs, list):
            problems.append(f"{where} must be a list of sources ({{file: ..., format: ...}}), got {srcs!r}")
            return
        for i, x in enumerate(srcs):
            if keys(f"{where}[{i}]", x, SOURCE_KEYS):
                if "file" not in x:
                    problems.append(f"{where}[{i}] has no `file:`")
                bad = _check_format(x.get("format", "plain"), x.get("columns"))
                if bad:
                    problems.append(f"{where}[{i}]: {bad}")
                if "lines" in x and not (isinstance(x["lines"], int) and not isinstance(x["lines"], bool)
                                         and x["lines"] > 0):
                    problems.append(f"{where}[{i}]: `lines:` (the first N lines of the source) must be a positive "
                                    f"integer, got {x['lines']!r}")

    keys("(top level)", spec, SPEC_KEYS)
    for k in ("name", "title"):
        if not isinstance(spec.get(k), str):
            problems.append(f"`{k}:` must be a string, got {spec.get(k)!r}")
    langs = spec.get("langs")
    string_list("langs", langs)
    if isinstance(langs, list) and len(langs) != 2:
        problems.append(f"langs must name exactly two languages, got {langs!r}")
    if "split_names" in spec:
        string_list("split_names", spec["split_names"])
    downloads = spec.get("downloads", [])
    if not isinstance(downloads, list):
        problems.append(f"downloads must be a list of {{file: ..., sha256: ...}} mappings, got {downloads!r}")
    else:
        for i, d in enumerate(downloads):
            if keys(f"downloads[{i}]", d, DOWNLOAD_KEYS) and "file" not in d:
                problems.append(f"downloads[{i}] has no `file:`")
    splits = spec.get("splits")
    if isinstance(splits, list):
        for i, x in enumerate(splits):
            keys(f"splits[{i}]", x, SPLIT_KEYS)
    elif splits is not None and keys("splits", splits, list(splits) if isinstance(splits, dict) else []):
        for name, srcs in splits.items():
            sources(f"splits.{name}", srcs)
    if "local" in spec and keys("local", spec["local"], LOCAL_KEYS):
        for name, srcs in (spec["local"].get("splits") or {}).items():
            sources(f"local.splits.{name}", srcs)
    if "recipe" in spec:
        keys("recipe", spec["recipe"], RECIPE_KEYS)
    if problems:
        raise SystemExit(f"{path}: " + ("\n  ".join([""] + problems) if len(problems) > 1 else problems[0]))


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
        SystemExit: unknown corpus (lists the valid ones), a spec that is not valid YAML or does
        not pass :func:`check_spec`, or an unknown pipeline."""
    import yaml

    path = os.path.join(DATA_PREP, corpus, "corpus.yaml")
    if not os.path.exists(path) or corpus.startswith("."):
        raise SystemExit(f"unknown corpus '{corpus}'; valid: {', '.join(list_corpora())}")
    try:
        with open(path, encoding="utf-8") as f:
            spec = yaml.safe_load(f)
    except yaml.YAMLError as err:
        raise SystemExit(f"{path} is not valid YAML: {err}") from None
    check_spec(spec, path)
    spec.setdefault("entry", f"data-prep/{corpus}/prepare.sh")
    if spec.setdefault("pipeline", "sentence") not in PIPELINES:
        raise SystemExit(f"{path}: pipeline '{spec['pipeline']}'; valid: {', '.join(PIPELINES)}")
    base = os.environ.get(spec.get("base_url_env") or "", "") or spec.get("base_url")
    for d in spec.get("downloads", []):
        if "url" not in d:
            d["url"] = f"{base.rstrip('/')}/{d['file']}"
    return spec


def shared_inputs(spec):
    """The paths under the shared data folder (:data:`SHARED_DATA`, ``../shared/data``) that ``mt-prep``
    reads for ``spec`` without ``--download``: ``local.default_dir`` for a sentence-level or Multi30k
    corpus (none when it has no local folder), the document-bounded sources for ``long_documents``
    (:data:`mt_pipeline.prep.longdoc.sources.SHARED_INPUTS`).  What the GPU kit carries of a corpus
    (:mod:`mt_pipeline.gpu_kit`)."""
    if spec["pipeline"] == "long_documents":
        from .longdoc.sources import SHARED_INPUTS

        return list(SHARED_INPUTS)
    default = (spec.get("local") or {}).get("default_dir")
    return [default] if default else []


def spec_digest(spec):
    """Digest of the spec (recorded in the raw stamp) without its ``variants``: they change nothing
    up to tok/.  (The default ``pipeline: sentence`` is left out too, so that the digest -- and the
    stamps -- of the specs written before pipelines had names stay the same.)"""
    spec = {k: v for k, v in spec.items() if k != "variants"}
    if spec.get("pipeline") == "sentence":
        spec.pop("pipeline")
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:16]


def effective_recipe(spec, variant=None, truecase=None, bpe=None, merges=None, dictionary=None, word_vocab=None,
                     char_vocab=None):
    """The recipe a run uses: the spec's ``recipe``, updated by the spec's variant ``variant``
    (``variants: {NAME: {about, truecase, bpe_joint, bpe_merges, dictionary, word_vocab, char_vocab}}``),
    then by the CLI overrides ``truecase`` (bool), ``bpe`` ('joint' / 'separate'), ``merges`` (int),
    ``dictionary`` ('joined' / 'separate'), ``word_vocab`` and ``char_vocab`` (int or ``{LANG: int}``;
    either one given replaces the other of the recipe: a run has one segmentation); None = not given.

    Raises:
        SystemExit: unknown variant (lists the valid ones), a variant key outside VARIANT_KEYS, an
        unknown ``bpe`` mode or ``dictionary``."""
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
    if dictionary is not None:
        r["dictionary"] = dictionary
    if word_vocab is not None:
        r["word_vocab"], r["char_vocab"] = word_vocab, None
    if char_vocab is not None:
        r["char_vocab"], r["word_vocab"] = char_vocab, None
    if r.get("dictionary", "joined") not in DICTIONARIES:
        raise SystemExit(f"unknown dictionary '{r['dictionary']}'; valid: {', '.join(DICTIONARIES)}")
    return r


def _sizes_per_lang(r, key, langs, least, what):
    """Recipe ``r``'s ``key`` (one number for every language or ``{LANG: N}``) as ``{LANG: N}``,
    or None when not set.

    Raises:
        SystemExit: languages other than ``langs``, or a value that is not an integer >= ``least``
        (the message says it must be ``what``)."""
    v = r.get(key)
    if v is None:
        return None
    out = dict(v) if isinstance(v, dict) else {l: v for l in langs}
    if sorted(out) != sorted(langs):
        raise SystemExit(f"{key} {v}: give sizes for exactly the languages {list(langs)}")
    if not all(isinstance(n, int) and not isinstance(n, bool) and n >= least for n in out.values()):
        raise SystemExit(f"{key} must be {what}; got {v!r})")
    return out


def word_vocab_for(r, langs):
    """The word vocabulary of recipe ``r``: None (subwords: BPE) or ``{LANG: N}``, the N most frequent
    training words of each language kept and every other word mapped to ``<unk>`` (fairseq-preprocess
    ``--nwordssrc`` / ``--nwordstgt``; N counts fairseq's 4 special symbols).  ``word_vocab`` is one
    number for every language or ``{LANG: N}``.  A word vocabulary replaces BPE: no ``bpe/`` stage.

    Raises:
        SystemExit: not a positive integer, languages other than ``langs``, or per-language sizes
        with a joined dictionary (one dictionary takes one size)."""
    w = r.get("word_vocab")
    out = _sizes_per_lang(r, "word_vocab", langs, 5, "integers > 4 (words kept, fairseq's 4 special symbols included")
    if out is None:
        return None
    if r.get("dictionary") == "joined" and len(set(out.values())) > 1:
        raise SystemExit(f"word_vocab {w} gives a size per language, which needs separate dictionaries "
                         "(dictionary: separate); a joined dictionary takes one size")
    return out


def char_vocab_for(r, langs):
    """The character vocabulary of recipe ``r``: None, or ``{LANG: N}``.  With one, every token is
    split into its characters (:func:`~mt_pipeline.prep.bpe.split_chars`: "@@" on all but a
    token's last, so ``--remove-bpe`` restores the tokens) instead of BPE, and each language keeps
    its N most frequent training *characters* (a character with and without "@@" is one character:
    both its symbols are kept), every other character -> ``<unk>``; separate dictionaries
    (:func:`~mt_pipeline.prep.bpe.char_dictionary`).  Flexible Attention (Shu & Nakayama 2017)
    §5.4: "We keep 100 most frequent types of character for the English side and 3000 types for the
    Japanese side."  ``char_vocab`` is one number for every language or ``{LANG: N}``.

    Raises:
        SystemExit: not a positive integer, languages other than ``langs``, a word vocabulary
        too (one segmentation), or a joined dictionary (each language keeps its own characters)."""
    c = r.get("char_vocab")
    out = _sizes_per_lang(r, "char_vocab", langs, 1, "positive integers (characters kept per language")
    if out is None:
        return None
    if r.get("word_vocab") is not None:
        raise SystemExit(f"char_vocab {c} and word_vocab {r['word_vocab']} both given: a recipe segments into "
                         "characters or words, not both")
    if r.get("dictionary") == "joined":
        raise SystemExit(f"char_vocab {c} keeps each language's own characters, which needs separate "
                         "dictionaries (dictionary: separate)")
    return out


def joined_dictionary(r):
    """Whether recipe ``r`` binarizes with one joined dictionary: its ``dictionary`` when given, else
    joined exactly for joint BPE (separate for separate BPE and for word or character vocabularies)."""
    if r.get("dictionary"):
        return r["dictionary"] == "joined"
    return r.get("word_vocab") is None and r.get("char_vocab") is None and r.get("bpe_joint", True)


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
