"""Review finding (provenance gaps): a run trained over several invocations of fairseq-train (a
campaign run resumed from its checkpoint after a restart, maybe on another machine, maybe at
another commit) records each invocation's code, machine, start time and starting update count
(``result.json``'s ``train_invocations``), and a ``+dirty`` invocation leaves the uncommitted
change itself (``dirty-<n>.diff``), which ``evidence.export`` commits beside the run's evidence.

fairseq-train, the averaging and the evaluation are faked (a checkpoint-shaped dict with the
update count, a copy, score files): what is under test is the runner's record, not the model.
The git state is a real throwaway repository, so the commit, ``+dirty`` and the diff are real.
"""

import gzip
import json
import os
import shutil
import subprocess

import pytest
import torch

from mt_pipeline import evidence, experiment, provenance
from mt_pipeline.evaluate import checkpoint_sha256


def _git(repo, *args):
    return subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True, text=True).stdout.strip()


@pytest.fixture
def repo(tmp_path):
    """A throwaway checkout with one tracked module under a code path (``mt_pipeline/``)."""
    r = tmp_path / "repo"
    (r / "mt_pipeline").mkdir(parents=True)
    (r / "docs").mkdir()
    (r / "mt_pipeline" / "model.py").write_text("LR = 1\n")
    (r / "docs" / "notes.md").write_text("notes\n")
    _git(r, "init", "-q")
    _git(r, "-c", "user.name=t", "-c", "user.email=t@t", "add", "-A")
    _git(r, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "A")
    return r


def test_code_state_holds_the_uncommitted_change_of_the_code_paths_only(repo):
    sha = _git(repo, "rev-parse", "HEAD")
    assert provenance.code_state(str(repo)) == {"git_commit": sha}  # clean: nothing else
    (repo / "docs" / "notes.md").write_text("other notes\n")  # not code: not +dirty, no diff
    assert provenance.code_state(str(repo)) == {"git_commit": sha}
    (repo / "mt_pipeline" / "model.py").write_text("LR = 2\n")
    (repo / "mt_pipeline" / "new.py").write_text("X = 1\n")  # untracked, not ignored
    (repo / ".gitignore").write_text("*.log\n")
    (repo / "mt_pipeline" / "debug.log").write_text("ignored\n")
    st = provenance.code_state(str(repo))
    assert st["git_commit"] == sha + "+dirty"
    assert "-LR = 1\n+LR = 2\n" in st["diff"] and "notes" not in st["diff"]
    assert st["untracked"] == [["mt_pipeline/new.py", provenance.file_sha256(str(repo / "mt_pipeline" / "new.py"))]]


@pytest.fixture
def fake_stages(tmp_path, monkeypatch, repo):
    """Run ``experiment.run_experiment`` with every subprocess faked.  ``plan`` is a list of
    ``(updates reached, killed?)``, one per fairseq-train started; ``machine`` labels hardware()."""
    prep = tmp_path / "prep"
    (prep / "bin").mkdir(parents=True)
    ref = tmp_path / "ref.txt"
    ref.write_text("a b c\n")
    ctl = {"plan": [], "machine": "A", "trained": 0, "train_cmds": []}

    def fake_run(cmd, logfile=None, env=None):
        if cmd[0].endswith("fairseq-train"):
            ctl["trained"] += 1
            ctl["train_cmds"].append(cmd)
            reach, killed = ctl["plan"].pop(0)
            save = cmd[cmd.index("--save-dir") + 1]
            os.makedirs(save, exist_ok=True)
            torch.save({"optimizer_history": [{"num_updates": reach}], "extra_state": {"previous_training_time": 1.0}},
                       os.path.join(save, "checkpoint_last.pt"))
            with open(logfile, "a") as f:
                f.write(f"fake training to {reach}\n")
            if killed:
                raise subprocess.CalledProcessError(-9, cmd)
        elif "mt_pipeline.averaging" in cmd:
            shutil.copyfile(os.path.join(cmd[cmd.index("--inputs") + 1], "checkpoint_last.pt"),
                            cmd[cmd.index("--output") + 1])
        elif "mt_pipeline.evaluate" in cmd:
            out, ck = cmd[cmd.index("--out") + 1], cmd[cmd.index("--checkpoint") + 1]
            os.makedirs(out, exist_ok=True)
            for s in cmd[cmd.index("--subsets") + 1].split(","):
                hyp = os.path.join(out, f"{s}.hyp.detok")
                with open(hyp, "w") as f:
                    f.write("a b c\n")
                with open(os.path.join(out, f"{s}.json"), "w") as f:
                    json.dump({"bleu": 100.0, "chrf": 100.0, "signature": "nrefs:1|case:mixed", "hyp": hyp,
                               "ref": str(ref), "checkpoint_sha256": checkpoint_sha256(ck)}, f)
        else:
            raise AssertionError(f"unexpected command {cmd}")

    monkeypatch.setattr(experiment, "run", fake_run)
    monkeypatch.setattr(experiment, "prepare_data", lambda budget: str(prep))
    monkeypatch.setattr(experiment, "code_state", lambda: provenance.code_state(str(repo)))
    monkeypatch.setattr(experiment, "git_commit", lambda: provenance.git_commit(str(repo)))
    monkeypatch.setattr(experiment, "hardware", lambda: {"machine": ctl["machine"]})
    monkeypatch.setenv("MT_EVIDENCE_ROOT", str(tmp_path / "evidence"))
    return ctl


def test_a_resumed_run_records_each_training_invocation_and_the_dirty_diff_is_exported(tmp_path, repo, fake_stages):
    run_dir = tmp_path / "runs" / "t" / "row1"
    argv = ["--out", str(run_dir), "--arch", "rela_transformer_small", "--max-update", "150"]
    sha_a = _git(repo, "rev-parse", "HEAD")
    # invocation 1: clean tree at commit A on machine A, killed at update 3
    fake_stages["plan"] = [(3, True)]
    with pytest.raises(subprocess.CalledProcessError):
        experiment.run_experiment(argv)
    # between sessions: a new commit B, then an uncommitted change and an untracked module
    (repo / "mt_pipeline" / "model.py").write_text("LR = 3\n")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qam", "B")
    sha_b = _git(repo, "rev-parse", "HEAD")
    (repo / "mt_pipeline" / "model.py").write_text("LR = 4\n")
    (repo / "mt_pipeline" / "new.py").write_text("X = 1\n")
    # invocation 2: resumed on machine B, trains to the end
    fake_stages.update(plan=[(150, False)], machine="B")
    experiment.run_experiment(argv)
    # a third call finds training finished: no fairseq-train, no training invocation
    fake_stages["machine"] = "C"
    res = experiment.run_experiment(argv)
    assert fake_stages["trained"] == 2

    inv = res["train_invocations"]
    assert [i["git_commit"] for i in inv] == [sha_a, sha_b + "+dirty"]
    assert [i["hardware"] for i in inv] == [{"machine": "A"}, {"machine": "B"}]
    assert [i["updates_at_start"] for i in inv] == [0, 3]
    assert [i["outcome"] for i in inv] == ["killed (signal 9)", "done"] and inv[1]["updates_at_end"] == 150
    assert all(i["started"] for i in inv) and "diff" not in inv[0]
    # the top-level fields stay: the code and machine that wrote the record
    assert res["git_commit"] == sha_b + "+dirty" and res["hardware"] == {"machine": "C"} and res["updates"] == 150
    assert res == json.loads((run_dir / "result.json").read_text())

    # the diff: the change against B (not A), with the untracked module listed; it applies to B
    diff = run_dir / "dirty-2.diff"
    assert inv[1]["diff"] == provenance.repo_relative(str(diff)) and not (run_dir / "dirty-1.diff").exists()
    text = diff.read_text()
    assert "-LR = 3\n+LR = 4\n" in text and "mt_pipeline/new.py  sha256 " in text
    _git(repo, "checkout", "--", ".")
    _git(repo, "apply", str(diff))
    assert (repo / "mt_pipeline" / "model.py").read_text() == "LR = 4\n"

    # the export commits it gzipped, lists it in the manifest and points the record at the copy
    ev = evidence.export(str(run_dir), "smoke")
    with gzip.open(os.path.join(ev, "dirty-2.diff.gz"), "rt") as f:
        assert f.read() == text
    manifest = json.load(open(os.path.join(ev, evidence.MANIFEST)))
    assert manifest["files"]["dirty-2.diff.gz"] == provenance.file_sha256(os.path.join(ev, "dirty-2.diff.gz"))
    exported = json.load(open(os.path.join(ev, "result.json")))
    assert exported["train_invocations"][1]["diff"] == provenance.repo_relative(os.path.join(ev, "dirty-2.diff.gz"))
    assert [i["git_commit"] for i in exported["train_invocations"]] == [sha_a, sha_b + "+dirty"]


def test_force_new_removes_the_diffs_of_the_earlier_run(tmp_path, repo, fake_stages):
    run_dir = tmp_path / "runs" / "t" / "row2"
    argv = ["--out", str(run_dir), "--arch", "rela_transformer_small", "--max-update", "150"]
    (repo / "mt_pipeline" / "model.py").write_text("LR = 9\n")
    fake_stages["plan"] = [(150, False)]
    experiment.run_experiment(argv)
    assert (run_dir / "dirty-1.diff").exists()
    _git(repo, "checkout", "--", ".")
    fake_stages["plan"] = [(150, False)]
    res = experiment.run_experiment(argv + ["--force-new"])
    assert not (run_dir / "dirty-1.diff").exists()
    assert [i["git_commit"] for i in res["train_invocations"]] == [_git(repo, "rev-parse", "HEAD")]


def test_a_failed_training_records_its_invocation_in_the_failed_result(tmp_path, repo, fake_stages, monkeypatch):
    run_dir = tmp_path / "runs" / "t" / "row3"
    real_run = experiment.run

    def failing(cmd, logfile=None, env=None):
        real_run(cmd, logfile, env)
        if cmd[0].endswith("fairseq-train"):
            raise subprocess.CalledProcessError(1, cmd)  # e.g. fairseq's FloatingPointError

    monkeypatch.setattr(experiment, "run", failing)
    fake_stages["plan"] = [(2, False)]
    with pytest.raises(subprocess.CalledProcessError):
        experiment.run_experiment(["--out", str(run_dir), "--arch", "rela_transformer_small", "--max-update", "150"])
    res = json.loads((run_dir / "result.json").read_text())
    assert res["status"] == "failed"
    [inv] = res["train_invocations"]
    assert inv["outcome"] == "failed (exit 1)" and inv["git_commit"] == _git(repo, "rev-parse", "HEAD")
    assert inv["hardware"] == {"machine": "A"} and inv["updates_at_start"] == 0 and "updates_at_end" not in inv


def test_tensorboard_is_per_run_and_outside_the_fingerprint(tmp_path, repo, fake_stages, monkeypatch):
    """``--tensorboard`` (or MT_TENSORBOARD=1, which reaches mt-table / reproduce / mt-campaign
    runs) writes the run's event files to ``<run>/tensorboard``; a run resumes with or without it."""
    run_dir = tmp_path / "runs" / "t" / "row4"
    argv = ["--out", str(run_dir), "--arch", "rela_transformer_small", "--max-update", "150"]
    fake_stages["plan"] = [(3, True), (150, False)]
    monkeypatch.setenv("MT_TENSORBOARD", "1")
    with pytest.raises(subprocess.CalledProcessError):
        experiment.run_experiment(argv)
    monkeypatch.delenv("MT_TENSORBOARD")
    experiment.run_experiment(argv)  # the same configuration: resumes
    first, second = fake_stages["train_cmds"]
    assert first[first.index("--tensorboard-logdir") + 1] == str(run_dir / "tensorboard")
    assert "--tensorboard-logdir" not in second
