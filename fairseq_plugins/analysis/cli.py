"""``fairseq-attention-analysis``: checkpoints + a data split -> Markdown/JSON tables and PNG figures.

Usage (one model, or several with ``LABEL=PATH`` to compare them in one table/figure; a PATH may be an
``mt-experiment`` run directory, read as the checkpoint that run was scored with; ``LABEL=RUN1,RUN2,RUN3``
is one model trained with three seeds, reported as their mean ± sd as ReLA §5.2 does,
:func:`.report.seed_mean_analysis`)::

    fairseq-attention-analysis --checkpoint softmax=runs/a/avg.pt relag=runs/b/avg.pt \\
        --data data-bin/multi30k_en_de/bin --source-lang en --target-lang de --split test \\
        --out results/analysis --hallucination --heatmap-ids 0 5 \\
        [--aer-checkpoint deen=runs/deen/avg.pt --aer-gold ../shared/data/rwth_gold_alignment_de_en \\
         --bpe-codes data-bin/multi30k_en_de/bpe/codes] \\
        [--rank-split train | --rank-raw SRC.txt TGT.txt] [--rank-out ranked.tsv] [--attention-level word]

Writes into ``--out``: ``analysis.json`` (every number, with provenance), ``analysis.md``
(tables; ``--md PATH`` writes them there instead), ``figures/*.png`` (per-layer curves of sparsity, null rate, JS divergence, entropy;
top-p curves; hallucination test; AER curves; heatmaps), and the ranked corpus file when asked.
``--attention-level`` (``subword``, the default, or ``word``: ReLA §5.2's word-level weights,
:func:`.capture.word_level_records`) sets the level of every table except the AER (which merges
subwords by its own rule) and the heatmaps (subword weights); the page and the JSON
(``settings.attention_level``) state it.
All files are written atomically.
"""

import argparse
import os
import sys
import time
from typing import Dict, List, Optional, Tuple

from ..options import positive_int
from ..user_dir import import_user_dir
from .alignment import SOURCE_MERGES
from .capture import ATTENTION_LEVELS
from .loading import USER_DIR_HELP

__all__ = ["main", "build_parser"]

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _labelled_seeds(items: List[str], flag: str) -> List[Tuple[str, List[str]]]:
    """``[LABEL=]PATH[,PATH...]`` arguments as ``(label, [checkpoint file, ...])``: several
    comma-separated PATHs are seeds of one configuration (each resolved as by :func:`_labelled`;
    the default label is the first's).  ``--checkpoint`` (with ``--compare``) and
    ``--aer-checkpoint`` read their arguments through it (ReLA §5.2 averages three seeds).

    Raises:
        SystemExit: naming the flag and the valid form, before anything is loaded: an empty entry
            in a seed list (``a,,b``, ``a,``), a ``LABEL=`` after a comma (a label inside one
            label's seeds), a repeated label, the same checkpoint twice among one label's seeds, or
            a missing checkpoint."""
    form = "[LABEL=]PATH[,PATH...] (one checkpoint file or run directory per seed)"
    out, seen = [], set()
    for it in items:
        label, paths = it.split("=", 1) if "=" in it else (None, it)
        parts = paths.split(",")
        if not any(parts):
            raise SystemExit(f"{flag}: no checkpoint in {it!r}; valid: {form}")
        if not all(parts):
            raise SystemExit(f"{flag}: {it!r} has an empty entry in its seed list; valid: {form}")
        if any("=" in x for x in parts):
            raise SystemExit(f"{flag}: {it!r}: the seeds of one label are PATH,PATH,... (no LABEL= after a comma); "
                             "give other models as separate arguments, LABEL1=PATH LABEL2=PATH")
        resolved = _labelled(parts, flag, repeat_ok=True)
        files = [p for _, p in resolved]
        label = label if label is not None else resolved[0][0]
        if label in seen:
            raise SystemExit(f"{flag}: label {label!r} given twice (labels so far: {', '.join(sorted(seen))}); "
                             f"give each model one label, its seeds as {form}")
        if len({os.path.realpath(f) for f in files}) != len(files):
            raise SystemExit(f"{flag} {label}: a checkpoint is given twice ({', '.join(parts)}): seeds are "
                             "different runs")
        seen.add(label)
        out.append((label, files))
    return out


def _refuse_unlike_seeds(flag: str, label: str, seeds: List[Tuple[str, dict]]) -> None:
    """Exit when the seeds of ``label`` are not one model: ``seeds`` is ``[(checkpoint,
    signature)]`` and the signatures (:func:`_seed_signature`, for ``--checkpoint`` and
    ``--aer-checkpoint`` alike) differ.  The message names each seed's differing fields.

    Raises:
        SystemExit: "FLAG LABEL: its seeds are different models (...)"."""
    sigs = [s for _, s in seeds]
    if all(s == sigs[0] for s in sigs):
        return
    keys = [k for k in sigs[0] if any(s.get(k) != sigs[0][k] for s in sigs)] + \
        [k for s in sigs for k in s if k not in sigs[0]]
    raise SystemExit(f"{flag} {label}: its seeds are different models ("
                     + "; ".join(f"{c}: " + str({k: s.get(k) for k in dict.fromkeys(keys)}) for c, s in seeds) + ")")


def _seed_signature(model, task, info: dict) -> dict:
    """What the seeds of one ``--checkpoint`` label must share to be averaged: the loader's
    ``info`` (architecture, attention function per kind, stock model rebuilt), the direction and
    the dictionaries they are read with (:func:`fairseq_plugins.trained_data.data_record`: the
    fingerprints of the vocabularies; a model whose own training record names other
    dictionaries is refused by the loader already) and the heads of every attention layer
    (``{kind: [heads per layer]}``)."""
    from ..trained_data import data_record
    from .capture import attention_modules

    heads: Dict[str, List[int]] = {}
    for kind, _, m in attention_modules(model):
        heads.setdefault(kind, []).append(int(getattr(m, "num_heads", 0)))
    return {"info": info, "data": data_record(task), "heads": heads}


def _labelled(items: List[str], flag: str, repeat_ok: bool = False) -> List[Tuple[str, str]]:
    """``[LABEL=]PATH`` arguments as ``(label, checkpoint file)``.  PATH is a checkpoint file or an
    ``mt-experiment`` run directory, which stands for the checkpoint the run was scored with
    (:func:`fairseq_plugins.provenance.decoded_checkpoint`); the default label is the run
    directory's name (for a file: its folder's).  Exits with a message naming the flag on a
    repeated label (unless ``repeat_ok``) or a missing checkpoint, before anything is loaded."""
    from ..provenance import decoded_checkpoint

    out, seen = [], set()
    for it in items:
        label, path = it.split("=", 1) if "=" in it else (None, it)
        if label is None:
            run = os.path.abspath(path) if os.path.isdir(path) else os.path.dirname(os.path.abspath(path))
            if os.path.basename(run) == "checkpoints":
                run = os.path.dirname(run)
            label = os.path.basename(run) or it
        if label in seen and not repeat_ok:
            raise SystemExit(f"{flag}: label {label!r} given twice")
        seen.add(label)
        if os.path.isdir(path):
            try:
                path = decoded_checkpoint(path)
            except FileNotFoundError as err:
                raise SystemExit(f"{flag}: {err}") from None
        elif not os.path.isfile(path):
            raise SystemExit(f"{flag}: checkpoint not found: {path}")
        out.append((label, path))
    return out


def _trained_direction(path: str) -> Tuple[Optional[str], Optional[str]]:
    """``(source_lang, target_lang)`` a fairseq checkpoint was trained with
    (:func:`fairseq_plugins.trained_data.stored_languages`); ``(None, None)`` when it records none.
    Exits with the plugin's message on a checkpoint that cannot be read."""
    from ..checkpoint import CheckpointError, load_checkpoint
    from ..trained_data import stored_languages

    try:
        return stored_languages(load_checkpoint(path))
    except CheckpointError as e:
        raise SystemExit(f"fairseq-attention-analysis: error: {e}")


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``fairseq-attention-analysis`` (the options and their help)."""
    p = argparse.ArgumentParser(prog="fairseq-attention-analysis",
                                description="Attention analysis (ReLA Section 5.2, ReLUFormer Sections 3.4/4.2)")
    p.add_argument("--checkpoint", nargs="+", default=[], metavar="[LABEL=]PATH[,PATH...]",
                   help="checkpoint(s) to analyse on --split -- a file, or an mt-experiment run directory for the "
                        "checkpoint it was scored with; several = --compare in one table/figure. Comma-separated "
                        "PATHs are seeds of one model (ReLA §5.2 averages three): each is analysed on the same data "
                        "and every number of the page and JSON is their mean, ± the seeds' sample sd (JSON: "
                        "<metric>, <metric>_seed_sd, <metric>_per_seed; each seed's full entry under seeds); per-head "
                        "values are not averaged (heads do not align across seeds: kept per seed; heatmaps of the "
                        "first seed); the seeds must be one model (architecture, attention functions, direction, "
                        "vocabulary, heads), checked before any analysis. A single PATH is one model, one seed")
    p.add_argument("--compare", nargs="+", default=[], metavar="LABEL=PATH[,PATH...]",
                   help="more checkpoints to put next to --checkpoint (same as listing them there; seeds as there)")
    p.add_argument("--data", help="fairseq data dir (binarized splits + dictionaries); required unless --replot")
    p.add_argument("--source-lang"), p.add_argument("--target-lang")
    p.add_argument("--split", default="test", help="split of --data to analyse (default: test)")
    p.add_argument("--limit", type=positive_int, help="only the first N pairs of the split (N >= 1)")
    p.add_argument("--out", help="output directory (required unless --replot)")
    p.add_argument("--md", metavar="PATH",
                   help="write the Markdown tables here instead of OUT/analysis.md (e.g. a results page beside "
                        "its OUT folder of analysis.json and figures)")
    p.add_argument("--replot", metavar="ANALYSIS_JSON",
                   help="only re-render the curve figures from a written analysis.json (no checkpoints needed; "
                        "--out defaults to its directory)")
    p.add_argument("--max-tokens", type=positive_int, default=4096)
    p.add_argument("--taus", type=float, nargs="+", default=[1.0, 0.5, 0.25, 0.1],
                   help="temperatures of the softmax re-normalisation of non-distributions (ReLA Table 6); tau = 1, the head "
                        "diversity of ReLA Fig. 5, is always added")
    p.add_argument("--top-p", type=float, nargs="+", default=[1.0, 5.0, 10.0, 20.0, 50.0])
    p.add_argument("--heatmap-ids", type=int, nargs="*", default=[],
                   help="sentence ids (dataset indices) whose attention is drawn as heatmaps")
    p.add_argument("--heatmap-kinds", nargs="+", default=["cross"], choices=["encoder", "decoder", "cross"])
    p.add_argument("--hallucination", action="store_true",
                   help="cross null rate with references vs shuffled references (ReLA Fig 6)")
    p.add_argument("--on-hypotheses", action="store_true",
                   help="also teacher-force on the model's own beam-search translations")
    p.add_argument("--beam", type=int, default=4)
    p.add_argument("--seed", type=int, default=1, help="seed of the reference shuffle")
    p.add_argument("--aer-checkpoint", nargs="+", default=[], metavar="[LABEL=]PATH[,PATH...]",
                   help="De->En or En->De checkpoint(s) (file or run directory, as --checkpoint) whose cross-attention "
                        "is scored against the RWTH De-En gold alignments, each in the direction it was trained "
                        "(ReLA Table 5 / Fig. 4 measure the En->De models); comma-separated PATHs are seeds of one "
                        "model: each is scored and the page shows their mean ± sd (ReLA §5.2 averages three seeds)")
    p.add_argument("--aer-data", help="data dir of the --aer-checkpoint models (default: --data)")
    p.add_argument("--aer-gold", default=os.path.join(os.path.dirname(ROOT), "shared", "data",
                                                      "rwth_gold_alignment_de_en"))
    p.add_argument("--aer-lowercase", action="store_true", help="use the lowercased gold text (test.{de,en})")
    p.add_argument("--aer-limit", type=positive_int, help="only the first N gold pairs (N >= 1)")
    p.add_argument("--aer-source-merge", choices=SOURCE_MERGES, default="sum",
                   help="how a source word's subword columns merge into the word's: sum (default; the row stays a "
                        "distribution over words) or mean (Zenkel et al. 2019, both sides averaged)")
    p.add_argument("--bpe-codes", help="BPE codes of the models' data-prep (AER gold text, --rank-raw)")
    p.add_argument("--moses-escape", "--aer-escape", dest="moses_escape", action="store_true",
                   help="Moses-tokenize the AER gold words and the --rank-raw text with tokenizer.perl's XML escaping "
                        "(&quot; ...), as the models' prep did (the WMT and IWSLT recipes; Multi30k: not)")
    p.add_argument("--moses-dash-splits", "--aer-dash-splits", dest="moses_dash_splits", action="store_true",
                   help="Moses-tokenize the AER gold words and the --rank-raw text with tokenizer.perl's -a "
                        "(a-b -> a @-@ b), as the models' prep did (the WMT recipes; Multi30k, IWSLT14: not)")
    p.add_argument("--rank-split", help="rank the pairs of this binarized split of --data by cross null rate")
    p.add_argument("--rank-raw", nargs=2, metavar=("SRC", "TGT"),
                   help="rank a raw parallel corpus, Moses-tokenised (sacremoses; --moses-escape, --moses-dash-splits "
                        "as the models' prep) and BPE'd (--bpe-codes); text a recipe also normalised, truecased or "
                        "lowercased (IWSLT14), or to be tokenized exactly as tokenizer.perl (its final-period rule: "
                        "'U.S.' -> 'U.S .' at the end of a line), is best prepared with mt-prep and passed with "
                        "--rank-pretokenized")
    p.add_argument("--rank-pretokenized", action="store_true",
                   help="--rank-raw files are already tokenised and BPE'd (skip both)")
    p.add_argument("--rank-with", metavar="LABEL",
                   help="model (label of --checkpoint) that ranks the corpus (default: the first whose "
                        "cross-attention can be null, i.e. is not a distribution; else the first); a label of "
                        "several seeds ranks by the seed mean of each pair's null rate")
    p.add_argument("--rank-out", help="ranked TSV (default: OUT/ranked_<split|raw>.tsv)")
    p.add_argument("--attention-level", choices=ATTENTION_LEVELS, default=None,
                   help="level of the --checkpoint analyses (sparsity, null rate, JS, entropy, top-p, hallucination "
                        "test, ranking): subword (default; the positions the model has) or word (subword-nmt @@ pieces "
                        "merged, rows and columns averaged as Zenkel et al. 2019 -- the level ReLA §5.2 reports). "
                        "Not for --replot or an --aer-checkpoint-only run (the AER is word-level by its own merge)")
    p.add_argument("--no-figures", action="store_true")
    p.add_argument("--user-dir", metavar="DIR", help=USER_DIR_HELP)
    return p


def _subset(task, dataset, limit):
    from .capture import dataset_pairs, pairs_dataset

    if limit is None or limit >= len(dataset):
        return dataset
    src, tgt = dataset_pairs(dataset)
    return pairs_dataset(task, src[:limit], tgt[:limit])


def _raw_pairs(task, paths, src_lang, tgt_lang, bpe_codes, pretokenized, escape=False, aggressive_dash_splits=False):
    """A raw parallel corpus as the models' data-prep would present it: sacremoses' Moses tokenizer
    (``escape`` / ``aggressive_dash_splits``: tokenizer.perl's XML escaping / ``-a``, as the recipe;
    both False is the Multi30k prep) + BPE (``bpe_codes``) + the task's dictionaries; ``pretokenized``:
    the files already are (whitespace-split only).

    Returns:
        ``(src, tgt, src_text, tgt_text)``: per pair a 1-D LongTensor with EOS and the text encoded.

    Raises:
        SystemExit: the two files have different line counts."""
    def lines(path):
        with open(path, encoding="utf-8", newline="\n") as f:
            return [l[:-1] if l.endswith("\n") else l for l in f]

    s_lines, t_lines = lines(paths[0]), lines(paths[1])
    if len(s_lines) != len(t_lines):
        raise SystemExit(f"--rank-raw: {len(s_lines)} source lines but {len(t_lines)} target lines")
    if not pretokenized:
        from sacremoses import MosesTokenizer

        bpe = None
        if bpe_codes:
            from subword_nmt.apply_bpe import BPE

            with open(bpe_codes, encoding="utf-8") as f:
                bpe = BPE(f)
        else:
            print("warning: --rank-raw without --bpe-codes: no BPE applied", file=sys.stderr)

        def prep(texts, lang):
            tok = MosesTokenizer(lang=lang)
            out = [tok.tokenize(t, escape=escape, aggressive_dash_splits=aggressive_dash_splits, return_str=True)
                   for t in texts]
            return [bpe.process_line(t) for t in out] if bpe else out

        s_lines, t_lines = prep(s_lines, src_lang), prep(t_lines, tgt_lang)
    enc = lambda d, t: d.encode_line(t, add_if_not_exist=False, append_eos=True).long()  # noqa: E731
    return ([enc(task.source_dictionary, s) for s in s_lines], [enc(task.target_dictionary, t) for t in t_lines],
            s_lines, t_lines)


def _fmt(x, pct=False):
    if x is None or x != x:
        return "–"
    return f"{100 * x:.1f}" if pct else f"{x:.3f}"


def _mean(values):
    """The mean of per-layer values, ``None`` (shown "–") when there are none or one is undefined."""
    return None if not values or None in values else sum(values) / len(values)


def _sd_cell(mean, sd, pct=False) -> str:
    """A seed mean as ``mean ± sd`` (:func:`_fmt` units; "–" when the mean is undefined, the mean
    alone when the sd is)."""
    if mean is None or mean != mean:
        return "–"
    return _fmt(mean, pct) + ("" if sd is None or sd != sd else f" ± {_fmt(sd, pct)}")


def _seeds_cell(values, pct=False) -> str:
    """The seeds' values (two or more) of one number as ``mean ± sample sd (n - 1)``
    (:func:`.report.seed_mean` / :func:`.report.seed_sd`); "–" when one is undefined."""
    from .report import seed_mean, seed_sd

    return _sd_cell(seed_mean(values), seed_sd(values), pct)


def _seed_row(label: str, n: int) -> str:
    """The table row name of a label that is the mean of ``n`` seeds."""
    return f"{label} (mean of {n} seeds)"


def _md_layer_table(results, kind, metric, pct) -> List[str]:
    """A per-layer table of ``metric`` (one row per model, a column per layer and their mean).  A
    seed mean (``metric + "_per_seed"`` beside it, :func:`.report.seed_mean_analysis`) shows
    ``mean ± sd`` per layer and, in the mean column, each seed's mean over layers averaged ± their sd."""
    rows = [(label, r["metrics"][kind]) for label, r in results.items()
            if kind in r["metrics"] and metric in r["metrics"][kind]]
    if not rows:
        return []
    L = max(len(m[metric]) for _, m in rows)
    head = "| model | " + " | ".join(f"L{i + 1}" for i in range(L)) + " | mean |"
    out = [head, "|" + "---|" * (L + 2)]
    for label, m in rows:
        v, seeds = m[metric], m.get(metric + "_per_seed")
        if seeds is None:
            out.append(f"| {label} | " + " | ".join(_fmt(x, pct) for x in v) + f" | {_fmt(_mean(v), pct)} |")
        else:
            out.append(f"| {_seed_row(label, len(seeds))} | "
                       + " | ".join(_sd_cell(x, e, pct) for x, e in zip(v, m[metric + "_seed_sd"]))
                       + f" | {_seeds_cell([_mean(x) for x in seeds], pct)} |")
    return out


def _seed_records(label: str, seeds: List[dict]) -> dict:
    """``{"<label> seed <k>": training record}`` of the seeds of a seed mean, k the run's recorded
    seed (else its position, when a seed is unrecorded or two are the same)."""
    recorded = [x.get("training", {}).get("seed") for x in seeds]
    known = None not in recorded and len(set(recorded)) == len(recorded)
    return {f"{label} seed {recorded[i] if known else i + 1}": x["training"]
            for i, x in enumerate(seeds) if "training" in x}


def _trained(report: dict) -> dict:
    """``{label: training record}`` of every model of the report (AER models as ``aer:<label>``,
    the seeds of a seed mean as ``<label> seed <k>`` / ``aer:<label> seed <k>``, :func:`_seed_records`)
    that has one (:func:`fairseq_plugins.provenance.trained_model`; reports written before it have none)."""
    out = {}
    for l, r in report["models"].items():
        if "seeds" in r:  # a seed mean: one record per seed
            out.update(_seed_records(l, r["seeds"]))
        elif "training" in r:
            out[l] = r["training"]
    for l, r in (report.get("aer") or {}).items():
        if "seeds" in r:
            out.update(_seed_records(f"aer:{l}", r["seeds"]))
        elif "training" in r:
            out[f"aer:{l}"] = r["training"]
    return out


def _gold_tokenization(aer: Dict[str, dict]) -> str:
    """" Gold words Moses-tokenized with ..." when a model's gold words were escaped or dash-split
    (``--moses-escape`` / ``--moses-dash-splits``), else "" (the Multi30k prep's tokenization)."""
    used = {label: [o for k, o in (("moses_escape", "XML escaping (`--moses-escape`)"),
                                   ("moses_dash_splits", "-a (`--moses-dash-splits`)")) if a.get(k)]
            for label, a in aer.items()}
    if not any(used.values()):
        return ""
    return " Gold words Moses-tokenized as the models' prep: " + "; ".join(
        f"{label}: {' and '.join(o) or 'neither'}" for label, o in used.items()) + "."


def _merge_words(aer: Dict[str, dict]) -> str:
    """How the AER models merged a source word's subword columns, in words: "summed (`--aer-source-merge
    sum`)", or per model when they differ."""
    how = {"sum": "summed", "mean": "averaged (Zenkel et al. 2019)"}
    merges = {label: a.get("source_merge", "sum") for label, a in aer.items()}
    if len(set(merges.values())) == 1:
        m = next(iter(merges.values()))
        return f"{how[m]} (`--aer-source-merge {m}`)"
    return " / ".join(f"{how[m]} (`--aer-source-merge {m}`: {', '.join(l for l, x in merges.items() if x == m)})"
                      for m in dict.fromkeys(merges.values()))


def _merge_heading(aer: Dict[str, dict]) -> str:
    """The subword-merge convention of the AER models for the AER headings: "source subwords
    averaged (`--aer-source-merge mean`, as ReLA §5.2)" or "source subwords summed
    (`--aer-source-merge sum`, the CLI default; ReLA §5.2 averages)", per model when they differ.
    ReLA §5.2 merges subwords "following Zenkel et al. (2019)", who average (target rows are
    averaged either way)."""
    merges = {label: a.get("source_merge", "sum") for label, a in aer.items()}
    if len(set(merges.values())) == 1:
        m = next(iter(merges.values()))
        if m == "mean":
            return "source subwords averaged (`--aer-source-merge mean`, as ReLA §5.2)"
        return f"source subwords {'summed' if m == 'sum' else m} (`--aer-source-merge {m}`" + \
            (", the CLI default" if m == "sum" else "") + "; ReLA §5.2 averages)"
    return "source subwords merged per model: " + ", ".join(f"{l} `{m}`" for l, m in merges.items()) + \
        " (`--aer-source-merge`; ReLA §5.2 averages)"


def _checkpoints(a: dict) -> str:
    """The checkpoint(s) of a model (analysis or AER) in Markdown: one, or "N seeds: `a`, `b`, ..."."""
    if "seeds" in a:
        return f"{len(a['seeds'])} seeds: " + ", ".join(f"`{x['checkpoint']}`" for x in a["seeds"])
    return f"`{a['checkpoint']}`"


def _aer_markdown(report: dict) -> List[str]:
    """The AER section of a report (``report["aer"]``; ``[]`` without AER models): AoL / AoH per
    model and mode, the diagonal baseline, the per-layer curves."""
    md = []
    if report.get("aer"):
        md += ["## AER (%) of cross-attention vs RWTH De-En gold alignments (ReLA Fig. 4, Table 5; "
               + _merge_heading(report["aer"]) + ")", "",
               "AoL: mean over layers of the layer attention's AER; AoH: mean over layers of the best head's. "
               "Each model is scored in its own direction (source word -> target word links). Subwords to words: "
               "a target word's rows are averaged, a source word's columns " + _merge_words(report["aer"]) + "."
               + _gold_tokenization(report["aer"]), "",
               "| model | direction | normal AoL | normal AoH | shifted AoL | shifted AoH | unk rate |",
               "|---|---|---|---|---|---|---|"]
        def cell(m, key):
            return f"{m[key]:.2f}" + (f" ± {m[key + '_sd']:.2f}" if key + "_sd" in m else "")

        for l, a in report["aer"].items():
            name = f"{l} (mean of {len(a['seeds'])} seeds)" if "seeds" in a else l
            md.append(f"| {name} | {a.get('direction', 'de-en')} | {cell(a['normal'], 'AoL')} | "
                      f"{cell(a['normal'], 'AoH')} | {cell(a['shifted'], 'AoL')} | {cell(a['shifted'], 'AoH')} | "
                      f"{100 * a['unk_rate']:.1f}% |")
        if any("seeds" in a for a in report["aer"].values()):
            md += ["", "A model of several seeds (ReLA §5.2: \"We train each model three times with different random "
                   "seeds ... and report the average results\"): every AER is the mean over its seeds (AoH: each "
                   "seed's own best head per layer), ± the sample standard deviation of the seeds' AoL / AoH."]
        diags = {a.get("direction", "de-en"): a["diagonal_aer"] for a in report["aer"].values()
                 if a.get("diagonal_aer") is not None}
        if diags:
            md += ["", "Reference without a model: the diagonal alignment (target word i -> source word "
                   "round(i·J/I)) has AER " + ", ".join(f"{d:.2f}" + (f" ({k})" if len(diags) > 1 else "")
                                                      for k, d in diags.items()) + " on the same gold set."]
        md.append("")
        for l, a in report["aer"].items():
            for mode in ("normal", "shifted"):
                m = a[mode]
                best = (", ".join(f"{x:.1f} (h{h})" for x, h in zip(m["best_head"], m["best_head_index"]))
                        if "best_head_index" in m else
                        ", ".join(f"{x:.1f}" for x in m["best_head"]) + " (mean of each seed's best)")
                md.append(f"*{l}, {mode}*: layer attention " + ", ".join(f"{x:.1f}" for x in m["layer"])
                          + "; best head " + best)
                md.append("")
    return md


def render_markdown(report: dict) -> str:
    """The Markdown tables of a report (see :func:`main`), led by the regime of the models'
    training runs and ended by their runs and committed evidence (``## Trained models``)."""
    from .. import provenance

    res = report["models"]
    trained = _trained(report)
    seed_means = [l for l, a in (report.get("aer") or {}).items() if "seeds" in a]
    model_means = [l for l, r in res.items() if "seeds" in r]
    means = ([f"AER of {', '.join(seed_means)}"] if seed_means else []) + (
        [f"analyses of {', '.join(model_means)}"] if model_means else [])
    note = (f"{' and '.join(means)}: the mean over each one's seeds, ± their sd; differences between models "
            "are not tested for significance" if means else None)
    head, section = provenance.models_markdown(trained, note) if trained else ("", "")
    if not res:  # --aer-checkpoint alone (ReLA Table 5): no split was analysed
        aer = report.get("aer") or {}
        md = ["# AER of cross-attention against the RWTH De-En gold alignments (ReLA Table 5, Figure 4; "
              + _merge_heading(aer) + ")", ""] + (
              [head] if head else []) + [
              f"Commit `{report['provenance']['git_commit']}`; command: `{report['provenance']['command']}`.", "",
              "Models: " + ", ".join(f"**{l}** = {_checkpoints(a)} ({a['info']['arch']}, "
                                      f"{'/'.join(a['info']['attention_fns'].values())}; {a.get('direction', 'de-en')})"
                                      for l, a in aer.items()), ""]
        return "\n".join(md + _aer_markdown(report) + ([section] if section else [])) + "\n"
    md = [f"# Attention analysis: {report['data']['split']} split", ""] + ([head] if head else []) + [
          f"Data: `{report['data']['dir']}` ({report['data']['direction']}, {report['data']['n_pairs']} pairs); "
          f"commit `{report['provenance']['git_commit']}`; command: `{report['provenance']['command']}`.", "",
          "Models: " + ", ".join(f"**{l}** = {_checkpoints(r)} ({r['info']['arch']}, "
                                  f"{'/'.join(r['info']['attention_fns'].values())})" for l, r in res.items()), "",
          _LEVEL_LINES[report["settings"].get("attention_level", "subword")], ""]
    if model_means:
        md += [_SEEDS_LINE.format(labels=", ".join(f"**{l}**" for l in model_means)), ""]
    sections = [
        ("sparsity", "Sparsity rate (%), mean over heads (ReLA Fig. 3)", True),
        ("null_rate", "Null rate (%), mean over heads (ReLA Fig. 6)", True),
        ("js", "Head diversity: JS divergence over heads (nats; ReLA Fig. 5, tau = 1)", False),
        ("entropy", "Entropy H(s) of the renormalised weights (nats; ReLUFormer Sec. 4.2)", False),
    ]
    for metric, title, pct in sections:
        md += [f"## {title}", ""]
        for kind in ("encoder", "decoder", "cross"):
            t = _md_layer_table(res, kind, metric, pct)
            if t:
                md += [f"*{kind}*", ""] + t + [""]
    js_tau = [(l, r) for l, r in res.items() if any("js_by_tau" in m for m in r["metrics"].values())]
    if js_tau:
        md += ["## JS divergence averaged over layers by temperature (ReLA Table 6)", "",
               "| model | tau | enc | dec | cross |", "|---|---|---|---|---|"]
        for l, r in res.items():
            taus = next((m["js_by_tau"].keys() for m in r["metrics"].values() if "js_by_tau" in m), ["1"])
            for t in taus:
                cells = []
                for kind in ("encoder", "decoder", "cross"):
                    m = r["metrics"].get(kind, {})
                    v = m.get("js_by_tau", {}).get(t, m.get("js"))
                    if "js_per_seed" in m:  # a seed mean: each seed's mean over layers, averaged ± sd
                        seeds = ([x[t] for x in m["js_by_tau_per_seed"]] if t in m.get("js_by_tau", {})
                                 else m["js_per_seed"])
                        cells.append(_seeds_cell([_mean(x) for x in seeds]))
                    else:
                        cells.append(_fmt(_mean(v)))
                md.append(f"| {_seed_row(l, len(r['seeds'])) if 'seeds' in r else l} | {t} | " + " | ".join(cells) + " |")
        md.append("")
    md += ["## Top-p % score sum, mean over layers (ReLUFormer Figs. 2, 4)", "",
           "| model | attention | " + " | ".join(f"top {p}%" for p in report["settings"]["top_p"]) + " |",
           "|---|---|" + "---|" * len(report["settings"]["top_p"])]
    for l, r in res.items():
        for kind, m in r["metrics"].items():
            if "top_p_per_seed" in m:
                md.append(f"| {_seed_row(l, len(m['top_p_per_seed']))} | {kind} | " + " | ".join(
                    _seeds_cell([_mean(x[p]) for x in m["top_p_per_seed"]]) for p in m["top_p"]) + " |")
            else:
                md.append(f"| {l} | {kind} | " + " | ".join(_fmt(_mean(v)) for v in m["top_p"].values()) + " |")
    md.append("")
    if any("ffn_anisotropy" in r for r in res.values()):
        md += ["## Anisotropy of FFN value slots (ReLUFormer eq. 4, Fig. 3)", "", "| model | encoder layers | decoder layers |",
               "|---|---|---|"]
        for l, r in res.items():
            a = r["ffn_anisotropy"]
            if "ffn_anisotropy_seed_sd" in r:
                sd = r["ffn_anisotropy_seed_sd"]
                md.append(f"| {_seed_row(l, len(r['ffn_anisotropy_per_seed']))} | "
                          + " | ".join(", ".join(_sd_cell(x, e) for x, e in zip(a[k], sd[k])) for k in ("encoder", "decoder"))
                          + " |")
            else:
                md.append(f"| {l} | {', '.join(_fmt(x) for x in a['encoder'])} | {', '.join(_fmt(x) for x in a['decoder'])} |")
        md.append("")
    if any("hallucination" in r for r in res.values()):
        md += ["## Hallucination test: cross-attention null rate (%), references vs shuffled (ReLA Fig. 6)", "",
               "| model | references | " + " | ".join("L%d" % (i + 1) for i in range(len(
                   next(r for r in res.values() if "hallucination" in r)["hallucination"]["reference"]))) + " |",
               "|---|---|" + "---|" * len(next(r for r in res.values() if "hallucination" in r)["hallucination"]["reference"])]
        for l, r in res.items():
            h = r.get("hallucination")
            if h and "reference_seed_sd" in h:
                name = _seed_row(l, len(h["reference_per_seed"]))
                for row, key in (("real", "reference"), ("shuffled", "shuffled")):
                    md.append(f"| {name} | {row} | "
                              + " | ".join(_sd_cell(x, e, True) for x, e in zip(h[key], h[key + "_seed_sd"])) + " |")
            elif h:
                md.append(f"| {l} | real | " + " | ".join(_fmt(x, True) for x in h["reference"]) + " |")
                md.append(f"| {l} | shuffled | " + " | ".join(_fmt(x, True) for x in h["shuffled"]) + " |")
        md.append("")
    if any("on_hypotheses" in r for r in res.values()):
        md += ["## Teacher-forced on the model's own translations (beam search)", ""]
        for kind in ("encoder", "decoder", "cross"):
            for metric, pct in (("sparsity", True), ("null_rate", True), ("js", False)):
                sub = {l: {"metrics": r["on_hypotheses"]} for l, r in res.items() if "on_hypotheses" in r}
                t = _md_layer_table(sub, kind, metric, pct)
                if t:
                    md += [f"*{kind}, {metric}*", ""] + t + [""]
    md += _aer_markdown(report)
    if report.get("ranking"):
        rk = report["ranking"]
        if "seeds" in rk:  # a label of several seeds: the seed mean of every pair's null rate
            md += ["## Corpus ranking by cross-attention null rate (ReLA Sec. 5.2)", "",
                   f"{rk['n_pairs']} pairs of {rk['corpus']} ranked by `{rk['model']}`, the mean of its {rk['seeds']} "
                   f"seeds' null rates of each pair ({rk.get('attention_level', 'subword')} level) -> `{rk['file']}`; "
                   f"mean null rate {_sd_cell(rk['mean'], rk['mean_seed_sd'], True)}% (± the sd of the seeds' corpus "
                   f"means), best {_fmt(rk['min'], True)}%, worst {_fmt(rk['max'], True)}% (of the seed-mean rates).", ""]
        else:
            md += ["## Corpus ranking by cross-attention null rate (ReLA Sec. 5.2)", "",
                   f"{rk['n_pairs']} pairs of {rk['corpus']} ranked by `{rk['model']}` "
                   f"({rk.get('attention_level', 'subword')} level) -> `{rk['file']}`; "
                   f"mean null rate {_fmt(rk['mean'], True)}%, best {_fmt(rk['min'], True)}%, worst {_fmt(rk['max'], True)}%.", ""]
    if section:
        md.append(section)
    return "\n".join(md) + "\n"


def curve_figures(report: dict, out: str) -> List[str]:
    """The per-layer and summary figures of a report (sparsity, null rate, JS divergence, entropy,
    top-p, hallucination and AER when the report has them) as PNGs in ``<out>/figures``; returns
    their paths.  The heatmaps need the weights and are drawn only by a full run."""
    from . import plots

    res, figures = report["models"], []
    fig_dir = os.path.join(out, "figures")
    if res:
        for metric, ylabel in (("sparsity", "sparsity rate"), ("null_rate", "null rate"),
                               ("js", "JS divergence (nats)"), ("entropy", "entropy (nats)")):
            if report.get("settings", {}).get("attention_level") == "word":
                ylabel += ", word level"
            figures.append(plots.layer_curves(res, metric, ylabel, os.path.join(fig_dir, f"{metric}.png")))
        figures.append(plots.top_p_curves(res, os.path.join(fig_dir, "top_p.png")))
        if all("hallucination" in r for r in res.values()):
            figures.append(plots.hallucination_curves(res, os.path.join(fig_dir, "hallucination.png")))
    if report.get("aer"):
        figures.append(plots.aer_curves(report["aer"], os.path.join(fig_dir, "aer.png")))
    return figures


def replot(json_path: str, out: Optional[str] = None) -> List[str]:
    """Re-render :func:`curve_figures` from a written ``analysis.json`` (into ``out``, default its
    directory) without the checkpoints, e.g. after a change to the plotting code."""
    import json

    with open(json_path, encoding="utf-8") as f:
        report = json.load(f)
    return curve_figures(report, out or os.path.dirname(os.path.abspath(json_path)))


#: how the page states the level of its tables (``settings.attention_level``; reports written
#: before it was recorded are subword-level)
_LEVEL_LINES = {
    "subword": "Attention level: **subword** -- every table below except the AER is computed on the subword positions "
               "the model has (one row per target piece, one column per source piece; no pieces merged). ReLA §5.2 "
               "reports word-level weights (`--attention-level word`).",
    "word": "Attention level: **word** (`--attention-level word`, as ReLA §5.2) -- before every table below except "
            "the AER (its own merge, in its heading), the subword-nmt `@@` pieces of the tokens the model read are "
            "merged into words, following Zenkel et al. (2019): a word's rows averaged and its columns averaged "
            "(distribution rows renormalised to sum 1 where key pieces were averaged), `</s>` a word of its own, decoder rows labelled by the token they "
            "read; a word pair is masked only when all its piece pairs are. Heatmaps show subword weights.",
}


#: how the page states what a label of several seeds shows (``--checkpoint LABEL=RUN1,RUN2,...``)
_SEEDS_LINE = (
    "Seeds: {labels} -- the mean over the seeds given (ReLA §5.2: \"We train each model three times with different "
    "random seeds ... and report the average results\"). Every number of such a row is the mean over its seeds ± "
    "the seeds' sample standard deviation (n - 1); a mean over layers (the `mean` columns, Table 6, top-p) is each "
    "seed's mean over layers, averaged, ± their sd. Per-head values are **not** averaged: heads are not aligned "
    "between independently trained models (head h of one seed is not head h of another), so the JSON keeps each "
    "seed's per-head values (`models.<label>.seeds[k]`) and the heatmaps (`heatmap_<label>_firstseed_*`) show the "
    "first seed's model only. The per-layer numbers are head-order-free (means over heads, pooled rows, the JS "
    "divergence across heads).")


def _dictionary_symbols(data: str) -> Dict[str, List[str]]:
    """``{file: symbols}`` of the fairseq dictionaries ``dict.*.txt`` of a data dir (first field of each line)."""
    out = {}
    for name in sorted(os.listdir(data)):
        if name.startswith("dict.") and name.endswith(".txt"):
            with open(os.path.join(data, name), encoding="utf-8") as f:
                out[name] = [line.split(" ", 1)[0] for line in f if line.strip()]
    return out


def _load_or_exit(load, path, *args, **kw):
    """``load(path, ...)`` (:func:`.capture.load_model_for_analysis`); a checkpoint that cannot be
    used (empty, cut short, unsafe, not a Transformer) stops the CLI with the plugin's message."""
    from ..checkpoint import CheckpointError

    try:
        return load(path, *args, tool="fairseq-attention-analysis", **kw)
    except CheckpointError as e:
        raise SystemExit(f"fairseq-attention-analysis: error: {e}")


def main(argv=None):
    """Run ``fairseq-attention-analysis`` on ``argv`` (default: ``sys.argv[1:]``) and return 0; see
    the module doc.  Each ``--checkpoint LABEL=PATH`` is one model, one seed; ``LABEL=RUN1,RUN2,...``
    analyses every seed and reports :func:`.report.seed_mean_analysis` (ReLA §5.2 averages three
    seeds); ``--aer-checkpoint`` seeds are averaged by :func:`.report.seed_mean_aer`.

    Raises:
        SystemExit: bad arguments (argparse's usage error, code 2), or a refusal with a message
            naming what is wrong and what is valid -- bad seed lists, seeds of different models, an
            unknown ``--rank-with``, missing files, unusable checkpoints -- before any work where it
            can be known then."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.replot and args.attention_level:
        parser.error("--attention-level: --replot only re-draws the figures of ANALYSIS_JSON, whose numbers keep the "
                     "level they were computed at (settings.attention_level); run the analysis again to change it")
    if args.replot:
        if not os.path.isfile(args.replot):
            parser.error(f"--replot {args.replot}: no such file")
        figures = replot(args.replot, args.out)
        print(f"re-rendered {len(figures)} figures from {args.replot}")
        return 0
    if not args.data or not args.out:
        parser.error("--data and --out are required (unless --replot)")
    md_path = args.md or os.path.join(args.out, "analysis.md")
    if not md_path.endswith(".md"):
        parser.error(f"--md {args.md}: the Markdown page's name must end in .md")
    models = _labelled_seeds(args.checkpoint + args.compare, "--checkpoint")
    aer_models = _labelled_seeds(args.aer_checkpoint, "--aer-checkpoint")
    if not models and not aer_models:
        raise SystemExit("nothing to do: give --checkpoint and/or --aer-checkpoint")
    level = args.attention_level or "subword"
    if level == "word" and not models:
        raise SystemExit("--attention-level word applies to the --checkpoint analyses (sparsity, null rate, JS, "
                         "entropy, top-p, hallucination test, ranking); an --aer-checkpoint is scored on words "
                         "already, merged by its own rule (--aer-source-merge): give a --checkpoint or drop "
                         "--attention-level")
    if (args.rank_split or args.rank_raw) and not models:
        raise SystemExit("--rank-split/--rank-raw need a --checkpoint")
    if args.rank_split and args.rank_raw:
        raise SystemExit("--rank-split and --rank-raw exclude each other")
    if (args.rank_split or args.rank_raw) and args.rank_with and args.rank_with not in [l for l, _ in models]:
        raise SystemExit(f"--rank-with {args.rank_with!r} is not a label of --checkpoint; "
                         f"valid choices: {', '.join(l for l, _ in models)}")
    if not os.path.isdir(args.data):
        raise SystemExit(f"--data: not a directory: {args.data}")
    if level == "word":
        from .capture import check_bpe_symbols

        for name, symbols in _dictionary_symbols(args.data).items():
            try:
                check_bpe_symbols(symbols, os.path.join(args.data, name))
            except ValueError as err:
                raise SystemExit(f"--attention-level word: {err}") from None
    if aer_models and not os.path.isdir(args.aer_gold):
        raise SystemExit(f"--aer-gold: not a directory: {args.aer_gold}")
    aer_directions = {}
    for label, paths in aer_models:  # scored in the direction it was trained (ReLA §5.2: En->De), checked first
        directions = [_trained_direction(path) for path in paths]
        direction = directions[0]
        if direction not in (("de", "en"), ("en", "de")):
            raise SystemExit(f"--aer-checkpoint {label}: the model translates {direction[0]}->{direction[1]}; the RWTH "
                             "gold set aligns German and English, so AER needs a de->en or en->de model")
        if any(d != direction for d in directions):
            raise SystemExit(f"--aer-checkpoint {label}: its seeds translate in different directions ("
                             + ", ".join(f"{p}: {d[0]}->{d[1]}" for p, d in zip(paths, directions)) + ")")
        aer_directions[label] = direction
    for path in filter(None, [args.bpe_codes] + list(args.rank_raw or [])):
        if not os.path.isfile(path):
            raise SystemExit(f"not found: {path}")
    import torch

    import fairseq_plugins  # noqa: F401
    try:  # the user's attention functions / architectures (registered on import)
        import_user_dir(args.user_dir)
    except FileNotFoundError as e:  # not a directory: before any model is loaded
        raise SystemExit(str(e))
    from . import plots
    from .capture import hypothesis_batches, load_model_for_analysis, pairs_dataset
    from .. import provenance
    from ..atomic import atomic_path, write_json_atomic, write_text_atomic
    from .metrics import ffn_anisotropy
    from .report import (alignment_aer, analyze_dataset, cross_null_by_sentence, hallucination_test, rank_pairs,
                         seed_mean_aer, seed_mean_analysis)

    # the seeds of one label are one model: checked before any analysis or AER scoring runs
    seed_lists = [("--checkpoint", label, paths, args.data, (args.source_lang, args.target_lang))
                  for label, paths in models]
    seed_lists += [("--aer-checkpoint", label, paths, args.aer_data or args.data, aer_directions[label])
                   for label, paths in aer_models]
    for flag, label, paths, data, (src_lang, tgt_lang) in seed_lists:
        if len(paths) > 1:
            signatures = []
            for path in paths:
                model, task, info = _load_or_exit(load_model_for_analysis, path, data, src_lang, tgt_lang)
                signatures.append((provenance.repo_relative(os.path.abspath(path)),
                                   _seed_signature(model, task, info)))
                del model, task
            _refuse_unlike_seeds(flag, label, signatures)

    t0 = time.time()
    os.makedirs(os.path.join(args.out, "figures"), exist_ok=True)
    report = {
        "provenance": provenance.collect(provenance.command_line("fairseq-attention-analysis", argv)),
        "settings": {"taus": list(dict.fromkeys((1.0, *args.taus))),  # as AttentionStats uses them
                     "top_p": [f"{p:g}" for p in args.top_p], "max_tokens": args.max_tokens,
                     "seed": args.seed, "beam": args.beam, "attention_level": level},
        "data": {"dir": provenance.repo_relative(os.path.abspath(args.data)), "split": args.split},
        "models": {}, "aer": {},
    }
    figures = []
    ranking = bool(args.rank_split or args.rank_raw)
    first = None  # the ranking model: (label, [(model, task) per seed], attention_is_distribution)
    for label, paths in models:
        per_seed, kept = [], []
        for k, path in enumerate(paths):
            model, task, info = _load_or_exit(load_model_for_analysis, path, args.data, args.source_lang,
                                              args.target_lang, subsets=[args.split])
            dataset = _subset(task, task.dataset(args.split), args.limit)
            report["data"].update(direction=f"{task.cfg.source_lang}-{task.cfg.target_lang}", n_pairs=len(dataset))
            summary, heat = analyze_dataset(model, task, dataset, args.max_tokens, args.heatmap_ids if k == 0 else (),
                                            args.taus, args.top_p, level=level)
            training = provenance.trained_model(path)
            entry = {"checkpoint": provenance.repo_relative(os.path.abspath(path)), "sha256": training["sha256"], "training": training, "info": info,
                     "metrics": summary, "ffn_anisotropy": ffn_anisotropy(model)}
            if args.hallucination:
                entry["hallucination"] = hallucination_test(model, task, dataset, args.seed, args.max_tokens,
                                                            level=level)
            if args.on_hypotheses:
                src, hyp = hypothesis_batches(task, model, dataset, beam=args.beam, max_tokens=args.max_tokens)
                entry["on_hypotheses"], _ = analyze_dataset(model, task, pairs_dataset(task, src, hyp),
                                                            args.max_tokens, (), args.taus, args.top_p, level=level)
            per_seed.append(entry)
            if not args.no_figures:  # heatmaps: one model's weights (of a label's first seed; heads do not align)
                name, who = (label, label) if len(paths) == 1 else (
                    f"{label}_firstseed", f"{label}, the first of its {len(paths)} seeds (`{entry['checkpoint']}`)")
                for h in heat:
                    for kind in args.heatmap_kinds:
                        rows = h["src"] if kind == "encoder" else h["prev"]
                        cols = h["prev"] if kind == "decoder" else h["src"]
                        figures.append(plots.heatmap_grid(
                            h["weights"][kind], rows, cols,
                            os.path.join(args.out, "figures", f"heatmap_{name}_{kind}_{h['id']}.png"),
                            title=f"{who}: {kind} attention, sentence {h['id']} (rows: queries; ∅ = null row)"
                                  + ("; subword weights" if level == "word" else "")))
            is_distribution = entry["metrics"]["cross"]["attention_is_distribution"]
            ranker_wanted = args.rank_with == label if args.rank_with else (
                first is None or (first[2] and not is_distribution))
            if ranking and ranker_wanted:
                kept.append((model, task))
            del model
        if len(per_seed) == 1:
            report["models"][label] = per_seed[0]
        else:
            try:
                report["models"][label] = seed_mean_analysis(per_seed)
            except ValueError as err:
                raise SystemExit(f"--checkpoint {label}: {err}") from None
        if kept:
            first = (label, kept, is_distribution)
    if ranking:
        label, kept, _ = first  # a --rank-with that names no label was refused before any work
        task = kept[0][1]
        if args.rank_split:
            task.load_dataset(args.rank_split)
            ds = task.dataset(args.rank_split)
            s_txt = [task.source_dictionary.string(ds.src[i], "subword_nmt") for i in range(len(ds))]
            t_txt = [task.target_dictionary.string(ds.tgt[i], "subword_nmt") for i in range(len(ds))]
            corpus = f"split {args.rank_split} of {provenance.repo_relative(os.path.abspath(args.data))}"
            name = args.rank_split
        else:
            src, tgt, s_txt, t_txt = _raw_pairs(task, args.rank_raw, task.cfg.source_lang, task.cfg.target_lang,
                                                args.bpe_codes, args.rank_pretokenized, escape=args.moses_escape,
                                                aggressive_dash_splits=args.moses_dash_splits)
            ds = pairs_dataset(task, src, tgt)
            corpus = " + ".join(provenance.repo_relative(os.path.abspath(p)) for p in args.rank_raw)
            corpus += (" (pretokenized)" if args.rank_pretokenized else
                       f" (MosesTokenizer escape={args.moses_escape}, aggressive_dash_splits={args.moses_dash_splits}"
                       + (f"; BPE {provenance.repo_relative(os.path.abspath(args.bpe_codes))})" if args.bpe_codes
                          else "; no BPE)"))
            name = "raw"
        # a label of several seeds ranks by the seed mean of each pair's null rate (NaN if one seed's is)
        per_seed_scores = [cross_null_by_sentence(model, task, ds, args.max_tokens, level=level) for model, _ in kept]
        scores = per_seed_scores[0] if len(kept) == 1 else torch.stack(per_seed_scores).mean(dim=0)
        del kept, first
        order = rank_pairs(scores)
        out_file = args.rank_out or os.path.join(args.out, f"ranked_{name}.tsv")
        with atomic_path(out_file) as tmp, open(tmp, "w", encoding="utf-8", newline="\n") as f:
            f.write("rank\tindex\tcross_null_rate\tsource\ttarget\n")
            for r, i in enumerate(order, 1):
                f.write(f"{r}\t{i}\t{float(scores[i]):.6f}\t{s_txt[i]}\t{t_txt[i]}\n")
        finite = scores[~torch.isnan(scores)]
        report["ranking"] = {"model": label, "corpus": corpus, "file": provenance.repo_relative(os.path.abspath(out_file)),
                             "attention_level": level,
                             "n_pairs": len(order), "mean": float(finite.mean()) if len(finite) else None,
                             "min": float(finite.min()) if len(finite) else None,
                             "max": float(finite.max()) if len(finite) else None}
        if len(per_seed_scores) > 1:  # each seed's mean null rate over the corpus, and their sample sd
            from .report import seed_sd

            means = [float(x[~torch.isnan(x)].mean()) if bool((~torch.isnan(x)).any()) else None
                     for x in per_seed_scores]
            report["ranking"].update(seeds=len(per_seed_scores), mean_per_seed=means, mean_seed_sd=seed_sd(means))
    for label, paths in aer_models:
        src_lang, tgt_lang = aer_directions[label]
        per_seed = []
        for path in paths:
            model, task, info = _load_or_exit(load_model_for_analysis, path, args.aer_data or args.data, src_lang,
                                              tgt_lang)
            res = alignment_aer(model, task, args.aer_gold, args.bpe_codes, src_lang, tgt_lang,
                                cased=not args.aer_lowercase, max_tokens=args.max_tokens, limit=args.aer_limit,
                                source_merge=args.aer_source_merge, escape=args.moses_escape,
                                aggressive_dash_splits=args.moses_dash_splits)
            training = provenance.trained_model(path)
            res.update(checkpoint=provenance.repo_relative(os.path.abspath(path)), sha256=training["sha256"],
                       training=training, info=info)
            per_seed.append(res)
            del model
        if len(per_seed) == 1:
            report["aer"][label] = per_seed[0]
            continue
        try:
            report["aer"][label] = dict(seed_mean_aer(per_seed), info=per_seed[0]["info"])
        except ValueError as err:
            raise SystemExit(f"--aer-checkpoint {label}: {err}") from None
    if not args.no_figures:
        figures += curve_figures(report, args.out)
    report["figures"] = [os.path.relpath(f, args.out) for f in figures]
    report["provenance"]["wall_s"] = round(time.time() - t0, 1)
    report["data"].setdefault("direction", "de-en")
    report["data"].setdefault("n_pairs", 0)
    write_json_atomic(os.path.join(args.out, "analysis.json"), report)
    write_text_atomic(md_path, render_markdown(report))
    print(f"wrote {md_path}, {os.path.join(args.out, 'analysis.json')} and {len(figures)} figures "
          f"in {report['provenance']['wall_s']} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
