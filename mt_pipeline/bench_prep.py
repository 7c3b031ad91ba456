#!/usr/bin/env python
"""Data-preparation memory vs corpus size: the peak memory of ``mt-prep`` per stage at two or more
corpus sizes, measured in the same run.

The claim it checks (docs/pipeline.md, "Data-prep"): raw, tok, tc and bpe stream their corpora in
chunks over ``--workers`` processes and truecasers / BPE are learned from counts, "so memory is
bounded by the chunk size times the workers (and the vocabulary), not by the corpus" -- what lets
the WMT recipes (4.5M pairs for WMT14 En-De, 36M for En-Fr) run on a workstation.

What this measures (a benchmark: it prints and writes numbers, it asserts nothing):

* **corpus**: the real Tatoeba De-En pairs of ``../shared/data`` (``--corpus``, 169,813 pairs; the
  first ``--base-lines`` of them when given) concatenated ``k`` times for each ``k`` of ``--sizes``
  (default ``1,4``).  Repetition keeps the vocabulary fixed, so a change in memory between sizes is
  what the number of lines costs -- the term the claim says is absent -- not a larger vocabulary
  (which the claim allows for);
* **pipeline**: ``mt-prep wmt14_en_de --truecase --workers W`` (``python -m mt_pipeline.prep``: the
  WMT14 En-De recipe -- normalize-punct, Moses tokenisation ``-a``, clean-corpus-n, Moses
  truecasers learned and applied, joint BPE learned and applied, fairseq-preprocess) on a fresh
  local directory per size holding that corpus as ``plain/train.de-en.{de,en}.gz`` and the real
  newstest2013 / newstest2014 of ``../shared/data/wmt`` as valid / test (the recipe's local layout);
* **memory** (:class:`TreeSampler`): every ``--interval`` seconds the proportional set size (PSS,
  ``/proc/PID/smaps_rollup``: a page shared by ``n`` processes counts ``1/n`` to each, so forked
  workers are not counted twice) and the resident set size (RSS) summed over every process of the
  ``mt-prep`` session (the CLI, its worker pools, subword-nmt, fairseq-preprocess and its workers);
  per stage (raw, tok, tc, bpe, bin: the interval up to the stage's ``done`` line) the peak of those
  sums and of the largest one process's RSS; over the whole run also the largest peak RSS of any one
  process (its ``VmHWM``: exact between samples).  A peak shorter than the interval can be missed by
  the sampled figures (not by ``VmHWM``).  Linux only (``/proc``).

Per stage the page shows each size's peak and the change per million extra pairs between the
smallest and the largest size (MiB / M pairs): about 0 where memory does not grow with the corpus.
The CLI process itself imports torch and fairseq (through :mod:`mt_pipeline.atomic`), a constant of
a few hundred MiB in every stage's PSS.

Output: ``--out`` (Markdown, atomically; default ``results/pipeline/prep_memory_cpu.md``), the JSON
record beside it (``.json``: per size and stage the peaks, the stage times and a 1-second timeline)
and the plot (``.png``: the session's PSS over time per size, stage ends marked).  The work
directory (``--work-dir``, default a fresh temporary one) holds the corpora and the prepared data; it
is removed at the end unless ``--keep``.

Usage:  mt-bench-prep [--sizes 1,4] [--base-lines N] [--workers 2] [--bpe-merges N]
            [--interval 0.2] [--work-dir DIR] [--keep] [--out results/pipeline/prep_memory_cpu.md]
"""

import argparse
import gzip
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from typing import Dict, List, Optional, Sequence, Tuple

from . import provenance
from .atomic import write_json_atomic, write_text_atomic, writable_problem
from .prep import spec as prep_spec

ROOT = provenance.ROOT
PROG = "mt-bench-prep"
CORPUS = "wmt14_en_de"
#: the stages of ``mt-prep wmt14_en_de --truecase``, in order
STAGES = ("raw", "tok", "tc", "bpe", "bin")
LANGS = ("de", "en")
DEFAULT_CORPUS = os.path.join(prep_spec.SHARED_DATA, "tatoeba_manythings_deu_eng_2018", "tatoeba.{lang}.gz")
WMT = os.path.join(prep_spec.SHARED_DATA, "wmt")
#: the valid / test files of the recipe's local layout (relative to a local directory and to ``WMT``)
HELD_OUT = tuple(f"plain/newstest2013.de-en.{lang}.gz" for lang in LANGS) + tuple(
    f"sgm/newstest2014-deen-{side}.{lang}.sgm.gz" for side in ("src", "ref") for lang in LANGS)
DEFAULT_OUT = os.path.join(ROOT, "results", "pipeline", "prep_memory_cpu.md")
MIB = 1024.0
_STAGE_END = re.compile(r"^\[[^\]]+\] (" + "|".join(STAGES) + r"): (done|up to date)")


# ---- measuring a process tree ---------------------------------------------------------------

def session_pids(sid: int) -> List[int]:
    """The PIDs of every live process whose session id is ``sid`` (``/proc/PID/stat`` field 6): a
    process started with ``start_new_session=True`` and everything it starts."""
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                stat = f.read()
        except OSError:
            continue  # exited meanwhile
        fields = stat[stat.rindex(")") + 2:].split()  # after "pid (comm) "; comm may hold spaces
        if int(fields[3]) == sid:
            out.append(int(name))
    return out


def process_memory(pid: int) -> Optional[Tuple[int, int, int]]:
    """``(pss, rss, hwm)`` of process ``pid`` in KiB -- proportional and resident set size
    (``/proc/PID/smaps_rollup``) and peak resident set size (``VmHWM``, ``/proc/PID/status``) --
    or None when it has exited."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            roll = f.read()
        with open(f"/proc/{pid}/status") as f:
            status = f.read()
    except OSError:
        return None

    def field(text, key):
        m = re.search(rf"^{key}:\s+(\d+) kB", text, re.M)
        return int(m.group(1)) if m else 0

    return field(roll, "Pss"), field(roll, "Rss"), field(status, "VmHWM")


class TreeSampler(threading.Thread):
    """Samples the memory of a process session in a background thread.

    Every ``interval`` seconds: the PSS and RSS (KiB) summed over the session's live processes
    (:func:`session_pids`, :func:`process_memory`) and the largest one process's RSS, appended to
    :attr:`samples` as ``(seconds since start, pss_kib, rss_kib, processes, largest_rss_kib)``; and
    each process's ``VmHWM`` (KiB, its peak RSS so far), kept in :attr:`hwm` by PID.  :meth:`stop`
    ends the thread after one last sample.
    """

    def __init__(self, sid: int, interval: float = 0.2):
        super().__init__(daemon=True)
        self.sid, self.interval = sid, interval
        self.t0 = time.monotonic()
        self.samples: List[Tuple[float, int, int, int, int]] = []
        self.hwm: Dict[int, int] = {}  # pid -> the largest VmHWM (KiB) read
        self._halt = threading.Event()

    def sample(self) -> None:
        """Take one sample now."""
        t = time.monotonic() - self.t0
        pss = rss = n = largest = 0
        for pid in session_pids(self.sid):
            mem = process_memory(pid)
            if mem is None:
                continue
            pss, rss, n, largest = pss + mem[0], rss + mem[1], n + 1, max(largest, mem[1])
            self.hwm[pid] = max(self.hwm.get(pid, 0), mem[2])  # 0 once it is a zombie
        self.samples.append((round(t, 3), pss, rss, n, largest))

    def run(self) -> None:
        while not self._halt.wait(self.interval):
            self.sample()

    def stop(self) -> None:
        """Stop sampling (after one last sample) and wait for the thread."""
        self._halt.set()
        self.join()
        self.sample()


def stage_peaks(samples: Sequence[Tuple[float, int, int, int, int]],
                ends: Dict[str, float]) -> Dict[str, Dict[str, float]]:
    """Per stage, the peaks of the sampled figures.

    Args:
        samples: :attr:`TreeSampler.samples`.
        ends: stage name -> the time (seconds, the sampler's clock) of its ``done`` line; a stage
            runs from the previous stage's end (0 for the first) to its own.

    Returns:
        ``{stage: {"start_s", "end_s", "peak_pss_mib", "peak_rss_mib", "largest_process_rss_mib",
        "max_processes"}}`` in the order of ``ends``: a stage's samples are those after the previous
        end up to its own (the last one before its end when none is); 0 when there is none.

    Raises:
        ValueError: the end times are not increasing.
    """
    out, start = {}, 0.0
    for stage, end in sorted(ends.items(), key=lambda kv: kv[1]):
        if end < start:
            raise ValueError(f"stage {stage} ends at {end}, before the previous one ({start})")
        inside = [s for s in samples if start < s[0] <= end] or [s for s in samples if s[0] <= end][-1:]
        out[stage] = {"start_s": round(start, 1), "end_s": round(end, 1),
                      "peak_pss_mib": round(max((s[1] for s in inside), default=0) / MIB, 1),
                      "peak_rss_mib": round(max((s[2] for s in inside), default=0) / MIB, 1),
                      "largest_process_rss_mib": round(max((s[4] for s in inside), default=0) / MIB, 1),
                      "max_processes": max((s[3] for s in inside), default=0)}
        start = end
    return out


def timeline(samples: Sequence[Tuple[float, int, int, int, int]], step: float = 1.0) -> List[Tuple[float, float]]:
    """``(seconds, peak PSS MiB)`` per ``step`` seconds of ``samples`` (the JSON's and the plot's
    curve: the peak of each step, so no spike is averaged away)."""
    buckets: Dict[int, int] = {}
    for t, pss, *_ in samples:
        b = int(t // step)
        buckets[b] = max(buckets.get(b, 0), pss)
    return [(round(b * step, 1), round(v / MIB, 1)) for b, v in sorted(buckets.items())]


# ---- one size --------------------------------------------------------------------------------

def read_pairs(pattern: str, base_lines: Optional[int]) -> Dict[str, List[bytes]]:
    """The lines (bytes, with their newlines) of the parallel corpus ``pattern`` (``{lang}`` for
    each of :data:`LANGS`; gzip), the first ``base_lines`` pairs when given.

    Raises:
        SystemExit: a file is missing or the sides have different lengths (names the files)."""
    sides = {}
    for lang in LANGS:
        path = pattern.format(lang=lang)
        if not os.path.isfile(path):
            raise SystemExit(f"{PROG}: --corpus {pattern}: {path} is missing")
        with gzip.open(path, "rb") as f:
            sides[lang] = [line if line.endswith(b"\n") else line + b"\n" for line in f]
        if base_lines:
            sides[lang] = sides[lang][:base_lines]
    n = {lang: len(v) for lang, v in sides.items()}
    if len(set(n.values())) != 1:
        raise SystemExit(f"{PROG}: --corpus {pattern}: the sides differ in length ({n})")
    return sides


def make_local_dir(d: str, sides: Dict[str, List[bytes]], copies: int) -> int:
    """Write the recipe's local layout into ``d``: ``plain/train.de-en.LANG.gz`` = ``sides``
    ``copies`` times, and links to the real held-out files of ``../shared/data/wmt``
    (:data:`HELD_OUT`).  Returns the number of training pairs."""
    os.makedirs(os.path.join(d, "plain"), exist_ok=True)
    os.makedirs(os.path.join(d, "sgm"), exist_ok=True)
    for lang, lines in sides.items():
        with gzip.open(os.path.join(d, "plain", f"train.de-en.{lang}.gz"), "wb", compresslevel=1) as f:
            for _ in range(copies):
                f.writelines(lines)
    for rel in HELD_OUT:
        os.symlink(os.path.join(WMT, rel), os.path.join(d, rel))
    return copies * len(next(iter(sides.values())))


def prep_command(local_dir: str, out: str, workers: int, bpe_merges: Optional[int]) -> List[str]:
    """The measured command: ``python -m mt_pipeline.prep wmt14_en_de --truecase ...``."""
    cmd = [sys.executable, "-m", "mt_pipeline.prep", CORPUS, "--local-dir", local_dir, "--out", out,
           "--truecase", "--workers", str(workers)]
    return cmd + (["--bpe-merges", str(bpe_merges)] if bpe_merges else [])


def measure_size(cmd: List[str], log_path: str, interval: float) -> Dict[str, object]:
    """Run ``cmd`` in its own session, sampling its memory (:class:`TreeSampler`) and timing the
    stage lines of its output (kept in ``log_path``).

    Returns:
        ``{"wall_s", "stages": stage_peaks(...), "overall": {the peaks over the run, and
        "max_process_hwm_mib": the largest VmHWM of one process}, "samples", "timeline"}``.

    Raises:
        SystemExit: the command failed or a stage never ended (names the log and shows its tail).
    """
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    with open(log_path, "w", encoding="utf-8") as log:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, start_new_session=True)
        sampler = TreeSampler(proc.pid, interval)
        sampler.start()
        ends: Dict[str, float] = {}
        try:
            for line in proc.stdout:
                log.write(line)
                m = _STAGE_END.match(line)
                if m:
                    ends[m.group(1)] = time.monotonic() - sampler.t0
            rc = proc.wait()
        except BaseException:  # Ctrl-C / a kill reaches this process only: stop its own session too
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait()
            raise
        finally:
            sampler.stop()
    wall = time.monotonic() - sampler.t0
    missing = [s for s in STAGES if s not in ends]
    if rc or missing:
        with open(log_path, encoding="utf-8") as f:
            tail = "".join(f.readlines()[-15:])
        why = f"exit status {rc}" if rc else f"no end line for stage(s) {', '.join(missing)}"
        raise SystemExit(f"{PROG}: {' '.join(cmd)}: {why}; log {log_path}:\n{tail}")
    stages = stage_peaks(sampler.samples, ends)
    overall = {k: max(s[k] for s in stages.values())
               for k in ("peak_pss_mib", "peak_rss_mib", "largest_process_rss_mib", "max_processes")}
    overall["max_process_hwm_mib"] = round(max(sampler.hwm.values(), default=0) / MIB, 1)
    return {"wall_s": round(wall, 1), "stages": stages, "overall": overall,
            "samples": len(sampler.samples), "timeline": timeline(sampler.samples)}


# ---- the page --------------------------------------------------------------------------------

def growth_per_million(runs: List[dict], key: str, stage: Optional[str] = None) -> float:
    """MiB per million extra training pairs between the smallest and the largest size of ``runs``
    (``key`` of a stage's peaks, or of the overall peaks when ``stage`` is None)."""
    a, b = runs[0], runs[-1]
    va = (a["stages"][stage] if stage else a["overall"])[key]
    vb = (b["stages"][stage] if stage else b["overall"])[key]
    return (vb - va) / ((b["pairs"] - a["pairs"]) / 1e6)


def render(runs: List[dict], record: dict) -> str:
    """The Markdown page: regime, what was run, per stage the peaks of every size and the growth
    per million pairs, and the provenance section (``record``: :func:`provenance.collect`)."""
    sizes = " | ".join(f"{r['copies']}× ({r['pairs']:,} pairs)" for r in runs)
    lines = [
        "# Data preparation: peak memory vs corpus size (`mt-prep`)", "",
        "**Regime: benchmark** (CPU; memory, not translation quality; neither smoke, converged nor paper "
        "scale; no seeds). Regenerate: `mt-bench-prep` (command below).", "",
        "Claim checked (docs/pipeline.md, Data-prep): the text stages stream in chunks over `--workers` "
        "processes and truecasers / BPE are learned from counts, \"so memory is bounded by the chunk size "
        "times the workers (and the vocabulary), not by the corpus\".", "",
        f"Corpus: Tatoeba De-En ({runs[0]['pairs'] // runs[0]['copies']:,} real pairs) concatenated k times "
        "(same vocabulary at every size), prepared by `mt-prep wmt14_en_de --truecase` (WMT14 En-De recipe: "
        "normalize-punct, Moses tok -a, clean-corpus-n, truecasing, joint BPE, fairseq-preprocess) with "
        "newstest2013 / newstest2014 as valid / test. Memory: PSS (shared pages split between the processes "
        "sharing them) and RSS summed over every process of the mt-prep session, sampled every "
        f"{record['sampling_interval_s']} s.", "",
        "## Peak PSS of the whole session per stage (MiB)", "",
        f"| stage | {sizes} | change per 1M extra pairs |",
        "|---|" + "---:|" * (len(runs) + 1)]
    for stage in STAGES:
        cells = " | ".join(f"{r['stages'][stage]['peak_pss_mib']:.0f}" for r in runs)
        lines.append(f"| {stage} | {cells} | {growth_per_million(runs, 'peak_pss_mib', stage):+.0f} |")
    cells = " | ".join(f"**{r['overall']['peak_pss_mib']:.0f}**" for r in runs)
    lines.append(f"| **whole run** | {cells} | **{growth_per_million(runs, 'peak_pss_mib'):+.0f}** |")
    lines += ["", "## Largest single process, summed RSS (MiB), processes, time", "",
              f"| stage | {sizes} |", "|---|" + "---:|" * len(runs)]
    for stage in STAGES:
        cells = " | ".join(f"{s['largest_process_rss_mib']:.0f} / {s['peak_rss_mib']:.0f} / {s['max_processes']} / "
                           f"{s['end_s'] - s['start_s']:.0f} s" for s in (r["stages"][stage] for r in runs))
        lines.append(f"| {stage} | {cells} |")
    cells = " | ".join(f"{r['overall']['max_process_hwm_mib']:.0f}" for r in runs)
    lines += [f"| largest VmHWM (peak RSS) read from one process | {cells} |", "",
              "Each stage cell: largest one process's RSS / summed RSS (sampled peaks) / most processes at once / "
              "stage wall time (wall times on a shared machine: not a speed measurement).", "",
              "The CLI process imports torch and fairseq (through `mt_pipeline.atomic`): a constant part of every "
              "stage's memory. Forked workers share its pages, which PSS splits and RSS counts once per process.",
              "", provenance.markdown(record)]
    return "\n".join(lines) + "\n"


def plot(runs: List[dict], path: str) -> str:
    """PNG of the session's PSS over time for each size, stage ends marked; written atomically
    (matplotlib, Agg backend).  Returns ``path``."""
    from fairseq_plugins.analysis.plots import pyplot, save_png

    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 3.8))
    for n, r in enumerate(runs):
        xs, ys = zip(*r["timeline"]) if r["timeline"] else ((), ())
        ax.plot(xs, ys, color=f"C{n}", label=f"{r['copies']}× ({r['pairs']:,} pairs)", linewidth=1)
        for stage, s in r["stages"].items():
            ax.axvline(s["end_s"], color=f"C{n}", alpha=0.3, linewidth=0.8)
            ax.annotate(stage, (s["end_s"], 0), fontsize=6, color=f"C{n}", rotation=90, va="bottom", ha="right")
    ax.set_xlabel("seconds since mt-prep started")
    ax.set_ylabel("PSS of the mt-prep session (MiB)")
    ax.set_title("mt-prep wmt14_en_de --truecase: memory over time per corpus size", fontsize=9)
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    return save_png(fig, path, dpi=120, tight=False)


# ---- command line ----------------------------------------------------------------------------

def parse_sizes(text: str) -> List[int]:
    """``"1,4"`` -> ``[1, 4]``: at least two distinct positive multiples, increasing.

    Raises:
        ValueError: anything else (the message says what is valid)."""
    try:
        sizes = [int(x) for x in text.split(",")]
    except ValueError:
        raise ValueError(f"--sizes {text!r}: give comma-separated positive integers, e.g. 1,4") from None
    if len(sizes) < 2 or any(k < 1 for k in sizes) or sizes != sorted(set(sizes)):
        raise ValueError(f"--sizes {text!r}: give at least two increasing positive multiples, e.g. 1,4")
    return sizes


def parse_args(argv=None):
    """The parsed options; every bad value stops here, before any work (names the valid ones)."""
    p = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", default="1,4", help="multiples of the corpus to prepare (default 1,4)")
    p.add_argument("--corpus", default=DEFAULT_CORPUS,
                   help="parallel corpus, '{lang}' for de / en, gzip (default: Tatoeba De-En of ../shared/data)")
    p.add_argument("--base-lines", type=int, help="use only the first N pairs of --corpus")
    p.add_argument("--workers", type=int, default=2, help="mt-prep --workers (default 2)")
    p.add_argument("--bpe-merges", type=int, help="mt-prep --bpe-merges (default: the recipe's, 32000)")
    p.add_argument("--interval", type=float, default=0.2, help="seconds between memory samples (default 0.2)")
    p.add_argument("--work-dir", help="where the corpora and prepared data go (default: a new temporary directory)")
    p.add_argument("--keep", action="store_true", help="keep the work directory")
    p.add_argument("--out", default=DEFAULT_OUT, help="Markdown page (the .json and .png go beside it)")
    a = p.parse_args(argv)
    try:
        a.sizes = parse_sizes(a.sizes)
    except ValueError as err:
        p.error(str(err))
    for name, value, low in (("--base-lines", a.base_lines, 1), ("--workers", a.workers, 1),
                             ("--bpe-merges", a.bpe_merges, 1)):
        if value is not None and value < low:
            p.error(f"{name} {value}: must be >= {low}")
    if not 0.01 <= a.interval <= 10:
        p.error(f"--interval {a.interval}: choose 0.01..10 seconds")
    if not os.path.isfile("/proc/self/smaps_rollup"):
        p.error("needs Linux's /proc/PID/smaps_rollup (kernel >= 4.14) to measure memory")
    for rel in HELD_OUT:
        if not os.path.isfile(os.path.join(WMT, rel)):
            p.error(f"the held-out file {os.path.join(WMT, rel)} is missing (../shared/data/wmt)")
    if not a.out.endswith(".md"):
        p.error(f"--out {a.out}: give a .md path (the .json and .png go beside it)")
    problem = writable_problem(a.out, is_dir=False)
    if problem:
        p.error(f"--out {a.out}: {problem}")
    if a.work_dir:
        if os.path.exists(a.work_dir) and os.listdir(a.work_dir):
            p.error(f"--work-dir {a.work_dir}: not empty (this tool removes only what it wrote: give a new "
                    "or empty directory)")
        problem = writable_problem(a.work_dir)
        if problem:
            p.error(f"--work-dir {a.work_dir}: {problem}")
    return a


def main(argv=None):
    """``mt-bench-prep``: see the module docstring.  Returns 0."""
    a = parse_args(argv)
    argv = sys.argv[1:] if argv is None else list(argv)
    t_start, load_start = time.time(), provenance.load_average()
    sides = read_pairs(a.corpus, a.base_lines)
    made = a.work_dir is None or not os.path.exists(a.work_dir)
    work = os.path.abspath(a.work_dir or tempfile.mkdtemp(prefix="mt-bench-prep."))
    os.makedirs(work, exist_ok=True)
    runs = []
    try:
        for k in a.sizes:
            local, out = os.path.join(work, f"x{k}", "local"), os.path.join(work, f"x{k}", "out")
            pairs = make_local_dir(local, sides, k)
            cmd = prep_command(local, out, a.workers, a.bpe_merges)
            print(f"[bench] {k}x: {pairs:,} training pairs: {' '.join(cmd[1:])}", flush=True)
            run = measure_size(cmd, os.path.join(work, f"x{k}", "prep.log"), a.interval)
            run.update(copies=k, pairs=pairs)
            runs.append(run)
            print(f"[bench] {k}x: peak PSS {run['overall']['peak_pss_mib']:.0f} MiB, largest process "
                  f"{run['overall']['max_process_hwm_mib']:.0f} MiB, {run['wall_s']:.0f} s", flush=True)
    finally:
        if not a.keep:  # only what this run wrote
            for k in a.sizes:
                shutil.rmtree(os.path.join(work, f"x{k}"), ignore_errors=True)
            if made:
                shutil.rmtree(work, ignore_errors=True)
    corpus = a.corpus
    record = provenance.collect(
        provenance.command_line(PROG, argv), regime="benchmark",
        data={"corpus": {lang: provenance.shown_path(corpus.format(lang=lang)) for lang in LANGS},
              "corpus_sha256": {lang: provenance.file_sha256(corpus.format(lang=lang)) for lang in LANGS},
              "base_pairs": len(sides["de"]), "held_out": [f"../shared/data/wmt/{rel}" for rel in HELD_OUT]},
        prep_command=" ".join(["mt-prep"] + prep_command("LOCAL", "OUT", a.workers, a.bpe_merges)[3:]),
        sampling_interval_s=a.interval, wall_s=round(time.time() - t_start, 1),
        load_average_1_5_15_min={"start": load_start, "end": provenance.load_average(), "cores": os.cpu_count()})
    text = render(runs, record)
    base = os.path.splitext(a.out)[0]
    plot(runs, base + ".png")
    write_json_atomic(base + ".json", {"provenance": record, "runs": runs})
    write_text_atomic(a.out, text)  # the page last: it appears only once the plot and the JSON are complete
    print(text)
    print(f"[bench] wrote {a.out}, {base}.json and {base}.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
