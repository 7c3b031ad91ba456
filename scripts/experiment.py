#!/usr/bin/env python
"""Run one translation experiment end to end, resumably, and record its provenance.

prep (data-prep/<corpus>/prepare.sh, idempotent) -> fairseq-train (resumes from
checkpoint_last.pt) -> average the last N checkpoints (scripts/average_checkpoints.py; or
fairseq's checkpoint_best.pt, budget ``average: {checkpoint: best}``) ->
fairseq-generate + sacrebleu on each test set (scripts/evaluate.sh) -> ``result.json``.

Every stage is skipped when its output is complete, so a killed run continues where it
stopped.  ``result.json`` carries: commands, config, git commit, data, sacrebleu signature,
hardware, number of updates and wall time (fairseq's cumulative training time, which survives
kills and resumes, plus the runner-timed stages).

Usage (from the repo root):
    python scripts/experiment.py --out runs/demo/rela_g --arch rela_transformer_small \
        --fns rela_g rela_g rela_g [--budget configs/multi30k/small_cpu.yaml] [--src en --tgt de]
        [--max-update N]

Raises SystemExit with a message on bad input (unknown arch/function are checked by
fairseq at start-up and listed with their valid choices).
"""

import argparse
import contextlib
import fcntl
import json
import os
import re
import shlex
import subprocess
import sys
import time

import yaml

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(1, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # this checkout's fairseq_plugins
from mt_pipeline.atomic import atomic_path, remove_leftovers  # noqa: E402
from mt_pipeline.provenance import git_commit, hardware  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.path.dirname(sys.executable)


def log(msg):
    print(f"[experiment] {msg}", flush=True)


def flags(mapping):
    """YAML mapping -> fairseq CLI flags (``true`` = bare flag, ``false``/None = omitted)."""
    out = []
    for k, v in mapping.items():
        if v is True:
            out.append(f"--{k}")
        elif v is False or v is None:
            continue
        else:
            out += [f"--{k}", str(v)]
    return out


def write_json(path, obj):
    """Write ``obj`` as JSON to ``path`` atomically."""
    with atomic_path(path) as tmp, open(tmp, "w") as f:
        json.dump(obj, f, indent=2, sort_keys=True)


def run(cmd, logfile=None):
    log("$ " + " ".join(shlex.quote(c) for c in cmd))
    if logfile is None:
        subprocess.run(cmd, check=True, cwd=ROOT)
        return
    with open(logfile, "a") as f:
        env = dict(os.environ, PYTHONUNBUFFERED="1")  # progress lines as they happen
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
        for line in proc.stdout:
            f.write(line)
            if " | train_inner | " in line or " | valid | " in line or "done training" in line:
                print("   " + line.rstrip()[20:], flush=True)
        if proc.wait() != 0:
            raise subprocess.CalledProcessError(proc.returncode, cmd)


def _json_stats(line, tag):
    """The stats dict of a fairseq ``--log-format json`` line of progress ``tag`` (``train_inner``,
    ``valid``), keys without their ``valid_`` prefix, values as floats where numeric; else None."""
    marker = f"| {tag} | "
    i = line.find(marker)
    if i < 0 or "{" not in line[i:]:
        return None
    try:
        stats = json.loads(line[line.index("{", i):])
    except ValueError:
        return None
    out = {}
    for k, v in stats.items():
        k = k[len(tag) + 1:] if k.startswith(tag + "_") else k
        try:
            out[k] = float(v)
        except (TypeError, ValueError):
            out[k] = v
    return out


def loss_curve(train_log):
    """(updates, train loss) pairs and valid losses parsed from a fairseq log, in the simple
    or the json ``--log-format``."""
    curve, valid = [], []
    if not os.path.exists(train_log):
        return curve, valid
    for line in open(train_log):
        st = _json_stats(line, "train_inner")
        if st is not None and "loss" in st:
            curve.append((int(st["num_updates"]), st["loss"]))
            continue
        st = _json_stats(line, "valid")
        if st is not None and "loss" in st:
            valid.append((int(st["num_updates"]), st["loss"]))
            continue
        m = re.search(r"\| train_inner \|.*?loss=([\d.naif]+).*?num_updates=(\d+)", line)
        if m:
            curve.append((int(m.group(2)), float(m.group(1))))
        m = re.search(r"\| valid \|.*?\| loss ([\d.naif]+) .*?\| num_updates (\d+)", line)
        if m:
            valid.append((int(m.group(2)), float(m.group(1))))
    return curve, valid


def _merge(base, over):
    """Deep-merge two YAML mappings (``over`` wins; nested mappings are merged key by key)."""
    out = dict(base)
    for k, v in over.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def load_budget(path):
    """Read a budget YAML; a top-level ``base: other.yaml`` (relative to the repo root) is loaded
    first and overridden key by key, so variants state only what differs.

    Raises:
        SystemExit: the file (or a base) does not exist, or bases form a cycle.
    """
    seen = []
    chain = []
    while path:
        path = path if os.path.isabs(path) else os.path.join(ROOT, path)
        if path in seen:
            raise SystemExit(f"budget bases form a cycle: {seen + [path]}")
        if not os.path.exists(path):
            raise SystemExit(f"budget config not found: {path}")
        seen.append(path)
        cfg = yaml.safe_load(open(path)) or {}
        chain.append(cfg)
        path = cfg.get("base")
    budget = {}
    for cfg in reversed(chain):
        budget = _merge(budget, {k: v for k, v in cfg.items() if k != "base"})
    return budget


def last_valid_metrics(train_log):
    """``{metric: value}`` of the last ``| valid |`` line of a fairseq simple-format log
    (e.g. ``loss``, ``nll_loss``, ``attn_entropy``); empty if there is none."""
    last = None
    if os.path.exists(train_log):
        for line in open(train_log):
            if " | valid | " in line:
                last = line
    if last is None:
        return {}
    st = _json_stats(last, "valid")
    if st is not None:
        return {k: v for k, v in st.items() if isinstance(v, float)}
    out = {}
    for m in re.finditer(r"\| ([a-z_0-9]+) (-?[\d.]+(?:e-?\d+)?|nan|inf)\b", last):
        out[m.group(1)] = float(m.group(2))
    return out


def prepare_data(budget):
    """Run ``data-prep/<corpus>/prepare.sh`` (idempotent) and return the prep dir holding
    ``bin/``, ``raw/`` and ``tok/``: ``<data.out>[/<data.variant>]``."""
    run(prep_cmd(budget))
    return prep_dir(budget)


def build_train_cmd(data_bin, ckpt_dir, arch, src, tgt, train_cfg, fns=None, extra="", cpu=False):
    """The fairseq-train command line (list of words) of one run: the budget's ``train`` flags,
    the attention functions ``fns`` (encoder self, decoder self, cross) when given, ``extra``
    flags (a shell-quoted string) and ``--cpu`` when ``cpu``."""
    cmd = [os.path.join(BIN, "fairseq-train"), data_bin, "--user-dir", os.path.join(ROOT, "fairseq_plugins"),
           "--arch", arch, "--source-lang", src, "--target-lang", tgt, "--save-dir", ckpt_dir, *flags(train_cfg)]
    if fns:
        cmd += ["--encoder-attention-fn", fns[0], "--decoder-attention-fn", fns[1], "--cross-attention-fn", fns[2]]
    if cpu:
        cmd.append("--cpu")
    return cmd + shlex.split(extra or "")


def eval_cmd(gen, checkpoint, data_bin, prep, src, tgt, subsets, eval_dir, ribes=False):
    """The scripts/evaluate.sh command (generate + sacreBLEU + tokenized BLEU, + RIBES when
    ``ribes``) for the budget's ``generate`` section ``gen`` on ``subsets``."""
    return (["bash", os.path.join(ROOT, "scripts", "evaluate.sh"), "--checkpoint", checkpoint, "--data-bin", data_bin,
             "--prep-dir", prep, "--src", src, "--tgt", tgt, "--subsets", ",".join(subsets),
             "--beam", str(gen["beam"]), "--lenpen", str(gen["lenpen"]), "--batch-size", str(gen["batch-size"]),
             "--out", eval_dir] + (["--extra", " ".join(flags(gen["extra"]))] if gen.get("extra") else [])
            + (["--ribes"] if ribes else []))


def average_cmd(ckpt_dir, n_avg, output, kind="update"):
    """The checkpoint-averaging command (last ``n_avg`` ``kind`` = update or epoch checkpoints
    of ``ckpt_dir``)."""
    return [sys.executable, os.path.join(ROOT, "scripts", "average_checkpoints.py"), "--inputs", ckpt_dir,
            f"--num-{kind}-checkpoints", str(n_avg), "--output", output]


def decode_checkpoint(budget, run_dir):
    """``(checkpoint, command)``: the checkpoint a run is evaluated with and the command that
    makes it (``None`` when fairseq writes it itself), from the budget's ``average`` section:

    - ``num-update-checkpoints: N`` -> ``<run_dir>/average_lastN.pt``, the average of the last N
      update checkpoints (:func:`average_cmd`);
    - ``checkpoint: best`` -> ``<run_dir>/checkpoints/checkpoint_best.pt``, fairseq's best on the
      validation set by ``--best-checkpoint-metric`` (default: loss), no averaging (E-ATT App. B:
      "we choose the best model over dev set").

    Raises:
        SystemExit: an ``average`` section with neither key (the message names both).
    """
    avg = budget.get("average") or {}
    if avg.get("checkpoint") == "best":
        return os.path.join(run_dir, "checkpoints", "checkpoint_best.pt"), None
    if avg.get("num-update-checkpoints"):
        n = int(avg["num-update-checkpoints"])
        out = os.path.join(run_dir, f"average_last{n}.pt")
        return out, average_cmd(os.path.join(run_dir, "checkpoints"), n, out)
    if avg.get("num-epoch-checkpoints"):
        n = int(avg["num-epoch-checkpoints"])
        out = os.path.join(run_dir, f"average_last{n}_epochs.pt")
        return out, average_cmd(os.path.join(run_dir, "checkpoints"), n, out, kind="epoch")
    raise SystemExit(f"budget `average` section {avg!r}: give `num-update-checkpoints: N` (average the last N "
                     "update checkpoints), `num-epoch-checkpoints: N` (the last N epoch checkpoints) or "
                     "`checkpoint: best` (fairseq's checkpoint_best.pt)")


def prep_dir(budget):
    """The prep dir ``prepare_data`` fills for ``budget`` (without running anything)."""
    data = budget["data"]
    out = os.path.join(ROOT, data.get("out", os.path.join("data-bin", f"{data['corpus']}_en_de")))
    return os.path.join(out, data["variant"]) if data.get("variant") else out


def prep_cmd(budget):
    """The data-prep command (list of words) ``prepare_data`` runs for ``budget``."""
    data = budget["data"]
    out = os.path.join(ROOT, data.get("out", os.path.join("data-bin", f"{data['corpus']}_en_de")))
    cmd = ["bash", os.path.join(ROOT, "data-prep", data["corpus"], "prepare.sh"), "--out", out]
    if data.get("bpe-merges"):
        cmd += ["--bpe-merges", str(data["bpe-merges"])]
    if data.get("train-lines"):
        cmd += ["--train-lines", str(data["train-lines"])]
    if data.get("variant") and os.path.exists(os.path.join(ROOT, "data-prep", data["corpus"], "corpus.yaml")):
        # a corpus.yaml variant (mt-prep --variant) is the prep_dir above, <out>/<variant>/: a recipe
        # variant (e.g. wmt14_en_de's `eatt`, truecased) writes it; the long-document preps build
        # every length in one run and check that L<L> is one of them
        cmd += ["--variant", data["variant"]]
    return cmd + flags(data.get("prep-flags") or {})


@contextlib.contextmanager
def run_dir_lock(out):
    """Hold ``<out>/.lock`` (``flock``) for the block, so that two runners never share a run
    directory (two fairseq-train on one save dir would corrupt it).

    Raises:
        SystemExit: another process holds the lock (the message names the directory).
    """
    f = open(os.path.join(out, ".lock"), "a")
    try:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise SystemExit(f"another experiment.py is running in {out} (it holds {out}/.lock); "
                             "wait for it to finish or stop it first") from None
        yield
    finally:
        f.close()  # releases the lock


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


def training_finished(ckpt_dir, max_update):
    """Number of updates of ``checkpoint_last.pt`` if it has reached ``max_update``, else None.

    fairseq-train restarted on a finished run does not exit at once: it runs one more update
    (update ``max_update + 1``) before its stop check, and saves it -- which would change a
    finished model and invalidate its average and scores.  The runner skips training instead.
    """
    last = os.path.join(ckpt_dir, "checkpoint_last.pt")
    if max_update is None or not os.path.exists(last):
        return None
    from fairseq_plugins.checkpoint import load_checkpoint

    updates = int(load_checkpoint(last)["optimizer_history"][-1]["num_updates"])
    return updates if updates >= max_update else None


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="run directory (checkpoints, logs, result.json)")
    p.add_argument("--arch", required=True)
    p.add_argument("--fns", nargs=3, metavar=("ENC", "DEC", "CROSS"),
                   help="attention functions for encoder self / decoder self / cross attention")
    p.add_argument("--budget", default=os.path.join(ROOT, "configs", "multi30k", "small_cpu.yaml"))
    p.add_argument("--src", default="en", help="source language (a language of the budget's corpus)")
    p.add_argument("--tgt", default="de", help="target language")
    p.add_argument("--max-update", type=int, help="override the budget's max-update")
    p.add_argument("--name", default=None, help="label stored in result.json")
    p.add_argument("--extra", default="", help="extra fairseq-train flags (quoted)")
    p.add_argument("--ribes", action="store_true",
                   help="also score RIBES (scripts/score.py --ribes; the En-Ja tables report it)")
    a = p.parse_args(argv)
    if a.src == a.tgt:
        p.error("--src and --tgt must differ (e.g. --src en --tgt de)")
    budget = load_budget(a.budget)
    train_cfg = dict(budget["train"])
    import torch

    if torch.cuda.is_available():  # e.g. bf16: the budget's GPU-only flags
        train_cfg.update(budget.get("train-gpu") or {})
    if a.max_update:
        train_cfg["max-update"] = a.max_update
    os.makedirs(a.out, exist_ok=True)
    out = os.path.abspath(a.out)
    with run_dir_lock(out):
        # temp files of a run killed while writing them (never read: a stage is redone instead)
        for d in (out, os.path.join(out, "eval")):
            for path in remove_leftovers(d):
                log(f"removed {path}, left by a killed run")
        return run_stages(a, argv, budget, train_cfg, out)


def run_stages(a, argv, budget, train_cfg, out):
    """The stages of :func:`main` (called with the run directory ``out`` locked)."""
    state_path = os.path.join(out, "state.json")
    state = json.load(open(state_path)) if os.path.exists(state_path) else {"wall_s": {}}

    prep = prepare_data(budget)
    data_bin = os.path.join(prep, "bin")
    ckpt_dir = os.path.join(out, "checkpoints")
    import torch

    train_cmd = build_train_cmd(data_bin, ckpt_dir, a.arch, a.src, a.tgt, train_cfg, a.fns, a.extra,
                                cpu=not torch.cuda.is_available())

    # 1. train (fairseq resumes from checkpoint_last.pt; a finished training is skipped, see
    # training_finished).  A kill while fairseq copied checkpoint_last.pt into place leaves it
    # torn: restore it first.
    from fairseq_plugins.checkpoint import repair_last_checkpoint

    repair_last_checkpoint(ckpt_dir)
    t0 = time.time()
    finished = training_finished(ckpt_dir, target_updates(train_cmd))
    try:
        if finished is None:
            run(train_cmd, logfile=os.path.join(out, "train.log"))
        else:
            log(f"train: done (checkpoint_last.pt at {finished} updates), skipping")
    except subprocess.CalledProcessError as err:
        if err.returncode < 0:  # killed (OOM killer, pre-emption, Ctrl-C): not a training failure
            log(f"fairseq-train was killed by signal {-err.returncode}; nothing recorded as failed: "
                "re-run the same command to resume from checkpoint_last.pt")
            raise
        # e.g. fairseq's FloatingPointError on a diverged run: record it, with the loss curve
        curve, valid = loss_curve(os.path.join(out, "train.log"))
        tail = open(os.path.join(out, "train.log")).read().splitlines()[-5:]
        write_json(os.path.join(out, "result.json"), {
            "name": a.name or os.path.basename(out), "status": "failed", "error_tail": tail,
            "arch": a.arch, "attention_fns": a.fns, "commands": {"train": " ".join(train_cmd)},
            "git_commit": git_commit(), "hardware": hardware(), "loss_curve": curve, "valid_loss": valid,
            "updates": curve[-1][0] if curve else 0, "wall_s": state["wall_s"], "scores": {},
            "time": time.strftime("%Y-%m-%d %H:%M:%S")})
        log(f"training failed; see {os.path.join(out, 'train.log')}")
        raise
    state["wall_s"]["train"] = state["wall_s"].get("train", 0.0) + time.time() - t0
    write_json(state_path, state)

    from fairseq_plugins.checkpoint import load_checkpoint

    last = load_checkpoint(os.path.join(ckpt_dir, "checkpoint_last.pt"))
    updates = int(last["optimizer_history"][-1]["num_updates"])
    # fairseq's own cumulative training time, which survives kills and resumes
    state["wall_s"]["train_fairseq_cumulative"] = float(last["extra_state"].get("previous_training_time", 0.0))
    curve, valid = loss_curve(os.path.join(out, "train.log"))

    # 2. average the last N update checkpoints (or take fairseq's checkpoint_best.pt)
    avg, avg_cmd = decode_checkpoint(budget, out)
    if avg_cmd and (not os.path.exists(avg)
                    or os.path.getmtime(avg) < os.path.getmtime(os.path.join(ckpt_dir, "checkpoint_last.pt"))):
        t0 = time.time()
        run(avg_cmd)
        state["wall_s"]["average"] = time.time() - t0

    # 3. generate + score each test set
    gen = budget["generate"]
    eval_dir = os.path.join(out, "eval")
    scores = {}
    subsets = budget["data"]["subsets"]
    missing = [s for s in subsets if not os.path.exists(os.path.join(eval_dir, f"{s}.json"))
               or os.path.getmtime(os.path.join(eval_dir, f"{s}.json")) < os.path.getmtime(avg)
               or (a.ribes and json.load(open(os.path.join(eval_dir, f"{s}.json"))).get("tok_ribes") is None)]
    if missing:
        t0 = time.time()
        run(eval_cmd(gen, avg, data_bin, prep, a.src, a.tgt, missing, eval_dir, ribes=a.ribes))
        state["wall_s"]["evaluate"] = time.time() - t0
    for s in subsets:
        scores[s] = json.load(open(os.path.join(eval_dir, f"{s}.json")))

    result = {
        "name": a.name or os.path.basename(out),
        "arch": a.arch,
        "attention_fns": dict(zip(["encoder", "decoder", "cross"], a.fns)) if a.fns else "arch default",
        "direction": f"{a.src}-{a.tgt}",
        "commands": {"train": " ".join(shlex.quote(c) for c in train_cmd),
                     "reproduce": " ".join(shlex.quote(c) for c in ["python", "scripts/experiment.py"] + list(argv or sys.argv[1:]))},
        "config": {"budget_file": os.path.relpath(a.budget, ROOT), "budget": budget, "train": train_cfg},
        "git_commit": git_commit(),
        "decoded_checkpoint": os.path.relpath(avg, out),
        "data": {"corpus": budget["data"]["corpus"], "prep_dir": os.path.relpath(prep, ROOT),
                 "prep_stamp": open(os.path.join(prep, "bin", ".done")).read().strip()
                 if os.path.exists(os.path.join(prep, "bin", ".done")) else None},
        "hardware": hardware(),
        "updates": updates,
        "wall_s": state["wall_s"],
        "loss_curve": curve,
        "valid_loss": valid,
        "valid_last": last_valid_metrics(os.path.join(out, "train.log")),
        "scores": scores,
        "status": "done",
        "time": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
    write_json(os.path.join(out, "result.json"), result)
    for s in subsets:
        log(f"{result['name']} {s}: SacreBLEU {scores[s]['bleu']:.2f} (tokenized {scores[s].get('tok_bleu')}) "
            f"{scores[s]['signature']}")
    return result


if __name__ == "__main__":
    main()
