"""Fill a results table row by row, resumably, from a table spec in ``configs/<paper>/``.

Each row is one :mod:`mt_pipeline.experiment` run (the table's one budget for every row) in
``<runs>/row<id>`` (or the ``run:`` directory of another table's row when the direction and
budget are the same, so a run is never repeated); a finished row is not re-run, an interrupted
one resumes from its checkpoints.  After every row the Markdown table ``out`` is re-rendered
from all finished rows, with the paper's numbers beside ours, the budget's regime, seeds,
significance against the reference row, a validation-loss figure and each row's provenance.

Usage (``mt-table``; also ``python scripts/run_table.py``)::

    mt-table --table configs/reluformer/table4_multi30k.yaml [--rows 1,5] [--max-rows K]
        [--budget configs/multi30k/converged.yaml] [--seeds 1,2,3] [--render-only]

``--budget`` runs the whole table under another budget (e.g. the converged one): its runs go to
``runs/<regime>/...`` and its table to ``<out>_<regime>.md``, so the smoke-test runs are kept (a
budget with a ``tag``, e.g. ``converged_6k`` for twice the converged updates, uses the tag instead, so
its runs are kept apart from the regime's).
``--seeds`` trains every row once per seed (the budget's own seed in the row's directory, seed
``k`` in ``<dir>-seed<k>``); the table then shows mean ± sd over seeds and says whether each
row's difference to the reference row exceeds seed noise (:mod:`mt_pipeline.significance`).

Table spec (YAML): ``title``, ``intro`` (Markdown), ``out``, ``runs``, ``budget``, ``src``,
``tgt``, ``subsets`` (fairseq subset -> column label; must be the budget's subsets),
``paper_label``, optional ``reference`` (the row id the others are tested against, or a list of
row ids: one ``vs row R`` column each, e.g. a study's baseline and its ablation's zero setting;
default the first row; ``[]``: none), ``metrics`` (final-validation metrics shown as columns, e.g. ``attn_entropy``),
``ribes: true`` (RIBES after each score), ``analyses`` (``[{name, script, key}]``: after a row is
trained, ``python SCRIPT --checkpoint <evaluated ckpt> --data-bin <bin> --src S --tgt T --json
<run>/analysis_<name>.json`` runs once and ``json[key][0]`` is shown as a column), and ``rows``:
``id``, ``name``, ``arch``, optional ``fns`` (encoder, decoder, cross), ``extra``
(fairseq-train flags), ``vs`` (the row id this row is tested against in one ``vs its reference``
column, e.g. the ReLU row of the same FFN size in a sweep), ``run`` (reuse a directory), ``budget`` (a row-specific budget, e.g. one
per document length; same subsets), ``paper`` (shown verbatim).  Optional ``user_dir``: a fairseq
``--user-dir`` of the researcher's own (repo-relative or absolute; an attention function registered
outside the plugin, docs/extending.md) with which every row is trained, evaluated and analysed
(``mt-experiment --user-dir``, which records its files' SHA-256).

A row whose training diverges or does not learn (final validation loss NaN or above 90% of the
loss of a uniform prediction) is reported as "–" with its loss curve, as the papers do.
"""

import argparse
import json
import math
import os
import sys
import time
from typing import Dict, List, Optional

import yaml

from . import experiment
from .atomic import atomic_path, remove_leftovers, write_json_atomic
from .budget import REGIMES, load_budget, regime, run_tag
from .provenance import ROOT

REQUIRED = ("title", "out", "runs", "budget", "src", "tgt", "subsets", "paper_label", "rows")


def load_table(path: str, budget: Optional[str] = None) -> Dict:
    """Read and check a table spec; with ``budget``, run it under that budget instead (see the
    module docstring: ``runs/<regime>/`` and ``<out>_<regime>.md``, or the budget's ``tag``).

    Raises:
        SystemExit: missing file or keys, duplicate row ids, subsets that differ from the
            budget's, ``budget`` given for a spec whose rows have their own budgets, or a row tested
            against a row scored on other data (the reference or its ``vs`` row: the paired bootstrap
            pairs the two test sets line by line).
    """
    if not os.path.exists(path):
        raise SystemExit(f"table spec not found: {path}")
    with open(path) as f:
        spec = yaml.safe_load(f)
    missing = [k for k in REQUIRED if k not in spec]
    if missing:
        raise SystemExit(f"{path}: missing keys {missing}; required: {list(REQUIRED)}")
    ids = [r["id"] for r in spec["rows"]]
    if len(set(ids)) != len(ids):
        raise SystemExit(f"{path}: duplicate row ids in {ids}")
    refs = reference_ids(spec) if spec.get("reference") is not None else []
    bad = [r for r in refs if r not in ids]
    if bad or len(set(refs)) != len(refs):
        raise SystemExit(f"{path}: reference {spec['reference']!r} must be one row id or a list of distinct row "
                         f"ids; {'not row ids: ' + str(bad) if bad else 'repeated ids'}; valid: {ids}")
    bad_vs = [r["id"] for r in spec["rows"] if r.get("vs") is not None and (r["vs"] not in ids or r["vs"] == r["id"])]
    if bad_vs:
        raise SystemExit(f"{path}: rows {bad_vs} name a `vs` that is not another row's id; valid: {ids}")
    if budget:
        own = [r["id"] for r in spec["rows"] if r.get("budget")]
        if own:
            raise SystemExit(f"{path}: rows {own} have their own budgets; --budget applies to tables whose rows "
                             "all use the table's budget")
        tag = run_tag(load_budget(budget))  # the regime, or the budget's own tag (e.g. converged_6k)
        spec["budget"] = os.path.relpath(budget, ROOT) if os.path.isabs(budget) else budget
        spec["out"] = spec["out"][:-3] + f"_{tag}.md" if spec["out"].endswith(".md") else spec["out"] + f"_{tag}"
        spec["_tag"] = tag
    for row in spec["rows"]:
        b = load_budget(row_budget(spec, row))
        if not budget and run_tag(b) != regime(b):  # its runs would land in (and its evidence mix with) the regime's
            raise SystemExit(f"{path}: row {row['id']} trains under {row_budget(spec, row)}, whose tag "
                             f"{run_tag(b)!r} names the directories of tables run under it with --budget "
                             "(mt-table --budget, a campaign plan's budget:); give it that way, not as the "
                             "table's or a row's own budget")
        if list(spec["subsets"]) != list(b["data"]["subsets"]):
            raise SystemExit(f"{path}: subsets {list(spec['subsets'])} differ from those of budget "
                             f"{row_budget(spec, row)}: {b['data']['subsets']}")
        row["_budget"] = b
    by_id = {r["id"]: r for r in spec["rows"]}
    for row in spec["rows"]:  # a significance test pairs hypotheses of one test set, line by line
        tested_against = [i for i in reference_ids(spec) if i != row["id"]]
        if row.get("vs") is not None:
            tested_against.append(row["vs"])
        for other in tested_against:
            if row["_budget"]["data"] != by_id[other]["_budget"]["data"]:
                raise SystemExit(f"{path}: row {row['id']} is tested against row {other}, whose test set is another "
                                 f"({row_budget(spec, row)} vs {row_budget(spec, by_id[other])}: data "
                                 f"{row['_budget']['data']} vs {by_id[other]['_budget']['data']}); give row {row['id']} "
                                 "a `vs:` row scored on its own data, or the spec `reference: []`")
    if spec.get("user_dir"):  # every row's run and analyses load it (experiment_argv, run_analyses)
        user_dir = spec["user_dir"] if os.path.isabs(spec["user_dir"]) else os.path.join(ROOT, spec["user_dir"])
        if not os.path.isdir(user_dir):
            raise SystemExit(f"{path}: user_dir {spec['user_dir']!r} is not a directory ({user_dir})")
        spec["_user_dir"] = user_dir
    spec["_path"] = path
    return spec


def reference_ids(spec: Dict) -> List[int]:
    """The row ids every row is tested against (spec ``reference``: one id or a list; default the
    first row), in the order of their ``vs row R`` columns."""
    refs = spec.get("reference")
    if refs is None:
        return [spec["rows"][0]["id"]]
    return list(refs) if isinstance(refs, list) else [refs]


def row_budget(spec: Dict, row: Dict) -> str:
    """The budget path of ``row`` as the spec gives it: the row's own ``budget``, else the table's."""
    return row.get("budget") or spec["budget"]


def run_dir(spec: Dict, row: Dict, seed: Optional[int] = None) -> str:
    """The run directory of ``row`` (for ``seed``: the budget's own seed, or None, is the row's
    directory; seed ``k`` is ``<dir>-seed<k>``).  Under a ``--budget`` override the leading
    ``runs/`` becomes ``runs/<tag>/`` (an absolute ``.../rowN``: ``.../<tag>/rowN``), the tag
    being the budget's regime or its own ``tag`` (:func:`mt_pipeline.budget.run_tag`)."""
    rel = row.get("run") or os.path.join(spec["runs"], f"row{row['id']}")
    reg = spec.get("_tag")
    if reg:  # runs/<x>/rowN -> runs/<tag>/<x>/rowN; an absolute /a/b/rowN -> /a/b/<tag>/rowN
        parts = rel.split(os.sep)
        if os.path.isabs(rel):
            rel = os.path.join(os.path.dirname(rel), reg, os.path.basename(rel))
        else:
            rel = os.path.join("runs", reg, *(parts[1:] if parts[0] == "runs" else parts))
    base = os.path.join(ROOT, rel)
    if seed is None or seed == _default_seed(row):
        return base
    return f"{base}-seed{seed}"


def _default_seed(row: Dict) -> int:
    return int(row["_budget"]["train"].get("seed", 1))


def row_regime(row: Dict) -> str:
    """The regime of the budget a (loaded) row trains with."""
    return regime(row["_budget"])


def _seed_dirs(parent: str, name: str) -> List[str]:
    if not os.path.isdir(parent):
        return []
    return [os.path.join(parent, n) for n in os.listdir(parent) if n.startswith(name + "-seed")]


def row_results(spec: Dict, row: Dict, seeds: Optional[List[int]] = None) -> List[Dict]:
    """``result.json`` dicts of the row's runs, one per seed that has finished (the row's own
    directory and every ``-seed<k>`` sibling when ``seeds`` is None), each read from its run
    directory or, where that is gone (another machine, a fresh checkout), from the committed
    evidence (:mod:`mt_pipeline.evidence`).  ``res["_dir"]`` is the directory it was read from."""
    from . import evidence

    base, reg = run_dir(spec, row), row_regime(row)
    if seeds is None:
        parent, name = os.path.split(base)
        ev_parent = os.path.dirname(evidence.evidence_dir(base, reg))
        names = {os.path.basename(d) for d in _seed_dirs(parent, name) + _seed_dirs(ev_parent, name)}
        dirs = [base] + [os.path.join(parent, n) for n in sorted(names, key=lambda n: int(n.rsplit("seed", 1)[1])
                                                                 if n.rsplit("seed", 1)[1].isdigit() else 0)]
    else:
        dirs = [run_dir(spec, row, s) for s in seeds]
    out = []
    for d in dirs:
        found = evidence.locate(d, reg)
        if found:
            with open(os.path.join(found, "result.json")) as f:
                res = json.load(f)
            res["_dir"] = found
            out.append(res)
    return out


def experiment_argv(spec: Dict, row: Dict, seed: Optional[int] = None) -> List[str]:
    """The :mod:`mt_pipeline.experiment` arguments of one row (and seed) of a loaded table spec:
    the one place a table row becomes a run (``mt-table`` and ``mt-campaign`` both use it)."""
    argv = ["--out", run_dir(spec, row, seed), "--arch", row["arch"],
            "--budget", os.path.join(ROOT, row_budget(spec, row)),
            "--src", spec["src"], "--tgt", spec["tgt"], "--name", f"row{row['id']}: {row['name']}"]
    if seed is not None:
        argv += ["--seed", str(seed)]
    if row.get("fns"):
        argv += ["--fns", *row["fns"]]
    if row.get("extra"):
        argv += ["--extra", row["extra"]]
    if spec.get("ribes"):
        argv.append("--ribes")
    if spec.get("_user_dir"):
        argv += ["--user-dir", spec["_user_dir"]]
    return argv


def failure_reason(res: Dict, vocab_size: Optional[int]) -> Optional[str]:
    """Why a finished run does not count (None when it does): training stopped with an error
    (the last line of its log), the final validation loss is NaN, or it stayed above 90% of the
    loss of a uniform prediction (did not learn)."""
    if res.get("status") == "failed":
        tail = [t for t in res.get("error_tail") or [] if t.strip()]
        return "training stopped with an error" + (f": {tail[-1].strip()[-160:]}" if tail else "")
    valid = [v for _, v in res.get("valid_loss", [])]
    if valid and not math.isfinite(valid[-1]):
        return f"diverged (final validation loss {valid[-1]})"
    if valid and vocab_size is not None and valid[-1] > 0.9 * math.log2(vocab_size):
        return (f"did not learn (final validation loss {valid[-1]:.2f} > 90% of a uniform guess, "
                f"{0.9 * math.log2(vocab_size):.2f})")
    return None


def retire_failed(rdir: str, committed: Optional[Dict] = None) -> Optional[str]:
    """Move a failed run's ``result.json`` aside (``result.failed-<time>.json``, kept as the record
    of that attempt) so the run is tried again; its checkpoints stay and training resumes.

    ``committed``: the run's failed record from committed evidence, used when the run directory
    holds no ``result.json`` (a fresh checkout): it is copied in as ``result.failed-<time>.json``, so
    the directory records that the failure was retried (:func:`retired_failures`) and a killed retry
    shows as partial, not as the old failure.  Committed evidence is never touched.

    Returns the new file's path, or None when there is no failed result to retire."""
    path = os.path.join(rdir, "result.json")
    new = os.path.join(rdir, time.strftime("result.failed-%Y%m%d-%H%M%S.json"))
    if not os.path.exists(path):
        if not committed or committed.get("status") != "failed":
            return None
        os.makedirs(rdir, exist_ok=True)
        write_json_atomic(new, {k: v for k, v in committed.items() if not k.startswith("_")})
        return new
    with open(path) as f:
        if json.load(f).get("status") != "failed":
            return None
    os.replace(path, new)
    return new


def retired_failures(rdir: str) -> List[str]:
    """The ``result.failed-<time>.json`` files :func:`retire_failed` left in ``rdir``, oldest first."""
    if not os.path.isdir(rdir):
        return []
    return sorted(n for n in os.listdir(rdir) if n.startswith("result.failed-") and n.endswith(".json"))


def row_failed(res: Dict, vocab_size: Optional[int]) -> bool:
    """The run does not count: :func:`failure_reason` gives a reason."""
    return failure_reason(res, vocab_size) is not None


def train_seconds(res: Dict, rdir: str) -> float:
    """Cumulative training wall time: fairseq's own counter (kept in the checkpoint across
    kills/resumes) when recorded, else the runner's sum over completed invocations."""
    from_ckpt = res["wall_s"].get("train_fairseq_cumulative")
    if from_ckpt:
        return from_ckpt
    ckpt = os.path.join(rdir, "checkpoints", "checkpoint_last.pt")
    if os.path.exists(ckpt):
        from fairseq_plugins.checkpoint import load_checkpoint

        return float(load_checkpoint(ckpt)["extra_state"].get("previous_training_time", 0.0))
    return res["wall_s"].get("train", 0.0)


def hardware_label(res: Dict) -> str:
    """A run's compute in a few words: the accelerator (or CPU and its cores), torch and the training
    precision read from its ``fairseq-train`` command (``fp16`` / ``bf16`` / ``fp32``) -- e.g.
    ``"NVIDIA H200, torch 2.11.0+cu130, fp16"``.  Runs of one table row or claim on different labels
    differ in more than their seed (half-precision training, kernels), which the pages say."""
    hw = res.get("hardware") or {}
    acc = hw.get("accelerator") or "?"
    where = f"CPU ({hw.get('cpu', '?')}, {hw.get('cores', '?')} cores)" if acc == "cpu only" else acc
    train = ((res.get("commands") or {}).get("train") or "").split()
    prec = "fp16" if "--fp16" in train else "bf16" if "--bf16" in train else "fp32"
    return f"{where}, torch {hw.get('torch', '?')}, {prec}"


def invocations_line(res: Dict, evidence_dir: Optional[str] = None) -> Optional[str]:
    """The run's starts and resumes of ``fairseq-train`` (``result.json``'s ``train_invocations``,
    recorded since 2026-11-30) as one provenance line: per invocation its code (``git_commit``,
    ``+dirty`` with the committed diff), machine, updates at start -> end and outcome; ``None`` for
    a run recorded before then.  A diff the run's committed evidence holds (``evidence_dir``:
    ``dirty-<n>.diff.gz``, :func:`mt_pipeline.evidence.export`) is named there, also when ``res``
    was read from the run directory, whose record names its own uncommitted copy -- so the page
    reads the same on every machine."""
    invs = res.get("train_invocations") or []
    if not invs:
        return None
    parts = []
    for i, inv in enumerate(invs):
        hw = inv.get("hardware") or {}
        acc = hw.get("accelerator") or "?"
        where = (f"{hw.get('cpu', '?')}, {hw.get('cores', '?')} cores, {hw.get('torch_threads', '?')} torch threads"
                 if acc == "cpu only" else acc)
        end, how = inv.get("updates_at_end"), inv.get("outcome")
        if how is None:  # killed: no end recorded; the next invocation resumed from its last checkpoint
            nxt = invs[i + 1].get("updates_at_start") if i + 1 < len(invs) else None
            how = ("stopped (killed or interrupted; the next resumed from its checkpoint at update "
                   f"{nxt})" if nxt is not None else "stopped (no end recorded: killed or interrupted)")
        span = f"updates {inv.get('updates_at_start', '?')} -> {'?' if end is None else end}"
        wall = f", {inv['wall_s']:.0f} s" if isinstance(inv.get("wall_s"), (int, float)) else ""
        diff = inv.get("diff")
        if diff and evidence_dir:
            name = os.path.basename(diff)
            committed = os.path.join(evidence_dir, name if name.endswith(".gz") else name + ".gz")
            if os.path.exists(committed):
                diff = os.path.relpath(committed, ROOT)
        diff = f", diff `{diff}`" if diff else ""
        parts.append(f"#{inv.get('n', '?')} `{str(inv.get('git_commit', '?'))[:12]}`{diff} on {where}, "
                     f"started {inv.get('started', '?')}, {span}, {how}{wall}")
    return "- training invocations: " + "; ".join(parts)


def hardware_lines(rows: List[Dict], results: Dict[int, List[Dict]]) -> List[str]:
    """The provenance page's hardware: one label when every finished run shares it, else one line
    per label naming its rows and seeds (``rows``: the spec's rows; ``results``: row id -> results)."""
    where: Dict[str, List[str]] = {}
    for r in rows:
        for res in results.get(r["id"], []):
            if res.get("status") == "done" and res.get("scores"):
                seed = _seed(res)
                where.setdefault(hardware_label(res), []).append(
                    f"row {r['id']}" + (f" seed {seed}" if seed is not None else ""))
    if len(where) <= 1:
        return [f"- hardware: {label}" for label in where]
    return ["- hardware: **mixed** -- the runs of this page did not all train on the same compute:"] + [
        f"  - {label}: {', '.join(runs)}" for label, runs in where.items()]


def _wall_cell(results: List[Dict]) -> str:
    """The ``train wall`` cell of a row: fairseq's cumulative training time in minutes, the mean per
    run when the row has several seeds (each seed's time is in its provenance section)."""
    mins = [train_seconds(x, x["_dir"]) / 60 for x in results]
    if len(mins) == 1:
        return f"{mins[0]:.1f} min"
    return f"{sum(mins) / len(mins):.1f} min (mean of {len(mins)})"


def resumes(rdir: str):
    """How often the row's training restarted from a checkpoint (from its train.log, or the
    committed ``train.log.gz`` of its evidence)."""
    log = os.path.join(rdir, "train.log")
    if os.path.exists(log):
        f = open(log, errors="replace")
    elif os.path.exists(log + ".gz"):
        import gzip

        f = gzip.open(log + ".gz", "rt", errors="replace")
    else:
        return "?"
    with f:
        return sum(1 for line in f if "Loaded checkpoint" in line and "@ 0 updates" not in line)


def _vocab(spec: Dict, row: Dict) -> Optional[int]:
    path = os.path.join(experiment.prep_dir(row["_budget"]), "bin", f"dict.{spec['tgt']}.txt")
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return sum(1 for _ in f) + 4


def run_analyses(spec: Dict, row: Dict, seed: Optional[int] = None) -> List[str]:
    """Run the table's ``analyses`` on a finished run of ``row`` (``seed``: as in :func:`run_dir`),
    skipping those whose ``analysis_<name>.json`` is newer than the decoded checkpoint; returns
    the analysis files written.  A run that has not finished (no ``result.json`` with status
    ``done``) or whose run directory is gone gets none.

    Raises:
        subprocess.CalledProcessError: an analysis script failed (its output file is not written).
    """
    rdir = run_dir(spec, row, seed)
    res_path = os.path.join(rdir, "result.json")
    if not spec.get("analyses") or not os.path.exists(res_path):
        return []
    with open(res_path) as f:
        res = json.load(f)
    if res.get("status") != "done":
        return []
    ckpt, _ = experiment.decode_checkpoint(row["_budget"], rdir)
    written = []
    for an in spec["analyses"]:
        out = os.path.join(rdir, f"analysis_{an['name']}.json")
        if os.path.exists(out) and os.path.getmtime(out) >= os.path.getmtime(ckpt):
            continue
        experiment.run([sys.executable, os.path.join(ROOT, an["script"]), "--checkpoint", ckpt,
                        "--data-bin", os.path.join(ROOT, res["data"]["prep_dir"], "bin"),
                        "--src", spec["src"], "--tgt", spec["tgt"], "--json", out]
                       + (["--user-dir", spec["_user_dir"]] if spec.get("_user_dir") else []))
        written.append(out)
    return written


def _analysis_cells(spec: Dict, row: Dict, res) -> List[str]:
    """The spec's ``analyses`` columns of ``row``, read from each result's ``res["_dir"]`` -- the
    directory its ``result.json`` came from (:func:`row_results`): the run directory, or the committed
    evidence where the run is not on this machine (a row that reuses another table's run, whose
    checkpoint is gone, keeps the number its evidence holds).  ``res``: one result or the row's results
    (one per seed): several seeds give mean ± sd over those that have the analysis; "n/a" where none
    did."""
    results = res if isinstance(res, list) else [res]
    cells = []
    for an in spec.get("analyses") or []:
        values = []
        for x in results:
            path = os.path.join(x.get("_dir") or run_dir(spec, row), f"analysis_{an['name']}.json")
            if os.path.exists(path):
                with open(path) as f:
                    values.append(json.load(f)[an["key"]][0])
        cells.append(_mean_cell(values, 3) if values else "n/a")
    return cells


def _score_cell(score: Dict, spec: Dict) -> str:
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


def _mean_cell(values: List[float], digits: int = 2) -> str:
    """One value as it is; several (one per seed) as mean ± sample sd, ``digits`` decimals."""
    if len(values) == 1:
        return f"{values[0]:.{digits}f}"
    from .significance import seed_summary

    s = seed_summary(values)
    return f"{s['mean']:.{digits}f} ± {s['sd']:.{digits}f}"


def _metric_cell(results: List[Dict], metric: str) -> str:
    """A validation metric of a row (``valid_last[metric]``): over several seeds mean ± sd, like the
    BLEU cells beside it (the seeds that logged it); "n/a" where none did."""
    values = [x["valid_last"][metric] for x in results if metric in (x.get("valid_last") or {})]
    return _mean_cell(values, 3) if values else "n/a"


def _read(path: str) -> List[str]:
    from .scoring import read_lines

    return read_lines(path)


def read_reference(score: Dict) -> List[str]:
    """The reference lines a subset's score record (``result.json`` ``scores[subset]``) was scored
    against, for a bootstrap that pairs them with its hypotheses.

    Raises:
        ValueError: the file at ``score["ref"]`` is not the one scored (its sha256 differs from the
            recorded ``ref_sha256``: data prepared again differently, or another machine's data).
        FileNotFoundError: the reference is missing.
    """
    from .evidence import reference_changed, resolve

    path = resolve(score["ref"])
    if reference_changed(score, path):
        raise ValueError(f"reference {score['ref']} differs from the one scored (sha256 "
                         f"{score['ref_sha256'][:12]} recorded): prepare the data as the run did")
    return _read(path)


def _significance(ref_res: Dict, res: Dict, subset: str) -> Optional[Dict]:
    """Seed-matched paired bootstrap of ``res`` against ``ref_res`` on ``subset``, cached in the
    system's run directory (``significance.json``, keyed by both hypotheses' checkpoints).  A run
    read from its committed evidence (under :func:`~mt_pipeline.evidence.evidence_root`, default
    ``results/runs``; no run directory here) is not cached: the cache is derived data, and the
    evidence holds only files with provenance.

    Raises:
        ValueError: the two runs record different references for ``subset`` (``ref_sha256``):
            their hypotheses are not paired sentence by sentence; or the reference file is not the
            one scored (:func:`read_reference`).
    """
    from .evidence import lowercased, resolve
    from .significance import paired_bootstrap

    a, b = ref_res["scores"].get(subset), res["scores"].get(subset)
    if not a or not b or not all(os.path.exists(resolve(x)) for x in (a["hyp"], b["hyp"], a["ref"])):
        return None
    if a.get("ref_sha256") and b.get("ref_sha256") and a["ref_sha256"] != b["ref_sha256"]:
        raise ValueError(f"paired bootstrap on {subset}: the runs were scored against different references "
                         f"({a['ref']} sha256 {a['ref_sha256'][:12]}, {b['ref']} sha256 {b['ref_sha256'][:12]})")
    lc = lowercased(a) or lowercased(b)  # scored on lowercased text (case:lc): so is the bootstrap
    key = (f"{subset}:{a.get('checkpoint_sha256', a['hyp'])}:{b.get('checkpoint_sha256', b['hyp'])}"
           + (f":{a['ref_sha256']}" if a.get("ref_sha256") else "") + (":lc" if lc else ""))
    return cached_significance(res["_dir"], key, lambda: paired_bootstrap(
        read_reference(a), _read(resolve(a["hyp"])), _read(resolve(b["hyp"])), lowercase=lc))


def cached_significance(run_dir: str, key: str, compute):
    """``compute()``'s result cached under ``key`` in ``<run_dir>/significance.json`` (derived data:
    not written when ``run_dir`` is committed evidence, under
    :func:`~mt_pipeline.evidence.evidence_root`) -- the one cache of the bootstrap statistics
    (:func:`_significance`, ``mt_pipeline.campaign``'s test-set sd)."""
    from .evidence import evidence_root

    cache_path = os.path.join(run_dir, "significance.json")
    cache = {}
    if os.path.exists(cache_path):
        with open(cache_path) as f:
            cache = json.load(f)
    if key not in cache:
        cache[key] = compute()
        committed = os.path.abspath(evidence_root())
        if os.path.commonpath([os.path.abspath(run_dir), committed]) != committed:
            write_json_atomic(cache_path, cache)
    return cache[key]


def _seed(result: Dict):
    """The training seed of a run's ``result.json`` (older runs record it only in their budget)."""
    seed = result.get("seed")
    return seed if seed is not None else result.get("config", {}).get("train", {}).get("seed")


def _by_seed(results: List[Dict]) -> Dict[object, Dict]:
    return {_seed(r): r for r in results}


def _verdict_cell(spec: Dict, row: Dict, ok: List[Dict], ref_ok: List[Dict], first: str) -> str:
    """The significance cell of one row against the reference row (first subset)."""
    from .significance import verdict

    if not ok or not ref_ok:
        return ""
    ref_by, sys_by = _by_seed(ref_ok), _by_seed(ok)
    common = [s for s in sys_by if s in ref_by]
    if not common:
        return "no seed in common with the reference"
    try:
        tests = [_significance(ref_by[s], sys_by[s], first) for s in common]
    except (OSError, ValueError) as err:
        return f"n/a ({type(err).__name__})"
    if any(t is None for t in tests):
        return "n/a (hypotheses missing)"
    return verdict([ref_by[s]["scores"][first]["bleu"] for s in common],
                   [sys_by[s]["scores"][first]["bleu"] for s in common], [t["bleu_p"] for t in tests])


def _pair_cell(spec: Dict, row: Dict, ok: List[Dict], pair_ref: Dict[int, int], ref_ok: Dict[int, List[Dict]],
               first: str) -> str:
    """The ``vs its reference`` cell: "row R: <verdict>" against the row's own ``vs`` row,
    "reference" for a row others are tested against, else empty."""
    if row["id"] in pair_ref:
        v = pair_ref[row["id"]]
        cell = _verdict_cell(spec, row, ok, ref_ok[v], first)
        return f"row {v}: {cell}" if cell else ""
    return "reference" if row["id"] in pair_ref.values() else ""


def _row_name(rows: List[Dict], rid: int) -> str:
    return next(r["name"] for r in rows if r["id"] == rid)


def _loss_figure(spec: Dict, results: Dict[int, List[Dict]], out_md: str) -> Optional[str]:
    """``<out>_valid_loss.png``: validation loss over updates, one line per row (its first seed)."""
    series = {f"{rid}: {_row_name(spec['rows'], rid)}": res[0]["valid_loss"]
              for rid, res in results.items() if res and res[0].get("valid_loss")}
    if not series:
        return None
    from fairseq_plugins.analysis.plots import training_curves

    path = out_md[:-3] + "_valid_loss.png" if out_md.endswith(".md") else out_md + "_valid_loss.png"
    return training_curves(series, path, ylabel="validation loss (base 2, label-smoothed)",
                           title=spec["title"])


def render(spec: Dict, seeds: Optional[List[int]] = None) -> None:
    """Write the Markdown table ``spec['out']`` (atomically) and its validation-loss figure from
    the finished rows (every seed found, or ``seeds``)."""
    from . import evidence

    rows, subsets, metrics = spec["rows"], spec["subsets"], spec.get("metrics") or []
    analyses = [an["name"] for an in spec.get("analyses") or []]
    results = {r["id"]: row_results(spec, r, seeds) for r in rows}
    results = {k: v for k, v in results.items() if v}
    first = next(iter(subsets))
    ref_ids = reference_ids(spec)
    pair_ref = {r["id"]: r["vs"] for r in rows if r.get("vs") is not None}  # row -> its own reference row
    n_vs = len(ref_ids) + (1 if pair_ref else 0)
    table_path = os.path.relpath(spec["_path"], ROOT)
    reg = regime(load_budget(spec["budget"]))
    n_seeds = sorted({len(v) for v in results.values()}) or [0]
    seed_list = sorted({str(_seed(x) if _seed(x) is not None else "?") for v in results.values() for x in v})
    override = f" --budget {spec['budget']}" if spec.get("_tag") else ""
    lines = [f"# {spec['title']}", "", spec.get("intro", "").strip(), "",
             f"**Regime: {reg}** -- {REGIMES.get(reg, 'not stated by the budget')}. "
             f"Seeds: {', '.join(seed_list) or 'none yet'} ({'/'.join(map(str, n_seeds))} per row"
             + ("; one seed: differences are not tested against seed noise" if n_seeds == [1] else "") + ").", "",
             f"Regenerate: `mt-table --table {table_path}{override}` (= `python scripts/run_table.py ...`; runs "
             "missing rows, resumes unfinished ones, re-renders this file; `--seeds 1,2,3` adds seeds). Budget: "
             f"`{spec['budget']}` unless a row names its own, direction {spec['src']}→{spec['tgt']}. Train wall = "
             "fairseq's cumulative training time (with several seeds: the mean per run); rows that shared the machine with other jobs, or were killed and "
             "resumed, ran slower than alone.", ""]
    head = (["ID", "Model", spec["paper_label"]] + [f"ours {lab}" for lab in subsets.values()]
            + [f"chrF {subsets[first]}"] + [f"vs row {i} ({subsets[first]})" for i in ref_ids]
            + ([f"vs its reference ({subsets[first]})"] if pair_ref else [])
            + [f"valid {m}" for m in metrics] + analyses + ["seeds", "updates", "train wall", "status"])
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    vocab = {r["id"]: _vocab(spec, r) for r in rows}
    ref_ok = {i: [x for x in results.get(i, []) if failure_reason(x, vocab[i]) is None]
              for i in ref_ids + sorted(set(pair_ref.values()))}
    for r in rows:
        paper = "–" if r.get("paper") is None else str(r["paper"])
        res = results.get(r["id"])
        if not res:
            lines.append("| " + " | ".join([str(r["id"]), r["name"], paper] + ["not run yet"] * len(subsets)
                                           + [""] * (1 + n_vs + len(metrics) + len(analyses) + 3)
                                           + ["pending"]) + " |")
            continue
        ok = [x for x in res if failure_reason(x, vocab[r["id"]]) is None]
        if not ok:
            cells = ["–"] * (len(subsets) + 1 + n_vs)
        else:
            cells = ([_score_cell(ok[0]["scores"][s], spec) if len(ok) == 1
                      else _mean_cell([x["scores"][s]["bleu"] for x in ok]) for s in subsets]
                     + [_mean_cell([x["scores"][first]["chrf"] for x in ok]) if all("chrf" in x["scores"][first]
                                                                                   for x in ok) else "n/a"]
                     + ["reference" if r["id"] == i else _verdict_cell(spec, r, ok, ref_ok[i], first)
                        for i in ref_ids]
                     + ([_pair_cell(spec, r, ok, pair_ref, ref_ok, first)] if pair_ref else []))
        mcells = [_metric_cell(ok or res, m) for m in metrics]
        reasons = sorted({failure_reason(x, vocab[r["id"]]) for x in res} - {None})
        status = "done" if len(ok) == len(res) else (
            ("failed: " if not ok else f"{len(res) - len(ok)} seed(s) failed: ") + "; ".join(reasons))
        lines.append("| " + " | ".join([str(r["id"]), r["name"], paper] + cells + mcells + _analysis_cells(spec, r, ok or res) + [
            str(len(res)), str(res[0].get("updates", 0)), _wall_cell(res), status]) + " |")
    lines += ["", "SacreBLEU (detokenised) with tokenized BLEU in brackets"
              + ("; RIBES (Isozaki et al. 2010, nltk, tokenized text) after the slash" if spec.get("ribes") else "")
              + "; with several seeds, mean ± sample sd of SacreBLEU. chrF: sacreBLEU's chrF (character 6-grams, "
              "β = 2). " + "; ".join([f"`vs row {i}`: difference to row {i} ({_row_name(rows, i)})" for i in ref_ids]
                                     + (["`vs its reference`: difference to the row named in the cell (the spec's "
                                         "`vs` of each row)"] if pair_ref else []))
              + f" on {subsets[first]}, sacreBLEU's paired bootstrap (1,000 resamples) per seed; with several seeds \"exceeds seed noise\" "
              "means |Δ mean| > 2 standard errors over seeds and, for every seed-matched pair, p < 0.05 with that "
              "seed's Δ of the mean's sign "
              "(`mt_pipeline.significance`).", ""]
    figure = _loss_figure(spec, results, os.path.join(ROOT, spec["out"])) if results else None
    if figure:
        lines += [f"Validation loss over updates: `{os.path.relpath(figure, ROOT)}`.", ""]
    lines += ["## Provenance", ""]
    done_res = [x for v in results.values() for x in v if x.get("status") == "done" and x.get("scores")]
    if done_res:  # a failed run records no scores and no data
        any_res = done_res[0]
        lines += [f"- SacreBLEU signature: `{any_res['scores'][first]['signature']}`"] + hardware_lines(rows, results) + [
                  f"- data: {any_res['data']}", ""]
    for r in rows:
        for res in results.get(r["id"], []):
            rdir = res["_dir"]
            lines += [f"### Row {r['id']}: {r['name']}" + (f" (seed {_seed(res)})" if _seed(res) is not None else ""),
                      ""]
            if res.get("status") == "failed":
                lines += ["- training stopped with an error: `" + " / ".join(res.get("error_tail", [])[-2:]) + "`"]
            ev_dir = rdir if res.get("evidence") else evidence.evidence_dir(rdir, row_regime(r))
            if os.path.exists(os.path.join(ev_dir, evidence.MANIFEST)):
                lines += [f"- committed evidence (result.json, hypotheses, training log): `{os.path.relpath(ev_dir, ROOT)}`"]
            else:
                lines += ["- committed evidence: none yet (`mt-campaign render` exports it)"]
            lines += [f"- run directory: `{res.get('evidence', {}).get('run_dir') or os.path.relpath(rdir, ROOT)}`; "
                      f"git commit: `{res['git_commit']}`"
                      + (f" (invocations: {', '.join(f'`{c}`' for c in res['git_commits_invoked'])})"
                         if set(res.get("git_commits_invoked") or [res["git_commit"]]) != {res["git_commit"]} else "")
                      + "; "
                      f"finished {res['time']}",
                      f"- attention functions: {res.get('attention_fns')}",
                      f"- hardware: {hardware_label(res)}",
                      *filter(None, [invocations_line(res, ev_dir)]),
                      f"- command: `{res['commands']['train']}`",
                      f"- updates: {res['updates']}; training time {train_seconds(res, rdir):.0f} s (fairseq "
                      f"cumulative); resumed {resumes(rdir)} time(s); runner-timed stages of the last invocation (s): "
                      + ", ".join(f"{k} {v:.0f}" for k, v in sorted(res['wall_s'].items())
                                  if k != "train_fairseq_cumulative"),
                      "- validation loss (update, loss): " + ", ".join(f"({u}, {l:.3f})" for u, l in res["valid_loss"]),
                      "- training loss curve (update, loss): "
                      + ", ".join(f"({u}, {l:.2f})" for u, l in res["loss_curve"][:: max(1, len(res["loss_curve"]) // 10)]),
                      ""]
    lines += ["", f"_Rendered by mt-table from {table_path}; git commit of each row above._", ""]
    out = os.path.join(ROOT, spec["out"])
    os.makedirs(os.path.dirname(out), exist_ok=True)
    remove_leftovers(os.path.dirname(out), names=[os.path.basename(out)])  # of a killed render
    with atomic_path(out) as tmp, open(tmp, "w") as f:
        f.write("\n".join(lines))
    print(f"[table] wrote {out} ({len(results)}/{len(rows)} rows)")


def main(argv=None, default_table=None) -> None:
    p = argparse.ArgumentParser(prog="mt-table", description=__doc__.split("\n\n")[0])
    p.add_argument("--table", default=default_table, required=default_table is None,
                   help="table spec YAML, e.g. configs/reluformer/table4_multi30k.yaml")
    p.add_argument("--rows", help="comma-separated row ids, run in this order (default: all)")
    p.add_argument("--max-rows", type=int, help="stop after running this many rows (row x seed runs)")
    p.add_argument("--budget", help="run every row under this budget instead of the spec's (e.g. "
                                    "configs/multi30k/converged.yaml): runs/<regime>/..., <out>_<regime>.md")
    p.add_argument("--seeds", help="comma-separated training seeds (default: the budget's seed)")
    p.add_argument("--render-only", action="store_true")
    p.add_argument("--retry-failed", action="store_true",
                   help="run again the rows whose training failed (their result.json is kept as "
                        "result.failed-<time>.json; training resumes from the last checkpoint)")
    a = p.parse_args(argv)
    budget = None
    if a.budget:
        budget = a.budget if os.path.isabs(a.budget) else os.path.join(ROOT, a.budget)
    spec = load_table(a.table if os.path.isabs(a.table) else os.path.join(ROOT, a.table), budget)
    by_id = {r["id"]: r for r in spec["rows"]}
    todo = list(by_id) if not a.rows else [int(x) for x in a.rows.split(",")]
    bad = [i for i in todo if i not in by_id]
    if bad:
        p.error(f"unknown row ids {bad}; valid: {list(by_id)}")
    try:
        seeds = [int(x) for x in a.seeds.split(",")] if a.seeds else None
    except ValueError:
        p.error(f"--seeds must be comma-separated integers, got {a.seeds!r}")
    done = 0
    for r in ([] if a.render_only else [by_id[i] for i in todo]):  # in the order given
        for seed in seeds or [None]:
            if a.max_rows is not None and done >= a.max_rows:
                break
            out = run_dir(spec, r, seed)
            if a.retry_failed and retire_failed(out):
                print(f"[table] row {r['id']}{'' if seed is None else f' seed {seed}'} failed before: retrying")
            if os.path.exists(os.path.join(out, "result.json")):
                print(f"[table] row {r['id']}{'' if seed is None else f' seed {seed}'} already done "
                      f"({os.path.relpath(out, ROOT)})")
                continue
            t0 = time.time()
            try:
                experiment.run_experiment(experiment_argv(spec, r, seed))
            except Exception as err:  # a diverged row must not stop the table
                print(f"[table] row {r['id']} raised {type(err).__name__}: {err}", file=sys.stderr)
            print(f"[table] row {r['id']} took {(time.time() - t0) / 60:.1f} min")
            done += 1
            render(spec, seeds)
    for r in ([] if a.render_only else [by_id[i] for i in todo]):
        try:
            run_analyses(spec, r)
        except Exception as err:  # an analysis failure must not lose the table
            print(f"[table] analyses of row {r['id']} raised {type(err).__name__}: {err}", file=sys.stderr)
    render(spec, seeds)


if __name__ == "__main__":
    main()
