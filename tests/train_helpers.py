"""A tiny binarized translation corpus and fairseq-train commands for the reliability tests.

The corpus is synthetic (no data files needed): target = source words reversed with a fixed
word map, 192 training pairs of 3-9 words over 24 words; ``fairseq-preprocess`` binarizes it.
"""

import os
import random
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.path.dirname(sys.executable)


def env():
    """The subprocess environment: one thread, no TORCH_FORCE_* overrides, venv first on PATH."""
    e = {k: v for k, v in os.environ.items() if not k.startswith("TORCH_FORCE")}
    e.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONPATH=ROOT)
    e["PATH"] = BIN + os.pathsep + e.get("PATH", "")
    return e


def run(cmd, check=True, **kw):
    out = subprocess.run(cmd, cwd=ROOT, env=env(), capture_output=True, text=True, **kw)
    if check:
        assert out.returncode == 0, f"{cmd}\nSTDOUT:{out.stdout[-3000:]}\nSTDERR:{out.stderr[-3000:]}"
    return out


def make_databin(out_dir, n_train=192, n_valid=16, seed=0):
    """Write ``out_dir/text/{train,valid}.{src,tgt}`` and binarize them to ``out_dir/bin``."""
    rng = random.Random(seed)
    words = [f"w{i}" for i in range(24)]
    mapping = {w: f"v{(i * 7) % 24}" for i, w in enumerate(words)}
    text = os.path.join(out_dir, "text")
    os.makedirs(text, exist_ok=True)
    for split, n in (("train", n_train), ("valid", n_valid)):
        src = [" ".join(rng.choice(words) for _ in range(rng.randint(3, 9))) for _ in range(n)]
        tgt = [" ".join(mapping[w] for w in reversed(s.split())) for s in src]
        for lang, lines in (("src", src), ("tgt", tgt)):
            with open(os.path.join(text, f"{split}.{lang}"), "w") as f:
                f.write("\n".join(lines) + "\n")
    bin_dir = os.path.join(out_dir, "bin")
    run([sys.executable, "-m", "fairseq_cli.preprocess", "--source-lang", "src", "--target-lang", "tgt",
         "--trainpref", os.path.join(text, "train"), "--validpref", os.path.join(text, "valid"),
         "--destdir", bin_dir, "--joined-dictionary", "--workers", "1"])
    return bin_dir


def train_args(data_bin, save_dir, *extra, arch="reluformer_small"):
    """fairseq-train arguments for a 2+2-layer d-16 model (no dropout), without the program."""
    return [data_bin, "--user-dir", os.path.join(ROOT, "fairseq_plugins"), "--task", "translation",
            "--source-lang", "src", "--target-lang", "tgt", "--arch", arch,
            "--encoder-layers", "2", "--decoder-layers", "2", "--encoder-embed-dim", "16",
            "--decoder-embed-dim", "16", "--encoder-ffn-embed-dim", "32", "--decoder-ffn-embed-dim", "32",
            "--encoder-attention-heads", "2", "--decoder-attention-heads", "2", "--dropout", "0",
            "--optimizer", "adam", "--lr", "0.003", "--lr-scheduler", "fixed",
            "--batch-size", "8", "--required-batch-size-multiple", "1", "--seed", "3",
            "--save-dir", save_dir, "--cpu", "--num-workers", "0", "--log-format", "simple",
            "--log-interval", "1", "--no-epoch-checkpoints", "--no-progress-bar", *extra]


def params(path):
    """The model parameters of a fairseq checkpoint (plugin allow-listed loader)."""
    from fairseq_plugins.checkpoint import load_checkpoint

    return load_checkpoint(path)["model"]


def live_processes(*tokens):
    """Pids of the live (not zombie) processes whose command line -- ``/proc/PID/cmdline``, the
    arguments joined by NUL bytes -- contains every one of ``tokens`` (bytes or str) as a substring;
    a token wrapped in ``b"\\0"`` matches one whole argument.  Linux ``/proc`` only."""
    want = [t.encode() if isinstance(t, str) else t for t in tokens]
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read()
            with open(f"/proc/{pid}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z" and all(t in cmd for t in want):
            found.append(int(pid))
    return found
