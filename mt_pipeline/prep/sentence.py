"""Sentence-level corpora defined by a spec (pipeline ``sentence``: IWSLT14/15, WMT14-18, ASPEC).

Stages (``<out>/``; every one idempotent and atomic, :class:`~mt_pipeline.prep.run.PrepRun`)::

    inputs  local directory (--local-dir, default the matching folder of ../shared/data when
            present) or download mode (the spec's URLs + checksums, :mod:`~mt_pipeline.prep.fetch`)
    raw     every split extracted from its sources (:mod:`~mt_pipeline.prep.raw`) -> raw/SPLIT.LANG;
            ``valid`` may be every N-th training pair (the fairseq IWSLT14 and WMT14 recipes)
    tok     the recipe's tokenisation (:mod:`~mt_pipeline.prep.tok`) -> tok/SPLIT.LANG;
            [clean-corpus-n on train]
    tc      [truecasing: recipe ``truecase``, --truecase / --no-truecase] (:mod:`~mt_pipeline.prep.tc`)
    bpe     joint (one model, ``bpe/codes``: learned, the codes the corpus ships, or --bpe-codes) or
            separate BPE (``bpe/codes.LANG``) on tc/ or tok/ (:mod:`~mt_pipeline.prep.bpe`); none
            with a word vocabulary (recipe ``word_vocab``, --word-vocab)
    char    instead of bpe with a character vocabulary (recipe ``char_vocab``, --char-vocab): every
            token split into characters ("@@" on all but its last) -> char/SPLIT.LANG, and
            char/dict.LANG.txt keeping each language's N most frequent training characters (a
            character not kept is one <unk> with or without "@@", so a generated word around an
            <unk> splits there after --remove-bpe)
    bin     fairseq-preprocess -> bin/ (+ subsets.json): a joined dictionary with joint BPE, separate
            ones with separate BPE, words or characters (recipe ``dictionary``, --dictionary,
            overrides); with a word vocabulary each dictionary keeps the N most frequent training
            words, with a character vocabulary char/'s dictionaries; OOV -> <unk>

Variants (``--variant NAME``, spec ``variants``) share download/, raw/ and tok/ with the default
recipe and write tc/, bpe/ (or char/), bin/ to ``<out>/<variant>/`` (raw/ and tok/ there are links to the
shared ones).  Where the training data is not available (local mode on ../shared/data holds only
dev/test sets), the stages run on the splits that are there and the run ends naming what is
missing and how to get it.  The stamps (:func:`~mt_pipeline.prep.run.stamp_text`) hold the stage
parameters, the digest of the upstream stamp and the tool versions.
"""

import hashlib
import json
import os
import shutil
from dataclasses import dataclass
from typing import Dict, List, Optional

from mt_pipeline.prep import binarize, bpe, fetch, raw, tc, tok
from mt_pipeline.provenance import file_sha256
from mt_pipeline.prep.binarize import preprocess_cmd, run_preprocess
from mt_pipeline.prep.run import PrepRun, not_owned_message, owned, stamp_text
from mt_pipeline.prep.spec import (DICTIONARIES, SHARED_DATA, bpe_merges_for, char_vocab_for, effective_recipe,
                                   joined_dictionary, spec_digest, truecase_langs, word_vocab_for)
from mt_pipeline.prep.textio import check_pair, count_lines, write_text_atomic
from mt_pipeline.prep.tools import check_lang_tool, check_tool, tool_versions


def stamps(stage, **kw):
    """``(stamp, legacy)``: the stage's stamp (:func:`~mt_pipeline.prep.run.stamp_text`) and the
    JSON stamp (sorted keys, one per line) that mt-prep wrote for it before the stamps had one
    format.  The JSON one is read only so that sentence-level preps made then stay up to date (a
    WMT prep takes hours); it is never written."""
    return stamp_text(stage, **kw), json.dumps(dict(kw, stage=stage), sort_keys=True, indent=1)


#: the stages, in order (``mt-prep CORPUS --until``); a run has tc only when it truecases, and bpe,
#: char or neither (a word-level recipe) as its recipe segments (:func:`run_stages`)
STAGES = ("raw", "tok", "tc", "bpe", "char", "bin")
#: the stage that writes the references a run is scored against (``raw/``, detokenized)
REFERENCE_STAGE = "raw"


def check_args(p, spec, args):
    """Nothing beyond the common checks of the CLI (which checks ``--until`` against
    :func:`run_stages`)."""


@dataclass(frozen=True)
class RunRecipe:
    """The recipe one run follows: the spec's, its ``--variant`` and the options applied
    (:func:`resolve_recipe`)."""

    #: the effective recipe dict (:func:`~mt_pipeline.prep.spec.effective_recipe`)
    recipe: dict
    #: the languages that are truecased (empty: no tc stage)
    tc_langs: List[str]
    #: one BPE model for both languages (``bpe/codes``) rather than one per language
    joint: bool
    #: ``{LANG: N}`` with a word vocabulary (no BPE), else None
    words: Optional[Dict[str, int]]
    #: ``{LANG: N}`` with a character vocabulary (no BPE), else None
    chars: Optional[Dict[str, int]]
    #: one dictionary for both languages in bin/
    joined: bool

    @property
    def segmentation(self) -> Optional[str]:
        """The stage that segments the tokens: ``"bpe"``, ``"char"``, or None (a word vocabulary)."""
        return None if self.words else "char" if self.chars else "bpe"


def resolve_recipe(spec, args) -> RunRecipe:
    """The recipe a run of ``mt-prep CORPUS`` follows for parsed ``args`` (``--variant``,
    ``--truecase``, ``--bpe``, ``--bpe-merges``, ``--dictionary``, ``--word-vocab``, ``--char-vocab``).

    Raises:
        SystemExit: an unknown variant or option value (the message names the valid ones), BPE
        merges missing for a BPE recipe, or a BPE option given with a word / character vocabulary."""
    langs = list(spec["langs"])
    recipe = effective_recipe(spec, args.variant, truecase=args.truecase, bpe=args.bpe, merges=args.bpe_merges,
                              dictionary=args.dictionary,
                              word_vocab=_vocab_arg(args.word_vocab, langs, "--word-vocab"),
                              char_vocab=_vocab_arg(args.char_vocab, langs, "--char-vocab"))
    r = RunRecipe(recipe, truecase_langs(recipe, langs), recipe.get("bpe_joint", True), word_vocab_for(recipe, langs),
                  char_vocab_for(recipe, langs), joined_dictionary(recipe))
    vocab = ("word_vocab", r.words) if r.words else ("char_vocab", r.chars) if r.chars else None
    if vocab is None:
        bpe_merges_for(recipe, langs, r.joint)
    elif args.bpe or args.bpe_merges or args.bpe_codes:
        raise SystemExit(f"a {vocab[0].split('_')[0]} vocabulary ({vocab[0]}: "
                         + ", ".join(f"{l} {n}" for l, n in vocab[1].items())
                         + ") has no BPE: drop --bpe / --bpe-merges / --bpe-codes, or pass a recipe "
                         f"without {vocab[0]}")
    return r


def run_stages(spec, args):
    """``(stages, why)``: the stages of :data:`STAGES` this run has, in order, and for each one it
    lacks why (``{stage: reason}``): tc only when the recipe truecases, bpe / char / neither as it
    segments (the CLI checks ``--until`` against them before any work).

    Raises:
        SystemExit: the recipe cannot be resolved (:func:`resolve_recipe`)."""
    r = resolve_recipe(spec, args)
    ours = [s for s in STAGES if s in ("raw", "tok", "bin") or (s == "tc" and r.tc_langs) or s == r.segmentation]
    seg = f"this run's recipe segments {'into words' if r.words else 'into characters' if r.chars else 'with BPE'}"
    return ours, {s: "this run does not truecase (--truecase)" if s == "tc" else seg for s in STAGES if s not in ours}


def add_arguments(p, spec):
    """The options of ``mt-prep CORPUS`` for a spec corpus (besides the common ones of the CLI)."""
    p.add_argument("--variant", metavar="NAME", help="a named variant of the recipe (corpus.yaml `variants`: truecasing / BPE "
                   "settings of one paper); tc/, bpe/ (or char/), bin/ go to <out>/<variant>/")
    p.add_argument("--truecase", action="store_true", default=None, help="learn Moses truecasers on the tokenized "
                   "train set and truecase every split (default: the recipe's `truecase`)")
    p.add_argument("--no-truecase", dest="truecase", action="store_false", help="do not truecase")
    p.add_argument("--bpe", metavar="{joint,separate}", help="joint: one BPE model for both languages (and a joined dictionary); separate: one "
                   "per language (separate dictionaries); default: the recipe's `bpe_joint`")
    p.add_argument("--dictionary", choices=DICTIONARIES, help="joined: one fairseq dictionary for both languages "
                   "(--joined-dictionary); separate: one per language; default: the recipe's `dictionary`, else "
                   "joined with joint BPE and separate with separate BPE or a word or character vocabulary")
    p.add_argument("--word-vocab", nargs="+", metavar="N|LANG=N", help="word-level vocabularies instead of BPE: the N "
                   "most frequent training words of each language (one N, or LANG=N for every language; "
                   "fairseq's 4 special symbols included), every other word -> <unk> (default: the recipe's "
                   "`word_vocab`)")
    p.add_argument("--char-vocab", nargs="+", metavar="N|LANG=N", help="character-level symbols instead of BPE "
                   "(\"@@\" on all but a token's last, so --remove-bpe restores the tokens): the N most frequent "
                   "training characters of each language kept (one N, or LANG=N for every language), every other "
                   "character -> <unk>; separate dictionaries (default: the recipe's `char_vocab`)")
    p.add_argument("--bpe-codes", nargs="+", metavar="FILE|LANG=FILE", help="use these BPE codes instead of learning "
                   "them: one FILE (joint BPE) or LANG=FILE for every language (separate BPE)")
    p.add_argument("--src", metavar="LANG", help="source language for bin/ (default: the spec's first language)")
    p.add_argument("--tgt", metavar="LANG", help="target language for bin/ (default: the spec's second language)")


class SentencePrep:
    """The state of one run for one spec corpus; the stages are the functions of this module."""

    def __init__(self, spec, args, run, mode, local_dir):
        self.spec, self.a, self.run, self.mode, self.local_dir = spec, args, run, mode, local_dir
        self.langs, self.out = list(spec["langs"]), run.out
        self.variant = args.variant
        self.vout = os.path.join(self.out, self.variant) if self.variant else self.out  # tc/, bpe/, bin/
        try:
            r = resolve_recipe(spec, args)
        except SystemExit as e:
            run.die(str(e))
        self.recipe, self.tc_langs, self.joint = r.recipe, r.tc_langs, r.joint
        #: ``{LANG: N}`` with a word vocabulary (no BPE), else None
        self.words = r.words
        #: ``{LANG: N}`` with a character vocabulary (no BPE), else None
        self.chars = r.chars
        self.joined = r.joined
        #: the stage that segments the tokens: "bpe", "char" or None (a word vocabulary)
        self.segmentation = r.segmentation
        self.sources = raw.Sources(spec, mode, local_dir, os.path.join(self.out, "download"), not args.no_checksum)
        self.splits, self.missing = [], []

    def prev(self, stage, base=None):
        """Digest of the stamp of ``stage`` under ``base`` (default: out), or 'none'."""
        p = os.path.join(base or self.out, stage, ".done")
        if not os.path.exists(p):
            return "none"
        with open(p, "rb") as f:
            return hashlib.sha256(f.read()).hexdigest()[:16]

    def codes_given(self):
        """Given or shipped codes: ``{'*': FILE}`` (joint), ``{LANG: FILE}`` (separate) or None (learn).

        Raises:
            SystemExit: ``--bpe-codes`` does not fit the mode (names the expected form), is missing,
            or is not a readable subword-nmt codes file (:func:`~mt_pipeline.prep.bpe.check_codes`)."""
        given = self.a.bpe_codes
        if not given:
            sc = self.recipe.get("shipped_codes") if self.joint and self.mode == "local" else None
            sc = sc and os.path.normpath(os.path.join(SHARED_DATA, sc))
            return {"*": sc} if sc and os.path.exists(sc) else None
        pairs = [g.partition("=") for g in given]
        if self.joint:
            if len(given) != 1 or pairs[0][1]:
                self.run.die(f"joint BPE takes one codes file: --bpe-codes FILE (got {' '.join(given)})")
            out = {"*": given[0]}
        else:
            out = {k: v for k, sep, v in pairs if sep}
            if len(out) != len(given) or sorted(out) != sorted(self.langs):
                self.run.die("separate BPE takes one codes file per language: --bpe-codes "
                             + " ".join(f"{l}=FILE" for l in self.langs) + f" (got {' '.join(given)})")
        for f in out.values():
            if not os.path.isfile(f):
                self.run.die(f"--bpe-codes {f}: no such file")
            try:
                bpe.check_codes(f)  # readable codes, before any work (and before any worker pool)
            except SystemExit as err:
                self.run.die(f"--bpe-codes: {err}")
        return out

    def main(self):
        """Run every stage (under the output lock), then :meth:`finish`."""
        run, spec = self.run, self.spec
        self.codes_given()  # a --bpe-codes that does not fit: fail now
        if not any(self.sources.of(s) is not None for s in spec["split_names"]):  # nothing to prepare: say how
            how = spec.get("licensed") or spec.get("obtain") or "see the corpus's recipe"
            run.die(f"{spec['name']}: no split ({', '.join(spec['split_names'])}) is available in {self.mode} mode"
                    + (f" ({self.local_dir})" if self.local_dir else "") + "; nothing was prepared. How to get it: "
                    + " ".join(how.split()))
        run.log(f"{spec['title']}: mode={self.mode}" + (f" ({self.local_dir})" if self.local_dir else "")
                + f" out={self.out}" + (f" variant={self.variant} (tc/, bpe/ or char/, bin/ in {self.vout})" if self.variant else "")
                + (" [dry run: nothing is written]" if run.dry else ""))
        if self.variant and spec["variants"][self.variant].get("about"):
            run.log(f"variant {self.variant}: " + " ".join(spec["variants"][self.variant]["about"].split()))
        sub = ("; word vocabularies (" + ", ".join(f"{l} {n}" for l, n in self.words.items()) + " words, others -> <unk>)"
               if self.words else
               "; characters (" + ", ".join(f"{l} {n}" for l, n in self.chars.items())
               + " characters kept, others -> <unk>)"
               if self.chars else ("; joint BPE" if self.joint else "; separate BPE per language"))
        run.log("after tokenisation: " + (f"truecase {', '.join(self.tc_langs)}" if self.tc_langs else "no truecasing")
                + sub + ("; joined dictionary" if self.joined else "; separate dictionaries"))
        with run.lock():
            self.check_stage_dirs()
            if run.dry or self.mode == "download":
                fetch.print_sources(run, spec.get("downloads", []))
            if self.mode == "download":
                fetch.fetch_all(run, spec.get("downloads", []), os.path.join(self.out, "download"),
                                not self.a.no_checksum,
                                "copy {file} by hand into " + os.path.join(self.out, "download")
                                + "/ and run again with --download (a file already there is not fetched again)")
            stage_raw(self)
            stage_tok(self)
            if self.variant:
                link_shared(self)
            if stage_tc(self) and (stage_char(self) if self.chars else stage_bpe(self)):
                stage_bin(self)
        self.finish()

    def stage_dirs(self):
        """``{stage: (directory, swap)}``: every stage directory this run writes, replaces or (tc/
        with truecasing off) removes."""
        seg = self.segmentation
        dirs = {"raw": (os.path.join(self.out, "raw"), True), "tok": (os.path.join(self.out, "tok"), False),
                "tc": (os.path.join(self.vout, "tc"), False), "bin": (os.path.join(self.vout, "bin"), True)}
        if seg:
            dirs[seg] = (os.path.join(self.vout, seg), False)
        return dirs

    def check_stage_dirs(self):
        """Stop before any work (a download, a stage) when a stage directory exists that mt-prep did
        not write (:func:`~mt_pipeline.prep.run.owned`: no ``.done`` stamp) -- the run would
        overwrite or delete the user's files there.  A dry run stops too: the real one would."""
        for name, (d, swap) in self.stage_dirs().items():
            if not owned(d, swap):
                action = ("remove (truecasing is off)" if name == "tc" and not self.tc_langs
                          else "replace" if swap else "write into")
                self.run.die(not_owned_message(name, d, action) + "; nothing was written")

    def finish(self):
        """Say what is missing here and how to get it; print the prepared directory last."""
        run = self.run
        if self.mode == "local" and set(self.spec["split_names"]) - set(self.splits):
            self.missing[:0] = self.spec["local"].get("missing", [])
        if self.missing:
            run.log("NOT complete here -- missing:")
            for m in self.missing:
                print(f"    - {m}")
            if self.spec.get("obtain"):
                print("    how to get it: " + " ".join(self.spec["obtain"].split()))
        run.log("done" + (" (dry run)" if run.dry else "") + f"; splits prepared: {', '.join(self.splits)}")
        print(os.path.join(self.vout, "bin") if "train" in self.splits else self.vout)


def stage_raw(p):
    """Stage raw: the splits available in this mode extracted from their sources."""
    run, d = p.run, os.path.join(p.out, "raw")
    p.splits = [s for s in p.spec["split_names"] if p.sources.of(s) is not None]
    missing = [s for s in p.spec["split_names"] if s not in p.splits]
    if missing:
        run.log(f"not available in this mode: {', '.join(missing)}")
    stamp, legacy = stamps("raw", mode=p.mode, spec=spec_digest(p.spec), splits=p.splits,
                       inputs=p.sources.fingerprint(p.splits))
    files = [os.path.join(d, f"{s}.{l}") for s in p.splits for l in p.langs]
    run.stage("raw", d, stamp, files, lambda x: raw.write_splits(run, p.sources, p.splits, x), legacy=[legacy])


def stage_tok(p):
    """Stage tok: the recipe's tokenisation, [clean-corpus-n on train], [valid carved from train]."""
    run, r, d = p.run, p.recipe, os.path.join(p.out, "tok")
    stamp, legacy = stamps("tok", upstream=p.prev("raw"), recipe=tok.describe(r, p.langs), versions=tool_versions())
    every = r.get("valid_every") if "train" in p.splits and "valid" not in p.splits else None
    splits = p.splits + (["valid"] if every else [])
    files = [os.path.join(d, f"{s}.{l}") for s in splits for l in p.langs]

    def body(x):
        for lang in p.langs:
            check_lang_tool(lang, run.dry, run.log)
        tok.tokenize_files(run, os.path.join(p.out, "raw"), x, p.splits, p.langs,
                           lambda s: tok.split_recipe(r, s))
        if r.get("clean") and "train" in p.splits:
            tok.clean_train(run, x, p.langs, r["clean"])
        if every:
            tok.carve_valid(run, x, p.langs, every)
        for s in ([] if run.dry else splits):
            check_pair(run, "tok", x, s, p.langs, count_lines(os.path.join(x, f"{s}.{p.langs[0]}")))
    run.stage("tok", d, stamp, files, body, legacy=[legacy])
    p.splits = splits


def link_shared(p):
    """A variant's ``<out>/<variant>/{raw,tok}``: relative links to the shared ``<out>/{raw,tok}``
    (the references scripts/evaluate.sh reads from the prep dir)."""
    for name in ("raw", "tok"):
        link, target = os.path.join(p.vout, name), os.path.join("..", name)
        if os.path.islink(link) and os.readlink(link) == target:
            continue
        p.run.step(f"link {p.variant}/{name} -> {target} (shared with the default recipe)")
        if p.run.dry:
            continue
        if os.path.exists(link) and not os.path.islink(link):
            p.run.die(f"{link} exists and is not a link to {target}; remove it")
        os.makedirs(p.vout, exist_ok=True)
        tmp = f"{link}.tmp.{os.getpid()}"
        if os.path.lexists(tmp):
            os.unlink(tmp)
        os.symlink(target, tmp)
        os.replace(tmp, link)


def stage_tc(p):
    """Truecasing; False when it cannot run here (no training data to learn the truecasers from)."""
    run, d = p.run, os.path.join(p.vout, "tc")
    if not p.tc_langs:
        if os.path.lexists(d):
            # only a tc/ mt-prep wrote (its .done stamp) is removed; a user's is refused, not deleted
            if not owned(d):
                run.die(not_owned_message("tc", d, "remove (truecasing is off)"))
            run.step("truecasing is off: remove tc/ of an earlier run (scripts/evaluate.sh would detruecase by its models)")
            if not run.dry:
                shutil.rmtree(d)
        return True
    if "train" not in p.splits:
        p.missing.append(f"truecaser models ({', '.join(p.tc_langs)}): learned on the training data, "
                         "which is not here -- so no tc/, bpe/ (char/) or bin/")
        return False
    check_tool("truecase", run.dry, run.log)
    stamp, legacy = stamps("tc", upstream=p.prev("tok"), langs=p.tc_langs, how=tc.DESCRIPTION, versions=tool_versions())
    files = [os.path.join(d, f"truecase-model.{l}") for l in p.tc_langs] + [
        os.path.join(d, f"{s}.{l}") for s in p.splits for l in p.langs]
    run.stage("tc", d, stamp, files, lambda x: tc.truecase_files(run, os.path.join(p.out, "tok"), x, p.splits,
                                                                  p.langs, p.tc_langs), legacy=[legacy])
    return True


def _vocab_arg(values, langs, option):
    """``--word-vocab`` / ``--char-vocab`` (``option``) ``N`` or ``LANG=N ...`` as the recipe value
    (int or ``{LANG: N}``); None = not given.

    Raises:
        SystemExit: a value that is not ``N`` or ``LANG=N`` with an integer N."""
    if not values:
        return None
    try:
        if len(values) == 1 and "=" not in values[0]:
            return int(values[0])
        pairs = [v.partition("=") for v in values]
        if not all(sep for _, sep, _ in pairs):
            raise ValueError
        return {k: int(n) for k, _, n in pairs}
    except ValueError:
        raise SystemExit(f"{option} takes one N or LANG=N for each of {', '.join(langs)} "
                         f"(got {' '.join(values)})") from None


def stage_bpe(p):
    """Joint or separate BPE on tc/ (truecasing on) or tok/; False when it cannot run here (no
    codes and no training data).  Nothing (True) with a word vocabulary."""
    run, d, joint = p.run, os.path.join(p.vout, "bpe"), p.joint
    src_stage, src_base = ("tc", p.vout) if p.tc_langs else ("tok", p.out)
    if p.words:
        run.log(f"bpe: none (word vocabularies; bin/ reads {src_stage}/)")
        return True
    given = p.codes_given()
    if given is None and "train" not in p.splits:
        p.missing.append("BPE codes: no training data to learn them from (pass --bpe-codes "
                         + ("FILE)" if joint else " ".join(f"{l}=FILE" for l in p.langs) + ")"))
        return False
    merges = bpe_merges_for(p.recipe, p.langs, joint)
    # codes file -> (key of `given` / `merges`, the languages it segments, how it is made)
    if joint:
        names = {"codes": ("*", p.langs, f"learn {merges['*']} joint merges on {src_stage}/train.{{{','.join(p.langs)}}}")}
    else:
        names = {f"codes.{l}": (l, [l], f"learn {merges[l]} merges on {src_stage}/train.{l} only") for l in p.langs}
    if given:
        # by content: new codes at the same path re-run the stage
        names = {n: (k, langs, f"copy the codes {given[k]} (sha256 "
                     f"{file_sha256(given[k]) if os.path.isfile(given[k]) else 'missing'})")
                 for n, (k, langs, _) in names.items()}
    how = ("joint" if joint else "separate") + " BPE: " + "; ".join(f"{n}: {h}" for n, (_, _, h) in names.items())
    stamp, legacy = stamps("bpe", upstream=p.prev(src_stage, src_base), input=src_stage, how=how, versions=tool_versions())
    files = [os.path.join(d, n) for n in names] + [os.path.join(d, f"{s}.{l}") for s in p.splits for l in p.langs]

    def body(x):
        check_tool("bpe", run.dry, run.log)
        if not run.dry:
            bpe.truncate(os.path.join(p.vout, "logs", "bpe.log"))
        # codes of the other mode (joint <-> separate) of an earlier run; x is mt-prep's own bpe/
        # (run.stage refuses a directory without its .done stamp), so the files are its
        for f in ([] if run.dry else os.listdir(x)):
            if (f == "codes" or f.startswith("codes.")) and f not in names:
                os.unlink(os.path.join(x, f))
        src_dir = os.path.join(src_base, src_stage)
        for name, (key, langs, h) in names.items():
            run.step(f"{h} -> bpe/{name} ({'joint' if joint else 'separate'} BPE)")
            if not run.dry and given:
                bpe.copy_codes(given[key], os.path.join(x, name))
            elif not run.dry:
                bpe.learn_bpe([os.path.join(src_dir, f"train.{l}") for l in langs], os.path.join(x, name), merges[key],
                              log=os.path.join(p.vout, "logs", "bpe.log"))
        for name, (_, langs, _) in names.items():
            run.step(f"apply bpe/{name} to {src_stage}/{{{','.join(p.splits)}}}.{bpe.alts(langs)} -> bpe/ "
                     f"({run.workers} workers)")
            if not run.dry:
                bpe.apply_bpe(bpe.io_pairs(src_dir, x, p.splits, langs), os.path.join(x, name), run.workers)
        for s in ([] if run.dry else p.splits):
            check_pair(run, "bpe", x, s, p.langs, count_lines(os.path.join(src_dir, f"{s}.{p.langs[0]}")))
    run.stage("bpe", d, stamp, files, body, legacy=[legacy])
    return True


def stage_char(p):
    """Stage char (a character vocabulary, instead of bpe): tc/ (truecasing on) or tok/ split into
    characters (:func:`~mt_pipeline.prep.bpe.split_chars`) -> char/SPLIT.LANG, and, with the
    training split, char/dict.LANG.txt keeping each language's ``p.chars[LANG]`` most frequent
    training characters (:func:`~mt_pipeline.prep.bpe.char_dictionary`).  Always True."""
    run, d = p.run, os.path.join(p.vout, "char")
    src_stage, src_base = ("tc", p.vout) if p.tc_langs else ("tok", p.out)
    src_dir = os.path.join(src_base, src_stage)
    dicts = "train" in p.splits
    stamp, legacy = stamps("char", upstream=p.prev(src_stage, src_base), input=src_stage,
                           segmentation="characters, @@ on all but a token's last (bpe.split_chars)",
                           chars=[p.chars[l] for l in p.langs])
    files = [os.path.join(d, f"{s}.{l}") for s in p.splits for l in p.langs] + (
        [os.path.join(d, f"dict.{l}.txt") for l in p.langs] if dicts else [])

    def body(x):
        run.step(f"split {src_stage}/{{{','.join(p.splits)}}}.{bpe.alts(p.langs)} into characters -> char/"
                 + (f"; keep the {', '.join(f'{n} {l}' for l, n in p.chars.items())} most frequent training "
                    "characters -> char/dict.LANG.txt" if dicts else ""))
        if run.dry:
            return
        bpe.split_chars_files(bpe.io_pairs(src_dir, x, p.splits, p.langs))
        for s in p.splits:
            check_pair(run, "char", x, s, p.langs, count_lines(os.path.join(src_dir, f"{s}.{p.langs[0]}")))
        for lang in (p.langs if dicts else []):
            lines, kept, total = bpe.char_dictionary(os.path.join(x, f"train.{lang}"), p.chars[lang])
            write_text_atomic(os.path.join(x, f"dict.{lang}.txt"), "".join(f"{line}\n" for line in lines))
            run.log(f"char/dict.{lang}.txt: {kept} of the {total} characters of train.{lang} "
                    f"(limit {p.chars[lang]}), {len(lines)} symbols")
    run.stage("char", d, stamp, files, body, legacy=[legacy])
    return True


def stage_bin(p):
    """Stage bin: fairseq-preprocess + subsets.json; needs train.  Input: bpe/; with a word
    vocabulary tc/ (truecasing on) or tok/, each dictionary cropped to its size (``--nwordssrc`` /
    ``--nwordstgt``); with a character vocabulary char/ and its dictionaries (``--srcdict`` /
    ``--tgtdict``).  Dictionaries: :attr:`SentencePrep.joined`.  After fairseq-preprocess, as the
    other pipelines (:mod:`~mt_pipeline.prep.binarize`): a joined dictionary must be one file for
    both languages, and every binarized split (fairseq names the test sets test, test1, ...) must
    hold as many sentences as its input text has lines -- else the stage fails and the previous
    bin/ stays."""
    if "train" not in p.splits:
        p.missing.append("bin/: fairseq-preprocess needs the training split for the dictionary")
        return
    run, a = p.run, p.a
    src, tgt = a.src or p.langs[0], a.tgt or p.langs[1]
    b = os.path.join(p.vout, "bin")
    stage_in, base_in = (("char", p.vout) if p.chars else ("bpe", p.vout) if not p.words
                         else ("tc", p.vout) if p.tc_langs else ("tok", p.out))
    bp = os.path.join(base_in, stage_in)
    tests = [s for s in p.splits if s not in ("train", "valid")]
    # (the stamp of a BPE prep with its default dictionary is unchanged: existing preps stay up to date)
    extra = ({"words": [p.words[src], p.words[tgt]]} if p.words else
             {"chars": [p.chars[src], p.chars[tgt]]} if p.chars else {})
    stamp, legacy = stamps("bin", upstream=p.prev(stage_in, base_in), src=src, tgt=tgt, tests=tests,
                           joined_dictionary=p.joined, **extra)

    def body(x):
        cmd = preprocess_cmd(src, tgt, x, run.workers, trainpref=f"{bp}/train", validpref=f"{bp}/valid",
                             testprefs=[f"{bp}/{s}" for s in tests], joined=p.joined,
                             nwords=(p.words[src], p.words[tgt]) if p.words else None,
                             srcdict=f"{bp}/dict.{src}.txt" if p.chars else None,
                             tgtdict=f"{bp}/dict.{tgt}.txt" if p.chars else None)
        run_preprocess(run, cmd, os.path.join(p.vout, "logs", "bin.log"))
        if not run.dry:
            if p.joined:
                binarize.check_joined(run, "bin", x, src, tgt)
            # fairseq's subset name -> the split whose text it binarized
            subsets = dict({"train": "train", "valid": "valid"},
                           **{"test" if i == 0 else f"test{i}": s for i, s in enumerate(tests)})
            binarize.check_counts(run, "bin", x, f"{src}-{tgt}", list(subsets), [src, tgt], lambda s, lang: (
                count_lines(os.path.join(bp, f"{subsets[s]}.{lang}")), f"{stage_in}/{subsets[s]}.{lang}"))
            write_text_atomic(os.path.join(x, "subsets.json"),
                              json.dumps({"test" if i == 0 else f"test{i}": s for i, s in enumerate(tests)}))
    run.stage("bin", b, stamp, [os.path.join(b, f"dict.{l}.txt") for l in (src, tgt)], body, swap=True,
              legacy=[legacy])


def main(spec, args, mode, local_dir):
    """Run the pipeline of a spec corpus for parsed ``args`` (``mode``: local / download)."""
    run = PrepRun(spec["name"], args.out, args.dry_run, args.workers, until=args.until)
    SentencePrep(spec, args, run, mode, local_dir).main()
