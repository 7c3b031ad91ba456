"""Stage tok: Moses tokenisation (sacremoses) by a corpus recipe, and the corpus-level cleaning.

Recipe keys (all optional): ``normalize_punct`` (MosesPunctNormalizer), ``remove_non_printing``
(remove-non-printing-char.perl) -- each ``true`` (every split) or a list of splits (fairseq's
prepare-wmt14en2de.sh normalises the training data only: its test set gets ``’ -> '`` and the
tokenizer, so its tokenized-BLEU reference keeps „ “ and –), ``romanian`` (WMT16 Ro normalisation
+ diacritics removed), ``replace_apostrophe`` (splits whose U+2019 becomes ``'``), ``escape``
(tokenizer.perl's XML escaping, default true), ``aggressive_dash_splits`` (``-a``, default false),
``perl_final_period`` (tokenizer.perl's final-period rule, :func:`moses_final_period`, default
true), ``lowercase``, ``pretokenized`` (text tokenized upstream: whitespace normalised only),
``clean`` (clean-corpus-n.perl on train), ``valid_every`` (valid = every N-th training pair).
Chinese and Japanese are segmented first (jieba / KyTea, :data:`~mt_pipeline.prep.tools.LANG_TOOLS`).

Files are streamed (:func:`tokenize_file`): read in chunks of :data:`TOK_CHUNK` lines, tokenized
over ``--workers`` processes (each creates its own sacremoses objects and segmenter), written
through a temp file; clean-corpus-n and the valid carving read both sides together line by line.
Memory is bounded by the chunk size times the workers, the output is that of one process.
"""

import contextlib
import os
import re
import time
import unicodedata

from mt_pipeline.prep.textio import iter_lines, lines_writer, map_file, paired_lines, worker_pool
from mt_pipeline.prep.tools import LANG_TOOLS

#: lines per task of the tokeniser (and truecaser) pool: a file is streamed in chunks of this many
#: lines, at most two per worker in memory at a time
TOK_CHUNK = 20000


def moses_final_period(tokenized):
    """tokenizer.perl's last-word rule that sacremoses misses: the last word ``X.`` (not a
    multi-dot ``..``) is always split into ``X .`` (tokenizer.perl: "split last words
    independently as they are unlikely to be non-breaking prefixes"); also strips the trailing
    space sacremoses leaves in that case."""
    words = tokenized.strip().split(" ")
    m = re.match(r"^(\S+)\.$", words[-1])
    if m and ".." not in words[-1]:
        words[-1] = m.group(1) + " ."
    return " ".join(words)


_RO_MAP = str.maketrans({"\u015e": "\u0218", "\u015f": "\u0219", "\u0162": "\u021a", "\u0163": "\u021b"})
_RO_STRIP = str.maketrans({"\u0218": "S", "\u0219": "s", "\u021a": "T", "\u021b": "t", "\u0102": "A", "\u0103": "a",
                           "\u00c2": "A", "\u00e2": "a", "\u00ce": "I", "\u00ee": "i"})


def romanian_normalise(line):
    """The WMT16 Ro-En recipe of Sennrich et al. (2016) for Romanian (wmt16-scripts
    preprocess/normalise-romanian.py + remove-diacritics.py): cedilla S/T -> comma-below, then
    every Romanian diacritic removed."""
    return line.translate(_RO_MAP).translate(_RO_STRIP)


def remove_non_printing(line):
    """remove-non-printing-char.perl: ``s/\\p{C}/ /g`` (control, format, unassigned, private use)."""
    return "".join(" " if unicodedata.category(c).startswith("C") else c for c in line)


def clean_ok(sides, c):
    """clean-corpus-n.perl's test for one sentence pair (token counts on whitespace):
    every side has ``c['min']``..``c['max']`` tokens and the ratio of the two lengths is at most
    ``c['ratio']``."""
    n = [len(s.split()) for s in sides]
    if any(k < c["min"] or k > c["max"] for k in n):
        return False
    return max(n) / min(n) <= c["ratio"]


#: recipe keys that may name the splits they apply to (a list) instead of all of them (``true``)
PER_SPLIT_KEYS = ("normalize_punct", "remove_non_printing", "replace_apostrophe")


def split_recipe(r, split):
    """Recipe ``r`` as it applies to ``split``: each of :data:`PER_SPLIT_KEYS` given as a list of
    splits becomes whether ``split`` is among them (a boolean stays as it is)."""
    return dict(r, **{k: split in r[k] for k in PER_SPLIT_KEYS if isinstance(r.get(k), (list, tuple))})


def describe(r, langs):
    """``{LANG: text}``: what the tokenisation of recipe ``r`` does per language (in the stamps)."""
    out = {}
    for l in langs:
        if r.get("pretokenized"):
            out[l] = "already tokenized upstream: whitespace normalised only" + (" | lowercase" if r.get("lowercase") else "")
            continue
        parts = []
        only = lambda k: f" ({', '.join(r[k])} only)" if isinstance(r.get(k), (list, tuple)) else ""  # noqa: E731
        if r.get("normalize_punct"):
            parts.append("MosesPunctNormalizer" + only("normalize_punct"))
        if r.get("remove_non_printing"):
            parts.append("remove-non-printing-char" + only("remove_non_printing"))
        if r.get("replace_apostrophe"):
            parts.append("’->'")
        if l in LANG_TOOLS:
            parts.append(LANG_TOOLS[l][0] + " segmentation")
        final = ", perl-compatible final period" if r.get("perl_final_period", True) else ""
        parts.append(f"MosesTokenizer({l}, escape={r.get('escape', True)}, "
                     f"aggressive_dash_splits={r.get('aggressive_dash_splits', False)}{final})")
        if r.get("lowercase"):
            parts.append("lowercase")
        out[l] = " | ".join(parts)
    return out


def _segmenter(lang):
    if lang == "zh":
        import jieba

        return lambda s: " ".join(w for w in jieba.cut(s) if w.strip())
    if lang == "ja":
        import Mykytea

        kt = Mykytea.Mykytea("")
        return lambda s: " ".join(kt.getWS(s))
    return None


def make_tokenizer(lang, r):
    """The tokeniser of language ``lang`` by recipe ``r`` (see :func:`describe`): a function from a
    list of raw lines to the list of their tokenized lines (one per line), its sacremoses objects
    and segmenter (jieba / KyTea) created once, here (in each worker process of a pool).

    The function raises ``SystemExit`` when a line break survived tokenisation (the output would
    not align)."""
    from sacremoses import MosesPunctNormalizer, MosesTokenizer

    if r.get("pretokenized"):
        if r.get("lowercase"):
            return lambda lines: [" ".join(l.split()).lower() for l in lines]
        return lambda lines: [" ".join(l.split()) for l in lines]
    norm = MosesPunctNormalizer(lang=lang) if r.get("normalize_punct") else None
    tok = MosesTokenizer(lang=lang if lang not in ("zh", "ja") else "en")
    seg = _segmenter(lang)

    def tokenize(lines):
        out = []
        for line in lines:
            if lang == "ro" and r.get("romanian"):
                line = romanian_normalise(line)
            if norm is not None:
                line = norm.normalize(line)
            if r.get("remove_non_printing"):
                line = remove_non_printing(line)
            if r.get("replace_apostrophe"):
                line = line.replace("\u2019", "'")
            if seg is not None:
                line = seg(line)
            t = tok.tokenize(line, escape=r.get("escape", True), return_str=True,
                             aggressive_dash_splits=r.get("aggressive_dash_splits", False))
            if r.get("perl_final_period", True):
                t = moses_final_period(t) if t.strip() else ""
            if r.get("lowercase"):
                t = t.lower()
            if "\n" in t or "\r" in t:
                raise SystemExit(f"tokenize: a line break survived tokenisation: {line[:80]!r}")
            out.append(t)
        return out
    return tokenize


def tokenize_lines(lines, lang, r):
    """Raw ``lines`` of language ``lang`` tokenized by recipe ``r`` (see :func:`describe`); one
    output line per input line (in memory; a stage streams its files: :func:`tokenize_file`).

    Raises:
        SystemExit: a line break survived tokenisation (the output would not align)."""
    return make_tokenizer(lang, r)(list(lines))


_TOKENIZE = None  # the tokeniser of this process (set by _init_tokenizer, in the workers too)


def _init_tokenizer(lang, r):
    global _TOKENIZE
    _TOKENIZE = make_tokenizer(lang, r)


def _tokenize_chunk(lines):
    return _TOKENIZE(lines)


def tokenize_file(src, dst, lang, r, workers=1, chunk=None):
    """Tokenise the file ``src`` -> ``dst`` as :func:`tokenize_lines` would, streamed: chunks of
    ``chunk`` lines (default :data:`TOK_CHUNK`) over a pool of ``workers`` processes when > 1 (each
    with its own tokeniser), ``dst`` written through a temp file (complete or not at all).

    Returns:
        The number of lines.

    Raises:
        SystemExit: a line break survived tokenisation.
        UnicodeDecodeError: ``src`` is not UTF-8."""
    workers = 1 if r.get("pretokenized") else workers  # whitespace only: a pool would cost more than it saves
    with worker_pool(workers, _init_tokenizer, (lang, r)) as pool:
        return map_file(src, dst, _tokenize_chunk, pool, chunk or TOK_CHUNK)


def tokenize_files(run, src_dir, dst_dir, splits, langs, recipe_of, src_name="raw"):
    """Tokenise ``src_dir/SPLIT.LANG`` -> ``dst_dir/SPLIT.LANG`` for every split and language
    (``recipe_of(split)``: the recipe of that split) with :func:`tokenize_file` over ``run.workers``
    processes, logging lines and time per file.

    Raises:
        SystemExit: a line break survived tokenisation (``run.die``: names the file)."""
    for s in splits:
        r = recipe_of(s)
        desc = describe(r, langs)
        for lang in langs:
            run.step(f"tokenise {src_name}/{s}.{lang} -> tok/{s}.{lang}: {desc[lang]}")
            if run.dry:
                continue
            t0 = time.time()
            try:
                n = tokenize_file(os.path.join(src_dir, f"{s}.{lang}"), os.path.join(dst_dir, f"{s}.{lang}"), lang, r,
                                  run.workers)
            except SystemExit as err:
                run.die(f"{src_name}/{s}.{lang}: {err}")
            run.log(f"  {s}.{lang}: {n} lines ({time.time() - t0:.1f}s)")


def clean_train(run, d, langs, c):
    """clean-corpus-n.perl on ``d/train.*`` (pairs failing :func:`clean_ok` removed), streamed:
    the files are read together line by line and rewritten through temp files.

    Raises:
        SystemExit: the files are not line-aligned (``run.die``)."""
    run.step(f"clean tok/train (clean-corpus-n: ratio {c['ratio']}, length {c['min']}..{c['max']} tokens)")
    if run.dry:
        return
    paths = [os.path.join(d, f"train.{l}") for l in langs]
    kept = total = 0
    try:
        with contextlib.ExitStack() as stack:
            outs = [stack.enter_context(lines_writer(p)) for p in paths]
            for pair in paired_lines(paths):
                total += 1
                if clean_ok(pair, c):
                    kept += 1
                    for f, line in zip(outs, pair):
                        f.write(line + "\n")
    except SystemExit as err:
        run.die(f"clean: {err}")
    run.log(f"  kept {kept} of {total} training pairs")


def carve_valid(run, d, langs, every):
    """valid = every ``every``-th pair of ``d/train.*``, the rest stays train (fairseq's IWSLT14
    and WMT14 recipes); streamed, each file written through a temp file."""
    run.step(f"valid = every {every}-th pair of the cleaned tok/train (the rest stays train), as the fairseq recipe")
    if run.dry:
        return
    for l in langs:
        train = os.path.join(d, f"train.{l}")
        with lines_writer(os.path.join(d, f"valid.{l}")) as valid, lines_writer(train) as rest:
            for i, x in enumerate(iter_lines(train), 1):
                (valid if i % every == 0 else rest).write(x + "\n")
