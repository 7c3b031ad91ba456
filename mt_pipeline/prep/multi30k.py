"""Multi30k Task 1 En-De (``data-prep/multi30k/corpus.yaml``, pipeline ``multi30k``).

Stages (``<out>/``)::

    inputs  the eight upstream .gz files from a local directory (default
            ../shared/data/multi30k_en_de/raw) or downloaded from the pinned commit of
            github.com/multi30k/dataset; sha256 of every file checked (--no-checksum: not)
    raw     decompressed -> raw/{train,valid,test,test1}.{en,de} (valid = val, test =
            test_2016_flickr, test1 = test_2017_flickr); the upstream line counts, strict UTF-8,
            no empty or over-long line (--max-words) and equal counts are checked before raw/
            is swapped in; train optionally cut to its first --train-lines pairs
    tok     sacremoses MosesTokenizer(lang).tokenize(escape=False, aggressive_dash_splits=False):
            no XML escaping, case kept, no punctuation normalisation -> tok/
    bpe     joint BPE (subword-nmt, --bpe-merges, min frequency 2) learned on tok/train.en +
            tok/train.de -> bpe/codes, applied to every split -> bpe/
    char    (--char, instead of bpe) one symbol per character, "@@" on all but a token's last,
            so --remove-bpe restores the tokens -> char/ (Flexible Attention, Table 3)
    bin     fairseq-preprocess --joined-dictionary -> bin/ (serves both directions: fairseq's
            translation task falls back to "{split}.{tgt}-{src}.*")

The stamps are the text stamps of the shell pipeline this replaces, verbatim, so that preps made
with it stay up to date.
"""

import gzip
import os

from mt_pipeline.prep import binarize, bpe, fetch, tok
from mt_pipeline.prep.run import PrepRun, sha256_text, stamp_text
from mt_pipeline.prep.textio import MAX_WORDS, check_pair, check_parallel_lines, count_lines, report_problems
from mt_pipeline.prep.tools import tool_versions_line
from mt_pipeline.provenance import file_sha256

TOKENIZER = "sacremoses MosesTokenizer(lang).tokenize(escape=False, aggressive_dash_splits=False); case kept"
BPE_HOW = "subword-nmt learn_bpe (min_frequency=2) on tok/train.en+tok/train.de, BPE.process_line on all splits"
CHAR_HOW = "characters, @@ on all but a token's last (m30k_tools.py split-chars)"  # (stamp text, kept verbatim)


#: the stages, in order (``mt-prep multi30k --until``): bpe or char, as --char says
STAGES = ("raw", "tok", "bpe", "char", "bin")
#: the stage that writes the references a run is scored against (``raw/``, detokenized)
REFERENCE_STAGE = "raw"


def check_args(p, spec, args):
    """Nothing beyond the common checks of the CLI (which checks ``--until`` against
    :func:`run_stages`)."""


def run_stages(spec, args):
    """``(stages, why)``: the stages of :data:`STAGES` this run has, in order -- char with
    ``--char``, bpe without -- and for the one it lacks why (``{stage: reason}``)."""
    other = "bpe" if args.char else "char"
    return [s for s in STAGES if s != other], {other: f"this run segments with {'characters (--char)' if args.char else 'BPE'}"}


def add_arguments(p, spec):
    """The options of ``mt-prep multi30k`` (besides the common ones of :mod:`mt_pipeline.prep.cli`)."""
    p.add_argument("--char", action="store_true", help="character-level symbols instead of BPE (word ends "
                   "marked with '@@' as BPE does, so --remove-bpe restores the words); use its own --out")
    p.add_argument("--train-lines", metavar="N", help="use only the first N training pairs (default: all 29000)")
    p.add_argument("--max-words", default=str(MAX_WORDS), metavar="N", help="longest raw line allowed, in words (default: "
                   f"{MAX_WORDS}); raw input is also checked for invalid UTF-8, empty lines and unequal line counts")
    p.add_argument("--src", default="en", metavar="LANG", help="source language for bin/: en or de (default: en)")
    p.add_argument("--tgt", default="de", metavar="LANG", help="target language: de or en (default: de); bin/ serves both directions")


def stamps(spec, a, in_dir):
    """The stamp of every stage for the options ``a`` (each but raw names the sha256 of the one
    before; the raw stamp names every input and its sha256)."""
    tl, versions = str(a.train_lines or "all"), tool_versions_line()
    sha = {d["file"]: d["sha256"] for d in spec["downloads"]}

    def input_sha(f):
        if not a.no_checksum:
            return sha[f]
        path = os.path.join(in_dir, f)
        return file_sha256(path) if os.path.isfile(path) else "missing"

    raw = stamp_text("raw", inputs=" ".join(f"{f}:{input_sha(f)}" for f in input_files(spec)), train_lines=tl)
    tok_ = stamp_text("tok", upstream=sha256_text(raw), train_lines=tl, tokenizer=TOKENIZER, versions=versions)
    bpe_ = stamp_text("bpe", upstream=sha256_text(tok_), train_lines=tl, bpe_merges=a.bpe_merges, bpe=BPE_HOW,
                      versions=versions)
    char = stamp_text("char", upstream=sha256_text(tok_), train_lines=tl, segmentation=CHAR_HOW)
    if a.char:
        seg = dict(upstream=sha256_text(char), train_lines=tl, segmentation="char")
    else:
        seg = dict(upstream=sha256_text(bpe_), train_lines=tl, bpe_merges=a.bpe_merges)
    bin_ = stamp_text("bin", **seg, src=a.src, tgt=a.tgt) + "\nfairseq-preprocess --joined-dictionary"
    return {"raw": raw, "tok": tok_, "bpe": bpe_, "char": char, "bin": bin_}


def input_files(spec):
    """The upstream file names, in the spec's split order, each language."""
    return [f"{s['upstream']}.{lang}.gz" for s in spec["splits"] for lang in spec["langs"]]


def check_local_inputs(run, spec, in_dir, verify):
    """Local mode: every input exists and (``verify``) has its recorded sha256.

    Raises:
        SystemExit: a missing file or another sha256 (names the file)."""
    sha = {d["file"]: d["sha256"] for d in spec["downloads"]}
    for f in input_files(spec):
        path = os.path.join(in_dir, f)
        if not os.path.isfile(path):
            run.die(f"missing input {path} (--raw-dir must hold {{{','.join(s['upstream'] for s in spec['splits'])}}}"
                    f".{{{','.join(spec['langs'])}}}.gz)")
        if verify and not run.dry and file_sha256(path) != sha[f]:
            run.die(f"sha256 mismatch for {path}: expected {sha[f]}, got {file_sha256(path)} "
                    "(use --no-checksum to accept other files)")
    if verify and not run.dry:
        run.log(f"inputs in {in_dir}: sha256 ok")


def read_split(run, split, langs, in_dir, a):
    """The raw byte lines of one split (``split``: a spec entry), per language, as
    ``[(name for messages, lines)]``: decompressed, the upstream count checked (unless
    --no-checksum), train cut to --train-lines, then checked by
    :func:`~mt_pipeline.prep.textio.check_parallel_lines`.  None in a dry run.

    Raises:
        SystemExit: a file that is not gzip, another line count, unequal counts, or bad text."""
    up, named, full = split["upstream"], [], {}
    for lang in langs:
        src = os.path.join(in_dir, f"{up}.{lang}.gz")
        cut = split["name"] == "train" and a.train_lines
        run.step(f"decompress {up}.{lang}.gz -> raw/{split['name']}.{lang}" + (f" (keep the first {a.train_lines} lines)"
                                                                               if cut else ""))
        if run.dry:
            continue
        try:
            with gzip.open(src, "rb") as f:
                lines = f.read().split(b"\n")
        except (OSError, EOFError):
            run.die(f"raw: cannot decompress {src} (not a valid .gz file?)")
        if lines[-1] == b"":
            lines.pop()  # (a last line without a newline gets one)
        full[lang] = len(lines)
        if not a.no_checksum and len(lines) != split["pairs"]:
            run.die(f"raw: {src} has {len(lines)} lines, expected {split['pairs']}")
        named.append((f"{in_dir}/{up}.{lang}.gz (decompressed)", lines[:a.train_lines] if cut else lines))
    if run.dry:
        return None
    x, y = langs
    if full[x] != full[y]:
        run.die(f"raw: line counts differ: {in_dir}/{up}.{x}.gz has {full[x]} lines, {in_dir}/{up}.{y}.gz has "
                f"{full[y]}; nothing written to {run.out}/raw")
    problems = check_parallel_lines(named, a.max_words)
    if problems:
        report_problems(problems, "check-parallel")
        run.die(f"raw: bad input in {in_dir}/{up}.{{{x},{y}}}.gz (see above); nothing written to {run.out}/raw")
    return named


class Multi30k:
    """One run of the Multi30k pipeline (see the module docstring); ``args`` are checked by the CLI."""

    def __init__(self, spec, args, run, mode, in_dir):
        self.spec, self.a, self.run, self.mode, self.in_dir = spec, args, run, mode, in_dir
        self.langs, self.out = list(spec["langs"]), run.out
        self.splits = [s["name"] for s in spec["splits"]]

    def split_count(self, split):
        """Sentence pairs of ``split`` (from raw/; '?' in a dry run)."""
        path = os.path.join(self.out, "raw", f"{split}.{self.langs[0]}")
        return count_lines(path) if os.path.exists(path) and not self.run.dry else "?"

    def files(self, stage):
        """``<out>/STAGE/SPLIT.LANG`` for every split and language."""
        return [os.path.join(self.out, stage, f"{s}.{lang}") for s in self.splits for lang in self.langs]

    def raw_body(self, d):
        """Stage raw: every split decompressed and checked (:func:`read_split`) into ``d``."""
        for split in self.spec["splits"]:
            named = read_split(self.run, split, self.langs, self.in_dir, self.a)
            for lang, (_, lines) in zip(self.langs, named or []):
                with open(os.path.join(d, f"{split['name']}.{lang}"), "wb") as f:
                    f.write(b"".join(line + b"\n" for line in lines))
            if named and split["name"] == "train" and self.a.train_lines and len(named[0][1]) != self.a.train_lines:
                self.run.log(f"note: --train-lines {self.a.train_lines} exceeds the corpus; using all "
                             f"{len(named[0][1])} training pairs")

    def tok_body(self, d):
        """Stage tok: raw/ tokenized into ``d``, line counts checked."""
        tok.tokenize_files(self.run, os.path.join(self.out, "raw"), d, self.splits, self.langs,
                           lambda s: tok.split_recipe(self.spec["recipe"], s))
        for s in ([] if self.run.dry else self.splits):
            check_pair(self.run, "tok", d, s, self.langs, self.split_count(s), " (the raw count)")

    def char_body(self, d):
        """Stage char (--char): tok/ split into characters into ``d``."""
        run = self.run
        run.step(f"split {bpe.alts(self.splits)}.{bpe.alts(self.langs)} into characters -> char/")
        if not run.dry:
            bpe.split_chars_files(bpe.io_pairs(os.path.join(self.out, "tok"), d, self.splits, self.langs))
            for s in self.splits:
                check_pair(run, "char", d, s, self.langs, self.split_count(s), " (the raw count)")

    def bpe_body(self, d):
        """Stage bpe: joint BPE learned on tok/train.* and applied into ``d``."""
        bpe.joint_bpe(self.run, os.path.join(self.out, "tok"), d, self.splits, self.langs, self.a.bpe_merges,
                      f"{self.a.bpe_merges} merges", self.split_count)

    def bin_body(self, d):
        """Stage bin: fairseq-preprocess --joined-dictionary into ``d``, dictionaries and counts checked."""
        run, a, seg = self.run, self.a, os.path.join(self.out, "char" if self.a.char else "bpe")
        cmd = binarize.preprocess_cmd(a.src, a.tgt, d, a.workers, trainpref=f"{seg}/train", validpref=f"{seg}/valid",
                                      testprefs=[f"{seg}/test", f"{seg}/test1"], joined=True)
        binarize.run_preprocess(run, cmd, os.path.join(self.out, "logs", "bin.log"))
        if run.dry:
            return
        binarize.check_joined(run, "bin", d, a.src, a.tgt)
        binarize.check_counts(run, "bin", d, f"{a.src}-{a.tgt}", self.splits, [a.src, a.tgt],
                              lambda s, lang: (self.split_count(s), f"raw/{s}.{a.src}"))
        run.log(f"dictionary: {count_lines(os.path.join(d, f'dict.{a.src}.txt'))} types (+4 special symbols), "
                f"shared by {a.src} and {a.tgt}")

    def main(self):
        """Run every stage (under the output lock); print the bin directory last."""
        run, a, out = self.run, self.a, self.out
        tl, pair, bin_dir = str(a.train_lines or "all"), f"{a.src}-{a.tgt}", os.path.join(self.out, "bin")
        with run.lock():
            run.log(f"out={out} src={a.src} tgt={a.tgt} " + ("segmentation=char" if a.char else f"bpe_merges={a.bpe_merges}")
                    + f" train_lines={tl} workers={a.workers} mode={self.mode}")
            if run.dry or self.mode == "download":
                fetch.print_sources(run, self.spec["downloads"])
            if self.mode == "download":
                fetch.fetch_all(run, self.spec["downloads"], self.in_dir, not a.no_checksum, "pass --raw-dir DIR holding {file}")
            else:
                check_local_inputs(run, self.spec, self.in_dir, not a.no_checksum)
            st = stamps(self.spec, a, self.in_dir)
            run.stage("raw", os.path.join(out, "raw"), st["raw"], self.files("raw"), self.raw_body, swap=True,
                      note=f" (train_lines={tl})")
            run.stage("tok", os.path.join(out, "tok"), st["tok"], self.files("tok"), self.tok_body)
            if a.char:
                run.stage("char", os.path.join(out, "char"), st["char"], self.files("char"), self.char_body)
            else:
                run.stage("bpe", os.path.join(out, "bpe"), st["bpe"], [os.path.join(out, "bpe", "codes")]
                          + self.files("bpe"), self.bpe_body, note=f" (bpe_merges={a.bpe_merges})")
            files = [os.path.join(bin_dir, f"dict.{l}.txt") for l in (a.src, a.tgt)]
            run.stage("bin", bin_dir, st["bin"], files + binarize.dataset_files(bin_dir, pair, self.splits, [a.src, a.tgt]),
                      self.bin_body, swap=True, note=f" ({pair})")
        if run.dry:
            run.log("dry run finished; nothing was done. The bin dir would be:")
        else:
            run.log(f"done. fairseq data dir (serves {a.src}->{a.tgt} and {a.tgt}->{a.src}):")
        print(bin_dir)


def main(spec, args, mode, local_dir):
    """Run the Multi30k pipeline for parsed ``args`` (``mode``: local / download)."""
    run = PrepRun(spec["name"], args.out, args.dry_run, args.workers, until=args.until)
    in_dir = local_dir if mode == "local" else os.path.join(args.out, "download")
    Multi30k(spec, args, run, mode, in_dir).main()
