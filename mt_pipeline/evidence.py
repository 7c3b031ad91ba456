"""Committed evidence of finished runs: what lets anyone re-score, bootstrap and check a number.

A run directory (``runs/...``: checkpoints, logs) is git-ignored and does not outlive the machine
it was trained on.  When a run has finished, :func:`export` copies what a reader needs into
``results/runs/<regime>/<table runs dir>/<row dir>/`` (:func:`evidence_dir`; small, no checkpoints):

* ``result.json`` -- the run's record (config, commit, data, hardware, wall time, scores), with
  each subset's ``hyp`` pointing at the committed hypotheses and ``ref`` at the reference file of
  the prepared data (repo-relative; the data itself is never committed: ``mt-prep`` re-creates it,
  and ``ref_sha256`` pins its content);
* ``<subset>.hyp.detok.gz`` -- the detokenized hypotheses that were scored (gzip, mtime 0, so the
  same text gives the same bytes);
* ``train.log.gz`` -- fairseq's full JSON training log (loss and validation curves, resumes);
* ``dirty-<n>.diff.gz`` -- for each training invocation (``result.json``'s ``train_invocations``)
  whose code was ``<sha>+dirty``, the uncommitted change it ran with (:mod:`mt_pipeline.experiment`
  wrote it into the run directory); the invocation's ``diff`` points at the committed copy;
* ``analysis_*.json`` when the run has them (its ``config.json`` fingerprint is ``result.json``'s
  ``config``; its ``campaign.json`` -- launcher, concurrency -- goes into ``result.json`` as ``campaign``);
* ``decodes/<name>/`` -- re-decodes of the run's checkpoint under other settings (Flexible
  Attention's tau sweep: :func:`export_decode`), each with its own ``result.json`` (``kind:
  decode``), hypotheses and manifest;
* ``MANIFEST.json`` -- the files this module wrote with their SHA-256, the run's git commit and the
  commit the export ran at; a later export overwrites
  only those, never anything else a user put in the directory.

:func:`locate` finds a run's ``result.json`` in its run directory or, failing that, in its
evidence directory, so tables re-render from committed evidence in a fresh checkout.
:func:`rescore` re-scores every committed run from its hypotheses and compares with the recorded
BLEU and chrF (``mt-campaign rescore``; a test runs it on every committed run).

The evidence root is ``results/runs`` of this checkout, or ``$MT_EVIDENCE_ROOT`` when set (the
tests point it at a temporary folder so they never write into ``results/``).  :func:`evidence_root`,
:func:`evidence_dir` and :data:`NO_EVIDENCE` live in :mod:`fairseq_plugins.provenance` (the
analysis CLIs trace their models to evidence too) and are re-exported here.
"""

import gzip
import json
import os
import shlex
import shutil
from typing import Dict, List, Optional

from .atomic import atomic_path, write_json_atomic
from .provenance import NO_EVIDENCE, ROOT, evidence_dir, evidence_root, file_sha256, git_commit, repo_relative

__all__ = ["evidence_root", "evidence_dir", "export", "export_decode", "is_current", "locate", "resolve", "rescore",
           "RescoreError", "stale_decodes", "drop_stale_decodes",
           "NO_EVIDENCE", "predates_evidence"]

MANIFEST = "MANIFEST.json"


def predates_evidence(page: str) -> bool:
    """Whether the full table ``page`` (a path) exists and carries :data:`NO_EVIDENCE`.  Such a page
    is replaced as a whole, once every row it shows a number for has re-run with evidence
    (:func:`mt_pipeline.reproduce.predated_rows_pending`) -- never row by row,
    which would turn the rows not re-run yet into "not run yet" and orphan what other pages quote
    from them (:func:`mt_pipeline.campaign.render_tables`, :func:`mt_pipeline.reproduce.write_index`)."""
    if not os.path.exists(page):
        return False
    with open(page, encoding="utf-8") as f:
        return NO_EVIDENCE in f.read()


class RescoreError(RuntimeError):
    """A committed run does not re-score to its recorded numbers (the message lists which)."""


def resolve(path: str) -> str:
    """A path recorded in a result: repo-relative ones are taken from the repository root."""
    return path if os.path.isabs(path) else os.path.join(ROOT, path)


def _gzip_to(src: str, dst: str) -> None:
    with open(src, "rb") as fin, atomic_path(dst) as tmp:
        with open(tmp, "wb") as raw, gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0) as gz:
            shutil.copyfileobj(fin, gz)


def _copy_to(src: str, dst: str) -> None:
    with atomic_path(dst) as tmp:
        shutil.copyfile(src, tmp)


#: the fields of a run's ``result.json`` that identify one finish of it (a re-run changes them)
_FINISH_KEYS = ("time", "status", "decoded_checkpoint_sha256")


def is_current(run_dir: str, regime: str) -> bool:
    """Whether the run's committed evidence is its latest finish: the evidence's ``result.json`` has
    the run's own ``time``, ``status`` and decoded checkpoint, and its manifest the SHA-256 of every
    ``analysis_*.json`` of the run directory.  By content, not file times: a ``git checkout`` or
    ``pull`` gives the evidence a fresh mtime without making it the run's."""
    ev = evidence_dir(run_dir, regime)
    try:
        with open(os.path.join(run_dir, "result.json")) as f:
            mine = json.load(f)
        with open(os.path.join(ev, "result.json")) as f:
            theirs = json.load(f)
    except FileNotFoundError:
        return False
    if any(mine.get(k) != theirs.get(k) for k in _FINISH_KEYS):
        return False
    files = _old_files(ev)
    return all(files.get(n) == file_sha256(os.path.join(run_dir, n)) for n in os.listdir(run_dir)
               if n.startswith("analysis_") and n.endswith(".json"))


def _sources(run_dir: str, res: Dict) -> List[str]:
    """Every file :func:`export` copies from, so that a missing one stops it before it writes."""
    out = [resolve(s["hyp"]) for s in (res.get("scores") or {}).values()]
    out += [resolve(inv["diff"]) for inv in res.get("train_invocations") or [] if inv.get("diff")]
    return out


def export(run_dir: str, regime: str) -> Optional[str]:
    """Copy the evidence of a finished run (``result.json`` with ``status: done``) into its
    evidence directory; returns that directory, or None when the run has not finished, or when it
    failed and its evidence directory holds an earlier *successful* finish (e.g. a run trained again
    for a post-training step that then diverged): that evidence is kept, the failure stays in the run
    directory.  A failed run without such evidence is exported: its record and log say why it failed.

    Raises:
        FileNotFoundError: a file the result names (hypotheses, a training invocation's diff) is
            missing -- checked before anything is written, so the evidence is never half old, half new.
    """
    import sys

    res_path = os.path.join(run_dir, "result.json")
    if not os.path.exists(res_path):
        return None
    with open(res_path) as f:
        res = json.load(f)
    missing = [p for p in _sources(run_dir, res) if not os.path.exists(p)]
    if missing:
        raise FileNotFoundError(f"evidence of {run_dir}: {', '.join(missing)} missing; nothing exported")
    out = evidence_dir(run_dir, regime)
    if res.get("status") != "done" and os.path.exists(os.path.join(out, "result.json")):
        with open(os.path.join(out, "result.json")) as f:
            if json.load(f).get("status") == "done":
                print(f"[evidence] {run_dir} did not finish ({res.get('status')}); the committed evidence of its "
                      f"earlier successful training in {repo_relative(out)} is kept", file=sys.stderr)
                return None
    os.makedirs(out, exist_ok=True)
    old = _old_files(out)
    written: Dict[str, str] = {}

    def put(name, src, gz=False):
        dst = os.path.join(out, name)
        (_gzip_to if gz else _copy_to)(src, dst)
        written[name] = file_sha256(dst)

    _put_scores(res.get("scores") or {}, out, put)
    if os.path.exists(os.path.join(run_dir, "train.log")):
        put("train.log.gz", os.path.join(run_dir, "train.log"), gz=True)
    for inv in res.get("train_invocations") or []:  # the uncommitted change of a +dirty training invocation
        if inv.get("diff"):
            name = os.path.basename(inv["diff"]) + ".gz"
            put(name, resolve(inv["diff"]), gz=True)
            inv["diff"] = repo_relative(os.path.join(out, name))
    for name in sorted(os.listdir(run_dir)):
        if name.startswith("analysis_") and name.endswith(".json"):
            put(name, os.path.join(run_dir, name))
    campaign = os.path.join(run_dir, "campaign.json")
    if os.path.exists(campaign):
        with open(campaign) as f:
            res["campaign"] = json.load(f)
    res["evidence"] = {"run_dir": repo_relative(run_dir), "regime": regime}
    _finish(out, res, written, old, "mt_pipeline.evidence.export")
    drop_stale_decodes(out)
    return out


def stale_decodes(run_evidence: str) -> List[str]:
    """The re-decodes committed beside a run's evidence (``<run_evidence>/decodes/<name>/``,
    :func:`export_decode`) whose checkpoint is not the run's: their ``decoded_checkpoint_sha256``
    differs from the run's own ``result.json``'s (the run was trained again, so they decoded a
    model that no longer exists).  Empty when the run's record states no checkpoint hash.

    Returns:
        the decode directories, sorted.
    """
    try:
        with open(os.path.join(run_evidence, "result.json")) as f:
            sha = json.load(f).get("decoded_checkpoint_sha256")
    except FileNotFoundError:
        return []
    root = os.path.join(run_evidence, "decodes")
    if not sha or not os.path.isdir(root):
        return []
    out = []
    for name in sorted(os.listdir(root)):
        rec = os.path.join(root, name, "result.json")
        if os.path.exists(rec):
            with open(rec) as f:
                if json.load(f).get("decoded_checkpoint_sha256") != sha:
                    out.append(os.path.join(root, name))
    return out


def drop_stale_decodes(run_evidence: str) -> List[str]:
    """Remove the :func:`stale_decodes` of a run's evidence: the files each decode's manifest lists
    (this module wrote them), its manifest, and the directory once empty -- a decode of a model
    that was replaced is no evidence for any page (git history keeps it).  Called by
    :func:`export`, so re-training a run never leaves the old model's decodes beside the new
    model's record.

    Returns:
        the decode directories removed.
    """
    gone = []
    for d in stale_decodes(run_evidence):
        for name in list(_old_files(d)) + ["result.json", MANIFEST]:
            if os.path.exists(os.path.join(d, name)):
                os.unlink(os.path.join(d, name))
        if not os.listdir(d):
            os.rmdir(d)
        gone.append(d)
    return gone


def _put_scores(scores: Dict, out: str, put) -> None:
    """Commit each subset's detokenized hypotheses (``<subset>.hyp.detok.gz`` via ``put``) and point
    the score records at them (repo-relative), the references at the prepared data (with their
    SHA-256); the tokenized files are not committed (tokenized BLEU is not re-scored from evidence)."""
    for subset, score in scores.items():
        put(f"{subset}.hyp.detok.gz", resolve(score["hyp"]), gz=True)
        ref = resolve(score["ref"])
        score["hyp"] = repo_relative(os.path.join(out, f"{subset}.hyp.detok.gz"))
        score["ref"] = repo_relative(ref)
        if os.path.exists(ref):
            score["ref_sha256"] = file_sha256(ref)
        for key in ("tok_hyp", "tok_ref"):
            score.pop(key, None)


def _old_files(out: str) -> Dict[str, str]:
    if os.path.exists(os.path.join(out, MANIFEST)):
        with open(os.path.join(out, MANIFEST)) as f:
            return json.load(f).get("files", {})
    return {}


def _finish(out: str, res: Dict, written: Dict[str, str], old: Dict[str, str], writer: str) -> None:
    """Write ``result.json`` and the manifest, then remove what an earlier export of ``out`` wrote
    and this one did not (never a file this module did not write)."""
    write_json_atomic(os.path.join(out, "result.json"), res)
    written["result.json"] = file_sha256(os.path.join(out, "result.json"))
    write_json_atomic(os.path.join(out, MANIFEST), {"written_by": writer, "git_commit": res.get("git_commit"),
                                                    "exported_at_git_commit": git_commit(), "files": written})
    for name in set(old) - set(written) - {MANIFEST}:
        if os.path.exists(os.path.join(out, name)):
            os.unlink(os.path.join(out, name))


def export_decode(run_dir: str, regime: str, name: str, decode_dir: str, subsets: List[str],
                  settings: Dict, command: str) -> str:
    """Commit a re-decode of a finished run's checkpoint under other decoding settings (e.g.
    Flexible Attention's threshold tau, ``mt-flexible-sweep``) as evidence beside the run's own:
    ``<evidence dir of the run>/decodes/<name>/`` with ``result.json`` (``kind: decode``: the run,
    the checkpoint's SHA-256, ``settings``, ``command``, the scores of ``subsets`` in that order,
    each pointing at its committed hypotheses), ``<subset>.hyp.detok.gz`` and ``MANIFEST.json``.
    :func:`committed_results` finds it, so ``mt-campaign rescore`` re-scores it like a run.

    Args:
        run_dir: the trained run (its ``result.json`` gives data, direction and commit).
        regime: the run's regime (:data:`fairseq_plugins.provenance.REGIMES`).
        name: the decode's directory name (``tau_1.2``); letters, digits, ``._-`` only.
        decode_dir: ``mt-evaluate``'s output for this decode (``<subset>.json`` + hypotheses).
        subsets: the subsets to commit, first the one a page shows.
        settings: what differs from the run's own decode (``{"flexible_threshold": "1.2", ...}``).
        command: the command that decoded.

    Raises:
        ValueError: ``name`` with other characters.
        FileNotFoundError: the run's ``result.json`` or a subset's ``<subset>.json`` is missing.
    """
    import re

    if not re.fullmatch(r"[A-Za-z0-9._-]+", name):
        raise ValueError(f"decode name {name!r}: use letters, digits, '.', '_' and '-' only")
    with open(os.path.join(run_dir, "result.json")) as f:
        run = json.load(f)
    scores = {}
    for subset in subsets:
        with open(os.path.join(decode_dir, f"{subset}.json")) as f:
            scores[subset] = json.load(f)
    shas = {sc.get("checkpoint_sha256") for sc in scores.values()}
    run_ev = evidence_dir(run_dir, regime)
    out = os.path.join(run_ev, "decodes", name)
    os.makedirs(out, exist_ok=True)
    old, written = _old_files(out), {}

    def put(fname, src, gz=False):
        dst = os.path.join(out, fname)
        (_gzip_to if gz else _copy_to)(src, dst)
        written[fname] = file_sha256(dst)

    _put_scores(scores, out, put)
    res = {"kind": "decode", "status": "done", "name": name, "run": repo_relative(run_dir),
           "run_evidence": repo_relative(run_ev), "regime": regime, "direction": run.get("direction"),
           "data": run.get("data"), "run_git_commit": run.get("git_commit"), "git_commit": git_commit(),
           "decoded_checkpoint": repo_relative(next(iter(scores.values()))["checkpoint"]) if scores else None,
           "decoded_checkpoint_sha256": shas.pop() if len(shas) == 1 else None,
           "settings": settings, "command": command, "scores": scores,
           "evidence": {"run_dir": repo_relative(decode_dir), "regime": regime}}
    _finish(out, res, written, old, "mt_pipeline.evidence.export_decode")
    return out


def locate(run_dir: str, regime: str) -> Optional[str]:
    """The directory holding the run's ``result.json``: the run directory itself, else its
    evidence directory, else None."""
    for d in (run_dir, evidence_dir(run_dir, regime)):
        if os.path.exists(os.path.join(d, "result.json")):
            return d
    return None


def committed_results(root: Optional[str] = None) -> List[str]:
    """Paths of every ``result.json`` under the evidence root, sorted."""
    root = root or evidence_root()
    out = []
    for dirpath, _, files in os.walk(root):
        if "result.json" in files and MANIFEST in files:
            out.append(os.path.join(dirpath, "result.json"))
    return sorted(out)


def reference_changed(score: Dict, path: str) -> bool:
    """Whether the reference file at ``path`` is not the one a subset's score record
    (``result.json`` ``scores[subset]``) was scored against: its SHA-256 differs from the recorded
    ``ref_sha256`` (data prepared again differently, or another machine's data).  False when the
    record predates ``ref_sha256``.
    """
    return bool(score.get("ref_sha256")) and file_sha256(path) != score["ref_sha256"]


def lowercased(score: Dict) -> bool:
    """Whether a subset's score record was computed on lowercased text: its sacreBLEU signature
    says ``case:lc`` (:func:`mt_pipeline.scoring.score_files` with ``lowercase``)."""
    return "case:lc" in (score.get("signature") or "")


def _reference_prep(res: Dict) -> str:
    """The command that prepares a run's references (its budget's data-prep up to the stage that
    writes them), as the message of a missing reference shows it."""
    from .budget import prep_cmd

    budget = (res.get("config") or {}).get("budget")
    if not budget:
        return f"mt-prep {res.get('data', {}).get('corpus', '<corpus>')} (the record names no budget)"
    try:
        cmd = prep_cmd(budget, references_only=True)
    except SystemExit as e:  # a corpus this checkout has no data-prep for
        return f"mt-prep {budget['data']['corpus']} ({e})"
    return " ".join(shlex.quote(repo_relative(c) if os.path.isabs(c) else c) for c in cmd)


def rescore(result_path: str, tolerance: float = 0.005) -> List[Dict]:
    """Re-score one committed run from its hypotheses and compare with its record.

    Returns:
        one ``{"subset", "bleu", "recorded_bleu", "chrf", "recorded_chrf"}`` per scored subset.

    Raises:
        RescoreError: a reference is missing (the message gives the data-prep command that writes
            it: ``prepare.sh ... --until STAGE``), its content differs from the one scored
            (``ref_sha256``), or a score differs from the record by more than ``tolerance``.
    """
    from .scoring import score_files

    with open(result_path) as f:
        res = json.load(f)
    rows, problems = [], []
    for subset, score in (res.get("scores") or {}).items():
        hyp, ref = resolve(score["hyp"]), resolve(score["ref"])
        if not os.path.exists(ref):
            raise RescoreError(f"{result_path}: reference {score['ref']} is missing; prepare it first: "
                               + _reference_prep(res))
        if reference_changed(score, ref):
            problems.append(f"{subset}: reference {score['ref']} differs from the one scored (sha256)")
            continue
        new = score_files(hyp, ref, lowercase=lowercased(score))  # as it was scored
        rows.append({"subset": subset, "bleu": new["bleu"], "recorded_bleu": score["bleu"],
                     "chrf": new.get("chrf"), "recorded_chrf": score.get("chrf")})
        if abs(new["bleu"] - score["bleu"]) > tolerance:
            problems.append(f"{subset}: BLEU {new['bleu']:.2f} re-scored, {score['bleu']:.2f} recorded")
        if score.get("chrf") is not None and abs(new["chrf"] - score["chrf"]) > tolerance:
            problems.append(f"{subset}: chrF {new['chrf']:.2f} re-scored, {score['chrf']:.2f} recorded")
    if problems:
        raise RescoreError(f"{result_path}: " + "; ".join(problems))
    return rows
