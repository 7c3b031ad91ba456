#!/usr/bin/env python
"""Decoding time per sentence: global vs flexible attention (Flexible Attention, Table 3), on CPU
(the paper's 751 -> 677 ms) or on a GPU (``--device cuda``: the paper's 123 -> 136 ms, flexible slower).

The paper's protocol (Section 5.5): the decoder is fed the *reference* tokens (forced decoding), so
both models run the same number of steps; every step is a real incremental decoding step (cached
keys ``W_k h̄``, the LSTM cell, attention, pre-output layer and the full output softmax), one
sentence at a time, on one CPU thread.  Inputs are long: ``--concat K`` consecutive sentences of a
binarized subset are joined (source and reference), and only inputs of at least ``--min-len``
source positions are kept.  ``--concat 5,10,20,40`` times every length in the same run (one row
each): the speed-up grows with the source length, since the windowed step costs about the same
at every length while global attention is linear in it.  The models are timed interleaved
(rotating order each round), CPU time by ``time.process_time``, and the ratio global / flexible
is printed.  ``--device cuda`` times the same steps on the GPU instead: wall time of each
sentence between two ``torch.cuda.synchronize()`` calls (the window's data-dependent size makes the
flexible step synchronise with the host anyway; that cost is part of what the paper measured).

    OMP_NUM_THREADS=1 python scripts/bench_flexible_decode.py \\
        --flexible runs/flexible_table1_de_en/row4/average_last1.pt --tau 1.2 \\
        --global-checkpoint runs/flexible_table1_de_en/row1/average_last3.pt \\
        --data-bin data-bin/multi30k_en_de/bin --src de --tgt en --out results/flexible/table3_decode_time.md

Three models are timed together: the global checkpoint (``--global-checkpoint``, the baseline of
the ratio), the flexible checkpoint with ``tau = inf`` (every position scored; it also computes the
gate, so it is slower than a global model) and the flexible checkpoint with ``--tau``.  Without
``--global-checkpoint`` the ``tau = inf`` run is the baseline.
Raises SystemExit on missing files, too few long inputs, or ``--device cuda`` without CUDA.
"""

import argparse
import math
import os
import platform
import sys
import time

from .provenance import ROOT, load_average
from .atomic import atomic_path
from .bench_speed import DEVICES, device_problem  # the devices ``--device`` accepts, one check for all benchmarks


def load(path, data_bin, src, tgt, tau=None, device="cpu"):
    import fairseq_plugins  # noqa: F401
    from fairseq_plugins.checkpoint import CheckpointError, load_model_ensemble_and_task

    over = {"data": data_bin, "source_lang": src, "target_lang": tgt}
    if tau is not None:
        over["flexible_threshold"] = tau
    try:
        models, cfg, task = load_model_ensemble_and_task([path], arg_overrides=over)
    except CheckpointError as e:  # names the file: empty, cut short, unsafe
        raise SystemExit(f"mt-bench-flexible-decode: error: {e}")
    m = models[0].eval()
    if not hasattr(m.decoder, "attention"):
        raise SystemExit(f"{path} is not an rnnsearch checkpoint")
    return m.to(device), task


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
    """Incremental forced decoding of one sentence: log-probs of every step, reference as feedback
    (on the model's device; ``src``, ``ref``: ``(S,)``, ``(T,)`` token ids, moved there)."""
    import torch

    device = next(model.parameters()).device
    with torch.no_grad():
        src, ref = src.to(device).unsqueeze(0), ref.to(device)
        enc = model.encoder(src, torch.tensor([src.size(1)], device=device))
        eos = model.decoder.dictionary.eos()
        prev = torch.cat([ref.new_tensor([eos]), ref[:-1]]).unsqueeze(0)
        state = {}
        for t in range(prev.size(1)):
            logits, _ = model.decoder(prev[:, : t + 1], enc, incremental_state=state)
            torch.log_softmax(logits, -1)


def parse_concat(text):
    """``"5,10,20"`` -> ``[5, 10, 20]``.

    Raises:
        SystemExit: a value that is not a positive integer.
    """
    try:
        values = [int(x) for x in str(text).split(",") if x.strip()]
    except ValueError:
        values = []
    if not values or min(values) < 1:
        raise SystemExit(f"--concat must be positive integers separated by commas (e.g. 5,10,20), got {text!r}")
    return values


def measure(models, data, rounds, device="cpu"):
    """ms per input of every model, interleaved: each round visits every input and, per input,
    every model in a rotating order (reversed every other round).  On ``"cpu"`` the process's CPU
    time (``time.process_time``); on ``"cuda"`` wall time between ``torch.cuda.synchronize()``
    calls.

    Args:
        models: list of ``(key, label, model)``; data: list of ``(source, reference)`` token tensors;
        device: one of :data:`DEVICES` (where the models are).

    Returns:
        ``{key: ms}``.
    """
    import torch

    if device == "cuda":
        def clock():
            torch.cuda.synchronize()
            return time.perf_counter()
    else:
        clock = time.process_time
    times = {k: 0.0 for k, _, _ in models}
    for r in range(rounds):
        order = models[r % len(models):] + models[: r % len(models)]
        if r % 2:
            order = order[::-1]
        for src, ref in data:
            for key, _, m in order:
                t0 = clock()
                forced_decode(m, src, ref)
                times[key] += clock() - t0
    n = rounds * len(data)
    return {k: 1000 * v / n for k, v in times.items()}


def run_info(checkpoint):
    """Provenance of the run that wrote ``checkpoint`` (its ``result.json`` next to it), if any."""
    import json

    path = os.path.join(os.path.dirname(os.path.abspath(checkpoint)), "result.json")
    if not os.path.exists(path):
        return None
    r = json.load(open(path))
    bleu = {k: v.get("bleu") for k, v in (r.get("scores") or {}).items()}
    return (f"`{os.path.relpath(checkpoint, ROOT)}`: {r.get('updates')} updates, git {r.get('git_commit', '?')}, "
            f"budget `{(r.get('config') or {}).get('budget_file', '?')}`, train wall "
            f"{(r.get('wall_s') or {}).get('train', float('nan')):.0f} s, valid loss {r.get('valid_loss', '?')}, "
            f"BLEU (beam, tau = inf) {bleu}; train command `{(r.get('commands') or {}).get('train', '?')}`")


def selected_tau(p, tau, tau_from):
    """``(tau, where it came from)``: ``--tau``, the tau Table 1 decodes at from the sweep file
    ``--tau-from`` (its rule's ``selected_tau``, :func:`mt_pipeline.sweeps.select_tau`, or, when no
    candidate met the rule, the candidate losing least, :func:`mt_pipeline.sweeps.used_tau`), or the
    default 1.2.  A missing or unreadable sweep file, or one that records neither, stops with
    ``p.error`` before any model is loaded."""
    import json

    if tau_from is None:
        return (1.2, "default") if tau is None else (tau, "--tau")
    try:
        with open(tau_from) as f:
            sw = json.load(f)
    except (OSError, ValueError) as err:
        p.error(f"--tau-from {tau_from}: cannot read a sweep.json ({err}); it is written by `mt-flexible-sweep "
                "table1 ...` or `mt-flexible-sweep sweep --run <run>`")
    if "selected_tau" not in sw:
        p.error(f"--tau-from {tau_from}: no `selected_tau` (not a sweep.json of mt-flexible-sweep)")
    where = os.path.relpath(os.path.abspath(tau_from), ROOT)
    if sw["selected_tau"] is None:
        if sw.get("least_loss_tau") is None:
            p.error(f"--tau-from {tau_from}: no tau met the selection rule in that sweep; pass --tau explicitly")
        # the tau Table 1 decodes at when no candidate meets the rule (mt_pipeline.sweeps.used_tau)
        from .sweeps import used_tau

        t, note = used_tau(sw)
        return t, f"Table 1's choice (`{where}`: {note})"
    return float(sw["selected_tau"]), f"selected by Table 1's rule (`{where}`)"


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--flexible", required=True, help="flexible-attention rnnsearch checkpoint")
    p.add_argument("--global-checkpoint", help="global-attention rnnsearch checkpoint (baseline)")
    taus = p.add_mutually_exclusive_group()
    taus.add_argument("--tau", type=float, help="threshold of the flexible model (paper 1.0-1.2; default 1.2)")
    taus.add_argument("--tau-from", metavar="SWEEP_JSON",
                      help="take the threshold Table 1's rule selected: the `selected_tau` of a sweep.json written "
                           "by `mt-flexible-sweep` (e.g. runs/flexible_table1_de_en/row3/sweep/sweep.json)")
    p.add_argument("--data-bin", required=True)
    p.add_argument("--src", required=True)
    p.add_argument("--tgt", required=True)
    p.add_argument("--subset", default="test")
    p.add_argument("--concat", default="10",
                   help="sentences joined into one input; a comma list (e.g. 5,10,20,40) times every length "
                        "in the same run")
    p.add_argument("--min-len", type=int, default=100, help="minimum source positions of an input")
    p.add_argument("--n", type=int, default=20, help="number of long inputs")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--fixed-gate", type=float, metavar="G",
                   help="mechanism timing only: set g(t) = G in (0, 1) for every step of both flexible runs "
                        "(v_g = 0, b_g = logit G), i.e. the window a well fine-tuned gate would give; "
                        "labelled as such, not a trained model")
    p.add_argument("--device", default="cpu", choices=DEVICES,
                   help="cpu: CPU time on one thread (the paper's CPU row); cuda: GPU wall time per sentence "
                        "(the paper's GPU remark, 123 -> 136 ms)")
    p.add_argument("--note", default="", help="a line added to the Markdown (e.g. what the data is)")
    p.add_argument("--out", help="also write a Markdown table here (atomically)")
    a = p.parse_args(argv)
    a.tau, a.tau_source = selected_tau(p, a.tau, a.tau_from)
    concats = parse_concat(a.concat)
    for f in [a.flexible, a.global_checkpoint]:
        if f and not os.path.exists(f):
            raise SystemExit(f"checkpoint not found: {f}")
    import torch

    problem = device_problem(a.device, "fp32")
    if problem:
        raise SystemExit(problem)
    wall0, load_start = time.time(), load_average()
    torch.set_num_threads(1)
    dev = a.device
    flex, task = load(a.flexible, a.data_bin, a.src, a.tgt, tau=a.tau, device=dev)
    if flex.decoder.attention.kind != "flexible":
        raise SystemExit(f"--flexible {a.flexible} has {flex.decoder.attention.kind} attention, not flexible")
    flex_inf, _ = load(a.flexible, a.data_bin, a.src, a.tgt, tau="inf", device=dev)
    if a.fixed_gate is not None:
        if not 0.0 < a.fixed_gate < 1.0:
            raise SystemExit(f"--fixed-gate must be in (0, 1), got {a.fixed_gate}")
        for m in (flex, flex_inf):
            torch.nn.init.zeros_(m.decoder.attention.gate_out.weight)
            torch.nn.init.constant_(m.decoder.attention.gate_out.bias, math.log(a.fixed_gate / (1 - a.fixed_gate)))
    # (key, label, model): every model decodes every input in every round, in rotating order
    models = []
    if a.global_checkpoint:
        base, _ = load(a.global_checkpoint, a.data_bin, a.src, a.tgt, device=dev)
        if base.decoder.attention.kind != "global":
            raise SystemExit(f"--global-checkpoint {a.global_checkpoint} has {base.decoder.attention.kind} attention")
        models.append(("global", f"Global attention (`{os.path.relpath(a.global_checkpoint, ROOT)}`)", base))
    models.append(("flex_inf", f"Flexible checkpoint, tau = inf (every position scored; computes g(t) too)", flex_inf))
    fixed = f", g(t) fixed to {a.fixed_gate:g} (mechanism timing, not the trained gate)" if a.fixed_gate is not None else ""
    models[-1] = (models[-1][0], models[-1][1] + fixed, models[-1][2])
    models.append(("flex", f"Flexible Attention, tau = {a.tau:g} (`{os.path.relpath(a.flexible, ROOT)}`){fixed}", flex))
    sets = [(k, long_inputs(task, a.subset, k, a.min_len, a.n)) for k in concats]
    for _, _, m in models:
        forced_decode(m, *sets[0][1][0])  # warm-up
    results = []  # per input length: dict(concat, src_len, steps, ms, wins, n)
    for k, data in sets:
        for _, _, m in models:
            m.decoder.attention.reset_window_stats()
        ms = measure(models, data, a.rounds, dev)
        results.append({"concat": k, "n": len(data), "src_len": sum(len(s) for s, _ in data) / len(data),
                        "steps": sum(len(r) for _, r in data) / len(data), "ms": ms,
                        "wins": {key: m.decoder.attention.average_window() for key, _, m in models}})
    base_key = "global" if a.global_checkpoint else "flex_inf"
    ratios = [r["ms"][base_key] / r["ms"]["flex"] for r in results]
    from mt_pipeline.provenance import git_commit

    commit = git_commit()
    wall, load_end = time.time() - wall0, load_average()
    for r, ratio in zip(results, ratios):
        print(f"concat {r['concat']}: {r['n']} inputs x {a.rounds} rounds, avg source length {r['src_len']:.1f}, "
              f"avg steps {r['steps']:.1f}")
        for key, label, _ in models:
            print(f"  {label}: {r['ms'][key]:.1f} ms/sentence (window {r['wins'][key]:.1f})")
        print(f"  speed-up {base_key}/flexible: {ratio:.2f}x" +
              (f"; flex_inf/flexible: {r['ms']['flex_inf'] / r['ms']['flex']:.2f}x" if base_key != "flex_inf" else ""))
    if a.out:
        cpu = platform.processor() or platform.machine()
        try:
            cpu = [l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")][0]
        except (OSError, IndexError):
            pass
        stamp = os.path.join(a.data_bin, ".done")
        stamp = open(stamp).read().strip().replace("\n", "; ") if os.path.exists(stamp) else "no stamp"
        runs = [x for x in (run_info(c) for c in [a.global_checkpoint, a.flexible] if c) if x]
        cmd = " ".join(argv if argv is not None else sys.argv[1:])
        if dev == "cuda":
            where, hardware = "GPU", f"GPU {torch.cuda.get_device_name()} (wall time), CPU {cpu}"
            timing = "wall time between `torch.cuda.synchronize()` calls"
            paper = ('Paper (§5.5, GPU): "applying Flexible Attention slows down the decoding speed on GPU", '
                     "123 ms -> 136 ms (global / flexible 0.90x).")
        else:
            where, hardware = "CPU", f"CPU {cpu} (CPU time, not wall)"
            timing = "1 thread, CPU time (`time.process_time`)"
            paper = "Paper (character-level En-Ja, Theano, one core): global 751 ms, flexible 677 ms (1.11x)."
        keys = [key for key, _, _ in models]
        summary = ["| sentences joined | source positions (avg) | steps (avg) | "
                   + " | ".join(f"{key} ms (window)" for key in keys) + f" | {base_key} / flexible |",
                   "|---|---|---|" + "---|" * len(keys) + "---|"]
        for r, ratio in zip(results, ratios):
            summary.append(f"| {r['concat']} | {r['src_len']:.1f} | {r['steps']:.1f} | "
                           + " | ".join(f"{r['ms'][key]:.1f} ({r['wins'][key]:.1f})" for key in keys)
                           + f" | **{ratio:.2f}x** |")
        met = [r["src_len"] for r, x in zip(results, ratios) if x >= 1.2]
        verdict = (f"Target (>= 1.2x on inputs >= 100 positions): met from {min(met):.0f} source positions on "
                   f"(of the lengths measured)" if met else
                   "Target (>= 1.2x on inputs >= 100 positions): **not met** at any length measured")
        if dev == "cuda":  # the paper's GPU remark: flexible decoding is slower there (ratio < 1)
            slower = [f"{r['src_len']:.0f}" for r, x in zip(results, ratios) if x < 1.0]
            verdict = ("Paper's GPU direction (flexible slower, " f"{base_key} / flexible < 1): "
                       + (f"ours agrees at {', '.join(slower)} source positions" if slower else "ours opposes")
                       + f" of the {len(results)} length(s) measured (one run; a benchmark, no verdict)")
        legend = [f"- `{key}`: {label}" for key, label, _ in models]
        from fairseq_plugins.provenance import models_markdown, trained_model

        ckpts = {"global": a.global_checkpoint, "flex": a.flexible} if a.global_checkpoint else {"flex": a.flexible}
        head, section = models_markdown({key: trained_model(c) for key, c in ckpts.items()})
        text = "\n".join([
            f"# Flexible Attention Table 3: {where} decoding time per sentence", "",
            head, "",
            paper, "",
            f"Protocol: reference tokens forced as feedback (same steps for every model), incremental decoding "
            f"with cached keys and full output softmax, encoder included, one sentence at a time, {timing}; "
            f"{a.rounds} interleaved rounds (rotating order) over "
            f"{results[0]['n']} inputs per length, each input = K consecutive {a.subset} sentences joined "
            f"({a.src}→{a.tgt}, >= {a.min_len} source positions). tau = {a.tau:g}: {a.tau_source}.", "",
            *([a.note, ""] if a.note else []),
            "Models:", "", *legend, "",
            *summary, "", verdict + ".", "",
            "Provenance:", "",
            f"- command: `python scripts/bench_flexible_decode.py {cmd}`",
            f"- code: git {commit}; torch {torch.__version__}; {hardware}; "
            f"bench wall {wall:.0f} s; load average (1/5/15 min) {load_start} at the start, {load_end} at the end "
            f"({os.cpu_count()} cores; above 1, other jobs ran beside the benchmark)",
            f"- data: `{os.path.relpath(a.data_bin, ROOT)}` (bin stamp: {stamp})",
            *[f"- model: {x}" for x in runs], "", section])
        os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
        with atomic_path(a.out) as tmp, open(tmp, "w") as f:
            f.write(text)
        print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    main()
