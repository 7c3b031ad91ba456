"""``fairseq-hydra-train`` with the plugin: each paper's example in ``configs/hydra/`` trains for 2
updates on real Multi30k data, and the checkpoint's ``cfg.model`` records the chosen attention
functions and hyper-parameters (given as hydra overrides), which the model built from the
checkpoint uses; ``fairseq-generate`` decodes with it.

Before the option dataclasses, the first of these stopped with ``ValueError: unknown attention
function None``: fairseq's ``TransformerConfig.from_namespace`` dropped every plugin key of the
hydra ``DictConfig``.
"""

import os
import re
import sys

import pytest
from fairseq import checkpoint_utils

from fairseq_plugins.checkpoint import load_checkpoint
from helpers import MULTI30K_RAW, ROOT, VENV_BIN, run_cli

# the tests that train need the real data; the ones that only compose or compare configs do not
needs_data = pytest.mark.skipif(not os.path.isdir(MULTI30K_RAW), reason=f"real data not found at {MULTI30K_RAW}")

# tiny sizes: keys the YAMLs do not list, added with hydra's "++" (add or override)
SMALL = ["++model.encoder_layers=1", "++model.decoder_layers=1", "++model.encoder_embed_dim=32",
         "++model.decoder_embed_dim=32", "++model.encoder_ffn_embed_dim=64", "++model.decoder_ffn_embed_dim=64"]
SMALL_RNN = ["++model.encoder_embed_dim=32", "++model.encoder_hidden_size=32", "++model.decoder_embed_dim=32",
             "++model.decoder_hidden_size=32", "++model.attention_dim=32", "++model.decoder_out_embed_dim=32"]

# paper -> (hydra overrides: sizes, the functions / hyper-parameters chosen, expected cfg.model entries)
CASES = {
    "rela": (SMALL + ["model.encoder_attention_fn=relu_rmsnorm", "model.cross_attention_fn=softmax",
                      "model.rela_norm_scope=head"],
             {"encoder_attention_fn": "relu_rmsnorm", "decoder_attention_fn": "rela_g", "cross_attention_fn": "softmax",
              "rela_norm_scope": "head", "rela_norm_eps": 1e-8}),
    "reluformer": (SMALL + ["model.reluformer_gamma=2.0", "model.decoder_attention_fn=rela_g",
                            "criterion.reg_weight=0.5"],
                   {"encoder_attention_fn": "reluformer", "decoder_attention_fn": "rela_g",
                    "cross_attention_fn": "reluformer", "reluformer_gamma": 2.0, "reluformer_entropy_c": 0.7,
                    "attention_entropy": True}),
    "eatt": (SMALL + ["model.eatt_tau=0.5", "model.cross_attention_fn=synth_dense", "model.synth_max_len=300"],
             {"encoder_attention_fn": "eatt", "decoder_attention_fn": "eatt", "cross_attention_fn": "synth_dense",
              "eatt_tau": 0.5, "synth_max_len": 300}),
    "flexible": (SMALL_RNN + ["model.rnn_attention_fn=sparsemax"],
                 {"rnn_attention": "flexible", "rnn_attention_fn": "sparsemax", "flexible_sigma": 1.5}),
}


@pytest.fixture(scope="module")
def data_bin(tmp_path_factory):
    out = tmp_path_factory.mktemp("m30k_hydra")
    run_cli(["bash", "data-prep/multi30k/prepare.sh", "--raw-dir", MULTI30K_RAW, "--out", str(out),
             "--train-lines", "1000", "--bpe-merges", "400"])
    return out / "bin"


def _functions(model):
    if hasattr(model.decoder, "attention"):  # RNNsearch
        att = model.decoder.attention
        return {"rnn_attention": att.kind, "rnn_attention_fn": att.normalizer_name, "flexible_sigma": att.sigma}
    enc, dec = model.encoder.layers[0], model.decoder.layers[0]
    return {"encoder_attention_fn": enc.self_attn.attn_fn.name, "decoder_attention_fn": dec.self_attn.attn_fn.name,
            "cross_attention_fn": dec.encoder_attn.attn_fn.name}


@needs_data
@pytest.mark.parametrize("paper", sorted(CASES))
def test_hydra_example_trains_and_the_checkpoint_records_the_functions(paper, data_bin, tmp_path):
    overrides, expected = CASES[paper]
    save = tmp_path / "ck"
    log = run_cli([os.path.join(VENV_BIN, "fairseq-hydra-train"), "--config-dir",
                   os.path.join(ROOT, "configs", "hydra", paper), "--config-name", "multi30k_small_cpu",
                   f"task.data={data_bin}", f"common.user_dir={ROOT}/fairseq_plugins", f"checkpoint.save_dir={save}",
                   "optimization.max_update=2", "dataset.max_tokens=1500", "dataset.disable_validation=true",
                   "common.log_interval=1", f"hydra.run.dir={tmp_path / 'hydra'}", *overrides])
    assert re.search(r'"num_updates": "2"', log), log[-2000:]  # the configs log JSON progress lines
    path = str(save / "checkpoint_last.pt")
    state = load_checkpoint(path)
    recorded = state["cfg"]["model"]
    assert {k: recorded[k] for k in expected} == expected
    assert state["optimizer_history"][-1]["num_updates"] == 2
    # the model rebuilt from the checkpoint uses them
    models, _, _ = checkpoint_utils.load_model_ensemble_and_task([path], arg_overrides={"data": str(data_bin)})
    built = _functions(models[0])
    assert built == {k: expected[k] for k in built}
    if paper == "reluformer":
        assert models[0].encoder.layers[0].self_attn.attn_fn.gamma == 2.0
        assert "reluformer_norm" in log and "reg_loss" in log  # the eq. 7 criterion ran
    if paper == "eatt":
        assert models[0].encoder.layers[0].self_attn.attn_fn.tau == 0.5
    if paper == "rela":  # fairseq-generate reads the hydra checkpoint (cfg.model is a DictConfig)
        out = run_cli([sys.executable, "-m", "fairseq_cli.generate", str(data_bin), "--user-dir",
                       os.path.join(ROOT, "fairseq_plugins"), "--path", path, "--gen-subset", "valid", "--beam", "2",
                       "--max-len-a", "0", "--max-len-b", "3", "--batch-size", "256",
                       "--required-batch-size-multiple", "1", "--cpu"])
        n_valid = sum(1 for _ in open(data_bin.parent / "raw" / "valid.de"))
        assert sum(1 for line in out.splitlines() if line.startswith("H-")) == n_valid


# paper -> the table row its example says it trains: (table spec, row id, budget override or None)
ROWS = {"rela": ("configs/rela/table1.yaml", 7, None),  # ReLA-g in all three attention types
        # the smoke budget with the λ = 0.01 of the converged Table 4 (the smoke page's row 5 has λ = 1)
        "reluformer": ("configs/reluformer/table4_multi30k_converged.yaml", 5, "configs/multi30k/small_cpu.yaml"),
        "eatt": ("configs/eatt/table4_multi30k.yaml", 2, None),
        "flexible": ("configs/flexible/table1_multi30k_en_de.yaml", 3, None)}
# settings fairseq derives from others (optimization.lr, dataset.max_tokens, common.tpu)
DERIVED = {("optimizer", "lr"), ("lr_scheduler", "lr"), ("optimizer", "tpu"), ("dataset", "max_tokens_valid")}
# config group -> the fairseq-train flag that picks its component
COMPONENTS = {"task": "task", "criterion": "criterion", "optimizer": "optimizer", "lr_scheduler": "lr-scheduler"}


def _cli_cfg(cmd):
    """``{group: {key: value}}`` of a fairseq-train command as fairseq-train builds its config
    (its parser, then ``convert_namespace_to_omegaconf``); a legacy ``Namespace`` group as a dict."""
    import argparse

    from fairseq.dataclass.utils import convert_namespace_to_omegaconf
    from omegaconf import OmegaConf

    from mt_pipeline.reproduce import check_row

    cfg, out = convert_namespace_to_omegaconf(check_row(cmd)), {}
    for g in cfg:
        v = cfg[g]
        out[g] = (dict(vars(v)) if isinstance(v, argparse.Namespace)
                  else OmegaConf.to_container(v, resolve=True) if OmegaConf.is_config(v) else v)
    return out


def _same(a, b):
    import ast

    norm = lambda v: list(ast.literal_eval(v)) if isinstance(v, str) and v.startswith("(") else (  # noqa: E731
        list(v) if isinstance(v, tuple) else v)
    return norm(a) == norm(b)


@pytest.mark.parametrize("paper", sorted(ROWS))
def test_hydra_example_is_the_table_row_it_names(paper):
    """Each hydra example trains the table row its header names, under the same budget: every key it
    sets equals that row's fairseq-train setting, and every setting of the row's command that is not
    its components' or arch preset's default (the budget's and the row's flags) is set by the example
    to the same value -- so a budget or row edited without its example (or the reverse) fails here.
    The row's side as fairseq-train builds it (its parser, then ``convert_namespace_to_omegaconf``);
    the example's side is its YAML, whose missing keys take the same components' defaults (what
    fairseq-hydra-train's config dataclasses give them)."""
    import argparse

    import yaml
    from fairseq.models import ARCH_MODEL_REGISTRY

    from mt_pipeline import budget as B, tables

    spec_path, rid, budget = ROWS[paper]
    h = yaml.safe_load(open(os.path.join(ROOT, "configs", "hydra", paper, "multi30k_small_cpu.yaml"), encoding="utf-8"))
    spec = tables.load_table(os.path.join(ROOT, spec_path), budget and os.path.join(ROOT, budget))
    row = next(r for r in spec["rows"] if r["id"] == rid)
    assert (h["task"]["source_lang"], h["model"]["_name"]) == (spec["src"], row["arch"])
    cmd = B.build_train_cmd("DATA", "SAVE", row["arch"], spec["src"], spec["tgt"], dict(row["_budget"]["train"]),
                            row.get("fns"), row.get("extra", ""), cpu=True)
    got = _cli_cfg(cmd)
    # the same arch and components with their defaults: what the example gets for a key it leaves out
    base = _cli_cfg(B.build_train_cmd("DATA", "SAVE", row["arch"], spec["src"], spec["tgt"], {}, None, " ".join(
        f"--{flag} {got[g]['_name']}" for g, flag in COMPONENTS.items()), cpu=True))
    p = argparse.ArgumentParser()
    ARCH_MODEL_REGISTRY[row["arch"]].add_args(p)
    model_keys = {a.dest for a in p._actions} - {"help"}
    for g, kv in h.items():
        for k, v in kv.items():
            if v == "???" or k == "save_dir":
                continue
            assert k in got[g], f"{paper}: the example sets {g}.{k}, which fairseq's {g} config has not"
            assert _same(got[g][k], v), f"{paper}: {g}.{k} = {v} in the example, {got[g][k]} in the row"
    for g, kv in got.items():
        if not isinstance(kv, dict):
            continue
        for k, v in kv.items():
            if (g, k) in DERIVED or k in ("save_dir", "data", "user_dir", "_name") or (
                    g == "model" and k not in model_keys):
                continue
            if not _same(v, (base.get(g) or {}).get(k)):
                assert _same((h.get(g) or {}).get(k), v), (f"{paper}: the row sets {g}.{k} = {v}, the example "
                                                          f"{(h.get(g) or {}).get(k, 'leaves it at the default')}")


@needs_data
def test_hydra_refuses_a_misspelt_model_key(data_bin, tmp_path):
    """A typo in ``model:`` fails at build with the key's name, before any update."""
    import subprocess

    cmd = [os.path.join(VENV_BIN, "fairseq-hydra-train"),
           "--config-dir", os.path.join(ROOT, "configs", "hydra", "rela"), "--config-name", "multi30k_small_cpu",
           f"task.data={data_bin}", f"common.user_dir={ROOT}/fairseq_plugins", f"checkpoint.save_dir={tmp_path / 'ck'}",
           "optimization.max_update=2", f"hydra.run.dir={tmp_path / 'hydra'}", *SMALL,
           "+model.rela_norm_epsilon=1e-6"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("TORCH_FORCE")}
    res = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode != 0
    assert "unknown model option(s) rela_norm_epsilon" in res.stderr + res.stdout
    assert not (tmp_path / "ck" / "checkpoint_last.pt").exists()


# where the documentation gives fairseq-hydra-train commands: the README, docs/, the examples' headers
DOCUMENTED = ["README.md", "docs/*.md", "configs/hydra/*/*.yaml"]


def _documented_commands():
    """``[(file, argv)]``: every ``fairseq-hydra-train`` command in :data:`DOCUMENTED`
    (:func:`doc_commands.documented_commands`: code-block lines, inline spans, the examples' header
    comments) split as the shell would, ``$PWD`` replaced by the repository root."""
    import glob
    import shlex

    from doc_commands import documented_commands

    return [(os.path.relpath(path, ROOT), shlex.split(cmd.replace("$PWD", ROOT)))
            for pattern in DOCUMENTED for path in sorted(glob.glob(os.path.join(ROOT, pattern)))
            for _, cmd in documented_commands(path, "fairseq-hydra-train")]


def _compose(argv):
    """The configuration ``fairseq-hydra-train argv`` composes (its ``--config-dir``/``--config-name``
    and overrides; ``hydra.*`` overrides left out), through hydra's compose API as
    ``fairseq_cli.hydra_train`` composes it: fairseq's schema registered under the config's name
    (``hydra_init``), hydra 1.1 semantics (its ``hydra.main`` gives no ``version_base``).  No training.

    Raises:
        hydra.errors.ConfigCompositionException: an override names a key the config has not, or a
            value of the wrong type.
    """
    from fairseq.dataclass.initialize import hydra_init
    from hydra import compose, initialize_config_dir

    opts, overrides, args = {}, [], list(argv[1:])
    while args:
        a = args.pop(0)
        if a in ("--config-dir", "--config-name"):
            opts[a] = args.pop(0)
        elif not a.startswith("hydra."):
            overrides.append(a)
    config_dir = os.path.join(ROOT, opts["--config-dir"])
    hydra_init(opts["--config-name"])
    with initialize_config_dir(config_dir=config_dir, version_base="1.1"):
        return compose(config_name=opts["--config-name"], overrides=overrides)


def test_every_documented_hydra_command_composes():
    """Each fairseq-hydra-train command in the README, docs/ and the examples' headers composes with
    the example it names, and fills every mandatory (``???``) key."""
    from omegaconf import OmegaConf

    cmds = _documented_commands()
    where = sorted({f for f, _ in cmds})
    assert "README.md" in where and len([f for f in where if f.startswith("configs/hydra/")]) == len(ROWS), where
    for path, argv in cmds:
        assert argv[0] == "fairseq-hydra-train", (path, argv)
        cfg = _compose(argv)
        assert not OmegaConf.missing_keys(cfg), (path, argv, OmegaConf.missing_keys(cfg))
        assert not OmegaConf.is_missing(cfg.common, "user_dir"), (path, argv)


def test_documented_bf16_command_trains_in_bf16_on_a_gpu(monkeypatch):
    """The README's bf16 command composes to ``common.cpu=false``, ``common.bf16=true`` (no ``tpu``),
    and the plugin's precision guard accepts it on a CUDA machine (CUDA faked: no GPU needed, no
    training).  The examples set ``common.cpu: true`` (the smoke rows' ``--cpu``): ``common.bf16=true``
    alone is refused by that guard ("bf16 training needs a CUDA GPU and --cpu is given")."""
    import torch

    from fairseq_plugins.models import precision

    cmds = [(path, argv) for path, argv in _documented_commands() if "common.bf16=true" in argv]
    assert any(path == "README.md" for path, _ in cmds), "the README gives no fairseq-hydra-train bf16 command"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    for path, argv in cmds:
        cfg = _compose(argv)
        assert (cfg.common.cpu, cfg.common.bf16, cfg.common.tpu) == (False, True, False), (path, argv)
        monkeypatch.setattr(precision, "training_config", lambda: cfg)
        precision.check_precision_flags()  # raises ValueError if fairseq could not train it here
        # the guard is live: the same command without common.cpu=false stops at it
        cpu = _compose([a for a in argv if a != "common.cpu=false"])
        monkeypatch.setattr(precision, "training_config", lambda: cpu)
        with pytest.raises(ValueError, match="--cpu is given"):
            precision.check_precision_flags()
