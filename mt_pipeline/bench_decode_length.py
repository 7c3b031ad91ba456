#!/usr/bin/env python
"""ReLA Figure 2: decoding speed vs source length, relative to stock fairseq, on CPU (default) or
on a GPU (``--device cuda [--dtype bf16]``, the paper's setting).

Paper (Zhang, Titov & Sennrich 2021, *Sparse Attention with Linear Units*, Figure 2 and §5.1
"Efficiency Analysis"): "Decoding speedup as source length increases on WMT14 En-De. We divide the
newstest2014 testset into 10 disjoint groups uniformly according to source length. Results are
averaged over 3 runs." -- "ReLA translates slightly slower than Baseline but at least 1.8 times
faster than sparsemax and 1.5-entmax."  (Table 2's ΔDecode is the same speedup at batch size 1.)

What this measures (a benchmark: it prints and writes numbers, it asserts nothing):

* **sources**: the real newstest2014 English side (``--source``, default
  ``../shared/data/wmt/plain/newstest2014.de-en.en.gz``, 3,003 lines) preprocessed exactly as the
  Multi30k models' inputs -- the Multi30k recipe's sacremoses tokenisation
  (:func:`mt_pipeline.prep.tok.tokenize_lines` with ``data-prep/multi30k/corpus.yaml``'s recipe),
  the Multi30k joint BPE codes (:func:`mt_pipeline.prep.bpe.apply_bpe_lines`) -- and encoded with the
  source dictionary of ``data-bin/multi30k_en_de/bin`` (words outside it become ``<unk>``);
* **groups** (:func:`length_groups`): the sentences sorted by source length in BPE tokens and cut
  into ``--groups`` disjoint groups of equal size (±1): deciles by default.  This is our reading
  of "10 disjoint groups uniformly according to source length" (equal counts, not equal length
  intervals).  ``--sents-per-group`` sentences of each group, evenly spaced within it
  (:func:`pick_evenly`), are decoded;
* **models** (``--models``, default the four curves of Figure 2): the (arch, attention function)
  pairs of :data:`mt_pipeline.bench_speed.MODELS`, untrained ``*_small`` models (``--size base``:
  Transformer base, the paper's size; :data:`mt_pipeline.bench_speed.SIZES`) built by
  :func:`mt_pipeline.bench_speed.build_models` (speed does not depend on the trained values: every
  op of these models -- dense matmuls, ReLU, sort-based sparsemax / 1.5-entmax, beam top-k -- costs
  the same for any values, and the step count is forced);
* **decoding**: beam ``--beam`` (4), batch 1, every sentence decoded with exactly as many steps as
  its source has BPE tokens (``min_len = max_len``, :func:`mt_pipeline.bench_speed.time_decoding`),
  so every model does the same work and the target length grows with the source as in
  translation.  One untimed warm-up decode per model; then ``--rounds`` rounds, each visiting every
  group and, within it, every model (the model order rotated by one per round), so that drift of
  the machine hits all models alike.  Per group and model: the median over rounds of sentences/s
  (sentences divided by the summed decode time); ratios of medians measured in the same run.

* **device** (``--device``, ``--dtype``): on ``cuda`` the models are converted to ``--dtype`` as
  ``fairseq-generate --bf16`` / ``--fp16`` do, the samples are moved to the GPU before each timer
  starts, and each timer brackets synchronised work (``torch.cuda.synchronize``).  At batch 1 a
  GPU decoding step is mostly launch overhead: that is the setting the paper measured.

Output: ``--out`` (Markdown, atomically; default ``results/rela/figure2_decode_length_cpu.md``,
on cuda ``results/gpu/rela_figure2_decode_length_<gpu>_<dtype>.md``) and the plot beside it
(``.png``: speed relative to the stock model over the group's mean source length, the shape of
the paper's figure).

Usage:  mt-bench-decode-length [--groups 10] [--sents-per-group 8] [--rounds 3] [--beam 4]
            [--models LABEL ...] [--source FILE] [--device cpu|cuda] [--dtype fp32|bf16|fp16]
            [--out results/rela/figure2_decode_length_cpu.md]
"""

import argparse
import os
import statistics
import sys
import time
from typing import Dict, List, Sequence, Tuple

from . import provenance
from .atomic import atomic_path, writable_problem
from .bench_speed import (DEVICES, DTYPES, MODELS, SIZES, arch_of, build_models, device_problem, gpu_slug,
                          size_suffix, time_decoding)
from .prep import spec as prep_spec
from .prep.multi30k import TOKENIZER

ROOT = provenance.ROOT
PROG = "mt-bench-decode-length"
#: the reference every ratio is taken against (ReLA's "Baseline")
BASELINE = "stock transformer (fairseq)"
#: ReLA-g and the two models the paper says it beats by "at least 1.8 times"
RELA, RIVALS = "ReLA-g", ("sparsemax", "1.5-entmax")
#: the curves of ReLA Figure 2 (labels of bench_speed.MODELS)
FIGURE2_MODELS = (BASELINE, RELA) + RIVALS
DEFAULT_SOURCE = os.path.join(prep_spec.SHARED_DATA, "wmt", "plain", "newstest2014.de-en.en.gz")
DEFAULT_DATA = os.path.join(ROOT, "data-bin", "multi30k_en_de")
DEFAULT_OUT = os.path.join(ROOT, "results", "rela", "figure2_decode_length_cpu.md")


def size_words(size: str = "small") -> str:
    """How the page names the models of ``--size size``: ``untrained `*_small` models``."""
    return "untrained `*_small` models" if size == "small" else f"untrained {size}-size models"


def regime_line(where: str, size: str = "small") -> str:
    """The page's regime line; ``where``: ``"CPU"`` or the GPU's name and dtype; ``size``: ``--size``."""
    setting = ("not the paper's GPU/TensorFlow setting" if where == "CPU" else
               "the paper's GPU setting, not its TensorFlow models")
    return (f"**Regime: benchmark** ({where}, {size_words(size)}, Multi30k BPE and vocabulary; {setting}): "
            "neither smoke, converged nor paper scale; no translation quality, no seeds")


PAPER_CLAIM = ("\"Curves in Figure 2 show consistent efficiency trend across different lengths: ReLA translates "
               "slightly slower than Baseline but at least 1.8 times faster than sparsemax and 1.5-entmax.\" "
               "(ReLA §5.1; Figure 2: \"Decoding speedup as source length increases on WMT14 En-De. We divide the "
               "newstest2014 testset into 10 disjoint groups uniformly according to source length. Results are "
               "averaged over 3 runs.\")")


# ---- sources ---------------------------------------------------------------------------------

def read_source(path: str) -> List[str]:
    """The lines of the raw source file ``path`` (UTF-8, ``.gz`` decompressed:
    :func:`mt_pipeline.prep.fetch.read_content`), split on ``\\n`` only as the data preparation
    reads text, without newlines.

    Raises:
        SystemExit: the file cannot be read or is not UTF-8 text (names the file)."""
    from .prep.fetch import read_content

    try:
        text = read_content(path).decode("utf-8")
    except (OSError, EOFError) as err:
        raise SystemExit(f"{PROG}: cannot read --source {path}: {err}") from None
    except UnicodeDecodeError as err:
        raise SystemExit(f"{PROG}: --source {path} is not UTF-8 text (byte {err.start})") from None
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()  # the end of the last line, not a line
    return lines


def multi30k_recipe() -> dict:
    """The tokenisation recipe of the Multi30k models' data (``data-prep/multi30k/corpus.yaml``)."""
    return prep_spec.load_spec("multi30k")["recipe"]


def preprocess(lines: Sequence[str], codes: str, lang: str = "en") -> List[str]:
    """Raw ``lines`` of language ``lang`` as the Multi30k models read them: tokenised by the
    Multi30k recipe (:func:`mt_pipeline.prep.tok.tokenize_lines`) and segmented with the BPE codes
    file ``codes`` (:func:`mt_pipeline.prep.bpe.apply_bpe_lines`).  One output line (space-separated
    BPE tokens) per input line.

    Raises:
        SystemExit: a bad codes file."""
    from .prep import bpe, tok

    return bpe.apply_bpe_lines(tok.tokenize_lines(list(lines), lang, multi30k_recipe()), codes)


# ---- groups ----------------------------------------------------------------------------------

def length_groups(lengths: Sequence[int], n_groups: int) -> List[List[int]]:
    """Cut sentences into ``n_groups`` disjoint groups of equal size by length.

    Args:
        lengths: the source length (BPE tokens) of sentence ``i`` at index ``i``.
        n_groups: number of groups, 1 <= n_groups <= len(lengths).

    Returns:
        ``n_groups`` lists of sentence indices that together cover ``range(len(lengths))`` once:
        the indices sorted by ``(length, index)`` (ties in file order, so the result is
        deterministic) and cut into consecutive runs whose sizes differ by at most one (the first
        ``len % n_groups`` groups have one more).  Each group is in that sorted order; group ``g``'s
        lengths are all <= group ``g + 1``'s.

    Raises:
        ValueError: ``n_groups`` out of range.
    """
    n = len(lengths)
    if not 1 <= n_groups <= n:
        raise ValueError(f"n_groups must be between 1 and the number of sentences ({n}), got {n_groups}")
    order = sorted(range(n), key=lambda i: (lengths[i], i))
    base, extra = divmod(n, n_groups)
    groups, start = [], 0
    for g in range(n_groups):
        size = base + (1 if g < extra else 0)
        groups.append(order[start:start + size])
        start += size
    return groups


def pick_evenly(group: Sequence[int], k: int) -> List[int]:
    """``k`` members of ``group`` evenly spaced through it: the middle member of each of ``k``
    equal slices (positions ``floor((j + 0.5) * len / k)``, ``j = 0..k-1``), in group order.

    Raises:
        ValueError: ``k < 1`` or ``k > len(group)``."""
    if not 1 <= k <= len(group):
        raise ValueError(f"cannot pick {k} of a group of {len(group)} sentences")
    return [group[int((j + 0.5) * len(group) / k)] for j in range(k)]


# ---- decoding --------------------------------------------------------------------------------

def encode_samples(task, bpe_lines: Sequence[str], ids: Sequence[int]):
    """Batch-1 fairseq samples of the sentences ``ids`` of ``bpe_lines``, encoded with the task's
    source dictionary (``encode_line(..., add_if_not_exist=False)``: unknown words -> ``<unk>``,
    EOS appended) and collated as fairseq-interactive does (``build_dataset_for_inference``).

    Returns:
        ``(samples, steps, unks)``: ``samples[i]`` the sample of ``ids[i]`` (``src_tokens`` of
        shape ``(1, L_i + 1)``), ``steps[i] = L_i`` its number of BPE tokens (the forced decoding
        steps), ``unks`` the number of ``<unk>`` tokens among them."""
    d = task.source_dictionary
    samples, steps, unks = [], [], 0
    for i in ids:
        tokens = d.encode_line(bpe_lines[i], add_if_not_exist=False, append_eos=True).long()
        unks += int((tokens == d.unk()).sum())
        ds = task.build_dataset_for_inference([tokens], [tokens.numel()])
        samples.append(ds.collater([ds[0]]))
        steps.append(tokens.numel() - 1)
    return samples, steps, unks


def decode_seconds(model, task, samples, steps, beam: int) -> float:
    """Seconds to decode ``samples`` one by one (batch 1, beam ``beam``), sample ``i`` with
    exactly ``steps[i]`` steps (timed by :func:`mt_pipeline.bench_speed.time_decoding`, which
    builds the generator outside its timer and returns sentences/s)."""
    return sum(1.0 / time_decoding(model, task, [s], beam, n) for s, n in zip(samples, steps))


def measure(models: Dict[str, object], task, groups: List[Tuple[list, list]], beam: int, rounds: int,
            log=lambda msg: print(msg, flush=True)) -> Dict[str, List[List[float]]]:
    """Decoding speed of every model on every group, interleaved.

    Args:
        models: label -> fairseq model (eval mode is set by the timer).
        groups: per group ``(samples, steps)`` (:func:`encode_samples`).
        rounds: rounds; in each, every group and within it every model (order rotated per round).
        log: called with one progress line per round and group.

    Returns:
        ``{label: [[sents/s of group g in round r for r] for g]}`` (sentences per second)."""
    import torch

    labels = list(models)
    for label in labels:  # untimed warm-up: allocations and lazy initialisation
        time_decoding(models[label], task, groups[0][0][:1], beam, groups[0][1][0])
    meas = {label: [[] for _ in groups] for label in labels}
    for r in range(rounds):
        order = labels[r % len(labels):] + labels[:r % len(labels)]
        for g, (samples, steps) in enumerate(groups):
            for label in order:
                torch.manual_seed(r)
                meas[label][g].append(len(samples) / decode_seconds(models[label], task, samples, steps, beam))
            log(f"[bench] round {r + 1}/{rounds} group {g + 1}/{len(groups)}: "
                + ", ".join(f"{label} {meas[label][g][-1]:.2f}" for label in labels) + " sent/s")
    return meas


def overall(meas: Dict[str, List[List[float]]], sizes: Sequence[int]) -> Dict[str, List[float]]:
    """Per model and round, the all-groups speed: all decoded sentences over their summed time
    (``sizes[g]``: sentences decoded in group ``g``)."""
    out = {}
    for label, per_group in meas.items():
        rounds = len(per_group[0])
        out[label] = [sum(sizes) / sum(n / per_group[g][r] for g, n in enumerate(sizes)) for r in range(rounds)]
    return out


# ---- the page and the plot -------------------------------------------------------------------

def _ratio(x: float) -> str:
    return f"{x:.3f}×"


def where_label(device: str, dtype: str) -> str:
    """``"CPU"``, or ``"GPU (<name>, <dtype>)"`` for ``device == "cuda"`` (the page's title words)."""
    if device == "cpu":
        return "CPU"
    import torch

    return f"GPU ({torch.cuda.get_device_name()}, {dtype})"


def render(a, labels: Sequence[str], info: List[dict], meas, all_rounds, record, where: str = "CPU") -> str:
    """The Markdown page: regime line, the paper's claim, how it was measured, the table (one row
    per group and model, then the all-groups rows), the reading of the ReLA-vs-rivals ratios,
    the per-round numbers and the provenance section (``record``: :func:`provenance.collect`).
    ``where``: :func:`where_label` (title, regime line)."""
    med = {k: [statistics.median(v) for v in meas[k]] for k in labels}
    med_all = {k: statistics.median(all_rounds[k]) for k in labels}
    png = os.path.basename(os.path.splitext(a.out)[0] + ".png")
    has_rela = RELA in labels
    data = record["data"]
    lines = [
        f"# ReLA Figure 2 on {where}: decoding speed vs source length, relative to stock fairseq `transformer`",
        "",
        regime_line(where, a.size),
        "",
        f"Paper: {PAPER_CLAIM}",
        "",
        f"Ours: the sentences of `{provenance.shown_path(a.source)}`, tokenised as the Multi30k data ({TOKENIZER}), BPE-segmented "
        f"with the Multi30k joint codes (`{provenance.shown_path(a.bpe_codes)}`) and encoded with the Multi30k source dictionary; "
        f"sorted by source length in BPE tokens and cut into {a.groups} disjoint groups of equal size (our reading of "
        "\"10 disjoint groups uniformly according to source length\": equal counts, not equal length intervals; "
        "groups are cut by rank, so neighbouring groups can share their boundary length); "
        f"{a.sents_per_group} sentence(s) per group, evenly spaced within it, decoded at batch 1 with beam {a.beam} "
        "and exactly as many steps as the source has BPE tokens (forced `min_len = max_len`). Untrained "
        f"models, {SIZES[a.size][0]} (speed does not depend on the trained values: every op -- dense "
        "matmuls, ReLU, sort-based sparsemax / 1.5-entmax, beam top-k -- costs the same for any values, and the step "
        f"count is forced). One untimed warm-up decode per model, then {a.rounds} interleaved round(s) (every group, "
        "every model, model order rotated per round); sents/s = median over rounds of sentences / summed decode time; "
        "ratios of those medians, measured in the same run. All-groups rows: all decoded sentences over their summed "
        "time per round, median over rounds."
        + ("" if where == "CPU" else " GPU: wall time between `torch.cuda.synchronize()` calls, models converted to "
           "the dtype in the title as `fairseq-generate` does."),
        "",
        f"Sentences: {data['kept']} of the {data['source_lines']} source lines kept ({data['dropped_empty']} empty and "
        f"{data['dropped_too_long']} longer than the models' {data['max_positions']} positions dropped); "
        f"{data['unk_tokens_decoded']} `<unk>` among the {data['decoded_tokens']} source tokens decoded.",
        "",
        f"Plot: [{png}]({png}) (speed relative to the stock model over the group's mean source length).",
        "",
        "| group | source length (BPE tokens) | mean length (decoded) | model | sents/s | × stock | "
        + (f"{RELA} ÷ model |" if has_rela else ""),
        "|---|---|---|---|---|---|" + ("---|" if has_rela else ""),
    ]

    def row(group, rng, mean, label, speed, ref, rela):
        cells = [group, rng, mean, label, f"{speed:.2f}", _ratio(speed / ref)]
        if has_rela:
            cells.append("—" if label == RELA else _ratio(rela / speed))
        return "| " + " | ".join(cells) + " |"

    for g, gi in enumerate(info):
        for label in labels:
            lines.append(row(str(g + 1), f"{gi['min']}–{gi['max']}", f"{gi['mean']:.1f}", label, med[label][g],
                             med[BASELINE][g], med[RELA][g] if has_rela else None))
    mean_all = sum(sum(gi["steps"]) for gi in info) / sum(len(gi["steps"]) for gi in info)
    for label in labels:
        lines.append(row("all", f"{info[0]['min']}–{info[-1]['max']}", f"{mean_all:.1f}", label, med_all[label],
                         med_all[BASELINE], med_all[RELA] if has_rela else None))
    rivals = [r for r in RIVALS if r in labels]
    if has_rela and rivals:
        lines += ["", "Reading (paper: ReLA at least 1.8× faster than sparsemax and 1.5-entmax at every length; "
                  "slightly slower than the baseline):", ""]
        for r in rivals:
            per = [med[RELA][g] / med[r][g] for g in range(len(info))]
            lines.append(f"- {RELA} ÷ {r}: {_ratio(min(per))} (min over groups) to {_ratio(max(per))} (max); "
                         f"all groups {_ratio(med_all[RELA] / med_all[r])}")
        per = [med[RELA][g] / med[BASELINE][g] for g in range(len(info))]
        lines.append(f"- {RELA} × stock: {_ratio(min(per))} to {_ratio(max(per))}; "
                     f"all groups {_ratio(med_all[RELA] / med_all[BASELINE])}")
    lines += ["", "Per-round measurements (sents/s, rounds in order):", "",
              "| group | model | " + " | ".join(f"round {r + 1}" for r in range(a.rounds)) + " |",
              "|---|---|" + "---|" * a.rounds]
    for g in range(len(info)):
        for label in labels:
            lines.append(f"| {g + 1} | {label} | " + " | ".join(f"{v:.2f}" for v in meas[label][g]) + " |")
    for label in labels:
        lines.append(f"| all | {label} | " + " | ".join(f"{v:.2f}" for v in all_rounds[label]) + " |")
    lines += ["", "Decoded sentences (line numbers of the source file, 1-based) per group:", ""]
    for g, gi in enumerate(info):
        lines.append(f"- group {g + 1} ({gi['size']} sentences, {gi['min']}–{gi['max']} tokens): lines "
                     + ", ".join(str(i + 1) for i in gi["ids"]) + f" (lengths {', '.join(map(str, gi['steps']))})")
    lines += ["", provenance.markdown(record)]
    return "\n".join(lines)


def plot(labels: Sequence[str], info: List[dict], meas, path: str, where: str = "CPU", size: str = "small") -> str:
    """PNG of each model's median speed relative to the stock model (y) over the group's mean
    decoded source length in BPE tokens (x), the shape of ReLA Figure 2; written atomically
    (matplotlib, Agg backend).  Returns ``path``."""
    from fairseq_plugins.analysis.plots import pyplot, save_png

    plt = pyplot()
    med = {k: [statistics.median(v) for v in meas[k]] for k in labels}
    xs = [gi["mean"] for gi in info]
    fig, ax = plt.subplots(figsize=(5.6, 3.8))
    for n, label in enumerate(labels):
        ys = [med[label][g] / med[BASELINE][g] for g in range(len(info))]
        ax.plot(xs, ys, "--" if label == BASELINE else "o-", color=f"C{n}", label=label, markersize=4)
    ax.set_xlabel("mean source length of the group (BPE tokens)")
    ax.set_ylabel("decoding speed ÷ stock (batch 1)")
    ax.set_title(f"ReLA Figure 2 on {where} ({size_words(size).replace('`', '')})", fontsize=9)
    top = max(med[k][g] / med[BASELINE][g] for k in labels for g in range(len(info)))
    ax.set_ylim(0, max(1.25, 1.1 * top))
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="lower left")
    fig.tight_layout()
    return save_png(fig, path, dpi=120, tight=False)


# ---- command line ----------------------------------------------------------------------------

def _models_arg(p, given):
    """The ``--models`` labels in MODELS order, matched case-insensitively; p.error on a bad one."""
    valid = {k.lower(): k for k in MODELS}
    out = []
    for word in given:
        label = valid.get(word.strip().lower())
        if label is None:
            p.error(f"--models: unknown model label {word!r}; valid: " + ", ".join(repr(k) for k in MODELS))
        if label not in out:
            out.append(label)
    if BASELINE not in out:
        p.error(f"--models must include the baseline {BASELINE!r} (every ratio is against it); valid: "
                + ", ".join(repr(k) for k in MODELS))
    return [k for k in MODELS if k in out]


def parse_args(argv=None):
    """Parse and check the options (no work done): every bad value stops with ``p.error`` naming
    the valid choices."""
    p = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    p.add_argument("--source", default=DEFAULT_SOURCE, help="raw English source sentences, one a line (.gz "
                   "decompressed; default: newstest2014 of the shared data folder)")
    p.add_argument("--data-bin", default=os.path.join(DEFAULT_DATA, "bin"), help="the Multi30k fairseq data "
                   "(dictionary; default: data-bin/multi30k_en_de/bin)")
    p.add_argument("--bpe-codes", default=os.path.join(DEFAULT_DATA, "bpe", "codes"), help="the Multi30k joint "
                   "BPE codes (default: data-bin/multi30k_en_de/bpe/codes)")
    p.add_argument("--src", default="en")
    p.add_argument("--tgt", default="de")
    p.add_argument("--models", nargs="+", default=list(FIGURE2_MODELS), metavar="LABEL",
                   help="labels of mt_pipeline.bench_speed.MODELS, quoted (default: the Figure 2 curves: "
                   + ", ".join(repr(k) for k in FIGURE2_MODELS) + "); must include the baseline")
    p.add_argument("--groups", type=int, default=10, help="length groups of equal size (default: 10)")
    p.add_argument("--sents-per-group", type=int, default=8, help="sentences decoded per group (default: 8)")
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds, median reported (default: 3)")
    p.add_argument("--beam", type=int, default=4)
    p.add_argument("--device", default="cpu", choices=DEVICES, help="cpu (default) or cuda (GPU wall time "
                   "between synchronisations)")
    p.add_argument("--dtype", default="fp32", choices=list(DTYPES), help="the models' precision (bf16 / fp16 on "
                   "--device cuda only; default fp32)")
    p.add_argument("--size", default="small", choices=list(SIZES),
                   help="model size: small (default; the *_small presets) or base (Transformer base, the paper's)")
    p.add_argument("--out", help="the Markdown page (the .png plot goes beside it; default: "
                   "results/rela/figure2_decode_length_cpu.md, on cuda "
                   "results/gpu/rela_figure2_decode_length_<gpu>_<dtype>.md; with --size base, _base before .md)")
    a = p.parse_args(argv)
    for opt in ("groups", "sents_per_group", "rounds", "beam"):
        if getattr(a, opt) < 1:
            p.error(f"--{opt.replace('_', '-')} must be an integer >= 1, got {getattr(a, opt)}")
    a.models = _models_arg(p, a.models)
    problem = device_problem(a.device, a.dtype)  # before the input files: a fresh checkout has no data-bin
    if problem:
        p.error(problem)
    if not os.path.isfile(a.source):
        p.error(f"--source {a.source}: no such file (the raw newstest2014 English side, default {DEFAULT_SOURCE})")
    if not os.path.isfile(os.path.join(a.data_bin, f"dict.{a.src}.txt")):
        p.error(f"--data-bin {a.data_bin}: no dict.{a.src}.txt there (run data-prep/multi30k/prepare.sh first, or "
                "give the bin/ folder of a Multi30k preparation)")
    if not os.path.isfile(a.bpe_codes):
        p.error(f"--bpe-codes {a.bpe_codes}: no such file (run data-prep/multi30k/prepare.sh first)")
    if a.out is None:
        a.out = (DEFAULT_OUT.replace(".md", f"{size_suffix(a.size)}.md") if a.device == "cpu" else os.path.join(
            ROOT, "results", "gpu", f"rela_figure2_decode_length_{gpu_slug()}_{a.dtype}{size_suffix(a.size)}.md"))
    if not a.out.endswith(".md"):
        p.error(f"--out {a.out}: must end in .md (the plot is written beside it as .png)")
    problem = writable_problem(a.out, is_dir=False)
    if problem:
        p.error(f"--out {a.out}: {problem}")
    return p, a


def main(argv=None):
    """``mt-bench-decode-length``: see the module docstring.  Returns 0."""
    from fairseq.utils import resolve_max_positions

    p, a = parse_args(argv)
    argv = sys.argv[1:] if argv is None else list(argv)
    t_start, load_start = time.time(), provenance.load_average()
    raw = read_source(a.source)
    print(f"[bench] preprocessing {len(raw)} lines of {a.source} (Multi30k tokenisation + BPE)", flush=True)
    bpe_lines = preprocess(raw, a.bpe_codes, a.src)
    lengths = [len(line.split()) for line in bpe_lines]

    models, task = build_models(a.data_bin, a.src, a.tgt, device=a.device, dtype=a.dtype, size=a.size)
    models = {k: models[k] for k in a.models}
    max_src, max_tgt = resolve_max_positions(task.max_positions(), *(m.max_positions() for m in models.values()))
    # a source of L tokens is L + 1 positions with EOS; L forced steps need L + 1 decoder positions
    cap = min(max_src - 1, max_tgt - 1)
    keep = [i for i, n in enumerate(lengths) if 1 <= n <= cap]
    empty, long_ = sum(1 for n in lengths if n == 0), sum(1 for n in lengths if n > cap)
    if empty or long_:
        print(f"[bench] dropped {empty} empty and {long_} sentences longer than {cap} BPE tokens "
              f"(the models' max positions {max_src}/{max_tgt})", flush=True)
    if a.groups > len(keep):
        p.error(f"--groups {a.groups}: more groups than sentences ({len(keep)}); choose 1..{len(keep)}")
    groups = [[keep[j] for j in grp] for grp in length_groups([lengths[i] for i in keep], a.groups)]
    smallest = min(len(grp) for grp in groups)
    if a.sents_per_group > smallest:
        p.error(f"--sents-per-group {a.sents_per_group}: the smallest of {a.groups} groups has {smallest} "
                f"sentences; choose 1..{smallest}")

    info, batches, unks = [], [], 0
    for grp in groups:
        ids = pick_evenly(grp, a.sents_per_group)
        samples, steps, u = encode_samples(task, bpe_lines, ids)
        unks += u
        batches.append((samples, steps))
        info.append({"size": len(grp), "min": lengths[grp[0]], "max": lengths[grp[-1]], "ids": ids,
                     "steps": steps, "mean": sum(steps) / len(steps)})
    print(f"[bench] {a.groups} groups of {smallest}..{max(len(g) for g in groups)} sentences; decoding "
          f"{a.sents_per_group} per group with {len(models)} models, {a.rounds} round(s)", flush=True)
    meas = measure(models, task, batches, a.beam, a.rounds)
    all_rounds = overall(meas, [len(s) for s, _ in batches])

    decoded = sum(len(s) for s, _ in batches)
    record = provenance.collect(
        provenance.command_line(PROG, argv), regime="benchmark",
        data={"source": provenance.shown_path(a.source), "source_sha256": provenance.file_sha256(a.source),
              "source_lines": len(raw), "kept": len(keep), "dropped_empty": empty, "dropped_too_long": long_,
              "max_positions": f"{max_src}/{max_tgt} (source/target)",
              "bpe_codes": provenance.shown_path(a.bpe_codes), "bpe_codes_sha256": provenance.file_sha256(a.bpe_codes),
              "dictionary": provenance.shown_path(os.path.join(a.data_bin, f"dict.{a.src}.txt")),
              "decoded_sentences": decoded, "unk_tokens_decoded": unks,
              "decoded_tokens": sum(sum(st) for _, st in batches)},
        models={k: f"{arch_of(k, a.size)} / {MODELS[k][1] or 'stock'}" for k in models},
        wall_s=round(time.time() - t_start, 1),
        load_average_1_5_15_min={"start": load_start, "end": provenance.load_average(), "cores": os.cpu_count()})
    where = where_label(a.device, a.dtype)
    text = render(a, list(models), info, meas, all_rounds, record, where)
    png = os.path.splitext(a.out)[0] + ".png"
    plot(list(models), info, meas, png, where, a.size)  # the plot first: the page appears only once both are complete
    with atomic_path(a.out) as tmp, open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
    print(text)
    print(f"[bench] wrote {a.out} and {png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
