"""The long-document pipeline (``data-prep/long_documents/corpus.yaml``, pipeline ``long_documents``).

Stages (``<out>/``)::

    inputs  the Maruf et al. (2019) dev/test files from --local-dir/--data-dir (the shared data
            folder) or downloaded (--download) from the pinned commit of
            github.com/sameenmaruf/selective-attn; sha256 of every input's content checked
    sent    every source read into documents of sentence pairs (sources.py), split and
            deduplicated (dedup.py) -> sent/{train,valid,test}.{en,de,docids} + sources.json;
            the line-aligned Maruf inputs are checked (UTF-8, empty / over-long lines, counts) first
    tok     Moses tokenisation (sacremoses, escape=False, case kept) -> tok/
    bpe     joint BPE (--bpe-merges, min frequency 2) learned on the sentence-level pool -> bpe/
    dict    one joined fairseq dictionary from bpe/train.{en,de} -> dict/
    L<L>    for every L of --lengths: documents of <= L BPE tokens per side (pack.py) ->
            L<L>/{bpe,tok,raw}/, L<L>/SPLIT.map; then fairseq-preprocess with dict/ -> L<L>/bin/
    stats   stats.json + a short summary

No document-level *training* corpus is available offline: the Maruf et al. Europarl7
document-level training set has no stable official URL, so it is never downloaded; pass a
copy with --train-dir (it is added first to the pool).  Training at length L needs
--max-source-positions / --max-target-positions >= L+2 (see data-prep/long_documents/README.md).

The stamps are the text stamps of the shell pipeline this replaces, verbatim, so that preps made
with it stay up to date; the sent stamp names the code that reads and deduplicates the sources
(:func:`sent_code_sha`), so a change there redoes everything.
"""

import glob
import hashlib
import os

from mt_pipeline.prep import binarize, bpe, fetch, tok
from mt_pipeline.prep.longdoc import dedup, pack, sources
from mt_pipeline.prep.run import PrepRun, StopAfter, sha256_text, stamp_text
from mt_pipeline.prep.textio import MAX_WORDS, check_pair, count_lines, report_problems
from mt_pipeline.prep.tools import tool_versions_line

SPLITS, LANGS = list(sources.SPLITS), list(sources.LANGS)
TOKENIZER = "sacremoses MosesTokenizer(lang).tokenize(escape=False); case kept"
BPE_HOW = "subword-nmt learn_bpe (min_frequency=2) on tok/train.en+tok/train.de, BPE.process_line on all splits"
# sha256 of the code versions known to write byte-identical sent/ outputs (full runs compared with
# `diff -r`); the sent stamp records the first of them for each, so data prepared with one is not
# redone with another.  After an edit of sources.py / dedup.py that keeps the outputs (verified the
# same way), append the new sent_code_sha(); any other version gets stamps of its own.
SENT_SAME_OUTPUT = (
    "5f8fa250cf14866c33c9de88996573772ad9d61c5d97b397b7ef7a427be73f2e",  # longdoc_tools.py up to commit e141f7e
    "3745acca7513d61d10a95fef7e22c56366d440a8c0be726e4f9457feef325011",  # + tokenize, BPE moved to text_tools.py
    "f3cd7139eb254b8a92b38dee3047893f4831833454cce8e4dc9cfeae41deac0a",  # + check-inputs subcommand
    "b2c4ceb330453d1f50393f1ea2b7fc2be42b8081e8de3b4473a3e2d724747554",  # mt_pipeline/prep/longdoc/{sources,dedup}.py
)


def sent_code_sha():
    """sha256 of the code that writes sent/ (sources.py + dedup.py); a known equivalent version
    maps to the first of SENT_SAME_OUTPUT."""
    h = hashlib.sha256()
    for mod in (sources, dedup):
        with open(mod.__file__, "rb") as f:
            h.update(f.read())
    sha = h.hexdigest()
    return SENT_SAME_OUTPUT[0] if sha in SENT_SAME_OUTPUT else sha


def parse_lengths(text):
    """``"256,128 256"`` -> ``[128, 256]`` (positive integers separated by spaces or commas;
    duplicates dropped, sorted).

    Raises:
        ValueError: an entry that is not a positive integer, or none at all."""
    out = set()
    for x in text.replace(",", " ").split():
        if not x.isdigit() or int(x) == 0:
            raise ValueError(x)
        out.add(int(x))
    if not out:
        raise ValueError(text)
    return sorted(out)


def add_arguments(p, spec):
    """The options of ``mt-prep long_documents`` (besides the common ones of :mod:`mt_pipeline.prep.cli`)."""
    default = " ".join(str(x) for x in spec["recipe"]["lengths"])
    p.add_argument("--train-dir", metavar="DIR", help="add a Maruf-format training set to the pool: DIR/concatenated_en2de_train_"
                   "{en,de}.txt (or .txt.gz; one sentence per line, a line '<d>' starts each document).  The full "
                   "Europarl7 document-level training set of Maruf et al. has no stable official URL, so it is never "
                   "downloaded: obtain it yourself and pass it here")
    p.add_argument("--lengths", default=default, metavar='"L ..."', help=f'document length limits in BPE tokens (default: "{default}")')
    p.add_argument("--variant", metavar="L<L>", help="L<L>, one of the --lengths: the prep dir <out>/L<L> (every length is built)")


def input_desc(data_dir, maruf_dir, train_dir):
    """``PATH:SIZE:MTIME `` of every input file, sorted (the sha256 values are checked when read)."""
    files = []
    if data_dir:
        for pattern in ("docmt_maruf2019_en_de/*/*", "iwslt14_de_en/orig_xml/IWSLT14.*.xml*",
                        "wmt/sgm/newstest2014-deen-*.sgm*"):
            files += [f for f in sorted(glob.glob(os.path.join(data_dir, pattern))) if os.path.isfile(f)]
    for base, prefix, deep in ((maruf_dir, "concatenated_", True), (train_dir, "concatenated_en2de_train_", False)):
        if base and os.path.isdir(base):
            for d, dirs, names in os.walk(base):
                files += [os.path.join(d, n) for n in names if n.startswith(prefix) and os.path.isfile(os.path.join(d, n))
                          and not os.path.islink(os.path.join(d, n))]
                dirs[:] = dirs if deep else []
    return "".join(f"{f}:{os.stat(f).st_size}:{os.stat(f).st_mtime_ns // 10**9} " for f in sorted(files))


class LongDocuments:
    """One run of the long-document pipeline (see the module docstring); ``args`` checked by the CLI."""

    def __init__(self, spec, args, run, data_dir, maruf_dir):
        self.spec, self.a, self.run, self.out = spec, args, run, run.out
        self.data_dir, self.maruf_dir, self.train_dir = data_dir, maruf_dir, args.train_dir

    def stamps(self):
        """The stamp of every stage (``sent``, ``tok``, ``bpe``, ``dict``, ``pack<L>``, ``bin<L>``)."""
        a, versions = self.a, tool_versions_line()
        sent = stamp_text("sent", data_dir=self.data_dir or "none", maruf_dir=self.maruf_dir or "from data_dir",
                          train_dir=self.train_dir or "none", checksum=0 if a.no_checksum else 1,
                          inputs=input_desc(self.data_dir, self.maruf_dir, self.train_dir), tools=sent_code_sha())
        tok_ = stamp_text("tok", upstream=sha256_text(sent), tokenizer=TOKENIZER, versions=versions)
        bpe_ = stamp_text("bpe", upstream=sha256_text(tok_), bpe_merges=a.bpe_merges, bpe=BPE_HOW, versions=versions)
        dict_ = (stamp_text("dict", upstream=sha256_text(bpe_))
                 + "\nfairseq-preprocess --joined-dictionary --dict-only on bpe/train.{en,de}")
        st = {"sent": sent, "tok": tok_, "bpe": bpe_, "dict": dict_}
        for n in a.lengths:
            st[f"pack{n}"] = stamp_text("pack", upstream=sha256_text(bpe_), length=n,
                                        unit="max(#BPE en, #BPE de) per sentence")
            st[f"bin{n}"] = (stamp_text("bin", upstream=sha256_text(st[f"pack{n}"]), dict=sha256_text(dict_))
                             + "\nfairseq-preprocess --srcdict --tgtdict en-de")
        return st

    def split_count(self, split):
        """Sentences of ``split`` (from sent/SPLIT.docids; '?' in a dry run)."""
        path = os.path.join(self.out, "sent", f"{split}.docids")
        return count_lines(path) if os.path.exists(path) and not self.run.dry else "?"

    def files(self, d, splits=SPLITS):
        """``d/SPLIT.LANG`` for ``splits`` and both languages."""
        return [os.path.join(d, f"{s}.{lang}") for s in splits for lang in LANGS]

    # ------------------------------------------------------------------ stage bodies
    def sent_body(self, d):
        """Stage sent: the Maruf inputs checked, then every source read, split and deduplicated into ``d``."""
        run = self.run
        if not run.dry and (self.data_dir or self.maruf_dir):
            problems = sources.check_inputs(self.data_dir, self.maruf_dir, MAX_WORDS)
            if problems:
                report_problems(problems, "check-inputs")
                run.die(f"sent: bad input (see above); nothing written to {self.out}/sent")
        run.step("read the sources (test = Europarl7 test, valid = Europarl7 dev, train = the deduplicated pool) "
                 "-> sent/")
        if run.dry:
            return
        try:
            sources.write_sentences(d, self.data_dir, self.maruf_dir, self.train_dir, not self.a.no_checksum, run.log)
        except sources.DataError as err:
            run.die(f"sent: {err}")
        for s in SPLITS:
            check_pair(run, "sent", d, s, LANGS, count_lines(os.path.join(d, f"{s}.docids")))

    def tok_body(self, d):
        """Stage tok: sent/ tokenized into ``d``, line counts checked."""
        tok.tokenize_files(self.run, os.path.join(self.out, "sent"), d, SPLITS, LANGS, lambda s: self.spec["recipe"],
                           src_name="sent")
        for s in ([] if self.run.dry else SPLITS):
            check_pair(self.run, "tok", d, s, LANGS, self.split_count(s))

    def dict_body(self, d):
        """Stage dict: the joined dictionary of bpe/train.{en,de} built into ``d``."""
        run = self.run
        cmd = binarize.preprocess_cmd("en", "de", d, self.a.workers, trainpref=os.path.join(self.out, "bpe", "train"),
                                      joined=True, dict_only=True)
        binarize.run_preprocess(run, cmd, os.path.join(self.out, "logs", "dict.log"))
        if not run.dry:
            binarize.check_joined(run, "dict", d, "en", "de")
            run.log(f"dict: {count_lines(os.path.join(d, 'dict.en.txt'))} types (+4 special symbols), shared by en "
                    "and de and every L")

    def pack_body(self, n, d):
        """Stage pack of length ``n``: documents of <= n BPE tokens into ``d`` (= <out>/L<n>)."""
        run = self.run
        run.step(f"pack L={n}: the sentences of each document into documents of <= {n} BPE tokens per side -> L{n}/")
        if run.dry:
            return
        try:
            pack.write_packed(self.out, n)
        except SystemExit as err:
            run.die(str(err))
        for s in SPLITS:
            docs = count_lines(os.path.join(d, f"{s}.map"))
            for level in ("bpe",) if s == "train" else ("bpe", "raw", "tok"):
                check_pair(run, f"L={n} pack", os.path.join(d, level), s, LANGS, docs)
        run.log(f"L={n} pack: train/valid/test " + "/".join(str(count_lines(os.path.join(d, f"{s}.map")))
                                                            for s in SPLITS) + " documents")

    def bin_body(self, n, d):
        """Stage bin of length ``n``: fairseq-preprocess with the shared dictionary into ``d``."""
        run, ldir, ddir = self.run, os.path.join(self.out, f"L{n}"), os.path.join(self.out, "dict")
        cmd = binarize.preprocess_cmd("en", "de", d, self.a.workers, srcdict=os.path.join(ddir, "dict.en.txt"),
                                      tgtdict=os.path.join(ddir, "dict.de.txt"), trainpref=f"{ldir}/bpe/train",
                                      validpref=f"{ldir}/bpe/valid", testprefs=[f"{ldir}/bpe/test"])
        binarize.run_preprocess(run, cmd, os.path.join(self.out, "logs", f"bin.L{n}.log"))
        if run.dry:
            return
        binarize.check_joined(run, f"L={n} bin", d, "en", "de", reference=os.path.join(ddir, "dict.en.txt"))
        binarize.check_counts(run, f"L={n} bin", d, "en-de", SPLITS, LANGS, lambda s, lang: (
            count_lines(os.path.join(ldir, "bpe", f"{s}.en")), f"L{n}/bpe/{s}.en"), unit="documents")

    # ------------------------------------------------------------------ main
    def main(self):
        """Run every stage (under the output lock); print the output directory last."""
        run, a, out = self.run, self.a, self.out
        with run.lock():
            run.log(f"out={out} data_dir={self.data_dir or 'none'} download={int(bool(a.download))} "
                    f"train_dir={self.train_dir or 'none'} lengths=\"{' '.join(map(str, a.lengths))}\" "
                    f"bpe_merges={a.bpe_merges} workers={a.workers}")
            if run.dry or a.download:
                fetch.print_sources(run, self.spec["downloads"])
            if a.download:
                fetch.fetch_all(run, self.spec["downloads"], self.maruf_dir, not a.no_checksum, "pass --data-dir DIR holding {file}")
            st = self.stamps()
            sent = os.path.join(out, "sent")
            run.stage("sent", sent, st["sent"], [os.path.join(sent, "sources.json")] + self.files(sent)
                      + [os.path.join(sent, f"{s}.docids") for s in SPLITS], self.sent_body, swap=True)
            run.stage("tok", os.path.join(out, "tok"), st["tok"], self.files(os.path.join(out, "tok")), self.tok_body)
            run.stage("bpe", os.path.join(out, "bpe"), st["bpe"],
                      [os.path.join(out, "bpe", "codes")] + self.files(os.path.join(out, "bpe")),
                      lambda d: bpe.joint_bpe(run, os.path.join(out, "tok"), d, SPLITS, LANGS, a.bpe_merges,
                                              f"{a.bpe_merges} merges, min frequency 2", self.split_count),
                      note=f" (bpe_merges={a.bpe_merges})")
            ddir = os.path.join(out, "dict")
            run.stage("dict", ddir, st["dict"], [os.path.join(ddir, f"dict.{l}.txt") for l in LANGS], self.dict_body,
                      swap=True)
            for n in a.lengths:
                self.length(n, st, with_bin=a.until != "pack")
            if a.until == "pack":
                raise StopAfter("pack", out)
            if run.dry:
                run.step("write stats.json")
            else:
                pack.write_stats(out, a.lengths, run.log)
        if run.dry:
            run.log("dry run finished; nothing was done. The output dir would be:")
        else:
            run.log(f"done. fairseq data dirs: {out}/L{{{','.join(map(str, a.lengths))}}}/bin (stats: "
                    f"{out}/stats.json). Output dir:")
        print(out)

    def length(self, n, st, with_bin=True):
        """The pack and (``with_bin``) bin stages of length ``n``."""
        d = os.path.join(self.out, f"L{n}")
        files = (self.files(os.path.join(d, "bpe")) + self.files(os.path.join(d, "raw"), ["valid", "test"])
                 + self.files(os.path.join(d, "tok"), ["valid", "test"]) + [os.path.join(d, f"{s}.map") for s in SPLITS])
        self.run.stage(f"L={n} pack", d, st[f"pack{n}"], files, lambda x: self.pack_body(n, x))
        if not with_bin:
            return
        b = os.path.join(d, "bin")
        self.run.stage(f"L={n} bin", b, st[f"bin{n}"], [os.path.join(b, f"dict.{l}.txt") for l in LANGS]
                       + binarize.dataset_files(b, "en-de", SPLITS, LANGS), lambda x: self.bin_body(n, x), swap=True)


#: the stages ``mt-prep long_documents --until`` stops after; ``pack`` is every length's pack stage
#: (``L<n>/``: the documents of length n, their raw / tok references and BPE), without the bin ones
STAGES = ("sent", "tok", "bpe", "dict", "pack")
#: the stage that writes the references a run is scored against (``L<n>/raw/``)
REFERENCE_STAGE = "pack"


def run_stages(spec, args):
    """``(stages, why)``: every run has all of :data:`STAGES` (``why`` is empty)."""
    return list(STAGES), {}


def check_args(p, spec, args):
    """Check and normalise the options of this pipeline (``p.error`` on a bad one): --lengths
    parsed (:func:`parse_lengths`), --variant one of them, --train-dir holding the Maruf files."""
    try:
        args.lengths = parse_lengths(args.lengths)
    except ValueError:
        p.error("--lengths must be positive integers separated by spaces or commas, e.g. "
                f"\"{' '.join(str(x) for x in spec['recipe']['lengths'])}\" (got '{args.lengths}')")
    valid = [f"L{n}" for n in args.lengths]
    if args.variant and args.variant not in valid:
        p.error(f"unknown variant '{args.variant}' of {spec['name']}; valid: {', '.join(valid)} (one per --lengths)")
    if args.train_dir:
        if not os.path.isdir(args.train_dir):
            p.error(f"--train-dir '{args.train_dir}' is not a directory: give the directory that holds Maruf et al. "
                    "(2019)'s Europarl7 training set, concatenated_en2de_train_{en,de}.txt[.gz] (the paper-scale "
                    "budgets of configs/reluformer/europarl7_doc/ expect data-bin/maruf_europarl7_train)")
        args.train_dir = os.path.abspath(args.train_dir)
        for lang in LANGS:
            f = os.path.join(args.train_dir, f"concatenated_en2de_train_{lang}.txt")
            if not (os.path.isfile(f) or os.path.isfile(f + ".gz")):
                p.error(f"--train-dir {args.train_dir} has no concatenated_en2de_train_{lang}.txt[.gz] (Maruf format: "
                        "one sentence per line, '<d>' starts a document)")


def main(spec, args, mode, local_dir):
    """Run the long-document pipeline for parsed ``args``: ``local_dir`` is the shared data folder
    (None: none), ``mode == 'download'`` fetches the Maruf files into ``<out>/download``."""
    run = PrepRun("long_docs", args.out, args.dry_run, args.workers, until=args.until)
    maruf_dir = os.path.join(args.out, "download") if args.download else None
    LongDocuments(spec, args, run, local_dir, maruf_dir).main()
