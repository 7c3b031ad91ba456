"""Stage tc: Moses truecasing (sacremoses ``MosesTruecaser``), as E-ATT preprocesses its corpora
(Wan et al. 2022, App. A).

Per language a truecaser is learned on ``tok/train.LANG`` (train-truecaser.perl) and saved as
``tc/truecase-model.LANG`` (Moses model format), then applied (truecase.perl) to every split.
``tok/`` keeps the original case: it is the tokenized reference the scores use, and
scripts/evaluate.sh detruecases hypotheses when ``tc/truecase-model.TGT`` exists.

Both steps stream: the truecaser is learned from counts (:func:`learn_truecaser`), and the files
are truecased in chunks over ``--workers`` processes (:func:`truecase_file`).
"""

import collections
import os
import time

from mt_pipeline.atomic import atomic_path
from mt_pipeline.prep.textio import iter_lines, map_file, worker_pool

DESCRIPTION = ("sacremoses MosesTruecaser: learned as train-truecaser.perl (surface-form counts of every "
               "non-sentence-initial token of tok/train.LANG), applied as truecase.perl (sentence-initial "
               "word -> its most frequent form; other known forms kept; other words -> most frequent form; "
               "words not in the model unchanged)")


def learn_truecaser(lines):
    """A Moses truecaser (sacremoses ``MosesTruecaser``) learned on tokenized ``lines`` (any iterable
    of str, e.g. a file streamed by :func:`~mt_pipeline.prep.textio.iter_lines`: only the counts are
    kept) as train-truecaser.perl does: every token that is not sentence-initial counts for its
    surface form; the model's best form of a word is its most frequent one.

    It is ``MosesTruecaser.train(possibly_use_first_token=False)`` counted line by line:
    sacremoses's ``train`` first builds the weights of every token of the corpus in memory
    (``chain(*map(...))``), tens of GB for WMT14 En-Fr."""
    from sacremoses import MosesTruecaser

    tc = MosesTruecaser()
    casing = collections.defaultdict(collections.Counter)
    for line in lines:
        for lower, surface, weight in tc.learn_truecase_weights(line.split(), possibly_use_first_token=False):
            casing[lower][surface] += weight
    tc.model = tc._casing_to_model(casing)
    return tc


def truecase_lines(lines, tc):
    """Tokenized ``lines`` truecased with ``tc`` as truecase.perl does (``use_known=True``: a
    non-initial token whose surface form is in the model is kept; the sentence-initial word and
    other known words get their most frequent form; unknown words are unchanged).

    Raises:
        SystemExit: a line whose token count changed (the output would not align)."""
    out = []
    for line in lines:
        t = tc.truecase(line, return_str=True, use_known=True)
        if len(t.split()) != len(line.split()):
            raise SystemExit(f"truecase: the token count changed on {line[:80]!r} -> {t[:80]!r}")
        out.append(t)
    return out


_TC = None  # the truecaser of this process (set by _init_truecaser, in the workers too)


def _init_truecaser(model):
    global _TC
    from sacremoses import MosesTruecaser

    _TC = None
    if model is not None:
        _TC = MosesTruecaser()
        _TC.model = model


def _truecase_chunk(lines):
    return truecase_lines(lines, _TC) if _TC is not None else lines


def truecase_file(src, dst, tc=None, workers=1, chunk=None):
    """Truecase the file ``src`` -> ``dst`` with the truecaser ``tc`` as :func:`truecase_lines` would
    (``tc`` None: copy the lines), streamed: chunks of ``chunk`` lines (default
    :data:`~mt_pipeline.prep.tok.TOK_CHUNK`) over a pool of ``workers`` processes when > 1, ``dst``
    written through a temp file (complete or not at all).

    Returns:
        The number of lines.

    Raises:
        SystemExit: a line whose token count changed."""
    from mt_pipeline.prep.tok import TOK_CHUNK

    model = None if tc is None else {"best": tc.model["best"], "known": tc.model["known"]}
    with worker_pool(workers if tc is not None else 1, _init_truecaser, (model,)) as pool:
        return map_file(src, dst, _truecase_chunk, pool, chunk or TOK_CHUNK)


def save_model(tc, path):
    """Write ``tc``'s model to ``path`` atomically, readable like every other output (sacremoses
    writes it 0600)."""
    with atomic_path(path) as tmp:
        tc.save_model(tmp)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)


def truecase_files(run, tok_dir, d, splits, langs, tc_langs):
    """Learn a truecaser per language of ``tc_langs`` on ``tok_dir/train.LANG`` (streamed) ->
    ``d/truecase-model.LANG``, and write every split to ``d/`` (truecased over ``run.workers``
    processes, or copied for a language that is not truecased; :func:`truecase_file`).

    Raises:
        SystemExit: truecasing changed a line's token count (``run.die``: names the file)."""
    if not run.dry:  # a model of a language no longer truecased
        for f in os.listdir(d):
            if f.startswith("truecase-model.") and f.split(".", 1)[1] not in tc_langs:
                os.unlink(os.path.join(d, f))
    models = {}
    for lang in tc_langs:
        run.step(f"learn a Moses truecaser on tok/train.{lang} -> tc/truecase-model.{lang}")
        if not run.dry:
            t0 = time.time()
            models[lang] = learn_truecaser(iter_lines(os.path.join(tok_dir, f"train.{lang}")))
            save_model(models[lang], os.path.join(d, f"truecase-model.{lang}"))
            run.log(f"  truecase-model.{lang}: {len(models[lang].model['best'])} words ({time.time() - t0:.1f}s)")
    for s in splits:
        for lang in langs:
            if lang in tc_langs:
                run.step(f"truecase tok/{s}.{lang} -> tc/{s}.{lang} (tc/truecase-model.{lang})")
            else:
                run.step(f"copy tok/{s}.{lang} -> tc/{s}.{lang} ({lang} is not truecased)")
            if run.dry:
                continue
            try:
                truecase_file(os.path.join(tok_dir, f"{s}.{lang}"), os.path.join(d, f"{s}.{lang}"), models.get(lang),
                              run.workers)
            except SystemExit as err:
                run.die(f"tok/{s}.{lang}: {err}")
