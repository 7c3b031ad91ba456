"""Faults: SIGKILL mid-epoch, kills while a checkpoint is written, killed data-prep.

Training kills are injected by a driver that runs ``scripts/train_distributed.py`` (one process)
after wrapping, in that process only, one fairseq function so that the process SIGKILLs itself
at a chosen point: after update K (mid-epoch; last checkpoint at an earlier update), half-way
through ``torch.save`` of the checkpoint of update K, or half-way through fairseq's copy of it
to ``checkpoint_last.pt``.  The re-run is the plain, unwrapped command.  Reference: the same
command never interrupted.  fairseq stores the epoch iterator position in the checkpoint and
re-seeds the RNG from ``seed + num_updates`` each update, so a resume is bit-exact on CPU
(dropout 0.1 on, to exercise the RNG): parameters are compared with ``torch.equal``.
"""

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
import torch

import train_helpers as th
from fairseq_plugins.checkpoint import checkpoint_is_complete, load_checkpoint, repair_last_checkpoint

LAUNCH = os.path.join(th.ROOT, "scripts", "train_distributed.py")  # the thin entry point of mt_pipeline.launch
EXTRA = ("--max-update", "30", "--save-interval-updates", "5", "--disable-validation", "--dropout", "0.1",
         "--criterion", "label_smoothed_cross_entropy_with_reg", "--label-smoothing", "0.1")
# 192 pairs / batch 8 = 24 updates per epoch: update 17 is mid-epoch 1, 30 is in epoch 2

DRIVER = textwrap.dedent("""
    import io, os, signal, sys
    mode, k = sys.argv.pop(1), int(sys.argv.pop(1))
    import torch
    from fairseq import checkpoint_utils, trainer
    from fairseq.file_io import PathManager

    def die():
        sys.stdout.flush(); sys.stderr.flush()
        os.kill(os.getpid(), signal.SIGKILL)

    if mode == "after-update":
        orig = trainer.Trainer.set_num_updates
        def set_num_updates(self, n):
            orig(self, n)
            if n == k:
                die()
        trainer.Trainer.set_num_updates = set_num_updates
    elif mode == "during-save":
        real = torch.save
        def save(obj, f, *a, **kw):
            if isinstance(obj, dict) and obj.get("optimizer_history", [{{}}])[-1].get("num_updates") == k:
                buf = io.BytesIO(); real(obj, buf, *a, **kw); data = buf.getvalue()
                f.write(data[: len(data) // 2]); f.flush(); os.fsync(f.fileno())
                die()
            return real(obj, f, *a, **kw)
        torch.save = save
    elif mode == "during-copy":
        real_copy = PathManager.copy
        def copy(src, dst, overwrite=False):
            if dst.endswith("checkpoint_last.pt") and src.endswith("_%d.pt" % k):
                data = open(src, "rb").read()
                with open(dst, "wb") as f:
                    f.write(data[: len(data) // 2]); f.flush(); os.fsync(f.fileno())
                die()
            return real_copy(src, dst, overwrite)
        PathManager.copy = staticmethod(copy)
    from mt_pipeline import launch
    launch.main()
""")


@pytest.fixture(scope="module")
def data_bin(tmp_path_factory):
    return th.make_databin(str(tmp_path_factory.mktemp("toy")))


@pytest.fixture(scope="module")
def reference(data_bin, tmp_path_factory):
    ck = str(tmp_path_factory.mktemp("ref"))
    th.run([os.path.join(th.BIN, "fairseq-train"), *th.train_args(data_bin, ck, *EXTRA)], timeout=300)
    return th.params(os.path.join(ck, "checkpoint_last.pt"))


def _killed(data_bin, ck, mode, k, tmp_path):
    driver = tmp_path / "driver.py"
    driver.write_text(DRIVER.format())
    res = th.run([sys.executable, str(driver), mode, str(k), *th.train_args(data_bin, ck, *EXTRA)],
                 check=False, timeout=300)
    assert res.returncode == -signal.SIGKILL, res.stderr[-2000:]
    return res


def _num_updates(path):
    return load_checkpoint(path)["optimizer_history"][-1]["num_updates"]


def _assert_same(params, reference):
    assert params.keys() == reference.keys()
    for key in reference:
        assert torch.equal(params[key], reference[key]), f"{key} differs after resume"


def test_sigkill_mid_epoch_then_same_command_resumes_bit_exact(data_bin, reference, tmp_path):
    ck = str(tmp_path / "ck")
    _killed(data_bin, ck, "after-update", 17, tmp_path)
    last = os.path.join(ck, "checkpoint_last.pt")
    state = load_checkpoint(last)
    assert state["optimizer_history"][-1]["num_updates"] == 15  # update 16, 17 were lost with the process
    itr = state["extra_state"]["train_iterator"]
    assert itr["epoch"] == 1 and itr["iterations_in_epoch"] == 15  # a mid-epoch checkpoint
    res = th.run([os.path.join(th.BIN, "fairseq-train"), *th.train_args(data_bin, ck, *EXTRA)], timeout=300)
    assert "Loaded checkpoint" in res.stdout + res.stderr and "@ 15 updates" in res.stdout + res.stderr
    _assert_same(th.params(last), reference)


def test_kill_during_torch_save_keeps_previous_checkpoint(data_bin, reference, tmp_path):
    ck = str(tmp_path / "ck")
    _killed(data_bin, ck, "during-save", 10, tmp_path)
    last = os.path.join(ck, "checkpoint_last.pt")
    assert os.path.exists(os.path.join(ck, "checkpoint_1_10.pt.tmp"))  # the half-written file
    assert not os.path.exists(os.path.join(ck, "checkpoint_1_10.pt"))
    assert checkpoint_is_complete(last) and _num_updates(last) == 5  # fairseq's tmp + rename
    th.run([sys.executable, LAUNCH, *th.train_args(data_bin, ck, *EXTRA)], timeout=300)
    assert not os.path.exists(os.path.join(ck, "checkpoint_1_10.pt.tmp"))
    _assert_same(th.params(last), reference)


def test_kill_during_copy_to_checkpoint_last_is_repaired(data_bin, reference, tmp_path):
    """fairseq copies checkpoint_last.pt into place non-atomically; the launcher repairs it."""
    ck = str(tmp_path / "ck")
    _killed(data_bin, ck, "during-copy", 10, tmp_path)
    last = os.path.join(ck, "checkpoint_last.pt")
    assert not checkpoint_is_complete(last)  # torn
    assert checkpoint_is_complete(os.path.join(ck, "checkpoint_1_10.pt"))
    # plain fairseq-train cannot resume from the torn file ...
    res = th.run([os.path.join(th.BIN, "fairseq-train"), *th.train_args(data_bin, ck, *EXTRA)],
                 check=False, timeout=300)
    assert res.returncode != 0
    # ... the same command through the launcher restores it from checkpoint_1_10.pt and resumes
    res = th.run([sys.executable, LAUNCH, *th.train_args(data_bin, ck, *EXTRA)], timeout=300)
    assert "restored it from checkpoint_1_10.pt" in res.stderr + res.stdout
    assert os.path.exists(last + ".torn")
    _assert_same(th.params(last), reference)


def test_repair_refuses_when_nothing_complete_is_left(tmp_path):
    (tmp_path / "checkpoint_last.pt").write_bytes(b"PK\x03\x04 truncated")
    with pytest.raises(RuntimeError, match="no complete checkpoint"):
        repair_last_checkpoint(str(tmp_path))
    assert repair_last_checkpoint(str(tmp_path / "absent")) is None


# ---------------------------------------------------------------------------------------------
# data-prep killed and re-run
# ---------------------------------------------------------------------------------------------
def _tree(root):
    out = {}
    for d, _, files in os.walk(root):
        for f in files:
            p = os.path.join(d, f)
            rel = os.path.relpath(p, root)
            if rel.startswith("logs") or rel == ".lock" or rel.endswith("preprocess.log"):
                continue
            out[rel] = open(p, "rb").read()
    return out


def _raw_dir(path):
    import gzip

    os.makedirs(path, exist_ok=True)
    words = "a man in a red shirt rides a bike down the street while two dogs run".split()
    for split, n in (("train", 400), ("val", 20), ("test_2016_flickr", 20), ("test_2017_flickr", 20)):
        for lang in ("en", "de"):
            lines = [" ".join(words[(i + j) % len(words)] for j in range(3 + i % 7)) + f" {lang} ." for i in range(n)]
            with gzip.open(os.path.join(path, f"{split}.{lang}.gz"), "wb") as f:
                f.write(("\n".join(lines) + "\n").encode())


@pytest.mark.parametrize("kill_after", ["raw/.done"])  # i.e. during the tok stage
def test_dataprep_killed_and_rerun_equals_clean_run(tmp_path, kill_after):
    raw = str(tmp_path / "raw_in")
    _raw_dir(raw)
    env = th.env()
    env["PYTHON"] = sys.executable
    cmd = ["bash", os.path.join(th.ROOT, "data-prep", "multi30k", "prepare.sh"), "--raw-dir", raw,
           "--no-checksum", "--workers", "1", "--bpe-merges", "50"]
    clean, killed = tmp_path / "clean", tmp_path / "killed"
    subprocess.run(cmd + ["--out", str(clean)], env=env, check=True, capture_output=True, timeout=300)
    proc = subprocess.Popen(cmd + ["--out", str(killed)], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    while proc.poll() is None and not (killed / kill_after).exists():
        time.sleep(0.005)
    os.killpg(proc.pid, signal.SIGKILL)  # the script and the stage it is running
    proc.wait()
    assert proc.returncode == -signal.SIGKILL, "finished before the kill; nothing tested"
    res = subprocess.run(cmd + ["--out", str(killed)], env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    assert f"{kill_after.split('/')[0]}: up to date" in res.stdout  # the finished stage was kept
    got, want = _tree(killed), _tree(clean)
    assert sorted(got) == sorted(want)  # no leftover temp file, nothing missing
    for rel in want:
        assert got[rel] == want[rel], rel
