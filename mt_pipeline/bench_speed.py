#!/usr/bin/env python
"""ReLA Table 2 on CPU: parameters, training-step throughput and decoding speed vs stock fairseq.

Models (all at the ``*_small`` preset sizes, joined Multi30k vocabulary): fairseq's stock
``transformer`` (the reference), ours with ``softmax``, ReLA-g, sparsemax, 1.5-entmax and
ReLUFormer (eq. 6; ReLUFormer paper: decoding 1.01x of softmax) and E-ATT (binarised selection +
L1 scores; no speed number in its paper) in all three attention types.  Every measurement is a ratio against the stock model *measured in the
same run*, interleaved round-robin over ``--rounds`` rounds so that drift of the machine hits
all models alike; the median over rounds is reported.

* training: forward + backward + Adam step on the same real Multi30k training batches
  (``--max-tokens`` per batch), throughput in target tokens/s;
* decoding: beam search (beam 4) on real test_2016 sources, batch 1 and a large batch; every
  model decodes exactly the same number of steps (``min_len = max_len``) so that speed, not
  output length, is compared.  Throughput in sentences/s.

Usage:  python scripts/bench_speed.py [--rounds 3] [--train-batches 6] [--decode-sents 24]
            [--big-batch 128] [--out results/rela/table2_speed_cpu.md]

This is a benchmark, not a test: it prints and writes numbers; it asserts nothing.
"""

import argparse
import os
import statistics
import sys
import time

import torch

from . import experiment, provenance
from .atomic import atomic_path

ROOT = experiment.ROOT

MODELS = {
    "stock transformer (fairseq)": ("stock_transformer_small", None),
    "ours: softmax": ("rela_transformer_small", "softmax"),
    "ReLA-g": ("rela_transformer_small", "rela_g"),
    "sparsemax": ("rela_transformer_small", "sparsemax"),
    "1.5-entmax": ("rela_transformer_small", "entmax15"),
    "ReLUFormer": ("reluformer_small", "reluformer"),
    "E-ATT": ("eatt_transformer_small", "eatt"),
}
PAPER = {"ours: softmax": ("1.00×", "1.00×"), "ReLA-g": ("0.93×", "0.98×"),
         "sparsemax": ("0.26×", "0.54×"), "1.5-entmax": ("0.27×", "0.49×"),
         "ReLUFormer": ("n/a", "1.01×"), "E-ATT": ("n/a", "n/a")}  # ReLUFormer paper: decoding speed 1.01x of softmax


def build_models(data_bin, src, tgt, extra_archs=()):
    from fairseq import options, tasks

    import fairseq_plugins  # noqa: F401

    models, task = {}, None
    for label, (arch, fn) in MODELS.items():
        argv = [data_bin, "--arch", arch, "--task", "translation", "--source-lang", src, "--target-lang", tgt,
                "--user-dir", os.path.join(ROOT, "fairseq_plugins"), "--dropout", "0.1"]
        if fn:
            argv += ["--encoder-attention-fn", fn, "--decoder-attention-fn", fn, "--cross-attention-fn", fn]
        args = options.parse_args_and_arch(options.get_training_parser(), argv)
        if task is None:
            task = tasks.setup_task(args)
            task.load_dataset("train")
            task.load_dataset("test")
        torch.manual_seed(1)
        models[label] = task.build_model(args)
    return models, task


def train_batches(task, max_tokens, n):
    ds = task.dataset("train")
    itr = task.get_batch_iterator(ds, max_tokens=max_tokens, seed=1, required_batch_size_multiple=1)
    it = itr.next_epoch_itr(shuffle=True)
    return [next(it) for _ in range(n)]


def time_training(model, batches, criterion):
    model.train()
    opt = torch.optim.Adam(model.parameters(), lr=1e-4, betas=(0.9, 0.98))
    # warm-up step (allocations, lazy init) not timed
    loss, _, _ = criterion(model, batches[0])
    loss.backward()
    opt.zero_grad()
    tokens, t0 = 0, time.perf_counter()
    for b in batches:
        loss, _, _ = criterion(model, b)
        loss.backward()
        opt.step()
        opt.zero_grad()
        tokens += b["ntokens"]
    return tokens / (time.perf_counter() - t0)


def time_decoding(model, task, samples, beam, steps):
    from fairseq.sequence_generator import SequenceGenerator

    model.eval()
    gen = SequenceGenerator([model], task.target_dictionary, beam_size=beam, min_len=steps,
                            max_len_a=0, max_len_b=steps)
    n, t0 = 0, time.perf_counter()
    with torch.no_grad():
        for s in samples:
            gen.forward(s)
            n += s["nsentences"]
    return n / (time.perf_counter() - t0)


def decode_samples(task, n_sents, batch):
    ds = task.dataset("test")
    samples = []
    for start in range(0, n_sents, batch):
        ids = list(range(start, min(start + batch, n_sents)))
        samples.append(ds.collater([ds[i] for i in ids]))
    return samples


def peak_child(a):
    """Child process: build one model, run the training batches and one batch-1 and one big-batch
    decode; print the extra peak resident memory (MiB) over the state after building."""
    import json

    from fairseq.criterions.label_smoothed_cross_entropy import LabelSmoothedCrossEntropyCriterion

    keep = {a._peak: MODELS[a._peak]}
    MODELS.clear()
    MODELS.update(keep)
    models, task = build_models(a.data_bin, a.src, a.tgt)
    crit = LabelSmoothedCrossEntropyCriterion(task, sentence_avg=False, label_smoothing=0.1)
    batches = train_batches(task, a.max_tokens, a.train_batches)
    big = decode_samples(task, a.big_batch, a.big_batch)
    def status_mib(field):
        with open("/proc/self/status") as f:
            return next(int(l.split()[1]) for l in f if l.startswith(field + ":")) / 1024

    import gc

    gc.collect()
    with open("/proc/self/clear_refs", "w") as f:  # reset the peak (VmHWM) to the current RSS
        f.write("5")
    base = status_mib("VmRSS")
    m = models[a._peak]
    time_training(m, batches, crit)
    time_decoding(m, task, big, a.beam, a.steps)
    print("PEAK " + json.dumps({"peak_mib": status_mib("VmHWM") - base}))


def peak_memory(a, label):
    """Extra peak resident memory (MiB) of training + big-batch decoding of one model, measured
    in a fresh process (CPU has no per-model allocator statistics): Linux VmHWM after resetting
    it (``/proc/self/clear_refs``) once the model and data are loaded, minus VmRSS then."""
    import json
    import subprocess

    argv = [sys.executable, "-m", "mt_pipeline.bench_speed", "--_peak", label, "--data-bin", a.data_bin, "--src", a.src,
            "--tgt", a.tgt, "--train-batches", str(a.train_batches), "--max-tokens", str(a.max_tokens),
            "--big-batch", str(a.big_batch), "--steps", str(a.steps), "--beam", str(a.beam)]
    out = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT)
    for line in out.stdout.splitlines():
        if line.startswith("PEAK "):
            return json.loads(line[5:])["peak_mib"]
    return float("nan")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data-bin", default=os.path.join(ROOT, "data-bin", "multi30k_en_de", "bin"))
    p.add_argument("--src", default="en")
    p.add_argument("--tgt", default="de")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--train-batches", type=int, default=6)
    p.add_argument("--max-tokens", type=int, default=4096)
    p.add_argument("--decode-sents", type=int, default=24, help="sentences decoded with batch 1")
    p.add_argument("--big-batch", type=int, default=128, help="sentences in the large-batch decode")
    p.add_argument("--steps", type=int, default=20, help="decoding steps per sentence (forced)")
    p.add_argument("--beam", type=int, default=4)
    p.add_argument("--out", default=os.path.join(ROOT, "results", "rela", "table2_speed_cpu.md"))
    p.add_argument("--no-memory", action="store_true", help="skip the peak-memory subprocesses")
    p.add_argument("--_peak", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a._peak:
        peak_child(a)
        return 0
    if not os.path.isdir(a.data_bin):
        p.error(f"{a.data_bin} not found: run data-prep/multi30k/prepare.sh first")
    from fairseq.criterions.label_smoothed_cross_entropy import LabelSmoothedCrossEntropyCriterion

    t_start = time.time()
    models, task = build_models(a.data_bin, a.src, a.tgt)
    crit = LabelSmoothedCrossEntropyCriterion(task, sentence_avg=False, label_smoothing=0.1)
    batches = train_batches(task, a.max_tokens, a.train_batches)
    one = decode_samples(task, a.decode_sents, 1)
    big = decode_samples(task, a.big_batch, a.big_batch)
    meas = {k: {"train": [], "dec1": [], "decB": []} for k in models}
    for r in range(a.rounds):
        for label, m in models.items():  # interleaved: every round visits every model
            torch.manual_seed(r)
            meas[label]["train"].append(time_training(m, batches, crit))
            meas[label]["dec1"].append(time_decoding(m, task, one, a.beam, a.steps))
            meas[label]["decB"].append(time_decoding(m, task, big, a.beam, a.steps))
            print(f"[bench] round {r + 1}/{a.rounds} {label}: train {meas[label]['train'][-1]:.0f} tok/s, "
                  f"decode b1 {meas[label]['dec1'][-1]:.2f} sent/s, b{a.big_batch} {meas[label]['decB'][-1]:.1f} sent/s",
                  flush=True)
    med = {k: {m: statistics.median(v) for m, v in d.items()} for k, d in meas.items()}
    peak = {k: float("nan") if a.no_memory else peak_memory(a, k) for k in models}
    ref = med["stock transformer (fairseq)"]
    hw = provenance.hardware()
    lines = [
        "# ReLA Table 2 on CPU: parameters and speed relative to stock fairseq `transformer`",
        "",
        "**Regime: benchmark** -- speed and memory ratios against the baseline measured in the same run on this "
        "machine's CPU; neither smoke, converged nor paper scale (untrained models, no seeds); no GPU numbers "
        "(those wait for a lent GPU: `results/gpu/`).",
        "",
        "Paper (Zhang et al. 2021, Table 2): WMT14 En-De Transformer base on a GTX 1080 Ti, TensorFlow; "
        "ΔTrain per training step, ΔDecode with batch size 1.",
        f"Ours: `*_small` preset (3+3 layers, d 256, 4 heads), Multi30k vocabulary, {hw['cpu']}, "
        f"{hw['torch_threads']} torch threads, torch {hw['torch']}. Median of {a.rounds} interleaved rounds; "
        f"training = {a.train_batches} real batches of ≤{a.max_tokens} tokens (fwd+bwd+Adam); decoding = beam "
        f"{a.beam}, exactly {a.steps} steps per sentence, {a.decode_sents} test_2016 sentences at batch 1 and "
        f"{a.big_batch} at batch {a.big_batch}.",
        "",
        "Targets (issue): ours-softmax ≥ 0.98×; ReLA-g ≥ 0.97× training and ≥ 0.98× decoding. "
        "Peak MiB: extra peak resident memory of the training batches + one big-batch decode, each model in a "
        "fresh process (Δpeak: ratio to the stock model, same run).",
        "",
        "| model | #params | train tok/s | ΔTrain | decode b=1 sent/s | ΔDecode b=1 | "
        f"decode b={a.big_batch} sent/s | ΔDecode b={a.big_batch} | peak MiB | Δpeak | paper ΔTrain / ΔDecode |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for label, m in models.items():
        n = sum(p.numel() for p in m.parameters())
        x = med[label]
        paper = " / ".join(PAPER.get(label, ("1.00×", "1.00×"))) if label in PAPER else "reference"
        lines.append(f"| {label} | {n / 1e6:.3f}M | {x['train']:.0f} | {x['train'] / ref['train']:.3f}× | "
                     f"{x['dec1']:.2f} | {x['dec1'] / ref['dec1']:.3f}× | {x['decB']:.1f} | "
                     f"{x['decB'] / ref['decB']:.3f}× | {peak[label]:.0f} | "
                     f"{peak[label] / peak['stock transformer (fairseq)']:.2f}× | {paper} |")
    lines += ["", "Per-round measurements (train tok/s; decode b=1, b=big sent/s):", ""]
    for label, d in meas.items():
        lines.append(f"- {label}: train {[round(v) for v in d['train']]}; b1 {[round(v, 2) for v in d['dec1']]}; "
                     f"big {[round(v, 1) for v in d['decB']]}")
    dictionary = os.path.join(a.data_bin, f"dict.{a.src}.txt")
    record = provenance.collect(
        provenance.command_line("python scripts/bench_speed.py", sys.argv[1:]), regime="benchmark",
        data={"data_bin": provenance.repo_relative(a.data_bin), "prepared_by": "data-prep/multi30k/prepare.sh defaults",
              "dictionary_sha256": provenance.file_sha256(dictionary) if os.path.exists(dictionary) else "n/a"},
        wall_s=round(time.time() - t_start, 1))
    lines += ["", provenance.markdown(record)]
    os.makedirs(os.path.dirname(a.out), exist_ok=True)
    with atomic_path(a.out) as tmp, open(tmp, "w", encoding="utf-8") as f:
        f.write("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
