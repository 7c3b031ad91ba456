"""mt-bench-decode-length (ReLA Figure 2 on CPU, :mod:`mt_pipeline.bench_decode_length`): the
length groups, the Multi30k preprocessing of its sources, a tiny end-to-end run and the refusals
of bad arguments (before any work, no output written).  The tests that need Multi30k prepare a
slice of it from the shared raw data (``helpers.MULTI30K_RAW``; they skip without it)."""

import gzip
import os
import random
import re

import pytest

from helpers import MULTI30K_RAW, run_cli
from mt_pipeline import bench_decode_length as bdl
from mt_pipeline.bench_speed import MODELS

needs_data = pytest.mark.skipif(not os.path.isdir(MULTI30K_RAW), reason=f"real data not found at {MULTI30K_RAW}")


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """A Multi30k preparation by the project's recipe (raw/, tok/, bpe/codes, bin/), on a slice of
    the training set so that it is quick."""
    out = tmp_path_factory.mktemp("m30k")
    run_cli(["bash", "data-prep/multi30k/prepare.sh", "--raw-dir", MULTI30K_RAW, "--out", str(out),
             "--train-lines", "3000", "--bpe-merges", "1000"])
    return str(out)


def _data_args(data):
    return ["--data-bin", os.path.join(data, "bin"), "--bpe-codes", os.path.join(data, "bpe", "codes")]


def _lines(path, n=None):
    with open(path, encoding="utf-8", newline="\n") as f:
        out = [line.rstrip("\n") for line in f]
    return out if n is None else out[:n]


# ---- groups ----------------------------------------------------------------------------------

@pytest.mark.parametrize("n,groups", [(3003, 10), (10, 3), (7, 7), (5, 1), (11, 4)])
def test_length_groups_are_disjoint_sorted_equal_sized_and_cover_every_sentence(n, groups):
    rng = random.Random(n)
    lengths = [rng.randint(1, 60) for _ in range(n)]
    got = bdl.length_groups(lengths, groups)
    assert len(got) == groups
    flat = [i for g in got for i in g]
    assert sorted(flat) == list(range(n))  # disjoint and covering
    assert max(map(len, got)) - min(map(len, got)) <= 1
    assert [lengths[i] for i in flat] == sorted(lengths)  # each group's lengths <= the next group's
    for g in got:  # ties in file order
        assert g == sorted(g, key=lambda i: (lengths[i], i))
    assert bdl.length_groups(list(lengths), groups) == got  # deterministic


def test_length_groups_rejects_a_bad_count():
    for bad in (0, 4):
        with pytest.raises(ValueError, match="between 1 and the number of sentences"):
            bdl.length_groups([3, 1, 2], bad)


def test_pick_evenly_is_deterministic_evenly_spaced_and_inside_the_group():
    group = list(range(100, 130))  # 30 members
    assert bdl.pick_evenly(group, 3) == [105, 115, 125]  # the middle of each third
    assert bdl.pick_evenly(group, 1) == [115]
    assert bdl.pick_evenly(group, 30) == group
    picked = bdl.pick_evenly(group, 8)
    assert picked == bdl.pick_evenly(group, 8) and len(set(picked)) == 8 and picked == sorted(picked)
    for k in (0, 31):
        with pytest.raises(ValueError):
            bdl.pick_evenly(group, k)


def test_overall_is_all_sentences_over_the_summed_time():
    meas = {"a": [[2.0, 4.0], [1.0, 1.0]]}  # group 0: 2 sents at 2 and 4 sent/s; group 1: 1 sent at 1 sent/s
    got = bdl.overall(meas, [2, 1])  # round 1: 2/2 + 1/1 s; round 2: 2/4 + 1/1 s
    assert got == {"a": pytest.approx([3 / (1 + 1), 3 / (0.5 + 1)])}


# ---- preprocessing parity with the Multi30k preparation -------------------------------------

@needs_data
def test_preprocessing_gives_the_bpe_tokens_of_the_multi30k_preparation(data):
    raw = _lines(os.path.join(data, "raw", "test.en"), 40)
    want = _lines(os.path.join(data, "bpe", "test.en"), 40)
    assert bdl.preprocess(raw, os.path.join(data, "bpe", "codes")) == want


def test_read_source_reads_gzip_and_splits_on_newlines_only(tmp_path):
    p = tmp_path / "s.en.gz"
    with gzip.open(p, "wb") as f:
        f.write("a b\nc\u2028d\n".encode("utf-8"))  # U+2028 is not a line break here
    assert bdl.read_source(str(p)) == ["a b", "c\u2028d"]


# ---- end to end ------------------------------------------------------------------------------

def _table(text):
    """Rows (cell lists) of the page's first table."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| group | source length"))
    rows = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        rows.append([c.strip() for c in line.strip().strip("|").split("|")])
    return lines[start], rows


@needs_data
def test_base_size_decodes_transformer_base_models(data, tmp_path):
    """--size base: the page's regime line, method text and provenance name the base-size models
    (fairseq's `transformer` for the stock row), and the default page name gets _base."""
    src = tmp_path / "src.en"
    src.write_text("\n".join(_lines(os.path.join(data, "raw", "test.en"), 4)) + "\n", encoding="utf-8")
    out = tmp_path / "fig2_base.md"
    assert bdl.main(["--source", str(src), *_data_args(data), "--groups", "1", "--sents-per-group", "1",
                     "--rounds", "1", "--models", bdl.BASELINE, "ReLA-g", "--size", "base", "--out", str(out)]) == 0
    text = out.read_text(encoding="utf-8")
    assert bdl.regime_line("CPU", "base") in text and "untrained base-size models" in text
    assert "Transformer base (6+6 layers, d 512" in text
    assert "transformer / stock" in text and "rela_transformer / rela_g" in text
    _, a = bdl.parse_args(["--source", str(src), *_data_args(data), "--size", "base"])
    assert a.out.endswith(os.path.join("results", "rela", "figure2_decode_length_cpu_base.md"))


@needs_data
def test_tiny_run_writes_the_page_and_the_plot(data, tmp_path, capsys):
    src = tmp_path / "src.en.gz"  # a few real sentences (gzip, as newstest2014 is)
    with gzip.open(src, "wt", encoding="utf-8") as f:
        f.write("\n".join(_lines(os.path.join(data, "raw", "test.en"), 12)) + "\n")
    out = tmp_path / "res" / "fig2.md"
    assert bdl.main(["--source", str(src), *_data_args(data), "--groups", "2", "--sents-per-group", "1", "--rounds", "1",
                     "--models", bdl.BASELINE, "ReLA-g", "--out", str(out)]) == 0
    text = out.read_text(encoding="utf-8")
    assert (tmp_path / "res" / "fig2.png").stat().st_size > 1000
    assert sorted(os.listdir(tmp_path / "res")) == ["fig2.md", "fig2.png"]  # no temp leftovers
    assert bdl.regime_line("CPU") in text and "at least 1.8 times faster than sparsemax" in text
    assert text.startswith("# ReLA Figure 2 on CPU:")
    header, rows = _table(text)
    assert "× stock" in header and "ReLA-g ÷ model" in header
    assert [r[0] for r in rows] == ["1", "1", "2", "2", "all", "all"]
    for r in rows:
        assert float(r[4]) > 0  # sents/s
        if r[3] == bdl.BASELINE:
            assert r[5] == "1.000×"
    assert all(r[3] in (bdl.BASELINE, "ReLA-g") for r in rows)
    assert re.search(r"^## Provenance", text, re.M)
    for key in ("command: `mt-bench-decode-length", "git commit:", "source_sha256", "bpe_codes_sha256",
                "hardware:", "wall s:", "time:", "load average 1 5 15 min: start "):
        assert key in text, key


# ---- bad arguments ---------------------------------------------------------------------------

def _refused(tmp_path, capsys, *args):
    out = tmp_path / "o" / "fig2.md"
    with pytest.raises(SystemExit) as e:
        bdl.main([*args, "--out", str(out)])
    assert e.value.code == 2
    assert not (tmp_path / "o").exists() or os.listdir(tmp_path / "o") == []
    return capsys.readouterr().err


def test_an_unknown_model_label_names_the_valid_ones(tmp_path, capsys):
    err = _refused(tmp_path, capsys, "--models", bdl.BASELINE, "relu-g")
    assert "unknown model label 'relu-g'" in err
    for label in MODELS:
        assert repr(label) in err


def test_the_baseline_is_required(tmp_path, capsys):
    err = _refused(tmp_path, capsys, "--models", "ReLA-g", "sparsemax")
    assert "must include the baseline" in err and repr(bdl.BASELINE) in err


@pytest.mark.parametrize("opt", ["--groups", "--sents-per-group", "--rounds", "--beam"])
def test_counts_below_one_are_refused(tmp_path, capsys, opt):
    err = _refused(tmp_path, capsys, opt, "0")
    assert f"{opt} must be an integer >= 1, got 0" in err


def test_missing_inputs_are_refused(tmp_path, capsys):
    src, bin_, codes = tmp_path / "src.en", tmp_path / "bin", tmp_path / "codes"
    src.write_text("a b\n")
    bin_.mkdir()
    (bin_ / "dict.en.txt").write_text("a 1\n")
    codes.write_text("#version: 0.2\na b\n")
    ok = {"--source": str(src), "--data-bin": str(bin_), "--bpe-codes": str(codes)}
    for opt, bad, msg in (("--source", tmp_path / "none.en.gz", "no such file"),
                          ("--data-bin", tmp_path / "nobin", "no dict.en.txt"),
                          ("--bpe-codes", tmp_path / "nocodes", "no such file")):
        args = [w for k, v in {**ok, opt: str(bad)}.items() for w in (k, v)]
        err = _refused(tmp_path, capsys, *args)
        assert f"{opt} {bad}: {msg}" in err


@needs_data
def test_more_sentences_per_group_than_a_group_holds_is_refused(data, tmp_path, capsys):
    src = tmp_path / "src.en"
    src.write_text("\n".join(_lines(os.path.join(data, "raw", "test.en"), 5)) + "\n", encoding="utf-8")
    err = _refused(tmp_path, capsys, "--source", str(src), *_data_args(data), "--groups", "2", "--sents-per-group", "3")
    assert "--sents-per-group 3: the smallest of 2 groups has 2 sentences; choose 1..2" in err


def test_half_precision_is_refused_on_cpu(tmp_path, capsys):
    for dtype in ("bf16", "fp16"):
        err = _refused(tmp_path, capsys, "--dtype", dtype, "--data-bin", str(tmp_path / "no-data-bin"))
        assert f"--dtype {dtype} needs --device cuda" in err


def test_an_unknown_device_or_dtype_names_the_valid_ones(tmp_path, capsys):
    err = _refused(tmp_path, capsys, "--device", "tpu")
    assert "'cpu', 'cuda'" in err
    err = _refused(tmp_path, capsys, "--dtype", "fp8")
    assert "'fp32', 'bf16', 'fp16'" in err


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="this machine has CUDA")
def test_cuda_without_a_gpu_is_refused(tmp_path, capsys):
    err = _refused(tmp_path, capsys, "--device", "cuda", "--dtype", "bf16", "--data-bin", str(tmp_path / "no-data-bin"))
    assert "--device cuda: torch sees no CUDA device here; use --device cpu" in err


@needs_data
@pytest.mark.skipif(not __import__("torch").cuda.is_available(), reason="needs a CUDA device")
def test_tiny_run_on_the_gpu_in_bf16(data, tmp_path):
    """The GPU path end to end (runs in a lent-GPU window): models in bf16 on the device, the page
    titled with the GPU and dtype, every model's speed measured."""
    import torch

    src = tmp_path / "src.en"
    src.write_text("\n".join(_lines(os.path.join(data, "raw", "test.en"), 12)) + "\n", encoding="utf-8")
    out = tmp_path / "fig2_gpu.md"
    assert bdl.main(["--source", str(src), *_data_args(data), "--groups", "2", "--sents-per-group", "1", "--rounds",
                     "1", "--device", "cuda", "--dtype", "bf16", "--out", str(out)]) == 0
    text = out.read_text(encoding="utf-8")
    assert text.startswith(f"# ReLA Figure 2 on GPU ({torch.cuda.get_device_name()}, bf16):")
    assert bdl.regime_line(f"GPU ({torch.cuda.get_device_name()}, bf16)") in text
    _, rows = _table(text)
    assert {r[3] for r in rows} == set(bdl.FIGURE2_MODELS) and all(float(r[4]) > 0 for r in rows)
