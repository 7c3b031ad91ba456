#!/usr/bin/env python
"""Fill a results table row by row, resumably, from a table spec in ``configs/<paper>/``.

Each row is one :mod:`experiment` run (the table's one budget for every row) in
``<runs>/row<id>`` (or the ``run:`` directory of another table's row when the direction and
budget are the same, so a run is never repeated); a finished row is not re-run, an interrupted
one resumes from its checkpoints.  After every row the Markdown table ``out`` is re-rendered
from all finished rows, with the paper's numbers beside ours and each row's provenance.

Usage:
    python scripts/run_table.py --table configs/reluformer/table4_multi30k.yaml \\
        [--rows 1,5] [--max-rows K] [--render-only]

Table spec (YAML): ``title``, ``intro`` (Markdown), ``out``, ``runs``, ``budget``, ``src``,
``tgt``, ``subsets`` (fairseq subset -> column label; must be the budget's subsets),
``paper_label``, optional ``metrics`` (final-validation metrics shown as columns, e.g.
``attn_entropy``), optional ``ribes: true`` (each score cell also shows RIBES on the tokenized
text, as the flexible-attention paper reports for En-Ja), and ``rows``: ``id``, ``name``, ``arch``, optional ``fns`` (encoder, decoder,
cross), ``extra`` (fairseq-train flags), ``run`` (reuse a directory), ``budget`` (a row-specific
budget, e.g. one per document length; same subsets), ``paper`` (shown verbatim).  Optional
``analyses``: ``[{name, script, key}]`` -- after a row is trained, ``script`` is run as
``python SCRIPT --checkpoint <evaluated ckpt> --data-bin <bin> --src S --tgt T --json
<run>/analysis_<name>.json`` (once) and ``json[key][0]`` is shown as a column.

A row whose training diverges or does not learn (final validation loss NaN or above 90% of
the loss of a uniform prediction) is reported as "–" with its loss curve, as the papers do.
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
REQUIRED = ("title", "out", "runs", "budget", "src", "tgt", "subsets", "paper_label", "rows")


def load_table(path):
    """Read and check a table spec.

    Raises:
        SystemExit: missing file or keys, duplicate row ids, or subsets that differ from the
            budget's (the message names what is wrong and the valid values).
    """
    if not os.path.exists(path):
        raise SystemExit(f"table spec not found: {path}")
    spec = yaml.safe_load(open(path))
    missing = [k for k in REQUIRED if k not in spec]
    if missing:
        raise SystemExit(f"{path}: missing keys {missing}; required: {list(REQUIRED)}")
    ids = [r["id"] for r in spec["rows"]]
    if len(set(ids)) != len(ids):
        raise SystemExit(f"{path}: duplicate row ids in {ids}")
    for row in spec["rows"]:
        budget = experiment.load_budget(row_budget(spec, row))
        if list(spec["subsets"]) != list(budget["data"]["subsets"]):
            raise SystemExit(f"{path}: subsets {list(spec['subsets'])} differ from those of budget "
                             f"{row_budget(spec, row)}: {budget['data']['subsets']}")
        row["_budget"] = budget
    spec["_path"] = path
    return spec


def row_budget(spec, row):
    return row.get("budget") or spec["budget"]


def run_dir(spec, row):
    return os.path.join(ROOT, row.get("run") or os.path.join(spec["runs"], f"row{row['id']}"))


def row_failed(res, vocab_size):
    valid = [v for _, v in res.get("valid_loss", [])]
    if not valid:
        return False
    last = valid[-1]
    return not math.isfinite(last) or (vocab_size is not None and last > 0.9 * math.log2(vocab_size))


def train_seconds(res, rdir):
    """Cumulative training wall time: fairseq's own counter (kept in the checkpoint across
    kills/resumes) when recorded, else the runner's sum over completed invocations."""
    from_ckpt = res["wall_s"].get("train_fairseq_cumulative")
    if from_ckpt:
        return from_ckpt
    ckpt = os.path.join(rdir, "checkpoints", "checkpoint_last.pt")
    if os.path.exists(ckpt):
        sys.path.insert(0, ROOT)
        from fairseq_plugins.checkpoint import load_checkpoint

        return float(load_checkpoint(ckpt)["extra_state"].get("previous_training_time", 0.0))
    return res["wall_s"].get("train", 0.0)


def resumes(rdir):
    """How often the row's training restarted from a checkpoint (from its train.log)."""
    log = os.path.join(rdir, "train.log")
    if not os.path.exists(log):
        return "?"
    return sum(1 for line in open(log) if "Loaded checkpoint" in line and "@ 0 updates" not in line)


def _vocab(spec, row):
    prep = row["_budget"]["data"]
    base = os.path.join(ROOT, prep.get("out", os.path.join("data-bin", f"{prep['corpus']}_en_de")))
    path = os.path.join(base, prep.get("variant", ""), "bin", f"dict.{spec['tgt']}.txt")
    return sum(1 for _ in open(path)) + 4 if os.path.exists(path) else None


def run_analyses(spec, row):
    """Run the table's analyses on a finished row (skipping those already done)."""
    rdir = run_dir(spec, row)
    res_path = os.path.join(rdir, "result.json")
    if not os.path.exists(res_path):
        return
    res = json.load(open(res_path))
    if res.get("status") != "done":
        return
    ckpt, _ = experiment.decode_checkpoint(row["_budget"], rdir)
    for an in spec.get("analyses") or []:
        out = os.path.join(rdir, f"analysis_{an['name']}.json")
        if os.path.exists(out) and os.path.getmtime(out) >= os.path.getmtime(ckpt):
            continue
        experiment.run([sys.executable, os.path.join(ROOT, an["script"]), "--checkpoint", ckpt,
                        "--data-bin", os.path.join(ROOT, res["data"]["prep_dir"], "bin"),
                        "--src", spec["src"], "--tgt", spec["tgt"], "--json", out])


def _analysis_cells(spec, row):
    cells = []
    for an in spec.get("analyses") or []:
        path = os.path.join(run_dir(spec, row), f"analysis_{an['name']}.json")
        cells.append(f"{json.load(open(path))[an['key']][0]:.3f}" if os.path.exists(path) else "n/a")
    return cells


def _score_cell(score, spec):
    """``"BLEU (tokBLEU)"``, plus ``" / RIBES"`` when the spec asks for ``ribes``.

    Raises:
        ValueError: ``ribes`` requested but the row was scored without it (re-evaluate the row).
    """
    cell = f"{score['bleu']:.2f} ({score['tok_bleu']:.2f})"
    if spec.get("ribes"):
        if score.get("tok_ribes") is None:
            raise ValueError(f"the table asks for RIBES but {score.get('hyp')} was scored without it; "
                             "delete the row's result.json and eval/ directory and re-run the table to re-score")
        cell += f" / {score['tok_ribes']:.4f}"
    return cell


def render(spec):
    """Write the Markdown table ``spec['out']`` (atomically) from the finished rows."""
    rows, subsets, metrics = spec["rows"], spec["subsets"], spec.get("metrics") or []
    analyses = [an["name"] for an in spec.get("analyses") or []]
    results = {}
    for r in rows:
        path = os.path.join(run_dir(spec, r), "result.json")
        if os.path.exists(path):
            results[r["id"]] = json.load(open(path))
    table_path = os.path.relpath(spec["_path"], ROOT)
    lines = [f"# {spec['title']}", "", spec.get("intro", "").strip(), "",
             f"Regenerate: `python scripts/run_table.py --table {table_path}` (runs missing rows, "
             "resumes unfinished ones, re-renders this file). Budget: "
             f"`{spec['budget']}` unless a row names its own, direction "
             f"{spec['src']}→{spec['tgt']}. Train wall = fairseq's cumulative training time; rows that "
             "shared the machine with other jobs, or were killed and resumed, ran slower than alone.", ""]
    head = ["ID", "Model", spec["paper_label"]] + [f"ours {lab}" for lab in subsets.values()] \
        + [f"valid {m}" for m in metrics] + analyses + ["updates", "train wall", "status"]
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        paper = "–" if r.get("paper") is None else str(r["paper"])
        res = results.get(r["id"])
        if res is None:
            lines.append("| " + " | ".join([str(r["id"]), r["name"], paper] + ["not run yet"] * len(subsets)
                                           + [""] * (len(metrics) + len(analyses) + 2) + ["pending"]) + " |")
            continue
        failed = res.get("status") == "failed" or row_failed(res, _vocab(spec, r))
        cells = ["–"] * len(subsets) if failed else [_score_cell(res["scores"][s], spec) for s in subsets]
        last = res.get("valid_last", {})
        mcells = [f"{last[m]:.3f}" if m in last else "n/a" for m in metrics]
        status = "failed to train (see loss curve below)" if failed else "done"
        lines.append("| " + " | ".join([str(r["id"]), r["name"], paper] + cells + mcells
                                       + _analysis_cells(spec, r) + [
            str(res["updates"]), f"{train_seconds(res, run_dir(spec, r)) / 60:.1f} min", status]) + " |")
    lines += ["", "SacreBLEU (detokenised) with tokenized BLEU in brackets"
              + ("; RIBES (Isozaki et al. 2010, nltk, tokenized text) after the slash." if spec.get("ribes") else "."),
              "", "## Provenance", ""]
    if results:
        any_res = next((x for x in results.values() if x.get("scores")), next(iter(results.values())))
        first = next(iter(subsets))
        sig = any_res["scores"][first]["signature"] if any_res.get("scores") else "n/a"
        lines += [f"- SacreBLEU signature: `{sig}`", f"- hardware: {any_res['hardware']}",
                  f"- data: {any_res['data']}", ""]
    for r in rows:
        res = results.get(r["id"])
        if res is None:
            continue
        rdir = run_dir(spec, r)
        lines += [f"### Row {r['id']}: {r['name']}", ""]
        if res.get("status") == "failed":
            lines += ["- training stopped with an error: `" + " / ".join(res.get("error_tail", [])[-2:]) + "`"]
        lines += [f"- run directory: `{os.path.relpath(rdir, ROOT)}`; git commit: `{res['git_commit']}`; "
                  f"finished {res['time']}",
                  f"- attention functions: {res['attention_fns']}",
                  f"- command: `{res['commands']['train']}`",
                  f"- updates: {res['updates']}; training time {train_seconds(res, rdir):.0f} s (fairseq "
                  f"cumulative); resumed {resumes(rdir)} time(s); runner-timed stages of the last invocation (s): "
                  + ", ".join(f"{k} {v:.0f}" for k, v in sorted(res['wall_s'].items())
                              if k != "train_fairseq_cumulative"),
                  "- validation loss (update, loss): " + ", ".join(f"({u}, {l:.3f})" for u, l in res["valid_loss"]),
                  "- training loss curve (update, loss): "
                  + ", ".join(f"({u}, {l:.2f})" for u, l in res["loss_curve"][:: max(1, len(res["loss_curve"]) // 10)]),
                  ""]
    lines += ["", f"_Rendered by scripts/run_table.py from {table_path}; git commit of each row above._", ""]
    out = os.path.join(ROOT, spec["out"])
    os.makedirs(os.path.dirname(out), exist_ok=True)
    experiment.remove_leftovers(os.path.dirname(out), names=[os.path.basename(out)])  # of a killed render
    with experiment.atomic_path(out) as tmp, open(tmp, "w") as f:
        f.write("\n".join(lines))
    print(f"[table] wrote {out} ({len(results)}/{len(rows)} rows)")


def main(argv=None, default_table=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--table", default=default_table, required=default_table is None,
                   help="table spec YAML, e.g. configs/reluformer/table4_multi30k.yaml")
    p.add_argument("--rows", help="comma-separated row ids, run in this order (default: all)")
    p.add_argument("--max-rows", type=int, help="stop after running this many rows")
    p.add_argument("--render-only", action="store_true")
    a = p.parse_args(argv)
    spec = load_table(a.table if os.path.isabs(a.table) else os.path.join(ROOT, a.table))
    by_id = {r["id"]: r for r in spec["rows"]}
    todo = list(by_id) if not a.rows else [int(x) for x in a.rows.split(",")]
    bad = [i for i in todo if i not in by_id]
    if bad:
        p.error(f"unknown row ids {bad}; valid: {list(by_id)}")
    done = 0
    for r in ([] if a.render_only else [by_id[i] for i in todo]):  # in the order given
        if a.max_rows is not None and done >= a.max_rows:
            break
        out = run_dir(spec, r)
        if os.path.exists(os.path.join(out, "result.json")):
            print(f"[table] row {r['id']} already done ({os.path.relpath(out, ROOT)})")
            continue
        argv_exp = ["--out", out, "--arch", r["arch"], "--budget", os.path.join(ROOT, row_budget(spec, r)),
                    "--src", spec["src"], "--tgt", spec["tgt"], "--name", f"row{r['id']}: {r['name']}"]
        if r.get("fns"):
            argv_exp += ["--fns", *r["fns"]]
        if r.get("extra"):
            argv_exp += ["--extra", r["extra"]]
        if spec.get("ribes"):
            argv_exp.append("--ribes")
        t0 = time.time()
        try:
            experiment.main(argv_exp)
        except Exception as err:  # a diverged row must not stop the table
            print(f"[table] row {r['id']} raised {type(err).__name__}: {err}", file=sys.stderr)
        print(f"[table] row {r['id']} took {(time.time() - t0) / 60:.1f} min")
        done += 1
        render(spec)
    for r in ([] if a.render_only else [by_id[i] for i in todo]):
        try:
            run_analyses(spec, r)
        except Exception as err:  # an analysis failure must not lose the table
            print(f"[table] analyses of row {r['id']} raised {type(err).__name__}: {err}", file=sys.stderr)
    render(spec)


if __name__ == "__main__":
    main()
