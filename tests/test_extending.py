"""docs/extending.md works as written.  Its Python block, written as ``my_attention/__init__.py``,
registers sigmoid attention beside the plugin's functions and computes what the page says
(``sigmoid(score - log n_i)``, zero where masked); the page's commands, run with a small slice of
Multi30k (2,000 training pairs), a tiny model and a few updates appended as overrides, train a model
with it in all three attention kinds, translate with it (``fairseq-generate``, ``mt-evaluate``),
analyse it (``fairseq-attention-analysis`` and ``fairseq-attention-zero-rate`` with ``--user-dir``)
and run the whole pipeline with it (``mt-experiment --user-dir``: the user code's SHA-256 recorded);
without the user directory the function is unknown and the errors list the valid ones.
"""

import hashlib
import json
import math
import os
import re
import shlex
import sys

import pytest
import torch
from train_helpers import make_databin, run, train_args

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PAGE = os.path.join(ROOT, "docs", "extending.md")
RAW = os.path.join(os.path.dirname(ROOT), "shared", "data", "multi30k_en_de", "raw")
BIN = os.path.dirname(sys.executable)
#: appended to the page's commands: a tiny model, a few updates, short translations
OVERRIDES = {
    "fairseq-train": ["--encoder-layers", "1", "--decoder-layers", "1", "--encoder-embed-dim", "32",
                      "--decoder-embed-dim", "32", "--encoder-ffn-embed-dim", "64", "--decoder-ffn-embed-dim", "64",
                      "--encoder-attention-heads", "2", "--decoder-attention-heads", "2", "--max-update", "20",
                      "--warmup-updates", "5", "--max-tokens", "2000", "--cpu", "--no-epoch-checkpoints",
                      "--disable-validation", "--num-workers", "0", "--seed", "1"],
    "fairseq-generate": ["--cpu", "--max-len-a", "0", "--max-len-b", "6", "--batch-size", "128"],
    "mt-evaluate": ["--subsets", "test", "--extra", "--max-len-a 0 --max-len-b 6 --cpu"],
    "fairseq-attention-analysis": ["--limit", "8", "--no-figures"],
    "fairseq-attention-zero-rate": [],
    # and "mt-experiment": a budget of the same size (tiny_budget)
}
#: the tiny model of the fairseq-train overrides, as mt-experiment's --extra
MODEL = " ".join(OVERRIDES["fairseq-train"][:16])


def tiny_budget(path, prep):
    """A budget (the CPU budget shrunk to the fairseq-train overrides: 20 updates, 2 checkpoints
    averaged, greedy 6-token translations of the test set) over the prepared slice ``prep``."""
    import yaml

    path.write_text(yaml.safe_dump({
        "base": "configs/multi30k/small_cpu.yaml",
        "train": {"max-update": 20, "save-interval-updates": 10, "keep-interval-updates": 2, "warmup-updates": 5,
                  "max-tokens": 2000, "disable-validation": True},
        "average": {"num-update-checkpoints": 2},
        "generate": {"beam": 1, "batch-size": 500, "extra": {"max-len-a": 0, "max-len-b": 6}},
        "data": {"out": str(prep), "train-lines": 2000, "bpe-merges": 800, "subsets": ["test"],
                 "prep-flags": {"raw-dir": RAW}}}))
    return str(path)


def _page_code():
    """The page's Python block (the user directory's ``__init__.py``)."""
    blocks = re.findall(r"```python\n(.*?)```", open(PAGE, encoding="utf-8").read(), re.S)
    assert len(blocks) == 1, "docs/extending.md should hold one Python block"
    return blocks[0]


def _page_commands():
    """``[[word, ...]]``: the commands of the page's bash block, continuations joined."""
    blocks = re.findall(r"```bash\n(.*?)```", open(PAGE, encoding="utf-8").read(), re.S)
    assert len(blocks) == 1, "docs/extending.md should hold one bash block"
    return [shlex.split(line) for line in re.sub(r"\\\n\s*", " ", blocks[0]).splitlines() if line.strip()]


@pytest.fixture(scope="module")
def user_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("user") / "my_attention"
    d.mkdir()
    (d / "__init__.py").write_text(_page_code())
    return d


@pytest.fixture
def registered(user_dir):
    """The page's module imported here as fairseq imports a --user-dir; unregistered afterwards, so
    the other tests of this process see the plugin's functions only."""
    import argparse

    from fairseq.utils import import_user_module

    from fairseq_plugins.attention import ATTENTION_FUNCTIONS

    before = set(ATTENTION_FUNCTIONS)
    import_user_module(argparse.Namespace(user_dir=str(user_dir)))
    yield
    for name in set(ATTENTION_FUNCTIONS) - before:
        del ATTENTION_FUNCTIONS[name]
    sys.modules.pop(user_dir.name, None)


def test_the_page_code_computes_sigmoid_attention_with_the_log_n_bias(registered):
    """Weights = sigmoid(score - log n_i), n_i the keys query i may see (padding and, under a causal
    mask, the future left out), exactly 0 where masked; the function is registered under its name,
    not a distribution, with the plugin's functions still there."""
    from fairseq_plugins.attention import ATTENTION_FUNCTIONS, attention_fn_names, build_attention_fn

    assert "sigmoid" in attention_fn_names() and {"softmax", "rela_g", "reluformer"} <= set(attention_fn_names())
    assert ATTENTION_FUNCTIONS["sigmoid"].is_distribution is False
    fn = build_attention_fn("sigmoid", 8, 2)
    torch.manual_seed(0)
    B, H, T, S = 2, 2, 3, 5
    scores = torch.randn(B, H, T, S, dtype=torch.float64)
    pad = torch.tensor([[False] * 5, [False, False, False, True, True]])  # batch 1: 3 real keys
    causal = torch.ones(T, S, dtype=torch.bool).triu(S - T + 1)  # key j > i + (S - T) blocked
    mask = pad[:, None, None, :] | causal[None, None]
    w = fn.normalize(scores, mask)
    for b in range(B):
        for i in range(T):
            seen = [j for j in range(S) if not mask[b, 0, i, j]]
            for j in range(S):
                want = 1 / (1 + math.exp(-(scores[b, 0, i, j].item() - math.log(len(seen))))) if j in seen else 0.0
                assert w[b, 0, i, j].item() == pytest.approx(want, abs=1e-12), (b, i, j)
    assert torch.equal(fn.normalize(scores, None), torch.sigmoid(scores - math.log(S)))


def test_the_registration_is_undone_after_the_test():
    """(The fixture above leaves this process's registry as it found it.)"""
    from fairseq_plugins.attention import attention_fn_names

    assert "sigmoid" not in attention_fn_names()


def test_the_page_commands_train_translate_and_analyse_a_model_with_it(user_dir, tmp_path_factory):
    if not os.path.isdir(RAW):
        pytest.skip(f"Multi30k not found under {RAW}")
    tmp = tmp_path_factory.mktemp("ext")
    prep = tmp / "m30k"
    r = run(["bash", "data-prep/multi30k/prepare.sh", "--raw-dir", RAW, "--out", str(prep), "--train-lines", "2000",
             "--bpe-merges", "800"], check=False)
    assert r.returncode == 0, r.stderr[-3000:]
    where = {"data-bin/multi30k_en_de": str(prep), "my_attention": str(user_dir), "ckpt/": str(tmp / "ckpt") + "/"}
    commands = _page_commands()
    assert [c[0] for c in commands] == ["fairseq-train", "fairseq-generate", "mt-evaluate",
                                        "fairseq-attention-analysis", "fairseq-attention-zero-rate", "mt-experiment"]
    overrides = dict(OVERRIDES, **{"mt-experiment": ["--budget", tiny_budget(tmp / "tiny.yaml", prep), "--extra", MODEL]})
    outputs = {}
    for cmd in commands:
        words = []
        for w in cmd:  # a path at the start of a word or after LABEL=
            for page_path, here in where.items():
                w = re.sub(rf"(^|=){re.escape(page_path)}", lambda m: m.group(1) + here, w)
            words.append(w)
        r = run([os.path.join(BIN, words[0])] + words[1:] + overrides[words[0]], check=False)
        assert r.returncode == 0, f"{words}\n{r.stdout[-2000:]}\n{r.stderr[-3000:]}"
        outputs[words[0]] = r.stdout + r.stderr
    ckpt = tmp / "ckpt" / "sigmoid" / "checkpoint_last.pt"
    cfg = torch.load(ckpt, map_location="cpu", weights_only=False)["cfg"]["model"]
    assert (cfg.encoder_attention_fn, cfg.decoder_attention_fn, cfg.cross_attention_fn) == ("sigmoid",) * 3
    assert "| num_updates 20" in outputs["fairseq-train"] or '"num_updates": "20"' in outputs["fairseq-train"]
    n_test = sum(1 for _ in open(prep / "raw" / "test.de"))
    assert len(re.findall(r"^H-\d+\t", outputs["fairseq-generate"], re.M)) == n_test  # every sentence translated
    ev = json.load(open(tmp / "ckpt" / "sigmoid" / "eval" / "test.json"))
    assert isinstance(ev["bleu"], float) and "nrefs:1" in ev["signature"]
    rep = json.load(open(tmp / "ckpt" / "sigmoid" / "analysis" / "analysis.json"))
    m = rep["models"]["sigmoid"]
    assert m["info"]["attention_fns"] == {"encoder": "sigmoid", "decoder": "sigmoid", "cross": "sigmoid"}
    for kind in ("encoder", "decoder", "cross"):
        k = m["metrics"][kind]
        assert k["attention_is_distribution"] is False
        assert all(x == 0 for x in k["null_rate"]), k["null_rate"]  # sigmoid weights are never all 0
    assert "--user-dir" in rep["provenance"]["command"]
    zero = json.load(open(tmp / "ckpt" / "sigmoid" / "zero_rate.json"))
    assert zero["mean"] == [0.0] and [len(zero[k]) for k in ("encoder", "decoder", "cross")] == [1, 1, 1]
    assert "--user-dir" in zero["provenance"]["command"]
    # the same analysis without the user directory, or with one that does not exist: refused by name
    # before anything is written
    zero_cmd = [os.path.join(BIN, "fairseq-attention-zero-rate"), "--checkpoint", str(ckpt), "--data-bin",
                str(prep / "bin"), "--src", "en", "--tgt", "de", "--subset", "test"]
    for extra, said in (([], ("sigmoid", "rela_g")), (["--user-dir", str(tmp / "nowhere")], ("no such directory",))):
        out = tmp / "refused.json"
        r = run(zero_cmd + extra + ["--json", str(out)], check=False)
        assert r.returncode != 0 and all(w in r.stderr for w in said) and "Traceback" not in r.stderr, r.stderr[-2000:]
        assert not out.exists()
    # the energy accounting loads it too, and counts it as dot-product attention: 100 % of vanilla's
    energy = tmp / "energy.json"
    r = run([os.path.join(BIN, "fairseq-attention-energy"), "--user-dir", str(user_dir), "--checkpoint", str(ckpt),
             "--data-bin", str(prep / "bin"), "--src", "en", "--tgt", "de", "--subset", "test", "--max-sentences", "8",
             "--json", str(energy)], check=False)
    assert r.returncode == 0, r.stderr[-2000:]
    en = json.load(open(energy))
    assert en["attention_fns"] == {"encoder": "sigmoid", "decoder": "sigmoid", "cross": "sigmoid"}
    assert en["energy_scores_asic_pct"] == [pytest.approx(100.0)], en["energy_scores_asic_pct"]
    # mt-experiment --user-dir: the whole pipeline with the function, the user code's hashes recorded
    res = json.load(open(tmp / "ckpt" / "sigmoid_run" / "result.json"))
    assert res["status"] == "done" and res["updates"] == 20 and res["attention_fns"] == {
        "encoder": "sigmoid", "decoder": "sigmoid", "cross": "sigmoid"}
    assert isinstance(res["scores"]["test"]["bleu"], float)
    code = {"__init__.py": hashlib.sha256((user_dir / "__init__.py").read_bytes()).hexdigest()}
    assert res["user_dir"]["files"] == code and res["user_dir"]["name"] == "my_attention"
    assert [inv["user_dir"]["files"] for inv in res["train_invocations"]] == [code]
    assert f"--user-dir {user_dir}" in res["commands"]["train"]
    decoded = torch.load(tmp / "ckpt" / "sigmoid_run" / res["decoded_checkpoint"], map_location="cpu",
                         weights_only=False)["cfg"]["model"]
    assert decoded.encoder_attention_fn == decoded.cross_attention_fn == "sigmoid"


def test_without_the_user_dir_the_function_is_unknown_and_the_valid_ones_are_named(tmp_path):
    """fairseq-train with the plugin alone refuses ``sigmoid``, listing the registered functions."""
    data = make_databin(str(tmp_path / "d"), n_train=16, n_valid=8)
    r = run([os.path.join(BIN, "fairseq-train"), *train_args(data, str(tmp_path / "ck"), arch="rela_transformer_small"),
             "--encoder-attention-fn", "sigmoid", "--max-update", "1"], check=False)
    assert r.returncode != 0 and "sigmoid" in r.stderr and "rela_g" in r.stderr, r.stderr[-2000:]
    # mt-experiment refuses it too, and a --user-dir that does not exist, before any work (no run directory)
    exp = [os.path.join(BIN, "mt-experiment"), "--out", str(tmp_path / "run"), "--arch", "rela_transformer_small",
           "--fns", "sigmoid", "sigmoid", "sigmoid"]
    for extra, said in (([], "valid: "), (["--user-dir", str(tmp_path / "nowhere")], "no such directory")):
        r = run(exp + extra, check=False)
        assert r.returncode == 2 and said in r.stderr and "Traceback" not in r.stderr, r.stderr[-2000:]
        assert not (tmp_path / "run").exists()
