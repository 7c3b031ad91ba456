"""Run one translation experiment end to end, resumably, and record its provenance.

prep (``data-prep/<corpus>/prepare.sh``, idempotent) -> ``fairseq-train`` (resumes from
``checkpoint_last.pt``) -> average the last N checkpoints (:mod:`mt_pipeline.averaging`; or
fairseq's ``checkpoint_best.pt``, budget ``average: {checkpoint: best}``) -> ``fairseq-generate``
+ sacreBLEU / chrF / tokenized BLEU on each test set (:mod:`mt_pipeline.evaluate`) ->
``result.json``.

Every stage is skipped when its output is complete, so a killed run continues where it
stopped.  A run directory belongs to one configuration: ``config.json`` holds its fingerprint
(:func:`run_config`: arch, functions, direction, extra flags, resolved budget), and a re-run
with another configuration is refused with the list of differences (``--force-new`` starts
over).  ``result.json`` carries the commands, config, git commit, data, sacreBLEU signature,
hardware, regime, seed, number of updates, wall time (fairseq's cumulative training time, which
survives kills and resumes, plus the runner-timed stages) and the SHA-256 of the evaluated
checkpoint.  Its top-level ``git_commit`` and ``hardware`` are those of the process that wrote it
(after evaluation); ``train_invocations`` records each start or resume of fairseq-train (its
commit, hardware, start time and update count, :func:`record_train_invocation`), with the
uncommitted change of a ``+dirty`` one in ``dirty-<n>.diff``.

Usage (from the repo root; also ``python scripts/experiment.py``)::

    mt-experiment --out runs/demo/rela_g --arch rela_transformer_small --fns rela_g rela_g rela_g \
        [--budget configs/multi30k/small_cpu.yaml] [--src en --tgt de] [--max-update N] [--seed S] \
        [--user-dir DIR]

``--user-dir``: a fairseq user directory of the researcher's own (an attention function
registered outside the plugin, docs/extending.md) that training and evaluation load instead of
the plugin's; every training invocation and ``result.json`` record the SHA-256 of its files
(:func:`fairseq_plugins.user_dir.fingerprint`), which the git commit does not cover.

Raises SystemExit with a message on bad input (unknown arch/function are checked by
fairseq at start-up and listed with their valid choices).
"""

import argparse
import contextlib
import hashlib
import json
import os
import shlex
import shutil
import subprocess
import sys
import time

from fairseq_plugins.user_dir import fingerprint, import_user_dir

from .atomic import atomic_path, remove_leftovers, writable_problem, write_json_atomic
from .budget import (averaging_problem, build_train_cmd, decode_checkpoint, eval_cmd, flags, load_budget, prep_cmd,  # noqa: F401
                     prep_dir, regime, train_env, train_flags)
from .curves import last_valid_metrics, loss_curves
from .locks import dir_lock, inherited_fds
from .provenance import ROOT, code_state, git_commit, hardware, repo_relative


def log(msg):
    print(f"[experiment] {msg}", flush=True)


def run(cmd, logfile=None, env=None):
    """Run ``cmd`` (argument list) from the repository root, holding this process's run-directory
    locks in the child too; with ``logfile`` its output is appended there (progress lines echoed).
    ``env``: the child's environment (default: this process's).

    Raises:
        subprocess.CalledProcessError: the command failed (``returncode < 0``: killed by a signal).
    """
    log("$ " + " ".join(shlex.quote(c) for c in cmd))
    fds = inherited_fds()  # the run-directory lock (run_dir_lock) lives as long as any child
    if logfile is None:
        subprocess.run(cmd, check=True, cwd=ROOT, pass_fds=fds, env=env)
        return
    with open(logfile, "a") as f:
        env = dict(os.environ if env is None else env, PYTHONUNBUFFERED="1")  # progress lines as they happen
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                                pass_fds=fds)
        for line in proc.stdout:
            f.write(line)
            if " | train_inner | " in line or " | valid | " in line or "done training" in line:
                f.flush()  # readers of the log (mt-campaign status) see progress as it happens
                print("   " + line.rstrip()[20:], flush=True)
        if proc.wait() != 0:
            raise subprocess.CalledProcessError(proc.returncode, cmd)


def prepare_data(budget):
    """Run ``data-prep/<corpus>/prepare.sh`` (idempotent) and return the prep dir holding
    ``bin/``, ``raw/`` and ``tok/``: ``<data.out>[/<data.variant>]``."""
    run(prep_cmd(budget))
    return prep_dir(budget)


@contextlib.contextmanager
def run_dir_lock(out):
    """Hold ``<out>/.lock`` (``flock``) for the block, so that two runners never share a run
    directory (two fairseq-train on one save dir would corrupt it).  The children that
    :func:`run` starts inherit the lock's file descriptor, so a fairseq-train that outlives a
    killed runner (TERM or KILL) still holds it and a re-run is refused until it has ended.

    Raises:
        SystemExit: another process holds the lock (the message names the directory).
    """
    with dir_lock(out, inherit=True,
                  busy_message=f"another mt-experiment, or a fairseq-train/evaluation it started, is running in {out} "
                               f"(it holds {out}/.lock; `fuser {out}/.lock` names it); wait for it to finish or "
                               "stop it first"):
        yield


def target_updates(train_cmd):
    """The ``--max-update`` of a fairseq-train command (the last one wins, as in argparse);
    None when there is none (or it is 0: no limit)."""
    value = None
    for i, word in enumerate(train_cmd):
        if word == "--max-update" and i + 1 < len(train_cmd):
            value = int(train_cmd[i + 1])
        elif word.startswith("--max-update="):
            value = int(word.split("=", 1)[1])
    return value or None


def checkpoint_updates(ckpt_dir):
    """Number of updates of ``<ckpt_dir>/checkpoint_last.pt``; None when there is none."""
    last = os.path.join(ckpt_dir, "checkpoint_last.pt")
    if not os.path.exists(last):
        return None
    from fairseq_plugins.checkpoint import load_checkpoint

    return int(load_checkpoint(last)["optimizer_history"][-1]["num_updates"])


def training_finished(ckpt_dir, max_update, updates=None):
    """Number of updates of ``checkpoint_last.pt`` if it has reached ``max_update``, else None
    (``updates``: that number when the caller has read it already, :func:`checkpoint_updates`).

    fairseq-train restarted on a finished run does not exit at once: it runs one more update
    (update ``max_update + 1``) before its stop check, and saves it -- which would change a
    finished model and invalidate its average and scores.  The runner skips training instead.
    """
    if max_update is None:
        return None
    updates = checkpoint_updates(ckpt_dir) if updates is None else updates
    return updates if updates is not None and updates >= max_update else None


#: per-invocation diff of a ``+dirty`` tree: ``dirty-<n>.diff`` (n: the 1-based training invocation)
DIRTY_DIFF = "dirty-{n}.diff"


#: fairseq-train flags that split a paper-scale budget's ``batch`` over the GPUs (``reproduce --gpus``)
BATCH_SPLIT = ("max-tokens", "batch-size", "update-freq", "distributed-world-size")


def record_train_invocation(out, state, updates_at_start, train_cfg=None, user_dir=None):
    """Append one training invocation (a start or resume of fairseq-train in run directory ``out``)
    to ``state["train_invocations"]`` and return it: the code (``git_commit``, ``+dirty`` when
    uncommitted changes were in it), ``hardware``, ``started`` and ``updates_at_start`` (0 on a fresh
    start).  With a ``+dirty`` tree the change itself is written to ``<out>/dirty-<n>.diff``
    (:func:`mt_pipeline.provenance.code_state`: ``git diff HEAD`` of the code paths, after a header
    listing the untracked files there with their SHA-256; ``git apply`` takes it as it is) and the
    record's ``diff`` names it (repo-relative).  The caller writes ``state.json`` and, when the
    invocation ends, adds ``ended``, ``outcome`` (``done``, ``failed (exit N)``, ``killed (signal
    N)``; absent when the runner itself was killed), ``wall_s`` and, when done, ``updates_at_end``.
    ``batch``: the flags of ``train_cfg`` that split the batch (:data:`BATCH_SPLIT`), when it sets
    any -- a paper-scale run may resume on another number of GPUs (:func:`run_config`).  ``user_dir``:
    the ``--user-dir`` of a researcher's own it trains with; its ``user_dir`` record is
    :func:`fairseq_plugins.user_dir.fingerprint` (the SHA-256 of each file, at this start)."""
    code = code_state()
    invs = state.setdefault("train_invocations", [])
    inv = {"n": len(invs) + 1, "git_commit": code["git_commit"], "hardware": hardware(),
           "started": time.strftime("%Y-%m-%d %H:%M:%S"), "updates_at_start": updates_at_start or 0}
    split = {k: (train_cfg or {})[k] for k in BATCH_SPLIT if k in (train_cfg or {})}
    if split:
        inv["batch"] = split
    if user_dir:
        inv["user_dir"] = fingerprint(user_dir)
    if "diff" in code:
        path = os.path.join(out, DIRTY_DIFF.format(n=inv["n"]))
        head = [f"# training invocation {inv['n']} of {repo_relative(out)}, {inv['started']}: the uncommitted change "
                f"of {code['git_commit']}",
                f"# (`git diff HEAD --binary` of the code paths; `git apply` this file at {code['git_commit'][:40]})",
                f"# untracked files under the code paths (not in the diff): {len(code['untracked'])}"]
        head += [f"#   {name}  sha256 {sha}" for name, sha in code["untracked"]]
        with atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8") as f:
            f.write("\n".join(head) + "\n" + code["diff"])
        inv["diff"] = repo_relative(path)
        inv["untracked"] = code["untracked"]
    elif "diff_error" in code:
        inv["diff_error"] = code["diff_error"]
    invs.append(inv)
    return inv


#: files of a run directory that ``--force-new`` removes (everything a run writes)
RUN_OUTPUTS = ("checkpoints", "eval", "result.json", "state.json", "train.log", "config.json", "tensorboard")
#: name prefixes of further run outputs that ``--force-new`` removes
RUN_OUTPUT_PREFIXES = ("average_last", "analysis_", "dirty-")


def run_config(a, budget, train_cfg):
    """The run's full configuration: everything that decides what is trained and scored
    (architecture, attention functions, direction, extra flags, the resolved budget and the
    effective ``train`` flags).  Paths and the code version are not part of it, nor -- for a
    budget with a ``batch`` section (paper scale) -- how its tokens per update are split over the
    GPUs (:data:`BATCH_SPLIT`, which ``reproduce --gpus`` derives from ``batch``): a run pre-empted
    on 8 GPUs resumes on 4 with the same batch per update (each invocation records its split).
    A ``--user-dir`` of the researcher's own adds its name (``user_dir``; its files' hashes are
    recorded per invocation, as the git commit is): a run without one has the key not at all, so
    its fingerprint is that of the runs before the option existed."""
    if budget.get("batch"):
        budget = dict(budget, train={k: v for k, v in budget["train"].items() if k not in BATCH_SPLIT})
        train_cfg = {k: v for k, v in train_cfg.items() if k not in BATCH_SPLIT}
    cfg = {"arch": a.arch, "fns": list(a.fns) if a.fns else None, "src": a.src, "tgt": a.tgt,
           "extra": shlex.split(a.extra or ""), "ribes": bool(a.ribes), "budget": budget, "train": train_cfg}
    if getattr(a, "user_dir", None):
        cfg["user_dir"] = os.path.basename(os.path.abspath(a.user_dir))
    return cfg


def config_hash(cfg):
    """SHA-256 of the canonical JSON of a :func:`run_config` dict."""
    return hashlib.sha256(json.dumps(cfg, sort_keys=True, default=str).encode()).hexdigest()


def _differences(old, new, prefix=""):
    """``["key.path: old -> new", ...]`` between two nested dicts."""
    out = []
    for k in sorted(set(old) | set(new), key=str):
        o, n = old.get(k, "<absent>"), new.get(k, "<absent>")
        if isinstance(o, dict) and isinstance(n, dict):
            out += _differences(o, n, f"{prefix}{k}.")
        elif o != n:
            out.append(f"{prefix}{k}: {o!r} -> {n!r}")
    return out


def check_config(out, cfg, force_new=False):
    """Make ``<out>/config.json`` hold ``cfg``: written on a new run; on an existing run the same
    configuration continues, a changed one is refused (or, with ``force_new``, every output of
    the old run is removed first).  A run directory from before fingerprints (outputs but no
    ``config.json``) is refused too: its configuration cannot be checked.

    Raises:
        SystemExit: the configuration changed; the message lists the differences and the way out.
    """
    path = os.path.join(out, "config.json")
    had_outputs = any(os.path.exists(os.path.join(out, n)) for n in RUN_OUTPUTS if n != "config.json")
    if force_new:
        for name in RUN_OUTPUTS + tuple(n for n in os.listdir(out) if n.startswith(RUN_OUTPUT_PREFIXES)):
            p = os.path.join(out, name)
            if os.path.isdir(p):
                shutil.rmtree(p)
            elif os.path.exists(p):
                os.unlink(p)
        log(f"--force-new: removed the outputs of the earlier run in {out}")
    elif os.path.exists(path):
        with open(path) as f:
            old = json.load(f)
        if old.get("sha256") != config_hash(cfg):
            diff = _differences(old.get("config", {}), cfg)
            raise SystemExit(f"{out} holds a run with another configuration; refusing to reuse its checkpoints "
                             f"and scores. Differences (earlier -> now):\n  " + "\n  ".join(diff or ["(unknown)"])
                             + f"\nUse another --out, or --force-new to delete the earlier run and start over.")
        return
    elif had_outputs:
        raise SystemExit(f"{out} holds outputs of a run without a configuration record (config.json), so it "
                         "cannot be checked against this one; use another --out, or --force-new to start over")
    write_json_atomic(path, {"sha256": config_hash(cfg), "config": cfg})


def _int_at_least(low):
    """An argparse type: an integer >= ``low`` (the error names the bound and the value)."""
    def parse(text):
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be an integer >= {low}, got {text!r}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"must be an integer >= {low}, got {text!r}")
        return value
    return parse


def main(argv=None) -> int:
    """Command line of one experiment (``mt-experiment``); exit status 0 (errors raise SystemExit)."""
    run_experiment(argv)
    return 0


def run_experiment(argv=None):
    """Parse ``argv`` (the :func:`main` flags), run every stage and return the ``result.json`` dict."""
    p = argparse.ArgumentParser(prog="mt-experiment", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="run directory (checkpoints, logs, config.json, result.json)")
    p.add_argument("--arch", required=True)
    p.add_argument("--fns", nargs=3, metavar=("ENC", "DEC", "CROSS"),
                   help="attention functions for encoder self / decoder self / cross attention")
    p.add_argument("--budget", default=os.path.join(ROOT, "configs", "multi30k", "small_cpu.yaml"))
    p.add_argument("--src", default="en", help="source language (a language of the budget's corpus)")
    p.add_argument("--tgt", default="de", help="target language")
    p.add_argument("--max-update", type=_int_at_least(1), help="override the budget's max-update (>= 1)")
    p.add_argument("--seed", type=_int_at_least(0), help="override the budget's seed (>= 0)")
    p.add_argument("--tensorboard", action="store_true", default=os.environ.get("MT_TENSORBOARD") == "1",
                   help="TensorBoard event files in <out>/tensorboard (fairseq's --tensorboard-logdir; needs "
                        "`pip install -e .[tensorboard]`); default on when MT_TENSORBOARD=1, which reaches the runs "
                        "of mt-table, reproduce and mt-campaign too.  Not part of the run's configuration: a run "
                        "resumes with or without it")
    p.add_argument("--name", default=None, help="label stored in result.json")
    p.add_argument("--extra", default="", help="extra fairseq-train flags (quoted)")
    p.add_argument("--ribes", action="store_true",
                   help="also score RIBES (mt-score --ribes; the En-Ja tables report it)")
    p.add_argument("--force-new", action="store_true",
                   help="delete the outputs of an earlier run in --out (another configuration) and start over")
    p.add_argument("--user-dir", metavar="DIR",
                   help="a fairseq --user-dir of your own that imports fairseq_plugins (an attention function "
                        "registered outside the plugin, docs/extending.md): training and evaluation load it instead "
                        "of the plugin's; the SHA-256 of its files is recorded with each training invocation and in "
                        "result.json")
    a = p.parse_args(argv)
    if a.src == a.tgt:
        p.error("--src and --tgt must differ (e.g. --src en --tgt de)")
    try:
        import_user_dir(a.user_dir)  # its functions join the registry the --fns check reads
    except FileNotFoundError as e:  # not a directory
        p.error(str(e))
    if a.fns:
        from fairseq_plugins.attention import attention_fn_names

        unknown = [f for f in a.fns if f not in attention_fn_names()]
        if unknown:  # else fairseq-train fails at start-up and the run would be recorded as a failed training
            p.error(f"--fns: unknown attention function(s) {', '.join(unknown)}; valid: {', '.join(attention_fn_names())}")
    budget = load_budget(a.budget)
    import torch

    train_cfg = train_flags(budget, torch.cuda.is_available(), a.max_update)
    if a.seed is not None:
        train_cfg["seed"] = a.seed
    problem = averaging_problem(budget, train_cfg)  # else it fails after training, at the averaging
    if problem:
        raise SystemExit(f"mt-experiment: --budget {a.budget}: {problem}")
    problem = writable_problem(a.out)
    if problem:
        p.error(f"--out {a.out}: {problem}")
    os.makedirs(a.out, exist_ok=True)
    out = os.path.abspath(a.out)
    with run_dir_lock(out):
        # temp files of a run killed while writing them (never read: a stage is redone instead)
        for d in (out, os.path.join(out, "eval")):
            for path in remove_leftovers(d):
                log(f"removed {path}, left by a killed run")
        check_config(out, run_config(a, budget, train_cfg), a.force_new)
        return run_stages(a, argv, budget, train_cfg, out)


def _failed_result(a, out, train_cmd, state):
    """The ``result.json`` of a run whose training stopped with an error (e.g. fairseq's
    FloatingPointError on a diverged run), with its loss curve."""
    curve, valid = loss_curves(os.path.join(out, "train.log"))
    with open(os.path.join(out, "train.log"), errors="replace") as f:
        tail = f.read().splitlines()[-5:]
    return {"name": a.name or os.path.basename(out), "status": "failed", "error_tail": tail,
            "arch": a.arch, "attention_fns": a.fns, "commands": {"train": " ".join(train_cmd)},
            "git_commit": git_commit(), "hardware": hardware(),
            "train_invocations": state.get("train_invocations", []), "loss_curve": curve, "valid_loss": valid,
            "updates": curve[-1][0] if curve else 0, "wall_s": state["wall_s"], "scores": {},
            "time": time.strftime("%Y-%m-%d %H:%M:%S"),
            **({"user_dir": fingerprint(a.user_dir)} if a.user_dir else {})}


def run_stages(a, argv, budget, train_cfg, out):
    """The stages of :func:`main` (called with the run directory ``out`` locked)."""
    from fairseq_plugins.checkpoint import load_checkpoint, repair_last_checkpoint

    from .evaluate import checkpoint_sha256, done_subsets

    state_path = os.path.join(out, "state.json")
    state = json.load(open(state_path)) if os.path.exists(state_path) else {"wall_s": {}}
    # the code of every invocation (a run resumed after a code change was trained by both)
    state.setdefault("invocations", []).append({"git_commit": git_commit(),
                                                "started": time.strftime("%Y-%m-%d %H:%M:%S")})
    write_json_atomic(state_path, state)

    prep = prepare_data(budget)
    data_bin = os.path.join(prep, "bin")
    ckpt_dir = os.path.join(out, "checkpoints")
    import torch

    train_cmd = build_train_cmd(data_bin, ckpt_dir, a.arch, a.src, a.tgt, train_cfg, a.fns, a.extra,
                                cpu=not torch.cuda.is_available(), user_dir=a.user_dir)
    if a.tensorboard and "--tensorboard-logdir" not in train_cmd:  # one directory per run, outside its fingerprint
        train_cmd += ["--tensorboard-logdir", os.path.join(out, "tensorboard")]

    # 1. train (fairseq resumes from checkpoint_last.pt; a finished training is skipped, see
    # training_finished).  A kill while fairseq copied checkpoint_last.pt into place leaves it
    # torn: restore it first.
    repair_last_checkpoint(ckpt_dir)
    start_updates = checkpoint_updates(ckpt_dir)
    finished = training_finished(ckpt_dir, target_updates(train_cmd), start_updates)
    inv = None
    if finished is None:  # this invocation's code, machine and starting point, before fairseq-train runs
        inv = record_train_invocation(out, state, start_updates, train_cfg, user_dir=a.user_dir)
        write_json_atomic(state_path, state)
    t0 = time.time()

    def end_invocation(outcome, **extra):
        if inv is not None:
            inv.update(ended=time.strftime("%Y-%m-%d %H:%M:%S"), outcome=outcome, wall_s=time.time() - t0, **extra)
            write_json_atomic(state_path, state)

    try:
        if finished is None:
            run(train_cmd, logfile=os.path.join(out, "train.log"), env=train_env(train_cfg))
        else:
            log(f"train: done (checkpoint_last.pt at {finished} updates), skipping")
    except subprocess.CalledProcessError as err:
        end_invocation(f"killed (signal {-err.returncode})" if err.returncode < 0 else f"failed (exit {err.returncode})")
        if err.returncode < 0:  # killed (OOM killer, pre-emption, Ctrl-C): not a training failure
            log(f"fairseq-train was killed by signal {-err.returncode}; nothing recorded as failed: "
                "re-run the same command to resume from checkpoint_last.pt")
            raise
        write_json_atomic(os.path.join(out, "result.json"), _failed_result(a, out, train_cmd, state))
        log(f"training failed; see {os.path.join(out, 'train.log')}")
        raise
    state["wall_s"]["train"] = state["wall_s"].get("train", 0.0) + time.time() - t0
    last = load_checkpoint(os.path.join(ckpt_dir, "checkpoint_last.pt"))
    updates = int(last["optimizer_history"][-1]["num_updates"])
    end_invocation("done", updates_at_end=updates)
    write_json_atomic(state_path, state)
    # fairseq's own cumulative training time, which survives kills and resumes
    state["wall_s"]["train_fairseq_cumulative"] = float(last["extra_state"].get("previous_training_time", 0.0))
    curve, valid = loss_curves(os.path.join(out, "train.log"))

    # 2. average the last N checkpoints (or take fairseq's checkpoint_best.pt)
    avg, avg_cmd = decode_checkpoint(budget, out)
    if avg_cmd and (not os.path.exists(avg)
                    or os.path.getmtime(avg) < os.path.getmtime(os.path.join(ckpt_dir, "checkpoint_last.pt"))):
        t0 = time.time()
        run(avg_cmd)
        state["wall_s"]["average"] = time.time() - t0

    # 3. generate + score each test set; a subset counts as done only when its S.json was
    # written for this very checkpoint (SHA-256), so scores of two models never mix
    gen = budget["generate"]
    eval_dir = os.path.join(out, "eval")
    subsets = budget["data"]["subsets"]
    sha = checkpoint_sha256(avg)
    done = done_subsets(eval_dir, sha, subsets, ribes=a.ribes)
    missing = [s for s in subsets if s not in done]
    if missing:
        t0 = time.time()
        run(eval_cmd(gen, avg, data_bin, prep, a.src, a.tgt, missing, eval_dir, ribes=a.ribes, user_dir=a.user_dir))
        state["wall_s"]["evaluate"] = time.time() - t0
    scores = {}
    for s in subsets:
        with open(os.path.join(eval_dir, f"{s}.json")) as f:
            scores[s] = json.load(f)
        if scores[s].get("checkpoint_sha256") != sha:
            raise SystemExit(f"{eval_dir}/{s}.json was not written for {avg}; re-run to re-evaluate")

    result = {
        "name": a.name or os.path.basename(out),
        "arch": a.arch,
        "attention_fns": dict(zip(["encoder", "decoder", "cross"], a.fns)) if a.fns else "arch default",
        "direction": f"{a.src}-{a.tgt}",
        "commands": {"train": " ".join(shlex.quote(c) for c in train_cmd),
                     "reproduce": " ".join(shlex.quote(c) for c in ["mt-experiment"] + list(argv or sys.argv[1:]))},
        "config": {"budget_file": os.path.relpath(a.budget, ROOT), "budget": budget, "train": train_cfg,
                   "sha256": config_hash(run_config(a, budget, train_cfg))},
        "regime": regime(budget),
        "seed": train_cfg.get("seed"),
        # the code that wrote this record (averaging, evaluation, scoring), not necessarily the code that
        # trained: that is train_invocations[*].git_commit (one entry per start/resume of fairseq-train)
        "git_commit": git_commit(),
        "git_commits_invoked": sorted({inv["git_commit"] for inv in state.get("invocations", [])}),
        "train_invocations": state.get("train_invocations", []),
        "decoded_checkpoint": os.path.relpath(avg, out),
        "decoded_checkpoint_sha256": sha,
        "data": {"corpus": budget["data"]["corpus"], "prep_dir": os.path.relpath(prep, ROOT),
                 "prep_stamp": open(os.path.join(prep, "bin", ".done")).read().strip()
                 if os.path.exists(os.path.join(prep, "bin", ".done")) else None},
        "hardware": hardware(),  # the machine that wrote this record; per training invocation: train_invocations
        "updates": updates,
        "wall_s": state["wall_s"],
        "loss_curve": curve,
        "valid_loss": valid,
        "valid_last": last_valid_metrics(os.path.join(out, "train.log")),
        "scores": scores,
        "status": "done",
        "time": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
    if a.user_dir:  # the user code that evaluated (each training invocation has its own record)
        result["user_dir"] = fingerprint(a.user_dir)
    write_json_atomic(os.path.join(out, "result.json"), result)
    for s in subsets:
        log(f"{result['name']} {s}: SacreBLEU {scores[s]['bleu']:.2f}, chrF {scores[s]['chrf']:.2f} "
            f"(tokenized BLEU {scores[s].get('tok_bleu')}) {scores[s]['signature']}")
    return result


if __name__ == "__main__":
    main()
