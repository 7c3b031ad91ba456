"""Provenance of every result file: the one record and its one Markdown rendering.

A number in ``results/`` must say how to regenerate it.  :func:`collect` gathers what every
result carries -- the command (with repo-relative paths), the git commit of the code (``+dirty``
when tracked code differs from it), the hardware and software, the time -- plus whatever the
caller adds (config, data, sacreBLEU signature, updates, wall time); :func:`markdown` renders
such a record as the ``## Provenance`` section of a Markdown result.  It lives in the plugin (its
analysis CLIs record provenance too) and :mod:`mt_pipeline.provenance` re-exports it.
"""

import hashlib
import os
import platform
import shlex
import subprocess
import sys
import time
import json
from typing import Dict, Iterable, Optional, Tuple

__all__ = ["ROOT", "CODE_DIRS", "git_commit", "hardware", "load_average", "command_line", "repo_relative", "collect",
           "markdown", "file_sha256", "REGIMES", "weakest_regime", "NO_EVIDENCE", "evidence_root", "evidence_dir",
           "trained_model", "decoded_checkpoint", "models_markdown"]

#: the repository root (the directory holding ``mt_pipeline/`` and ``fairseq_plugins/``)
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
#: tracked paths whose uncommitted changes make a result ``+dirty`` (results/ and docs do not)
CODE_DIRS = ("fairseq_plugins", "mt_pipeline", "scripts", "configs", "data-prep", "setup.cfg")


def git_commit(root: str = ROOT) -> str:
    """``<sha>``, or ``<sha>+dirty`` when tracked files under :data:`CODE_DIRS` differ from the
    commit; ``unknown`` outside a git checkout (e.g. an installed wheel)."""
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True,
                             timeout=30)
        if sha.returncode != 0:
            return "unknown"
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--", *CODE_DIRS],
                               cwd=root, capture_output=True, text=True, timeout=30).stdout.strip()
        return sha.stdout.strip() + ("+dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def file_sha256(path: str, algo: str = "sha256") -> str:
    """Hex SHA-256 of a file (checkpoints, data), read in 1 MiB blocks; ``algo`` another
    :func:`hashlib.new` algorithm (mt-prep checks the md5 sums sacreBLEU records for test sets)."""
    h = hashlib.new(algo)
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def hardware() -> Dict[str, object]:
    """CPU model, cores, torch threads, accelerator, torch/python versions (torch imported here)."""
    cpu = platform.processor() or platform.machine() or "unknown"
    try:
        with open("/proc/cpuinfo") as f:
            names = [line.split(":", 1)[1].strip() for line in f if line.startswith("model name")]
        cpu = names[0] if names else cpu
    except OSError:
        pass
    import torch

    dev = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu only"
    return {"cpu": cpu, "cores": os.cpu_count(), "torch_threads": torch.get_num_threads(),
            "accelerator": dev, "torch": torch.__version__, "python": platform.python_version()}


def load_average() -> str:
    """The machine's load average over 1, 5 and 15 minutes (runnable processes, all cores
    together), e.g. ``"2.05 2.10 1.98"``; ``"n/a"`` where the OS has none.  Benchmarks record it
    at their start and end beside the core count, so a page timed while other jobs ran (the
    background campaigns here) says so."""
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except (AttributeError, OSError):
        return "n/a"


def repo_relative(word: str, root: str = ROOT) -> str:
    """``word`` with a path inside the repository written relative to it (sibling directories
    such as ``/work/main2`` are not inside ``/work/main``); anything else unchanged."""
    if not os.path.isabs(word):
        return word
    try:
        inside = os.path.commonpath([os.path.abspath(word), root]) == root
    except ValueError:  # different drives
        return word
    return os.path.relpath(word, root) if inside else word


def command_line(prog: str, argv: Optional[Iterable[str]] = None) -> str:
    """The shell command that reran this one: ``prog`` and ``argv`` (default ``sys.argv[1:]``),
    quoted, repo paths relative."""
    args = sys.argv[1:] if argv is None else list(argv)
    return " ".join([prog] + [shlex.quote(_relative_arg(str(a))) for a in args])


def _relative_arg(arg: str) -> str:
    """``arg`` with a repo path relative, also as the value of ``label=path`` / ``--opt=path``."""
    if "=" in arg and not os.path.isabs(arg):
        head, value = arg.split("=", 1)
        return f"{head}={repo_relative(value)}"
    return repo_relative(arg)


def collect(command: str, **extra) -> Dict[str, object]:
    """The provenance record of one result: ``command``, ``git_commit``, ``hardware``, ``time``
    (local, ``%Y-%m-%d %H:%M:%S``) and every keyword in ``extra`` (e.g. ``config``, ``data``,
    ``sacrebleu``, ``updates``, ``wall_s``; values must be JSON-serialisable)."""
    rec = {"command": command, "git_commit": git_commit(), "hardware": hardware(),
           "time": time.strftime("%Y-%m-%d %H:%M:%S")}
    rec.update(extra)
    return rec


def _fmt(value) -> str:
    if isinstance(value, dict):
        return "; ".join(f"{k} {_fmt(v)}" for k, v in value.items())
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def markdown(record: Dict[str, object], title: str = "Provenance", level: int = 2) -> str:
    """Render a :func:`collect` record as a Markdown section: a heading and one bullet per key
    (the command and the commit in code spans), ending with a newline."""
    lines = ["#" * level + f" {title}", ""]
    for key, value in record.items():
        label = key.replace("_", " ")
        if key in ("command", "git_commit"):
            lines.append(f"- {label}: `{value}`")
        else:
            lines.append(f"- {label}: {_fmt(value)}")
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------------
# the trained models an analysis measured, traced to their training runs and committed evidence
# (issue 27: every number traceable).  The pipeline (mt_pipeline.budget, mt_pipeline.evidence)
# re-exports these; they live here because the plugin's analysis CLIs write such pages too.

#: what a run's numbers can claim, by the regime of the budget it trained with (shown on every
#: rendered table and analysis page)
REGIMES = {
    "smoke": "early-training smoke test (a reduced CPU budget, far short of convergence): shows the pipeline runs, "
             "never a replication",
    "diagnostic": "early training (the first updates of the converged budget): compares rows of one study, "
                  "not a paper's claim",
    "converged": "the converged budget at reduced scale (small model, Multi30k; the validation NLL still falls "
                 "at its end: results/README.md's campaign block): tests a claim's direction at that budget",
    "paper": "the paper's data, model size and budget",
}
#: the line a page carries when its numbers predate committed evidence (issue 27): they can be
#: re-run (``mt-campaign run --plan configs/campaign/smoke.yaml``) but not traced in the repository
NO_EVIDENCE = "**Evidence: none committed.**"


def evidence_root() -> str:
    """``$MT_EVIDENCE_ROOT`` or ``<repo>/results/runs``."""
    return os.environ.get("MT_EVIDENCE_ROOT") or os.path.join(ROOT, "results", "runs")


def evidence_dir(run_dir: str, regime: str) -> str:
    """Where a run's evidence goes: its path below ``runs/`` (else its last three components),
    led by the regime, under the evidence root -- e.g. ``results/runs/converged/rela_table1/row7-seed2``
    for ``runs/converged/rela_table1/row7-seed2`` and ``results/runs/smoke/rela_table1/row1`` for the
    smoke run ``runs/rela_table1/row1``."""
    run_dir = os.path.abspath(run_dir)
    runs = os.path.join(ROOT, "runs")
    if os.path.commonpath([run_dir, runs]) == runs:
        parts = os.path.relpath(run_dir, runs).split(os.sep)
    else:
        parts = run_dir.split(os.sep)[-3:]
    if parts[0] != regime:
        parts = [regime] + parts
    return os.path.join(evidence_root(), *parts)


def decoded_checkpoint(run_dir: str) -> str:
    """The checkpoint a training run was scored with: ``decoded_checkpoint`` of the run's
    ``result.json`` (written by ``mt-experiment``; relative to ``run_dir``, e.g.
    ``average_last5_epochs.pt`` at the converged budget, ``average_last3.pt`` at smoke), so an
    analysis of the run reads the model its BLEU belongs to.

    Returns:
        the checkpoint's absolute path.

    Raises:
        FileNotFoundError: ``run_dir`` has no ``result.json`` (not a finished ``mt-experiment``
            run), the record names no checkpoint, or the checkpoint is gone; the message says which.
    """
    rec = os.path.join(os.path.abspath(run_dir), "result.json")
    if not os.path.isfile(rec):
        raise FileNotFoundError(f"{run_dir}: no result.json -- not a finished mt-experiment run; give a checkpoint "
                                f"file instead")
    with open(rec) as f:
        name = json.load(f).get("decoded_checkpoint")
    if not name:
        raise FileNotFoundError(f"{rec} names no decoded_checkpoint; give a checkpoint file instead")
    path = os.path.join(os.path.dirname(rec), name)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{run_dir}: its scored checkpoint {name} is gone (result.json names it); re-run the "
                                f"experiment to rebuild it, or give another checkpoint file")
    return path


def trained_model(checkpoint: str) -> Dict[str, object]:
    """The training run behind ``checkpoint`` and its committed evidence.

    The run directory is the checkpoint's folder (``<run>/average_last3.pt``) or, for a file in a
    ``checkpoints/`` folder, the one above; its ``result.json`` (written by ``mt-experiment``)
    gives the regime, seed, updates and commit.  Returns a JSON-serialisable dict:
    ``checkpoint`` (repo-relative), ``sha256`` of the checkpoint, ``run_dir`` (None when no
    ``result.json`` is found: a checkpoint trained outside the pipeline), ``regime``, ``seed``,
    ``updates``, ``git_commit``, ``decoded`` (the checkpoint is the one the run was scored
    with: its SHA-256 equals ``decoded_checkpoint_sha256``) and ``evidence`` (the repo-relative
    evidence directory, :func:`evidence_dir`, when its ``result.json`` records this very
    checkpoint; else None).

    Raises:
        FileNotFoundError: ``checkpoint`` does not exist.
    """
    path = os.path.abspath(checkpoint)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"checkpoint not found: {checkpoint}")
    rec: Dict[str, object] = {"checkpoint": repo_relative(path), "sha256": file_sha256(path), "run_dir": None,
                              "regime": "unstated", "seed": None, "updates": None, "git_commit": None,
                              "decoded": False, "evidence": None}
    run = os.path.dirname(path)
    if os.path.basename(run) == "checkpoints":
        run = os.path.dirname(run)
    if not os.path.exists(os.path.join(run, "result.json")):
        return rec
    with open(os.path.join(run, "result.json")) as f:
        res = json.load(f)
    rec.update(run_dir=repo_relative(run), regime=res.get("regime") or "unstated", seed=res.get("seed"),
               updates=res.get("updates"), git_commit=res.get("git_commit"),
               decoded=res.get("decoded_checkpoint_sha256") == rec["sha256"])
    ev = evidence_dir(run, rec["regime"])
    if os.path.exists(os.path.join(ev, "result.json")):
        with open(os.path.join(ev, "result.json")) as f:
            if json.load(f).get("decoded_checkpoint_sha256") == rec["sha256"]:
                rec["evidence"] = repo_relative(ev)
    return rec


def weakest_regime(regimes: Iterable[str]) -> str:
    """The regime a page showing numbers of several regimes can claim: the weakest of them
    (``unstated`` < smoke < diagnostic < converged < paper; unknown names count as unstated;
    ``unstated`` for none)."""
    order = ["unstated", "smoke", "diagnostic", "converged", "paper"]
    return min(regimes, key=lambda r: order.index(r) if r in order else 0, default="unstated")


def models_markdown(models: Dict[str, Dict[str, object]], seeds_note: Optional[str] = None) -> Tuple[str, str]:
    """Markdown for a page that measured trained ``models`` (label -> :func:`trained_model`):
    ``(head, section)``.  ``head`` is the regime line (``**Regime: smoke** -- ...``, the weakest
    regime of the models when they differ) and, when any model's training run has no committed
    evidence for this checkpoint, :data:`NO_EVIDENCE` with the command that re-trains them;
    ``section`` is ``## Trained models`` with a ``### Model <label>:`` entry per model naming its
    run, regime, seed, updates, checkpoint SHA-256 and committed evidence (the format the results
    audit, ``tests/test_results_audit.py``, reads).  ``seeds_note`` replaces the regime line's
    "(one model per label: ...)" where the page averages seeds (the AER seed means)."""
    regimes = [str(m["regime"]) for m in models.values()]
    weakest = weakest_regime(regimes)
    seeds = sorted({m["seed"] for m in models.values() if m["seed"] is not None})
    head = [f"**Regime: {weakest}** -- measured on the trained models below "
            f"({', '.join(f'{k}: {m}' for k, m in zip(models, regimes))}): "
            f"{REGIMES.get(weakest, 'their training runs state no regime')}. "
            f"Seeds: {', '.join(map(str, seeds)) or 'not recorded'} ("
            + (seeds_note or "one model per label: differences between models are not tested against seed noise")
            + ").", ""]
    missing = [k for k, m in models.items() if not m["evidence"]]
    if missing:
        head += [f"{NO_EVIDENCE} The training runs of {', '.join(missing)} have no committed evidence "
                 "(result.json, hypotheses, training log) for the checkpoint measured here, so the models cannot be "
                 "traced in the repository, only re-trained: `mt-campaign run --plan configs/campaign/smoke.yaml` "
                 "(smoke and diagnostic runs; `configs/campaign/converged.yaml` for converged ones) re-trains them "
                 "with evidence, then this page's command re-measures them.", ""]
    section = ["## Trained models", ""]
    for label, m in models.items():
        section.append(f"### Model {label}: `{m['checkpoint']}`")
        section.append("")
        if m["run_dir"]:
            section.append(f"- training run `{m['run_dir']}`: regime {m['regime']}, seed {m['seed']}, "
                           f"{m['updates']} updates, git commit `{m['git_commit']}`"
                           + ("" if m["decoded"] else "; **not** the checkpoint the run was scored with"))
        else:
            section.append("- training run: none found (no result.json beside the checkpoint)")
        section.append(f"- checkpoint sha256: `{m['sha256']}`")
        if m["evidence"]:
            section.append(f"- committed evidence (result.json, hypotheses, training log): `{m['evidence']}`")
        section.append("")
    return "\n".join(head), "\n".join(section)
