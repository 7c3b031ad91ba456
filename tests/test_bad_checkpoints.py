"""Checkpoint files a tool cannot use, given to every checkpoint-reading tool (issue 21, items 5-6).

* an empty ``.pt`` (0 bytes: a full disk, a kill before ``torch.save`` wrote anything) used to
  give a bare ``EOFError`` in every tool; a cut-short zip gave ``OSError: [Errno 22] Invalid
  argument``; a crafted pickle gave torch's advice to re-run with ``weights_only=False``
  (``average_checkpoints.py`` missed torch's "blocked module" wording).  Now every tool says
  what is wrong with which file, in the plugin's words (:mod:`fairseq_plugins.checkpoint`);
* an ``rnnsearch`` checkpoint given to a Transformer analysis used to exit 0 with
  ``{"mean": [NaN]}`` (ffn_variance_ratio.py) or crash in matplotlib / on an attribute
  (the analysis CLI, eatt_energy.py).  Now: "needs a Transformer checkpoint", exit != 0, no output.

The tools run as a user runs them (subprocesses, the toy corpus of ``train_helpers``, tiny
checkpoints trained by ``fairseq-train``).
"""

import json
import os
import sys

import pytest
import torch

import train_helpers as th
from fairseq_plugins.checkpoint import CheckpointError, UnsafeCheckpointError, load_checkpoint

PY = sys.executable
TORCH_ADVICE = ("weights_only` set to `False`", "Re-running `torch.load`", "Weights only load failed")


class _Evil:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """Toy data, a tiny Transformer and a tiny rnnsearch checkpoint, and the bad files."""
    root = tmp_path_factory.mktemp("badck")
    data_bin = th.make_databin(str(root / "toy"), n_train=32, n_valid=8)
    tr = root / "tr"
    th.run([os.path.join(th.BIN, "fairseq-train"),
            *th.train_args(data_bin, str(tr), "--max-update", "1", arch="rela_transformer_small")])
    rnn = root / "rnn"
    th.run([os.path.join(th.BIN, "fairseq-train"), data_bin, "--user-dir", os.path.join(th.ROOT, "fairseq_plugins"),
            "--task", "translation", "--source-lang", "src", "--target-lang", "tgt", "--arch", "rnnsearch_small",
            "--encoder-embed-dim", "16", "--encoder-hidden-size", "16", "--decoder-embed-dim", "16",
            "--decoder-hidden-size", "16", "--attention-dim", "16", "--decoder-out-embed-dim", "16",
            "--optimizer", "adam", "--lr", "0.003", "--batch-size", "8", "--max-update", "1",
            "--save-dir", str(rnn), "--cpu", "--num-workers", "0", "--no-epoch-checkpoints", "--no-progress-bar"])
    empty = root / "empty.pt"
    empty.write_bytes(b"")
    good = (tr / "checkpoint_last.pt").read_bytes()
    cut = root / "cut.pt"
    cut.write_bytes(good[: len(good) // 2])
    text = root / "text.pt"
    text.write_text("not a checkpoint\n")
    (root / "out").mkdir()
    evil = root / "evil.pt"
    torch.save({"model": {}, "args": _Evil(root / "pwned"), "cfg": None}, evil)
    # the Transformer as if trained with a user directory's function (docs/extending.md), given without it
    state = load_checkpoint(str(tr / "checkpoint_last.pt"))
    state["cfg"]["model"].cross_attention_fn = "sigmoid"
    foreign = root / "foreign_fn.pt"
    torch.save(state, foreign)
    return {"data": data_bin, "transformer": str(tr / "checkpoint_last.pt"), "rnnsearch": str(rnn / "checkpoint_last.pt"),
            "empty": str(empty), "cut": str(cut), "text": str(text), "evil": str(evil), "foreign_fn": str(foreign),
            "marker": root / "pwned", "out": root / "out"}  # (out/ is created by the fixture)


# ---------------------------------------------------------------------------------------------
# the loader
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind,words", [
    ("empty", "is empty (0 bytes): not a checkpoint"),
    ("cut", "is cut short or corrupt"),
    ("text", "is not a torch checkpoint"),
])
def test_load_checkpoint_names_the_file_and_what_is_wrong(files, kind, words):
    with pytest.raises(CheckpointError) as e:
        load_checkpoint(files[kind])
    assert str(e.value).startswith(f"{files[kind]} {words}"), str(e.value)
    assert not isinstance(e.value, UnsafeCheckpointError)  # a broken file, not a refused pickle
    assert not any(a in str(e.value) for a in TORCH_ADVICE)


def test_load_checkpoint_still_loads_good_and_legacy_files(files, tmp_path):
    assert "model" in load_checkpoint(files["transformer"])
    legacy = tmp_path / "legacy.pt"  # torch < 1.6 format: a plain pickle, not a zip archive
    torch.save({"model": {"w": torch.ones(2)}}, legacy, _use_new_zipfile_serialization=False)
    assert torch.equal(load_checkpoint(str(legacy))["model"]["w"], torch.ones(2))
    with pytest.raises(FileNotFoundError):
        load_checkpoint(str(tmp_path / "missing.pt"))
    with pytest.raises(UnsafeCheckpointError, match="posix.system"):
        load_checkpoint(files["evil"])


# ---------------------------------------------------------------------------------------------
# every checkpoint-reading tool (item 6)
# ---------------------------------------------------------------------------------------------
def _tool(name, ck, f):
    """(command, output paths that must not appear) of tool ``name`` reading checkpoint ``ck``."""
    out = f["out"] / f"{name}.{os.path.basename(ck)}"
    d = ["--data-bin", f["data"], "--src", "src", "--tgt", "tgt"]
    s = os.path.join(th.ROOT, "scripts")
    user = ["--user-dir", os.path.join(th.ROOT, "fairseq_plugins"), "--source-lang", "src", "--target-lang", "tgt"]
    return {
        "ffn_variance_ratio.py": ([PY, f"{s}/ffn_variance_ratio.py", "--checkpoint", ck, *d, "--json", f"{out}.json"],
                                  [f"{out}.json"]),
        "attention_zero_rate.py": ([PY, f"{s}/attention_zero_rate.py", "--checkpoint", ck, *d, "--json", f"{out}.json"],
                                   [f"{out}.json"]),
        "ffn_top_p.py": ([PY, f"{s}/ffn_top_p.py", "--checkpoint", ck, *d, "--json", f"{out}.json"], [f"{out}.json"]),
        "ffn_anisotropy.py": ([PY, f"{s}/ffn_anisotropy.py", "--checkpoint", ck, *d, "--json", f"{out}.json"],
                              [f"{out}.json"]),
        "source_reliance.py": ([PY, f"{s}/source_reliance.py", "--checkpoint", ck, *d, "--json", f"{out}.json"],
                               [f"{out}.json"]),
        "eatt_energy.py": ([PY, f"{s}/eatt_energy.py", "--checkpoint", ck, *d, "--json", f"{out}.json",
                            "--md", f"{out}.md"], [f"{out}.json", f"{out}.md"]),
        "fairseq-attention-analysis": ([PY, f"{s}/analyze_attention.py", "--checkpoint", ck, "--data", f["data"],
                                        "--source-lang", "src", "--target-lang", "tgt", "--out", str(out)],
                                       [f"{out}/analysis.json", f"{out}/analysis.md"]),
        "average_checkpoints.py": ([PY, f"{s}/average_checkpoints.py", "--inputs", ck, f["transformer"],
                                    "--output", f"{out}.pt"], [f"{out}.pt"]),
        "bench_flexible_decode.py": ([PY, f"{s}/bench_flexible_decode.py", "--flexible", ck, *d, "--subset", "valid",
                                     "--out", f"{out}.md"], [f"{out}.md"]),
        "fairseq-generate": ([os.path.join(th.BIN, "fairseq-generate"), f["data"], "--path", ck, "--cpu",
                              "--gen-subset", "valid", *user], []),
        "fairseq-interactive": ([os.path.join(th.BIN, "fairseq-interactive"), f["data"], "--path", ck, "--cpu",
                                 *user], []),
    }[name]


TOOLS = ["ffn_variance_ratio.py", "ffn_top_p.py", "ffn_anisotropy.py", "attention_zero_rate.py", "source_reliance.py",
         "eatt_energy.py",
         "fairseq-attention-analysis",
         "average_checkpoints.py", "bench_flexible_decode.py", "fairseq-generate", "fairseq-interactive"]


@pytest.mark.parametrize("tool", TOOLS)
def test_every_tool_names_an_empty_checkpoint_and_refuses_a_crafted_one_in_the_plugins_words(files, tool):
    for kind in ("empty", "evil"):
        cmd, outputs = _tool(tool, files[kind], files)
        res = th.run(cmd, check=False, input="w1 w2\n", timeout=300)
        err = res.stderr
        assert res.returncode != 0, err[-2000:]
        if kind == "empty":
            assert f"{files['empty']} is empty (0 bytes)" in err, err[-2000:]
        else:
            assert f"refusing to load {files['evil']}: its pickle references posix.system" in err, err[-2000:]
            assert "Nothing from it was executed" in err and "add_safe_globals" in err
        assert not any(a in err for a in TORCH_ADVICE), err[-2000:]  # torch's message is replaced
        assert not any(os.path.exists(o) for o in outputs)
    assert not files["marker"].exists()


@pytest.mark.parametrize("tool", [t for t in TOOLS if t != "average_checkpoints.py"])  # averaging builds no model
def test_every_tool_names_an_attention_function_it_has_not_registered_and_the_way_to_it(files, tool):
    """A checkpoint trained with an attention function of a user directory, given without that
    ``--user-dir``: the plugin's tools refuse it before building the model, naming the file, the
    function and its flag, the registered ones and ``--user-dir`` (no traceback, no output);
    fairseq's own tools end their traceback with the same advice (the model's option check)."""
    cmd, outputs = _tool(tool, files["foreign_fn"], files)
    res = th.run(cmd, check=False, input="w1 w2\n", timeout=300)
    assert res.returncode != 0, res.stdout[-2000:]
    last = res.stderr.strip().splitlines()[-1]
    assert "--cross-attention-fn 'sigmoid'" in last and "rela_g" in last and "needs the --user-dir" in last, last
    if tool.startswith("fairseq-") and tool != "fairseq-attention-analysis":  # fairseq-generate / -interactive
        assert last.startswith("ValueError: "), last
    else:
        assert f"{files['foreign_fn']} was trained with attention function(s) not registered here" in last, last
        assert "Traceback" not in res.stderr, res.stderr[-2000:]
    assert not any(os.path.exists(o) for o in outputs)


def test_fairseq_train_names_an_empty_checkpoint_last(files, tmp_path):
    """A restarted fairseq-train whose checkpoint_last.pt is empty: the plugin's message (through
    its sys.excepthook), not a bare EOFError."""
    save = tmp_path / "ck"
    save.mkdir()
    (save / "checkpoint_last.pt").write_bytes(b"")
    res = th.run([os.path.join(th.BIN, "fairseq-train"),
                  *th.train_args(files["data"], str(save), "--max-update", "1", arch="rela_transformer_small")],
                 check=False, timeout=300)
    assert res.returncode != 0
    assert f"fairseq_plugins: {save / 'checkpoint_last.pt'} is empty (0 bytes)" in res.stderr, res.stderr[-2000:]


def test_fairseq_generate_names_a_cut_short_checkpoint(files):
    cmd, _ = _tool("fairseq-generate", files["cut"], files)
    res = th.run(cmd, check=False, timeout=300)
    assert res.returncode != 0
    assert f"fairseq_plugins: {files['cut']} is cut short or corrupt" in res.stderr, res.stderr[-2000:]


# ---------------------------------------------------------------------------------------------
# Transformer-only analyses given an rnnsearch checkpoint (item 5)
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("tool", ["ffn_variance_ratio.py", "ffn_top_p.py", "ffn_anisotropy.py", "attention_zero_rate.py",
                                  "eatt_energy.py",
                                  "fairseq-attention-analysis"])
def test_transformer_analyses_refuse_an_rnnsearch_checkpoint(files, tool):
    cmd, outputs = _tool(tool, files["rnnsearch"], files)
    res = th.run(cmd, check=False, timeout=300)
    assert res.returncode != 0, res.stdout[-2000:]
    assert f"needs a Transformer checkpoint (encoder and decoder layers with attention modules); " \
           f"{files['rnnsearch']} holds a RNNsearchModel" in res.stderr, res.stderr[-2000:]
    assert "NaN" not in res.stdout and "Traceback" not in res.stderr
    assert not any(os.path.exists(o) for o in outputs)


def test_source_reliance_still_measures_an_rnnsearch_checkpoint(files):
    """Source reliance needs no layers (NLL with true vs shuffled sources): it still runs."""
    cmd, (out,) = _tool("source_reliance.py", files["rnnsearch"], files)
    th.run(cmd, timeout=300)
    res = json.load(open(out))
    assert all(torch.isfinite(torch.tensor(res[k])).all() for k in ("nll_true", "nll_shuffled"))
    # the record says how to regenerate it and which model it measured
    assert res["provenance"]["git_commit"] and res["provenance"]["command"].startswith("fairseq-attention-source-reliance")
    assert res["model"]["sha256"] and res["model"]["run_dir"] is None


def test_library_functions_refuse_a_model_without_transformer_layers(files):
    from fairseq_plugins.analysis import ffn_variance_ratios
    from fairseq_plugins.analysis.capture import AttentionCapture, load_model_for_analysis
    from fairseq_plugins.checkpoint import UnsupportedCheckpointError

    model, task, _ = load_model_for_analysis(files["rnnsearch"], files["data"], "src", "tgt", transformer_only=False)
    with pytest.raises(UnsupportedCheckpointError, match="ffn_variance_ratios needs a Transformer"):
        ffn_variance_ratios(model, [], task.target_dictionary.pad())
    with pytest.raises(UnsupportedCheckpointError, match="attention capture needs a Transformer"):
        AttentionCapture(model, task.target_dictionary.pad())
    with pytest.raises(UnsupportedCheckpointError, match=files["rnnsearch"]):
        load_model_for_analysis(files["rnnsearch"], files["data"], "src", "tgt")
