"""mt-bench-speed (ReLA Table 2, :mod:`mt_pipeline.bench_speed`): the device / dtype choices are
checked before any work, and on a GPU (lent-GPU windows; skipped here) the benchmark runs end to
end in bf16 with every model on the device."""

import os
import re

import pytest
import torch

from helpers import MULTI30K_RAW, run_cli
from mt_pipeline import bench_speed

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.mark.parametrize("device,dtype,msg", [
    ("tpu", "fp32", "--device tpu: valid choices: cpu, cuda"),
    ("cpu", "fp8", "--dtype fp8: valid choices: fp32, bf16, fp16"),
    ("cpu", "bf16", "--dtype bf16 needs --device cuda"),
    ("cpu", "fp16", "--dtype fp16 needs --device cuda"),
])
def test_device_problem_names_the_valid_choices(device, dtype, msg):
    assert msg in bench_speed.device_problem(device, dtype)


def test_cpu_fp32_is_fine():
    assert bench_speed.device_problem("cpu", "fp32") is None


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_cuda_without_a_gpu_is_refused_before_any_work(tmp_path, capsys):
    out = tmp_path / "o" / "t2.md"
    with pytest.raises(SystemExit) as e:
        bench_speed.main(["--data-bin", str(tmp_path / "no-data-bin"), "--device", "cuda", "--out", str(out)])
    assert e.value.code == 2
    assert "--device cuda: torch sees no CUDA device here; use --device cpu" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_on_device_leaves_cpu_samples_alone():
    sample = {"net_input": {"src_tokens": torch.ones(1, 3, dtype=torch.long)}}
    assert bench_speed.on_device(sample, torch.device("cpu")) is sample


def test_peak_memory_child_builds_the_size_measured(monkeypatch):
    """On CPU each model's peak memory is measured in a child process: it gets --size (a base run
    measured the small models' memory before), and its PEAK line is read back."""
    import argparse
    import subprocess

    seen = {}

    def fake_run(argv, **kw):
        seen["argv"] = argv
        return subprocess.CompletedProcess(argv, 0, stdout='PEAK {"peak_mib": 12.5}\n', stderr="")

    monkeypatch.setattr(subprocess, "run", fake_run)
    a = argparse.Namespace(data_bin="d", src="en", tgt="de", train_batches=1, max_tokens=512, big_batch=4, steps=3,
                           beam=4, size="base")
    assert bench_speed.peak_memory(a, "ReLA-g") == 12.5
    argv = seen["argv"]
    assert argv[argv.index("--size") + 1] == "base" and argv[argv.index("--_peak") + 1] == "ReLA-g"


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """A quick Multi30k preparation by the project's recipe (a slice of the training set)."""
    if not os.path.isdir(MULTI30K_RAW):
        pytest.skip(f"real data not found at {MULTI30K_RAW}")
    out = tmp_path_factory.mktemp("m30k")
    run_cli(["bash", "data-prep/multi30k/prepare.sh", "--raw-dir", MULTI30K_RAW, "--out", str(out),
             "--train-lines", "2000", "--bpe-merges", "1000"])
    return out


def test_sizes_name_an_architecture_for_every_model():
    """--size base replaces every *_small architecture by its Transformer-base one (fairseq's stock
    `transformer` for the reference); small keeps MODELS as it is; an unknown size is a KeyError."""
    for label, (arch, _) in bench_speed.MODELS.items():
        assert bench_speed.arch_of(label, "small") == arch
        base = bench_speed.arch_of(label, "base")
        assert base == ("transformer" if arch == "stock_transformer_small" else arch[:-len("_small")]), (label, base)
    with pytest.raises(KeyError):
        bench_speed.arch_of("ReLA-g", "large")


@pytest.mark.parametrize("device,dtype,size", [
    ("cpu", "fp32", "small"), ("cpu", "fp32", "base"), pytest.param("cuda", "bf16", "small", marks=needs_cuda),
    pytest.param("cuda", "bf16", "base", marks=needs_cuda)])
def test_tiny_run_measures_every_model(data, tmp_path, device, dtype, size):
    """End to end on real data (the GPU case runs in a lent-GPU window): one row per model, the
    stock model the 1.000× reference, the page titled with where it ran and naming the size (base:
    the models have Transformer base's parameter count, ~4x small's); on the GPU every model's
    peak CUDA memory is measured (on CPU the memory subprocesses are skipped: --no-memory)."""
    out = tmp_path / "t2.md"
    argv = ["--data-bin", str(data / "bin"), "--device", device, "--dtype", dtype, "--rounds", "1",
            "--train-batches", "1", "--max-tokens", "512", "--decode-sents", "2", "--big-batch", "4", "--steps", "3",
            "--size", size, "--out", str(out)]
    bench_speed.main(argv + (["--no-memory"] if device == "cpu" else []))
    text = out.read_text(encoding="utf-8")
    where = "CPU" if device == "cpu" else f"GPU ({torch.cuda.get_device_name()}, {dtype})"
    assert text.startswith(f"# ReLA Table 2 on {where}:")
    assert "neither smoke, converged nor paper scale" in text
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in text.splitlines()
            if line.startswith("| ") and line.count("×") >= 3]
    assert [r[0] for r in rows] == list(bench_speed.MODELS)
    stock = rows[0]
    assert stock[3] == stock[5] == stock[7] == "1.000×"
    for r in rows:
        assert float(r[2]) > 0 and float(r[4]) > 0 and float(r[6]) > 0  # tok/s, sents/s
        if device == "cuda":
            assert float(r[8]) > 0  # peak MiB
    assert "command: `python scripts/bench_speed.py" in text and f"--device {device}" in text
    assert f"Ours: {bench_speed.SIZES[size][0]}, vocabulary of " in text
    assert "prep_stamp stage=bin; " in text  # the data-bin's own record of its preparation
    stock_params = float(stock[1].rstrip("M"))  # small: ~3M + embeddings; base: 44M + embeddings
    assert (stock_params > 40) == (size == "base"), stock_params
    # the fixture's dictionary is joined: both sizes share all embeddings (one V x d matrix)
    assert bench_speed._joined(str(data / "bin"), "en", "de")
    models, _ = bench_speed.build_models(str(data / "bin"), "en", "de", size=size) if device == "cpu" else ({}, None)
    for m in models.values():
        assert m.encoder.embed_tokens.weight is m.decoder.embed_tokens.weight
    # the machine's load at the start and end: a page timed beside other jobs says so
    assert re.search(r"^- load average 1 5 15 min: start (\d+\.\d\d ){2}\d+\.\d\d; end (\d+\.\d\d ){2}\d+\.\d\d; "
                     r"cores \d+$", text, re.M), text


@pytest.mark.parametrize("size,joined,flag", [("small", False, None), ("base", True, "--share-all-embeddings"),
                                              ("base", False, "--share-decoder-input-output-embed")])
def test_embedding_sharing_follows_the_dictionaries(monkeypatch, size, joined, flag):
    """The models are built as their training would build them: the small presets share all
    embeddings (their arch does), Transformer base shares all of them on a joined dictionary and, on
    separate dictionaries (ReLA's WMT14 prep, the released code's vocabularies), ties only the target
    embedding to the softmax -- the argv of every model says so."""
    from fairseq import options

    seen = []

    def stop(parser, argv):
        seen.append(argv)
        raise RuntimeError("argv captured")

    monkeypatch.setattr(bench_speed, "_joined", lambda *a: joined)
    monkeypatch.setattr(options, "parse_args_and_arch", stop)
    with pytest.raises(RuntimeError, match="argv captured"):
        bench_speed.build_models("data-bin/x/bin", "en", "de", size=size)
    flags = {"--share-all-embeddings", "--share-decoder-input-output-embed"} & set(seen[0])
    assert flags == ({flag} if flag else set())
