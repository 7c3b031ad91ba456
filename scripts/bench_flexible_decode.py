#!/usr/bin/env python
"""CPU decoding time per sentence: global vs flexible attention (Flexible Attention, Table 3).

The paper's protocol (Section 5.5): the decoder is fed the *reference* tokens (forced decoding), so
both models run the same number of steps; every step is a real incremental decoding step (cached
keys ``W_k h̄``, the LSTM cell, attention, pre-output layer and the full output softmax), one
sentence at a time, on one CPU thread.  Inputs are long: ``--concat K`` consecutive sentences of a
binarized subset are joined (source and reference), and only inputs of at least ``--min-len``
source positions are kept.  The two models are timed interleaved (alternating order each round),
CPU time by ``time.process_time``, and the ratio global / flexible is printed.

    OMP_NUM_THREADS=1 python scripts/bench_flexible_decode.py \\
        --flexible runs/flexible_table1_de_en/row4/average_last1.pt --tau 1.2 \\
        --global-checkpoint runs/flexible_table1_de_en/row1/average_last3.pt \\
        --data-bin data-bin/multi30k_en_de/bin --src de --tgt en --out results/flexible/table3_decode_time.md

Without ``--global-checkpoint`` the baseline is the flexible checkpoint with ``tau = inf`` (every
position scored; it also computes the gate, so it is slightly slower than a global model).
Raises SystemExit on missing files or too few long inputs.
"""

import argparse
import os
import platform
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from atomic import atomic_path  # noqa: E402


def load(path, data_bin, src, tgt, tau=None):
    import fairseq_plugins  # noqa: F401
    from fairseq import checkpoint_utils

    over = {"data": data_bin, "source_lang": src, "target_lang": tgt}
    if tau is not None:
        over["flexible_threshold"] = tau
    models, cfg, task = checkpoint_utils.load_model_ensemble_and_task([path], arg_overrides=over)
    m = models[0].eval()
    if not hasattr(m.decoder, "attention"):
        raise SystemExit(f"{path} is not an rnnsearch checkpoint")
    return m, task


def long_inputs(task, subset, concat, min_len, n):
    """``n`` (source, reference) token tensors of >= ``min_len`` source positions, each ``concat``
    consecutive sentences joined (EOS kept only at the end)."""
    import torch

    task.load_dataset(subset)
    ds = task.dataset(subset)
    eos = task.source_dictionary.eos()
    out = []
    for start in range(0, len(ds) - concat + 1, concat):
        items = [ds[i] for i in range(start, start + concat)]
        src = torch.cat([it["source"][:-1] for it in items] + [items[0]["source"].new_tensor([eos])])
        ref = torch.cat([it["target"][:-1] for it in items] + [items[0]["target"].new_tensor([eos])])
        if len(src) >= min_len:
            out.append((src, ref))
        if len(out) == n:
            break
    if len(out) < n:
        raise SystemExit(f"only {len(out)} inputs of >= {min_len} positions with --concat {concat}; "
                         "raise --concat or lower --n")
    return out


def forced_decode(model, src, ref):
    """Incremental forced decoding of one sentence: log-probs of every step, reference as feedback."""
    import torch

    with torch.no_grad():
        src = src.unsqueeze(0)
        enc = model.encoder(src, torch.tensor([src.size(1)]))
        eos = model.decoder.dictionary.eos()
        prev = torch.cat([ref.new_tensor([eos]), ref[:-1]]).unsqueeze(0)
        state = {}
        for t in range(prev.size(1)):
            logits, _ = model.decoder(prev[:, : t + 1], enc, incremental_state=state)
            torch.log_softmax(logits, -1)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--flexible", required=True, help="flexible-attention rnnsearch checkpoint")
    p.add_argument("--global-checkpoint", help="global-attention rnnsearch checkpoint (baseline)")
    p.add_argument("--tau", type=float, default=1.2, help="threshold of the flexible model (paper 1.0-1.2)")
    p.add_argument("--data-bin", required=True)
    p.add_argument("--src", required=True)
    p.add_argument("--tgt", required=True)
    p.add_argument("--subset", default="test")
    p.add_argument("--concat", type=int, default=10, help="sentences joined into one input")
    p.add_argument("--min-len", type=int, default=100, help="minimum source positions of an input")
    p.add_argument("--n", type=int, default=20, help="number of long inputs")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--out", help="also write a Markdown table here (atomically)")
    a = p.parse_args(argv)
    for f in [a.flexible, a.global_checkpoint]:
        if f and not os.path.exists(f):
            raise SystemExit(f"checkpoint not found: {f}")
    import torch

    torch.set_num_threads(1)
    flex, task = load(a.flexible, a.data_bin, a.src, a.tgt, tau=a.tau)
    if a.global_checkpoint:
        base, _ = load(a.global_checkpoint, a.data_bin, a.src, a.tgt)
        base_name = f"global attention ({os.path.relpath(a.global_checkpoint, ROOT)})"
    else:
        base, _ = load(a.flexible, a.data_bin, a.src, a.tgt, tau="inf")
        base_name = "flexible checkpoint with tau = inf (all positions scored)"
    if flex.decoder.attention.kind != "flexible":
        raise SystemExit(f"--flexible {a.flexible} has {flex.decoder.attention.kind} attention, not flexible")
    data = long_inputs(task, a.subset, a.concat, a.min_len, a.n)
    src_len = sum(len(s) for s, _ in data) / len(data)
    steps = sum(len(r) for _, r in data) / len(data)
    forced_decode(flex, *data[0]), forced_decode(base, *data[0])  # warm-up
    for m in (flex, base):
        m.decoder.attention.reset_window_stats()
    times = {"base": 0.0, "flex": 0.0}
    for r in range(a.rounds):
        order = ("base", "flex") if r % 2 == 0 else ("flex", "base")
        for src, ref in data:
            for name in order:
                m = base if name == "base" else flex
                t0 = time.process_time()
                forced_decode(m, src, ref)
                times[name] += time.process_time() - t0
    n = a.rounds * len(data)
    ms = {k: 1000 * v / n for k, v in times.items()}
    ratio = ms["base"] / ms["flex"]
    win_b, win_f = base.decoder.attention.average_window(), flex.decoder.attention.average_window()
    try:
        commit = subprocess.check_output(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, text=True).strip()
    except (OSError, subprocess.CalledProcessError):
        commit = "unknown"
    print(f"inputs: {len(data)} x {a.rounds} rounds, avg source length {src_len:.1f}, avg steps {steps:.1f}")
    print(f"baseline: {base_name}: {ms['base']:.1f} ms/sentence (window {win_b:.1f})")
    print(f"flexible tau={a.tau:g}: {ms['flex']:.1f} ms/sentence (window {win_f:.1f})")
    print(f"speed-up global/flexible: {ratio:.2f}x")
    if a.out:
        cpu = platform.processor() or platform.machine()
        try:
            cpu = [l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")][0]
        except (OSError, IndexError):
            pass
        text = "\n".join([
            "# Flexible Attention Table 3: CPU decoding time per sentence", "",
            "Paper (character-level En-Ja, Theano, one core): global 751 ms, flexible 677 ms (1.11x).", "",
            f"Protocol: reference tokens forced as feedback (same steps for both), incremental decoding "
            f"with cached keys and full output softmax, one sentence at a time, 1 thread, "
            f"{a.rounds} interleaved rounds over {len(data)} inputs of {a.concat} concatenated "
            f"{a.subset} sentences ({a.src}→{a.tgt}, >= {a.min_len} positions; average source length "
            f"{src_len:.1f}, {steps:.1f} steps).", "",
            "| Model | window | CPU time / sentence |", "|---|---|---|",
            f"| {base_name} | {win_b:.1f} | {ms['base']:.1f} ms |",
            f"| Flexible Attention (tau={a.tau:g}, `{os.path.relpath(a.flexible, ROOT)}`) | {win_f:.1f} | {ms['flex']:.1f} ms |",
            "", f"Speed-up: **{ratio:.2f}x** (target >= 1.2x on inputs >= 100 positions).", "",
            f"Command: `python scripts/bench_flexible_decode.py {' '.join(argv if argv is not None else sys.argv[1:])}`; "
            f"git {commit}; CPU {cpu}; torch {torch.__version__}.", ""])
        os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
        with atomic_path(a.out) as tmp, open(tmp, "w") as f:
            f.write(text)
        print(f"wrote {a.out}")
    return ratio


if __name__ == "__main__":
    main()
