"""Bad input fails early and loudly, naming what is wrong, and leaves no partial output.

* data-prep (``data-prep/multi30k/prepare.sh``, ``mt_pipeline.prep.textio.check_parallel``) on corrupt raw
  text: unequal line counts, empty and over-long lines, invalid UTF-8, a missing file, a file
  that is not gzip -- the message names the file (and line) and ``<out>/raw`` is never created;
* model/criterion flags: out-of-range hyper-parameters fail at start-up (``validate_args``,
  ``fairseq-train``), legal-but-suspicious combinations warn;
* ``label_smoothed_cross_entropy_with_reg`` on a model without auxiliary losses warns once;
* ``--fp16`` / ``--bf16`` the machine cannot train with fail at start-up (issue 21, items 7-8).
"""

import argparse
import gzip
import importlib.util
import logging
import os
import subprocess
import sys

import pytest
import torch
from fairseq import options

from fairseq_plugins.models.transformer import AttentionTransformerModel, validate_args
from helpers import toy_task
import train_helpers as th

ROOT = th.ROOT
PREP = os.path.join(ROOT, "data-prep", "multi30k", "prepare.sh")
SPLITS = ("train", "val", "test_2016_flickr", "test_2017_flickr")


def _write_raw(raw_dir, overrides=None, drop=None):
    """Eight small valid .gz files; ``overrides[(split, lang)] = bytes`` replaces one file's text."""
    os.makedirs(raw_dir, exist_ok=True)
    for split in SPLITS:
        for lang in ("en", "de"):
            data = "".join(f"a {lang} sentence number {i} .\n" for i in range(6)).encode()
            data = (overrides or {}).get((split, lang), data)
            if (split, lang) == drop:
                continue
            path = os.path.join(raw_dir, f"{split}.{lang}.gz")
            if data is None:
                with open(path, "wb") as f:
                    f.write(b"not gzip at all\n")
            else:
                with gzip.open(path, "wb") as f:
                    f.write(data)


GOOD = b"".join(b"a sentence number %d .\n" % i for i in range(6))
CASES = {
    "unequal line counts": ({("train", "de"): GOOD + b"one more .\n"}, None,
                            ["train.en.gz has 6 lines", "train.de.gz has 7"]),
    "empty line": ({("train", "de"): GOOD.replace(b"a sentence number 3 .", b"   ")}, None, ["train.de.gz", ":4: empty line"]),
    "over-long line": ({("val", "en"): GOOD.replace(b"number 2 .", b"w " * 300)}, None,
                       ["val.en.gz", ":3: 302 words, more than --max-words 250"]),
    "invalid UTF-8": ({("train", "en"): GOOD.replace(b"number 4", b"n\xc3\x28mber 4")}, None,
                      ["train.en.gz", ":5: invalid UTF-8"]),
    "missing file": ({}, ("test_2017_flickr", "de"), ["missing input", "test_2017_flickr.de.gz"]),
    "not gzip": ({("val", "de"): None}, None, ["cannot decompress", "val.de.gz"]),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_dataprep_refuses_corrupt_raw_text_and_writes_nothing(case, tmp_path):
    overrides, drop, expected = CASES[case]
    raw, out = str(tmp_path / "raw"), tmp_path / "out"
    _write_raw(raw, overrides, drop)
    env = th.env()
    env["PYTHON"] = sys.executable
    res = subprocess.run(["bash", PREP, "--raw-dir", raw, "--out", str(out), "--no-checksum", "--workers", "1"],
                         env=env, capture_output=True, text=True, timeout=120)
    assert res.returncode != 0
    for piece in expected:
        assert piece in res.stderr, (piece, res.stderr)
    left = sorted(os.listdir(out)) if out.exists() else []
    assert "raw" not in left and not any(".tmp." in name for name in left), left
    assert not (out / "tok").exists() and not (out / "bin").exists()


def test_check_parallel_accepts_good_text_and_reports_every_problem(tmp_path):
    from mt_pipeline.prep.textio import check_parallel

    a, b = tmp_path / "x.en", tmp_path / "x.de"
    a.write_bytes(GOOD)
    b.write_bytes(GOOD)
    assert check_parallel([str(a), str(b)]) == []
    b.write_bytes(GOOD.replace(b"a sentence number 1 .", b"").replace(b"number 5", b"\xff"))
    problems = check_parallel([str(a), str(b)], max_words=3)
    assert any(p.startswith(f"{b}:2: empty line") for p in problems)
    assert any(p.startswith(f"{b}:6: invalid UTF-8") for p in problems)
    assert any(p.startswith(f"{a}:1: 5 words") for p in problems)


MARUF = os.path.join(os.path.dirname(ROOT), "shared", "data", "docmt_maruf2019_en_de")


@pytest.mark.skipif(not os.path.isdir(MARUF), reason=f"real data not found at {MARUF}")
@pytest.mark.parametrize("case", ["empty line", "invalid UTF-8", "line counts differ"])
def test_long_documents_prep_refuses_corrupt_maruf_input_and_writes_nothing(case, tmp_path):
    """data-prep/long_documents/prepare.sh runs check-parallel on its line-aligned inputs (the real
    Maruf dev/test files, one of them corrupted) before anything is written."""
    data = tmp_path / "data" / "docmt_maruf2019_en_de"
    for sub in os.listdir(MARUF):
        if os.path.isdir(os.path.join(MARUF, sub)):
            (data / sub).mkdir(parents=True)
            for name in os.listdir(os.path.join(MARUF, sub)):
                os.symlink(os.path.join(MARUF, sub, name), data / sub / name)
    bad = data / "nc2016" / "test.de.gz"
    lines = gzip.open(bad, "rb").read().split(b"\n")
    if case == "empty line":
        lines[2] = b"  "
        expected = f"{bad}:3: empty line"
    elif case == "invalid UTF-8":
        lines[4] = lines[4][:5] + b"\xc3\x28" + lines[4][5:]
        expected = f"{bad}:5: invalid UTF-8 at byte 5"
    else:
        del lines[7]
        expected = "line counts differ"
    os.unlink(bad)
    with gzip.open(bad, "wb") as f:
        f.write(b"\n".join(lines))
    out = tmp_path / "out"
    env = th.env()
    env["PYTHON"] = sys.executable
    res = subprocess.run(["bash", os.path.join(ROOT, "data-prep", "long_documents", "prepare.sh"),
                          "--data-dir", str(tmp_path / "data"), "--out", str(out), "--workers", "1"],
                         env=env, capture_output=True, text=True, timeout=120)
    assert res.returncode != 0
    assert expected in res.stderr and "nothing written" in res.stderr, res.stderr[-2000:]
    left = sorted(os.listdir(out)) if out.exists() else []
    assert set(left) <= {".lock"}, left  # no sent/, tok/, ... nor temp file


def test_long_documents_check_inputs_accepts_the_real_maruf_files():
    if not os.path.isdir(MARUF):
        pytest.skip(f"real data not found at {MARUF}")
    from mt_pipeline.prep.longdoc.sources import check_inputs
    from mt_pipeline.prep.textio import MAX_WORDS

    assert check_inputs(os.path.dirname(MARUF), None, MAX_WORDS) == []


# ---------------------------------------------------------------------------------------------
# model / criterion flags
# ---------------------------------------------------------------------------------------------
def _parse(*extra, arch="reluformer_small"):
    parser = options.get_training_parser()
    return options.parse_args_and_arch(parser, ["/nonexistent", "--arch", arch, "--task", "translation",
                                                "--user-dir", os.path.join(ROOT, "fairseq_plugins"), *extra])


@pytest.mark.parametrize("flags,match", [
    (("--reluformer-gamma", "0"), "--reluformer-gamma must be a finite number > 0"),  # was silently 1.0
    (("--reluformer-gamma=-1",), "--reluformer-gamma must be a finite number > 0"),
    (("--reluformer-gamma", "nan"), "--reluformer-gamma"),
    (("--reluformer-entropy-c=-0.1",), "--reluformer-entropy-c must be a finite number >= 0"),
    (("--rela-norm-eps", "0"), "--rela-norm-eps must be a finite number > 0"),  # was silently 1e-8
    (("--rela-norm-eps=-1e-6",), "--rela-norm-eps"),
])
def test_out_of_range_hyper_parameters_fail_at_build(flags, match):
    args = _parse(*flags)
    with pytest.raises(ValueError, match=match):
        AttentionTransformerModel.build_model(args, toy_task())


def test_suspicious_combinations_warn(caplog):
    caplog.set_level(logging.WARNING, logger="fairseq_plugins.models.transformer")
    validate_args(_parse("--criterion", "label_smoothed_cross_entropy", "--attention-entropy",
                         "--reluformer-entropy-c", "1.5"))
    text = caplog.text
    assert "ignores it" in text and "label_smoothed_cross_entropy_with_reg" in text
    assert "--attention-entropy" in text and "always 0" in text
    caplog.clear()
    validate_args(_parse("--reluformer-gamma", "2", arch="rela_transformer_small"))
    assert "--reluformer-gamma given but no attention type uses a ReLUFormer function" in caplog.text
    caplog.clear()
    validate_args(_parse("--criterion", "label_smoothed_cross_entropy_with_reg"))  # the intended setup
    assert caplog.text == ""


@pytest.fixture(scope="module")
def data_bin(tmp_path_factory):
    return th.make_databin(str(tmp_path_factory.mktemp("toy")))


@pytest.mark.parametrize("extra,message", [
    (("--reluformer-gamma=-2",), "--reluformer-gamma must be a finite number > 0"),
    (("--criterion", "label_smoothed_cross_entropy_with_reg", "--reg-weight=-1"), "--reg-weight must be a finite number >= 0"),
    (("--encoder-attention-fn", "relu2"), "invalid choice: 'relu2'"),
    # issue 21 item 3: these passed start-up and failed after the first update (crash.pt), or, for
    # --eatt-tau inf, trained on all-zero binarised inputs
    (("--arch", "eatt_transformer_small", "--eatt-tau", "nan"), "--eatt-tau must be a finite number, got nan"),
    (("--arch", "eatt_transformer_small", "--eatt-tau", "inf"), "--eatt-tau must be a finite number, got inf"),
    (("--criterion", "label_smoothed_cross_entropy_with_reg", "--reg-weight", "nan"),
     "--reg-weight must be a finite number >= 0, got nan"),
])
def test_fairseq_train_fails_at_start_up(data_bin, tmp_path, extra, message):
    res = th.run([os.path.join(th.BIN, "fairseq-train"),
                  *th.train_args(data_bin, str(tmp_path / "ck"), "--max-update", "1", *extra)],
                 check=False, timeout=120)
    assert res.returncode != 0 and message in res.stderr, res.stderr[-2000:]
    assert "begin training" not in res.stdout + res.stderr
    assert not os.path.exists(tmp_path / "ck" / "checkpoint_last.pt")
    assert not os.path.exists(tmp_path / "ck" / "crash.pt")
    if "relu2" in extra:
        assert "reluformer" in res.stderr and "softmax" in res.stderr  # the valid choices


# ---------------------------------------------------------------------------------------------
# label_smoothed_cross_entropy_with_reg on a model without auxiliary losses (issue 21, item 7)
# ---------------------------------------------------------------------------------------------
def _with_reg_sample(task):
    from helpers import toy_batch

    src, src_lengths, prev = toy_batch(task, bsz=3, src_len=7, tgt_len=6)
    target = torch.cat([prev[:, 1:], torch.full((3, 1), task.target_dictionary.eos())], 1)
    return {"net_input": {"src_tokens": src, "src_lengths": src_lengths, "prev_output_tokens": prev},
            "target": target, "ntokens": target.numel()}


@pytest.mark.parametrize("arch,reg_weight,warns", [
    ("rela_transformer_small", 1.0, True),   # ReLA: no regulariser -> plain CE: the probe
    ("reluformer_small", 1.0, False),        # ReLUFormer eq. 7: the intended setup
    ("rela_transformer_small", 0.0, False),  # --reg-weight 0: plain CE asked for
])
def test_reg_criterion_warns_once_when_the_model_reports_no_auxiliary_loss(caplog, arch, reg_weight, warns):
    from fairseq_plugins.criterions import LabelSmoothedCrossEntropyWithRegCriterion
    from helpers import build

    caplog.set_level(logging.WARNING, logger="fairseq_plugins.criterions.label_smoothed_cross_entropy_with_reg")
    torch.manual_seed(0)
    model, task = build(arch, encoder_layers=1, decoder_layers=1)
    sample = _with_reg_sample(task)
    crit = LabelSmoothedCrossEntropyWithRegCriterion(task, sentence_avg=False, label_smoothing=0.1,
                                                     reg_weight=reg_weight)
    model.eval()
    crit(model, sample)  # validation passes never warn (nothing is trained)
    assert caplog.text == ""
    model.train()
    for _ in range(3):
        loss, _, log = crit(model, sample)
    if warns:  # once per criterion instance, and the loss is exactly label-smoothed CE
        assert caplog.text.count("reports no auxiliary loss") == 1, caplog.text
        assert "trains plain label-smoothed cross-entropy and --reg-weight 1 has no effect" in caplog.text
        assert "AttentionTransformerModel" in caplog.text and "reg_loss" not in "".join(log)
        from fairseq.criterions.label_smoothed_cross_entropy import LabelSmoothedCrossEntropyCriterion

        plain, _, _ = LabelSmoothedCrossEntropyCriterion(task, False, 0.1)(model, sample)
        torch.testing.assert_close(loss, plain)
        crit2 = LabelSmoothedCrossEntropyWithRegCriterion(task, False, 0.1, reg_weight=reg_weight)
        crit2(model, sample)
        assert caplog.text.count("reports no auxiliary loss") == 2  # a new instance warns again
    else:
        assert caplog.text == "", caplog.text


# ---------------------------------------------------------------------------------------------
# --fp16 / --bf16 on a CPU-only machine (issue 21, item 8)
# ---------------------------------------------------------------------------------------------
@pytest.mark.skipif(torch.cuda.is_available(), reason="checks a CPU-only machine")
@pytest.mark.parametrize("flag,message", [
    ("--fp16", "--fp16 needs a CUDA GPU and this machine has no CUDA GPU"),
    ("--bf16", "--bf16 needs a GPU or TPU and this machine has no CUDA GPU"),
])
def test_half_precision_flags_fail_at_start_up_on_a_cpu_only_machine(data_bin, tmp_path, flag, message):
    """Was: fairseq's Trainer died with "'NoneType' object has no attribute 'xla_device'"
    (--bf16) or "Torch not compiled with CUDA enabled" (--fp16).  Now the model's build_model
    says it, before the trainer, a checkpoint or a training step."""
    args = th.train_args(data_bin, str(tmp_path / "ck"), "--max-update", "1", flag, arch="rela_transformer_small")
    args.remove("--cpu")  # a user who does not think of --cpu (with it the message says "--cpu is given")
    res = th.run([os.path.join(th.BIN, "fairseq-train"), *args], check=False, timeout=300)
    assert res.returncode != 0 and message in res.stderr, res.stderr[-2000:]
    assert "xla_device" not in res.stderr and "not compiled with CUDA" not in res.stderr
    assert "begin training" not in res.stdout + res.stderr
    assert not os.path.exists(tmp_path / "ck" / "checkpoint_last.pt")


def _fake_train_main():
    """A function named ``main`` in a file ``.../fairseq_cli/train.py`` (what
    ``check_precision_flags`` looks for on the stack), calling the check with ``cfg``."""
    ns = {}
    code = ("def main(cfg):\n"
            "    from fairseq_plugins.models.precision import check_precision_flags\n"
            "    check_precision_flags()\n")
    exec(compile(code, os.path.join("somewhere", "fairseq_cli", "train.py"), "exec"), ns)
    return ns["main"]


@pytest.mark.parametrize("flags,cuda,xla,match", [
    (dict(fp16=True), False, False, "--fp16 needs a CUDA GPU and this machine has no CUDA GPU"),
    (dict(fp16=True, cpu=True), True, False, "--fp16 needs a CUDA GPU and --cpu is given"),
    (dict(memory_efficient_fp16=True), False, False, "--fp16 needs a CUDA GPU"),
    (dict(bf16=True, tpu=True), False, False, "--bf16 needs a GPU or TPU"),
    (dict(memory_efficient_bf16=True, tpu=True), False, False, "--bf16 needs a GPU or TPU"),
    # fairseq-train --bf16 on a CUDA GPU: fairseq sets --tpu, and without torch_xla its Trainer dies
    (dict(bf16=True, tpu=True), True, False, "even on this CUDA GPU"),
    (dict(bf16=True), False, False, "bf16 training needs a CUDA GPU"),  # fairseq-hydra-train's common.bf16
    # ... with configs/hydra's CPU examples (cpu: true) on a GPU machine: the message names common.cpu=false
    (dict(bf16=True, cpu=True), True, False, "--cpu is given.*On a CUDA GPU set common.cpu=false"),
    (dict(fp16=True), True, False, None),
    (dict(bf16=True), True, False, None),
    (dict(bf16=True, tpu=True), False, True, None),
    (dict(), False, False, None),
])
def test_precision_check_decisions(monkeypatch, flags, cuda, xla, match):
    from fairseq_plugins.models import precision

    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    monkeypatch.setattr(precision, "_has_torch_xla", lambda: xla)
    cfg = argparse.Namespace(common=argparse.Namespace(**flags))
    if match is None:
        _fake_train_main()(cfg)
    else:
        with pytest.raises(ValueError, match=match):
            _fake_train_main()(cfg)
    precision.check_precision_flags()  # not under fairseq_cli.train.main: never refuses


def test_checkpoint_trained_with_half_precision_flags_loads_on_cpu(data_bin, tmp_path):
    """The check runs only when fairseq-train builds the model: a checkpoint whose stored args say
    --fp16 / --bf16 --tpu (trained on a GPU / TPU) still loads for generation and analysis here."""
    from fairseq_plugins.checkpoint import load_checkpoint, load_model_ensemble_and_task

    th.run([os.path.join(th.BIN, "fairseq-train"),
            *th.train_args(data_bin, str(tmp_path / "ck"), "--max-update", "1", arch="rela_transformer_small")])
    state = load_checkpoint(str(tmp_path / "ck" / "checkpoint_last.pt"))
    for ns in (state.get("args"), state["cfg"]["model"]):
        if ns is not None:
            ns.fp16 = ns.bf16 = ns.tpu = True
    state["cfg"]["common"].update(fp16=True, bf16=True, tpu=True)
    path = tmp_path / "gpu_trained.pt"
    torch.save(state, path)
    models, _, _ = load_model_ensemble_and_task([str(path)], arg_overrides={"data": data_bin})
    assert type(models[0]).__name__ == "AttentionTransformerModel"


_SIMULATED_GPU = """
import sys, torch
# a CUDA machine as far as fairseq's device choice goes: is_available() and the RNG calls fairseq
# makes before building the Trainer (no kernel ever runs: the process fails before any tensor work)
torch.cuda.is_available = lambda: True
torch.cuda.device_count = lambda: 1
torch.cuda.get_rng_state = lambda *a, **k: torch.ByteTensor()
torch.cuda.set_rng_state = torch.cuda.manual_seed = torch.cuda.manual_seed_all = lambda *a, **k: None
sys.argv = ["fairseq-train"] + sys.argv[1:]
from fairseq_cli.train import cli_main
cli_main()
"""


@pytest.mark.skipif(importlib.util.find_spec("torch_xla") is not None, reason="torch_xla installed: --bf16 --tpu can work")
@pytest.mark.parametrize("arch,message", [
    ("transformer", "'NoneType' object has no attribute 'xla_device'"),  # stock arch: fairseq's own failure
    ("rela_transformer_small", "--bf16 in fairseq-train implies --tpu"),  # the plugin's check
])
def test_fairseq_train_bf16_takes_the_tpu_branch_even_on_a_cuda_machine(data_bin, tmp_path, arch, message):
    """``fairseq-train --bf16`` sets ``--tpu`` (fairseq/options.py), so on a CUDA machine without
    torch_xla fairseq's Trainer dies asking torch_xla for a device (simulated CUDA machine; the
    stock arch shows fairseq's behaviour, the plugin's arch its start-up refusal)."""
    args = th.train_args(data_bin, str(tmp_path / "ck"), "--max-update", "1", "--bf16",
                         "--distributed-world-size", "1", arch=arch)
    args.remove("--cpu")
    res = th.run([sys.executable, "-c", _SIMULATED_GPU, *args], check=False, timeout=300)
    assert res.returncode != 0 and message in res.stderr, res.stderr[-2000:]
    assert "begin training" not in res.stdout + res.stderr
