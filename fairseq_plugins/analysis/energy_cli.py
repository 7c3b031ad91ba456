"""Energy of attention (E-ATT Tables 1, 2, 4) and binarisation ratios rho (Figure 2).

Usage (``fairseq-attention-energy``; also ``python scripts/eatt_energy.py``):
    # the form of the paper's Table 2 (Transformer base; l defaults to the length implied by
    # Dense's 51.10 %):
    fairseq-attention-energy [--l 23] [--d 512] [--h 8] [--rho 0.2] [--md OUT.md]

    # a trained model: rho per layer / attention type / role on a data split (teacher forcing,
    # one sentence per batch), the energy of its attention relative to vanilla attention at the
    # same sizes and the mean lengths, and its mean energy per sentence:
    fairseq-attention-energy --checkpoint runs/.../average_last3.pt \\
        --data-bin data-bin/multi30k_en_de/bin --src en --tgt de [--subset valid] \\
        [--max-sentences 500] [--json OUT.json] [--md OUT.md] [--plot OUT.png] [--user-dir DIR]

Counting conventions and assumptions: :mod:`fairseq_plugins.analysis.energy`.  The JSON holds
``energy_scores_asic_pct``, ``energy_scores_fpga_pct``, ``energy_block_asic_pct``,
``energy_block_fpga_pct`` (each ``[value]``, the form ``mt-table`` analyses read): energy relative
to vanilla attention *at the mean lengths* ``l_src``, ``l_tgt`` (the paper's Tables 2 and 4 count
one length ``l``); the absolute energies in µJ, the mean over the sentences of each sentence's
energy at its own lengths (``energy_scores_asic_uJ`` etc., ``[value]``: comparable across model
sizes, E-ATT Figure 1; also in pJ as ``energy_*_pJ_per_sentence``, with
``energy_*_pJ_at_mean_lengths`` beside it -- the counts hold ``l_q l_k`` terms, so the two differ,
by 0.6-5.5 % on Multi30k's validation set (d 32-128), results/eatt/figure1_dimension.md; the page and
``energy_*_at_mean_lengths_below_mean_pct`` state it); ``energy_*_pct_of_means`` (the ratio of the mean energies); ``ops_scores`` / ``ops_block`` (mean adds and muls per sentence, ours and vanilla's)
and ``ops_*_at_mean_lengths``;
``rho`` (``"type/layer/role" -> value``), ``l_src``, ``l_tgt``, the model's attention functions
and ``model``: the checkpoint's training run, regime and committed evidence
(:func:`fairseq_plugins.provenance.trained_model`), which the page states with its regime.
Outputs are written atomically.
"""

import argparse
import json
import os
import sys

from ..atomic import atomic_path
from ..options import positive_int
from ..user_dir import import_user_dir
from .loading import USER_DIR_HELP

PAPER_T2 = {"Vanilla": "100.00", "Dense": "51.10", "RandInit": "0.00", "E-ATT": "0.44"}
FORMULAS = {"Vanilla": ("2ld² + l²d", "2ld² + l²d"), "Dense": ("ld² + l²d", "ld² + l²d"),
            "RandInit": ("0", "0"), "E-ATT": ("2ρld² + c·l²d", "0")}


def table2_markdown(l, d, h, rho, l1_adds):
    from fairseq_plugins.analysis import energy as E

    lines = [f"## Table 2 form: self-attention, l = {l:g}, d = {d}, h = {h}, ρ = {rho:g}, "
             f"c_L1 = {l1_adds} addition(s) per L1 element", "",
             "| Model | # add | # mul | adds | muls | Δ ASIC scores (%) | Δ FPGA scores (%) | "
             "Δ ASIC block (%) | Δ FPGA block (%) | paper Δ (%) |", "|" + "---|" * 10]
    rows = {hw: {p: E.table2(l, d, h, rho, hw, p, l1_adds_per_element=l1_adds) for p in ("scores", "block")}
            for hw in ("asic", "fpga")}
    for j, r in enumerate(rows["asic"]["scores"]):
        m = r["model"]
        cells = [m, *FORMULAS[m], E.fmt_count(r["adds"]), E.fmt_count(r["muls"])]
        cells += [f"{rows[hw][p][j]['ratio_pct']:.2f}" for p in ("scores", "block") for hw in ("asic", "fpga")]
        cells.append(PAPER_T2[m])
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", f"- Dense's 51.10 % implies l = {E.implied_length(0.5110, d):.2f} at d = {d} (independent of hardware).",
              f"- E-ATT's 0.44 % (scores) needs ρ = {E.implied_rho(0.0044, l, d, h, 'asic', l1_adds):.4f} on ASIC "
              f"and ρ = {E.implied_rho(0.0044, l, d, h, 'fpga', l1_adds):.4f} on FPGA at this l, d.",
              "- The paper's E-ATT cell read as printed in our copy (garbled: ½ l d ρ + l² d additions, no "
              "multiplication) gives "
              + "; ".join(f"{hw.upper()} {E.printed_eatt_cell(l, d, 0.0, hw):.3f} % (ρ = 0) to "
                          f"{E.printed_eatt_cell(l, d, 1.0, hw):.3f} % (ρ = 1)" for hw in ("asic", "fpga"))
              + " at this l, d (it is linear in ρ).",
              "- With the official code's Q/K width d/h (NLP2CT/E-Att `E-ATT.py`: `linear_in_weight` of d × 2d/h, "
              f"so each head's L1 distance runs over d/h² = {d // h // h} dimensions; not in the paper): E-ATT "
              + "; ".join(f"{hw.upper()} "
                          f"{E.table2(l, d, h, rho, hw, l1_adds_per_element=l1_adds, qk_width=d // h)[3]['ratio_pct']:.2f} %"
                          for hw in ("asic", "fpga"))
              + f" of vanilla's scores at ρ = {rho:g}; 0.44 % needs ρ = "
              + " / ".join(f"{E.implied_rho(0.0044, l, d, h, hw, l1_adds, qk_width=d // h):.4f} ({hw.upper()})"
                           for hw in ("asic", "fpga")) + ".",
              "- Table 1 costs (pJ, FP32): ASIC add 0.9 / mul 3.7; FPGA add 0.4 / mul 18.8.", ""]
    return "\n".join(lines)


def measure(a):
    """Load the checkpoint, measure rho and the lengths of ``a.subset``'s sentences, and count the
    model's attention energy: ratios to vanilla attention at the mean lengths (the paper's Table 2/4
    form) and the mean over sentences of the per-sentence energy (pJ / µJ), E-ATT Tables 1, 2, 4."""
    import fairseq_plugins  # noqa: F401  (archs, safe globals for checkpoint loading)
    import torch

    from fairseq_plugins.analysis import energy as E
    from fairseq_plugins.analysis.capture import check_transformer
    from fairseq_plugins.checkpoint import load_model_ensemble_and_task
    from fairseq_plugins.models.transformer import ATTENTION_TYPES

    torch.set_grad_enabled(False)
    models, cfg, task = load_model_ensemble_and_task(
        [a.checkpoint], arg_overrides={"data": a.data_bin, "source_lang": a.src, "target_lang": a.tgt})
    model = models[0].eval()
    check_transformer(model, "fairseq-attention-energy --checkpoint", a.checkpoint)
    margs = cfg.model
    fns = {kind: getattr(margs, attr, "softmax") or "softmax" for kind, (_, attr) in ATTENTION_TYPES.items()}
    task.load_dataset(a.subset)
    ds = task.dataset(a.subset)
    n = len(ds) if a.max_sentences is None else min(len(ds), a.max_sentences)
    samples, lengths = [], []
    for i in range(n):
        s = ds.collater([ds[i]])
        samples.append(s)
        lengths.append((int(ds.src_sizes[i]), int(ds.tgt_sizes[i])))
    rho = E.measure_rho(model, samples)
    l_src, l_tgt = sum(x for x, _ in lengths) / n, sum(y for _, y in lengths) / n
    d, h = model.encoder.layers[0].self_attn.embed_dim, model.encoder.layers[0].self_attn.num_heads
    qk_dim = int(getattr(margs, "eatt_qk_dim", 0) or 0) or None  # --eatt-qk-dim (None: d)
    layers = {"encoder": len(model.encoder.layers), "decoder": len(model.decoder.layers)}
    vanilla = {k: "softmax" for k in fns}
    from .. import provenance

    res = {"checkpoint": provenance.repo_relative(os.path.abspath(a.checkpoint)),
           "model": provenance.trained_model(a.checkpoint), "subset": a.subset, "sentences": n,
           "attention_fns": fns, "l_src": l_src, "l_tgt": l_tgt, "d": d, "h": h, "layers": layers,
           "tau": getattr(margs, "eatt_tau", None), "qk_dim": qk_dim or d, "l1_adds_per_element": a.l1_adds,
           "rho": {f"{t}/{i}/{r}": v for (t, i, r), v in sorted(rho.items())}}
    for part in ("scores", "block"):
        # the paper's form (Tables 2 and 4: one length l): the ratio at the mean lengths
        ours = E.model_ops(fns, layers, l_src, l_tgt, d, h, rho, part, l1_adds_per_element=a.l1_adds,
                           qk_width=qk_dim)
        base = E.model_ops(vanilla, layers, l_src, l_tgt, d, h, None, part, l1_adds_per_element=a.l1_adds)
        to, tb = E.total(ours.values()), E.total(base.values())
        # absolute energies: the mean over sentences of each sentence's energy (the counts have
        # l_q l_k terms, so this is not the energy at the mean lengths)
        mo = E.total(E.mean_model_ops(fns, layers, lengths, d, h, rho, part, l1_adds_per_element=a.l1_adds,
                                      qk_width=qk_dim).values())
        mb = E.total(E.mean_model_ops(vanilla, layers, lengths, d, h, None, part,
                                      l1_adds_per_element=a.l1_adds).values())
        res[f"ops_{part}"] = {"adds": mo.adds, "muls": mo.muls, "vanilla_adds": mb.adds, "vanilla_muls": mb.muls}
        res[f"ops_{part}_at_mean_lengths"] = {"adds": to.adds, "muls": to.muls,
                                              "vanilla_adds": tb.adds, "vanilla_muls": tb.muls}
        for hw in ("asic", "fpga"):
            res[f"energy_{part}_{hw}_pct"] = [100.0 * E.energy_pj(to, hw) / E.energy_pj(tb, hw)]
            res[f"energy_{part}_{hw}_pct_of_means"] = [100.0 * E.energy_pj(mo, hw) / E.energy_pj(mb, hw)]
            res[f"energy_{part}_{hw}_pJ_per_sentence"] = E.energy_pj(mo, hw)
            res[f"energy_{part}_{hw}_pJ_at_mean_lengths"] = E.energy_pj(to, hw)
            # absolute, comparable across model sizes (E-ATT Figure 1: energy as d is halved)
            res[f"energy_{part}_{hw}_uJ"] = [E.energy_pj(mo, hw) / 1e6]
        res[f"energy_{part}_at_mean_lengths_below_mean_pct"] = mean_length_gap(res, part)
    return res


def mean_length_gap(res, part):
    """How far the energy counted at the mean lengths lies below the mean per-sentence energy, in %
    of the mean: ``{"asic": ours, "fpga": ours, "vanilla_asic": ..., "vanilla_fpga": ...}``.

    The counts hold ``l_q l_k`` terms, so ``E[l_q l_k] = E[l_q] E[l_k] + Cov`` and the paper's
    one-length form (Tables 2, 4) undercounts a set of varied lengths; this is the size of that gap
    (docs/eatt.md).  Computed from ``res["ops_<part>"]`` and ``res["ops_<part>_at_mean_lengths"]``
    (``part``: ``"scores"`` or ``"block"``), so a committed JSON re-renders it.

    Raises:
        KeyError: ``res`` lacks the two ``ops_<part>*`` records.
    """
    from fairseq_plugins.analysis import energy as E

    mean, at = res[f"ops_{part}"], res[f"ops_{part}_at_mean_lengths"]
    out = {}
    for who, pre in (("", ""), ("vanilla_", "vanilla_")):
        m = E.OpCount(mean[f"{pre}adds"], mean[f"{pre}muls"])
        a = E.OpCount(at[f"{pre}adds"], at[f"{pre}muls"])
        for hw in ("asic", "fpga"):
            em = E.energy_pj(m, hw)
            out[f"{who}{hw}"] = 100.0 * (em - E.energy_pj(a, hw)) / em if em else None
    return out


def _labelled(res):
    """``{label: training record}`` of the measured model, labelled by its run directory below
    ``runs/`` (``eatt_table3/row4``), or ``model`` when it has none."""
    run = res["model"]["run_dir"]
    label = run[len("runs/"):] if run and run.startswith("runs/") else (os.path.basename(run) if run else "model")
    return {label: res["model"]}


def model_markdown(res):
    """The measured model's part of the page: heading, regime (and, without committed evidence of
    the model's training run, :data:`fairseq_plugins.provenance.NO_EVIDENCE`), energy and ρ tables."""
    from .. import provenance

    head, _ = provenance.models_markdown(_labelled(res))
    lines = [f"## Attention energy of `{res['checkpoint']}`", "", head,
             f"Attention functions {res['attention_fns']}; d = {res['d']}, h = {res['h']}, layers {res['layers']}; "
             f"mean lengths on `{res['subset']}` ({res['sentences']} sentences): source {res['l_src']:.2f}, "
             f"target {res['l_tgt']:.2f} tokens; τ = {res['tau']}"
             + (f"; Q/K width {res['qk_dim']} (`--eatt-qk-dim`)" if res.get("qk_dim", res["d"]) != res["d"] else "")
             + ".", "",
             "| part | ASIC (% of vanilla, at the mean lengths) | FPGA (% of vanilla, at the mean lengths) | "
             "ASIC µJ / sentence (mean) | FPGA µJ / sentence (mean) | adds / sentence (mean) | "
             "muls / sentence (mean) |",
             "|---|---|---|---|---|---|---|"]
    from fairseq_plugins.analysis import energy as E

    for part in ("scores", "block"):
        o = res[f"ops_{part}"]
        lines.append(f"| {part} | {res[f'energy_{part}_asic_pct'][0]:.2f} | {res[f'energy_{part}_fpga_pct'][0]:.2f} | "
                     f"{res[f'energy_{part}_asic_uJ'][0]:.3f} | {res[f'energy_{part}_fpga_uJ'][0]:.3f} | "
                     f"{E.fmt_count(o['adds'])} | {E.fmt_count(o['muls'])} |")
    gaps = {part: mean_length_gap(res, part) for part in ("scores", "block")}
    pct = lambda v: "–" if v is None else f"{v:.2f} %"  # noqa: E731
    lines += ["", "Energy at the mean lengths vs the mean energy per sentence (the counts hold l_q·l_k terms, so "
              "the paper's one-length form undercounts varied lengths): at the mean lengths it is "
              + "; ".join(f"{part} {pct(g['asic'])} (ASIC) / {pct(g['fpga'])} (FPGA) below the mean, vanilla "
                          f"attention {pct(g['vanilla_asic'])} / {pct(g['vanilla_fpga'])}"
                          for part, g in gaps.items()) + "."]
    if res["rho"]:
        lines += ["", "### Ratio of ones after binarisation ρ (paper Figure 2)", "",
                  "| layer | Enc-Self | Dec-Self | Dec-Crs-Query | Dec-Crs-Key |", "|---|---|---|---|---|"]
        n = max(res["layers"].values())
        for i in range(n):
            cell = [res["rho"].get(k) for k in (f"encoder/{i}/query", f"decoder/{i}/query",
                                                f"cross/{i}/query", f"cross/{i}/key")]
            lines.append(f"| {i + 1} | " + " | ".join("–" if c is None else f"{c:.3f}" for c in cell) + " |")
    return "\n".join(lines) + "\n"


def plot(res, path):
    """Paper Figure 2 as a PNG (``fairseq_plugins.analysis.plots.rho_curves``)."""
    from fairseq_plugins.analysis.plots import rho_curves

    return rho_curves(res["rho"], max(res["layers"].values()), res["tau"], path)


def provenance_markdown(argv=None):
    """The Markdown footer that lets a reader regenerate the file: command, git commit, hardware."""
    from .. import provenance

    rec = provenance.collect(provenance.command_line("fairseq-attention-energy", argv))
    return "\n" + provenance.markdown(rec)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--l", type=float, help="sequence length for the Table 2 form (default: implied by Dense, 23.03)")
    p.add_argument("--d", type=positive_int, default=512)
    p.add_argument("--h", type=positive_int, default=8)
    p.add_argument("--rho", type=float, default=0.2, help="ratio of ones for the Table 2 form (default 0.2)")
    p.add_argument("--l1-adds", type=int, default=1, choices=(1, 2),
                   help="additions per L1 element: 1 (the paper's l²d) or 2 (subtraction counted too)")
    p.add_argument("--checkpoint")
    p.add_argument("--data-bin")
    p.add_argument("--src")
    p.add_argument("--tgt")
    p.add_argument("--subset", default="valid")
    p.add_argument("--max-sentences", type=positive_int, help="measure on the first N sentences only (N >= 1)")
    p.add_argument("--json", help="write the measurement here (with --checkpoint)")
    p.add_argument("--md", help="write Markdown here")
    p.add_argument("--plot", help="write the Figure 2 plot (PNG) here (with --checkpoint)")
    p.add_argument("--user-dir", metavar="DIR",
                   help=USER_DIR_HELP + "; its functions are counted as dot-product ('vanilla') attention, as every "
                        "function outside E-ATT's kinds is (energy.kind_of)")
    a = p.parse_args(argv)
    from fairseq_plugins.analysis import energy as E

    l = a.l if a.l is not None else E.implied_length(0.5110, 512)
    md = table2_markdown(l, a.d, a.h, a.rho, a.l1_adds)
    if not a.checkpoint:  # the accounting alone: say what kind of page it is
        md = ("# Attention energy in the form of E-ATT Table 2\n\n**Regime: accounting** (operation counts "
              "priced with Table 1's costs; no training, no model): neither smoke, converged nor paper scale; "
              "no seeds.\n\n" + md)
    if a.checkpoint:
        missing = [f for f in ("data_bin", "src", "tgt") if getattr(a, f) is None]
        if missing:
            p.error("--checkpoint needs " + ", ".join("--" + m.replace("_", "-") for m in missing))
        for path in (a.checkpoint, a.data_bin):
            if not os.path.exists(path):
                p.error(f"not found: {path}")
        try:
            import_user_dir(a.user_dir)
        except FileNotFoundError as e:  # not a directory
            p.error(str(e))
        from fairseq_plugins import provenance
        from fairseq_plugins.checkpoint import CheckpointError

        try:
            res = measure(a)
        except CheckpointError as e:  # names the file: empty, cut short, unsafe, not a Transformer
            p.error(str(e))
        md = model_markdown(res) + "\n" + md + "\n" + provenance.models_markdown(_labelled(res))[1]
        print(json.dumps({k: v for k, v in res.items() if k != "rho"}, indent=1))
        if a.json:
            res["provenance"] = provenance.collect(provenance.command_line("fairseq-attention-energy", argv))
            with atomic_path(a.json) as tmp, open(tmp, "w") as f:
                json.dump(res, f, indent=1)
        if a.plot and res["rho"]:
            plot(res, a.plot)
    elif a.json or a.plot or a.user_dir:
        p.error("--json, --plot and --user-dir need --checkpoint")
    if a.md:
        md += provenance_markdown(argv)
    print(md)
    if a.md:
        with atomic_path(a.md) as tmp, open(tmp, "w") as f:
            f.write(md)


if __name__ == "__main__":
    main()
