"""End to end on real data: data-prep -> fairseq-train --user-dir -> fairseq-generate -> sacrebleu.

Uses a 3,000-pair slice of the real Multi30k En-De training set (../shared/data) and the full
test_2016_flickr set, a 2+2-layer ReLA-g model and a few hundred updates: it checks that the
pipeline runs and learns, not the BLEU of a trained model.
"""

import json
import math
import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RAW = os.path.join(os.path.dirname(ROOT), "shared", "data", "multi30k_en_de", "raw")
BIN = os.path.dirname(sys.executable)

pytestmark = pytest.mark.skipif(not os.path.isdir(RAW), reason=f"real data not found at {RAW}")


def sh(cmd, **kw):
    env = {k: v for k, v in os.environ.items() if not k.startswith("TORCH_FORCE")}
    env["PATH"] = BIN + os.pathsep + env.get("PATH", "")
    out = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, **kw)
    assert out.returncode == 0, f"{cmd}\nSTDOUT:{out.stdout[-3000:]}\nSTDERR:{out.stderr[-3000:]}"
    return out.stdout + out.stderr


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    out = tmp_path_factory.mktemp("m30k")
    sh(["bash", "data-prep/multi30k/prepare.sh", "--raw-dir", RAW, "--out", str(out),
        "--train-lines", "3000", "--bpe-merges", "1000"])
    return out


def train_cmd(prepared, save_dir, *extra):
    """fairseq-train of a tiny (2+2 layers, d 64) ReLA-g model on the prepared slice."""
    return [os.path.join(BIN, "fairseq-train"), str(prepared / "bin"), "--user-dir", "fairseq_plugins",
            "--arch", "rela_transformer_small", "--encoder-layers", "2", "--decoder-layers", "2",
            "--encoder-embed-dim", "64", "--decoder-embed-dim", "64", "--encoder-ffn-embed-dim", "128",
            "--decoder-ffn-embed-dim", "128", "--encoder-attention-heads", "2", "--decoder-attention-heads", "2",
            "--source-lang", "en", "--target-lang", "de", "--optimizer", "adam", "--adam-betas", "(0.9,0.98)",
            "--lr", "0.003", "--criterion", "label_smoothed_cross_entropy", "--max-tokens", "2000",
            "--save-dir", str(save_dir), "--cpu", "--no-epoch-checkpoints", "--log-format", "simple",
            "--num-workers", "0", *extra]


SCHEDULE = ("--lr-scheduler", "inverse_sqrt", "--warmup-updates", "50", "--label-smoothing", "0.1",
            "--dropout", "0.1", "--seed", "1", "--save-interval-updates", "80", "--keep-interval-updates", "2",
            "--log-interval", "20")


@pytest.fixture(scope="module")
def trained(prepared, tmp_path_factory):
    ck = tmp_path_factory.mktemp("ck")
    log = sh(train_cmd(prepared, ck, "--max-update", "240", *SCHEDULE))
    return ck, log


def test_train_learns(trained):
    _, log = trained
    losses = [float(l.split("| loss ")[1].split()[0]) for l in log.splitlines() if "| valid |" in l]
    assert len(losses) >= 2
    assert losses[-1] < losses[0] - 1.0, losses  # validation loss falls by > 1 bit


def test_resume_from_checkpoint_last(trained, prepared):
    ck, _ = trained
    import shutil
    import tempfile

    d = tempfile.mkdtemp()
    shutil.copy(ck / "checkpoint_last.pt", d)
    log = sh(train_cmd(prepared, d, "--max-update", "250", *SCHEDULE))  # the same command, longer
    assert "Loaded checkpoint" in log and "num_updates 250" in log.replace("=", " ")
    # it resumed at update 240 (fairseq: "Loaded checkpoint ... (epoch N @ 240 updates)") and counted
    # on from there: no progress, valid or save line after loading reports an update count <= 240
    loaded = re.findall(r"Loaded checkpoint \S+ \(epoch \d+ @ (\d+) updates\)", log)
    assert loaded == ["240"], loaded
    after = log[log.index("Loaded checkpoint"):].replace("=", " ")
    updates = [int(u) for u in re.findall(r"num_updates (\d+)", after)]
    updates += [int(u) for u in re.findall(r"Saved checkpoint \S+ \(epoch \d+ @ (\d+) updates", after)]
    assert updates and min(updates) > 240 and max(updates) == 250, updates


def test_average_generate_score(trained, prepared, tmp_path):
    ck, _ = trained
    avg = tmp_path / "avg.pt"
    sh([sys.executable, "scripts/average_checkpoints.py", "--inputs", str(ck), "--num-update-checkpoints", "2",
        "--output", str(avg)])
    # the average is the mean of the two newest interval checkpoints (updates 160 and 240), parameter by
    # parameter; the rest (integer buffers, cfg, optimizer history) is the newest one's
    import torch

    from fairseq_plugins.checkpoint import load_checkpoint
    from mt_pipeline.averaging import select_checkpoints

    paths = select_checkpoints([str(ck)], num_update=2)
    assert [os.path.basename(p).split("_")[-1] for p in paths] == ["160.pt", "240.pt"], paths
    a, b = (load_checkpoint(p)["model"] for p in paths)
    out_state = load_checkpoint(str(avg))
    m = out_state["model"]
    assert list(m) == list(b) and out_state["optimizer_history"][-1]["num_updates"] == 240
    n_float = n_differ = 0
    for k, v in m.items():
        if torch.is_tensor(v) and v.is_floating_point():
            n_differ += not torch.equal(a[k], b[k])
            mean = ((a[k].double() + b[k].double()) / 2).to(v.dtype)
            assert v.dtype == b[k].dtype and v.shape == b[k].shape, k
            torch.testing.assert_close(v, mean, msg=lambda s, k=k: f"{k}: {s}")  # dtype's default tolerance
            n_float += 1
        else:
            assert torch.equal(v, b[k]) if torch.is_tensor(v) else v == b[k], k
    assert n_float > 20 and n_differ > 20, (n_float, n_differ)  # trained between 160 and 240: a real mean
    out = sh(["bash", "scripts/evaluate.sh", "--checkpoint", str(avg), "--data-bin", str(prepared / "bin"),
              "--prep-dir", str(prepared), "--src", "en", "--tgt", "de", "--subsets", "test",
              "--batch-size", "250", "--out", str(tmp_path / "eval")])
    res = json.load(open(tmp_path / "eval" / "test.json"))
    assert res["n_hyp"] == res["n_ref"] == 1000  # nothing silently dropped
    assert res["signature"].startswith("nrefs:1|case:mixed|eff:no|tok:13a")
    assert 0.0 < res["bleu"] < 100.0 and res["tok_bleu"] > 0.0
    assert "BLEU" in out
    # where the evaluation's time went: the generate process (start-up, loading, decoding), then scoring
    assert res["seconds"]["generate"] > 0.5 and res["seconds"]["extract_and_score"] > 0, res["seconds"]
    assert re.search(r"\[evaluate\] test: fairseq-generate \d+\.\d s, extraction and scoring", out), out


def test_fairseq_interactive_loads_plugin_checkpoint(trained, prepared):
    ck, _ = trained
    env = {k: v for k, v in os.environ.items() if not k.startswith("TORCH_FORCE")}
    out = subprocess.run(
        [os.path.join(BIN, "fairseq-interactive"), str(prepared / "bin"), "--user-dir", "fairseq_plugins",
         "--path", str(ck / "checkpoint_last.pt"), "--source-lang", "en", "--target-lang", "de",
         "--tokenizer", "moses", "--bpe", "subword_nmt", "--bpe-codes", str(prepared / "bpe" / "codes"),
         "--beam", "4", "--cpu"],
        cwd=ROOT, env=env, input="A man is riding a bike.\nTwo dogs play in the snow.\n",
        capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    hyps = [l for l in out.stdout.splitlines() if l.startswith("D-")]
    assert len(hyps) == 2


def test_reluformer_with_regulariser_trains_and_generates(prepared, tmp_path):
    """ReLUFormer + label_smoothed_cross_entropy_with_reg: every term is logged, training and
    validation stay finite, and fairseq-generate + sacrebleu score the full test set."""
    ck = tmp_path / "ck"
    log = sh(train_cmd(prepared, ck, "--max-update", "80", *SCHEDULE,
                       "--arch", "reluformer_small", "--criterion", "label_smoothed_cross_entropy_with_reg",
                       "--reg-weight", "1.0", "--attention-entropy"))
    valid = [l for l in log.splitlines() if "| valid |" in l]
    assert valid, log[-2000:]
    for name in ("reluformer_norm", "reluformer_entropy", "reg_loss", "attn_entropy", "attn_null_rate"):
        assert f"| {name} " in valid[-1], valid[-1]
    value = float(valid[-1].split("| attn_entropy ")[1].split()[0])
    assert math.isfinite(value) and value > 0
    out = sh(["bash", "scripts/evaluate.sh", "--checkpoint", str(ck / "checkpoint_last.pt"),
              "--data-bin", str(prepared / "bin"), "--prep-dir", str(prepared), "--src", "en", "--tgt", "de",
              "--subsets", "test", "--batch-size", "250", "--out", str(tmp_path / "eval")])
    res = json.load(open(tmp_path / "eval" / "test.json"))
    assert res["n_hyp"] == res["n_ref"] == 1000 and "BLEU" in out


def test_tensorboard_logdir_writes_curves(prepared, tmp_path):
    """``--tensorboard-logdir`` (the ``[tensorboard]`` extra) writes the training and validation loss
    curves as TensorBoard event files; without the package fairseq only logs "tensorboard not
    found" and writes nothing, which is what the extra exists to prevent."""
    pytest.importorskip("tensorboard", reason="the [tensorboard] extra is not installed")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    tb = tmp_path / "tb"
    sh(train_cmd(prepared, tmp_path / "ck", "--max-update", "6", "--log-interval", "2",
                 "--tensorboard-logdir", str(tb)))
    curves = {}
    for sub in ("train_inner", "valid"):
        acc = EventAccumulator(str(tb / sub))
        acc.Reload()
        assert "loss" in acc.Tags()["scalars"], (sub, acc.Tags())
        curves[sub] = [(e.step, e.value) for e in acc.Scalars("loss")]
    assert [s for s, _ in curves["train_inner"]] == [2, 4, 6]
    assert all(math.isfinite(v) and v > 0 for _, v in curves["train_inner"] + curves["valid"])
