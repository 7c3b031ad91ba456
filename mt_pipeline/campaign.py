"""Converged evidence on whatever compute exists: run a campaign plan of table rows × seeds.

A *plan* (``configs/campaign/converged.yaml``) lists, most decisive first, rows of existing table
specs with the seeds to train them under one budget -- or, without ``budget:``, each table under
its own budget(s) (``configs/campaign/smoke.yaml``: the smoke tables with committed evidence)::

    title: ...
    budget: configs/multi30k/converged.yaml     # optional: every run trains under it (``mt-table --budget``)
    runs:
      - {table: configs/rela/table1.yaml, rows: [1, 7], seeds: [1, 2, 3], why: "ReLA's main claim"}
    claims:                                     # optional: verdicts rendered on results/README.md
      - {id: rela-main, claim: "...", table: configs/rela/table1.yaml, row: 7, vs: 1, expect: equal}
    section: converged_6k                       # optional: the verdicts' own block on the page (a second
                                                # plan's, e.g. configs/campaign/converged_6k.yaml: the same
                                                # claims at twice the converged budget), after the first

Each entry expands seed-major (row 1 seed 1, row 7 seed 1, row 1 seed 2, ...), so the first
finished runs already pair up; a run is one :mod:`mt_pipeline.experiment` run in the table
machinery's own run directory (``runs/<regime>/<table>/row<id>[-seed<k>]``, or ``runs/<tag>/...``
for a budget with a ``tag``: :func:`mt_pipeline.budget.run_tag`): resume, the
configuration fingerprint and provenance are the table's, and ``mt-table`` renders the same runs.
A run shared by two tables (a spec's ``run:``) is trained once.

Commands (``mt-campaign``)::

    mt-campaign run    [--plan P] [--launcher local|slurm] [--jobs N|auto] [--minutes M]
                       [--max-runs K] [--nice 10] [--retry-failed] [--dry-run] [slurm options]
    mt-campaign status [--plan P] [--json]
    mt-campaign render [--plan P]
    mt-campaign rescore                      # every committed run re-scored from its hypotheses
    mt-campaign gpu-kit --out .device        # what an offline GPU machine needs (docs/gpu.md)

* ``run --launcher local`` on a CPU: one run at a time under ``nice``, in its own process group;
  safe to start in the background (``setsid nohup mt-campaign run &``) and to kill at any moment
  (TERM/INT stop the runs it started; after a KILL the runs go on, hold their run-directory lock
  and a new campaign counts them as running).  Killed runs resume from their checkpoints.
* ``run --launcher local`` on a GPU: ``--jobs`` runs at once on the one GPU (``auto``: from free
  GPU memory, ``gpu.mem_per_run_gib`` of the plan, and the CPU cores), each pinned to its share
  of cores (``sched_setaffinity``, ``OMP_NUM_THREADS``); the budget's ``train-gpu`` (fp16) applies.
* ``--minutes M`` starts only runs that can finish in M minutes, from the throughput of finished
  runs of the same budget (else of one that trains the same way for another number of updates) on
  the same device (and concurrency) -- read from their ``result.json``
  and ``campaign.json``, in run directories or committed evidence -- so a short GPU window ends
  with finished rows, not half-trained ones.  A run with no such measurement is refused (give
  ``--per-run-minutes`` to state an estimate).
* ``run --launcher slurm``: one job per run through submitit (``submitit.AutoExecutor``;
  ``--partition``, ``--gpus-per-node``, ``--cpus-per-task``, ``--timeout-min``); ``--cluster local``
  uses submitit's local executor (what the tests run).  Needs the ``[cluster]`` extra.
* ``after:`` (optional) names post-training steps of :data:`mt_pipeline.reproduce.TABLES`
  (``- {paper: flexible, table: table1, why: ...}``: Flexible Attention's tau sweep and decoding
  benchmark; ReLA Table 5's AER), which need the trained checkpoints of the plan's runs of that
  table's small-scale specs -- the runs its commands name (:func:`_runs_read`); a plan with a
  converged ``budget:`` runs the table's converged commands, on those specs' rows under it.  A step is *done* when every page it writes exists without "Evidence: none committed."
  (:func:`mt_pipeline.evidence.predates_evidence`) and no step whose pages are not done reads a
  file it writes (``reproduce.after_writes``) that is missing -- on a fresh machine Table 1's committed page
  does not stand in for its git-ignored ``sweep.json``, which Table 3's benchmark reads; until then a run it needs whose result is only
  in committed evidence (its git-ignored run directory gone with an earlier machine) trains again
  (its evidence is then re-exported), and once all of them have finished here the step's commands
  run, niced, in plan order (log: ``runs/campaign/after/<paper>_<table>.log``), once every file
  they read under ``runs/`` is there (``reproduce.step_inputs``: Table 3's benchmark reads Table 1's
  tau sweep), and again only when a run they need finishes again or such a file changes
  (:func:`after_state`).  The local launcher runs them (at its start and after each
  run); with ``--launcher slurm`` the re-training is submitted and a later local ``mt-campaign run``
  runs the steps.
* After every finished run the ``analyses`` of every table showing it are run (:func:`analyse`:
  E-ATT Table 4's energy of ReLA Table 1's softmax run too), its evidence is committed-ready under
  ``results/runs/`` (:mod:`mt_pipeline.evidence`) and its tables are re-rendered; ``render`` does the same for every
  finished run and writes the claims' verdicts between ``<!-- mt-campaign:begin -->`` and
  ``<!-- mt-campaign:end -->`` in ``results/README.md`` (a plan with a ``section``: between its own
  markers, :func:`markers`).

Verdict rule (results/README.md's): a claim is "reproduced" or "not reproduced" only with a
converged budget and at least 3 seed-matched runs of both rows; "beyond seed noise" is
:func:`mt_pipeline.significance.verdict` (|Δ mean| > 2 standard errors over seeds, SE_seeds, and
every seed-matched paired bootstrap p < 0.05).  ``expect: better|worse``: reproduced when the difference is beyond
seed noise in that direction, not reproduced when beyond it the other way, else inconclusive.
``expect: equal`` (a "comparable quality" claim) is an equivalence test with the claim's
``margin`` (BLEU, default 1.0), decided by the interval Δ ± 2 SE (seeds and test set) both ways,
SE = √(SE_seeds² + sd_test²) with ``sd_test`` the joint paired bootstrap's standard deviation of the
seed-mean Δ (:func:`mt_pipeline.significance.testset_sd`: every seed is scored on one test set,
so the seeds' spread lacks its sampling noise; "beyond seed noise" keeps SE_seeds and the per-seed
bootstraps): reproduced when it lies inside ± margin, not reproduced when it lies wholly outside (and the
difference is beyond seed noise), else inconclusive -- no difference found is not by itself
equivalence, and a difference beyond seed noise whose interval reaches inside the margin is not
by itself non-equivalence (the verdict then says which way it goes).  Fewer seeds or another regime: "not tested yet"
with the direction so far.  Beside each verdict, not part of it, :func:`gap_trend` reads the runs'
training logs: how the rows' validation-NLL gap moved during training (closing, widening or no
consistent direction), and how fast each run was still improving at the budget's end -- whether a
longer budget could plausibly move the verdict.

Errors: a plan with unknown keys, missing tables or rows, or bad seeds is refused before anything
runs (SystemExit naming the valid choices).
"""

import argparse
import contextlib
import functools
import glob
import json
import math
import os
import shlex
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

import yaml

from . import evidence
from . import tables
from .atomic import atomic_path, write_json_atomic
from .budget import load_budget, regime
from .locks import lock_held
from .provenance import ROOT, hardware, repo_relative

__all__ = ["Run", "AfterStep", "load_plan", "run_state", "after_state", "estimate_minutes", "device_name", "main"]

DEFAULT_PLAN = "configs/campaign/converged.yaml"
PLAN_KEYS = ("title", "budget", "runs", "claims", "gpu", "intro", "after", "section")
AFTER_KEYS = ("paper", "table", "why")
AFTER_LOGS = os.path.join("runs", "campaign", "after")  # git-ignored: logs and "ran" markers of after steps
ENTRY_KEYS = ("table", "rows", "seeds", "why")
CLAIM_KEYS = ("id", "claim", "table", "row", "vs", "expect", "margin", "paper")
EXPECT = ("equal", "better", "worse")
MIN_SEEDS = 3
#: the regimes a verdict may rest on (results/README.md's rule: "converged regime (or paper scale)")
VERDICT_REGIMES = ("converged", "paper")
BEGIN, END = "<!-- mt-campaign:begin -->", "<!-- mt-campaign:end -->"


def markers(plan: Dict) -> Tuple[str, str]:
    """The begin / end markers of the plan's verdict block on the results page: :data:`BEGIN` /
    :data:`END`, or, for a plan with a ``section``, ``<!-- mt-campaign:begin <section> -->`` / ``...end...``."""
    section = plan.get("section")
    if not section:
        return BEGIN, END
    return f"<!-- mt-campaign:begin {section} -->", f"<!-- mt-campaign:end {section} -->"


def log(msg: str) -> None:
    print(f"[campaign] {msg}", flush=True)


@dataclass
class Run:
    """One row × seed of a table spec under the plan's budget."""
    key: str                 # "rela_table1 row7 seed2"
    table: str               # spec path as written in the plan
    spec: Dict
    row: Dict
    seed: int
    dir: str                 # the run directory (tables.run_dir)
    why: str = ""
    tables: List[str] = field(default_factory=list)  # every plan table that shows this run

    @property
    def regime(self) -> str:
        return tables.row_regime(self.row)

    @property
    def budget(self) -> str:
        """Absolute path of the budget the run trains under (the plan's, else its row's or table's)."""
        return _abs(tables.row_budget(self.spec, self.row))

    @property
    def target_updates(self) -> Optional[int]:
        value = self.row["_budget"]["train"].get("max-update")
        return int(value) if value else None


@dataclass
class AfterStep:
    """A post-training step of the plan (``after:``): the commands of
    ``mt_pipeline.reproduce.TABLES[paper][table]["after"][scale]`` (``small``, or ``converged`` in a
    plan with a converged budget) on the plan's runs of that table's small-scale specs."""
    key: str                 # "flexible table1"
    paper: str
    table: str
    commands: List[List[str]]
    pages: List[str]         # the Markdown pages the commands write (repo-relative)
    runs: List[Run]          # the plan's runs whose checkpoints the commands read
    why: str = ""
    inputs: List[str] = field(default_factory=list)  # files under runs/ the commands read (reproduce.step_inputs)
    writes: List[str] = field(default_factory=list)  # files under runs/ they write besides pages (reproduce.after_writes)


def _abs(path: str) -> str:
    return path if os.path.isabs(path) else os.path.join(ROOT, path)


def _check_keys(where: str, mapping, valid) -> None:
    if not isinstance(mapping, dict):
        raise SystemExit(f"{where}: expected a mapping with keys {list(valid)}, got {type(mapping).__name__}")
    unknown = [k for k in mapping if k not in valid]
    if unknown:
        import difflib

        hints = [f"{k!r} (did you mean {difflib.get_close_matches(k, valid, 1)[0]!r}?)"
                 if difflib.get_close_matches(k, valid, 1) else repr(k) for k in unknown]
        raise SystemExit(f"{where}: unknown keys {', '.join(hints)}; valid: {list(valid)}")


def load_plan(path: str) -> Dict:
    """Read and check a plan; returns it with ``_runs`` (the expanded, de-duplicated
    :class:`Run` list in plan order) and ``_specs`` (table path -> loaded spec).

    Raises:
        SystemExit: missing file, unknown keys, a table or row that does not exist, seeds that
            are not positive integers, a claim naming rows that the plan does not run.
    """
    path = _abs(path)
    if not os.path.exists(path):
        plans = sorted(glob.glob(os.path.join(ROOT, "configs", "campaign", "*.yaml")))
        raise SystemExit(f"campaign plan not found: {path}; the plans here: "
                         + ", ".join(repo_relative(p) for p in plans))
    with open(path) as f:
        try:
            plan = yaml.safe_load(f)
        except yaml.YAMLError as err:
            raise SystemExit(f"{path}: not valid YAML: {err}") from None
    _check_keys(path, plan, PLAN_KEYS)
    if "runs" not in plan:
        raise SystemExit(f"{path}: missing key 'runs'; required: ['runs'] (and optionally 'budget')")
    budget = _abs(plan["budget"]) if plan.get("budget") else None
    if budget:
        load_budget(budget)  # raises on a missing budget
    section = plan.get("section")
    if section is not None and not (isinstance(section, str) and section.replace("_", "").replace("-", "").isalnum()):
        raise SystemExit(f"{path}: section {section!r} must be a name of letters, digits, '_' or '-' (it names the "
                         "plan's verdict block on results/README.md)")
    if not isinstance(plan["runs"], list) or not plan["runs"]:
        raise SystemExit(f"{path}: 'runs' must be a non-empty list of {{table, rows, seeds}} entries")
    specs: Dict[str, Dict] = {}
    runs: List[Run] = []
    by_dir: Dict[str, Run] = {}
    for i, entry in enumerate(plan["runs"]):
        where = f"{path}: runs[{i}]"
        _check_keys(where, entry, ENTRY_KEYS)
        if "table" not in entry or "rows" not in entry:
            raise SystemExit(f"{where}: needs 'table' and 'rows'")
        table = entry["table"]
        if table not in specs:
            specs[table] = tables.load_table(_abs(table), budget)
        spec = specs[table]
        by_id = {r["id"]: r for r in spec["rows"]}
        rows = entry["rows"]
        if not isinstance(rows, list) or any(r not in by_id for r in rows):
            raise SystemExit(f"{where}: rows {rows!r} are not all row ids of {table}; valid: {list(by_id)}")
        seeds = entry.get("seeds", [1])
        if not isinstance(seeds, list) or not seeds or any(type(s) is not int or s < 1 for s in seeds):
            raise SystemExit(f"{where}: seeds must be a list of positive integers, got {seeds!r}")
        for seed in seeds:
            for rid in rows:
                row = by_id[rid]
                d = tables.run_dir(spec, row, seed)
                if d in by_dir:
                    if table not in by_dir[d].tables:
                        by_dir[d].tables.append(table)
                    continue
                stem = os.path.basename(os.path.normpath(spec["runs"]))
                run = Run(key=f"{stem} row{rid} seed{seed}", table=table, spec=spec, row=row, seed=seed, dir=d,
                          why=entry.get("why", ""), tables=[table])
                by_dir[d] = run
                runs.append(run)
    # a run that another plan table shows too (a spec's `run:`) re-renders that table when it finishes
    all_seeds = sorted({r.seed for r in runs})
    for table, spec in specs.items():
        for row in spec["rows"]:
            for seed in all_seeds:
                run = by_dir.get(tables.run_dir(spec, row, seed))
                if run is not None and table not in run.tables:
                    run.tables.append(table)
    for i, claim in enumerate(plan.get("claims") or []):
        where = f"{path}: claims[{i}]"
        _check_keys(where, claim, CLAIM_KEYS)
        missing = [k for k in ("id", "claim", "table", "row", "vs", "expect") if k not in claim]
        if missing:
            raise SystemExit(f"{where}: missing keys {missing}")
        if claim["expect"] not in EXPECT:
            raise SystemExit(f"{where}: expect {claim['expect']!r} is not one of {list(EXPECT)}")
        margin = claim.get("margin", 1.0)
        if type(margin) not in (int, float) or not math.isfinite(margin) or margin <= 0:
            raise SystemExit(f"{where}: margin must be a positive number of BLEU points, got {margin!r}")
        if claim["table"] not in specs:
            raise SystemExit(f"{where}: table {claim['table']} is not run by the plan; plan tables: {list(specs)}")
        ids = [r["id"] for r in specs[claim["table"]]["rows"]]
        for k in ("row", "vs"):
            if claim[k] not in ids:
                raise SystemExit(f"{where}: {k} {claim[k]!r} is not a row of {claim['table']}; valid: {ids}")
    plan["_path"], plan["_budget"], plan["_runs"], plan["_specs"] = path, budget, runs, specs
    scale = "converged" if budget and regime(load_budget(budget)) == "converged" else "small"
    plan["_after"] = _load_after(path, plan.get("after"), runs, specs, scale)
    return plan


def _load_after(path: str, entries, runs: List[Run], specs: Dict[str, Dict], scale: str = "small") -> List[AfterStep]:
    """The plan's ``after:`` entries as :class:`AfterStep` s (see the module docstring): the
    table's post-training commands at ``scale`` -- ``small`` for a plan whose tables train under
    their own budgets, ``converged`` for a plan whose ``budget:`` is a converged one (its runs are
    the small specs' rows under that budget, the run directories the converged commands read).

    Raises:
        SystemExit: not a list, unknown keys, a paper / table without post-training steps at
            ``scale`` (the valid ones are named), a table whose specs the plan does not run, or a
            step that reads run directories the plan does not train (e.g. a converged step in a
            plan whose budget tags its runs otherwise).
    """
    from .reproduce import TABLES, after_steps, after_writes, step_inputs, step_outputs  # reproduce imports the table machinery: import late

    if entries is None:
        return []
    if not isinstance(entries, list):
        raise SystemExit(f"{path}: 'after' must be a list of {{paper, table}} entries")
    valid = [f"{p} {t}" for p, ts in TABLES.items() for t, e in ts.items() if after_steps(e, scale)]
    plan_specs = {os.path.normpath(_abs(t)) for t in specs}
    steps = []
    for i, entry in enumerate(entries):
        where = f"{path}: after[{i}]"
        _check_keys(where, entry, AFTER_KEYS)
        key = f"{entry.get('paper')} {entry.get('table')}"
        if key not in valid:
            raise SystemExit(f"{where}: {key!r} has no post-training steps at {scale} scale; valid: {valid}")
        table = TABLES[entry["paper"]][entry["table"]]
        missing = [t for t in table["small"] if os.path.normpath(_abs(t)) not in plan_specs]
        if missing:
            raise SystemExit(f"{where}: the plan does not run {missing}, whose checkpoints {key}'s steps read: "
                             "add them to 'runs'")
        wanted = {os.path.normpath(_abs(t)) for t in table["small"]}
        commands = after_steps(table, scale)
        read, foreign = _runs_read(commands, [r for r in runs if any(os.path.normpath(_abs(t)) in wanted for t in r.tables)])
        if foreign:
            raise SystemExit(f"{where}: {key}'s {scale} steps read {repo_relative(foreign[0])}, which is none of the "
                             "run directories this plan trains for its tables")
        steps.append(AfterStep(
            key=key, paper=entry["paper"], table=entry["table"], commands=commands,
            pages=[o for c in commands for o in step_outputs(c) if o.endswith(".md")],
            runs=read, why=entry.get("why", ""),
            inputs=list(dict.fromkeys(i for c in commands for i in step_inputs(c))),
            writes=list(after_writes(table, scale))))
    return steps


def _runs_read(commands: List[List[str]], runs: List[Run]) -> Tuple[List[Run], List[str]]:
    """``(read, foreign)``: the ``runs`` (of the step's tables) that the step's ``commands`` read --
    those whose run directory an argument under ``runs/`` names, or a file below it (``[LABEL=]PATH``
    arguments count by their PATH): ReLA Table 5's AER reads Table 1's rows 1, 2, 3, 7, so only those
    train again for it; all of ``runs`` when no argument names one (Flexible Table 1's sweep is given
    the tables' ``runs/`` folders and reads every row) -- and the named paths that are neither a run
    directory of ``runs``, nor below one, nor a folder holding one (absolute paths)."""
    named = []
    for cmd in commands:
        for arg in cmd[1:]:
            path = arg.split("=", 1)[1] if "=" in arg and not arg.startswith("-") else arg
            if path.startswith("runs/"):
                named.append(os.path.normpath(_abs(path)))
    dirs = [os.path.normpath(r.dir) for r in runs]

    def below(a: str, b: str) -> bool:
        return a == b or a.startswith(b + os.sep)

    read = [r for r, d in zip(runs, dirs) if any(below(n, d) for n in named)]
    foreign = [n for n in dict.fromkeys(named) if not any(below(n, d) or below(d, n) for d in dirs)]
    return read or runs, foreign


def _after_marker(step: AfterStep) -> str:
    return os.path.join(ROOT, AFTER_LOGS, f"{step.paper}_{step.table}.json")


def _pages_done(step: AfterStep) -> bool:
    """Every page the step writes exists without :data:`mt_pipeline.evidence.NO_EVIDENCE`."""
    pages = [_abs(p) for p in step.pages]
    return bool(pages) and all(os.path.exists(p) and not evidence.predates_evidence(p) for p in pages)


def _writes_wanted(step: AfterStep, plan: Optional[Dict]) -> List[str]:
    """Files the step writes besides its pages (``AfterStep.writes``) that are not here and that
    another step of ``plan`` whose pages are not done reads -- on a fresh machine, Table 1's
    ``sweep.json`` (git-ignored, under ``runs/``) for Table 3's benchmark although Table 1's page is
    committed with evidence."""
    if not plan or not step.writes:
        return []
    read = {i for other in plan.get("_after", []) if other is not step and not _pages_done(other)
            for i in other.inputs}
    return [w for w in step.writes if w in read and not os.path.exists(_abs(w))]


def after_state(step: AfterStep, plan: Optional[Dict] = None) -> Dict:
    """``{"state", "reason"}`` of a post-training step: ``done`` (every page it writes exists without
    :data:`mt_pipeline.evidence.NO_EVIDENCE` and, given the ``plan``, no other step of it whose pages
    are not done reads a file this one writes that is missing: :func:`_writes_wanted`), ``ran`` (its
    commands ran on exactly the runs that are here now, and a page still lacks evidence or such a
    file is still missing: see its log; it runs again when a run it needs
    finishes again, or an input file changes), ``ready`` (every run it needs has finished in its run
    directory here and every file it reads is there) or ``waiting`` (with how many runs have finished,
    or the first input file missing: one an earlier step writes, e.g. Table 1's tau sweep for Table 3's
    benchmark)."""
    pages_done, wanted = _pages_done(step), _writes_wanted(step, plan)
    if pages_done and not wanted:
        return {"state": "done", "reason": None}
    again = f"its pages are done, but another step reads {wanted[0]}, which it writes" if pages_done else None
    also = f" ({again})" if again else ""
    here = [r for r in step.runs if (_read_json(os.path.join(r.dir, "result.json")) or {}).get("status") == "done"]
    if len(here) < len(step.runs):
        return {"state": "waiting", "reason": f"{len(here)} of {len(step.runs)} runs it needs finished here{also}"}
    missing = [p for p in step.inputs if not os.path.exists(_abs(p))]
    if missing:
        return {"state": "waiting", "reason": f"needs {missing[0]}, which is not there yet (an earlier step or "
                                              f"a run writes it){also}"}
    marker = _read_json(_after_marker(step)) or {}
    if marker.get("runs") == _finished_fingerprint(step):
        return {"state": "ran", "reason": f"ran at {marker.get('finished')} (exit status {marker.get('returncode')}); "
                                          + (f"{wanted[0]} is still missing" if pages_done else "a page still lacks evidence")
                                          + f": {repo_relative(_after_log(step))}"}
    return {"state": "ready", "reason": again}


def _after_log(step: AfterStep) -> str:
    return os.path.join(ROOT, AFTER_LOGS, f"{step.paper}_{step.table}.log")


def _finished_fingerprint(step: AfterStep) -> Dict[str, float]:
    """When each run the step needs last finished here (its ``result.json``'s mtime) and when each
    file it reads last changed: a step that ran (or failed) runs again when either changes."""
    out = {}
    for r in step.runs:
        res = os.path.join(r.dir, "result.json")
        out[repo_relative(r.dir)] = os.path.getmtime(res) if os.path.exists(res) else None
    for p in step.inputs:
        out[p] = os.path.getmtime(_abs(p)) if os.path.exists(_abs(p)) else None
    return out


def _retrain_for_after(plan: Dict) -> List[Run]:
    """Runs a step that is not done needs, whose result is only in committed evidence (their run
    directories, with the checkpoints, are not here): they train again, in plan order."""
    want = []
    for step in plan.get("_after", []):
        if after_state(step, plan)["state"] == "done":
            continue
        for r in step.runs:
            if r.dir not in want and not os.path.exists(os.path.join(r.dir, "result.json")) \
                    and run_state(r)["state"] == "done":
                want.append(r.dir)
    return [r for r in plan["_runs"] if r.dir in want]


def run_after_steps(plan: Dict, nice: int = 10) -> List[str]:
    """Run every ``ready`` post-training step of the plan (:func:`after_state`), in plan order, each
    command niced and logged to ``runs/campaign/after/<paper>_<table>.log``; a step stops at its
    first failing command.  Then the table's index file (``results/<paper>/<table>.md``) is
    re-written.  Returns the keys of the steps that ran; a failure is logged, never raised."""
    from .reproduce import TABLES, write_index  # import late, as above

    ran = []
    for step in plan.get("_after", []):
        if after_state(step, plan)["state"] != "ready":
            continue
        fingerprint = _finished_fingerprint(step)
        os.makedirs(os.path.dirname(_after_log(step)), exist_ok=True)
        rc = 0
        with open(_after_log(step), "a") as logf:
            for cmd in step.commands:
                log(f"after {step.key}: {' '.join(shlex.quote(c) for c in cmd)}")
                logf.write(f"\n[campaign] {time.strftime('%Y-%m-%d %H:%M:%S')} $ "
                           f"{' '.join(shlex.quote(c) for c in cmd)}\n")
                logf.flush()
                rc = subprocess.call(cmd, cwd=ROOT, stdout=logf, stderr=subprocess.STDOUT,
                                     preexec_fn=(lambda: os.nice(nice)) if nice else None)
                if rc:
                    log(f"after {step.key}: exit status {rc} (log: {repo_relative(_after_log(step))})")
                    break
        write_json_atomic(_after_marker(step), {"finished": time.strftime("%Y-%m-%d %H:%M:%S"),
                                                "returncode": rc, "runs": fingerprint})
        if not rc:
            try:
                write_index(step.paper, step.table, TABLES[step.paper][step.table])
            except (Exception, SystemExit) as err:  # noqa: BLE001 - never stop the campaign
                log(f"after {step.key}: rewriting the index file failed: {type(err).__name__}: {err}")
        log(f"after {step.key}: {after_state(step, plan)['state']}")
        ran.append(step.key)
    return ran


# ---------------------------------------------------------------------------------------------
# state of a run, throughput, estimates

def _updates_so_far(run_dir: str) -> int:
    from .curves import loss_curves

    logp = os.path.join(run_dir, "train.log")
    if not os.path.exists(logp):
        return 0
    curve, valid = loss_curves(logp)
    return max([u for u, _ in curve] + [u for u, _ in valid] + [0])


def _own_rate(run_dir: str) -> Optional[float]:
    """Seconds per update of a run in progress: fairseq's ``ups`` on its last progress line."""
    from .curves import progress_stats

    logp = os.path.join(run_dir, "train.log")
    if not os.path.exists(logp):
        return None
    last = None
    with open(logp, errors="replace") as f:
        for line in f:
            if " | train_inner | " in line:
                last = line
    st = progress_stats(last, "train_inner") if last else None
    ups = st.get("ups") if st else None
    return 1.0 / ups if isinstance(ups, float) and ups > 0 else None


def _vocab(run: Run) -> Optional[int]:
    return tables._vocab(run.spec, run.row)


def run_state(run: Run) -> Dict:
    """``{"state", "reason", "updates", "where"}`` of a run: ``done`` (a counted result, in the
    run directory or committed evidence), ``failed`` (with the reason), ``running`` (its
    run-directory lock is held), ``partial`` (checkpoints, no runner), ``submitted`` (a slurm
    job recorded, not started yet) or ``pending``."""
    # the run directory first, then its runner, then committed evidence (of this or an earlier attempt)
    held = not os.path.exists(os.path.join(run.dir, "result.json")) and lock_held(run.dir)
    found = None if held else evidence.locate(run.dir, run.regime)
    if found:
        with open(os.path.join(found, "result.json")) as f:
            res = json.load(f)
        reason = tables.failure_reason(res, _vocab(run))
        # a failure in committed evidence whose run directory has had a failed attempt retired
        # (--retry-failed) is that attempt or an older one: the retry, even killed, supersedes it
        retried = (reason and res.get("status") == "failed" and os.path.abspath(found) != os.path.abspath(run.dir)
                   and tables.retired_failures(run.dir))
        if not retried:
            return {"state": "failed" if reason else "done", "reason": reason, "updates": res.get("updates", 0),
                    "where": repo_relative(found), "result": res}
    updates = _updates_so_far(run.dir)
    if held:
        return {"state": "running", "reason": None, "updates": updates, "where": repo_relative(run.dir)}
    meta = _read_json(os.path.join(run.dir, "campaign.json")) or {}
    ended = None
    if meta.get("launcher") == "slurm" and meta.get("job_id") and not meta.get("finished"):
        # submitit's local executor (--cluster local) runs no SLURM job: nothing to ask
        local = meta.get("cluster") == "local"
        alive = None if local else slurm_job_alive(str(meta["job_id"]))
        if alive is not False:  # queued or running, or no squeue here to ask
            reason = f"job {meta['job_id']}" + ("" if alive or local else " (squeue not available: not checked)")
            return {"state": "submitted", "reason": reason, "updates": updates, "where": repo_relative(run.dir)}
        # gone from the queue without a result (time limit, node failure, scancel): resumable like any other
        ended = f"slurm job {meta['job_id']} ended without a result"
    if updates or os.path.exists(os.path.join(run.dir, "checkpoints", "checkpoint_last.pt")):
        return {"state": "partial", "reason": ended, "updates": updates, "where": repo_relative(run.dir)}
    return {"state": "pending", "reason": ended, "updates": 0, "where": None}


def slurm_job_alive(job_id: str) -> Optional[bool]:
    """Whether SLURM still has the job (pending, running, completing ...): ``squeue -h -j ID -o %T``
    prints its state; nothing, or "Invalid job id" once SLURM has forgotten it, means it has left the
    queue.  ``None`` when there is no ``squeue`` to ask (or it fails otherwise)."""
    try:
        out = subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%T"], capture_output=True, text=True,
                             timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    if out.returncode == 0:
        return bool(out.stdout.strip())
    return False if "invalid job id" in (out.stderr or "").lower() else None


def _read_json(path: str) -> Optional[Dict]:
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def device_name(hw: Optional[Dict] = None) -> str:
    """The device a throughput belongs to: the accelerator's name, or ``cpu: <model> (<n> cores)``."""
    hw = hw or hardware()
    if hw.get("accelerator") and hw["accelerator"] != "cpu only":
        return str(hw["accelerator"])
    return f"cpu: {hw.get('cpu')} ({hw.get('cores')} cores)"


def _model_key(arch: Optional[str], fns) -> Tuple[Optional[str], Optional[Tuple[str, ...]]]:
    """Which model a run trains, for throughput: its architecture and attention functions
    (encoder, decoder, cross; None for the architecture's defaults).  ``fns``: a run row's list or a
    ``result.json``'s ``attention_fns`` mapping."""
    if isinstance(fns, dict):
        fns = [fns.get(k) for k in ("encoder", "decoder", "cross")]
    return arch, (tuple(fns) if isinstance(fns, (list, tuple)) and fns else None)


def _seconds_between(started: Optional[str], finished: Optional[str]) -> Optional[float]:
    """Seconds from ``started`` to ``finished`` (``campaign.json``'s ``%Y-%m-%d %H:%M:%S`` stamps);
    None when either is missing or unreadable."""
    try:
        fmt = "%Y-%m-%d %H:%M:%S"
        return time.mktime(time.strptime(finished, fmt)) - time.mktime(time.strptime(started, fmt))
    except (TypeError, ValueError):
        return None


def throughput_records(extra_dirs: Optional[List[str]] = None) -> List[Dict]:
    """Every finished run's measured speed: ``{"budget", "device", "jobs", "model", "s_per_update",
    "overhead_s"}`` from the ``result.json`` (+ ``campaign.json``) of committed evidence and of
    ``extra_dirs`` (run directories).  ``model``: :func:`_model_key`.  ``overhead_s``: everything
    but training -- the launcher's wall time of the run's last invocation (``campaign.json``'s
    ``started`` to ``finished``: process start, data check, averaging, decoding, scoring) less
    that invocation's training, where the launcher recorded both; else the runner-timed averaging
    and evaluation alone."""
    paths = evidence.committed_results() + [os.path.join(d, "result.json") for d in extra_dirs or []]
    out, seen = [], set()
    for p in paths:
        res = _read_json(p)
        if not res or res.get("status") != "done" or not res.get("updates"):
            continue
        key = (res.get("git_commit"), res.get("time"), res.get("name"))
        if key in seen:
            continue
        seen.add(key)
        wall = res.get("wall_s") or {}
        train = wall.get("train_fairseq_cumulative") or wall.get("train")
        if not train:
            continue
        meta = res.get("campaign") or _read_json(os.path.join(os.path.dirname(p), "campaign.json")) or {}
        overhead = float(wall.get("average", 0.0)) + float(wall.get("evaluate", 0.0))
        total = _seconds_between(meta.get("started"), meta.get("finished"))
        if total is not None and wall.get("train") and total - float(wall["train"]) > overhead:
            overhead = total - float(wall["train"])
        out.append({"budget": os.path.realpath(evidence.resolve(res.get("config", {}).get("budget_file", "?"))),
                    "device": device_name(res.get("hardware") or {}), "jobs": int(meta.get("jobs", 1)),
                    "model": _model_key(res.get("arch"), res.get("attention_fns")),
                    "s_per_update": float(train) / float(res["updates"]), "overhead_s": overhead})
    return out


@functools.lru_cache(maxsize=None)
def _training_key(path: str) -> Optional[str]:
    """What makes a budget's per-update time and its time outside training (JSON of its ``train``
    flags without ``max-update``, ``train-gpu``, ``average``, ``generate``, ``data``); None when it
    cannot be loaded.  Cached: ``status`` asks it for every record x run."""
    try:
        b = load_budget(path)
    except SystemExit:
        return None
    train = {k: v for k, v in b.get("train", {}).items() if k != "max-update"}
    return json.dumps([train, b.get("train-gpu"), b.get("average"), b.get("generate"), b.get("data")], sort_keys=True)


def _same_training(budget_a: str, budget_b: str) -> bool:
    """Whether two budgets train alike per update: the same ``train`` / ``train-gpu`` flags except
    ``max-update`` (and the same averaging and decoding: the time outside training); False when
    either cannot be loaded."""
    ka = _training_key(os.path.realpath(budget_a))
    return ka is not None and ka == _training_key(os.path.realpath(budget_b))


def estimate_minutes(run: Run, records: List[Dict], device: str, jobs: int,
                     budget: str, updates_done: int = 0) -> Optional[float]:
    """Minutes the run still needs on ``device`` with ``jobs`` runs at once: the median
    seconds per update of finished runs of the same budget and device (same concurrency if any,
    else the slowest concurrency measured; among those, runs of the same model -- architecture and
    attention functions -- if any, else of the same architecture, else all), times the updates
    left, plus their median time outside training (:func:`throughput_records`).  Without a run of
    this budget, runs of a budget that trains the same way for another number of updates stand in
    (:func:`_same_training`: e.g. the converged budget's for ``converged_6k``).  None without such
    a measurement."""
    same = [r for r in records if r["budget"] == os.path.realpath(budget) and r["device"] == device]
    if not same:
        same = [r for r in records if r["device"] == device and _same_training(r["budget"], budget)]
    if not same or not run.target_updates:
        return None
    exact = [r for r in same if r["jobs"] == jobs]
    pool = exact or [r for r in same if r["jobs"] == max(x["jobs"] for x in same)]
    model = _model_key(run.row.get("arch"), run.row.get("fns"))
    pool = ([r for r in pool if r.get("model") == model]
            or [r for r in pool if (r.get("model") or (None,))[0] == model[0]] or pool)
    spu = statistics.median(r["s_per_update"] for r in pool)
    overhead = statistics.median(r["overhead_s"] for r in pool)
    left = max(0, run.target_updates - updates_done)
    return (left * spu + overhead) / 60.0


# ---------------------------------------------------------------------------------------------
# after a run: evidence and tables

def analyse(plan: Dict, run: Run) -> List[str]:
    """Run the ``analyses`` of every plan table that shows ``run`` (its own table's and, for a run
    another table reuses through a row's ``run:``, that table's: E-ATT Table 4's energy of
    ReLA Table 1's softmax run) on the finished run, those not done yet
    (:func:`mt_pipeline.tables.run_analyses`); returns the files written.  A failing analysis
    is logged, never raised: it must not stop the campaign, and the table shows "n/a" for it."""
    written = []
    for table in run.tables:
        spec = plan["_specs"][table]
        for row in spec["rows"]:
            if not spec.get("analyses") or tables.run_dir(spec, row, run.seed) != run.dir:
                continue
            try:
                written += tables.run_analyses(spec, row, run.seed)
            except Exception as err:  # noqa: BLE001 - never stop the campaign
                log(f"analyses of {table} row {row['id']} on {run.key} failed: {type(err).__name__}: {err}")
    return written


def _export_if_stale(run: Run) -> Optional[str]:
    """Export the run's evidence (:func:`mt_pipeline.evidence.export`) unless the committed evidence
    already is this finish of the run, analyses included (:func:`mt_pipeline.evidence.is_current`: by
    content, not file times); returns the evidence directory written, else None."""
    if evidence.is_current(run.dir, run.regime):
        return None
    d = evidence.export(run.dir, run.regime)
    if d:
        log(f"evidence of {run.key}: {repo_relative(d)}")
    return d


def collect(plan: Dict, runs: Optional[List[Run]] = None) -> List[str]:
    """Export the evidence of every finished run (of ``runs``, default the whole plan) whose run
    directory is here, then run its missing analyses (:func:`analyse`) and export again if they
    wrote anything -- the scores are committed-ready first, so a machine that is taken away during
    an analysis (a lent GPU window ending) still leaves the run's evidence; returns the evidence
    directories written."""
    out = []
    for run in runs or plan["_runs"]:
        res = _read_json(os.path.join(run.dir, "result.json"))
        if res is None:
            continue
        d = _export_if_stale(run)
        if res.get("status") == "done":
            written = analyse(plan, run)
            for path in written:
                log(f"analysis of {run.key}: {repo_relative(path)}")
            if written:
                d = _export_if_stale(run) or d
        if d and d not in out:
            out.append(d)
    return out


def render_tables(plan: Dict, table_paths: Optional[List[str]] = None) -> None:
    """Re-render the plan's tables (or only ``table_paths``) that have a finished run -- a page whose
    numbers predate committed evidence (:func:`mt_pipeline.evidence.predates_evidence`) only once
    every row it shows a number for has one (:func:`mt_pipeline.reproduce.predated_rows_pending`) --
    then every index file (``results/<paper>/<table>.md``, :func:`mt_pipeline.reproduce.render_indexes`) with a
    part among them: the index rows quote the full tables, so none keeps a stale row."""
    from .reproduce import predated_rows_pending, render_indexes  # reproduce imports the table machinery: import late

    rendered = []
    for table in table_paths or list(plan["_specs"]):
        spec = plan["_specs"][table]
        done = {r["id"]: bool(tables.row_results(spec, r)) for r in spec["rows"]}
        if not any(done.values()):
            continue  # nothing finished yet: no table of pending rows
        waiting = predated_rows_pending(os.path.join(ROOT, spec["out"]), done)
        if waiting:
            log(f"kept {spec['out']}: its numbers predate committed evidence; it is re-rendered once the rows it "
                f"shows numbers for have re-run (waiting for row(s) {', '.join(map(str, waiting))})")
            continue
        try:
            tables.render(spec)
            rendered.append(spec["out"])
        except (Exception, SystemExit) as err:  # a render problem (a spec refused) must not stop the campaign
            log(f"rendering {table} failed: {type(err).__name__}: {err}")
    try:
        if rendered:
            render_indexes(rendered)
    except (Exception, SystemExit) as err:  # noqa: BLE001 - same: never stop the campaign
        log(f"rendering the index files failed: {type(err).__name__}: {err}")


def _seed_scores(results: List[Dict], subset: str) -> Dict[object, Dict]:
    return {tables._seed(r): r for r in results if r.get("scores", {}).get(subset)}


def gap_trend(pairs: List[Tuple[str, str]], row_id, ref_id) -> Dict:
    """How the two rows of a claim drift apart or together during training -- context for a
    verdict, not part of it.

    Args:
        pairs: one ``(row run directory, reference run directory)`` per seed-matched seed; each
            holds ``train.log`` or the evidence's ``train.log.gz`` (:func:`mt_pipeline.curves.run_train_log`).
        row_id, ref_id: the rows' ids, for the words.

    Returns:
        ``{"cell": str, "own": {run directory: float}}``: ``cell`` says the seed-mean difference row - reference of
        the validation NLL (fairseq's ``valid_nll_loss``: bits per target token, no label smoothing
        and no auxiliary loss such as ReLUFormer's eq. 7 term, so rows of one target dictionary
        compare) at a third, two thirds and the end of the shortest run's updates, the same
        updates for every seed (linear between validations), and the gap's least-squares slope over the last third, per 1,000 updates:
        "closing" or "widening" only when it points toward the same row in every seed and its
        seed mean exceeds 2 standard errors (the verdicts' seed-noise rule, applied to the slope).
        ``own``: each run's own validation-NLL slope over its last third, per 1,000 updates
        (negative: still improving).  A seed without logs gives ``cell`` "training logs missing",
        one with fewer than 3 validations in that last third "too few validations ...", and no ``own``.
    """
    from .curves import interpolate, run_train_log, slope_per_1000, valid_curve

    curves = [(row_dir, ref_dir, valid_curve(run_train_log(row_dir)), valid_curve(run_train_log(ref_dir)))
              for row_dir, ref_dir in pairs]
    if not curves or any(not a or not b for _, _, a, b in curves):
        return {"cell": "training logs missing", "own": {}}
    end = min(min(a[-1][0], b[-1][0]) for _, _, a, b in curves)  # every seed's gap at the same updates
    thin = {"cell": "too few validations to compare (3 in the last third of training needed)", "own": {}}
    gaps, slopes, own = [], [], {}
    for row_dir, ref_dir, a, b in curves:
        at = [interpolate(a, k * end / 3) for k in (1, 2, 3)], [interpolate(b, k * end / 3) for k in (1, 2, 3)]
        if None in at[0] or None in at[1]:
            return thin
        gaps.append([x - y for x, y in zip(*at)])
        last = [(u, interpolate(a, u) - y) for u, y in b if 2 * end / 3 <= u <= end and interpolate(a, u) is not None]
        slope = slope_per_1000(last)
        if slope is None:
            return thin
        slopes.append(slope)
        for d, c in ((row_dir, a), (ref_dir, b)):
            own[os.path.abspath(d)] = slope_per_1000([p for p in c if p[0] >= 2 * c[-1][0] / 3])
    from .significance import seed_summary

    n = len(gaps)
    mean = [statistics.fmean(g[i] for g in gaps) for i in range(3)]
    summary = seed_summary(slopes)  # the verdicts' seed statistics, applied to the slope
    slope = summary["mean"]
    at_u = " / ".join(f"{round(k * end / 3):,}" for k in (1, 2, 3))
    toward_row = sum(s_ < 0 for s_ in slopes)  # row's NLL falls relative to the reference's
    toward_ref = sum(s_ > 0 for s_ in slopes)
    two_se = 2 * summary["sd"] / math.sqrt(n) if n > 1 else math.inf
    if n < 2:
        words = "one seed: no direction claimed"
    elif (toward_row == n or toward_ref == n) and abs(slope) > two_se:
        fav = row_id if toward_row == n else ref_id
        behind = row_id if mean[2] > 0 else ref_id
        words = f"toward row {fav} in {n} of {n} seeds: {'closing' if fav == behind else 'widening'}"
    else:
        words = (f"no consistent direction (toward row {row_id} in {toward_row} of {n} seeds, "
                 f"mean slope within 2 standard errors: {two_se:.3f})")
    cell = (f"row {row_id} − row {ref_id}: {mean[0]:+.2f}, {mean[1]:+.2f}, {mean[2]:+.2f} bits/token at {at_u} "
            f"updates; last third {slope:+.3f} per 1,000 updates, {words}")
    return {"cell": cell, "own": {d: x for d, x in own.items() if x is not None}}


def _test_set_sd(ref_runs: List[Dict], sys_runs: List[Dict], subset: str) -> Optional[Dict]:
    """:func:`mt_pipeline.significance.testset_sd` of the seed-matched runs (``result.json`` dicts with
    ``_dir``, ``ref_runs[k]`` and ``sys_runs[k]`` one seed) on ``subset``: the hypotheses and the
    reference that the seed-matched paired bootstrap reads (:func:`mt_pipeline.tables._significance`),
    cached like it in the system's first-seed run directory (``significance.json``, keyed by every
    run's checkpoint; a run read from committed evidence is not cached).  None when a hypothesis or
    the reference file is missing.

    Raises:
        ValueError: the runs record different references for ``subset`` (``ref_sha256``), or the
            reference file is not the one scored (:func:`mt_pipeline.tables.read_reference`).
    """
    from .evidence import resolve
    from .significance import testset_sd

    scores = [r["scores"].get(subset) for r in ref_runs + sys_runs]
    if not all(scores) or not all(os.path.exists(resolve(x["hyp"])) for x in scores) \
            or not os.path.exists(resolve(scores[0]["ref"])):
        return None
    shas = {x["ref_sha256"] for x in scores if x.get("ref_sha256")}
    if len(shas) > 1:
        raise ValueError(f"test-set bootstrap on {subset}: the runs were scored against different references "
                         f"({', '.join(sorted(x[:12] for x in shas))})")
    ids = lambda runs: ",".join(x["scores"][subset].get("checkpoint_sha256", x["scores"][subset]["hyp"])  # noqa: E731
                                for x in runs)
    lc = any(evidence.lowercased(x) for x in scores)  # scored on lowercased text (case:lc): so is the bootstrap
    key = (f"testset_sd:{subset}:{ids(ref_runs)}:{ids(sys_runs)}" + (f":{next(iter(shas))}" if shas else "")
           + (":lc" if lc else ""))
    return tables.cached_significance(sys_runs[0]["_dir"], key, lambda: testset_sd(
        tables.read_reference(scores[0]),
        [tables._read(resolve(x["scores"][subset]["hyp"])) for x in ref_runs],
        [tables._read(resolve(x["scores"][subset]["hyp"])) for x in sys_runs], lowercase=lc))


def other_budget(res: Dict, row: Dict) -> Optional[str]:
    """Why the run ``res`` (a ``result.json``) was not trained under the row's budget (``row["_budget"]``,
    the plan's), or ``None``: the budget it recorded (``config.budget``) differs in a key other than
    ``train.seed`` (e.g. ``converged.yaml`` edited after the run: its evidence must not be counted as the
    new budget's).  Records without ``config.budget`` (older ones) are not judged."""
    from .experiment import BATCH_SPLIT

    recorded = (res.get("config") or {}).get("budget")
    expected = row.get("_budget")
    if recorded is None or expected is None:
        return None
    # a budget with a `batch` section records no split of its tokens over GPUs (experiment.run_config)
    ignore = {"seed"} | (set(BATCH_SPLIT) if expected.get("batch") else set())
    diff = []
    for key in sorted(set(recorded) | set(expected)):
        a, b = recorded.get(key), expected.get(key)
        if key == "train" and isinstance(a, dict) and isinstance(b, dict):
            diff += [f"train.{k}" for k in sorted(set(a) | set(b)) if k not in ignore and a.get(k) != b.get(k)]
        elif a != b:
            diff.append(key)
    return f"trained under another budget ({', '.join(diff)} differ)" if diff else None


def claim_verdict(plan: Dict, claim: Dict) -> Dict:
    """The verdict of one plan claim by the page's rule (module docstring): ``{"ours", "verdict",
    "seeds", "trend"}`` (``trend``: :func:`gap_trend` of the seed-matched runs, context beside the
    verdict)."""
    spec = plan["_specs"][claim["table"]]
    by_id = {r["id"]: r for r in spec["rows"]}
    row, ref = by_id[claim["row"]], by_id[claim["vs"]]
    first = next(iter(spec["subsets"]))
    found = {id(r): [(x, other_budget(x, r)) for x in tables.row_results(spec, r)] for r in (row, ref)}
    ok = lambda res, r: [x for x, other in res  # noqa: E731
                         if other is None and tables.failure_reason(x, tables._vocab(spec, r)) is None]
    stale = [f"row {r['id']} {os.path.basename(x['_dir'])}: {other}" for r in (row, ref) for x, other in found[id(r)] if other]
    sys_by = _seed_scores(ok(found[id(row)], row), first)
    ref_by = _seed_scores(ok(found[id(ref)], ref), first)
    common = sorted((s for s in sys_by if s in ref_by), key=str)
    reg = tables.row_regime(row)
    tag = spec.get("_tag") or reg  # e.g. converged_6k: the converged regime at twice the updates
    left_out = f" (left out: {'; '.join(stale)})" if stale else ""
    if not common:
        return {"ours": "not run yet" + left_out, "verdict": f"not tested yet (0/{MIN_SEEDS} seeds)", "seeds": 0,
                "trend": {"cell": "", "own": {}}}
    sys_s = [sys_by[s]["scores"][first]["bleu"] for s in common]
    ref_s = [ref_by[s]["scores"][first]["bleu"] for s in common]
    delta = statistics.fmean(sys_s) - statistics.fmean(ref_s)
    ours = (f"{tables._mean_cell(sys_s)} vs {tables._mean_cell(ref_s)} "  # mean ± sd over seeds
            f"(Δ {delta:+.2f}, {len(common)} seed{'s' if len(common) > 1 else ''}, {tag}){left_out}")
    labels = {tables.hardware_label(x) for x in [sys_by[s] for s in common] + [ref_by[s] for s in common]}
    if len(labels) > 1:  # e.g. CPU fp32 seeds beside GPU fp16 ones: say so beside the numbers
        def on(label, rid, by):
            seeds = [str(s) for s in common if tables.hardware_label(by[s]) == label]
            return [f"row {rid} seed{'s' if len(seeds) > 1 else ''} {', '.join(seeds)}"] if seeds else []
        ours += "; mixed hardware: " + "; ".join(
            f"{label}: {' and '.join(on(label, claim['row'], sys_by) + on(label, claim['vs'], ref_by))}"
            for label in sorted(labels))
    trend = gap_trend([(sys_by[s]["_dir"], ref_by[s]["_dir"]) for s in common], claim["row"], claim["vs"])
    try:
        tests = [tables._significance(ref_by[s], sys_by[s], first) for s in common]
    except (OSError, ValueError) as err:  # e.g. the reference is not the one the runs were scored against
        return {"ours": ours, "verdict": f"cannot test: {err}", "seeds": len(common), "trend": trend}
    if any(t is None for t in tests):
        return {"ours": ours, "verdict": "hypotheses missing: cannot test", "seeds": len(common), "trend": trend}
    from .significance import seed_summary, verdict

    words = verdict(ref_s, sys_s, [t["bleu_p"] for t in tests])
    if reg not in VERDICT_REGIMES or len(common) < MIN_SEEDS:
        direction = "better" if delta > 0 else "worse" if delta < 0 else "equal"
        return {"ours": ours, "seeds": len(common), "trend": trend,
                "verdict": f"not tested yet ({len(common)}/{MIN_SEEDS} seeds, {reg}): so far {direction}; {words}"}
    from .significance import seeds_against, welch

    a, b = seed_summary(sys_s), seed_summary(ref_s)
    se = math.sqrt(a["sd"] ** 2 / a["n"] + b["sd"] ** 2 / b["n"])  # seeds only: the "beyond seed noise" test
    # every seed's bootstrap significant *in the direction of the mean* (sacreBLEU's p is for |Δ|)
    all_p = not seeds_against(ref_s, sys_s, [t["bleu_p"] for t in tests])
    equal = claim["expect"] == "equal"
    sd_test = 0.0
    if equal:  # the equivalence test's interval adds the test set's sampling noise of the seed-mean Δ
        try:
            joint = _test_set_sd([ref_by[s] for s in common], [sys_by[s] for s in common], first)
        except (OSError, ValueError) as err:
            return {"ours": ours, "verdict": f"cannot test: {err}", "seeds": len(common), "trend": trend}
        if joint is None:
            return {"ours": ours, "verdict": "hypotheses missing: cannot test", "seeds": len(common), "trend": trend}
        sd_test = joint["sd"]
    se_total = math.sqrt(se ** 2 + sd_test ** 2)

    def decide(mult: float, what: str) -> str:
        """The rule's verdict with the multiplier ``mult`` (``what`` names the interval): beyond seed
        noise on Δ ± mult x SE (seeds), equivalence on Δ ± mult x SE (seeds and test set)."""
        beyond = abs(delta) > mult * se and all_p
        if equal:
            m, half = float(claim.get("margin", 1.0)), mult * se_total
            if abs(delta) + half <= m:
                return f"reproduced: equivalent within ±{m:g} BLEU"
            if beyond and abs(delta) - half > m:
                return f"not reproduced: differs by more than {m:g} BLEU, beyond seed noise"
            if beyond:
                way = "better" if delta > 0 else "worse"
                return (f"inconclusive: {way} beyond seed noise, but Δ ± {what} reaches inside "
                        f"±{m:g} BLEU (neither equivalent nor different by more than {m:g})")
            return f"inconclusive: neither equivalent within ±{m:g} BLEU nor different beyond it"
        if beyond and (delta > 0) == (claim["expect"] == "better"):
            return f"reproduced: {claim['expect']} beyond seed noise"
        if beyond:
            return "not reproduced: the opposite direction, beyond seed noise"
        return f"inconclusive: no difference beyond seed noise (expected {claim['expect']})"

    v = decide(2, "2 SE (seeds and test set)" if equal else "2 standard errors")
    if equal:
        v += (f"; Δ ± 2 SE (seeds and test set): [{delta - 2 * se_total:.2f}, {delta + 2 * se_total:.2f}], "
              f"SE {se_total:.2f} = √({se:.2f}² seeds + {sd_test:.2f}² test set)")
    try:
        w = welch(ref_s, sys_s)
    except ValueError:  # no spread at all: the t interval is the point itself, as the normal one
        w = None
    if w is not None:
        alt = decide(w["t"], "a Welch t interval")
        if alt.split(":")[0] != v.split(":")[0]:
            half = w["t"] * (se_total if equal else w["se"])
            v += (f"; with a Welch t interval instead of 2 standard errors (ν = {w['df']:.1f}, ×{w['t']:.2f}: "
                  f"Δ in [{delta - half:.2f}, {delta + half:.2f}]) it would be "
                  f"{alt.split(':')[0]}")
    return {"ours": ours, "verdict": f"{v} ({words})", "seeds": len(common), "trend": trend}


def render_verdicts(plan: Dict, page: Optional[str] = None) -> Optional[str]:
    """Write the claims' verdicts between the plan's markers (:func:`markers`) of
    ``results/README.md``; without them on the page, a ``section`` plan's block goes right after the
    first plan's block, any other is appended.  Returns the page path, or None without claims."""
    claims = plan.get("claims") or []
    if not claims:
        return None
    page = page or os.path.join(ROOT, "results", "README.md")
    plan_rel = repo_relative(plan["_path"])
    begin, end = markers(plan)
    heading = (f"{plan.get('title') or plan['section']}: verdicts" if plan.get("section")
               else "Converged campaign verdicts")
    lines = [begin, "", f"### {heading} (`mt-campaign render --plan {plan_rel}`)", "",
             f"Rule (this page's): a verdict needs the converged budget (or paper scale) and ≥ {MIN_SEEDS} seed-matched runs of both "
             "rows; first test subset, SacreBLEU mean over seeds; \"beyond seed noise\" = |Δ mean| > 2 standard "
             "errors over seeds (SE seeds: unpaired, √(s₁²/n + s₂²/n) of the seeds' sample sds) and every "
             "seed-matched paired bootstrap p < 0.05 with that seed's Δ of the mean's sign (sacreBLEU's paired bootstrap, "
             "1,000 resamples: Moses' test of |Δ|, one-sided in effect -- a centred two-sided p is about twice as "
             "large near 0.05); within it: "
             "inconclusive. A \"matches\" claim is an equivalence test on Δ ± 2 SE (seeds and test set), "
             "SE = √(SE seeds² + sd test set²), sd test set the bootstrap sd of the seed-mean Δ when one set of "
             "resampled sentences is applied to every seed of both rows (`significance.testset_sd`: the seeds "
             "share one test set, so their spread lacks its sampling noise): reproduced when the interval lies "
             "inside ± the claim's margin, not reproduced when it lies wholly outside it (and Δ is beyond seed "
             "noise), else inconclusive. "
             "The 2 is the normal approximation: a verdict that a Welch t interval (Student's t for so few "
             "seeds, `significance.welch`, times the same standard errors) would change says so. "
             "Evidence of every run: `results/runs/`.", "",
             "| claim | paper | ours | seeds | verdict | validation NLL gap during training (not part of the verdict) |",
             "|---|---|---|---|---|---|"]
    own: Dict[str, float] = {}  # run directory -> its own slope (a run shared by two claims counts once)
    for claim in claims:
        v = claim_verdict(plan, claim)
        own.update(v["trend"]["own"])
        lines.append(f"| {claim['claim']} | {claim.get('paper', '')} | {v['ours']} | {v['seeds']} | {v['verdict']} "
                     f"| {v['trend']['cell']} |")
    lines += ["", "Last column: the seed-mean difference of validation NLL (fairseq's `valid_nll_loss`, bits per "
              "target token: no label smoothing, no auxiliary loss) between the claim's rows at a third, two thirds "
              "and the end of training, and its least-squares slope over the last third; \"closing\" / "
              "\"widening\" only when that slope points toward the same row in every seed and its mean exceeds 2 "
              "standard errors "
              "(`mt_pipeline.campaign.gap_trend`, from the committed `train.log.gz`)."]
    if own:
        falling = sorted(-x for x in own.values() if x < 0)
        lines[-1] += (f" The budget is called converged, but at its end {len(falling)} of these {len(own)} runs' own "
                      "validation NLL was still falling"
                      + (f", by {falling[0]:.3f} to {falling[-1]:.3f} bits/token per 1,000 updates over their last "
                         "third" if falling else "")
                      + ": each verdict holds for this budget, and a gap closing in every seed may close further "
                      "with a longer one.")
    lines += ["", end]
    block = "\n".join(lines)
    text = open(page, encoding="utf-8").read() if os.path.exists(page) else "# Results\n"
    if begin in text and end in text:
        head, rest = text.split(begin, 1)
        text = head + block + rest.split(end, 1)[1]
    elif begin != BEGIN and END in text:  # a section's first render: right after the first plan's block
        head, rest = text.split(END, 1)
        text = head + END + "\n\n" + block + rest
    else:
        text = text.rstrip("\n") + "\n\n" + block + "\n"
    with atomic_path(page) as tmp, open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
    return page


def render(plan: Dict) -> None:
    """Export every finished run's evidence, re-render every table of the plan, the index files and
    the verdicts."""
    collect(plan)
    render_tables(plan)
    page = render_verdicts(plan)
    if page:
        log(f"verdicts written to {repo_relative(page)}")


# ---------------------------------------------------------------------------------------------
# launchers

def _gpu_jobs(plan: Dict) -> int:
    """How many runs fit at once on the visible GPUs: per GPU its free memory /
    ``gpu.mem_per_run_gib`` (default 6), summed; at most one per 2 CPU cores, at least 1."""
    import torch

    per_run = float((plan.get("gpu") or {}).get("mem_per_run_gib", 6)) * 2 ** 30
    fit = sum(int(torch.cuda.mem_get_info(i)[0] // per_run) for i in range(torch.cuda.device_count()))
    return max(1, min(fit, (os.cpu_count() or 2) // 2))


def _visible_gpus() -> List[str]:
    """The CUDA devices this process may use, as ``CUDA_VISIBLE_DEVICES`` entries (its own list
    when set, else ``0 .. device_count-1``); ``[]`` without CUDA."""
    import torch

    if not torch.cuda.is_available():
        return []
    given = os.environ.get("CUDA_VISIBLE_DEVICES")
    if given:
        return [x.strip() for x in given.split(",") if x.strip()][:torch.cuda.device_count()]
    return [str(i) for i in range(torch.cuda.device_count())]


def _core_slices(jobs: int) -> List[List[int]]:
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))
    share = max(1, len(cores) // jobs)
    return [cores[i * share:(i + 1) * share] or cores for i in range(jobs)]


class LocalLauncher:
    """Runs on this machine: up to ``jobs`` experiment processes at once, each in its own process
    group, niced, pinned to its share of cores and, with CUDA, to one GPU (slot ``i`` sees only
    GPU ``i mod n`` of the ``n`` visible: ``CUDA_VISIBLE_DEVICES``; a run trains on one device);
    TERM/INT/HUP stop them (they resume later)."""

    def __init__(self, plan: Dict, jobs: int, nice: int, device: str, gpus: Optional[List[str]] = None):
        self.plan, self.jobs, self.nice, self.device = plan, jobs, nice, device
        self.gpus = _visible_gpus() if gpus is None else gpus
        self.active: Dict[subprocess.Popen, Run] = {}
        self.slices = _core_slices(jobs)
        self.free_slices = list(range(jobs))
        self.slot: Dict[subprocess.Popen, int] = {}

    def start(self, run: Run) -> None:
        """Start ``run`` (``python -m mt_pipeline.experiment``) in a free slot, in the background.

        The process gets the slot's cores (and GPU), ``nice`` and its own session; writes
        ``<run.dir>/campaign.json`` (launcher, cores, GPU, start time) and appends the command and
        the run's output to ``<run.dir>/campaign.log``.  The caller keeps at most ``jobs`` runs active."""
        slot = self.free_slices.pop(0)
        cores = self.slices[slot]
        os.makedirs(run.dir, exist_ok=True)
        meta = {"launcher": "local", "jobs": self.jobs, "device": self.device, "cores": cores,
                "started": time.strftime("%Y-%m-%d %H:%M:%S"), "plan": repo_relative(self.plan["_path"])}
        env = dict(os.environ, OMP_NUM_THREADS=str(len(cores)), MKL_NUM_THREADS=str(len(cores)))
        if self.gpus:
            env["CUDA_VISIBLE_DEVICES"] = meta["gpu"] = self.gpus[slot % len(self.gpus)]
        write_json_atomic(os.path.join(run.dir, "campaign.json"), meta)
        cmd = [sys.executable, "-m", "mt_pipeline.experiment", *tables.experiment_argv(run.spec, run.row, run.seed)]
        nice = self.nice

        def pre():
            if nice:
                os.nice(nice)
                # with the kernel's autogroups (a scheduling group per session, as here) a process's
                # nice weighs only against its own session: the run's new session is niced as a whole
                with contextlib.suppress(OSError):
                    with open("/proc/self/autogroup", "w") as f:
                        f.write(str(nice))
            if hasattr(os, "sched_setaffinity"):
                os.sched_setaffinity(0, cores)

        logf = open(os.path.join(run.dir, "campaign.log"), "a")
        logf.write(f"\n[campaign] {time.strftime('%Y-%m-%d %H:%M:%S')} $ {' '.join(shlex.quote(c) for c in cmd)}\n")
        logf.flush()
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=logf, stderr=subprocess.STDOUT,
                                start_new_session=True, preexec_fn=pre)
        logf.close()
        self.active[proc] = run
        self.slot[proc] = slot
        log(f"started {run.key} (pid {proc.pid}, cores {cores}, nice {nice}) -> {repo_relative(run.dir)}")

    def wait_one(self) -> tuple:
        """Block (polling every 2 s) until an active run exits; free its slot, return ``(run, returncode)``."""
        while True:
            for proc in list(self.active):
                if proc.poll() is not None:
                    run = self.active.pop(proc)
                    self.free_slices.append(self.slot.pop(proc))
                    return run, proc.returncode
            time.sleep(2)

    def stop_all(self, sig=signal.SIGTERM) -> None:
        """Send ``sig`` to the process group of every active run, then wait up to 60 s for each to exit."""
        for proc in self.active:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, sig)
        for proc in self.active:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=60)


def _finish(plan: Dict, run: Run, rc: int) -> None:
    meta = _read_json(os.path.join(run.dir, "campaign.json")) or {}
    meta.update(finished=time.strftime("%Y-%m-%d %H:%M:%S"), returncode=rc)
    write_json_atomic(os.path.join(run.dir, "campaign.json"), meta)
    st = run_state(run)
    log(f"{run.key}: {st['state']}" + (f" ({st['reason']})" if st["reason"] else "") + f", exit status {rc}")
    collect(plan, [run])
    render_tables(plan, run.tables)


def _candidates(plan: Dict, retry_failed: bool) -> List[Run]:
    """The runs to start, in plan order: pending and partial ones, those a post-training step needs
    trained here (:func:`_retrain_for_after`) and, with ``retry_failed``, failed ones (whose
    ``result.json`` is moved aside first)."""
    todo = []
    retrain = {r.dir for r in _retrain_for_after(plan)}
    for run in plan["_runs"]:
        state = run_state(run)
        st = state["state"]
        if st == "failed" and retry_failed:
            tables.retire_failed(run.dir, state.get("result"))
            st = "pending"
        if st in ("pending", "partial") or run.dir in retrain:
            todo.append(run)
    return todo


def _fits(run: Run, a, records, device, jobs, deadline) -> bool:
    """``--minutes``: may the run start now and finish before the deadline?"""
    if deadline is None:
        return True
    est = estimate_minutes(run, records, device, jobs, run.budget, _updates_so_far(run.dir))
    if est is None and a.per_run_minutes:
        est = a.per_run_minutes * (1 - _updates_so_far(run.dir) / max(1, run.target_updates or 1))
    left = (deadline - time.time()) / 60
    if est is None:
        log(f"not starting {run.key}: no throughput measured for this budget on {device} with {jobs} job(s) "
            "(finish one run without --minutes first, or give --per-run-minutes)")
        return False
    if est > left:
        log(f"not starting {run.key}: needs ~{est:.1f} min, {left:.1f} min left of --minutes")
        return False
    log(f"{run.key}: ~{est:.1f} min needed, {left:.1f} min left")
    return True


def run_local(plan: Dict, a) -> int:
    """``mt-campaign run --launcher local``; returns the number of runs started."""
    import torch

    gpu = torch.cuda.is_available()
    jobs = (_gpu_jobs(plan) if gpu else 1) if a.jobs == "auto" else int(a.jobs)
    device = device_name()
    deadline = time.time() + a.minutes * 60 if a.minutes else None
    launcher = LocalLauncher(plan, jobs, a.nice, device)
    records = throughput_records([r.dir for r in plan["_runs"]])
    queue = _candidates(plan, a.retry_failed)
    log(f"{len(queue)} run(s) to do of {len(plan['_runs'])}; {jobs} at once on {device}"
        + (f"; --minutes {a.minutes}" if a.minutes else ""))

    def on_signal(signum, _frame):
        log(f"signal {signum}: stopping {len(launcher.active)} run(s); they resume on the next `mt-campaign run`")
        launcher.stop_all()
        raise SystemExit(128 + signum)

    old = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}
    started = 0
    try:
        while queue or launcher.active:
            # runs of this plan trained by another process on this machine (another campaign,
            # mt-table) take their share of the jobs: one run at a time on a CPU means one
            mine = set(id(r) for r in launcher.active.values())
            busy = sum(1 for r in plan["_runs"] if id(r) not in mine and run_state(r)["state"] == "running")
            while (queue and len(launcher.active) + busy < jobs
                   and (a.max_runs is None or started < a.max_runs)):
                run = queue.pop(0)
                now = run_state(run)["state"]
                if now == "done" and any(r.dir == run.dir for r in _retrain_for_after(plan)):
                    now = "pending"  # its result is only in committed evidence; an after step needs it here
                if now in ("running", "done", "submitted") or (now == "failed" and not a.retry_failed):
                    continue  # another campaign took it meanwhile
                if not _fits(run, a, records, device, jobs, deadline):
                    continue
                launcher.start(run)
                started += 1
            if not launcher.active:
                if busy and queue and (a.max_runs is None or started < a.max_runs):
                    time.sleep(30)  # wait for the other process's run to finish
                    continue
                break
            run, rc = launcher.wait_one()
            _finish(plan, run, rc)
            run_after_steps(plan, a.nice)
            records = throughput_records([r.dir for r in plan["_runs"]])
    finally:
        for s, h in old.items():
            signal.signal(s, h)
    render_verdicts(plan)
    return started


def _slurm_job(argv: List[str]) -> str:
    """The body of one submitit job: one experiment run (in the job's process)."""
    from . import experiment

    res = experiment.run_experiment(argv)
    return res.get("status", "done")


def run_slurm(plan: Dict, a) -> int:
    """``mt-campaign run --launcher slurm``: one submitit job per run; waits for them (unless
    ``--no-wait``), then collects and renders.  Returns the number of jobs submitted."""
    try:
        import submitit
    except ImportError:
        raise SystemExit("--launcher slurm needs submitit: pip install -e '.[cluster]'") from None
    folder = os.path.join(ROOT, "runs", "campaign", "submitit", "%j")
    ex = submitit.AutoExecutor(folder=folder, cluster=a.cluster)
    params = {"timeout_min": a.timeout_min, "cpus_per_task": a.cpus_per_task, "name": "mt-campaign"}
    if a.gpus_per_node:
        params["gpus_per_node"] = a.gpus_per_node
    if a.partition:
        params["slurm_partition"] = a.partition
    ex.update_parameters(**params)
    queue = _candidates(plan, a.retry_failed)
    if a.max_runs is not None:
        queue = queue[:a.max_runs]
    jobs = []
    for run in queue:
        os.makedirs(run.dir, exist_ok=True)
        job = ex.submit(_slurm_job, tables.experiment_argv(run.spec, run.row, run.seed))
        write_json_atomic(os.path.join(run.dir, "campaign.json"),
                          {"launcher": "slurm", "cluster": ex.cluster, "job_id": str(job.job_id), "jobs": 1,
                           "submitted": time.strftime("%Y-%m-%d %H:%M:%S"), "plan": repo_relative(plan["_path"])})
        log(f"submitted {run.key} as job {job.job_id} ({ex.cluster})")
        jobs.append((run, job))
    if a.no_wait:
        return len(jobs)
    for run, job in jobs:
        try:
            job.result()
            rc = 0
        except Exception as err:  # the run's result.json says why; the campaign goes on
            log(f"job {job.job_id} ({run.key}) failed: {type(err).__name__}: {str(err).strip().splitlines()[-1:]}")
            rc = 1
        _finish(plan, run, rc)
    render_verdicts(plan)
    return len(jobs)


# ---------------------------------------------------------------------------------------------
# status

def status(plan: Dict) -> List[Dict]:
    """One dict per run: ``key``, ``state``, ``updates``/``target``, ``eta_min`` (running,
    partial and pending runs, when a throughput is known), ``reason``, ``where``, ``why``."""
    device = device_name()
    records = throughput_records([r.dir for r in plan["_runs"]])
    retrain = {r.dir for r in _retrain_for_after(plan)}
    out = []
    for run in plan["_runs"]:
        st = run_state(run)
        if run.dir in retrain:
            st = dict(st, reason="trains again here: a post-training step (after:) needs its checkpoints")
        meta = _read_json(os.path.join(run.dir, "campaign.json")) or {}
        eta = None
        if st["state"] in ("running", "partial", "pending", "submitted"):
            eta = estimate_minutes(run, records, device, int(meta.get("jobs", 1)), run.budget, st["updates"])
            rate = _own_rate(run.dir) if st["state"] == "running" else None
            if eta is None and rate and run.target_updates:  # no finished run measured yet: its own speed
                eta = (run.target_updates - st["updates"]) * rate / 60.0
        out.append({"key": run.key, "state": st["state"], "updates": st["updates"], "target": run.target_updates,
                    "eta_min": None if eta is None else round(eta, 1), "reason": st["reason"], "where": st["where"],
                    "why": run.why, "dir": repo_relative(run.dir)})
    return out


def _print_status(rows: List[Dict]) -> None:
    counts = {}
    for r in rows:
        counts[r["state"]] = counts.get(r["state"], 0) + 1
    print("  ".join(f"{k}: {v}" for k, v in sorted(counts.items())))
    print(f"{'run':<42} {'state':<10} {'updates':>11} {'ETA':>9}  reason / where")
    for r in rows:
        eta = "" if r["eta_min"] is None else f"{r['eta_min']:.0f} min"
        upd = f"{r['updates']}/{r['target'] or '?'}"
        print(f"{r['key']:<42} {r['state']:<10} {upd:>11} {eta:>9}  {r['reason'] or r['where'] or ''}")


# ---------------------------------------------------------------------------------------------
# command line

def main(argv=None) -> int:
    """``mt-campaign``: see the module docstring.  Exit status 0, or 1 when ``rescore`` finds a
    committed run that does not re-score to its record."""
    p = argparse.ArgumentParser(prog="mt-campaign", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    runp = sub.add_parser("run", help="train the plan's pending runs (resumes partial ones)")
    stp = sub.add_parser("status", help="done / running / partial / pending / failed, with ETA")
    rep = sub.add_parser("render", help="export evidence, re-render the plan's tables and verdicts")
    for q in (runp, stp, rep):
        q.add_argument("--plan", default=DEFAULT_PLAN, help=f"campaign plan YAML (default {DEFAULT_PLAN})")
    stp.add_argument("--json", action="store_true", help="print the status as JSON")
    runp.add_argument("--launcher", choices=("local", "slurm"), default="local")
    runp.add_argument("--jobs", default="auto", help="runs at once (local launcher): an integer or 'auto' "
                                                     "(1 on a CPU; on a GPU from free memory and cores)")
    runp.add_argument("--minutes", type=float, help="start only runs that can finish within M minutes")
    runp.add_argument("--per-run-minutes", type=float,
                      help="estimate for a whole run when no throughput of this budget and device was measured")
    runp.add_argument("--max-runs", type=int, help="start at most K runs")
    runp.add_argument("--nice", type=int, default=10, help="niceness of the runs (local launcher; default 10)")
    runp.add_argument("--retry-failed", action="store_true", help="run failed runs again (their result.json is "
                                                                   "kept as result.failed-<time>.json)")
    runp.add_argument("--dry-run", action="store_true", help="print the runs that would start, start nothing")
    runp.add_argument("--cluster", default=None, help="submitit cluster: slurm (default when sbatch exists) or local")
    runp.add_argument("--partition", help="SLURM partition")
    runp.add_argument("--gpus-per-node", type=int, default=0, help="GPUs per job (slurm)")
    runp.add_argument("--cpus-per-task", type=int, default=8, help="CPU cores per job (slurm)")
    runp.add_argument("--timeout-min", type=int, default=240, help="job time limit in minutes (slurm)")
    runp.add_argument("--no-wait", action="store_true", help="submit and return (slurm); `render` collects later")
    sub.add_parser("rescore", help="re-score every committed run from its hypotheses; exit 1 on a mismatch")
    kit = sub.add_parser("gpu-kit", help="write the folder an offline GPU machine needs (docs/gpu.md)")
    kit.add_argument("--out", default=".device", help="git-ignored folder to write (default .device)")
    kit.add_argument("--plan", action="append", dest="plans", metavar="PLAN",
                     help=f"a plan whose corpora the kit carries; repeat for several (default {DEFAULT_PLAN})")
    a = p.parse_args(argv)

    if a.cmd == "rescore":
        return _rescore_all()
    if a.cmd == "gpu-kit":
        from .gpu_kit import write_kit

        write_kit(a.out, [load_plan(path) for path in (a.plans or [DEFAULT_PLAN])])
        return 0
    if a.cmd == "run":
        if a.jobs != "auto" and (not a.jobs.isdigit() or int(a.jobs) < 1):
            p.error(f"--jobs must be a positive integer or 'auto', got {a.jobs!r}")
        for name in ("minutes", "per_run_minutes"):
            v = getattr(a, name)
            if v is not None and not (math.isfinite(v) and v > 0):
                p.error(f"--{name.replace('_', '-')} must be a positive number of minutes, got {v}")
        if a.max_runs is not None and a.max_runs < 1:
            p.error(f"--max-runs must be at least 1, got {a.max_runs}")
    plan = load_plan(a.plan)
    if a.cmd == "status":
        rows = status(plan)
        if a.json:
            print(json.dumps(rows, indent=1))
        else:
            _print_status(rows)
            for step in plan["_after"]:
                st = after_state(step, plan)
                print(f"{'after ' + step.key:<42} {st['state']:<10} {'':>11} {'':>9}  {st['reason'] or ''}")
        return 0
    if a.cmd == "render":
        render(plan)
        return 0
    if a.dry_run:
        for run in _candidates(plan, False):
            print(f"{run.key}: python -m mt_pipeline.experiment "
                  + " ".join(shlex.quote(repo_relative(x)) for x in tables.experiment_argv(run.spec, run.row, run.seed)))
        for step in plan["_after"]:
            if after_state(step, plan)["state"] != "done":
                for cmd in step.commands:
                    print(f"after {step.key}: " + " ".join(shlex.quote(c) for c in cmd))
        return 0
    collect(plan)  # runs that finished while no campaign watched them
    if a.launcher == "local":
        run_after_steps(plan, a.nice)  # steps whose runs finished while no campaign watched them
    n = run_slurm(plan, a) if a.launcher == "slurm" else run_local(plan, a)
    log(f"started {n} run(s)")
    return 0


def _rescore_all() -> int:
    paths = evidence.committed_results()
    bad = 0
    for path in paths:
        try:
            rows = evidence.rescore(path)
            print(f"ok   {repo_relative(path)}: " + ", ".join(f"{r['subset']} BLEU {r['bleu']:.2f}" for r in rows))
        except evidence.RescoreError as err:
            bad += 1
            print(f"FAIL {err}")
    print(f"{len(paths) - bad} of {len(paths)} committed runs re-score to their recorded BLEU and chrF")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
