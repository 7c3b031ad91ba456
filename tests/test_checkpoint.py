"""Checkpoints load under torch's weights-only unpickler via the plugin's allow-list."""

import argparse
import os
import pickle
import subprocess
import sys

import numpy as np
import pytest
import torch
from fairseq.dataclass.utils import convert_namespace_to_omegaconf

from fairseq_plugins.checkpoint import UnsafeCheckpointError, load_checkpoint
from helpers import build

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _fairseq_like_state(model, args):
    """What fairseq's trainer stores: a Namespace, an omegaconf cfg, numpy scalars, tensors."""
    return {
        "args": args,
        "cfg": convert_namespace_to_omegaconf(args),
        "model": model.state_dict(),
        "extra_state": {"val_loss": np.float64(3.25), "best": np.float32(3.0),
                        "train_iterator": {"epoch": 2, "iterations_in_epoch": 7}},
        "optimizer_history": [{"criterion_name": "X", "optimizer_name": "Y", "num_updates": 5}],
    }


def _args():
    from fairseq import options

    parser = options.get_training_parser()
    return options.parse_args_and_arch(
        parser, ["/data", "--arch", "rela_transformer_small", "--user-dir", os.path.join(ROOT, "fairseq_plugins"),
                 "--task", "translation", "--optimizer", "adam", "--lr", "0.001"])


def test_fairseq_checkpoint_loads_weights_only(tmp_path):
    model, _ = build("rela_transformer_small")
    path = tmp_path / "ckpt.pt"
    torch.save(_fairseq_like_state(model, _args()), path)
    state = load_checkpoint(str(path))
    assert isinstance(state["args"], argparse.Namespace)
    assert state["cfg"].model.arch == "rela_transformer_small"
    assert torch.equal(state["model"]["encoder.embed_tokens.weight"],
                       model.state_dict()["encoder.embed_tokens.weight"])
    # plain torch.load (weights_only=True by default in torch >= 2.6) in a fresh interpreter
    # with no environment variable: importing the plugin is enough.
    env = {k: v for k, v in os.environ.items() if not k.startswith("TORCH_FORCE")}
    code = ("import sys, torch; sys.path.insert(0, %r); import fairseq_plugins; "
            "s = torch.load(%r); print(s['cfg'].model.arch)" % (ROOT, str(path)))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().endswith("rela_transformer_small")


class _Evil:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_crafted_checkpoint_is_refused_and_nothing_runs(tmp_path):
    marker = tmp_path / "pwned"
    path = tmp_path / "evil.pt"
    torch.save({"model": {}, "args": _Evil(marker)}, path)
    with pytest.raises(UnsafeCheckpointError) as e:
        load_checkpoint(str(path))
    assert "posix.system" in str(e.value) and str(path) in str(e.value)
    assert "add_safe_globals" in str(e.value) and "Nothing from it was executed" in str(e.value)
    with pytest.raises(pickle.UnpicklingError):
        torch.load(path)  # the default loader refuses too
    assert not marker.exists()


@pytest.mark.parametrize("cli", ["fairseq-generate", "fairseq-interactive"])
def test_crafted_checkpoint_is_refused_by_the_fairseq_clis(cli, tmp_path):
    """The plugin's allow-list is what fairseq-generate / fairseq-interactive load under: the
    pickled os.system call is refused before it runs; the traceback ends with the plugin's
    message (the file, the global, how to allow-list a trusted type) in place of torch's, whose
    advice to re-run with weights_only=False is not printed."""
    import train_helpers as th

    data_bin = th.make_databin(str(tmp_path / "toy"), n_train=16, n_valid=4)
    marker = tmp_path / "pwned"
    path = tmp_path / "evil.pt"
    torch.save({"model": {}, "args": _Evil(marker), "cfg": None}, path)
    cmd = [os.path.join(th.BIN, cli), data_bin, "--user-dir", os.path.join(ROOT, "fairseq_plugins"),
           "--path", str(path), "--cpu", "--source-lang", "src", "--target-lang", "tgt"]
    if cli == "fairseq-generate":
        cmd += ["--gen-subset", "valid"]
    res = th.run(cmd, check=False, input="w1 w2\n", timeout=120)
    assert res.returncode != 0
    assert "_pickle.UnpicklingError: (explained by fairseq_plugins below)" in res.stderr, res.stderr[-2000:]
    assert "weights_only` set to `False`" not in res.stderr and "Weights only load failed" not in res.stderr
    plugin = res.stderr.split("fairseq_plugins: refusing to load ", 1)
    assert len(plugin) == 2, res.stderr[-2000:]
    assert plugin[1].startswith(f"{path}: its pickle references posix.system")
    assert "add_safe_globals" in plugin[1] and "Nothing from it was executed" in plugin[1]
    assert not marker.exists()
