"""Translate test sets with a fairseq checkpoint and score them (sacreBLEU, chrF, tokenized BLEU).

Usage (``mt-evaluate``, ``python -m mt_pipeline.evaluate`` or ``bash scripts/evaluate.sh``)::

    mt-evaluate --checkpoint CKPT --data-bin DIR --prep-dir DIR --src en --tgt de \\
        [--subsets test,test1] [--beam 4] [--lenpen 0.6] [--batch-size 128] [--out DIR] \\
        [--user-dir fairseq_plugins|none] [--extra "ARGS"] [--ribes]

For every subset ``S``: ``fairseq-generate`` (always with ``--required-batch-size-multiple 1``:
fairseq as built here silently drops the last ``N mod 8`` sentences otherwise), its log kept as
``<out>/S.generate.log``; the hypotheses extracted in corpus order, none missing
(:mod:`mt_pipeline.hypotheses`); detruecased when the prep truecased the target side
(``<prep>/tc/truecase-model.TGT``); scored against ``<prep>/raw/S.TGT`` (detokenized sacreBLEU,
13a, mixed case; chrF) and ``<prep>/tok/S.TGT`` (tokenized BLEU) by :mod:`mt_pipeline.scoring`;
``<out>/S.json`` written last.  Every file is written atomically.  An RNNsearch model's window
report (the line its attention prints at the end of generation, :func:`window_report`) is kept in
``S.json`` as ``window``, so a committed result carries the window sizes Flexible Attention's
Table 1 shows.

One directory, one checkpoint: ``S.json`` records the checkpoint's path and SHA-256
(``checkpoint_sha256``).  Before anything is generated, the results of any *other* checkpoint in
``--out`` are removed (all subsets, not just the ones asked for), so an interrupted re-evaluation
leaves a directory with fewer subsets, never a mix of two models.  :func:`done_subsets` tells a
caller which subsets are complete for a checkpoint.

Only files mt-evaluate wrote are ever removed or overwritten: they are recorded in
``<out>/.mt-evaluate.owned`` (:class:`mt_pipeline.atomic.OwnedFiles`) before they are written.
Any other file in ``--out`` (a run's ``config.json``, a user's ``notes.json``) is left alone, and
one that has the name of an output to write stops the evaluation before it starts.  A directory
from before the manifest adopts the subsets whose ``S.json`` records a ``checkpoint_sha256``
(and generation logs that start with mt-evaluate's ``# command:`` line).  ``--out`` may not be
the data-bin or prep directory (or inside it).
"""

import argparse
import glob
import json
import os
import re
import subprocess
import sys
import time
from typing import Dict, List, Optional

from .atomic import (NotOwnedError, OwnedFiles, atomic_path, remove_leftovers, writable_problem, write_json_atomic,
                     write_text_atomic)
from .provenance import ROOT
from .provenance import file_sha256 as checkpoint_sha256

__all__ = ["checkpoint_sha256", "done_subsets", "evaluate", "testset_name", "tokenized_with_escaping", "lowercased",
           "dash_split", "main", "EvaluateError", "window_report"]

#: files of one subset ``S`` in an evaluation directory
SUBSET_FILES = ("{s}.json", "{s}.hyp.tok", "{s}.hyp.tc", "{s}.hyp.detok", "{s}.score.txt",
                "{s}.generate.log", "{s}.generate.failed.log")


class EvaluateError(RuntimeError):
    """Bad input or a failed step; the message says which and what to do."""


def window_report(generate_log: str) -> Optional[Dict]:
    """The last window report in a ``fairseq-generate`` log, or None (not an RNNsearch model, or a
    log from before the per-sentence average): the dict of
    :func:`fairseq_plugins.attention.additive.parse_window_report` (``window`` is the paper's
    average, Shu & Nakayama 2017, §5.2)."""
    from fairseq_plugins.attention.additive import parse_window_report

    with open(generate_log, encoding="utf-8", errors="replace") as f:
        return parse_window_report(f.read())


def _tok_stamp(prep_dir: str) -> str:
    """The prep's tok-stage stamp (``<prep_dir>/tok/.done``, written by :mod:`mt_pipeline.prep`),
    or "" without one."""
    try:
        with open(os.path.join(prep_dir, "tok", ".done"), encoding="utf-8") as f:
            return f.read()
    except OSError:
        return ""


def tokenized_with_escaping(prep_dir: str, lang: str) -> bool:
    """Whether the prep in ``prep_dir`` Moses-tokenised ``lang`` with tokenizer.perl's XML escaping
    (``&quot;`` for ``"``, ...): its tok stage's stamp (``<prep_dir>/tok/.done``, written by
    :mod:`mt_pipeline.prep`) describes ``MosesTokenizer(LANG, escape=True, ...)`` for ``lang``.
    Then the hypotheses are unescaped when detokenized (:func:`mt_pipeline.hypotheses.detokenize`)
    -- the raw references are plain text.  False without a stamp, for recipes without escaping
    (Multi30k, the long-document sets) and for pretokenized corpora, whose raw reference keeps
    the corpus's own entities."""
    return f"MosesTokenizer({lang}, escape=True" in _tok_stamp(prep_dir)


def dash_split(prep_dir: str, lang: str) -> bool:
    """Whether the prep tokenized ``lang`` with tokenizer.perl's ``-a`` (``@-@``; the WMT recipes):
    then ``S.json`` also records ``tok_bleu_compound``, fairseq's compound-split tokenized BLEU
    (:func:`mt_pipeline.scoring.compound_split`)."""
    return re.search(rf"MosesTokenizer\({re.escape(lang)}, escape=\w+, aggressive_dash_splits=True",
                     _tok_stamp(prep_dir)) is not None


def tokenized_reference(prep_dir: str, lang: str) -> bool:
    """Whether the prep in ``prep_dir`` got ``lang`` already tokenized upstream (recipe
    ``pretokenized``: IWSLT15 En-Vi's Stanford release): its tok stage's stamp describes "already
    tokenized upstream" for it.  Then raw/ -- the sacreBLEU reference -- is tokenized text, and
    sacreBLEU scores detokenized hypotheses against it: not a standard sacreBLEU number
    (:func:`mark_tokenized_reference`).  False without a stamp."""
    return re.search(rf'"{re.escape(lang)}":\s*"already tokenized upstream', _tok_stamp(prep_dir)) is not None


#: appended to the sacreBLEU / chrF signatures of a score against a tokenized reference
TOKENIZED_REF_SUFFIX = "|ref:tokenized"


def mark_tokenized_reference(res: Dict) -> Dict:
    """Mark a subset's score record ``res`` as scored against a tokenized reference (in place;
    returned): ``reference_tokenized: true`` and :data:`TOKENIZED_REF_SUFFIX` on ``signature`` and
    ``chrf_signature``, so a page or table that shows the signature does not present the number as
    a standard sacreBLEU (13a on detokenized references).  Its tokenized BLEU (``tok_bleu``) is
    the comparable metric and stays as it is."""
    res["reference_tokenized"] = True
    for key in ("signature", "chrf_signature"):
        if res.get(key) and not res[key].endswith(TOKENIZED_REF_SUFFIX):
            res[key] += TOKENIZED_REF_SUFFIX
    return res


def lowercased(prep_dir: str, lang: str) -> bool:
    """Whether the prep in ``prep_dir`` lowercased ``lang`` (its tok stage's stamp describes
    ``... | lowercase`` for it: IWSLT14 De-En's recipe).  A model trained on it writes lowercase, so
    sacreBLEU then compares lowercased text (``case:lc``) against the cased raw reference.  False
    without a stamp or a per-language recipe line (Multi30k, the long-document sets keep case)."""
    for line in _tok_stamp(prep_dir).splitlines():
        if line.startswith("recipe="):
            try:
                desc = json.loads(line[len("recipe="):])
            except ValueError:
                return False
            return isinstance(desc, dict) and "lowercase" in str(desc.get(lang, "")).split(" | ")
    return False


def testset_name(prep_dir: str, subset: str) -> str:
    """The official test-set name of a fairseq subset: Multi30k preps map ``valid/test/test1`` to
    the WMT16 Multimodal names (``val``, ``test_2016_flickr``, ``test_2017_flickr``); any other
    prep keeps the subset name."""
    if os.path.basename(os.path.normpath(prep_dir)).startswith("multi30k"):
        return {"valid": "val", "test": "test_2016_flickr", "test1": "test_2017_flickr"}.get(subset, subset)
    return subset


def _read_json(path: str) -> Optional[Dict]:
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def done_subsets(out: str, sha256: str, subsets: List[str], ribes: bool = False) -> List[str]:
    """The ``subsets`` whose ``<out>/S.json`` was written for the checkpoint with this SHA-256
    (and holds RIBES when ``ribes``)."""
    done = []
    for s in subsets:
        res = _read_json(os.path.join(out, f"{s}.json"))
        if res and res.get("checkpoint_sha256") == sha256 and (not ribes or res.get("tok_ribes") is not None):
            done.append(s)
    return done


_SUBSET_FILE = re.compile(r"([A-Za-z0-9_]+)\.(json|hyp\.tok|hyp\.tc|hyp\.detok|score\.txt|generate\.log|"
                          r"generate\.failed\.log)")
TOOL = "mt-evaluate"


def subset_files(s: str) -> List[str]:
    """The file names mt-evaluate may write for subset ``s`` (:data:`SUBSET_FILES`)."""
    return [pattern.format(s=s) for pattern in SUBSET_FILES]


def owned_files(out: str) -> OwnedFiles:
    """mt-evaluate's manifest of ``out``.  In a directory from before the manifest, the files of
    every subset whose ``S.json`` records a ``checkpoint_sha256`` (mt-evaluate's result), and the
    generation logs that begin with mt-evaluate's ``# command: ... fairseq_cli.generate`` line,
    are adopted as mt-evaluate's; nothing else is."""
    owned = OwnedFiles(out, TOOL)
    if owned.exists or not os.path.isdir(out):
        return owned
    adopt = []
    for name in sorted(os.listdir(out)):
        m = _SUBSET_FILE.fullmatch(name)
        if not m:
            continue
        if m.group(2) == "json":
            res = _read_json(os.path.join(out, name))
            if isinstance(res, dict) and "checkpoint_sha256" in res:
                adopt += [f for f in subset_files(m.group(1)) if os.path.exists(os.path.join(out, f))]
        elif m.group(2).startswith("generate"):
            try:
                with open(os.path.join(out, name), encoding="utf-8", errors="replace") as f:
                    head = f.readline()
            except OSError:
                continue
            if head.startswith("# command: ") and "fairseq_cli.generate" in head:
                adopt.append(name)
    if adopt:
        owned.adopt(adopt)
    return owned


def _purge_other_checkpoints(out: str, sha256: str, owned: Optional[OwnedFiles] = None) -> List[str]:
    """Remove every subset's files in ``out`` that mt-evaluate wrote unless its ``S.json`` belongs
    to ``sha256``; returns the subsets removed.  Files of a subset without ``S.json`` (an
    interrupted run) go too; files mt-evaluate did not write (``owned``, default
    :func:`owned_files`) are never removed."""
    owned = owned if owned is not None else owned_files(out)
    names = {m.group(1) for m in map(_SUBSET_FILE.fullmatch, sorted(owned.names)) if m}
    removed = []
    for s in sorted(names):
        res = _read_json(os.path.join(out, f"{s}.json")) if owned.owns(f"{s}.json") else None
        if res and res.get("checkpoint_sha256") == sha256:
            continue
        gone = [name for name in subset_files(s) if owned.remove(name)]
        if gone:
            removed.append(s)
    return removed


def check_out(a, out: str) -> OwnedFiles:
    """Refuse an ``out`` that cannot be written (a read-only folder), that is (or is inside)
    ``--data-bin`` or ``--prep-dir``, or that holds a
    file mt-evaluate did not write under the name of an output it would write for ``a.subsets``;
    returns mt-evaluate's manifest of ``out`` (nothing is written when ``out`` is new).

    Raises:
        EvaluateError: the message names the directory or the files and the way out.
    """
    real = os.path.realpath(out)
    for flag, d in (("--data-bin", a.data_bin), ("--prep-dir", a.prep_dir)):
        d = os.path.realpath(d)
        if real == d or real.startswith(d + os.sep):
            raise EvaluateError(f"--out {out} is inside {flag} {d}; evaluation outputs go to a directory of their "
                                "own (e.g. the default <checkpoint dir>/eval_<checkpoint name>)")
    problem = writable_problem(out)
    if problem:
        raise EvaluateError(f"--out {out}: {problem}; choose a writable --out")
    owned = owned_files(out)
    alien = owned.foreign([f for s in a.subsets for f in subset_files(s)])
    if alien:
        raise EvaluateError(f"--out {out} holds {', '.join(alien)}, not written by mt-evaluate; refusing to overwrite "
                            "(use another --out, or move them away)")
    return owned


def _check_inputs(a) -> None:
    """Raise :class:`EvaluateError` naming the first bad input (before the slow generation)."""
    for name in ("checkpoint", "data_bin", "prep_dir", "src", "tgt"):
        if not getattr(a, name):
            raise EvaluateError(f"--{name.replace('_', '-')} is required (see --help)")
    if not os.path.isfile(a.checkpoint):
        raise EvaluateError(f"--checkpoint {a.checkpoint}: no such file")
    for flag, path in (("--data-bin", a.data_bin), ("--prep-dir", a.prep_dir)):
        if not os.path.isdir(path):
            raise EvaluateError(f"{flag} {path}: no such directory")
    langs = sorted(os.path.basename(p)[5:-4] for p in glob.glob(os.path.join(a.data_bin, "dict.*.txt")))
    for lang in (a.src, a.tgt):
        if not os.path.isfile(os.path.join(a.data_bin, f"dict.{lang}.txt")):
            raise EvaluateError(f"no dictionary {a.data_bin}/dict.{lang}.txt; languages available in "
                                f"--data-bin: {' '.join(langs) or 'none'}")
    if a.src == a.tgt:
        raise EvaluateError("--src and --tgt must differ")
    if a.beam < 1 or a.batch_size < 1:
        raise EvaluateError(f"--beam and --batch-size must be positive integers (got {a.beam}, {a.batch_size})")
    if a.user_dir and a.user_dir != "none" and not os.path.isdir(a.user_dir):
        raise EvaluateError(f"--user-dir {a.user_dir}: no such directory (use --user-dir none for no plugin)")
    if not a.subsets:
        raise EvaluateError("--subsets is empty")
    raw = os.path.join(a.prep_dir, "raw")
    for s in a.subsets:
        if not re.fullmatch(r"[A-Za-z0-9_]+", s):
            raise EvaluateError(f"bad subset name {s!r} in --subsets (e.g. test,test1)")
        if not os.path.isfile(os.path.join(raw, f"{s}.{a.tgt}")):
            have = sorted(n[: -len(a.tgt) - 1] for n in os.listdir(raw) if n.endswith("." + a.tgt)) \
                if os.path.isdir(raw) else []
            raise EvaluateError(f"missing detokenized reference {raw}/{s}.{a.tgt} (subsets available in "
                                f"--prep-dir: {' '.join(have) or 'none'})")
        if not os.path.isfile(os.path.join(a.prep_dir, "tok", f"{s}.{a.tgt}")):
            raise EvaluateError(f"missing tokenized reference {a.prep_dir}/tok/{s}.{a.tgt}")
        if not any(os.path.isfile(os.path.join(a.data_bin, f"{s}.{x}.{a.src}.idx"))
                   for x in (f"{a.src}-{a.tgt}", f"{a.tgt}-{a.src}")):
            raise EvaluateError(f"subset {s!r} not binarized in {a.data_bin} (no {s}.{a.src}-{a.tgt}.{a.src}.idx "
                                f"or {s}.{a.tgt}-{a.src}.{a.src}.idx)")


#: fairseq-generate flags mt-evaluate sets itself (``--extra`` may not give them: a second
#: ``--gen-subset`` would score one subset's hypotheses against another's references)
OWN_FLAGS = {"--gen-subset": "--subsets", "--source-lang": "--src", "-s": "--src", "--target-lang": "--tgt",
             "-t": "--tgt", "--path": "--checkpoint", "--beam": "--beam", "--lenpen": "--lenpen",
             "--batch-size": "--batch-size", "--max-sentences": "--batch-size", "--remove-bpe": "(always given)",
             "--post-process": "(--remove-bpe is always given)", "--required-batch-size-multiple": "(always 1)",
             "--nbest": "(always 1)", "--user-dir": "--user-dir", "--results-path": "(the log is read from stdout)"}


def check_extra(extra: str) -> None:
    """Refuse an ``--extra`` that gives a flag mt-evaluate sets itself (:data:`OWN_FLAGS`).

    Raises:
        EvaluateError: naming the flag and mt-evaluate's own option for it.
    """
    import shlex

    for word in shlex.split(extra or ""):
        flag = word.split("=", 1)[0]
        if flag in OWN_FLAGS:
            raise EvaluateError(f"--extra may not set {flag}: mt-evaluate sets it itself; use {OWN_FLAGS[flag]}")


def check_checkpoint_data(a) -> None:
    """Compare the checkpoint with ``--src/--tgt`` and ``--data-bin``: the direction stored in its
    ``cfg.task`` and, for the plugin's models, the fingerprints of the dictionaries it was trained
    with (:mod:`fairseq_plugins.trained_data`), before anything is generated.

    Raises:
        EvaluateError: the checkpoint cannot be read, was trained in another direction, or with
            other dictionaries than ``--data-bin``'s (the message says which and what to do).
    """
    from fairseq.data import Dictionary

    from fairseq_plugins.checkpoint import CheckpointError, load_checkpoint
    from fairseq_plugins.trained_data import check_languages, dictionary_fingerprint, stored_record

    try:
        state = load_checkpoint(a.checkpoint)
        check_languages(state, a.src, a.tgt, a.checkpoint)
    except CheckpointError as err:
        raise EvaluateError(str(err)) from None
    record = stored_record(state) or {}
    for side, lang in (("source", a.src), ("target", a.tgt)):
        want = record.get(f"{side}_dict")
        if want:
            path = os.path.join(a.data_bin, f"dict.{lang}.txt")
            got = dictionary_fingerprint(Dictionary.load(path))
            if got != want:
                raise EvaluateError(f"{path} is not the {side} dictionary {a.checkpoint} was trained with "
                                    f"(fingerprint {got[:12]}, trained with {want[:12]}): same size or not, its "
                                    "indices name other words; give the --data-bin the model was trained on")


def _generate(a, subset: str, log_path: str) -> None:
    """Run fairseq-generate on ``subset``; its output (command first) goes to ``log_path``
    atomically, or to ``<subset>.generate.failed.log`` and an :class:`EvaluateError`."""
    import torch

    cmd = [sys.executable, "-m", "fairseq_cli.generate", a.data_bin, "--path", a.checkpoint,
           "--gen-subset", subset, "--source-lang", a.src, "--target-lang", a.tgt, "--beam", str(a.beam),
           "--lenpen", str(a.lenpen), "--remove-bpe", "--batch-size", str(a.batch_size),
           "--required-batch-size-multiple", "1"]
    if a.user_dir and a.user_dir != "none":
        cmd[4:4] = ["--user-dir", os.path.abspath(a.user_dir)]
    if not torch.cuda.is_available():
        cmd.append("--cpu")
    cmd += a.extra.split()
    with atomic_path(log_path) as tmp:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write("# command: " + " ".join(cmd) + "\n")
            f.flush()
            rc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, cwd=ROOT).returncode
        if rc != 0:
            failed = os.path.join(os.path.dirname(log_path), f"{subset}.generate.failed.log")
            os.replace(tmp, failed)
            with open(failed, encoding="utf-8", errors="replace") as f:
                sys.stderr.write("".join(f.readlines()[-20:]))
            raise EvaluateError(f"fairseq-generate failed on subset {subset} (log: {failed})")


def evaluate(a) -> List[Dict]:
    """Generate and score every subset of ``a`` (the parsed arguments of :func:`main`); returns
    the ``S.json`` dicts.

    Raises:
        EvaluateError: bad input (checked before anything is written: paths, subsets, ``--extra``,
            the checkpoint's direction and dictionaries, ``--out``), a failed generation, or
            hypotheses that do not match the references (count, missing ids, BPE left).
    """
    from . import hypotheses, scoring

    _check_inputs(a)
    check_extra(a.extra)
    check_checkpoint_data(a)
    out = os.path.abspath(a.out or os.path.join(os.path.dirname(a.checkpoint),
                                                "eval_" + os.path.splitext(os.path.basename(a.checkpoint))[0]))
    owned = check_out(a, out)
    os.makedirs(out, exist_ok=True)
    sha = checkpoint_sha256(a.checkpoint)
    planned = [f for s in a.subsets for f in subset_files(s)]
    remove_leftovers(out, names=sorted(owned.names | set(planned)))  # temp files a kill left, of our outputs only
    for s in _purge_other_checkpoints(out, sha, owned):
        print(f"[evaluate] removed the results of subset {s} (another checkpoint, or incomplete)", file=sys.stderr)
    try:
        owned.claim(planned)  # recorded before they are written
    except NotOwnedError as err:  # (a file appeared since check_out)
        raise EvaluateError(str(err)) from None
    truecased = os.path.isfile(os.path.join(a.prep_dir, "tc", f"truecase-model.{a.tgt}"))
    escaped = tokenized_with_escaping(a.prep_dir, a.tgt)
    lower = lowercased(a.prep_dir, a.tgt)  # sacreBLEU case:lc for a lowercasing recipe
    compound = dash_split(a.prep_dir, a.tgt)  # tokenizer.perl -a: also compound-split tokenized BLEU
    tok_ref_only = tokenized_reference(a.prep_dir, a.tgt)  # pretokenized corpus (Stanford En-Vi)
    post = ("remove-bpe,detruecase,detokenize" if truecased else "remove-bpe,detokenize")
    post += ",unescape" if escaped else ""
    print(f"[evaluate] checkpoint={a.checkpoint} sha256={sha[:12]} direction={a.src}->{a.tgt} beam={a.beam} "
          f"lenpen={a.lenpen} postprocess={post} out={out}", file=sys.stderr)
    results = []
    for s in a.subsets:
        ref = os.path.join(a.prep_dir, "raw", f"{s}.{a.tgt}")
        tok_ref = os.path.join(a.prep_dir, "tok", f"{s}.{a.tgt}")
        n = len(scoring.read_lines(ref))
        print(f"[evaluate] {s} ({testset_name(a.prep_dir, s)}): generating {n} sentences ...", file=sys.stderr)
        log = os.path.join(out, f"{s}.generate.log")
        t0 = time.perf_counter()
        _generate(a, s, log)
        t1 = time.perf_counter()
        hyp_tok, hyp_detok = os.path.join(out, f"{s}.hyp.tok"), os.path.join(out, f"{s}.hyp.detok")
        argv = [log, "--expected", str(n), "--lang", a.tgt, "--tok-out", hyp_tok, "--detok-out", hyp_detok]
        if truecased:
            argv += ["--detruecase", "--truecased-out", os.path.join(out, f"{s}.hyp.tc")]
        if escaped:
            argv.append("--unescape")
        if hypotheses.main(argv) != 0:
            raise EvaluateError(f"could not extract {n} hypotheses for subset {s} from {log}")
        try:
            res = scoring.score_files(hyp_detok, ref, hyp_tok, tok_ref, ribes=a.ribes, lowercase=lower,
                                      compound=compound)
        except (scoring.LineCountError, scoring.TextError) as err:
            raise EvaluateError(f"scoring failed for subset {s}: {err}") from err
        if tok_ref_only:  # raw/ holds the corpus's tokenized text: not a standard sacreBLEU
            mark_tokenized_reference(res)
        # wall seconds of this subset's steps: the fairseq-generate process (start-up, model load,
        # decoding) and extraction + scoring -- where a slow evaluation spends its time
        res["seconds"] = {"generate": round(t1 - t0, 2), "extract_and_score": round(time.perf_counter() - t1, 2)}
        print(f"[evaluate] {s}: fairseq-generate {t1 - t0:.1f} s, extraction and scoring "
              f"{time.perf_counter() - t1:.1f} s", file=sys.stderr)
        res.update(subset=s, testset=testset_name(a.prep_dir, s), src=a.src, tgt=a.tgt,
                   checkpoint=os.path.abspath(a.checkpoint), checkpoint_sha256=sha, beam=str(a.beam),
                   lenpen=str(a.lenpen), extra=a.extra, postprocess=post)
        window = window_report(log)
        if window is not None:  # an RNNsearch model: the positions its attention scored (§5.2)
            res["window"] = window
        line = (f"{s} ({res['testset']}) {a.src}->{a.tgt}: BLEU = {res['bleu']:.2f} | chrF = {res['chrf']:.2f} | "
                f"tok BLEU = {res['tok_bleu']:.2f} | n = {res['n_hyp']} | {res['signature']}")
        write_text_atomic(os.path.join(out, f"{s}.score.txt"), res["bleu_str"] + "\n" + line + "\n")
        write_json_atomic(os.path.join(out, f"{s}.json"), res)  # last: marks the subset done
        print(line)
        results.append(res)
    print(f"[evaluate] done; results in {out}/{{{','.join(a.subsets)}}}.json", file=sys.stderr)
    return results


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="mt-evaluate", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="Outputs in --out, per subset S: S.generate.log, S.hyp.tok, [S.hyp.tc], "
                                       "S.hyp.detok, S.score.txt, S.json (scores, settings, checkpoint sha256).")
    p.add_argument("--checkpoint", required=True, help="model checkpoint (.pt)")
    p.add_argument("--data-bin", required=True, help="fairseq binarized data dir (e.g. data-bin/multi30k_en_de/bin)")
    p.add_argument("--prep-dir", required=True,
                   help="data-prep dir holding raw/S.TGT (detokenized reference) and tok/S.TGT (tokenized)")
    p.add_argument("--src", required=True, help="source language, e.g. en")
    p.add_argument("--tgt", required=True, help="target language, e.g. de")
    p.add_argument("--subsets", default="test,test1", type=lambda x: [s for s in x.split(",") if s],
                   help="comma-separated fairseq subsets (default: test,test1; Multi30k: valid=val, "
                        "test=test_2016_flickr, test1=test_2017_flickr)")
    p.add_argument("--beam", type=int, default=4, help="beam size (default 4)")
    p.add_argument("--lenpen", type=float, default=0.6, help="length penalty (default 0.6)")
    p.add_argument("--batch-size", type=int, default=128, help="sentences per batch (default 128)")
    p.add_argument("--out", help="output dir (default: <checkpoint dir>/eval_<checkpoint name>)")
    p.add_argument("--user-dir", default=os.path.join(ROOT, "fairseq_plugins"),
                   help="fairseq --user-dir (default: this checkout's fairseq_plugins; none: no plugin)")
    p.add_argument("--extra", default="", help='extra fairseq-generate arguments, split on whitespace')
    p.add_argument("--ribes", action="store_true", help="also RIBES on the tokenized text (slow on long sentences)")
    return p


def main(argv=None) -> int:
    """Command line of :func:`evaluate`; exit status 0, or 1 with the error on stderr."""
    a = parser().parse_args(argv)
    try:
        evaluate(a)
    except EvaluateError as err:
        print(f"[evaluate] ERROR: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
