"""``mt-prep CORPUS [options]``: prepare one corpus for fairseq (the console entry point).

``CORPUS`` is a directory of ``data-prep/`` holding a ``corpus.yaml`` (``mt-prep --list``);
``data-prep/<corpus>/prepare.sh [options]`` runs the same command.  The options common to every
corpus::

    --local-dir DIR     directory with the corpus files (default: the matching folder of
                        ../shared/data when present, else download); Multi30k also calls it
                        --raw-dir, the long-document sets --data-dir
    --download          download the official files (checksums verified) into <out>/download/
    --out DIR           output directory (default: data-bin/<corpus>)
    --bpe-merges N      BPE merge operations (default: the recipe's)
    --workers N         worker processes for tokenisation, truecasing, BPE and fairseq-preprocess (default: 2)
    --no-checksum       accept inputs whose checksum differs from the recorded one
    --dry-run           print the URLs, checksums and every step; write nothing
    --until STAGE       stop after that stage (raw, tok, ..., bin: the pipeline's own), done or up
                        to date, and print its directory last; a later run goes on from there

and each pipeline adds its own (``mt-prep CORPUS --help``).  Bad options stop with a message
naming the valid ones.  The last line printed on stdout is the prepared directory.
"""

import argparse
import os
import re
import sys

from mt_pipeline.atomic import writable_problem
from mt_pipeline.prep import multi30k, sentence, spec as specs
from mt_pipeline.prep.longdoc import pipeline as longdoc
from mt_pipeline.prep.run import StopAfter
from mt_pipeline.prep.tools import missing_base_modules

#: ``corpus.yaml``'s ``pipeline`` -> its module, which provides ``STAGES`` (every stage, in order),
#: ``REFERENCE_STAGE`` (the one that writes the scored references), ``add_arguments(p, spec)``,
#: ``check_args(p, spec, args)``, ``run_stages(spec, args)`` (this run's stages and why it lacks the
#: others: what ``--until`` may name) and ``main(spec, args, mode, local_dir)``
PIPELINES = {"sentence": sentence, "multi30k": multi30k, "long_documents": longdoc}
LOCAL_ALIAS = {"multi30k": "--raw-dir", "long_documents": "--data-dir"}  # the option's name in those scripts
POSINT = ("bpe_merges", "workers", "train_lines", "max_words")


class _Parser(argparse.ArgumentParser):
    """argparse with the messages of the data-prep scripts: ``[tag] ERROR: ...``, exit status 1,
    an unknown option listing the valid ones, a missing value named as such."""

    def __init__(self, tag, **kw):
        super().__init__(allow_abbrev=False, formatter_class=argparse.RawDescriptionHelpFormatter, **kw)
        self.tag = tag

    def valid_options(self):
        """Every option of the parser, aliases joined by '/'."""
        return ", ".join(a.option_strings[-1] if len(a.option_strings) == 1 else "/".join(a.option_strings)
                         for a in self._actions if a.option_strings)

    def error(self, message):
        """Print the message as the data-prep scripts do and exit with status 1."""
        m = re.match(r"argument ([^:]+): expected (one|at least one) argument", message)
        if m:
            message = f"{m.group(1).split('/')[-1]} needs a value (see --help)"
        m = re.match(r"unrecognized arguments: (\S+)", message)
        if m:
            message = f"unknown option '{m.group(1)}'; valid options: {self.valid_options()}"
        print(f"[{self.tag}] ERROR: {message}", file=sys.stderr)
        raise SystemExit(1)


def reference_stage(corpus):
    """The stage of ``mt-prep CORPUS`` that writes the references its runs are scored against:
    ``mt-prep CORPUS --until`` it prepares what re-scoring needs and nothing more.

    Raises:
        SystemExit: ``corpus`` is not a corpus of data-prep/ (the message lists them)."""
    return PIPELINES[specs.load_spec(corpus)["pipeline"]].REFERENCE_STAGE


def build_parser(spec):
    """The option parser of ``mt-prep CORPUS`` for ``spec``."""
    kind = spec["pipeline"]
    module = PIPELINES[kind]
    tag = "long_docs" if kind == "long_documents" else spec["name"]
    about = (module.__doc__ or "").split("\n\n", 1)[1].split("\n\nThe stamps")[0]
    p = _Parser(tag, prog=f"mt-prep {spec['name']}",
                description=f"{spec['title']}.\n\n" + about.replace("``", "").replace("::", ":"),
                epilog=f"Also run as: {spec['entry']} [options].  The last line printed on stdout is the prepared "
                       "directory.")
    local = ["--local-dir"] + ([LOCAL_ALIAS[kind]] if kind in LOCAL_ALIAS else [])
    p.add_argument(*local, dest="local_dir", metavar="DIR", help="directory with the corpus files (default: the "
                   "matching folder of ../shared/data when present, else download)")
    p.add_argument("--download", action="store_true", help="download the official files (checksums verified) into "
                   "<out>/download/")
    p.add_argument("--out", metavar="DIR", help=f"output directory (default: {spec.get('default_out', 'data-bin/' + spec['name'])})")
    merges = (spec.get("recipe") or {}).get("bpe_merges")
    p.add_argument("--bpe-merges", metavar="N", help="BPE merge operations" + (f" (default: {merges})" if isinstance(merges, int) else
                   " (per language with --bpe separate; default: the paper's, from the spec)"))
    p.add_argument("--workers", default="2", metavar="N", help="worker processes for tokenisation, truecasing, BPE and "
                   "fairseq-preprocess (default: 2)")
    p.add_argument("--no-checksum", action="store_true", help="accept inputs whose checksum differs from the recorded one")
    p.add_argument("--dry-run", action="store_true", help="print URLs, checksums and every step; write nothing")
    p.add_argument("--until", metavar="STAGE", help=f"stop after stage STAGE ({', '.join(module.STAGES)}), done or up to "
                   "date, and print its directory last; a later run goes on from there")
    module.add_arguments(p, spec)
    return p


def parse_args(spec, argv):
    """Parsed and checked options of ``mt-prep CORPUS argv...``; ``out`` made absolute.

    Raises:
        SystemExit: a bad option or value (the message names the valid choices)."""
    p = build_parser(spec)
    args, extra = p.parse_known_args(argv)
    if extra:
        p.error(f"unknown option '{extra[0]}'; valid options: {p.valid_options()}")
    for name in POSINT:
        v = getattr(args, name, None)
        if v is not None and not (str(v).isdigit() and int(v) > 0):
            p.error(f"--{name.replace('_', '-')} must be a positive integer (got '{v}')")
        if v is not None:
            setattr(args, name, int(v))
    if args.bpe_merges is None and spec["pipeline"] != "sentence":
        args.bpe_merges = spec["recipe"]["bpe_merges"]
    langs = spec["langs"]
    for opt in ("src", "tgt"):
        v = getattr(args, opt, None)
        if v is not None and v not in langs:
            p.error(f"--{opt} must be one of: {', '.join(langs)} (got '{v}')")
    if getattr(args, "src", None) and args.src == getattr(args, "tgt", None):
        p.error(f"--src and --tgt must differ (valid pairs: --src {langs[0]} --tgt {langs[1]}, "
                f"--src {langs[1]} --tgt {langs[0]})")
    if getattr(args, "bpe", None) not in (None, "joint", "separate"):
        p.error(f"--bpe must be one of: joint, separate (got '{args.bpe}')")
    module = PIPELINES[spec["pipeline"]]
    if args.until is not None and args.until not in module.STAGES:
        p.error(f"--until must be one of: {', '.join(module.STAGES)} (got '{args.until}')")
    module.check_args(p, spec, args)
    if args.until is not None:  # a stage this run has (its recipe decides: tc, bpe / char)
        try:
            ours, why = module.run_stages(spec, args)
        except SystemExit as err:
            p.error(str(err))
        if args.until not in ours:
            p.error(f"--until {args.until}: {why[args.until]}; this run's stages: {', '.join(ours)}")
    out = args.out or os.path.join(specs.REPO, spec.get("default_out", os.path.join("data-bin", spec["name"])))
    args.out = os.path.abspath(out).rstrip(os.sep) or os.sep
    return p, args


def resolve_inputs(p, spec, args):
    """``(mode, local_dir)``: ``download`` (``--download``; or no local directory for a corpus that
    has its default one missing), else ``local`` with an absolute directory.  The long-document
    sets use their local directory (the shared data folder) in both modes.

    Raises:
        SystemExit: --download with --local-dir (other than for long documents), a local directory
        that is not one, a licensed corpus without its local directory."""
    kind, opt = spec["pipeline"], LOCAL_ALIAS.get(spec["pipeline"], "--local-dir")
    if args.local_dir and not os.path.isdir(args.local_dir):
        p.error(f"{opt} '{args.local_dir}' is not a directory")
    if kind == "long_documents":
        d = args.local_dir or (specs.SHARED_DATA if os.path.isdir(specs.SHARED_DATA) else None)
        d = d and os.path.abspath(d)
        if not args.download and not d:
            p.error(f"no data: {specs.SHARED_DATA} does not exist; pass --data-dir DIR (the shared data folder) "
                    "or --download")
        if not args.download and not os.path.isdir(os.path.join(d, "docmt_maruf2019_en_de")):
            p.error(f"--data-dir {d} has no docmt_maruf2019_en_de/ (the Maruf et al. dev/test files); pass the "
                    "shared data folder or use --download")
        return ("download" if args.download else "local"), d
    if args.download and args.local_dir:
        p.error(f"--download and {opt} exclude each other")
    if args.download:
        return "download", None
    if args.local_dir:
        return "local", os.path.abspath(args.local_dir)
    default = (spec.get("local") or {}).get("default_dir")
    if default and os.path.isdir(os.path.join(specs.SHARED_DATA, default)):
        return "local", os.path.normpath(os.path.join(specs.SHARED_DATA, default))
    if spec.get("licensed"):
        p.error(f"{spec['title']} is licensed and cannot be downloaded by this script.\n{spec['licensed'].strip()}\n"
                f"Then run: {spec['entry']} --local-dir DIR")
    return "download", None


def _inside(path, directory):
    """Whether ``path`` is ``directory`` or below it (symbolic links resolved)."""
    path, directory = os.path.realpath(path), os.path.realpath(directory)
    return path == directory or path.startswith(directory.rstrip(os.sep) + os.sep)


def check_overlap(p, spec, args, mode, local_dir):
    """Refuse an ``--out`` that overlaps an input directory (the local corpus directory or
    ``--train-dir``): the stages replace ``<out>/raw``, ``<out>/bin`` ... as a whole, so
    ``--raw-dir D/raw --out D`` would delete the upstream files (issue 29.2), and an ``--out``
    inside an input directory writes into the user's data.

    Raises:
        SystemExit: the message names both directories."""
    kind = spec["pipeline"]
    inputs = [(LOCAL_ALIAS.get(kind, "--local-dir"), local_dir)] if mode == "local" or kind == "long_documents" else []
    if getattr(args, "train_dir", None):
        inputs.append(("--train-dir", args.train_dir))
    for opt, d in inputs:
        if d and (_inside(d, args.out) or _inside(args.out, d)):
            p.error(f"--out {args.out} overlaps the input directory {opt} {d}: the preparation would write into (or "
                    f"replace) the input files; use an --out outside {d} (e.g. the default "
                    f"data-bin/<corpus>)")


def check_python(p, dry):
    """Stop (a dry run: warn) when this interpreter lacks sacremoses, subword_nmt or fairseq."""
    missing = missing_base_modules()
    if missing:
        msg = (f"'{sys.executable}' cannot import {', '.join(missing)}; activate the venv (. .venv/bin/activate) "
               "or set PYTHON=/path/to/python")
        if not dry:
            p.error(msg)
        print(f"[{p.tag}] WARNING: {msg}", file=sys.stderr)


def main(argv=None):
    """The ``mt-prep`` command; returns the exit status (a bad option exits with status 1)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "--list"):
        if argv and argv[0] == "--list":
            print("\n".join(specs.list_corpora()))
            return 0
        print(__doc__.strip() + "\n\ncorpora: " + ", ".join(specs.list_corpora()))
        return 0 if argv else 1
    try:
        spec = specs.load_spec(argv[0])
    except SystemExit as err:
        print(f"[mt-prep] ERROR: {err}", file=sys.stderr)
        return 1
    p, args = parse_args(spec, argv[1:])
    mode, local_dir = resolve_inputs(p, spec, args)
    check_overlap(p, spec, args, mode, local_dir)
    if not args.dry_run and writable_problem(args.out):
        p.error(f"--out {args.out}: {writable_problem(args.out)}")
    check_python(p, args.dry_run)
    try:
        PIPELINES[spec["pipeline"]].main(spec, args, mode, local_dir)
    except StopAfter as stop:
        print(f"[{p.tag}] stopped after stage {stop.stage} (--until {stop.stage}); the later stages did not run"
              + ("" if args.dry_run else "; without --until a run goes on from here") + ". Stage directory:")
        print(stop.directory)
    return 0


if __name__ == "__main__":
    sys.exit(main())
