#!/usr/bin/env python
"""Fill ReLA Table 1 (rows 1-13) on Multi30k En->De, row by row, resumably.

Each row is one :mod:`experiment` run (same budget for all rows) in ``runs/rela_table1/row<N>``;
a finished row is not re-run, an interrupted one resumes from its checkpoints.  After every
row the Markdown table ``results/rela/table1_multi30k.md`` is re-rendered from all finished
rows, with the paper's WMT14 numbers beside ours and each row's provenance.

Usage:
    python scripts/rela_table1.py [--rows 1,7,13] [--max-rows K] [--budget FILE] [--render-only]

A row whose training diverges or does not learn (final validation loss NaN or above 90% of
the loss of a uniform prediction) is reported as "–" with its loss curve, as the paper does.
"""

import argparse
import json
import math
import os
import sys
import time

import yaml

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import experiment  # noqa: E402

ROOT = experiment.ROOT
ROWS = os.path.join(ROOT, "configs", "rela", "table1_rows.yaml")
RUNS = os.path.join(ROOT, "runs", "rela_table1")
OUT = os.path.join(ROOT, "results", "rela", "table1_multi30k.md")
SETS = {"test": "test_2016_flickr", "test1": "test_2017_flickr"}


def row_failed(res, vocab_size):
    valid = [v for _, v in res.get("valid_loss", [])]
    if not valid:
        return False
    last = valid[-1]
    return not math.isfinite(last) or last > 0.9 * math.log2(vocab_size)


def train_minutes(res):
    """Cumulative training wall time in minutes: fairseq's own counter (kept in the checkpoint
    across kills/resumes) when recorded, else the runner's sum over completed invocations."""
    from_ckpt = res["wall_s"].get("train_fairseq_cumulative")
    if from_ckpt:
        return from_ckpt / 60
    ckpt = os.path.join(RUNS, res.get("_row", ""), "checkpoints", "checkpoint_last.pt")
    if res.get("_row") and os.path.exists(ckpt):
        sys.path.insert(0, ROOT)
        from fairseq_plugins.checkpoint import load_checkpoint

        return float(load_checkpoint(ckpt)["extra_state"].get("previous_training_time", 0.0)) / 60
    return res["wall_s"].get("train", 0.0) / 60


def resumes(res):
    """How often the row's training restarted from a checkpoint (from its train.log, if present)."""
    log = os.path.join(RUNS, res.get("_row", ""), "train.log")
    if not (res.get("_row") and os.path.exists(log)):
        return "?"
    return sum(1 for line in open(log) if "Loaded checkpoint" in line and "@ 0 updates" not in line)


def render(rows, budget_file):
    results = {}
    for r in rows:
        path = os.path.join(RUNS, f"row{r['id']}", "result.json")
        if os.path.exists(path):
            results[r["id"]] = dict(json.load(open(path)), _row=f"row{r['id']}")
    vocab = None
    dict_path = os.path.join(ROOT, "data-bin", "multi30k_en_de", "bin", "dict.en.txt")
    if os.path.exists(dict_path):
        vocab = sum(1 for _ in open(dict_path)) + 4
    lines = [
        "# ReLA Table 1 on Multi30k En→De (`rela_transformer_small`, CPU budget)",
        "",
        "Paper: Zhang, Titov & Sennrich (2021), *Sparse Attention with Linear Units*, Table 1 "
        "(WMT14 En-De, Transformer base, SacreBLEU with tokenized BLEU in brackets).",
        "Ours: Multi30k Task 1 En→De (29K training pairs), 3+3-layer d=256 model, every row trained "
        f"with the same budget (`{os.path.relpath(budget_file, ROOT)}`), last checkpoints averaged, "
        "beam 4, length penalty 0.6, detokenised SacreBLEU on test_2016_flickr / test_2017_flickr "
        "(tokenized BLEU in brackets). Train wall = fairseq's cumulative training time on 2 CPU cores; rows "
        "that shared the machine with other jobs, or were killed and resumed (counted per row below), "
        "ran slower than they would alone. "
        "Multi30k BLEU is not comparable in absolute value with WMT14; "
        "compare rows with row 1, which is fairseq's stock `transformer` at the same size.",
        "",
        "Regenerate: `python scripts/rela_table1.py` (runs missing rows, resumes unfinished ones, "
        "re-renders this file).",
        "",
        "| ID | Model | paper WMT14 | ours test2016 | ours test2017 | updates | train wall | status |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        paper = "–" if r["paper"] is None else f"{r['paper']:.1f} ({r['paper_tok']:.2f})"
        res = results.get(r["id"])
        if res is None:
            lines.append(f"| {r['id']} | {r['name']} | {paper} | not run yet | not run yet | | | pending |")
            continue
        failed = res.get("status") == "failed" or (vocab is not None and row_failed(res, vocab))
        cells = ["–", "–"] if failed else [
            f"{res['scores'][s]['bleu']:.2f} ({res['scores'][s]['tok_bleu']:.2f})" for s in SETS]
        status = "failed to train (see loss curve below)" if failed else "done"
        lines.append(f"| {r['id']} | {r['name']} | {paper} | {cells[0]} | {cells[1]} | {res['updates']} | "
                     f"{train_minutes(res):.1f} min | {status} |")
    lines += ["", "## Provenance", ""]
    if results:
        any_res = next((x for x in results.values() if x.get("scores")), next(iter(results.values())))
        sig = any_res["scores"]["test"]["signature"] if any_res.get("scores") else "n/a"
        lines += [f"- SacreBLEU signature: `{sig}`",
                  f"- hardware: {any_res['hardware']}",
                  f"- data: {any_res['data']}", ""]
    for r in rows:
        res = results.get(r["id"])
        if res is None:
            continue
        lines += [f"### Row {r['id']}: {r['name']}", ""]
        if res.get("status") == "failed":
            lines += ["- training stopped with an error: `" + " / ".join(res.get("error_tail", [])[-2:]) + "`"]
        lines += [f"- git commit: `{res['git_commit']}`; finished {res['time']}",
                  f"- attention functions: {res['attention_fns']}",
                  f"- command: `{res['commands']['train']}`",
                  f"- updates: {res['updates']}; training time {train_minutes(res) * 60:.0f} s (fairseq cumulative); "
                  f"resumed {resumes(res)} time(s); runner-timed stages of the last invocation (s): "
                  + ", ".join(f"{k} {v:.0f}" for k, v in sorted(res['wall_s'].items())
                              if k != "train_fairseq_cumulative"),
                  "- validation loss (update, loss): " + ", ".join(f"({u}, {l:.3f})" for u, l in res["valid_loss"]),
                  "- training loss curve (update, loss): "
                  + ", ".join(f"({u}, {l:.2f})" for u, l in res["loss_curve"][:: max(1, len(res["loss_curve"]) // 10)]),
                  ""]
    lines += ["", "_Rendered by scripts/rela_table1.py; git commit of each row above._", ""]
    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    with experiment.atomic_path(OUT) as tmp, open(tmp, "w") as f:
        f.write("\n".join(lines))
    print(f"[table1] wrote {OUT} ({len(results)}/{len(rows)} rows)")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", help="comma-separated row ids, run in this order (default: all, 1..13)")
    p.add_argument("--max-rows", type=int, help="stop after running this many rows")
    p.add_argument("--budget", default=os.path.join(ROOT, "configs", "multi30k", "small_cpu.yaml"))
    p.add_argument("--render-only", action="store_true")
    a = p.parse_args()
    rows = yaml.safe_load(open(ROWS))["rows"]
    ids = [r["id"] for r in rows]
    todo = ids if not a.rows else [int(x) for x in a.rows.split(",")]
    bad = [i for i in todo if i not in ids]
    if bad:
        p.error(f"unknown row ids {bad}; valid: {ids}")
    done = 0
    by_id = {r["id"]: r for r in rows}
    for r in ([] if a.render_only else [by_id[i] for i in todo]):  # in the order given
        if a.max_rows is not None and done >= a.max_rows:
            break
        out = os.path.join(RUNS, f"row{r['id']}")
        if os.path.exists(os.path.join(out, "result.json")):
            print(f"[table1] row {r['id']} already done")
            continue
        argv = ["--out", out, "--arch", r["arch"], "--budget", a.budget, "--name", f"row{r['id']}: {r['name']}"]
        if r.get("fns"):
            argv += ["--fns", *r["fns"]]
        t0 = time.time()
        try:
            experiment.main(argv)
        except Exception as err:  # a diverged row must not stop the table
            print(f"[table1] row {r['id']} raised {type(err).__name__}: {err}", file=sys.stderr)
        print(f"[table1] row {r['id']} took {(time.time() - t0) / 60:.1f} min")
        done += 1
        render(rows, a.budget)
    render(rows, a.budget)


if __name__ == "__main__":
    main()
