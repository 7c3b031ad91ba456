"""Training curves from fairseq's logs: the one reader.

fairseq writes one progress line per ``--log-interval`` updates (``train_inner``) and one per
validation (``valid``).  Budgets log ``--log-format json``::

    2026-11-24 08:41:22 | INFO | train_inner | {"epoch": 3, "update": 2.13, "loss": "7.809", ..., "num_updates": "275"}
    2026-11-24 08:44:01 | INFO | valid | {"epoch": 3, "valid_loss": "7.5", "valid_nll_loss": "6.6", ..., "valid_num_updates": "390"}

(values are strings; ``valid`` keys carry the ``valid_`` prefix).  Older runs used the
``simple`` format (``| valid | epoch 003 | loss 7.5 | ... | num_updates 390``), which is read too,
so a table can mix runs of both.  Losses are fairseq's: base 2, per target token.
"""

import gzip
import json
import os
import re
from typing import Dict, List, Optional, Tuple

__all__ = ["progress_stats", "loss_curves", "last_valid_metrics", "valid_curve", "run_train_log", "interpolate",
           "slope_per_1000", "Curve"]

Curve = List[Tuple[int, float]]

_SIMPLE_TRAIN = re.compile(r"\| train_inner \|.*?loss=([\d.naif]+).*?num_updates=(\d+)")
_SIMPLE_VALID = re.compile(r"\| valid \|.*?\| loss ([\d.naif]+) .*?\| num_updates (\d+)")
_SIMPLE_METRIC = re.compile(r"\| ([a-z_0-9]+) (-?[\d.]+(?:e-?\d+)?|nan|inf)\b")


def _number(value):
    try:
        return float(value)
    except (TypeError, ValueError):
        return value


def progress_stats(line: str, tag: str) -> Optional[Dict[str, object]]:
    """The statistics of one fairseq progress line of ``tag`` (``"train_inner"``, ``"valid"``,
    ``"train"``), in either log format, or None when the line is not one.

    Returns:
        ``{name: value}`` with the ``<tag>_`` prefix removed and numeric strings as floats
        (``loss``, ``nll_loss``, ``num_updates``, ``attn_entropy``, ...).
    """
    marker = f"| {tag} | "
    i = line.find(marker)
    if i < 0:
        return None
    rest = line[i + len(marker):]
    if rest.lstrip().startswith("{"):
        try:
            stats = json.loads(rest)
        except ValueError:
            return None
        prefix = tag + "_"
        return {(k[len(prefix):] if k.startswith(prefix) else k): _number(v) for k, v in stats.items()}
    if tag == "train_inner":  # simple format: "epoch 001:  10 / 130 loss=12.3, nll_loss=..., num_updates=10"
        return {k: _number(v) for k, v in re.findall(r"([a-z_0-9]+)=([^,\s]+)", rest)} or None
    return {m.group(1): float(m.group(2)) for m in _SIMPLE_METRIC.finditer("| " + rest)} or None


def loss_curves(train_log: str) -> Tuple[Curve, Curve]:
    """``(train, valid)``: lists of ``(num_updates, loss)`` from a fairseq training log (missing
    file: two empty lists).  A resumed run's log holds every invocation; points are kept in order."""
    train: Curve = []
    valid: Curve = []
    if not os.path.exists(train_log):
        return train, valid
    with open(train_log, errors="replace") as f:
        for line in f:
            for tag, out in (("train_inner", train), ("valid", valid)):
                st = progress_stats(line, tag)
                if st and isinstance(st.get("loss"), float) and "num_updates" in st:
                    out.append((int(st["num_updates"]), st["loss"]))
                    break
    return train, valid


def last_valid_metrics(train_log: str) -> Dict[str, float]:
    """``{metric: value}`` of the last validation line (``loss``, ``nll_loss``, ``attn_entropy``,
    ...); empty when there is none."""
    last = None
    if os.path.exists(train_log):
        with open(train_log, errors="replace") as f:
            for line in f:
                if " | valid | " in line:
                    last = line
    st = progress_stats(last, "valid") if last else None
    return {k: v for k, v in (st or {}).items() if isinstance(v, float)}


def run_train_log(run_dir: str) -> Optional[str]:
    """The fairseq training log of a run: ``train.log`` in its run directory, else the gzipped
    ``train.log.gz`` of its committed evidence (:mod:`mt_pipeline.evidence`); None without either."""
    for name in ("train.log", "train.log.gz"):
        path = os.path.join(run_dir, name)
        if os.path.exists(path):
            return path
    return None


def valid_curve(train_log: Optional[str], metric: str = "nll_loss") -> Curve:
    """``(num_updates, value)`` of ``metric`` on every validation line of a fairseq training log.

    Args:
        train_log: ``train.log`` or the evidence's ``train.log.gz`` (read as gzip by its suffix);
            None or a missing file gives ``[]``.
        metric: a validation statistic without its ``valid_`` prefix: ``nll_loss`` (base 2, per
            target token, no label smoothing and no auxiliary loss: comparable across models that
            share a target dictionary), ``loss`` (what the criterion optimises, e.g. with ReLUFormer's
            eq. 7 term), ``attn_entropy``, ...

    Returns:
        Points sorted by updates; a validation repeated at the same update (a resumed run's log
        holds every invocation) keeps its last value.
    """
    if not train_log or not os.path.exists(train_log):
        return []
    opener = gzip.open if train_log.endswith(".gz") else open
    points: Dict[int, float] = {}
    with opener(train_log, "rt", errors="replace") as f:
        for line in f:
            st = progress_stats(line, "valid")
            if st and isinstance(st.get(metric), float) and isinstance(st.get("num_updates"), float):
                points[int(st["num_updates"])] = st[metric]
    return sorted(points.items())


def interpolate(curve: Curve, update: float) -> Optional[float]:
    """The curve's value at ``update``, linear between its two neighbouring points; None outside
    ``[first, last]`` update of the curve (no extrapolation)."""
    if not curve or update < curve[0][0] or update > curve[-1][0]:
        return None
    for (u0, v0), (u1, v1) in zip(curve, curve[1:]):
        if u0 <= update <= u1:
            return v0 if u1 == u0 else v0 + (v1 - v0) * (update - u0) / (u1 - u0)
    return curve[-1][1]  # a one-point curve, update == its update


def slope_per_1000(points: Curve) -> Optional[float]:
    """Least-squares slope of ``(num_updates, value)`` points, in value units per 1,000 updates;
    None with fewer than 3 points or a single update."""
    if len(points) < 3:
        return None
    xs = [u / 1000.0 for u, _ in points]
    ys = [v for _, v in points]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    if sxx == 0:
        return None
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
