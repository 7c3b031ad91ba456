"""Long pipelines killed and re-run: scripts/experiment.py and scripts/run_table.py.

Real data: the 3,000-pair Multi30k slice of tests/test_end_to_end.py (its ``prepared`` fixture),
a 1+1-layer d-16 ReLA model, 8 updates, greedy search on test_2016_flickr with short outputs.
It checks that a killed pipeline continues where it stopped, never reuses a half-written file
and ends with the result of an uninterrupted run -- not translation quality.

Kills are SIGKILLs of the whole process group (the runner and the stage it runs), injected at
deterministic points by a driver that runs the runner in-process after wrapping, in that process
only, the command of one stage: fairseq-train kills the group after update K, the checkpoint
averaging kills it half-way through writing its output, run_table kills it right after
rendering the Markdown of its first row.  A kill during evaluation is sent by the test as soon as
fairseq-generate's temp log exists (generation then runs for seconds).
"""

import glob
import shutil
import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
import torch
import yaml

import train_helpers as th
from fairseq_plugins.checkpoint import load_checkpoint
from test_end_to_end import RAW, prepared  # noqa: F401  (module fixture: the prepared Multi30k slice)

pytestmark = pytest.mark.skipif(not os.path.isdir(RAW), reason=f"real data not found at {RAW}")

SCRIPTS = os.path.join(th.ROOT, "scripts")
MAX_UPDATE = 8
MODEL = ("--encoder-layers 1 --decoder-layers 1 --encoder-embed-dim 16 --decoder-embed-dim 16 "
         "--encoder-ffn-embed-dim 32 --decoder-ffn-embed-dim 32 --encoder-attention-heads 2 "
         "--decoder-attention-heads 2")

DRIVER = textwrap.dedent("""
    import os, signal, sys
    mode, arg = sys.argv.pop(1), sys.argv.pop(1)
    from mt_pipeline import experiment
    from mt_pipeline import tables as run_table

    TRAIN = '''
    import os, signal, sys
    from fairseq import trainer
    orig = trainer.Trainer.set_num_updates
    def set_num_updates(self, n):
        orig(self, n)
        if n == %d:
            sys.stdout.flush(); os.killpg(0, signal.SIGKILL)
    trainer.Trainer.set_num_updates = set_num_updates
    sys.argv = sys.argv[1:]
    from fairseq_cli.train import cli_main
    cli_main()
    '''
    AVERAGE = '''
    import io, os, runpy, signal, sys, torch
    real = torch.save
    def save(obj, f, *a, **kw):
        buf = io.BytesIO(); real(obj, buf); data = buf.getvalue()
        with open(f, "wb") as fh:
            fh.write(data[: len(data) // 2]); fh.flush(); os.fsync(fh.fileno())
        os.killpg(0, signal.SIGKILL)
    torch.save = save
    sys.argv = sys.argv[1:]
    if sys.argv[0] == "-m":  # python -m MODULE ARGS
        sys.argv = sys.argv[1:]
        runpy.run_module(sys.argv[0], run_name="__main__", alter_sys=True)
    else:
        runpy.run_path(sys.argv[0], run_name="__main__")
    '''
    if mode == "train":
        orig_train = experiment.build_train_cmd
        def build_train_cmd(*a, **kw):
            cmd = orig_train(*a, **kw)
            return [sys.executable, "-c", TRAIN % int(arg), *cmd]
        experiment.build_train_cmd = build_train_cmd
    elif mode == "average":
        from mt_pipeline import budget
        orig_avg = budget.average_cmd
        def average_cmd(*a, **kw):
            cmd = orig_avg(*a, **kw)
            return [cmd[0], "-c", AVERAGE, *cmd[1:]]
        budget.average_cmd = average_cmd
    elif mode == "after-render":
        orig_render = run_table.render
        def render(spec, seeds=None):
            orig_render(spec, seeds)
            done = [r for r in spec["rows"] if os.path.exists(os.path.join(run_table.run_dir(spec, r), "result.json"))]
            if len(done) == int(arg):
                sys.stdout.flush(); os.killpg(0, signal.SIGKILL)
        run_table.render = render
    (experiment if sys.argv[1] == "experiment" else run_table).main(sys.argv[2:])
""")


@pytest.fixture(scope="module")
def budget(prepared, tmp_path_factory):  # noqa: F811
    """A budget YAML (the CPU budget, shrunk) that reuses the prepared slice."""
    path = tmp_path_factory.mktemp("budget") / "tiny.yaml"
    path.write_text(yaml.safe_dump({
        "base": "configs/multi30k/small_cpu.yaml",
        "train": {"max-update": MAX_UPDATE, "save-interval-updates": 2, "keep-interval-updates": 3,
                  "warmup-updates": 4, "max-tokens": 1000, "disable-validation": True},
        "average": {"num-update-checkpoints": 2},
        "generate": {"beam": 1, "batch-size": 500, "extra": {"max-len-a": 0, "max-len-b": 8}},
        # the same prep flags as test_end_to_end's fixture: prepare.sh finds it up to date
        "data": {"out": str(prepared), "train-lines": 3000, "bpe-merges": 1000, "subsets": ["test"],
                 "prep-flags": {"raw-dir": RAW}}}))
    return str(path)


def exp_args(budget, out, fns=("rela_g", "rela_g", "softmax")):
    return ["--out", str(out), "--arch", "rela_transformer_small", "--budget", budget, "--fns", *fns,
            "--extra", MODEL]


def start(driver_args, tmp_path):
    """Start the driver in a new process group (so that its SIGKILL spares pytest)."""
    driver = tmp_path / "driver.py"
    driver.write_text(DRIVER.format())
    return subprocess.Popen([sys.executable, str(driver), *driver_args], cwd=th.ROOT, env=th.env(),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)


def killed(driver_args, tmp_path, when=None):
    """Run the driver until it is SIGKILLed (by itself, or by us once ``when()`` is true)."""
    proc = start(driver_args, tmp_path)
    if when is not None:
        while proc.poll() is None and not when():
            time.sleep(0.005)
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    out = proc.communicate(timeout=600)[0]
    assert proc.returncode == -signal.SIGKILL, f"not killed (finished first?):\n{out[-3000:]}"
    return out


def plain(script, args):
    res = th.run([sys.executable, os.path.join(SCRIPTS, script), *args], check=False, timeout=600)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    return res.stdout + res.stderr


def leftovers(root):
    """Temp files left anywhere under ``root`` (atomic_path's, evaluate.sh's, fairseq's)."""
    return [p for p in glob.glob(os.path.join(root, "**", "*"), recursive=True) + glob.glob(
        os.path.join(root, "**", ".*"), recursive=True) if ".tmp" in os.path.basename(p)]


def avg_params(out):
    return load_checkpoint(os.path.join(out, "average_last2.pt"))["model"]


@pytest.fixture(scope="module")
def reference(budget, tmp_path_factory):
    """The same experiment, never interrupted."""
    out = tmp_path_factory.mktemp("ref") / "run"
    plain("experiment.py", exp_args(budget, out))
    return out


def test_experiment_killed_in_train_average_and_evaluate_resumes_to_the_same_result(budget, reference, tmp_path):
    out = tmp_path / "run"
    ck = out / "checkpoints"
    # 1. killed after update 5 (last checkpoint: update 4)
    killed(["train", "5", "experiment", *exp_args(budget, out)], tmp_path)
    assert load_checkpoint(str(ck / "checkpoint_last.pt"))["optimizer_history"][-1]["num_updates"] == 4
    assert not (out / "result.json").exists()
    # 2. the re-run resumes training at update 4 and is killed half-way through writing the average
    log = killed(["average", "0", "experiment", *exp_args(budget, out)], tmp_path)
    assert "Loaded checkpoint" in (out / "train.log").read_text() and "@ 4 updates" in (out / "train.log").read_text()
    half = glob.glob(str(out / ".average_last2.pt.*.tmp"))
    assert half and not (out / "average_last2.pt").exists(), log[-2000:]  # the half-written file
    ckpt_mtime = os.path.getmtime(ck / "checkpoint_last.pt")
    # 3. the re-run neither trains again nor uses the half-written average; killed in generation
    killed(["none", "0", "experiment", *exp_args(budget, out)], tmp_path,
           when=lambda: glob.glob(str(out / "eval" / ".test.generate.log.*.tmp")))
    assert os.path.getmtime(ck / "checkpoint_last.pt") == ckpt_mtime  # a finished training is not extended
    assert not glob.glob(str(out / ".average_last2.pt.*.tmp"))
    assert (out / "average_last2.pt").exists() and not (out / "eval" / "test.json").exists()
    # 4. the plain re-run evaluates and ends where the uninterrupted run ended
    plain("experiment.py", exp_args(budget, out))
    assert leftovers(str(out)) == []
    res, ref = json.loads((out / "result.json").read_text()), json.loads((reference / "result.json").read_text())
    assert res["status"] == "done" and res["updates"] == ref["updates"] == MAX_UPDATE
    assert res["scores"]["test"]["n_hyp"] == 1000
    got, want = avg_params(str(out)), avg_params(str(reference))
    assert got.keys() == want.keys()
    for key in want:
        assert torch.equal(got[key], want[key]), f"{key} differs from the uninterrupted run"
    assert (out / "eval" / "test.hyp.detok").read_bytes() == (reference / "eval" / "test.hyp.detok").read_bytes()
    assert res["scores"]["test"]["bleu"] == ref["scores"]["test"]["bleu"]


def test_experiment_child_killed_is_not_recorded_as_a_failed_run(budget, tmp_path):
    """fairseq-train dying of a signal (OOM killer, scheduler pre-emption) is no training failure:
    no ``status: failed`` result.json, which would make run_table skip the row forever."""
    out = tmp_path / "run"
    proc = start(["none", "0", "experiment", *exp_args(budget, out)], tmp_path)
    ck = out / "checkpoints" / "checkpoint_1_2.pt"
    while proc.poll() is None and not ck.exists():
        time.sleep(0.005)
    train = subprocess.run(["pgrep", "-g", str(proc.pid), "-f", "fairseq-train"], capture_output=True, text=True)
    pids = [int(p) for p in train.stdout.split()]
    assert pids, "fairseq-train not found"
    for pid in pids:
        os.kill(pid, signal.SIGKILL)
    out_text = proc.communicate(timeout=600)[0]
    assert proc.returncode != 0 and "killed by signal" in out_text, out_text[-2000:]
    assert not (out / "result.json").exists()
    plain("experiment.py", exp_args(budget, out))
    assert json.loads((out / "result.json").read_text())["status"] == "done"


def test_run_table_killed_between_rows_and_mid_row_resumes(budget, tmp_path):
    spec = {"title": "tiny", "out": str(tmp_path / "table.md"), "runs": str(tmp_path / "runs"),
            "budget": budget, "src": "en", "tgt": "de", "subsets": {"test": "test2016"}, "paper_label": "paper",
            "rows": [{"id": 1, "name": "softmax", "arch": "rela_transformer_small",
                      "fns": ["softmax", "softmax", "softmax"], "extra": MODEL},
                     {"id": 2, "name": "ReLA-g", "arch": "rela_transformer_small",
                      "fns": ["rela_g", "rela_g", "softmax"], "extra": MODEL}]}
    table = tmp_path / "table.yaml"
    table.write_text(yaml.safe_dump(spec))
    md, row1, row2 = tmp_path / "table.md", tmp_path / "runs" / "row1", tmp_path / "runs" / "row2"

    def rows():
        return [l for l in md.read_text().splitlines() if l.startswith("| ") and not l.startswith("| ID")]

    # 1. killed between rows: row 1 done and rendered, row 2 not started
    killed(["after-render", "1", "run_table", "--table", str(table)], tmp_path)
    assert md.read_text().rstrip().endswith("git commit of each row above._")  # complete file
    assert "| done |" in rows()[0] and "pending" in rows()[1] and not row2.exists()
    row1_result = (row1 / "result.json").read_bytes()
    row1_mtime = os.path.getmtime(row1 / "result.json")
    rendered = md.read_bytes()
    # 2. killed in row 2's training, after update 3 (last checkpoint: update 2)
    log = killed(["train", "3", "run_table", "--table", str(table)], tmp_path)
    assert "row 1 already done" in log
    assert not (row2 / "result.json").exists() and (row2 / "checkpoints" / "checkpoint_last.pt").exists()
    assert md.read_bytes() == rendered  # the table of step 1, untouched
    # 3. the plain re-run: row 1 is not re-run, row 2 resumes from its checkpoint
    log = plain("run_table.py", ["--table", str(table)])
    assert "row 1 already done" in log
    assert (row1 / "result.json").read_bytes() == row1_result and os.path.getmtime(row1 / "result.json") == row1_mtime
    train_log = (row2 / "train.log").read_text()
    assert "@ 2 updates" in train_log
    assert json.loads((row2 / "result.json").read_text())["updates"] == MAX_UPDATE
    assert all("| done |" in r for r in rows()) and "resumed 1 time(s)" in md.read_text()
    assert leftovers(str(tmp_path / "runs")) == [] and not glob.glob(str(tmp_path / ".table.md.*"))


def test_a_changed_configuration_is_refused_with_its_differences(budget, reference, tmp_path):
    """Issue 21.1: a finished run re-run with other attention functions must not reuse the old
    checkpoint and scores under the new name: refused, naming what changed; --force-new starts over."""
    out = tmp_path / "run"
    shutil.copytree(reference, out)
    before = (out / "result.json").read_bytes()
    res = th.run([sys.executable, os.path.join(SCRIPTS, "experiment.py"),
                  *exp_args(budget, out, fns=("softmax", "softmax", "softmax"))], check=False, timeout=600)
    assert res.returncode != 0
    msg = res.stdout + res.stderr
    assert "another configuration" in msg and "fns: ['rela_g', 'rela_g', 'softmax'] -> ['softmax', 'softmax', 'softmax']" in msg
    assert "--force-new" in msg and (out / "result.json").read_bytes() == before
    # the same configuration continues (nothing to do: the finished result is rewritten unchanged)
    plain("experiment.py", exp_args(budget, out))
    assert json.loads((out / "result.json").read_text())["attention_fns"]["encoder"] == "rela_g"
    # --force-new: the old run is removed and the new configuration trained from scratch
    plain("experiment.py", [*exp_args(budget, out, fns=("softmax", "softmax", "softmax")), "--force-new"])
    new = json.loads((out / "result.json").read_text())
    assert new["attention_fns"] == {"encoder": "softmax", "decoder": "softmax", "cross": "softmax"}
    assert "Loaded checkpoint" not in (out / "train.log").read_text()  # trained from scratch


def test_an_interrupted_re_evaluation_never_mixes_two_checkpoints(reference, tmp_path):
    """Issue 21.2: evaluating another checkpoint into a directory that holds scores of the first
    removes those first, so a kill during generation leaves fewer subsets, never a mix; every
    S.json names the checkpoint (SHA-256) that produced it."""
    from mt_pipeline.evaluate import checkpoint_sha256, done_subsets

    res = json.loads((reference / "result.json").read_text())
    eval_dir = tmp_path / "eval"
    shutil.copytree(reference / "eval", eval_dir)
    first = reference / "average_last2.pt"
    assert json.loads((eval_dir / "test.json").read_text())["checkpoint_sha256"] == checkpoint_sha256(str(first))
    # every subset of the first checkpoint goes, also one not asked for now (test1)
    stale = dict(json.loads((eval_dir / "test.json").read_text()), subset="test1")
    (eval_dir / "test1.json").write_text(json.dumps(stale))
    from mt_pipeline.atomic import OwnedFiles

    OwnedFiles(str(eval_dir), "mt-evaluate").adopt(["test1.json"])  # as mt-evaluate records what it writes
    other = reference / "checkpoints" / "checkpoint_last.pt"
    prep = os.path.join(th.ROOT, res["data"]["prep_dir"])
    args = ["-m", "mt_pipeline.evaluate", "--checkpoint", str(other), "--data-bin", os.path.join(prep, "bin"),
            "--prep-dir", prep, "--src", "en", "--tgt", "de", "--subsets", "test", "--beam", "1",
            "--batch-size", "500", "--extra", "--max-len-a 0 --max-len-b 8", "--out", str(eval_dir)]
    proc = subprocess.Popen([sys.executable, *args], cwd=th.ROOT, env=th.env(), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    while proc.poll() is None and not glob.glob(str(eval_dir / ".test.generate.log.*.tmp")):
        time.sleep(0.005)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=60)
    left = sorted(os.path.basename(p) for p in glob.glob(str(eval_dir / "*")))
    assert not any(n.startswith(("test.", "test1.")) for n in left), left  # nothing of the first checkpoint
    assert done_subsets(str(eval_dir), checkpoint_sha256(str(first)), ["test", "test1"]) == []
    # the plain re-run completes for the second checkpoint and records it
    out = th.run([sys.executable, *args], check=False, timeout=600)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    got = json.loads((eval_dir / "test.json").read_text())
    assert got["checkpoint_sha256"] == checkpoint_sha256(str(other)) and got["checkpoint"] == str(other)
    assert leftovers(str(eval_dir)) == []
