"""Bad input fails early and loudly, naming what is wrong, and leaves no partial output.

* data-prep (``data-prep/multi30k/prepare.sh``, ``mt_pipeline.prep.textio.check_parallel``) on corrupt raw
  text: unequal line counts, empty and over-long lines, invalid UTF-8, a missing file, a file
  that is not gzip -- the message names the file (and line) and ``<out>/raw`` is never created;
* model/criterion flags: out-of-range hyper-parameters fail at start-up (``validate_args``,
  ``fairseq-train``), legal-but-suspicious combinations warn.
"""

import argparse
import gzip
import logging
import os
import subprocess
import sys

import pytest
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
    (("--criterion", "label_smoothed_cross_entropy_with_reg", "--reg-weight=-1"), "--reg-weight must be >= 0"),
    (("--encoder-attention-fn", "relu2"), "invalid choice: 'relu2'"),
])
def test_fairseq_train_fails_at_start_up(data_bin, tmp_path, extra, message):
    res = th.run([os.path.join(th.BIN, "fairseq-train"),
                  *th.train_args(data_bin, str(tmp_path / "ck"), "--max-update", "1", *extra)],
                 check=False, timeout=120)
    assert res.returncode != 0 and message in res.stderr, res.stderr[-2000:]
    assert "begin training" not in res.stdout + res.stderr
    assert not os.path.exists(tmp_path / "ck" / "checkpoint_last.pt")
    if "relu2" in extra:
        assert "reluformer" in res.stderr and "softmax" in res.stderr  # the valid choices
