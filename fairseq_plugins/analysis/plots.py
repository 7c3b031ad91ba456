"""PNG figures of the attention analyses and of training runs (matplotlib, Agg backend).

Shape legend: H heads, T query length, S key length.  Every function writes one PNG
atomically (temp file + rename) and returns its path.  Layers are shown 1-based, as in the
papers' figures.
"""

import math
import os
from typing import Dict, List, Optional, Sequence

from ..atomic import atomic_path

__all__ = ["pyplot", "save_png", "layer_curves", "hallucination_curves", "aer_curves", "top_p_curves", "heatmap_grid", "rho_curves",
           "training_curves"]

KIND_TITLES = {"encoder": "encoder self-attention", "decoder": "decoder self-attention",
               "cross": "cross-attention"}


def pyplot():
    """``matplotlib.pyplot`` on the Agg backend (no display needed), with matplotlib's and PIL's
    loggers at WARNING (fairseq may leave the root logger at DEBUG: no import-time chatter)."""
    import logging

    import matplotlib

    for name in ("matplotlib", "PIL"):
        logging.getLogger(name).setLevel(logging.WARNING)
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


_plt = pyplot


def _layer_axis(ax):
    """Label ``ax``'s x axis as 1-based layer numbers with integer ticks only."""
    from matplotlib.ticker import MaxNLocator

    ax.set_xlabel("layer")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))


def save_png(fig, path: str, dpi: int = 110, tight: bool = True) -> str:
    """Write matplotlib figure ``fig`` to ``path`` as a PNG atomically (``dpi`` dots per inch;
    ``tight``: cropped to its content, ``bbox_inches="tight"``), close it and return ``path``."""
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=dpi, **({"bbox_inches": "tight"} if tight else {}))
    pyplot().close(fig)
    return path


_save = save_png


def _nan(ys):
    """``None`` (undefined) as NaN, for matplotlib."""
    return [math.nan if y is None else y for y in ys]


def _seed_errorbar(ax, xs, ys, sds, n: int, label: str, part: str = "", **kw):
    """A seed mean's curve: the means with ± the seeds' sample sd as error bars, labelled
    "LABEL (PART, mean ± sd of N seeds)"."""
    ax.errorbar(list(xs), _nan(ys), yerr=_nan(sds), capsize=3,
                label=f"{label} ({part + ', ' if part else ''}mean ± sd of {n} seeds)", **kw)


def layer_curves(results: Dict[str, dict], metric: str, ylabel: str, path: str,
                 title: Optional[str] = None) -> str:
    """Per-layer curves of ``metric`` for each attention type (one panel each), one line per
    model label.  ``results[label]["metrics"][kind][metric]`` is a list over layers; a seed mean
    (``metric + "_seed_sd"`` beside it, :func:`~fairseq_plugins.analysis.report.seed_mean_analysis`)
    is drawn with ± the seeds' sd as error bars."""
    plt = _plt()
    kinds = [k for k in KIND_TITLES if any(k in r["metrics"] for r in results.values())]
    fig, axes = plt.subplots(1, len(kinds), figsize=(4.2 * len(kinds), 3.2), squeeze=False)
    for ax, kind in zip(axes[0], kinds):
        for label, r in results.items():
            m = r["metrics"].get(kind, {})
            ys = m.get(metric)
            if ys is None:
                continue
            if metric + "_seed_sd" in m:
                _seed_errorbar(ax, range(1, len(ys) + 1), ys, m[metric + "_seed_sd"], len(m[metric + "_per_seed"]),
                               label, marker="o")
                continue
            ax.plot(range(1, len(ys) + 1), [math.nan if y is None else y for y in ys], marker="o", label=label)
        ax.set_title(KIND_TITLES[kind])
        _layer_axis(ax)
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
    axes[0][-1].legend(fontsize=8)
    if title:
        fig.suptitle(title)
    return _save(fig, path)


def hallucination_curves(results: Dict[str, dict], path: str) -> str:
    """Cross-attention null rate per layer: references (solid) vs shuffled references (dashed)
    (ReLA Figure 6); a seed mean with ± the seeds' sd as error bars."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(4.8, 3.4))
    for n, (label, r) in enumerate(results.items()):
        h = r.get("hallucination")
        if not h:
            continue
        c = f"C{n}"
        xs = range(1, len(h["reference"]) + 1)
        if "reference_seed_sd" in h:
            k = len(h["reference_per_seed"])
            _seed_errorbar(ax, xs, h["reference"], h["reference_seed_sd"], k, label, "reference", color=c, marker="o")
            _seed_errorbar(ax, xs, h["shuffled"], h["shuffled_seed_sd"], k, label, "shuffled", color=c, marker="x",
                           linestyle="--")
            continue
        ax.plot(xs, h["reference"], color=c, marker="o", label=f"{label} (reference)")
        ax.plot(xs, h["shuffled"], color=c, marker="x", linestyle="--", label=f"{label} (shuffled)")
    _layer_axis(ax)
    ax.set_ylabel("cross-attention null rate")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    return _save(fig, path)


def aer_curves(aer_results: Dict[str, dict], path: str) -> str:
    """AER per layer, normal (left) and shifted (right) attention; solid = best head per layer,
    dashed = layer attention (ReLA Figure 4)."""
    plt = _plt()
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.4), sharey=True)
    for ax, mode in zip(axes, ("normal", "shifted")):
        for n, (label, r) in enumerate(aer_results.items()):
            m = r[mode]
            xs = range(1, len(m["layer"]) + 1)
            ax.plot(xs, m["best_head"], color=f"C{n}", marker="o", label=f"{label} best head")
            ax.plot(xs, m["layer"], color=f"C{n}", marker="x", linestyle="--", label=f"{label} layer")
        ax.set_title(f"{mode} attention")
        _layer_axis(ax)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("AER (%)")
    axes[1].legend(fontsize=7)
    return _save(fig, path)


def top_p_curves(results: Dict[str, dict], path: str) -> str:
    """Top-p % score sum against p (mean over layers), one panel per attention type
    (ReLUFormer Figures 2 and 4); a seed mean (``top_p_per_seed``) with ± the sd of the seeds'
    means over layers as error bars."""
    plt = _plt()
    kinds = [k for k in KIND_TITLES if any(k in r["metrics"] for r in results.values())]
    fig, axes = plt.subplots(1, len(kinds), figsize=(4.2 * len(kinds), 3.2), squeeze=False)
    for ax, kind in zip(axes[0], kinds):
        for label, r in results.items():
            tp = r["metrics"].get(kind, {}).get("top_p")
            if not tp:
                continue
            ps = sorted(tp, key=float)
            means = [math.nan if None in tp[p] else sum(tp[p]) / len(tp[p]) for p in ps]  # None: undefined
            seeds = r["metrics"][kind].get("top_p_per_seed")
            if seeds:
                import statistics

                per = [[None if None in s[p] else sum(s[p]) / len(s[p]) for s in seeds] for p in ps]
                sds = [None if None in v else statistics.stdev(v) for v in per]
                _seed_errorbar(ax, [float(p) for p in ps], means, sds, len(seeds), label, marker="o")
                continue
            ax.plot([float(p) for p in ps], means, marker="o", label=label)
        ax.set_title(KIND_TITLES[kind])
        ax.set_xlabel("top p (%)")
        ax.set_ylabel("score sum")
        ax.grid(alpha=0.3)
    axes[0][-1].legend(fontsize=8)
    return _save(fig, path)


def heatmap_grid(weights: List, row_tokens: Sequence[str], col_tokens: Sequence[str], path: str,
                 title: str = "") -> str:
    """Attention heatmaps, one row of panels per layer and one column per head.

    Args:
        weights: per layer a ``(H, T, S)`` tensor.
        row_tokens: the ``T`` query tokens; col_tokens: the ``S`` key tokens.

    Null rows (all weights 0) are drawn hatched in red and their query label is marked ``∅``,
    so switched-off queries stay visible (ReLA Figure 7).
    """
    plt = _plt()
    from matplotlib.patches import Rectangle

    L, H = len(weights), weights[0].size(0)
    T, S = weights[0].shape[-2:]
    cell = 0.22
    fig, axes = plt.subplots(L, H, figsize=(max(3.0, cell * S + 1.2) * H, max(2.5, cell * T + 1.0) * L),
                             squeeze=False)
    for li, w in enumerate(weights):
        for h in range(H):
            ax = axes[li][h]
            a = w[h].float()
            vmax = float(a.max()) if float(a.max()) > 0 else 1.0
            ax.imshow(a.numpy(), cmap="Blues", vmin=0.0, vmax=vmax, aspect="auto", interpolation="nearest")
            null = (a == 0).all(dim=-1).tolist()
            for t, is_null in enumerate(null):
                if is_null:
                    ax.add_patch(Rectangle((-0.5, t - 0.5), S, 1, fill=False, hatch="///",
                                           edgecolor="red", linewidth=0.0))
            ax.set_xticks(range(S))
            ax.set_xticklabels(col_tokens, rotation=90, fontsize=6)
            ax.set_yticks(range(T))
            ax.set_yticklabels([("∅ " if n else "") + tok for tok, n in zip(row_tokens, null)], fontsize=6)
            ax.set_title(f"layer {li + 1} head {h} (null {sum(null)}/{T})", fontsize=7)
    if title:
        fig.suptitle(title, fontsize=9)
    return _save(fig, path)


def rho_curves(rho: Dict[str, float], n_layers: int, tau: float, path: str) -> str:
    """E-ATT's ratio of ones after binarisation ρ per layer (paper Figure 2): one line each for
    encoder self-attention, decoder self-attention, and the cross-attention query and key inputs.

    Args:
        rho: ``"{encoder|decoder|cross}/{layer (0-based)}/{query|key}" -> ρ`` in [0, 1]; missing
            keys (a layer without E-ATT) are skipped.
        n_layers: the largest number of layers of any attention type.
        tau: the binarisation threshold τ, shown in the title.
        path: the PNG to write (atomically).

    Returns:
        ``path``.
    """
    plt = _plt()
    fig, ax = plt.subplots(figsize=(5, 3.2))
    for label, typ, role in (("Enc-Self", "encoder", "query"), ("Dec-Self", "decoder", "query"),
                             ("Dec-Crs-Query", "cross", "query"), ("Dec-Crs-Key", "cross", "key")):
        pts = [(i + 1, rho[f"{typ}/{i}/{role}"]) for i in range(n_layers) if f"{typ}/{i}/{role}" in rho]
        if pts:
            ax.plot(*zip(*pts), marker="o", label=label)
    _layer_axis(ax)
    ax.set_ylabel("ratio of nonzero values ρ")
    ax.set_title(f"E-ATT binarisation ratio (τ = {tau})")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return _save(fig, path)


def training_curves(series: Dict[str, Sequence], path: str, ylabel: str = "validation loss",
                    title: Optional[str] = None) -> str:
    """One line per run: ``series[label]`` is a sequence of ``(num_updates, value)`` points
    (e.g. a run's validation losses, base 2).  Non-finite values (a diverged run) are left out
    of the line and marked by the label."""
    import math

    plt = _plt()
    fig, ax = plt.subplots(figsize=(7.0, 4.2))
    for label, points in series.items():
        pts = [(int(u), float(v)) for u, v in points]
        finite = [(u, v) for u, v in pts if math.isfinite(v)]
        if len(finite) < len(pts):
            label += " (diverged)"
        if finite:
            ax.plot([u for u, _ in finite], [v for _, v in finite], marker=".", label=label)
    ax.set_xlabel("updates")
    ax.set_ylabel(ylabel)
    if title:
        ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="upper right")
    return _save(fig, path)
