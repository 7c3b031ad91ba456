#!/usr/bin/env python3
"""Sentence-level MT corpus preparation driven by a corpus spec (``data-prep/<corpus>/corpus.yaml``).

Run through the corpus's shell entry point, ``data-prep/<corpus>/prepare.sh [options]``
(``--help`` lists the options).  Pipeline, every stage idempotent (a ``.done`` stamp holding the
stage's parameters, a hash of the previous stamp and the tool versions; a stage whose stamp
matches and whose outputs exist is skipped) and atomic (every file written to a temp file and
renamed; ``bin/`` built in a temp dir and swapped in):

    0. inputs  local-directory mode (``--local-dir``, default the matching folder of
               ``../shared/data`` when present) or download mode (URLs + checksums recorded in the
               spec: sha256, or the md5 sacreBLEU records for its test sets; a checksum the spec
               marks ``unverified`` is computed on first download and stored in
               ``<out>/download/CHECKSUMS``)
    1. raw     extract every split from its sources (plain text / .gz / members of .tgz/.zip /
               WMT sgm / IWSLT XML ``<seg>`` / IWSLT ``train.tags``) -> raw/SPLIT.LANG
               (detokenized references for sacreBLEU); ``valid`` may be every N-th training line
               (the fairseq IWSLT14 and WMT14 recipes)
    2. tok     per language: [Moses punctuation normalisation] -> [remove non-printing chars]
               -> [Chinese: jieba / Japanese: KyTea segmentation] -> Moses tokenisation
               (sacremoses, the recipe's escape / aggressive-hyphen settings) -> [lowercase]
               -> tok/SPLIT.LANG;  [clean-corpus-n on train: ratio, min/max length]
    2b. tc     [truecasing, recipe ``truecase: true`` (every language) or ``[LANG, ...]``, CLI
               ``--truecase`` / ``--no-truecase``]: per language a Moses truecaser (sacremoses
               ``MosesTruecaser``, as train-truecaser.perl) learned on tok/train.LANG ->
               tc/truecase-model.LANG (Moses model format), applied (as truecase.perl) to every split
               -> tc/SPLIT.LANG.  tok/ keeps the original case: it is the tokenized reference the
               scores use, and scripts/evaluate.sh detruecases hypotheses when
               tc/truecase-model.TGT exists (so tc/ is removed when truecasing is off)
    3. bpe     BPE (subword-nmt) on tc/ (truecasing on) or tok/: joint (recipe ``bpe_joint: true``,
               the default) = one model learned on the concatenated train.* of both sides (or the recipe's
               shipped codes, or ``--bpe-codes FILE``) -> bpe/codes; separate (``bpe_joint: false``,
               CLI ``--bpe separate``) = one model per language learned on its own train side
               (``bpe_merges`` a number for every language or ``{LANG: N}``; or ``--bpe-codes
               LANG=FILE ...``) -> bpe/codes.LANG; applied to every split -> bpe/SPLIT.LANG
    4. bin     fairseq-preprocess (``--joined-dictionary`` with joint BPE; separate dictionaries
               dict.SRC.txt / dict.TGT.txt with separate BPE) -> bin/

Variants (``--variant NAME``, spec key ``variants``): a corpus shared by several papers keeps its
default recipe and names each paper's differing post-tokenisation settings (``truecase``,
``bpe_joint``, ``bpe_merges``) as a variant; e.g. wmt14_en_de's ``eatt`` (E-ATT: truecased).  A
variant shares download/, raw/ and tok/ with the default recipe (same tokenisation) and writes
tc/, bpe/ and bin/ to ``<out>/<variant>/``, where raw/ and tok/ are relative links to the
shared ones, so ``<out>/<variant>`` is a complete prep dir for scripts/evaluate.sh.

Where the corpus's training data is not available (local mode on ``../shared/data`` holds only the
dev/test sets), the stages run on the splits that are there and the run ends with a message naming
what is missing and how to get it; BPE then needs codes (``--bpe-codes``, or the codes the corpus
ships, e.g. the fairseq IWSLT14 codes), truecasing is not done (the truecaser is learned on train;
tc/ and everything after it is then listed as missing) and ``bin/`` is not built (it needs the
training dictionary).  A local split whose sources are all marked ``optional: true`` in the spec
(e.g. IWSLT15 En-Vi's ``stanford/train.{lang}.gz``) is used when its files are in the local
directory and is otherwise just not available.

Raises SystemExit with a message naming the valid choices on bad options, a missing input, a
checksum mismatch, or a missing language tool or truecaser / BPE library (the message names the
package to install).
"""

import argparse
import gzip
import hashlib
import html
import io
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tarfile
import time
import zipfile

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
import text_tools  # noqa: E402  (read_lines, write_lines_atomic, learn/apply BPE, count-bin)

from mt_pipeline.atomic import atomic_path  # noqa: E402

SHARED_DATA = os.path.join(REPO, "..", "shared", "data")

# Language tools that are not part of the base environment: package to install, and why.
LANG_TOOLS = {
    "zh": ("jieba", "pip install jieba", "Chinese word segmentation before Moses tokenisation"),
    "ja": ("Mykytea", "pip install kytea (needs the KyTea library: http://www.phontron.com/kytea/)",
           "Japanese word segmentation (KyTea, as in the WAT ASPEC baseline)"),
}


# Libraries of the post-tokenisation steps (in the base environment, checked all the same so that a
# trimmed environment fails with the package to install): module, install command, what needs it.
STEP_TOOLS = {
    "truecase": ("sacremoses", "pip install sacremoses", "Moses truecasing (sacremoses MosesTruecaser)"),
    "bpe": ("subword_nmt", "pip install subword-nmt", "BPE (subword-nmt learn_bpe / apply_bpe)"),
}
# What a variant may change: the steps after tokenisation (it shares raw/ and tok/ with the default).
VARIANT_KEYS = {"truecase", "bpe_joint", "bpe_merges"}
TRUECASE_DESC = ("sacremoses MosesTruecaser: learned as train-truecaser.perl (surface-form counts of every "
                 "non-sentence-initial token of tok/train.LANG), applied as truecase.perl (sentence-initial "
                 "word -> its most frequent form; other known forms kept; other words -> most frequent form; "
                 "words not in the model unchanged)")


class Prep:
    """One run of the pipeline for one corpus spec; see the module docstring."""

    def __init__(self, spec, args):
        self.spec, self.a = spec, args
        self.tag = spec["name"]
        self.langs = list(spec["langs"])
        self.dry = args.dry_run
        self.out = os.path.abspath(args.out or os.path.join(REPO, "data-bin", spec["name"]))
        self.variant = getattr(args, "variant", None)
        # tc/, bpe/, bin/ of a variant go to <out>/<variant>; download/, raw/, tok/ are shared
        self.vout = os.path.join(self.out, self.variant) if self.variant else self.out
        try:
            self.recipe = effective_recipe(spec, self.variant, truecase=getattr(args, "truecase", None),
                                           bpe=getattr(args, "bpe", None), merges=args.bpe_merges)
            self.tc_langs = truecase_langs(self.recipe, self.langs)
            bpe_merges_for(self.recipe, self.langs, self.recipe.get("bpe_joint", True))
        except SystemExit as e:
            self.die(str(e))
        self.steps = 0

    # ------------------------------------------------------------------ logging / helpers
    def log(self, msg):
        print(f"[{self.tag}] {msg}", flush=True)

    def die(self, msg):
        print(f"[{self.tag}] ERROR: {msg}", file=sys.stderr, flush=True)
        raise SystemExit(1)

    def step(self, msg):
        """Announce a step (printed in dry runs as the plan, in real runs as progress)."""
        self.steps += 1
        self.log(("would " if self.dry else "") + msg)

    def stamp_ok(self, stage_dir, stamp, files):
        p = os.path.join(stage_dir, ".done")
        return (os.path.exists(p) and open(p).read() == stamp and all(os.path.exists(f) for f in files))

    def write_stamp(self, stage_dir, stamp):
        with atomic_path(os.path.join(stage_dir, ".done")) as tmp, open(tmp, "w") as f:
            f.write(stamp)

    @staticmethod
    def stamp_text(**kw):
        return json.dumps(kw, sort_keys=True, indent=1) + "\n"

    # ------------------------------------------------------------------ stage 0: inputs
    def resolve_mode(self):
        a, loc = self.a, self.spec.get("local")
        if a.download and a.local_dir:
            self.die("--download and --local-dir exclude each other")
        if a.download:
            return "download", None
        if a.local_dir:
            if not os.path.isdir(a.local_dir):
                self.die(f"--local-dir '{a.local_dir}' is not a directory")
            return "local", os.path.abspath(a.local_dir)
        if loc and loc.get("default_dir"):
            d = os.path.normpath(os.path.join(SHARED_DATA, loc["default_dir"]))
            if os.path.isdir(d):
                return "local", d
        if self.spec.get("licensed"):
            self.die(f"{self.spec['title']} is licensed and cannot be downloaded by this script.\n"
                     f"{self.spec['licensed'].strip()}\nThen run: {self.spec['entry']} --local-dir DIR")
        return "download", None

    def checksum(self, path, algo):
        h = hashlib.new(algo)
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
        return h.hexdigest()

    def stage_inputs(self):
        """Download mode: fetch every spec download into <out>/download/ and check its checksum.
        Local mode: nothing to fetch (the local files are checked when read)."""
        dls = self.spec.get("downloads", [])
        if self.dry or self.mode == "download":
            self.log("official sources (URL, checksum, where the checksum comes from):")
            for d in dls:
                algo, val = self._expected(d)
                print(f"    {d['url']}\n        -> download/{d['file']}  {algo}:{val}"
                      f"  ({d.get('checksum_source', 'recorded')})")
                if d.get("note"):
                    print(f"        note: {d['note']}")
        if self.mode != "download":
            return
        ddir = os.path.join(self.out, "download")
        store = os.path.join(ddir, "CHECKSUMS")
        stored = {}
        if os.path.exists(store):
            for line in open(store):
                parts = line.split()
                if len(parts) == 2:
                    stored[parts[1]] = parts[0]
        for d in dls:
            path = os.path.join(ddir, d["file"])
            algo, val = self._expected(d)
            if val == "unverified":
                val = stored.get(d["file"], "unverified")
            if os.path.exists(path) and (val == "unverified" or self.checksum(path, algo) == val):
                self.log(f"have download/{d['file']}")
                if val == "unverified":
                    stored[d["file"]] = self.checksum(path, "sha256")
                continue
            self.step(f"download {d['url']} -> download/{d['file']}")
            if self.dry:
                continue
            os.makedirs(ddir, exist_ok=True)
            tool = (["curl", "-fL", "--retry", "3", "-o", path + ".part", d["url"]] if shutil.which("curl")
                    else ["wget", "--tries=3", "-O", path + ".part", d["url"]] if shutil.which("wget") else None)
            if tool is None:
                self.die("download mode needs curl or wget (neither found); or pass --local-dir DIR")
            if subprocess.run(tool).returncode != 0:
                if os.path.exists(path + ".part"):
                    os.unlink(path + ".part")
                self.die(f"download failed: {d['url']} (pass --local-dir DIR holding {d['file']})")
            got = self.checksum(path + ".part", algo)
            if val != "unverified" and got != val and not self.a.no_checksum:
                os.unlink(path + ".part")
                self.die(f"{algo} mismatch for {d['url']}: expected {val}, got {got}")
            os.replace(path + ".part", path)
            if val == "unverified":
                stored[d["file"]] = self.checksum(path, "sha256")
                self.log(f"no recorded checksum for {d['file']}: sha256 {stored[d['file']]} stored in "
                         "download/CHECKSUMS (checked on later runs)")
        if stored and not self.dry:
            with atomic_path(store) as tmp, open(tmp, "w") as f:
                for k in sorted(stored):
                    f.write(f"{stored[k]} {k}\n")

    @staticmethod
    def _expected(d):
        for algo in ("sha256", "md5"):
            if d.get(algo):
                return algo, d[algo]
        return "sha256", "unverified"

    # ------------------------------------------------------------------ stage 1: raw
    def sources(self, split):
        """Sources of ``split`` in the current mode: a list of source dicts, or None when the split
        is not available (its key is missing in the spec's ``local`` section)."""
        if self.mode == "download":
            return self.spec["splits"].get(split)
        srcs = self.spec["local"]["splits"].get(split)
        if srcs and all(x.get("optional") for x in srcs) and not all(
                os.path.exists(os.path.join(self.local_dir, x["file"].format(lang=l, **self._side(x, l))))
                for x in srcs for l in self.langs):
            return None  # an optional local split (e.g. training data) whose files are not there
        return srcs

    def open_source(self, src, lang):
        """Text of one source for ``lang`` (str, newline-terminated lines)."""
        fmt = src.get("format", "plain")
        base = self.local_dir if self.mode == "local" else os.path.join(self.out, "download")
        path_t = src["file"].format(lang=lang, **self._side(src, lang))
        if "archive" in src:
            arch = os.path.join(os.path.join(self.out, "download"), src["archive"])
            if not os.path.exists(arch):
                self.die(f"missing download {arch}")
            data = self._read_member(arch, path_t)
        else:
            path = os.path.join(base, path_t)
            if not os.path.exists(path):
                self.die(f"missing input {path} (expected in {'--local-dir' if self.mode == 'local' else 'download/'})")
            want = (src.get("sha256") or {}).get(lang) if isinstance(src.get("sha256"), dict) else None
            data = open(path, "rb").read()
            if path.endswith(".gz"):
                data = gzip.decompress(data)
            if want and not self.a.no_checksum:
                got = hashlib.sha256(data).hexdigest()
                if got != want:
                    self.die(f"sha256 mismatch for the content of {path}: expected {want}, got {got} "
                             "(use --no-checksum to accept other files)")
        text = data.decode("utf-8-sig" if src.get("bom") else "utf-8")
        # a format may name the language or the column: tmx:{lang}, bars:{col} (spec key `columns`)
        return extract(text, fmt.format(lang=lang, col=src.get("columns", {}).get(lang, "")), src)

    def _side(self, src, lang):
        """Template fields for sgm files: ``side`` = src or ref for ``lang``."""
        return {"side": "src" if lang == src.get("src_lang", self.langs[0]) else "ref"}

    def _read_member(self, arch, member):
        if arch.endswith(".zip"):
            with zipfile.ZipFile(arch) as z:
                return z.read(member)
        with tarfile.open(arch) as t:
            f = t.extractfile(member)
            if f is None:
                self.die(f"{member} not found in {arch}")
            data = f.read()
        return gzip.decompress(data) if member.endswith(".gz") else data

    def stage_raw(self):
        d = os.path.join(self.out, "raw")
        splits = [s for s in self.spec["split_names"] if self.sources(s) is not None]
        self.splits = splits
        missing = [s for s in self.spec["split_names"] if s not in splits]
        stamp = self.stamp_text(stage="raw", mode=self.mode, spec=self.spec_digest(), splits=splits)
        files = [os.path.join(d, f"{s}.{l}") for s in splits for l in self.langs]
        if missing:
            self.log(f"not available in this mode: {', '.join(missing)}")
        if self.stamp_ok(d, stamp, files) and not self.dry:
            self.log("raw: up to date, skipping")
            return
        if not self.dry:
            os.makedirs(d, exist_ok=True)
        for s in splits:
            srcs = self.sources(s)
            per_lang = {}
            for l in self.langs:
                self.step(f"extract {s}.{l} from " + " + ".join(
                    (x.get("archive", "") + ":" if "archive" in x else "") + x["file"].format(lang=l, **self._side(x, l))
                    + f" [{x.get('format', 'plain')}]" for x in srcs))
                if not self.dry:
                    lines = []
                    for x in srcs:
                        lines += self.open_source(x, l)
                    per_lang[l] = lines
            if self.dry:
                continue
            n = {l: len(v) for l, v in per_lang.items()}
            if len(set(n.values())) != 1:
                self.die(f"raw: {s} has different line counts per language: {n}")
            for l in self.langs:
                text_tools.write_lines_atomic(os.path.join(d, f"{s}.{l}"), per_lang[l])
            self.log(f"raw/{s}: {len(per_lang[self.langs[0]])} pairs")
        if not self.dry:
            self.write_stamp(d, stamp)

    def spec_digest(self):
        """Digest of the spec without its ``variants`` (they change nothing up to tok/)."""
        spec = {k: v for k, v in self.spec.items() if k != "variants"}
        return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:16]

    # ------------------------------------------------------------------ stage 2: tok
    def stage_tok(self):
        r = self.recipe
        d = os.path.join(self.out, "tok")
        desc = tok_description(r, self.langs)
        stamp = self.stamp_text(stage="tok", upstream=self._prev("raw"), recipe=desc, versions=versions())
        every = r.get("valid_every") if "train" in self.splits and "valid" not in self.splits else None
        files = [os.path.join(d, f"{s}.{l}") for s in self.splits + (["valid"] if every else []) for l in self.langs]
        if self.stamp_ok(d, stamp, files) and not self.dry:
            self.log("tok: up to date, skipping")
            if every:
                self.splits.append("valid")
            return
        for l in self.langs:
            check_lang_tool(l, self.dry, self.log)
        if not self.dry:
            os.makedirs(d, exist_ok=True)
        for s in self.splits:
            for l in self.langs:
                self.step(f"tokenise raw/{s}.{l} -> tok/{s}.{l}: {desc[l]}")
                if not self.dry:
                    t0 = time.time()
                    lines = text_tools.read_lines(os.path.join(self.out, "raw", f"{s}.{l}"))
                    out = tokenize_lines(lines, l, dict(r, replace_apostrophe=s in r.get("replace_apostrophe", [])))
                    text_tools.write_lines_atomic(os.path.join(d, f"{s}.{l}"), out)
                    self.log(f"  {s}.{l}: {len(out)} lines ({time.time() - t0:.1f}s)")
        clean = r.get("clean")
        if clean and "train" in self.splits:
            self.step(f"clean tok/train (clean-corpus-n: ratio {clean['ratio']}, length {clean['min']}..{clean['max']} tokens)")
            if not self.dry:
                cols = [text_tools.read_lines(os.path.join(d, f"train.{l}")) for l in self.langs]
                keep = [i for i in range(len(cols[0])) if clean_ok([c[i] for c in cols], clean)]
                for l, c in zip(self.langs, cols):
                    text_tools.write_lines_atomic(os.path.join(d, f"train.{l}"), [c[i] for i in keep])
                self.log(f"  kept {len(keep)} of {len(cols[0])} training pairs")
        if every:
            self.step(f"valid = every {every}-th pair of the cleaned tok/train (the rest stays train), "
                      "as the fairseq recipe")
            if not self.dry:
                for l in self.langs:
                    allv = text_tools.read_lines(os.path.join(d, f"train.{l}"))
                    text_tools.write_lines_atomic(os.path.join(d, f"valid.{l}"),
                                                  [x for i, x in enumerate(allv, 1) if i % every == 0])
                    text_tools.write_lines_atomic(os.path.join(d, f"train.{l}"),
                                                  [x for i, x in enumerate(allv, 1) if i % every != 0])
            self.splits.append("valid")
        if not self.dry:
            self.write_stamp(d, stamp)

    def _prev(self, stage, base=None):
        p = os.path.join(base or self.out, stage, ".done")
        return hashlib.sha256(open(p, "rb").read()).hexdigest()[:16] if os.path.exists(p) else "none"

    # ------------------------------------------------------------------ variant dir
    def link_shared(self):
        """A variant's ``<out>/<variant>/{raw,tok}``: relative links to the shared ``<out>/{raw,tok}``
        (the references scripts/evaluate.sh reads from the prep dir)."""
        for name in ("raw", "tok"):
            link, target = os.path.join(self.vout, name), os.path.join("..", name)
            if os.path.islink(link) and os.readlink(link) == target:
                continue
            self.step(f"link {self.variant}/{name} -> {target} (shared with the default recipe)")
            if self.dry:
                continue
            if os.path.exists(link) and not os.path.islink(link):
                self.die(f"{link} exists and is not a link to {target}; remove it")
            os.makedirs(self.vout, exist_ok=True)
            tmp = f"{link}.tmp{os.getpid()}"
            if os.path.lexists(tmp):
                os.unlink(tmp)
            os.symlink(target, tmp)
            os.replace(tmp, link)

    # ------------------------------------------------------------------ stage 2b: tc
    def stage_tc(self):
        """Truecasing (see the module docstring).  Returns False when it cannot run here (no
        training data to learn the truecasers from), True otherwise (done, skipped or off)."""
        d = os.path.join(self.vout, "tc")
        if not self.tc_langs:
            if os.path.isdir(d):
                self.step("truecasing is off: remove tc/ of an earlier run (scripts/evaluate.sh would "
                          "detruecase by its models)")
                if not self.dry:
                    shutil.rmtree(d)
            return True
        if "train" not in self.splits:
            self.missing.append(f"truecaser models ({', '.join(self.tc_langs)}): learned on the training data, "
                                "which is not here -- so no tc/, bpe/ or bin/")
            return False
        check_tool("truecase", self.dry, self.log)
        models = {l: os.path.join(d, f"truecase-model.{l}") for l in self.tc_langs}
        stamp = self.stamp_text(stage="tc", upstream=self._prev("tok"), langs=self.tc_langs, how=TRUECASE_DESC,
                                versions=versions())
        files = list(models.values()) + [os.path.join(d, f"{s}.{l}") for s in self.splits for l in self.langs]
        if self.stamp_ok(d, stamp, files) and not self.dry:
            self.log("tc: up to date, skipping")
            return True
        if not self.dry:
            os.makedirs(d, exist_ok=True)
            for f in os.listdir(d):  # a model of a language no longer truecased
                if f.startswith("truecase-model.") and f.split(".", 1)[1] not in self.tc_langs:
                    os.unlink(os.path.join(d, f))
        tcs = {}
        for l in self.tc_langs:
            self.step(f"learn a Moses truecaser on tok/train.{l} -> tc/truecase-model.{l}")
            if not self.dry:
                t0 = time.time()
                tcs[l] = learn_truecaser(text_tools.read_lines(os.path.join(self.out, "tok", f"train.{l}")))
                with atomic_path(models[l]) as tmp:
                    tcs[l].save_model(tmp)  # (sacremoses writes it 0600; readable like every other output)
                    umask = os.umask(0)
                    os.umask(umask)
                    os.chmod(tmp, 0o666 & ~umask)
                self.log(f"  truecase-model.{l}: {len(tcs[l].model['best'])} words ({time.time() - t0:.1f}s)")
        for s in self.splits:
            for l in self.langs:
                if l in self.tc_langs:
                    self.step(f"truecase tok/{s}.{l} -> tc/{s}.{l} (tc/truecase-model.{l})")
                else:
                    self.step(f"copy tok/{s}.{l} -> tc/{s}.{l} ({l} is not truecased)")
                if self.dry:
                    continue
                lines = text_tools.read_lines(os.path.join(self.out, "tok", f"{s}.{l}"))
                out = truecase_lines(lines, tcs[l]) if l in self.tc_langs else lines
                text_tools.write_lines_atomic(os.path.join(d, f"{s}.{l}"), out)
        if not self.dry:
            self.write_stamp(d, stamp)
        return True

    # ------------------------------------------------------------------ stage 3: bpe
    def stage_bpe(self):
        """Joint or separate BPE on tc/ (truecasing on) or tok/ (see the module docstring).
        Returns False when it cannot run here (no codes and no training data)."""
        d = os.path.join(self.vout, "bpe")
        src_stage = "tc" if self.tc_langs else "tok"
        src_base = self.vout if self.tc_langs else self.out
        joint = self.recipe.get("bpe_joint", True)
        codes_src = self._codes_sources(joint)
        if codes_src is None and "train" not in self.splits:
            self.missing.append("BPE codes: no training data to learn them from (pass --bpe-codes "
                                + ("FILE)" if joint else " ".join(f"{l}=FILE" for l in self.langs) + ")"))
            return False
        merges = bpe_merges_for(self.recipe, self.langs, joint)
        # codes file -> (languages it segments, how it is made)
        if joint:
            names = {"codes": (self.langs, f"copy the codes {codes_src['*']}" if codes_src else
                               f"learn {merges['*']} joint merges on {src_stage}/train.{{{','.join(self.langs)}}}")}
        else:
            names = {f"codes.{l}": ([l], f"copy the codes {codes_src[l]}" if codes_src else
                                    f"learn {merges[l]} merges on {src_stage}/train.{l} only")
                     for l in self.langs}
        how = ("joint" if joint else "separate") + " BPE: " + "; ".join(f"{n}: {h}" for n, (_, h) in names.items())
        stamp = self.stamp_text(stage="bpe", upstream=self._prev(src_stage, src_base), input=src_stage, how=how,
                                versions=versions())
        files = [os.path.join(d, n) for n in names] + [os.path.join(d, f"{s}.{l}") for s in self.splits
                                                      for l in self.langs]
        if self.stamp_ok(d, stamp, files) and not self.dry:
            self.log("bpe: up to date, skipping")
            return True
        check_tool("bpe", self.dry, self.log)
        if not self.dry:
            os.makedirs(d, exist_ok=True)
            for f in os.listdir(d):  # codes of the other mode (joint <-> separate) of an earlier run
                if (f == "codes" or f.startswith("codes.")) and f not in names:
                    os.unlink(os.path.join(d, f))
        for name, (langs, h) in names.items():
            self.step(f"{h} -> bpe/{name} ({'joint' if joint else 'separate'} BPE)")
            if self.dry:
                continue
            src = codes_src and codes_src["*" if joint else langs[0]]
            if src:
                data = open(src, "rb").read()
                data = gzip.decompress(data) if src.endswith(".gz") else data
                with atomic_path(os.path.join(d, name)) as tmp, open(tmp, "wb") as f:
                    f.write(data)
            else:
                text_tools.cmd_learn_bpe(argparse.Namespace(
                    merges=merges["*" if joint else langs[0]], output=os.path.join(d, name),
                    inputs=[os.path.join(src_base, src_stage, f"train.{l}") for l in langs]))
        for name, (langs, _) in names.items():
            pairs = []
            for s in self.splits:
                for l in langs:
                    pairs += [os.path.join(src_base, src_stage, f"{s}.{l}"), os.path.join(d, f"{s}.{l}")]
            self.step(f"apply bpe/{name} to {src_stage}/{{{','.join(self.splits)}}}.{_alts(langs)} -> bpe/ "
                      f"({self.a.workers} workers)")
            if not self.dry:
                text_tools.cmd_apply_bpe(argparse.Namespace(codes=os.path.join(d, name), workers=self.a.workers,
                                                            files=pairs))
        if not self.dry:
            self.write_stamp(d, stamp)
        return True

    def _codes_sources(self, joint):
        """Given or shipped codes: ``{'*': FILE}`` (joint), ``{LANG: FILE}`` (separate) or None (learn).

        Raises:
            SystemExit: ``--bpe-codes`` does not fit the mode (names the expected form)."""
        given = self.a.bpe_codes
        if not given:
            sc = self._shipped_codes() if joint else None  # shipped codes are joint codes
            return {"*": sc} if sc else None
        pairs = [g.partition("=") for g in given]
        if joint:
            if len(given) != 1 or pairs[0][1]:
                self.die(f"joint BPE takes one codes file: --bpe-codes FILE (got {' '.join(given)})")
            out = {"*": given[0]}
        else:
            out = {k: v for k, sep, v in pairs if sep}
            if len(out) != len(given) or sorted(out) != sorted(self.langs):
                self.die("separate BPE takes one codes file per language: --bpe-codes "
                         + " ".join(f"{l}=FILE" for l in self.langs) + f" (got {' '.join(given)})")
        for f in out.values():
            if not os.path.isfile(f):
                self.die(f"--bpe-codes {f}: no such file")
        return out

    def _shipped_codes(self):
        sc = self.recipe.get("shipped_codes")
        if sc and self.mode == "local":
            p = os.path.normpath(os.path.join(SHARED_DATA, sc))
            return p if os.path.exists(p) else None
        return None

    # ------------------------------------------------------------------ stage 4: bin
    def stage_bin(self):
        if "train" not in self.splits:
            self.missing.append("bin/: fairseq-preprocess needs the training split for the dictionary")
            return
        src, tgt = self.a.src or self.langs[0], self.a.tgt or self.langs[1]
        b = os.path.join(self.vout, "bin")
        tests = [s for s in self.splits if s not in ("train", "valid")]
        joined = self.recipe.get("bpe_joint", True)  # separate BPE -> separate dictionaries
        stamp = self.stamp_text(stage="bin", upstream=self._prev("bpe", self.vout), src=src, tgt=tgt, tests=tests,
                                joined_dictionary=joined)
        if self.stamp_ok(b, stamp, [os.path.join(b, f"dict.{l}.txt") for l in (src, tgt)]) and not self.dry:
            self.log("bin: up to date, skipping")
            return
        tmp = b + ".tmp"
        p = os.path.join(self.vout, "bpe")
        cmd = [sys.executable, "-m", "fairseq_cli.preprocess", "--source-lang", src, "--target-lang", tgt,
               *(["--joined-dictionary"] if joined else []), "--trainpref", f"{p}/train", "--validpref", f"{p}/valid",
               "--destdir", tmp, "--workers", str(self.a.workers)]
        if tests:
            cmd += ["--testpref", ",".join(f"{p}/{s}" for s in tests)]
        self.step("binarize: " + " ".join(shlex.quote(c) for c in cmd))
        if self.dry:
            return
        shutil.rmtree(tmp, ignore_errors=True)
        os.makedirs(os.path.join(self.vout, "logs"), exist_ok=True)
        with open(os.path.join(self.vout, "logs", "bin.log"), "w") as f:
            if subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT).returncode != 0:
                self.die(f"fairseq-preprocess failed (see {self.vout}/logs/bin.log)")
        with open(os.path.join(tmp, "subsets.json"), "w") as f:
            json.dump({"test" if i == 0 else f"test{i}": s for i, s in enumerate(tests)}, f)
        with open(os.path.join(tmp, ".done"), "w") as f:
            f.write(stamp)
        shutil.rmtree(b, ignore_errors=True)
        os.replace(tmp, b)

    # ------------------------------------------------------------------ main
    def run(self):
        self.mode, self.local_dir = self.resolve_mode()
        self.missing = []
        self._codes_sources(self.recipe.get("bpe_joint", True))  # a --bpe-codes that does not fit: fail now
        self.log(f"{self.spec['title']}: mode={self.mode}" + (f" ({self.local_dir})" if self.local_dir else "")
                 + f" out={self.out}" + (f" variant={self.variant} (tc/, bpe/, bin/ in {self.vout})" if self.variant else "")
                 + (" [dry run: nothing is written]" if self.dry else ""))
        if self.variant and self.spec["variants"][self.variant].get("about"):
            self.log(f"variant {self.variant}: " + " ".join(self.spec["variants"][self.variant]["about"].split()))
        self.log("after tokenisation: " + (f"truecase {', '.join(self.tc_langs)}" if self.tc_langs else "no truecasing")
                 + ("; joint BPE" if self.recipe.get("bpe_joint", True) else "; separate BPE per language"))
        if not self.dry:
            os.makedirs(self.out, exist_ok=True)
        self.stage_inputs()
        self.stage_raw()
        self.stage_tok()
        if self.variant:
            self.link_shared()
        if self.stage_tc() and self.stage_bpe():
            self.stage_bin()
        if self.mode == "local" and set(self.spec["split_names"]) - set(self.splits):
            for what in self.spec["local"].get("missing", []):
                self.missing.insert(0, what)
        if self.missing:
            self.log("NOT complete here -- missing:")
            for m in self.missing:
                print(f"    - {m}")
            if self.spec.get("obtain"):
                print("    how to get it: " + " ".join(self.spec["obtain"].split()))
        self.log("done" + (" (dry run)" if self.dry else "") + f"; splits prepared: {', '.join(self.splits)}")
        print(os.path.join(self.vout, "bin") if "train" in self.splits else self.vout)


# ---------------------------------------------------------------------------------------------
# Text steps (pure functions; tested directly)
# ---------------------------------------------------------------------------------------------
_SEG = re.compile(r'<seg id="[0-9]*">\s*')
_SEG_END = re.compile(r"\s*</seg>\s*")


def extract(text, fmt, src=None):
    """Lines of one source ``text`` in format ``fmt``.

    ``plain``: one sentence per line.  ``seg``: the fairseq recipe for IWSLT XML / WMT sgm
    (``grep '<seg id' | sed 's/<seg id="[0-9]*">\\s*//; s/\\s*<\\/seg>\\s*//'``), no unescaping, as
    prepare-iwslt14.sh / prepare-wmt14en2de.sh do.  ``sgm``: the segments of a WMT sgm file
    HTML-unescaped (as sacreBLEU reads them).  ``iwslt_tags``: an IWSLT ``train.tags`` file
    (lines with ``<url>``, ``<talkid>``, ``<keywords>`` dropped; ``<title>``/``<description>``
    tags removed, every other line kept -- exactly prepare-iwslt14.sh's grep/sed chain).
    ``tsv:N``: column N of a TSV file.

    Raises:
        SystemExit: unknown format (names the valid ones).
    """
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    if fmt == "plain":
        return [l.rstrip("\r") for l in lines]
    if fmt == "seg":
        return [_SEG_END.sub("", _SEG.sub("", l)) for l in lines if "<seg id" in l]
    if fmt == "sgm":
        out = []
        for l in lines:
            m = re.search(r"<seg[^>]*>(.*)</seg>", l)
            if m:
                out.append(html.unescape(m.group(1).strip()))
        return out
    if fmt == "iwslt_tags":
        # prepare-iwslt14.sh: grep -v '<url>' | grep -v '<talkid>' | grep -v '<keywords>' |
        # sed s/<title>//; s/<\/title>//; s/<description>//; s/<\/description>//
        out = []
        for l in lines:
            if "<url>" in l or "<talkid>" in l or "<keywords>" in l:
                continue
            for t in ("<title>", "</title>", "<description>", "</description>"):
                l = l.replace(t, "")
            out.append(l)
        return out
    if fmt.startswith("tmx:"):  # tmx:LANG -- the <seg> of every <tuv xml:lang="LANG">
        want, out, cur = fmt.split(":")[1], [], None
        for l in lines:
            m = re.search(r'<tuv[^>]*xml:lang="([^"]+)"', l)
            if m:
                cur = m.group(1)
            m = re.search(r"<seg>(.*)</seg>", l)
            if m and cur == want:
                out.append(html.unescape(m.group(1)).strip())
        return out
    if fmt.startswith("bars:"):  # bars:N -- field N of "a ||| b ||| c" lines (ASPEC)
        col = int(fmt.split(":")[1])
        return [l.split(" ||| ")[col].strip() for l in lines]
    if fmt.startswith("tsv:"):
        col = int(fmt.split(":")[1])
        return [l.split("\t")[col] for l in lines]
    raise SystemExit(f"unknown source format '{fmt}'; valid: plain, seg, sgm, iwslt_tags, tmx:LANG, bars:N, tsv:N")


def _require(mod, install, what, dry, log):
    import importlib.util

    if importlib.util.find_spec(mod) is None:
        msg = f"{what}: Python module '{mod}' is missing; install it with: {install}"
        if dry:
            log("WARNING: " + msg)
        else:
            raise SystemExit(f"ERROR: {msg}")


def check_lang_tool(lang, dry=False, log=print):
    """Die with the package to install when ``lang`` needs a segmenter that is not importable
    (a dry run only warns)."""
    if lang not in LANG_TOOLS:
        return
    mod, install, why = LANG_TOOLS[lang]
    _require(mod, install, f"'{lang}' needs {why}", dry, log)


def _alts(items):
    """``{a,b}`` (shell-brace style) for several items, the item itself for one."""
    return items[0] if len(items) == 1 else "{" + ",".join(items) + "}"


def check_tool(step, dry=False, log=print):
    """Die with the package to install when the library of ``step`` (a key of STEP_TOOLS:
    truecase, bpe) is not importable (a dry run only warns)."""
    mod, install, why = STEP_TOOLS[step]
    _require(mod, install, f"{why} is needed", dry, log)


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


def learn_truecaser(lines):
    """A Moses truecaser (sacremoses ``MosesTruecaser``) learned on tokenized ``lines`` (str) as
    train-truecaser.perl does: every token that is not sentence-initial counts for its surface
    form; the model's best form of a word is its most frequent one."""
    from sacremoses import MosesTruecaser

    tc = MosesTruecaser()
    tc.train((line.split() for line in lines), possibly_use_first_token=False)
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


def tok_description(r, langs):
    out = {}
    for l in langs:
        if r.get("pretokenized"):
            out[l] = "already tokenized upstream: whitespace normalised only" + (" | lowercase" if r.get("lowercase") else "")
            continue
        parts = []
        if r.get("normalize_punct"):
            parts.append("MosesPunctNormalizer")
        if r.get("remove_non_printing"):
            parts.append("remove-non-printing-char")
        if r.get("replace_apostrophe"):
            parts.append("’->'")
        if l in LANG_TOOLS:
            parts.append(LANG_TOOLS[l][0] + " segmentation")
        parts.append(f"MosesTokenizer({l}, escape={r.get('escape', True)}, "
                     f"aggressive_dash_splits={r.get('aggressive_dash_splits', False)}, perl-compatible final period)")
        if r.get("lowercase"):
            parts.append("lowercase")
        out[l] = " | ".join(parts)
    return out


def versions():
    from importlib.metadata import PackageNotFoundError, version

    v = {}
    for dist in ("sacremoses", "subword-nmt"):
        try:
            v[dist] = version(dist)
        except PackageNotFoundError:
            v[dist] = "unknown"
    return v


def _nonprinting(line):
    # remove-non-printing-char.perl: s/\p{C}/ /g (control, format, unassigned, private use)
    import unicodedata

    return "".join(" " if unicodedata.category(c).startswith("C") else c for c in line)


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


def tokenize_lines(lines, lang, r):
    """The recipe ``r``'s tokenisation of raw ``lines`` in ``lang`` (see tok_description)."""
    from sacremoses import MosesPunctNormalizer, MosesTokenizer

    norm = MosesPunctNormalizer(lang=lang) if r.get("normalize_punct") else None
    tok = MosesTokenizer(lang=lang if lang not in ("zh", "ja") else "en")
    seg = None
    if lang == "zh":
        import jieba

        seg = lambda s: " ".join(w for w in jieba.cut(s) if w.strip())  # noqa: E731
    elif lang == "ja":
        import Mykytea

        kt = Mykytea.Mykytea("")
        seg = lambda s: " ".join(kt.getWS(s))  # noqa: E731
    out = []
    if r.get("pretokenized"):
        return [" ".join(l.split()).lower() if r.get("lowercase") else " ".join(l.split()) for l in lines]
    for line in lines:
        if lang == "ro" and r.get("romanian"):
            line = romanian_normalise(line)
        if norm is not None:
            line = norm.normalize(line)
        if r.get("remove_non_printing"):
            line = _nonprinting(line)
        if r.get("replace_apostrophe"):
            line = line.replace("\u2019", "'")
        if seg is not None:
            line = seg(line)
        t = tok.tokenize(line, escape=r.get("escape", True), return_str=True,
                         aggressive_dash_splits=r.get("aggressive_dash_splits", False))
        t = moses_final_period(t) if t.strip() else ""
        if r.get("lowercase"):
            t = t.lower()
        if "\n" in t or "\r" in t:
            raise SystemExit(f"tokenize: a line break survived tokenisation: {line[:80]!r}")
        out.append(t)
    return out


_RO_MAP = str.maketrans({"\u015e": "\u0218", "\u015f": "\u0219", "\u0162": "\u021a", "\u0163": "\u021b"})
_RO_STRIP = str.maketrans({"\u0218": "S", "\u0219": "s", "\u021a": "T", "\u021b": "t", "\u0102": "A", "\u0103": "a",
                           "\u00c2": "A", "\u00e2": "a", "\u00ce": "I", "\u00ee": "i"})


def romanian_normalise(line):
    """The WMT16 Ro-En recipe of Sennrich et al. (2016) for Romanian (wmt16-scripts
    preprocess/normalise-romanian.py + remove-diacritics.py): cedilla S/T -> comma-below, then
    every Romanian diacritic removed."""
    return line.translate(_RO_MAP).translate(_RO_STRIP)


def clean_ok(sides, c):
    """clean-corpus-n.perl's test for one sentence pair (token counts on whitespace):
    every side has min..max tokens and the ratio of the two lengths is at most ``c['ratio']``."""
    n = [len(s.split()) for s in sides]
    if any(k < c["min"] or k > c["max"] for k in n):
        return False
    return max(n) / min(n) <= c["ratio"]


def load_spec(corpus):
    """The spec of ``corpus`` (data-prep/<corpus>/corpus.yaml).

    Raises:
        SystemExit: unknown corpus (lists the valid ones)."""
    import yaml

    path = os.path.join(REPO, "data-prep", corpus, "corpus.yaml")
    if not os.path.exists(path):
        valid = sorted(d for d in os.listdir(os.path.join(REPO, "data-prep"))
                       if os.path.exists(os.path.join(REPO, "data-prep", d, "corpus.yaml")))
        raise SystemExit(f"unknown corpus '{corpus}'; valid: {', '.join(valid)}")
    spec = yaml.safe_load(open(path))
    spec.setdefault("entry", f"data-prep/{corpus}/prepare.sh")
    return spec


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--corpus", required=True, help="directory name under data-prep/ holding corpus.yaml")
    p.add_argument("--local-dir", help="directory with the corpus files (default: the matching folder of "
                   "../shared/data when present, else download)")
    p.add_argument("--download", action="store_true", help="force download mode")
    p.add_argument("--out", help="output directory (default: data-bin/<corpus>)")
    p.add_argument("--variant", help="a named variant of the recipe (corpus.yaml `variants`: truecasing / BPE "
                   "settings of one paper); tc/, bpe/, bin/ go to <out>/<variant>/")
    p.add_argument("--truecase", action=argparse.BooleanOptionalAction, default=None,
                   help="learn Moses truecasers on the tokenized train set and truecase every split "
                   "(default: the recipe's `truecase`)")
    p.add_argument("--bpe", choices=["joint", "separate"], help="one BPE model for both languages (and a joined "
                   "dictionary) or one per language (separate dictionaries); default: the recipe's `bpe_joint`")
    p.add_argument("--bpe-merges", type=int, help="BPE merges (per language with --bpe separate; default: the "
                   "paper's, from the spec)")
    p.add_argument("--bpe-codes", nargs="+", metavar="FILE|LANG=FILE",
                   help="use these BPE codes instead of learning them: one FILE (joint BPE) or LANG=FILE for "
                   "every language (separate BPE)")
    p.add_argument("--src", help="source language for bin/ (default: the spec's first language)")
    p.add_argument("--tgt", help="target language for bin/")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--no-checksum", action="store_true", help="accept inputs whose checksum differs")
    p.add_argument("--dry-run", action="store_true", help="print URLs, checksums and every step; write nothing")
    a = p.parse_args(argv)
    spec = load_spec(a.corpus)
    for opt in ("src", "tgt"):
        v = getattr(a, opt)
        if v is not None and v not in spec["langs"]:
            p.error(f"--{opt} must be one of {spec['langs']} (got '{v}')")
    if a.src and a.tgt and a.src == a.tgt:
        p.error("--src and --tgt must differ")
    if a.workers < 1 or (a.bpe_merges is not None and a.bpe_merges < 1):
        p.error("--workers and --bpe-merges must be positive integers")
    Prep(spec, a).run()


if __name__ == "__main__":
    main()
