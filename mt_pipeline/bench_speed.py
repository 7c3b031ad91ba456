#!/usr/bin/env python
"""ReLA Table 2: parameters, training-step throughput and decoding speed vs stock fairseq, on CPU
(default) or on a GPU (``--device cuda [--dtype bf16]``: the paper's setting was a GTX 1080 Ti).

Models (at the ``*_small`` preset sizes, or with ``--size base`` at Transformer base, the
paper's size: :data:`SIZES`; joined Multi30k vocabulary unless ``--data-bin`` names another):
fairseq's stock ``transformer`` (the reference), ours with ``softmax``, ReLA-g, sparsemax, 1.5-entmax and
ReLUFormer (eq. 6; ReLUFormer paper: decoding 1.01x of softmax) and E-ATT (binarised selection +
L1 scores; no speed number in its paper) in all three attention types.  Every measurement is a ratio against the stock model *measured in the
same run*, interleaved round-robin over ``--rounds`` rounds so that drift of the machine hits
all models alike; the median over rounds is reported.

* training: forward + backward + Adam step on the same real training batches of ``--data-bin``
  (Multi30k by default; ``--max-tokens`` per batch), throughput in target tokens/s;
* decoding: beam search (beam 4) on real sources of its ``test`` split (Multi30k: test_2016),
  batch 1 and a large batch; every
  model decodes exactly the same number of steps (``min_len = max_len``) so that speed, not
  output length, is compared.  Throughput in sentences/s.

On ``--device cuda`` every timer brackets synchronised work (``torch.cuda.synchronize`` before
and after), batches are moved to the GPU before it starts, and peak memory is read from torch's
CUDA allocator in the same process (:func:`peak_cuda`); on CPU each model's peak resident memory is
measured in a fresh process (:func:`peak_memory`).

Usage:  python scripts/bench_speed.py [--rounds 3] [--train-batches 6] [--decode-sents 24]
            [--big-batch 128] [--device cpu|cuda] [--dtype fp32|bf16|fp16] [--size small|base]
            [--out results/rela/table2_speed_cpu.md]

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
DEFAULT_DATA_BIN = os.path.join(ROOT, "data-bin", "multi30k_en_de", "bin")

MODELS = {
    "stock transformer (fairseq)": ("stock_transformer_small", None),
    "ours: softmax": ("rela_transformer_small", "softmax"),
    "ReLA-g": ("rela_transformer_small", "rela_g"),
    "sparsemax": ("rela_transformer_small", "sparsemax"),
    "1.5-entmax": ("rela_transformer_small", "entmax15"),
    "ReLUFormer": ("reluformer_small", "reluformer"),
    "E-ATT": ("eatt_transformer_small", "eatt"),
}
#: model sizes (``--size``): how the page describes them, and the architecture each
#: :data:`MODELS` architecture is replaced by at that size ("small": as in MODELS)
SIZES = {
    "small": ("`*_small` preset (3+3 layers, d 256, 4 heads, FFN 1024, all embeddings shared)", {}),
    "base": ("Transformer base (6+6 layers, d 512, 8 heads, FFN 2048: fairseq's `transformer`, our "
             "`rela_transformer` / `reluformer` / `eatt_transformer`; the paper's size; all embeddings shared "
             "when the dictionary is joined, else the target embedding tied to the softmax)",
             {"stock_transformer_small": "transformer", "rela_transformer_small": "rela_transformer",
              "reluformer_small": "reluformer", "eatt_transformer_small": "eatt_transformer"}),
}


def arch_of(label: str, size: str = "small") -> str:
    """The fairseq architecture of the :data:`MODELS` entry ``label`` at ``size`` (a key of :data:`SIZES`).

    Raises:
        KeyError: an unknown label or size."""
    arch = MODELS[label][0]
    return SIZES[size][1].get(arch, arch)


PAPER = {"ours: softmax": ("1.00×", "1.00×"), "ReLA-g": ("0.93×", "0.98×"),
         "sparsemax": ("0.26×", "0.54×"), "1.5-entmax": ("0.27×", "0.49×"),
         "ReLUFormer": ("n/a", "1.01×"), "E-ATT": ("n/a", "n/a")}  # ReLUFormer paper: decoding speed 1.01x of softmax


#: where the speed benchmarks run (``--device``) and in which precision (``--dtype``: the model's
#: parameters and activations, as ``fairseq-train --bf16`` / ``--fp16`` convert the model)
DEVICES = ("cpu", "cuda")
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def device_problem(device: str, dtype: str):
    """Why ``--device device --dtype dtype`` cannot run here, or None.  Half precision is measured on
    a GPU only (no paper's setting and no user's runs half precision on CPU); ``cuda`` needs torch to
    see a CUDA device.  Every message names the valid choices."""
    if device not in DEVICES:
        return f"--device {device}: valid choices: {', '.join(DEVICES)}"
    if dtype not in DTYPES:
        return f"--dtype {dtype}: valid choices: {', '.join(DTYPES)}"
    if device == "cpu" and dtype != "fp32":
        return f"--dtype {dtype} needs --device cuda (on cpu the benchmark runs fp32)"
    if device == "cuda" and not torch.cuda.is_available():
        return "--device cuda: torch sees no CUDA device here; use --device cpu"
    return None


def build_models(data_bin, src, tgt, extra_archs=(), device="cpu", dtype="fp32", size="small"):
    """Every model of :data:`MODELS` (same seed, untrained) at ``size`` (a key of :data:`SIZES`), on
    ``device`` in ``dtype`` (a key of :data:`DTYPES`), with the translation task that loaded the
    ``train`` and ``test`` splits of ``data_bin``.  Returns ``(models, task)``: ``{label: model}`` in
    :data:`MODELS` order."""
    from fairseq import options, tasks

    import fairseq_plugins  # noqa: F401

    models, task = {}, None
    # the small presets share all embeddings; base does so too when the dictionary is joined, and
    # with separate dictionaries (ReLA's WMT14 En-De prep, the released code's vocabularies) ties the
    # target embedding to the softmax, as the paper-scale training does (configs/rela/paper_base.yaml)
    joined = size == "small" or _joined(data_bin, src, tgt)
    share = size != "small" and joined
    for label, (_, fn) in MODELS.items():
        argv = [data_bin, "--arch", arch_of(label, size), "--task", "translation", "--source-lang", src, "--target-lang", tgt,
                "--user-dir", os.path.join(ROOT, "fairseq_plugins"), "--dropout", "0.1"]
        if share:
            argv.append("--share-all-embeddings")
        elif not joined:
            argv.append("--share-decoder-input-output-embed")
        if fn:
            argv += ["--encoder-attention-fn", fn, "--decoder-attention-fn", fn, "--cross-attention-fn", fn]
        args = options.parse_args_and_arch(options.get_training_parser(), argv)
        if task is None:
            task = tasks.setup_task(args)
            task.load_dataset("train")
            task.load_dataset("test")
        torch.manual_seed(1)
        models[label] = task.build_model(args).to(device=torch.device(device), dtype=DTYPES[dtype])
    return models, task


def _joined(data_bin: str, src: str, tgt: str) -> bool:
    """Whether ``data_bin``'s source and target dictionaries are one (``--joined-dictionary``)."""
    paths = [os.path.join(data_bin, f"dict.{lang}.txt") for lang in (src, tgt)]
    if not all(os.path.isfile(p) for p in paths):
        return False
    with open(paths[0], "rb") as f1, open(paths[1], "rb") as f2:
        return f1.read() == f2.read()


def _device_of(model):
    return next(model.parameters()).device


def _sync(device):
    """Wait for the device's queued kernels (a no-op on CPU), so a timer brackets finished work."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def on_device(sample, device):
    """``sample`` (a fairseq batch dict) with its tensors on ``device`` (unchanged on CPU)."""
    if device.type != "cuda":
        return sample
    from fairseq.utils import move_to_cuda

    return move_to_cuda(sample, device)


def train_batches(task, max_tokens, n):
    ds = task.dataset("train")
    itr = task.get_batch_iterator(ds, max_tokens=max_tokens, seed=1, required_batch_size_multiple=1)
    it = itr.next_epoch_itr(shuffle=True)
    return [next(it) for _ in range(n)]


def time_training(model, batches, criterion):
    """Target tokens per second of forward + backward + Adam step over ``batches`` on the model's
    device (one untimed warm-up step first; on a GPU the timer brackets synchronised work)."""
    device = _device_of(model)
    batches = [on_device(b, device) for b in batches]
    model.train()
    opt = torch.optim.Adam(model.parameters(), lr=1e-4, betas=(0.9, 0.98))
    # warm-up step (allocations, lazy init) not timed
    loss, _, _ = criterion(model, batches[0])
    loss.backward()
    opt.zero_grad()
    _sync(device)
    tokens, t0 = 0, time.perf_counter()
    for b in batches:
        loss, _, _ = criterion(model, b)
        loss.backward()
        opt.step()
        opt.zero_grad()
        tokens += b["ntokens"]
    _sync(device)
    return tokens / (time.perf_counter() - t0)


def time_decoding(model, task, samples, beam, steps):
    """Sentences per second of beam search (``beam``) over ``samples`` with exactly ``steps``
    steps each (``min_len = max_len``), on the model's device: the samples are moved there and the
    generator built before the timer starts; on a GPU the timer brackets synchronised work."""
    from fairseq.sequence_generator import SequenceGenerator

    device = _device_of(model)
    samples = [on_device(s, device) for s in samples]
    model.eval()
    gen = SequenceGenerator([model], task.target_dictionary, beam_size=beam, min_len=steps,
                            max_len_a=0, max_len_b=steps)
    _sync(device)
    n, t0 = 0, time.perf_counter()
    with torch.no_grad():
        for s in samples:
            gen.forward(s)
            n += s["nsentences"]
    _sync(device)
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
    models, task = build_models(a.data_bin, a.src, a.tgt, size=a.size)
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
            "--big-batch", str(a.big_batch), "--steps", str(a.steps), "--beam", str(a.beam), "--size", a.size]
    out = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT)
    for line in out.stdout.splitlines():
        if line.startswith("PEAK "):
            return json.loads(line[5:])["peak_mib"]
    return float("nan")


def peak_cuda(model, task, batches, big, criterion, beam, steps):
    """Extra peak CUDA memory (MiB) of the training batches + one big-batch decode of ``model``,
    over what was allocated before (the model and its optimizer-free state): the same-process GPU
    counterpart of :func:`peak_memory`, from ``torch.cuda.max_memory_allocated`` after
    ``reset_peak_memory_stats`` (the allocator counts per device, so models measured one after
    the other do not mix)."""
    device = _device_of(model)
    torch.cuda.synchronize(device)
    torch.cuda.empty_cache()
    base = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    time_training(model, batches, criterion)
    time_decoding(model, task, big, beam, steps)
    torch.cuda.synchronize(device)
    return (torch.cuda.max_memory_allocated(device) - base) / 2 ** 20


def gpu_slug():
    """The CUDA device's name in lower case with ``_`` for spaces (``nvidia_h100_80gb_hbm3``), for
    default file names; ``"cpu"`` without CUDA."""
    if not torch.cuda.is_available():
        return "cpu"
    import re

    return re.sub(r"[^a-z0-9_]", "", torch.cuda.get_device_name().lower().replace(" ", "_"))


def size_suffix(size: str) -> str:
    """What a default output name gets for ``--size size``: ``""`` for small (the names the pages
    have always had), else ``"_<size>"``."""
    return "" if size == "small" else f"_{size}"


def main(argv=None):
    """``mt-bench-speed`` (ReLA Table 2): see the module docstring.  Bad options stop with
    ``p.error`` (exit 2) before any model is built."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data-bin", default=DEFAULT_DATA_BIN)
    p.add_argument("--src", default="en")
    p.add_argument("--tgt", default="de")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--train-batches", type=int, default=6)
    p.add_argument("--max-tokens", type=int, default=4096)
    p.add_argument("--decode-sents", type=int, default=24, help="sentences decoded with batch 1")
    p.add_argument("--big-batch", type=int, default=128, help="sentences in the large-batch decode")
    p.add_argument("--steps", type=int, default=20, help="decoding steps per sentence (forced)")
    p.add_argument("--beam", type=int, default=4)
    p.add_argument("--device", default="cpu", choices=DEVICES,
                   help="cpu (default; fp32, one process per model for peak memory) or cuda (the paper's setting: "
                   "GPU wall time between synchronisations, peak memory from torch's CUDA allocator)")
    p.add_argument("--dtype", default="fp32", choices=list(DTYPES),
                   help="the models' precision (bf16 / fp16 on --device cuda only; default fp32)")
    p.add_argument("--size", default="small", choices=list(SIZES),
                   help="model size: small (default; the *_small presets) or base (Transformer base, the paper's)")
    p.add_argument("--out", help="the Markdown page (default: results/rela/table2_speed_cpu.md, on cuda "
                   "results/gpu/rela_table2_speed_<gpu>_<dtype>.md; with --size base, _base before .md)")
    p.add_argument("--no-memory", action="store_true", help="skip the peak-memory measurement")
    p.add_argument("--_peak", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a._peak:
        peak_child(a)
        return 0
    problem = device_problem(a.device, a.dtype)
    if problem:
        p.error(problem)
    if not os.path.isdir(a.data_bin):
        p.error(f"{a.data_bin} not found: run data-prep/multi30k/prepare.sh first")
    if a.out is None:
        a.out = (os.path.join(ROOT, "results", "rela", f"table2_speed_cpu{size_suffix(a.size)}.md") if a.device == "cpu"
                 else os.path.join(ROOT, "results", "gpu", f"rela_table2_speed_{gpu_slug()}_{a.dtype}{size_suffix(a.size)}.md"))
    from fairseq.criterions.label_smoothed_cross_entropy import LabelSmoothedCrossEntropyCriterion

    t_start, load_start = time.time(), provenance.load_average()
    models, task = build_models(a.data_bin, a.src, a.tgt, device=a.device, dtype=a.dtype, size=a.size)
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
    if a.no_memory:
        peak = {k: float("nan") for k in models}
    elif a.device == "cuda":
        peak = {k: peak_cuda(m, task, batches, big, crit, a.beam, a.steps) for k, m in models.items()}
    else:
        peak = {k: peak_memory(a, k) for k in models}
    ref = med["stock transformer (fairseq)"]
    hw = provenance.hardware()
    where = "CPU" if a.device == "cpu" else f"GPU ({torch.cuda.get_device_name()}, {a.dtype})"
    lines = [
        f"# ReLA Table 2 on {where}: parameters and speed relative to stock fairseq `transformer`",
        "",
        "**Regime: benchmark** -- speed and memory ratios against the baseline measured in the same run on this "
        f"machine's {where}; neither smoke, converged nor paper scale (untrained models, no seeds)"
        + ("; no GPU numbers (those wait for a lent GPU: `results/gpu/`)." if a.device == "cpu" else
           "; GPU wall time between `torch.cuda.synchronize()` calls."),
        "",
        "Paper (Zhang et al. 2021, Table 2): WMT14 En-De Transformer base on a GTX 1080 Ti, TensorFlow; "
        "ΔTrain per training step, ΔDecode with batch size 1.",
        f"Ours: {SIZES[a.size][0]}, vocabulary of `{provenance.repo_relative(a.data_bin)}`, "
        + (f"{hw['cpu']}, {hw['torch_threads']} torch threads" if a.device == "cpu" else where)
        + f", torch {hw['torch']}. Median of {a.rounds} interleaved rounds; "
        f"training = {a.train_batches} real batches of ≤{a.max_tokens} tokens (fwd+bwd+Adam); decoding = beam "
        f"{a.beam}, exactly {a.steps} steps per sentence, {a.decode_sents} sentences of its test split at batch 1 and "
        f"{a.big_batch} at batch {a.big_batch}.",
        "",
        "Targets (issue): ours-softmax ≥ 0.98×; ReLA-g ≥ 0.97× training and ≥ 0.98× decoding. "
        + ("Peak MiB: extra peak resident memory of the training batches + one big-batch decode, each model in a "
         "fresh process (Δpeak: ratio to the stock model, same run)." if a.device == "cpu" else
         "Peak MiB: peak CUDA memory allocated by the training batches + one big-batch decode over what the model "
         "and its batches held before (`torch.cuda.max_memory_allocated`; Δpeak: ratio to the stock model, same "
         "run)."),
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
    stamp = os.path.join(a.data_bin, ".done")
    record = provenance.collect(
        provenance.command_line("python scripts/bench_speed.py", sys.argv[1:] if argv is None else argv), regime="benchmark",
        data={"data_bin": provenance.repo_relative(a.data_bin),
              # how it was prepared: the stamp the data-prep recipe leaves in bin/ (None: not prepared by it)
              "prep_stamp": open(stamp).read().strip().replace("\n", "; ") if os.path.exists(stamp) else None,
              "dictionary_sha256": provenance.file_sha256(dictionary) if os.path.exists(dictionary) else "n/a"},
        wall_s=round(time.time() - t_start, 1),
        load_average_1_5_15_min={"start": load_start, "end": provenance.load_average(), "cores": os.cpu_count()})
    lines += ["", provenance.markdown(record)]
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    with atomic_path(a.out) as tmp, open(tmp, "w", encoding="utf-8") as f:
        f.write("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
