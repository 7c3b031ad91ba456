"""Shared builders for the tests (tiny models over a toy dictionary; no data files needed)."""

import argparse
import os
import subprocess
import sys

import pytest
import torch
from fairseq.data import Dictionary
from fairseq.models import ARCH_CONFIG_REGISTRY, ARCH_MODEL_REGISTRY
from fairseq.tasks.translation import TranslationTask

import fairseq_plugins  # noqa: F401  (registers archs)
import fairseq_plugins.attention.triton as tk

#: the Triton tests: the interpreter ones need the package, the compiled ones a CUDA GPU too
needs_triton = pytest.mark.skipif(not tk.triton_available(),
                                  reason="triton is not installed (pip install -e .[gpu])")
needs_cuda = pytest.mark.skipif(not (torch.cuda.is_available() and tk.triton_available()),
                                reason="needs a CUDA GPU and triton")


def toy_dictionary(n_words: int = 40) -> Dictionary:
    d = Dictionary()
    for i in range(n_words):
        d.add_symbol(f"w{i}")
    d.finalize(padding_factor=1)
    return d


def toy_task(dictionary=None):
    d = dictionary or toy_dictionary()
    args = argparse.Namespace(source_lang="src", target_lang="tgt", left_pad_source=True,
                              left_pad_target=False, data="", max_source_positions=1024,
                              max_target_positions=1024)
    return TranslationTask(args, d, d)


def build(arch: str, task=None, **overrides):
    """Build ``arch`` with tiny sizes (2+2 layers, d 16, 2 heads, no dropout) plus ``overrides``."""
    task = task or toy_task()
    args = argparse.Namespace(
        encoder_embed_dim=16, decoder_embed_dim=16, encoder_ffn_embed_dim=32,
        decoder_ffn_embed_dim=32, encoder_layers=2, decoder_layers=2,
        encoder_attention_heads=2, decoder_attention_heads=2, dropout=0.0,
        attention_dropout=0.0, activation_dropout=0.0, share_all_embeddings=True,
    )
    for k, v in overrides.items():  # None removes a tiny default (the arch's value is used)
        if v is None:
            args.__dict__.pop(k, None)
        else:
            setattr(args, k, v)
    ARCH_CONFIG_REGISTRY[arch](args)
    return ARCH_MODEL_REGISTRY[arch].build_model(args, task), task


def toy_batch(task, bsz=3, src_len=7, tgt_len=6, seed=0):
    """A padded batch: sources left-padded with different lengths, targets right-padded."""
    g = torch.Generator().manual_seed(seed)
    d = task.source_dictionary
    lo, hi = d.nspecial, len(d)
    src = torch.randint(lo, hi, (bsz, src_len), generator=g)
    src[:, -1] = d.eos()
    src_lengths = torch.tensor([src_len - (i % 3) for i in range(bsz)])
    for i, n in enumerate(src_lengths.tolist()):
        src[i, : src_len - n] = d.pad()  # left padding
    prev = torch.randint(lo, hi, (bsz, tgt_len), generator=g)
    prev[:, 0] = d.eos()
    return src, src_lengths, prev


# ---- real data and CLI runs (end-to-end tests) -----------------------------------------------
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
#: the raw Multi30k En-De of the shared data folder (end-to-end tests skip without it)
MULTI30K_RAW = os.path.join(os.path.dirname(ROOT), "shared", "data", "multi30k_en_de", "raw")
#: the virtualenv's bin directory (fairseq-* CLIs, python)
VENV_BIN = os.path.dirname(sys.executable)


def run_cli(cmd):
    """Run ``cmd`` from the repo root with the venv's bin first on PATH; return stdout + stderr.

    Fails the test (with the output tails) on a non-zero exit status.
    """
    env = {k: v for k, v in os.environ.items() if not k.startswith("TORCH_FORCE")}
    env["PATH"] = VENV_BIN + os.pathsep + env.get("PATH", "")
    out = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    assert out.returncode == 0, f"{cmd}\nSTDOUT:{out.stdout[-3000:]}\nSTDERR:{out.stderr[-3000:]}"
    return out.stdout + out.stderr
