"""Regenerate one table of one paper: prep -> train (resumable) -> average -> generate -> score.

    reproduce <paper> <table> [--scale small|converged|paper] [--seeds 1,2,3] [--dry-run] [--gpus N] [--rows 1,5]

(also ``scripts/reproduce``).  ``paper`` is one of rela, reluformer, eatt, flexible; ``table`` is
``table1``, ``table2``, ... as numbered in that paper (plus the studies ``reluformer lambda`` and
``rela normscope``).  A table is one or more table specs (``configs/<paper>/...``) run by
:mod:`mt_pipeline.tables` (each row one :mod:`mt_pipeline.experiment` run: resumable, skipped
when done).  Scales:

* ``small`` -- the CPU-sized specs on the data that is here, with their own budgets (the
  400-update smoke budget ``configs/multi30k/small_cpu.yaml`` for most Multi30k tables: early
  training, labelled "smoke");
* ``converged`` -- the same Multi30k specs under ``configs/multi30k/converged.yaml`` (3,000
  updates, ~23 epochs; minutes a row on a GPU, ~80 min on 2 CPU cores), runs in
  ``runs/converged/``, tables in ``<out>_converged.md``; with ``--seeds`` every row per seed,
  mean ± sd and significance against the reference row;
* ``paper`` -- the paper's hyper-parameters from ``configs/<paper>/<dataset>/`` with the batch
  (tokens per update) turned into ``--max-tokens`` / ``--update-freq`` for ``--gpus`` GPUs.

Afterwards ``results/<paper>/<table>.md`` collects every part of the table at every scale next
to the paper's numbers.  Steps that need the
trained runs (Flexible Attention's tau sweeps and decode-time benchmark) run after the rows.

``--dry-run`` prints every command (data prep, fairseq-train, averaging, evaluation, analyses,
post-training steps) and checks that every row resolves -- the arch, criterion, attention
functions and every flag are parsed by fairseq's own training parser with this repo's --user-dir --
without running anything.

Raises SystemExit naming the valid papers / tables / rows on bad input, and a "not yet available"
error for tables whose configs have not landed yet.
"""

import argparse
import math
import os
import shlex
import sys

import yaml

from . import experiment
from . import tables as run_table
from .atomic import atomic_path
from .budget import REGIMES, regime
from .evidence import predates_evidence
from .provenance import ROOT, git_commit

def _aer_command(runs, out, seeds=(), prep="data-bin/multi30k_en_de", moses=()):
    """ReLA Table 5's post-training step: AER of the En->De models in ``runs``/row1, row2, row3, row7
    (ReLA Table 1's softmax, sparsemax, 1.5-entmax and ReLA-g rows: §5.2 analyses the Table 1 models;
    each run directory stands for the checkpoint it was scored with) against the RWTH De-En gold
    alignments (``--aer-gold``'s default, ``../shared/data/rwth_gold_alignment_de_en``), tokenised
    as the data-prep ``prep`` (its ``bin/`` and ``bpe/codes``; ``moses``: the Moses options of its
    recipe, e.g. ``--moses-escape``), subword weights merged into word weights by averaging
    (``--aer-source-merge mean``: §5.2 merges them "following Zenkel et al. (2019)", who average);
    writes ``<out>.md`` and ``<out>/`` (analysis.json, figures/aer.png).  ``seeds``: every model is
    the mean over these seeds (seed 1 in ``rowN``, seed k in ``rowN-seed<k>``, as
    :func:`mt_pipeline.tables.run_dir` names them; ReLA §5.2 averages three)."""
    labels = {1: "softmax", 2: "sparsemax", 3: "entmax15", 7: "rela_g"}

    def paths(i):
        return ",".join(f"{runs}/row{i}" + ("" if k == 1 else f"-seed{k}") for k in (seeds or (1,)))

    return [sys.executable, "-m", "fairseq_plugins.analysis.cli",
            "--aer-checkpoint", *[f"{label}={paths(i)}" for i, label in labels.items()],
            "--data", f"{prep}/bin", "--bpe-codes", f"{prep}/bpe/codes", *moses, "--aer-source-merge", "mean",
            "--out", out, "--md", f"{out}.md"]


# paper -> table -> {"small": [spec...], "paper": [spec...]} (a missing scale = not configured;
# "converged": [spec...] names converged specs explicitly, otherwise the Multi30k small specs run
# under the converged budget),
# optionally with "after": {scale: [command...], "note": ...} -- post-training steps (analyses,
# sweeps, benchmarks on the trained runs) run after the specs and printed by --dry-run; or
# {"benchmark": {...}} (a speed table); or {"pending": reason}.
TABLES = {
    "rela": {
        "table1": {"small": ["configs/rela/table1.yaml"], "paper": ["configs/rela/wmt14_en_de/table1.yaml"]},
        "table2": {"benchmark": {
            "small": [sys.executable, "-m", "mt_pipeline.bench_speed", "--out", "results/rela/table2_speed_cpu.md"],
            "paper": [sys.executable, "-m", "mt_pipeline.bench_speed", "--data-bin", "data-bin/wmt14_en_de/rela/bin",
                      "--size", "base", "--max-tokens", "25000", "--train-batches", "500",
                      "--out", "results/rela/table2_speed_wmt14.md"],
            "note": "speed ratios vs fairseq's stock transformer measured in the same run (scripts/bench_speed.py; "
                    "small scale: the *_small models on Multi30k; paper scale: Transformer base (--size base) on "
                    "WMT14; on a GPU reproduce adds --device cuda --dtype bf16)"}},
        "table3": {"paper": ["configs/rela/wmt14_en_fr/table3.yaml", "configs/rela/wmt18_en_fi/table3.yaml",
                             "configs/rela/wmt18_zh_en/table3.yaml", "configs/rela/wmt16_ro_en/table3.yaml"]},
        # Figure 2: decoding speed by source length (10 length groups of newstest2014, batch 1)
        "figure2": {"benchmark": {
            "small": [sys.executable, "-m", "mt_pipeline.bench_decode_length",
                      "--out", "results/rela/figure2_decode_length_cpu.md"],
            "note": "decoding speed at batch 1 by source-length group of newstest2014 (10 groups of equal size), "
                    "ratios vs fairseq's stock transformer measured in the same run (mt-bench-decode-length; "
                    "untrained *_small models, Multi30k BPE and vocabulary)"}},
        # RMSNorm over the concatenated heads (paper §4, released code) vs per head (a variant)
        "normscope": {"small": ["configs/rela/norm_scope.yaml"]},
        # Table 5 / Figure 4 (AER of cross-attention vs the RWTH De-En gold alignments) of Table 1's
        # En->De models (§5.2: "we quantitatively analyze these weights on WMT14 En-De"): the spec
        # names Table 1's rows 1, 2, 3, 7 (the same runs), the AER is the post-training step
        # At paper scale every model is three seeds (§5.2), their mean on the page: the table's default seeds
        "table5": {"small": ["configs/rela/table5_aer.yaml"], "paper": ["configs/rela/wmt14_en_de/table5_aer.yaml"],
                   "seeds": {"paper": "1,2,3"},
                   "after": {
                       "small": [_aer_command("runs/rela_table1", "results/rela/table5_aer_multi30k")],
                       "converged": [_aer_command("runs/converged/rela_table1",
                                                  "results/rela/table5_aer_multi30k_converged")],
                       # the rela variant of the WMT14 prep (joint BPE, configs/rela/wmt14_en_de/budget.yaml);
                       # its recipe escapes and splits dashes (tokenizer.perl -a), so the gold words are too
                       "paper": [_aer_command("runs/paper/rela_table1", "results/rela/table5_aer_wmt14",
                                              seeds=(1, 2, 3), prep="data-bin/wmt14_en_de/rela",
                                              moses=("--moses-escape", "--moses-dash-splits"))],
                       "note": "AER (%) of the En->De cross-attention of ReLA Table 1's rows 1, 2, 3, 7 (softmax, "
                               "sparsemax, 1.5-entmax, ReLA-g) against the RWTH De-En gold alignments, normal and "
                               "shifted, layer attention and best head per layer (paper Table 5, Figure 4; "
                               "fairseq-attention-analysis --aer-checkpoint; at paper scale the mean of seeds 1-3, "
                               "as §5.2)"}},
    },
    "reluformer": {
        "table1": {"small": ["configs/reluformer/table1_ffn_memory.yaml"],
                   "paper": ["configs/reluformer/iwslt14_de_en/table1.yaml"]},
        # Table 2: softmax / ReLU / ReLU + eq. 6 scale (rows 1, 3 reuse T4 row 1 and T5 row 3), + §4.1's ReLU + LN
        "table2": {"small": ["configs/reluformer/table2_activation.yaml"]},
        # T4/T5: the smoke specs keep the lambda = 1.0 they were run with (the committed smoke tables
        # stay reproducible); the converged specs train with the default lambda = 0.01 (the
        # --budget override alone would keep lambda = 1.0, which the lambda study rules out).
        "table4": {"small": ["configs/reluformer/table4_multi30k.yaml"],
                   "converged": ["configs/reluformer/table4_multi30k_converged.yaml"],
                   "paper": ["configs/reluformer/iwslt14_de_en/table4.yaml", "configs/reluformer/wmt14_en_de/table4.yaml"]},
        "table5": {"small": ["configs/reluformer/table5_ablation.yaml"],
                   "converged": ["configs/reluformer/table5_ablation_converged.yaml"],
                   "paper": ["configs/reluformer/iwslt14_de_en/table5.yaml"]},
        "table6": {"small": ["configs/reluformer/table6_long_documents.yaml"],
                   "paper": ["configs/reluformer/europarl7_doc/table6.yaml"]},
        # Figure 1 (FFN memory size d_h 32-4096) with Figures 2-3's slot statistics as analyses
        "figure1": {"small": ["configs/reluformer/figure1_ffn_size.yaml"]},
        # the eq. 7 weight the paper does not give (diagnostic budget on CPU; --scale converged on a GPU)
        "lambda": {"small": ["configs/reluformer/lambda_study.yaml"]},
    },
    "eatt": {
        "table3": {"small": ["configs/eatt/table3_ablation_multi30k.yaml"],
                   "paper": ["configs/eatt/iwslt15_en_vi/table3.yaml"]},
        "table4": {"small": ["configs/eatt/table4_multi30k.yaml"],
                   "paper": ["configs/eatt/iwslt15_en_vi/table4.yaml", "configs/eatt/wmt14_en_de/table4.yaml",
                             "configs/eatt/wmt17_zh_en/table4.yaml"],
                   "after": {
                       "small": [[sys.executable, "-m", "fairseq_plugins.analysis.energy_cli",
                                  "--checkpoint", "runs/eatt_table3/row4/average_last3.pt",
                                  "--data-bin", "data-bin/multi30k_en_de/bin", "--src", "en", "--tgt", "de",
                                  "--md", "results/eatt/figure2_rho_multi30k.md",
                                  "--plot", "results/eatt/figure2_rho_multi30k.png"]],
                       "note": "ratio of ones rho after binarisation per layer and attention type of the trained "
                               "E-ATT model on the validation set, with its energy accounting (paper Figure 2)"}},
        "table5": {"small": ["configs/eatt/table5_hybrids_multi30k.yaml"],
                   "paper": ["configs/eatt/iwslt15_en_vi/table5.yaml"]},
        # Figure 1: BLEU vs attention energy as d is halved (vanilla and E-ATT at d 256 ... 32)
        "figure1": {"small": ["configs/eatt/figure1_dimension.yaml"]},
    },
    "flexible": {
        # Table 1: the rows train the models (tau = inf); the window columns, the tau selected on the
        # validation set and the tau rows are post-training steps (scripts/flexible_sweep.py).
        "table1": {"small": ["configs/flexible/table1_multi30k_en_de.yaml", "configs/flexible/table1_multi30k_de_en.yaml"],
                   "paper": ["configs/flexible/wmt15_de_en/table1.yaml", "configs/flexible/aspec_en_ja/table1.yaml"],
                   "after": {
                       "small": [[sys.executable, "-m", "mt_pipeline.sweeps", "table1", "--runs", "runs/flexible_table1_en_de",
                                  "runs/flexible_table1_de_en", "--out", "results/flexible/table1_multi30k.md",
                                  "--figure", "results/flexible/figure3_tradeoff.png"]],
                       "paper": [[sys.executable, "-m", "mt_pipeline.sweeps", "table1", "--runs", "runs/paper/flexible_table1_de_en",
                                  "runs/paper/flexible_table1_en_ja", "--out", "results/flexible/table1_paper.md",
                                  "--title", "Flexible Attention Table 1 at paper scale (WMT15 De-En, ASPEC En-Ja; `rnnsearch`)",
                                  "--figure", "results/flexible/figure3_tradeoff_paper.png"]],
                       # besides its pages the sweep writes each direction's <runs>/row3/sweep/sweep.json,
                       # which Table 3's benchmark reads (--tau-from)
                       "writes": {"small": ["runs/flexible_table1_en_de/row3/sweep/sweep.json",
                                            "runs/flexible_table1_de_en/row3/sweep/sweep.json"],
                                  "paper": ["runs/paper/flexible_table1_de_en/row3/sweep/sweep.json",
                                            "runs/paper/flexible_table1_en_ja/row3/sweep/sweep.json"]},
                       "note": "tau sweep (0.3 ... 999 and inf) on valid + test of each direction's flexible row, tau chosen by "
                               "the paper's rule (<= 0.5 validation BLEU lost vs tau = inf; the smallest such tau of 0.8-1.6, our reading), windows "
                               "and BLEU of every model at that tau; the fine-tuned row swept too, its trade-off figure (paper Figure 3, §5.3)"}},
        # Table 2 (character-level ASPEC En-Ja): no character-level corpus here, so no small scale.
        "table2": {"paper": ["configs/flexible/aspec_en_ja/table2.yaml"],
                   "after": {
                       "paper": [[sys.executable, "-m", "mt_pipeline.sweeps", "sweep", "--run", "runs/paper/flexible_table2_en_ja_char/row2",
                                  "--out", "results/flexible/table2_sweep_flexible"],
                                 [sys.executable, "-m", "mt_pipeline.sweeps", "sweep", "--run", "runs/paper/flexible_table2_en_ja_char/row3",
                                  "--out", "results/flexible/table2_sweep_finetuned",
                                  "--figure", "results/flexible/table2_tradeoff_finetuned.png"]],
                       "note": "tau sweep on the flexible row (tau selection by the paper's rule; paper: 1.0) and on the "
                               "fine-tuned row, which selects its own tau the same way (§5.4: after fine-tuning 'we "
                               "selected the threshold to be tau = 1.0 in the same manner'); every tau's BLEU and "
                               "window is recorded: windows and the tau rows of Table 2"}},
        # Table 3 (decoding time): the global and fine-tuned flexible models, then the benchmark.
        "table3": {"small": ["configs/flexible/table3_multi30k_de_en.yaml"],
                   "paper": ["configs/flexible/aspec_en_ja/table3.yaml"],
                   "after": {
                       "small": [[sys.executable, "-m", "mt_pipeline.bench_flexible_decode",
                                  "--flexible", "runs/flexible_table1_de_en/row4/average_last1.pt",
                                  "--tau-from", "runs/flexible_table1_de_en/row3/sweep/sweep.json",
                                  "--global-checkpoint", "runs/flexible_table1_de_en/row1/average_last3.pt",
                                  "--data-bin", "data-bin/multi30k_en_de/bin", "--src", "de", "--tgt", "en",
                                  "--concat", "10,20,40",
                                  "--out", "results/flexible/table3_decode_time_multi30k.md"]],
                       "paper": [[sys.executable, "-m", "mt_pipeline.bench_flexible_decode",
                                  "--flexible", "runs/paper/flexible_table2_en_ja_char/row3/checkpoints/checkpoint_best.pt",
                                  "--tau-from", "results/flexible/table2_sweep_finetuned/sweep.json", "--global-checkpoint",
                                  "runs/paper/flexible_table2_en_ja_char/row1/checkpoints/checkpoint_best.pt",
                                  "--data-bin", "data-bin/aspec_en_ja/char/bin", "--src", "en", "--tgt", "ja",
                                  "--subset", "test", "--concat", "1", "--min-len", "1", "--n", "1812", "--rounds", "1",
                                  "--out", "results/flexible/table3_decode_time_aspec_char.md"]],
                       "note": "CPU decoding time per sentence, global vs fine-tuned flexible attention at the tau "
                               "Table 1's rule selected (small scale: its sweep.json, so `reproduce flexible table1` "
                               "first; paper scale: the tau Table 2's fine-tuned sweep selected, §5.4 'tau = 1.0', so "
                               "`reproduce flexible table2` first), reference fed back (forced decoding), one thread, both models interleaved in "
                               "the same run (scripts/bench_flexible_decode.py; the paper's GPU column is not measured)"}},
    },
}
# Run order matters for specs whose rows reuse another spec's runs (ReLUFormer T1/T2/T5 reuse T4, T2 also T5; E-ATT
# T4/T5 reuse T3's Vanilla and E-ATT rows, and small T3-T5 reuse ReLA T1's softmax row; Flexible T3
# reuses T2's runs (paper) / T1's de-en runs (small): a reused row not yet run is trained by
# whichever table comes first, in the shared run directory).  Within a spec the rows run in order,
# so a fine-tuning row (--finetune-from-model) comes after the row it starts from.


#: the Multi30k CPU budgets a ``--scale converged`` run replaces by the converged budget
MULTI30K_CPU_BUDGETS = ("configs/multi30k/small_cpu.yaml", "configs/multi30k/diagnostic_cpu.yaml")
CONVERGED_BUDGET = "configs/multi30k/converged.yaml"
SCALES = ("small", "converged", "paper")


def converged_specs(entry):
    """The specs of a table entry that ``--scale converged`` runs: the entry's own ``converged``
    list when it has one (specs written for the converged budget, e.g. ReLUFormer T4/T5 with the
    default lambda = 0.01; run as they are, no budget override), else the ``small`` specs whose
    rows all use one of :data:`MULTI30K_CPU_BUDGETS` (not the long-document or RNN budgets), run
    under :data:`CONVERGED_BUDGET`."""
    if "converged" in entry:
        return list(entry["converged"])
    out = []
    for path in entry.get("small", []):
        with open(os.path.join(ROOT, path)) as f:
            spec = yaml.safe_load(f)
        if spec["budget"] in MULTI30K_CPU_BUDGETS and not any(r.get("budget") for r in spec["rows"]):
            out.append(path)
    return out


def _scales(entry):
    """The scales a table entry can run at."""
    have = [s for s in ("small", "paper") if s in entry or s in entry.get("benchmark", {})]
    if "benchmark" not in entry and converged_specs(entry):
        have.insert(1, "converged")
    return have


def _specs(entry, scale):
    """``[(spec path, budget override or None)]`` of a table entry at ``scale``."""
    if scale == "converged":
        if "converged" in entry:  # written for the converged budget: no override
            return [(p, None) for p in entry["converged"]]
        return [(p, CONVERGED_BUDGET) for p in converged_specs(entry)]
    return [(p, None) for p in entry.get(scale, [])]


def available():
    """``paper: table (scales), ...`` lines of what can be run now."""
    lines = []
    for paper, tables in TABLES.items():
        parts = []
        for t, e in tables.items():
            if "pending" in e:
                parts.append(f"{t} (pending)")
            else:
                parts.append(f"{t} ({'/'.join(_scales(e))})")
        lines.append(f"  {paper}: " + ", ".join(parts))
    return "\n".join(lines)


def lookup(paper, table, scale):
    """The table entry (``scale`` None: any scale); SystemExit naming the valid choices otherwise."""
    if paper not in TABLES:
        raise SystemExit(f"unknown paper '{paper}'; valid: {', '.join(TABLES)}\navailable:\n{available()}")
    if table not in TABLES[paper]:
        raise SystemExit(f"unknown table '{table}' for {paper}; valid: {', '.join(TABLES[paper])}\n"
                         f"available:\n{available()}")
    e = TABLES[paper][table]
    if "pending" in e:
        raise SystemExit(f"{paper} {table} is not yet available ({e['pending']}).\navailable now:\n{available()}")
    if scale is not None and scale not in _scales(e):
        raise SystemExit(f"{paper} {table} has no --scale {scale} configuration; valid: {', '.join(_scales(e))}")
    return e


def batch_for_gpus(batch, gpus):
    """``(per_gpu, update_freq)`` giving about ``batch['tokens_per_update']`` tokens per update on
    ``gpus`` GPUs with at most ``batch['max_tokens_per_gpu']`` tokens per GPU batch -- or, for a
    batch counted in sentences (``sentences_per_update`` / ``max_sentences_per_gpu``, e.g. the
    64-sentence mini-batches of Flexible Attention), that many sentences."""
    unit = "sentences" if "sentences_per_update" in batch else "tokens"
    per_update = int(batch[f"{unit}_per_update"])
    cap = int(batch[f"max_{unit}_per_gpu"])
    uf = max(1, math.ceil(per_update / (cap * gpus)))
    return math.ceil(per_update / (gpus * uf)), uf


#: fairseq's default --max-source-positions / --max-target-positions of the Transformer archs
DEFAULT_MAX_POSITIONS = 1024


def max_positions(train):
    """The longest sample (tokens, EOS included) a budget's ``train`` flags admit: the larger of
    ``max-source-positions`` / ``max-target-positions`` (fairseq's default 1024 where not set)."""
    return max(int(train.get(k) or DEFAULT_MAX_POSITIONS) for k in ("max-source-positions", "max-target-positions"))


def batch_flags(batch, gpus):
    """fairseq-train overrides for ``gpus`` GPUs from a budget's ``batch`` section (see
    :func:`batch_for_gpus`): ``max-tokens`` or ``batch-size``, ``update-freq``,
    ``distributed-world-size`` and ``fp16`` (unless the section says ``fp16: false``), plus a
    one-line description.  Whether the per-GPU share holds the longest sample is
    :func:`check_gpus_fit`'s question.

    Raises:
        SystemExit: the section counts neither tokens nor sentences (the message names both).
    """
    keys = {"tokens": ("tokens_per_update", "max_tokens_per_gpu"),
            "sentences": ("sentences_per_update", "max_sentences_per_gpu")}
    unit = next((u for u, k in keys.items() if all(x in batch for x in k)), None)
    if unit is None:
        raise SystemExit(f"budget `batch` section {batch!r}: give {' + '.join(keys['tokens'])} or "
                         f"{' + '.join(keys['sentences'])}")
    per_gpu, uf = batch_for_gpus(batch, gpus)
    over = {"max-tokens" if unit == "tokens" else "batch-size": per_gpu, "update-freq": uf,
            "distributed-world-size": gpus, "fp16": bool(batch.get("fp16", True))}
    want, got = int(batch[keys[unit][0]]), gpus * per_gpu * uf
    # a sentence batch is exact (a token batch is a cap): say when the GPUs make it larger
    off = (f" = {got}, not {want}: {gpus} GPUs x update-freq {uf} do not divide {want}"
           if unit == "sentences" and got != want else "")
    return over, f"~{want} {unit} per update = {gpus} x {per_gpu} {unit} x update-freq {uf}{off}"


def check_gpus_fit(spec, gpus, rows=None):
    """Refuse ``gpus`` GPUs when the budget of a row of the table spec ``spec`` (the rows whose
    ids are in ``rows``, a comma-separated string as ``--rows``; default every row) would split
    its tokens per update below the longest sample its model admits (:func:`max_positions`:
    fairseq's ``batch_by_size`` asserts that no sample is longer than ``--max-tokens``).

    Raises:
        SystemExit: naming each such budget and the most GPUs that every budget of the table fits.
    """
    short, most = [], gpus
    want = None if not rows else {x.strip() for x in str(rows).split(",")}
    for path in dict.fromkeys(r.get("budget") or spec["budget"] for r in spec["rows"]
                              if want is None or str(r["id"]) in want):
        b = experiment.load_budget(path)
        batch = b.get("batch") or {}
        if "tokens_per_update" not in batch or "max_tokens_per_gpu" not in batch:
            continue
        longest = max_positions(b["train"])
        per_gpu = batch_for_gpus(batch, gpus)[0]
        if per_gpu < longest:
            fits = [g for g in range(1, gpus) if batch_for_gpus(batch, g)[0] >= longest]
            most = min(most, max(fits) if fits else 0)
            short.append(f"{path}: --max-tokens {per_gpu} per GPU < {longest} (its --max-source/target-positions)")
    if short:
        raise SystemExit(
            f"--gpus {gpus}: the tokens per update split over {gpus} GPUs fall below the longest sample the model "
            "admits, which fairseq cannot batch:\n  " + "\n  ".join(short) + "\n"
            + (f"use --gpus {most} or fewer (update-freq keeps each paper's batch per update)" if most else
               "a budget's max_tokens_per_gpu is itself below it: fix the budget"))


def resolve_spec(spec_path, gpus, scale="paper", rows=None):
    """Table spec for this run.  Paper scale: writes (atomically) a copy of the spec whose budgets
    carry ``--max-tokens``/``--update-freq``/``--distributed-world-size``/``--fp16`` for ``gpus``
    GPUs, next to its runs (``<runs>/gpus<N>/``), and returns its path; small scale: the spec."""
    if scale != "paper":
        return os.path.join(ROOT, spec_path)
    spec = yaml.safe_load(open(os.path.join(ROOT, spec_path)))
    check_gpus_fit(spec, gpus, rows)  # the budgets of the rows to run, before anything is written
    outdir = os.path.join(ROOT, spec["runs"], f"gpus{gpus}")
    os.makedirs(outdir, exist_ok=True)
    cache = {}

    def resolved(budget_path):
        if budget_path not in cache:
            b = experiment.load_budget(budget_path)
            if "batch" not in b:
                raise SystemExit(f"{budget_path}: a paper-scale budget needs a `batch` section "
                                 "(tokens_per_update + max_tokens_per_gpu, or sentences_per_update + "
                                 "max_sentences_per_gpu)")
            train, desc = batch_flags(b["batch"], gpus)
            over = {"base": budget_path, "train": train}
            path = os.path.join(outdir, os.path.basename(budget_path).replace(".yaml", f"_gpus{gpus}.yaml"))
            with atomic_path(path) as tmp, open(tmp, "w") as f:
                f.write(f"# {budget_path} for {gpus} GPU(s): {desc} (written by scripts/reproduce)\n")
                yaml.safe_dump(over, f, sort_keys=False)
            cache[budget_path] = os.path.relpath(path, ROOT)
        return cache[budget_path]

    spec["budget"] = resolved(spec["budget"])
    for r in spec["rows"]:
        if r.get("budget"):
            r["budget"] = resolved(r["budget"])
    path = os.path.join(outdir, os.path.basename(spec_path))
    with atomic_path(path) as tmp, open(tmp, "w") as f:
        f.write(f"# {spec_path} resolved for {gpus} GPU(s) by scripts/reproduce\n")
        yaml.safe_dump(spec, f, sort_keys=False, allow_unicode=True)
    return path


def select_rows(spec, rows):
    """The rows of a loaded table ``spec`` whose ids are in ``rows`` (``--rows``, e.g. ``"1,5"``), in
    spec order; every row when ``rows`` is empty or None.

    Raises:
        SystemExit: an id in ``rows`` that is no row of the spec (the message lists the valid ids;
            ``main`` has checked that ``rows`` is comma-separated integers).
    """
    ids = [r["id"] for r in spec["rows"]]
    if not rows:
        return spec["rows"]
    want = [int(x) for x in rows.split(",")]
    bad = [i for i in want if i not in ids]
    if bad:
        raise SystemExit(f"{spec['_path']}: unknown row ids {bad}; valid: {ids}")
    return [r for r in spec["rows"] if r["id"] in want]


def check_row(train_cmd):
    """Parse a fairseq-train command line with fairseq's own training parser (arch, criterion,
    task, attention functions and every flag must exist).  Raises SystemExit with fairseq's
    message otherwise."""
    from fairseq import options

    args = train_cmd[1:]
    # --user-dir must be imported before the parser is built (fairseq does the same at start-up)
    from fairseq.utils import import_user_module

    import_user_module(argparse.Namespace(user_dir=os.path.join(ROOT, "fairseq_plugins")))
    parser = options.get_training_parser()
    try:
        return options.parse_args_and_arch(parser, input_args=args)
    except SystemExit as err:
        raise SystemExit(f"row does not resolve (fairseq rejected the flags; see above): {' '.join(args)}") from err


def dry_run(spec_path, rows, gpus, scale, check=True, shown=None, budget=None, seeds=None):
    """Print every command of the table spec's rows (under ``budget`` when given; for every seed of
    ``seeds``, comma-separated, as :mod:`mt_pipeline.tables` runs them); parse each row's training
    command (see check_row).  Returns the number of rows checked."""
    import torch

    spec = run_table.load_table(spec_path, None if budget is None else os.path.join(ROOT, budget))
    q = lambda cmd: " ".join(shlex.quote(str(c)) for c in cmd)  # noqa: E731
    shown = shown or os.path.relpath(spec_path, ROOT)
    print(f"## {shown}: {spec['title']}")
    print(f"   direction {spec['src']}->{spec['tgt']}, renders {spec['out']}")
    prepped = set()
    n = 0
    for r in select_rows(spec, rows):
        row_budget = r["_budget"]
        for k, seed in enumerate([int(x) for x in seeds.split(",")] if seeds else [None]):
            rdir = run_table.run_dir(spec, r, seed)
            print(f"\n# row {r['id']}: {r['name']}" + (f", seed {seed}" if seed is not None else "")
                  + f"  (paper: {'–' if r.get('paper') is None else r['paper']})  run dir {os.path.relpath(rdir, ROOT)}")
            pcmd = experiment.prep_cmd(row_budget)
            if q(pcmd) not in prepped:
                prepped.add(q(pcmd))
                print("$ " + q(pcmd))
            prep = experiment.prep_dir(row_budget)
            data_bin = os.path.join(prep, "bin")
            # the command mt-experiment will run on this machine: a paper-scale budget is resolved for
            # --gpus GPUs; a smaller one trains on the CPU, or on one GPU with its `train-gpu` flags
            cuda = scale == "paper" or torch.cuda.is_available()
            train_cfg = dict(row_budget["train"] if scale == "paper" else experiment.train_flags(row_budget, cuda),
                             **({"seed": seed} if seed is not None else {}))
            cmd = experiment.build_train_cmd(data_bin, os.path.join(rdir, "checkpoints"), r["arch"], spec["src"],
                                             spec["tgt"], train_cfg, r.get("fns"), r.get("extra", ""), cpu=not cuda)
            print("$ " + q(cmd) + "    # resumes from checkpoint_last.pt")
            avg, avg_cmd = experiment.decode_checkpoint(row_budget, rdir)
            if avg_cmd:
                print("$ " + q(avg_cmd))
            else:
                print(f"# evaluate {os.path.relpath(avg, ROOT)} (fairseq's best checkpoint on the validation set)")
            print("$ " + q(experiment.eval_cmd(row_budget["generate"], avg, data_bin, prep, spec["src"], spec["tgt"],
                                               row_budget["data"]["subsets"], os.path.join(rdir, "eval"))))
            for an in spec.get("analyses") or []:
                print("$ " + q([sys.executable, an["script"], "--checkpoint", avg, "--data-bin", data_bin,
                                "--src", spec["src"], "--tgt", spec["tgt"], "--json",
                                os.path.join(rdir, f"analysis_{an['name']}.json")]))
            if check and k == 0:  # the seeds' commands differ only in --seed and the directory
                check_row(cmd)
                print("  (resolved: fairseq's training parser accepts this command)")
        n += 1
    print(f"\n$ mt-table --table {shown}" + (f" --budget {budget}" if budget else "")
          + (f" --rows {rows}" if rows else "") + (f" --seeds {seeds}" if seeds else "")
          + "    # renders " + spec["out"] + "\n")
    return n


def _row_status(spec, row):
    """``(ours, status, commit, seeds, signature)`` of one table row from its runs' result.json
    (every seed found): the score cell of the table's first subset (mean ± sd over seeds when there
    are several), ``done`` / ``failed`` / ``not run``, the git commit of its first run, the seeds
    and the sacreBLEU signature; ``None`` when no run of the row is on this machine."""
    results = run_table.row_results(spec, row)
    if not results:
        return None
    res = results[0]
    seeds = ",".join(str(run_table._seed(x)) if run_table._seed(x) is not None else "?" for x in results)
    commit = f"`{res.get('git_commit', 'unknown')[:12]}`"
    first = next(iter(spec["subsets"]))
    ok = [x for x in results if x.get("status") == "done" and x.get("scores")]
    if not ok:
        return "", res.get("status", "unknown"), commit, seeds, None
    if all(run_table.row_failed(x, None) for x in ok):
        return "–", "failed to train (see the full table)", commit, seeds, None
    sig = ok[0]["scores"][first].get("signature")
    if len(ok) == 1:
        return run_table._score_cell(ok[0]["scores"][first], spec), "done", commit, seeds, sig
    return run_table._mean_cell([x["scores"][first]["bleu"] for x in ok]), "done", commit, seeds, sig


def predated_rows_pending(out, done):
    """The rows a full table whose numbers predate committed evidence still waits for.

    Such a page (:func:`mt_pipeline.evidence.predates_evidence`) is replaced as a whole, never row by
    row, so that no number it shows -- and other pages quote -- turns into "not run yet"; it is
    replaced once every row that shows a number on it has re-run with evidence.  Rows the page shows
    as not run never held a number, so they are not waited for.

    Args:
        out: path of the full table (``spec['out']``).
        done: ``{row id: whether the row has a run with a result here}`` for the spec's rows.

    Returns:
        the ids (in ``done``'s order) of rows shown with a number on a page that predates evidence
        and not re-run yet -- every row not done when the page has no parsable table; ``[]`` when the
        page does not predate evidence (or does not exist).
    """
    if not predates_evidence(out):
        return []
    committed = committed_table(out)
    if committed is None:
        return [rid for rid, ok in done.items() if not ok]
    return [rid for rid, ok in done.items()
            if not ok and committed["rows"].get(str(rid), {}).get("ours")]


def committed_table(path):
    """What a committed full table (``spec['out']``, rendered by mt-table) says about its rows, for
    an index written where the runs are not (``runs/`` is not committed): ``{"rows": {id: {"ours",
    "status", "seeds", "commit"}}, "signature": str or None}`` -- ``ours`` is the cell of its first
    ``ours <subset>`` column, seeds from its ``seeds`` column or else the rows' ``--seed`` flags,
    commits from the per-row provenance.  ``None`` if the file does not exist or has no table."""
    if not os.path.exists(path):
        return None
    import re

    lines = open(path, encoding="utf-8").read().splitlines()
    head = next((i for i, l in enumerate(lines) if l.startswith("| ID | Model |")), None)
    if head is None:
        return None
    cols = [c.strip() for c in lines[head].strip().strip("|").split("|")]
    ours_col = next(i for i, c in enumerate(cols) if c.startswith("ours "))
    rows = {}
    for line in lines[head + 2:]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        cell = dict(zip(cols, cells))
        ours = cells[ours_col]
        rows[cell["ID"]] = {"ours": "" if ours == "not run yet" else ours,
                            "status": "not run" if ours == "not run yet" else cell.get("status", ""),
                            "seeds": cell.get("seeds", ""), "commit": ""}
    current = None
    for line in lines:
        m = re.match(r"### Row (\d+):.*?(?: \(seed (\d+)\))?$", line)
        if m:
            current = rows.get(m.group(1))
            continue
        if current is None:
            continue
        m = re.search(r"git commit: `([0-9a-f]{12})", line)
        if m and not current["commit"]:
            current["commit"] = f"`{m.group(1)}`"
        m = re.search(r"--seed (\d+)", line)
        if m and line.startswith("- command:"):
            have = [x for x in current.get("_seeds", []) if x != m.group(1)]
            current["_seeds"] = have + [m.group(1)]
    for r in rows.values():  # the --seed flags, when the table has no seeds column
        flags = r.pop("_seeds", [])
        r["seeds"] = r["seeds"] or ",".join(flags)
    m = re.search(r"[Ss]acreBLEU signature:? `([^`]+)`", "\n".join(lines))
    return {"rows": rows, "signature": m.group(1) if m else None}


def _part_command(paper, table, scale, spec_path, override):
    """The command that runs (or resumes) one part of a table, and the mt-table line it amounts to."""
    mt = f"mt-table --table {spec_path}" + (f" --budget {override}" if override else "")
    seeds = " --seeds 1,2,3" if scale == "converged" else ""
    gpus = " --gpus N" if scale == "paper" else ""
    return f"`reproduce {paper} {table} --scale {scale}{seeds}{gpus}`" + ("" if scale == "paper" else f" (= `{mt}{seeds}`)")


def write_index(paper, table, entry, results_dir=None):
    """results/<paper>/<table>.md (atomically): for every scale and part of the table, the regime,
    the command that runs it, which rows ran on which data with which budget and seeds, our score
    next to the paper's number with the sacreBLEU signature, and where the full table with its
    provenance is (the part's own ``out`` file).  Reads the runs' result.json where the runs are
    here, else the committed full table (``runs/`` is not committed): nothing is re-scored."""
    scales = "|".join(_scales(entry))
    lines = [f"# {paper} {table}: what ran, at which scale, on which data", "",
             f"Regenerate: `reproduce {paper} {table} --scale {scales}` (runs what is missing; "
             f"`--dry-run` prints every command first; `--index-only` rewrites this file from what has run). "
             "Claims and verdicts: [results/README.md](../README.md) -- a smoke or diagnostic number below is "
             "never a replication.", "",
             f"{INDEX_COMMIT_LINE} `{git_commit()}`; each row's commit is in the `commit` "
             "column (full provenance -- command, config, data, signature, hardware, wall time -- in the part's "
             "full table). Where the runs are not on the machine that wrote this index, the row cells are "
             "copied from the committed full table named in the part.", ""]
    for scale in ("paper", "converged", "small"):
        if "benchmark" in entry:
            if scale in entry["benchmark"]:
                out = entry["benchmark"][scale][entry["benchmark"][scale].index("--out") + 1]
                state = "written" if os.path.exists(os.path.join(ROOT, out)) else "not run yet"
                lines += [f"## scale: {scale}", "", f"**Regime: benchmark** (speed, no BLEU). "
                          f"{entry['benchmark']['note']}: `{out}` ({state}). Command: "
                          f"`reproduce {paper} {table} --scale {scale}`.", ""]
            continue
        for spec_path, override in _specs(entry, scale):
            spec = run_table.load_table(os.path.join(ROOT, spec_path),
                                        None if override is None else os.path.join(ROOT, override))
            budget = experiment.load_budget(os.path.join(ROOT, spec["budget"]))
            reg = regime(budget)
            out = spec["out"]
            written = os.path.exists(os.path.join(ROOT, out))
            statuses = {r["id"]: _row_status(spec, r) for r in spec["rows"]}
            committed = None
            # the committed full table where no run is here, or where that table predates evidence and
            # a row it shows a number for has not re-run yet (it is replaced as a whole:
            # predated_rows_pending)
            if not any(statuses.values()) or predated_rows_pending(
                    os.path.join(ROOT, out), {rid: st is not None for rid, st in statuses.items()}):
                committed = committed_table(os.path.join(ROOT, out))
            rows, sigs, seen_seeds = [], set(), set()
            for r in spec["rows"]:
                st = None if committed else statuses[r["id"]]
                if st is not None:
                    ours, status, commit, seeds, sig = st
                    if sig:
                        sigs.add(sig)
                elif committed and str(r["id"]) in committed["rows"]:
                    c = committed["rows"][str(r["id"])]
                    ours, status, commit = c["ours"], c["status"], c["commit"]
                    seeds = c["seeds"]
                else:
                    ours, status, commit, seeds = "", "not run", "", ""
                seen_seeds.update(x for x in seeds.split(",") if x)
                rows.append(f"| {r['id']} | {r['name']} | {'–' if r.get('paper') is None else r['paper']} | "
                            f"{ours} | {seeds} | {status} | {commit} |")
            if committed and committed["signature"]:
                sigs.add(committed["signature"])
            sig = (" / ".join(f"`{x}`" for x in sorted(sigs)) if sigs
                   else ("none recorded in the full table" if written else "none yet (nothing scored)"))
            source = (f"row cells copied from the committed `{out}`" if committed else
                      "row cells from the runs' result.json" if any(statuses.values()) else "no run yet")
            lines += [f"## scale: {scale} -- {spec['title']}", "",
                      f"**Regime: {reg}** -- {REGIMES.get(reg, 'not stated by the budget')}. "
                      f"Seeds: {', '.join(sorted(seen_seeds, key=lambda x: (len(x), x))) or 'none yet'}. "
                      f"SacreBLEU signature: {sig}.", "",
                      f"Command: {_part_command(paper, table, scale, spec_path, override)}. Spec `{spec_path}`, "
                      f"budget `{spec['budget']}`, data: {budget['data']['corpus']} {spec['src']}→{spec['tgt']}; "
                      f"full table with provenance: `{out}` ({'written' if written else 'not rendered yet'}; "
                      f"{source}).", "",
                      f"| row | model | {spec['paper_label']} | ours ({next(iter(spec['subsets'].values()))}) | seeds "
                      "| status | commit |", "|---|---|---|---|---|---|---|"] + rows + [""]
        for cmd in after_steps(entry, scale):
            outs = [f"`{o}` ({'written' if os.path.exists(os.path.join(ROOT, o)) else 'not run yet'})"
                    for o in step_outputs(cmd)]
            lines += [f"- after the rows ({scale}): {entry['after']['note']} -> " + ", ".join(outs)]
        if after_steps(entry, scale):
            lines.append("")
    out = os.path.join(results_dir or os.path.join(ROOT, "results"), paper, f"{table}.md")
    text = "\n".join(lines) + "\n"
    if os.path.exists(out) and _without_commit_line(open(out).read()) == _without_commit_line(text):
        return out  # nothing but the commit it was written at would change: leave it (and its commit)
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with atomic_path(out) as tmp, open(tmp, "w") as f:
        f.write(text)
    print(f"[reproduce] wrote {os.path.relpath(out, ROOT)}")
    return out


def _without_commit_line(text: str) -> str:
    return "\n".join(line for line in text.splitlines() if not line.startswith(INDEX_COMMIT_LINE))


#: how the line naming the commit an index was written at starts
INDEX_COMMIT_LINE = "Index written at git commit"


def index_entries():
    """``[(paper, table, entry)]`` of every table that has an index file (not the pending ones)."""
    return [(paper, table, e) for paper, tabs in TABLES.items() for table, e in tabs.items() if "pending" not in e]


def _part_outs(entry):
    """The full-table files (absolute) of every part of a table entry at every scale."""
    outs = set()
    if "benchmark" in entry:
        return outs
    for scale in _scales(entry):
        for spec_path, override in _specs(entry, scale):
            spec = run_table.load_table(os.path.join(ROOT, spec_path),
                                        None if override is None else os.path.join(ROOT, override))
            outs.add(os.path.abspath(os.path.join(ROOT, spec["out"])))
    return outs


def render_indexes(full_tables=None, results_dir=None):
    """Rewrite the index files ``results/<paper>/<table>.md`` (:func:`write_index`) from what has
    run here or is committed as evidence; a file whose only change would be its commit line is
    left as it is.  ``mt-campaign`` calls it after re-rendering full tables, so no index keeps a
    stale row.

    Args:
        full_tables: only the indexes with a part whose full table (a spec's ``out``, absolute or
            repo-relative) is among these; None: every index.
        results_dir: where the index files go (default ``results/``).

    Returns:
        The index paths written or found up to date.
    """
    want = None if full_tables is None else {os.path.abspath(os.path.join(ROOT, p)) for p in full_tables}
    return [write_index(paper, table, e, results_dir) for paper, table, e in index_entries()
            if want is None or _part_outs(e) & want]


def main(argv=None):
    p = argparse.ArgumentParser(prog="reproduce", description=__doc__.split("\n\n")[0],
                                epilog="available tables:\n" + available(),
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("paper", help=f"one of {', '.join(TABLES)}")
    p.add_argument("table", help="table1, table2, ... (figure1, ...) as numbered in the paper")
    p.add_argument("--scale", default="small", choices=list(SCALES),
                   help="small: the CPU-sized specs with their own (smoke) budgets (default); converged: the "
                        "Multi30k specs under configs/multi30k/converged.yaml; paper: the paper's "
                        "hyper-parameters and data")
    p.add_argument("--seeds", help="comma-separated training seeds, e.g. 1,2,3 (default: the budget's seed; a table "
                                   "whose paper averages seeds has its own, e.g. rela table5 at paper scale: 1,2,3)")
    p.add_argument("--dry-run", action="store_true", help="print every command, check every row, run nothing")
    p.add_argument("--gpus", type=int, default=None,
                   help="GPUs for --scale paper (default 1): sets --max-tokens/--update-freq to keep the paper's "
                        "tokens per update")
    p.add_argument("--rows", help="comma-separated row ids (default: all)")
    p.add_argument("--no-check", action="store_true", help="with --dry-run: do not parse the rows with fairseq")
    p.add_argument("--index-only", action="store_true",
                   help="only rewrite results/<paper>/<table>.md from what has run (runs nothing)")
    a = p.parse_args(argv)
    for flag, text in (("--seeds", a.seeds), ("--rows", a.rows)):
        if text is not None and not all(x.strip().isdigit() for x in text.split(",")):
            p.error(f"{flag} must be comma-separated non-negative integers (e.g. 1,2,3), got {text!r}")
    if a.index_only:  # every scale goes into the index
        write_index(a.paper, a.table, lookup(a.paper, a.table, None))
        return 0
    entry = lookup(a.paper, a.table, a.scale)
    gpus = a.gpus if a.gpus is not None else (1 if a.scale == "paper" else 0)
    if gpus < 0 or (a.scale == "paper" and gpus < 1):
        p.error("--gpus must be >= 1 with --scale paper (>= 0 with --scale small or converged)")
    if a.scale != "paper" and gpus > 0:
        p.error(f"--gpus {gpus} applies to --scale paper; a --scale {a.scale} budget trains on one device (the GPU "
                "when there is one, with the budget's train-gpu flags)")
    if a.scale == "paper" and not a.dry_run and "benchmark" not in entry:
        import torch

        seen = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if seen and gpus > seen:  # fairseq would start `seen` ranks and wait for the others
            p.error(f"--gpus {gpus} but this node shows {seen} CUDA device(s): reproduce trains on one node (use "
                    f"--gpus {seen}, or mt-train-distributed across nodes: docs/pipeline.md)")
    if a.seeds and "benchmark" in entry:
        p.error("--seeds applies to trained tables, not to benchmarks")
    default_seeds = (entry.get("seeds") or {}).get(a.scale)
    if default_seeds and a.seeds is not None and a.seeds.replace(" ", "") != default_seeds:
        # its post-training step reads exactly these seeds' runs (ReLA Table 5: the AER mean over three)
        p.error(f"{a.paper} {a.table} at {a.scale} scale trains and averages seeds {default_seeds} (its post-training "
                f"step reads those runs); leave --seeds out (got {a.seeds!r})")
    if default_seeds and a.seeds is None:  # a table whose paper averages seeds
        a.seeds = default_seeds
        print(f"[reproduce] {a.paper} {a.table} at {a.scale} scale trains seeds {a.seeds}: the paper averages them")

    if "benchmark" in entry:
        cmd = benchmark_cmd(entry, a.scale)
        print(f"# {a.paper} {a.table}: {entry['benchmark']['note']}")
        print("$ " + " ".join(shlex.quote(c) for c in cmd))
        if not a.dry_run:
            experiment.run(cmd)
            write_index(a.paper, a.table, entry)
        return 0

    specs = _specs(entry, a.scale)
    if a.dry_run:
        # resolved specs are written under runs/ only for real runs; a dry run resolves in a temp dir
        import tempfile

        n = 0
        with tempfile.TemporaryDirectory() as tmp:
            for s, override in specs:
                path = os.path.join(ROOT, s) if a.scale != "paper" else _resolve_in(tmp, s, gpus, a.rows)
                shown = s if a.scale != "paper" else os.path.join(
                    yaml.safe_load(open(os.path.join(ROOT, s)))["runs"], f"gpus{gpus}", os.path.basename(s))
                n += dry_run(path, a.rows, gpus, a.scale, check=not a.no_check, shown=shown, budget=override,
                             seeds=a.seeds)
        after = after_steps(entry, a.scale)
        if after:
            print(f"# after the rows: {entry['after']['note']}")
            for cmd in after:
                print("$ " + " ".join(shlex.quote(c) for c in cmd))
            print()
        print(f"[reproduce] dry run: {n} row(s) resolved; nothing was run. Results would go to "
              f"results/{a.paper}/{a.table}.md")
        return 0
    for s, override in specs:
        path = resolve_spec(s, gpus, a.scale, a.rows) if a.scale == "paper" else os.path.join(ROOT, s)
        run_table.main(["--table", path] + (["--budget", override] if override else [])
                       + (["--rows", a.rows] if a.rows else []) + (["--seeds", a.seeds] if a.seeds else []))
    if a.rows and after_steps(entry, a.scale):
        print(f"[reproduce] --rows given: the post-training steps ({entry['after']['note']}) need every row; "
              "not run")
    else:
        for cmd in after_steps(entry, a.scale):
            experiment.run(cmd)
    write_index(a.paper, a.table, entry)
    return 0


def benchmark_cmd(entry, scale, cuda=None):
    """A benchmark table's command at ``scale``; at paper scale on a machine with CUDA (``cuda``:
    None asks torch) it measures there, ``--device cuda --dtype bf16`` (the papers' GPU setting),
    unless the command names a device -- on the CPU a Transformer-base benchmark says little."""
    cmd = list(entry["benchmark"][scale])
    if cuda is None:
        import torch

        cuda = torch.cuda.is_available()
    if scale == "paper" and cuda and "--device" not in cmd and any("mt_pipeline.bench_" in c for c in cmd):
        cmd += ["--device", "cuda"] + ([] if "--dtype" in cmd else ["--dtype", "bf16"])
    return cmd


def after_steps(entry, scale):
    """The table's post-training commands at ``scale`` (sweeps, analyses, benchmarks on the trained
    runs; run after every spec, in order), ``[]`` if none."""
    return (entry.get("after") or {}).get(scale, [])


def after_writes(entry, scale):
    """Files under ``runs/`` the table's post-training commands at ``scale`` write besides their
    pages (``after: {writes: {scale: [...]}}``), ``[]`` if none declared -- e.g. Table 1's tau sweep
    writes ``runs/flexible_table1_de_en/row3/sweep/sweep.json``, which Table 3's benchmark reads
    (:func:`step_inputs`).  ``mt_pipeline.campaign`` runs a step again when such a file is missing
    and a step that is not done reads it."""
    return ((entry.get("after") or {}).get("writes") or {}).get(scale, [])


def step_outputs(cmd):
    """Paths a post-training command writes (its ``--out`` / ``--figure`` / ``--md`` / ``--plot`` values)."""
    return [cmd[i + 1] for i, c in enumerate(cmd[:-1]) if c in ("--out", "--figure", "--md", "--plot")]


def step_inputs(cmd):
    """Files a post-training command reads that runs or earlier steps write: its arguments under
    ``runs/`` that name a file (a suffix of :data:`INPUT_SUFFIXES`: a checkpoint ``.pt``, a
    ``sweep.json``), not a run directory --
    e.g. Table 3's ``--tau-from runs/flexible_table1_de_en/row3/sweep/sweep.json``, which Table 1's
    tau sweep writes."""
    return [c for c in cmd[1:] if c.startswith("runs/") and os.path.splitext(c)[1] in INPUT_SUFFIXES]


#: what :func:`step_inputs` counts as a file (a run directory may have a dot in its name: row5-lambda0.01)
INPUT_SUFFIXES = (".pt", ".json", ".gz", ".txt", ".tsv")


def _resolve_in(tmpdir, spec_path, gpus, rows=None):
    """resolve_spec writing into ``tmpdir`` instead of the runs dir (dry runs write nothing)."""
    spec = yaml.safe_load(open(os.path.join(ROOT, spec_path)))
    fake = dict(spec, runs=os.path.relpath(os.path.join(tmpdir, "runs"), ROOT))
    tmp_spec = os.path.join(tmpdir, os.path.basename(spec_path))
    with open(tmp_spec, "w") as f:
        yaml.safe_dump(fake, f, sort_keys=False, allow_unicode=True)
    out = resolve_spec(os.path.relpath(tmp_spec, ROOT), gpus, "paper", rows)
    # keep the real run directories in the printed commands
    resolved = yaml.safe_load(open(out))
    resolved["runs"] = spec["runs"]
    with open(out, "w") as f:
        yaml.safe_dump(resolved, f, sort_keys=False, allow_unicode=True)
    return out


if __name__ == "__main__":
    sys.exit(main())
