#!/usr/bin/env python
"""Flexible Attention: BLEU vs average window over thresholds tau, and Table 1.

Two sub-commands (Shu & Nakayama 2017, Sections 5.2-5.3):

``sweep``: decode the valid and test sets of a trained flexible-attention checkpoint with every
``tau`` (default the paper's 0.3 0.5 0.8 1.0 1.2 1.4 1.6 5 8 999, plus inf) through
``scripts/evaluate.sh --extra "--model-overrides {'flexible_threshold':TAU}"``, read BLEU and the
average window the model reports (the paper's per-sentence average, §5.2, which mt-evaluate keeps
in each subset's ``S.json``: :func:`mt_pipeline.evaluate.window_report`), pick ``tau`` by the
paper's rule -- the smallest ``tau`` in {0.8, 1.0, 1.2, 1.4, 1.6} whose validation BLEU is at most
0.5 below ``tau = inf`` -- and write ``<out>/sweep.json``, ``<out>/sweep.md`` and the trade-off
figure (paper Figure 3)::

    python scripts/flexible_sweep.py sweep --run runs/flexible_table1_de_en/row4 \\
        --figure results/flexible/figure3_tradeoff.png

``table1``: assemble ``results/flexible/table1_multi30k.md`` from the table runs of
``configs/flexible/table1_multi30k_*.yaml`` (rows 1 global, 2 local-p, 3 flexible, 4 fine-tuned)
of one or more directions: window and BLEU on the test set for Global, Local-p, Flexible
``tau = inf``, Flexible at the ``tau`` selected on row 3's validation set, and + fine-tuning at that
``tau``; rows 3 and 4 are both swept (row 3 selects tau; row 4's sweep is Figure 3, §5.3: "testing
different thresholds with the fine-tuned Flexible Attention model"); decodes what is missing.  When
no candidate meets the rule, the candidate losing least is used and the page says so::

    python scripts/flexible_sweep.py table1 --runs runs/flexible_table1_en_de runs/flexible_table1_de_en

Every decode is resumable (skipped when its ``<subset>.json`` is newer than the checkpoint);
outputs are written atomically.  Every decode at a tau is committed as evidence beside its run's
(``results/runs/<regime>/.../row<i>/decodes/tau_<tau>/``: hypotheses, scores, the command;
``mt-campaign rescore`` re-scores them), and Table 1 names, per row, the evidence its BLEU comes from.  Raises SystemExit on a missing run / checkpoint / report.
"""

import argparse
import json
import math
import os
import re
import subprocess
import sys

from .atomic import atomic_path
from .experiment import decode_checkpoint
from .provenance import ROOT
PAPER_TAUS = (0.3, 0.5, 0.8, 1.0, 1.2, 1.4, 1.6, 5.0, 8.0, 999.0)
SELECT_FROM = (0.8, 1.0, 1.2, 1.4, 1.6)




def _training_table(rdir):
    """The committed Markdown table (a table spec's ``out``) rendered from the runs in ``rdir``: the
    spec under configs/ whose ``runs`` is ``rdir``, if its output exists; else None."""
    import glob

    import yaml

    rel = os.path.relpath(rdir, ROOT)
    for path in sorted(glob.glob(os.path.join(ROOT, "configs", "**", "*.yaml"), recursive=True)):
        try:
            with open(path) as f:
                spec = yaml.safe_load(f)
        except Exception:  # not every YAML under configs/ is a table spec
            continue
        if isinstance(spec, dict) and spec.get("runs") == rel and spec.get("out") \
                and os.path.exists(os.path.join(ROOT, spec["out"])):
            return spec["out"]
    return None

def log(msg):
    print(f"[flexible] {msg}", flush=True)


def tau_name(tau: float) -> str:
    """``tau`` as written in directory names and overrides: ``"inf"`` if infinite, else ``f"{tau:g}"``."""
    return "inf" if math.isinf(tau) else f"{tau:g}"


def read_window(score: dict, where: str) -> dict:
    """``{window, source_length, ...}`` of a decode: the ``window`` record mt-evaluate keeps in
    ``S.json`` (:func:`mt_pipeline.evaluate.window_report`; ``window`` is the paper's per-sentence
    average, §5.2).

    Raises:
        SystemExit: the record has none (not an ``rnnsearch`` model, or decoded before the
            per-sentence average was recorded: decode it again).
    """
    w = score.get("window")
    if not w or w.get("window") is None:
        raise SystemExit(f"{where}: no window record (an rnnsearch decode records one since the per-sentence "
                         "average, Shu & Nakayama 2017 §5.2): decode it again (mt-evaluate, or delete the file "
                         "for mt-flexible-sweep)")
    return dict(w)


def run_info(run_dir: str) -> dict:
    """result.json of an experiment run plus its checkpoint path.

    Raises:
        SystemExit: the run is missing or did not finish.
    """
    path = os.path.join(run_dir, "result.json")
    if not os.path.exists(path):
        raise SystemExit(f"{run_dir}: no result.json (train it first with scripts/run_table.py)")
    res = json.load(open(path))
    if res.get("status") != "done":
        raise SystemExit(f"{run_dir}: run status is {res.get('status')!r}, not 'done'")
    # the checkpoint the run was evaluated with: average_lastN.pt or checkpoints/checkpoint_best.pt
    res["_checkpoint"] = decode_checkpoint(res["config"]["budget"], run_dir)[0]
    res["_prep"] = os.path.join(ROOT, res["data"]["prep_dir"])
    return res


def _decode_cmd(res: dict, tau: float, subsets, out_dir: str) -> list:
    """The ``scripts/evaluate.sh`` command that decodes ``subsets`` of the run ``res`` at ``tau``."""
    src, tgt = res["direction"].split("-")
    gen = res["config"]["budget"]["generate"]
    override = "{'flexible_threshold':'%s'}" % tau_name(tau)
    return ["bash", os.path.join(ROOT, "scripts", "evaluate.sh"), "--checkpoint", res["_checkpoint"],
            "--data-bin", os.path.join(res["_prep"], "bin"), "--prep-dir", res["_prep"], "--src", src,
            "--tgt", tgt, "--subsets", ",".join(subsets), "--beam", str(gen["beam"]), "--lenpen",
            str(gen["lenpen"]), "--batch-size", str(gen["batch-size"]), "--out", out_dir,
            "--extra", f"--model-overrides {override}"]


def decode(res: dict, tau: float, subsets, out_dir: str) -> dict:
    """Decode ``subsets`` with threshold ``tau`` (resumable); ``{subset: {bleu, tok_bleu, window, ...}}``."""
    ckpt = res["_checkpoint"]
    def stale(s):
        path = os.path.join(out_dir, f"{s}.json")
        return not os.path.exists(path) or os.path.getmtime(path) < os.path.getmtime(ckpt) \
            or "window" not in json.load(open(path))  # decoded before the per-sentence window record

    todo = [s for s in subsets if stale(s)]
    if todo:
        cmd = _decode_cmd(res, tau, todo, out_dir)
        log("$ " + " ".join(cmd))
        subprocess.run(cmd, check=True, cwd=ROOT, env=dict(os.environ, PYTHON=sys.executable))
    out = {}
    for s in subsets:
        path = os.path.join(out_dir, f"{s}.json")
        score = json.load(open(path))
        out[s] = {"bleu": score["bleu"], "tok_bleu": score["tok_bleu"], "signature": score["signature"],
                  **read_window(score, path)}
    return out


def export_decode(run_dir: str, res: dict, tau: float, subsets, out_dir: str):
    """Commit the decode of ``subsets`` at ``tau`` in ``out_dir`` as evidence of the run
    (``<run evidence>/decodes/tau_<tau>/``: :func:`mt_pipeline.evidence.export_decode`), so the
    BLEU a page shows for it re-scores from committed hypotheses; the repo-relative evidence
    directory, or None when the run states no regime (a run outside the table system)."""
    from . import evidence
    from .provenance import repo_relative

    regime = res.get("regime")
    if not regime:
        return None
    cmd = " ".join(repo_relative(c) if os.path.isabs(c) else c for c in _decode_cmd(res, tau, subsets, out_dir))
    return repo_relative(evidence.export_decode(run_dir, regime, f"tau_{tau_name(tau)}", out_dir, list(subsets),
                                                {"flexible_threshold": tau_name(tau)}, cmd))


def run_evidence(run_dir: str, res: dict, subset: str, bleu: float):
    """The run's committed evidence directory (repo-relative) when it exists and records ``bleu``
    for ``subset`` (the run's own decode is what the page shows) with its window record, else None."""
    from .evidence import evidence_dir
    from .provenance import repo_relative

    if not res.get("regime"):
        return None
    d = evidence_dir(run_dir, res["regime"])
    path = os.path.join(d, "result.json")
    if not os.path.exists(path):
        return None
    with open(path) as f:
        rec = json.load(f)
    score = (rec.get("scores") or {}).get(subset) or {}
    if next(iter(rec.get("scores") or {}), None) != subset or score.get("bleu") is None \
            or abs(score["bleu"] - bleu) > 0.005 or not score.get("window"):  # the window cell needs it too
        return None
    return repo_relative(d)


def select_tau(points: dict, metric: str, max_loss: float = 0.5, candidates=SELECT_FROM):
    """The paper's rule (Section 5.2): the smallest candidate ``tau`` (i.e. the smallest window)
    whose validation ``metric`` is at least ``BLEU(tau = inf) - max_loss``; None if none is.

    Args:
        points: ``{tau (float): {"valid": {metric: value, ...}, ...}}`` including ``inf``.
    """
    ref = points[math.inf]["valid"][metric]
    ok = [t for t in sorted(candidates) if t in points and points[t]["valid"][metric] >= ref - max_loss]
    return ok[0] if ok else None


def least_loss_tau(points: dict, metric: str, candidates=SELECT_FROM):
    """The candidate ``tau`` whose validation ``metric`` is highest (the smaller ``tau`` on a tie): the
    threshold Table 1 decodes at when :func:`select_tau` finds none -- every candidate loses more than
    the allowed BLEU, and this one loses least, the closest to the paper's rule.  None when no
    candidate was decoded."""
    have = [t for t in sorted(candidates) if t in points]
    return max(have, key=lambda t: (points[t]["valid"][metric], -t)) if have else None


def used_tau(sw: dict):
    """``(tau, note)`` of a sweep summary (:func:`sweep`): the rule's ``selected_tau``, else the
    candidate losing least (``least_loss_tau``, with a note saying so); ``(None, note)`` when the
    summary has neither."""
    if sw.get("selected_tau") is not None:
        return float(sw["selected_tau"]), ""
    if sw.get("least_loss_tau") is None:
        return None, "no candidate was decoded"
    t = float(sw["least_loss_tau"])
    ref = sw["points"]["inf"]["valid"][sw["metric"]]
    loss = ref - sw["points"][tau_name(t)]["valid"][sw["metric"]]
    return t, (f"no candidate of {sw['select_from']} met the rule (each loses more than {sw['max_loss']} validation "
               f"{sw['metric']} against tau = inf); tau = {tau_name(t)}, the candidate losing least ({loss:.2f}), used")


def write_text(path: str, text: str) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with atomic_path(path) as tmp, open(tmp, "w") as f:
        f.write(text)


def plot(points: dict, path: str, title: str) -> None:
    """BLEU against average window for valid and test (paper Figure 3), atomically as PNG.

    ``points``: ``{tau: {"valid": {"window", "tok_bleu"}, "test": {...}}}`` (``math.inf`` for
    tau = ∞).  Taus are annotated on the validation curve only; a finite tau whose points equal
    those of tau = ∞ (a threshold beyond every window, e.g. 999) is drawn once, as ∞; labels of
    points closer than a few points on the canvas are staggered so that none overlap.
    """
    from fairseq_plugins.analysis.plots import pyplot, save_png

    plt = pyplot()
    inf = points.get(math.inf)

    def same_as_inf(t):
        return inf is not None and all(points[t][s]["window"] == inf[s]["window"] and
                                       points[t][s]["tok_bleu"] == inf[s]["tok_bleu"] for s in ("valid", "test"))

    taus = sorted(t for t in points if not math.isinf(t) and not same_as_inf(t)) + ([math.inf] if inf else [])
    fig, ax = plt.subplots(figsize=(6.0, 4.2))
    for subset, style in (("valid", "o-"), ("test", "s--")):
        ax.plot([points[t][subset]["window"] for t in taus], [points[t][subset]["tok_bleu"] for t in taus],
                style, label=subset, markersize=4)
    # stagger labels of neighbouring points (in axis-fraction units) so that they do not overlap
    xs = [points[t]["valid"]["window"] for t in taus]
    ys = [points[t]["valid"]["tok_bleu"] for t in taus]
    xr, yr = (max(xs) - min(xs)) or 1.0, (max(ys) - min(ys)) or 1.0
    placed = []
    for t, x, y in zip(taus, xs, ys):
        k = sum(1 for px, py in placed if abs(px - x) / xr < 0.06 and abs(py - y) / yr < 0.08)
        placed.append((x, y))
        ax.annotate("∞" if math.isinf(t) else f"{t:g}", (x, y), textcoords="offset points",
                    xytext=(4, 4 + 9 * k if k % 2 == 0 else -10 - 9 * k), fontsize=7)
    ax.set_xlabel("average window (source positions scored per step, averaged per sentence, §5.2)")
    ax.set_ylabel("BLEU (tokenized)")
    ax.set_title(title, fontsize=9)
    ax.legend(loc="lower right")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    save_png(fig, path, dpi=120, tight=False)


_ROW = re.compile(r"^\| (\S+) \| ([\d.]+) \| ([\d.]+) \(([\d.]+)\) \| ([\d.]+) \| ([\d.]+) \(([\d.]+)\) \|$")


def read_sweep_tables(md_path: str) -> list:
    """The BLEU-vs-window tables of a rendered Table 1 file (:func:`table1`), in file order:
    ``[(direction, model, {tau: {"valid": {...}, "test": {...}}})]``, ``model`` ``"fine-tuned"`` for
    the fine-tuned row's sweep (Figure 3's points, §5.3) and ``"flexible"`` for the flexible row's
    (where tau is selected; a page rendered before the fine-tuned sweep has only these).

    Raises:
        SystemExit: the file holds no such table.
    """
    out, direction, model, points = [], None, "flexible", None
    with open(md_path, encoding="utf-8") as f:
        for line in f:
            line = line.rstrip("\n")
            if line.startswith("## "):
                direction, model = line[3:].strip(), "flexible"
            elif line.startswith("### "):
                model = "fine-tuned" if "fine-tuned row" in line else "flexible"
            elif line.startswith("| tau | valid window"):
                points = {}
                out.append((direction, model, points))
            elif points is not None and (m := _ROW.match(line)):
                tau = math.inf if m.group(1) == "inf" else float(m.group(1))
                points[tau] = {s: {"window": float(m.group(2 + 3 * i)), "bleu": float(m.group(3 + 3 * i)),
                                   "tok_bleu": float(m.group(4 + 3 * i))} for i, s in enumerate(("valid", "test"))}
            elif points is not None and line and not line.startswith("|"):
                points = None
    if not out:
        raise SystemExit(f"{md_path}: no BLEU-vs-window table ('| tau | valid window | ...') found")
    return out


def sweep_table(points) -> list:
    """Markdown lines of the BLEU-vs-window table from ``(tau name, {valid, test})`` pairs."""
    lines = ["| tau | valid window | valid BLEU (tok) | test window | test BLEU (tok) |", "|---|---|---|---|---|"]
    for name, v in points:
        lines.append(f"| {name} | {v['valid']['window']:.2f} | {v['valid']['bleu']:.2f} "
                     f"({v['valid']['tok_bleu']:.2f}) | {v['test']['window']:.2f} | {v['test']['bleu']:.2f} "
                     f"({v['test']['tok_bleu']:.2f}) |")
    return lines


def sweep(run_dir: str, taus, metric: str, max_loss: float, figure=None, out=None,
          model="Flexible attention") -> dict:
    """Decode valid + test over ``taus`` (and inf); write sweep.json / sweep.md (+ figure, titled
    with ``model``); commit each tau's decode as the run's evidence (:func:`export_decode`;
    ``summary["evidence"]``).  The summary records the rule's ``selected_tau`` (None when no
    candidate meets it) and ``least_loss_tau`` (:func:`least_loss_tau`); :func:`used_tau` says
    which one a table decodes at."""
    res = run_info(run_dir)
    out = out or os.path.join(run_dir, "sweep")
    points, evid = {}, {}
    for tau in list(taus) + [math.inf]:
        points[tau] = decode(res, tau, ["valid", "test"], os.path.join(out, f"tau_{tau_name(tau)}"))
        evid[tau_name(tau)] = export_decode(run_dir, res, tau, ["test", "valid"],
                                            os.path.join(out, f"tau_{tau_name(tau)}"))
        log(f"tau={tau_name(tau)}: valid {metric} {points[tau]['valid'][metric]:.2f} window "
            f"{points[tau]['valid']['window']:.2f}; test {metric} {points[tau]['test'][metric]:.2f} window "
            f"{points[tau]['test']['window']:.2f}")
    chosen = select_tau(points, metric, max_loss)
    summary = {"run": os.path.relpath(run_dir, ROOT), "checkpoint": os.path.relpath(res["_checkpoint"], ROOT),
               "direction": res["direction"], "metric": metric, "max_loss": max_loss,
               "selected_tau": chosen, "least_loss_tau": least_loss_tau(points, metric),
               "select_from": list(SELECT_FROM),
               "points": {tau_name(t): v for t, v in points.items()}, "git_commit": res.get("git_commit"),
               "regime": res.get("regime"), "seed": res.get("seed"), "evidence": evid}
    with atomic_path(os.path.join(out, "sweep.json")) as tmp, open(tmp, "w") as f:
        json.dump(summary, f, indent=2)
    lines = [f"# BLEU vs average window over tau ({res['direction']}, `{summary['checkpoint']}`)", "",
             f"Selected tau (paper rule: smallest of {list(SELECT_FROM)} with validation {metric} >= "
             f"tau=inf - {max_loss}): **{tau_name(chosen) if chosen is not None else 'none'}**"
             + ("" if chosen is not None else f" ({used_tau(summary)[1]})"), "",
             *sweep_table((tau_name(t), v) for t, v in points.items())]
    lines += ["", f"Window = source positions scored per hypothesis and step (beam {res['config']['budget']['generate']['beam']}); "
              f"average source length {points[math.inf]['test']['source_length']:.2f} (test). "
              "SacreBLEU with tokenized BLEU in brackets. Regenerate: `python scripts/flexible_sweep.py sweep "
              f"--run {summary['run']}`.", ""]
    write_text(os.path.join(out, "sweep.md"), "\n".join(lines))
    if figure:
        plot(points, figure, f"{model}, {res['direction']}: BLEU vs window (tau annotated)")
        log(f"wrote {figure}")
    log(f"selected tau = {tau_name(chosen) if chosen is not None else 'none'}; wrote {out}/sweep.md")
    return summary


#: Paper Table 1 cells (window, BLEU[ / RIBES]) per column; a run is compared with the En-Ja column
#: when its target is Japanese, else with the De-En column (Multi30k runs, both directions).
PAPER_TABLE1 = {
    "De-En": {"global": ("20.7", "20.62"), "local": ("15.7", "21.09"), "inf": ("20.7", "21.31"),
              "tau": ("7.8", "21.11"), "ft": ("7.4", "20.79")},
    "En-Ja": {"global": ("24.4", "34.87 / 0.810"), "local": ("18.4", "34.52 / 0.809"),
              "inf": ("24.4", "35.01 / 0.814"), "tau": ("16.4", "34.90 / 0.812"), "ft": ("10.7", "34.78 / 0.807")},
}


def table1(runs, metric, max_loss, out_path, figure=None,
           title="Flexible Attention Table 1 on Multi30k (`rnnsearch_small`, CPU budget)"):
    """Assemble Table 1 (window and BLEU per model) over the given direction run directories.

    Each direction is shown next to the paper's En-Ja column when its target language is ``ja``,
    else next to the paper's De-En column (:data:`PAPER_TABLE1`).  Every model row has a page-wide
    ID (``<direction>/<row>``, ``-tau`` for the rows decoded at the selected tau) and a ``### Row``
    section naming its committed evidence: the run's own (rows decoded as trained) or the decode at
    tau committed beside it (:func:`export_decode`) -- the format ``tests/test_results_audit.py``
    checks.  When a row has none, the page says so (:data:`NO_EVIDENCE`) and names no evidence.
    """
    from .evidence import NO_EVIDENCE
    from .provenance import REGIMES, repo_relative, weakest_regime

    sections, all_entries, regimes, seeds = [], [], [], set()
    for rdir in runs:
        rows = {i: os.path.join(rdir, f"row{i}") for i in (1, 2, 3, 4)}
        res3 = run_info(rows[3])
        fig = figure if rdir == runs[-1] else None
        tuned = os.path.exists(os.path.join(rows[4], "result.json"))
        sw = sweep(rows[3], PAPER_TAUS, metric, max_loss, figure=None if tuned else fig)
        tau, tau_note = used_tau(sw)
        # Figure 3 (§5.3): "The data points are collected by testing different thresholds with the
        # fine-tuned Flexible Attention model" -- row 4 is swept too (its tau row reads that sweep)
        sw4 = sweep(rows[4], PAPER_TAUS, metric, max_loss, figure=fig, model="Fine-tuned flexible attention") \
            if tuned else None
        direction = res3["direction"]
        entries = []
        for key, name, i, t in (("global", "Global Attention", 1, None), ("local", "Local Attention (local-p)", 2, None),
                                ("inf", "Flexible Attention (tau=inf)", 3, math.inf),
                                ("tau", f"Flexible Attention (tau={tau_name(tau)})", 3, tau),
                                ("ft", f"+ fine-tuning (tau={tau_name(tau)})", 4, tau)):
            rid = f"{direction}/{i}" + ("-tau" if key in ("tau", "ft") else "")
            if not os.path.exists(os.path.join(rows[i], "result.json")):
                entries.append(dict(id=rid, key=key, name=name, v=None, evidence=None, run=rows[i]))
                continue
            res = run_info(rows[i])
            regimes.append(res.get("regime") or "unstated")
            if res.get("seed") is not None:
                seeds.add(res["seed"])
            if t is None:  # the run's own decode (tau is not a setting of these models)
                sub = os.path.join(rows[i], "eval")
                own = json.load(open(os.path.join(sub, "test.json")))
                v = {**own, **read_window(own, os.path.join(sub, "test.json"))}
                ev = run_evidence(rows[i], res, "test", v["bleu"])
            else:  # row 3's or row 4's sweep decoded it and committed it
                s_i = sw if i == 3 else sw4
                v = s_i["points"][tau_name(t)]["test"]
                ev = (s_i.get("evidence") or {}).get(tau_name(t))
            entries.append(dict(id=rid, key=key, name=name, v=v, evidence=ev, run=rows[i], tau=t))
        all_entries += entries
        sections.append((rdir, res3, sw, sw4, tau, tau_note, fig, entries))

    complete = all(e["evidence"] for e in all_entries)
    weakest = weakest_regime(regimes)
    cmd = "mt-flexible-sweep table1 --runs " + " ".join(repo_relative(r) for r in runs)
    lines = [f"# {title}", "",
             f"**Regime: {weakest}** -- {REGIMES.get(weakest, 'the runs state no regime')}. Seeds: "
             f"{', '.join(map(str, sorted(seeds))) or 'not recorded'} (one run per row: differences between rows "
             "are not tested against seed noise). Converged numbers and verdicts: [results/README.md](../README.md).", ""]
    if not complete:
        missing = [e["id"] for e in all_entries if not e["evidence"]]
        lines += [f"{NO_EVIDENCE} Rows {', '.join(missing)} have no committed evidence (their runs or decodes were "
                  "not exported), so this page's numbers cannot be re-scored from the repository, only re-run: "
                  "`mt-campaign run --plan configs/campaign/smoke.yaml` trains the Flexible Table 1 runs with "
                  f"evidence, then `{cmd}` decodes and commits the rest.", ""]
    lines += ["Paper: Shu & Nakayama (2017), Table 1 (De-En: WMT15, En-Ja: ASPEC; 1000-unit RNNsearch, tokenized "
              "BLEU; RIBES for En-Ja). "
              "Window = source positions scored, averaged as §5.2 says: at each decoding step over the beam's "
              "hypotheses, then over the sentence's steps, then over the test sentences -- for Global attention "
              "the mean number of source positions (positions are the source's tokens -- BPE pieces, words or characters, as the "
              "data were prepared -- plus the EOS fairseq appends, which the paper's windows do not count; each "
              "decode's record keeps the average pooled over hypothesis-steps too). tau chosen on the validation "
              f"set by the paper's rule (§5.2: at most {max_loss} {metric} lost against tau = inf; the smallest "
              f"such tau of {list(SELECT_FROM)}, our reading). "
              "SacreBLEU with tokenized BLEU in brackets.", ""]
    for rdir, res3, sw, sw4, tau, tau_note, fig, entries in sections:
        column = "En-Ja" if res3["direction"].split("-")[-1] == "ja" else "De-En"
        paper = PAPER_TABLE1[column]
        lines += [f"## {res3['direction']}", "", f"Selected tau: {tau_name(tau)}" + (f" ({tau_note})" if tau_note else ""), "",
                  f"| ID | Model | paper window ({column}) | paper BLEU ({column}) | window | BLEU (tok) |",
                  "|---|---|---|---|---|---|"]
        for e in entries:
            v = e["v"]
            cells = ["not run yet", ""] if v is None else [f"{v['window']:.2f}", f"{v['bleu']:.2f} ({v['tok_bleu']:.2f})"]
            lines.append(f"| {e['id']} | {e['name']} | {paper[e['key']][0]} | {paper[e['key']][1]} | " + " | ".join(cells) + " |")
        src_len = next((e["v"]["source_length"] for e in entries if e["v"] and e["v"].get("source_length")), None)
        if src_len is not None:
            lines += ["", f"Test sources: {src_len:.2f} positions a sentence on average (tokens + EOS)."]
        sig = next((e["v"].get("signature") for e in entries if e["v"] and e["v"].get("signature")), "n/a")
        table = _training_table(rdir)
        lines += ["", f"Runs: `{repo_relative(rdir)}/row1..4`; their commands, configs, commits, hardware and "
                  "wall times are in " + (f"the committed training table `{table}` (rendered from the same runs) and in "
                                          if table else "") + "each run's result.json (committed with its evidence, below); "
                  f"sacreBLEU signature `{sig}`.", ""]
        for e in entries:
            if e["v"] is None:
                continue
            lines += [f"### Row {e['id']}: {e['name']}", "",
                      f"- run `{repo_relative(e['run'])}`"
                      + ("" if e.get("tau") is None else f", decoded at tau = {tau_name(e['tau'])} "
                         f"(`--model-overrides {{'flexible_threshold':'{tau_name(e['tau'])}'}}`)")]
            if complete:
                kind = "result.json, hypotheses, training log" if e.get("tau") is None else "result.json, hypotheses"
                lines.append(f"- committed evidence ({kind}): `{e['evidence']}`")
            lines.append("")
        for which, s_i in (("flexible row, where tau is selected", sw), ("fine-tuned row (Figure 3", sw4)):
            if s_i is None:
                continue
            where = f"plotted in {os.path.relpath(fig, ROOT)}" if fig and s_i is (sw4 or sw) else ""
            head = f"{which}{' -- ' + where if where else ''})" if s_i is sw4 else which + (f" ({where})" if where else "")
            lines += [f"### BLEU vs window over tau, {head}",
                      "", f"`{s_i['checkpoint']}`, git commit `{s_i.get('git_commit')}`; from `{s_i['run']}/sweep/sweep.md`"
                      + (f"; each tau's decode (valid and test) is committed under "
                         f"`{os.path.dirname(next(iter(s_i['evidence'].values())))}/`"
                         if complete and s_i.get("evidence") and all(s_i["evidence"].values()) else "") + ".", "",
                      *sweep_table(s_i["points"].items()), ""]
    lines += [f"_Rendered by `{cmd}`._", ""]
    write_text(out_path, "\n".join(lines))
    log(f"wrote {out_path}")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("sweep", help="BLEU and window over tau for one run")
    s.add_argument("--run", required=True, help="experiment run directory (with result.json)")
    s.add_argument("--taus", type=float, nargs="+", default=list(PAPER_TAUS))
    s.add_argument("--figure", help="write the trade-off figure here (PNG)")
    s.add_argument("--out", help="output directory (default: <run>/sweep)")
    t = sub.add_parser("table1", help="assemble results/flexible/table1_multi30k.md")
    t.add_argument("--runs", nargs="+", required=True, help="table run dirs, one per direction")
    t.add_argument("--out", default=os.path.join(ROOT, "results", "flexible", "table1_multi30k.md"))
    t.add_argument("--title", default="Flexible Attention Table 1 on Multi30k (`rnnsearch_small`, CPU budget)",
                   help="heading of the table (the paper-scale reproduce command sets its own)")
    t.add_argument("--figure", default=os.path.join(ROOT, "results", "flexible", "figure3_tradeoff.png"),
                   help="trade-off figure (Figure 3) of the last direction's fine-tuned row (its flexible row's "
                        "while row 4 is not trained)")
    for q in (s, t):
        q.add_argument("--metric", choices=["tok_bleu", "bleu"], default="tok_bleu",
                       help="BLEU used by the selection rule (paper: tokenized BLEU)")
        q.add_argument("--max-loss", type=float, default=0.5, help="allowed validation BLEU loss (paper 0.5)")
    r = sub.add_parser("replot", help="re-render the trade-off figure from a rendered Table 1 file")
    r.add_argument("--table", default=os.path.join(ROOT, "results", "flexible", "table1_multi30k.md"))
    r.add_argument("--direction", help="which direction's sweep (default: the last in the file); the fine-tuned "
                                       "row's when the page has it (Figure 3, §5.3), else the flexible row's")
    r.add_argument("--figure", default=os.path.join(ROOT, "results", "flexible", "figure3_tradeoff.png"))
    a = p.parse_args(argv)
    if a.cmd == "replot":
        tables = read_sweep_tables(a.table)
        chosen = [t for t in tables if a.direction in (None, t[0])]
        if not chosen:
            p.error(f"--direction {a.direction!r}; valid: {', '.join(dict.fromkeys(str(d) for d, _, _ in tables))}")
        direction = chosen[-1][0]
        # Figure 3 plots the fine-tuned model's sweep (§5.3); an older page has only the flexible row's
        mine = [t for t in chosen if t[0] == direction]
        _, model, points = next((t for t in mine if t[1] == "fine-tuned"), mine[-1])
        title = "Fine-tuned flexible attention" if model == "fine-tuned" else "Flexible attention"
        plot(points, a.figure, f"{title}, {direction}: BLEU vs window (tau annotated)")
        log(f"wrote {a.figure} from {a.table} ({direction}, {model} row)")
    elif a.cmd == "sweep":
        bad = [x for x in a.taus if not x > 0]
        if bad:
            p.error(f"--taus must be > 0, got {bad}")
        sweep(os.path.abspath(a.run), a.taus, a.metric, a.max_loss, a.figure, a.out)
    else:
        table1([os.path.abspath(r) for r in a.runs], a.metric, a.max_loss, a.out, a.figure, a.title)


if __name__ == "__main__":
    main()
