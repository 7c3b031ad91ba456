"""Energy accounting of attention (E-ATT, *Attention Mechanism with Energy-Friendly Operations*,
Table 1 costs, Table 2 counts, Table 4 "Energy (%)", Figure 2 binarisation ratios).

Symbols: ``l_q`` / ``l_k`` query / key sequence lengths (``l`` in the paper's self-attention
case), ``d`` model size, ``h`` heads (``d_h = d / h``, the paper's ``k_h``), ``rho_q`` /
``rho_k`` the ratio of ones in the binarised query / key inputs (Figure 2), ``k = d`` the width
of ``W_Q`` / ``W_K`` (Transformer base; fairseq's ``q_proj`` / ``k_proj``).

Counts (``convention="paper"``, which reproduces the paper's Table 2 formulas for vanilla and
Dense; the E-ATT row is our count of eqs. 9-12 -- the paper's E-ATT cell, garbled in our copy,
reads ``1/2 l d rho + l^2 d``, which taken as printed gives 0.430-0.440 % of vanilla at
``l = 23.03``, ``d = 512`` with the ASIC costs of Table 1 for any ``rho`` in [0, 1] --
:func:`printed_eatt_cell`):

============ ======================================= =======================================
kind         additions (scores)                      multiplications (scores)
============ ======================================= =======================================
vanilla      ``l_q d k + l_k d k + l_q l_k d``       same (every multiply is accumulated)
dense        ``l_q d d + l_q l_k d``                 same  (``W1``: d x d, ``W2_h``: d_h x l)
random       0                                       0     (scores are a parameter)
eatt         ``rho_q l_q d k + rho_k l_k d k``       0
             ``+ c_L1 l_q l_k d``
eatt_l1      ``(l_q + l_k) d k + c_L1 l_q l_k d``    ``(l_q + l_k) d k``
eatt_select  ``rho_q l_q d k + rho_k l_k d k``       ``l_q l_k d``
_dot         ``+ l_q l_k d``
============ ======================================= =======================================

With ``l_q = l_k = l``, ``rho_q = rho_k = rho``: vanilla ``2 l d^2 + l^2 d`` (Table 2), Dense
``l d^2 + l^2 d`` (Table 2), E-ATT ``2 rho l d^2 + l^2 d`` additions and no multiplication (ours,
see above).

Assumptions (stated because the paper does not):

* A multiply-accumulate is one multiplication + one addition (``convention="paper"``);
  ``convention="exact"`` counts ``n`` products and ``n - 1`` additions per length-``n`` dot
  product, ``m - 1`` additions for a sum of ``m`` selected rows (``m = rho d``), and
  ``2 d_h - 1`` additions/subtractions per L1 distance.
* ``c_L1`` (``l1_adds_per_element``): additions per element of an L1 distance.  1 reproduces the
  paper's ``l^2 d``; 2 also counts the subtraction ``q - k`` next to the accumulation
  (``|.|`` is a sign-bit clear, free).  Default 1 (the paper's).
* Biases, the ``1 / sqrt(d_h)`` scaling, the binarisation comparisons, the softmax and ReLU are
  not counted.  The scale ``s = 1 / sqrt(d_h)`` costs nothing at inference because it folds into
  the weights: for dot products into ``W_Q`` and its bias alone (``s (q . k) = (s q) . k``); for
  the L1 distance into *both* ``W_Q`` and ``W_K`` and both biases (``s ||q - k||_1 =
  ||s q - s k||_1`` for ``s > 0``, whereas ``s ||q - k||_1 != ||s q - k||_1`` in general); scaled
  rows are still selected and added, so E-ATT stays multiplication-free.  Decoder
  self-attention is counted over all ``l_q l_k`` pairs (the paper's ``l^2``; the causal mask
  halves the pairs actually needed, for every kind alike).
* "block" adds the value path, identical for all kinds and full precision in E-ATT too:
  ``V = Y W_V`` (``l_k d^2``), ``A V`` (``l_q l_k d``), ``O W_O`` (``l_q d^2``), each as MACs.

Energy: ``adds * cost_add + muls * cost_mul`` with Table 1's FP32 costs (pJ):
ASIC add 0.9 / mul 3.7; FPGA add 0.4 / mul 18.8 (You et al. 2020).

Table 2 (``Delta``) is reproduced with :func:`table2`: Dense's 51.10 % fixes ``l`` -- it equals
``(d + l) / (2 d + l)`` for every hardware, so ``l = d (2r - 1) / (1 - r) = 23.0`` at ``d = 512``
(:func:`implied_length`); E-ATT's 0.44 % then needs ``rho`` given by :func:`implied_rho`
(hardware-dependent; see README).
"""

import math
from dataclasses import dataclass
from typing import Dict, Iterable, List, Mapping, Optional, Tuple

__all__ = [
    "COSTS_PJ", "KINDS", "FN_KIND", "OpCount", "score_ops", "block_ops", "energy_pj", "table2",
    "implied_length", "implied_rho", "model_ops", "mean_model_ops", "kind_of", "printed_eatt_cell",
]

#: E-ATT Table 1: energy (pJ) of one FP32 operation
COSTS_PJ = {"asic": {"add": 0.9, "mul": 3.7}, "fpga": {"add": 0.4, "mul": 18.8}}
KINDS = ("vanilla", "dense", "random", "eatt", "eatt_l1", "eatt_select_dot")
#: attention function name -> kind for the accounting (dot-product functions are "vanilla")
FN_KIND = {"eatt": "eatt", "eatt_l1": "eatt_l1", "eatt_select_dot": "eatt_select_dot",
           "synth_dense": "dense", "synth_random": "random"}
CONVENTIONS = ("paper", "exact")


def kind_of(fn_name: str) -> str:
    """The accounting kind of a registered attention function (``"vanilla"`` for dot-product ones)."""
    return FN_KIND.get(fn_name, "vanilla")


@dataclass
class OpCount:
    """Numbers of additions and multiplications (floats: expected counts under ``rho``)."""

    adds: float = 0.0
    muls: float = 0.0

    def __add__(self, other: "OpCount") -> "OpCount":
        return OpCount(self.adds + other.adds, self.muls + other.muls)


def energy_pj(ops: OpCount, hardware: str) -> float:
    """Energy in pJ of ``ops`` on ``hardware`` (``"asic"`` or ``"fpga"``, Table 1).

    Raises:
        ValueError: unknown hardware (the message lists the valid choices).
    """
    if hardware not in COSTS_PJ:
        raise ValueError(f"unknown hardware {hardware!r}; valid choices: {', '.join(COSTS_PJ)}")
    c = COSTS_PJ[hardware]
    return ops.adds * c["add"] + ops.muls * c["mul"]


def _check(kind, convention, d, h, rho_q, rho_k):
    if kind not in KINDS:
        raise ValueError(f"unknown kind {kind!r}; valid choices: {', '.join(KINDS)}")
    if convention not in CONVENTIONS:
        raise ValueError(f"unknown convention {convention!r}; valid choices: {', '.join(CONVENTIONS)}")
    if d % h:
        raise ValueError(f"d = {d} is not divisible by h = {h}")
    for r in (rho_q, rho_k):
        if kind in ("eatt", "eatt_select_dot") and (r is None or not 0.0 <= r <= 1.0):
            raise ValueError(f"{kind} needs rho_q and rho_k in [0, 1], got {rho_q}, {rho_k}")


def _matmul(rows: float, n_in: int, n_out: int, exact: bool) -> OpCount:
    """``(rows x n_in) @ (n_in x n_out)``: MACs, or exact (``n_in - 1`` adds per output)."""
    return OpCount(rows * n_out * (n_in - 1 if exact else n_in), rows * n_out * n_in)


def _select(rows: float, rho: float, d: int, k: int, exact: bool) -> OpCount:
    """Masked selection (eqs. 9-12): ``rho d`` rows of width ``k`` added per token."""
    m = rho * d
    return OpCount(rows * k * (max(m - 1.0, 0.0) if exact else m), 0.0)


def _pairs(l_q, l_k, d, h, how: str, exact: bool, l1_adds: int) -> OpCount:
    """Scores of all ``l_q x l_k`` pairs over ``h`` heads of ``d_h``: dot products or L1."""
    dh = d // h
    n = l_q * l_k * h
    if how == "dot":
        return OpCount(n * (dh - 1 if exact else dh), n * dh)
    return OpCount(n * ((2 * dh - 1) if exact else l1_adds * dh), 0.0)


def score_ops(kind: str, l_q: float, l_k: float, d: int, h: int, rho_q: Optional[float] = None,
              rho_k: Optional[float] = None, convention: str = "paper", l1_adds_per_element: int = 1,
              qk_width: Optional[int] = None) -> OpCount:
    """Operations that produce the attention scores of one attention module (all heads).

    Args:
        kind: one of :data:`KINDS`.  l_q, l_k: query / key lengths.  d: model size.
        h: heads.  rho_q, rho_k: ratio of ones after binarisation (E-ATT kinds only).
        convention: ``"paper"`` (MAC = 1 add + 1 mul; Table 2) or ``"exact"``.
        l1_adds_per_element: ``c_L1`` of the module docstring (1 = paper).
        qk_width: the width ``k`` of ``W_Q`` / ``W_K`` for the E-ATT kinds (default ``d``, the
            paper's Transformer base).  The official code (NLP2CT/E-Att ``E-ATT.py``:
            ``linear_in_weight`` of ``d x 2 d / h``, ``factor = num_of_heads``) uses ``d / h``:
            each head's L1 distance runs over ``d / h^2`` dimensions.  Vanilla, Dense and
            RandInit keep ``d``.

    Returns:
        :class:`OpCount`.

    Raises:
        ValueError: unknown kind / convention, ``d % h != 0``, a missing/invalid ``rho``, or a
            ``qk_width`` that is not a positive multiple of ``h``.
    """
    _check(kind, convention, d, h, rho_q, rho_k)
    if qk_width is not None and (qk_width <= 0 or qk_width % h):
        raise ValueError(f"qk_width = {qk_width} must be a positive multiple of h = {h}")
    ex = convention == "exact"
    k = qk_width if qk_width is not None and kind.startswith("eatt") else d
    if kind == "random":
        return OpCount()
    if kind == "dense":  # W1 (d x d over all heads), then W2_h (d_h x l_k) per head
        return _matmul(l_q, d, d, ex) + _matmul(l_q * h, d // h, l_k, ex)
    if kind in ("vanilla", "eatt_l1"):
        proj = _matmul(l_q, d, k, ex) + _matmul(l_k, d, k, ex)
    else:
        proj = _select(l_q, rho_q, d, k, ex) + _select(l_k, rho_k, d, k, ex)
    how = "l1" if kind in ("eatt", "eatt_l1") else "dot"
    return proj + _pairs(l_q, l_k, k, h, how, ex, l1_adds_per_element)


def block_ops(kind: str, l_q: float, l_k: float, d: int, h: int, rho_q: Optional[float] = None,
              rho_k: Optional[float] = None, convention: str = "paper", l1_adds_per_element: int = 1,
              qk_width: Optional[int] = None) -> OpCount:
    """:func:`score_ops` plus the value path ``V = Y W_V``, ``A V``, ``O W_O`` (the whole
    attention block but softmax and biases).  Same arguments and errors."""
    ex = convention == "exact"
    s = score_ops(kind, l_q, l_k, d, h, rho_q, rho_k, convention, l1_adds_per_element, qk_width)
    av = OpCount(l_q * h * (d // h) * (l_k - 1 if ex else l_k), l_q * l_k * d)
    return s + _matmul(l_k, d, d, ex) + av + _matmul(l_q, d, d, ex)


def implied_length(dense_ratio: float = 0.5110, d: int = 512) -> float:
    """``l`` at which Dense costs ``dense_ratio`` of vanilla: ``(d + l) / (2 d + l) = r``."""
    return d * (2 * dense_ratio - 1) / (1 - dense_ratio)


def implied_rho(target_ratio: float, l: float, d: int, h: int, hardware: str,
                l1_adds_per_element: int = 1, qk_width: Optional[int] = None) -> float:
    """``rho`` at which E-ATT's score energy is ``target_ratio`` of vanilla's (paper convention;
    may be negative or > 1 when no ``rho`` gives the target; ``qk_width`` as in :func:`score_ops`)."""
    van = energy_pj(score_ops("vanilla", l, l, d, h), hardware)
    base = energy_pj(score_ops("eatt", l, l, d, h, 0.0, 0.0, l1_adds_per_element=l1_adds_per_element,
                               qk_width=qk_width), hardware)
    per_rho = energy_pj(score_ops("eatt", l, l, d, h, 1.0, 1.0, l1_adds_per_element=l1_adds_per_element,
                                  qk_width=qk_width), hardware) - base
    return (target_ratio * van - base) / per_rho


def printed_eatt_cell(l: float, d: int, rho: float, hardware: str) -> float:
    """Energy (% of vanilla's scores) of E-ATT Table 2's E-ATT cell *read as printed* in our copy.

    The cell is garbled; as printed it reads ``1/2 l d rho + l^2 d`` additions and no
    multiplication (against vanilla's ``2 l d^2 + l^2 d`` MACs, Table 2's first row), priced with
    Table 1's costs.  It is not our count (:func:`score_ops` ``"eatt"``): it is printed so that a
    reader can see what the paper's 0.44 % is consistent with.  Linear in ``rho``; at ``d = 512``,
    ``l = 23.03`` it is 0.430 % (``rho = 0``) to 0.440 % (``rho = 1``) on ASIC.

    Args:
        l: self-attention length (tokens).  d: model size.  rho: ratio of ones, in [0, 1].
        hardware: ``"asic"`` or ``"fpga"`` (Table 1).

    Returns:
        The ratio in percent.

    Raises:
        ValueError: ``rho`` outside [0, 1] or an unknown hardware (the message lists the choices).
    """
    if not 0.0 <= rho <= 1.0:
        raise ValueError(f"rho must be in [0, 1], got {rho}")
    cell = OpCount(0.5 * l * d * rho + l * l * d, 0.0)
    van = score_ops("vanilla", l, l, d, 1)  # 2 l d^2 + l^2 d MACs (one head: the same count for any h)
    return 100.0 * energy_pj(cell, hardware) / energy_pj(van, hardware)


def table2(l: float, d: int, h: int, rho: float, hardware: str = "asic", part: str = "scores",
           convention: str = "paper", l1_adds_per_element: int = 1, qk_width: Optional[int] = None) -> List[Dict]:
    """The rows of the paper's Table 2 for self-attention of length ``l``.

    Returns:
        ``[{"model", "adds", "muls", "energy_pj", "ratio_pct"}]`` for Vanilla, Dense,
        RandInit and E-ATT; ``ratio_pct`` is energy relative to Vanilla (%); ``qk_width`` as in
        :func:`score_ops` (E-ATT's row only).

    Raises:
        ValueError: bad ``part`` / hardware / convention (messages list the choices).
    """
    if part not in ("scores", "block"):
        raise ValueError(f"unknown part {part!r}; valid choices: scores, block")
    fn = score_ops if part == "scores" else block_ops
    rows = []
    for label, kind in (("Vanilla", "vanilla"), ("Dense", "dense"), ("RandInit", "random"), ("E-ATT", "eatt")):
        ops = fn(kind, l, l, d, h, rho, rho, convention, l1_adds_per_element, qk_width)
        rows.append({"model": label, "adds": ops.adds, "muls": ops.muls, "energy_pj": energy_pj(ops, hardware)})
    van = rows[0]["energy_pj"]
    for r in rows:
        r["ratio_pct"] = 100.0 * r["energy_pj"] / van
    return rows


def model_ops(fns: Mapping[str, str], layers: Mapping[str, int], l_src: float, l_tgt: float, d: int, h: int,
              rho: Optional[Mapping[Tuple[str, int, str], float]] = None, part: str = "scores",
              convention: str = "paper", l1_adds_per_element: int = 1,
              qk_width: Optional[int] = None) -> Dict[Tuple[str, int], OpCount]:
    """Operations of every attention module of an encoder-decoder model.

    Args:
        fns: attention type (``"encoder"``, ``"decoder"``, ``"cross"``) -> function name.
        layers: ``{"encoder": n_enc, "decoder": n_dec}``.
        l_src, l_tgt: source / target lengths in tokens (one sentence's, or the mean lengths:
            the paper's one-length form; the mean over sentences of the counts is
            :func:`mean_model_ops`, which differs because the counts hold ``l_q l_k`` terms).
        rho: ``(type, layer, role) -> rho`` with role ``"query"`` / ``"key"``; needed for
            E-ATT kinds.
        part: ``"scores"`` or ``"block"``.
        qk_width: the model's ``--eatt-qk-dim`` (None or 0: ``d``), the width of ``W_Q`` /
            ``W_K`` of its binarised E-ATT modules (``eatt``, ``eatt_select_dot``: the functions
            that have the option); other modules keep ``d``.

    Returns:
        ``{(type, layer): OpCount}``.

    Raises:
        ValueError: as :func:`score_ops`, or a missing ``rho`` entry (named).
    """
    fn = score_ops if part == "scores" else block_ops
    out = {}
    for typ, n, lq, lk in (("encoder", layers["encoder"], l_src, l_src), ("decoder", layers["decoder"], l_tgt, l_tgt),
                           ("cross", layers["decoder"], l_tgt, l_src)):
        kind = kind_of(fns[typ])
        for i in range(n):
            rq = rk = width = None
            if kind in ("eatt", "eatt_select_dot"):
                width = qk_width or None
                try:
                    rq, rk = rho[(typ, i, "query")], rho[(typ, i, "key")]
                except (KeyError, TypeError) as err:
                    raise ValueError(f"missing rho for {typ} layer {i} ({fns[typ]})") from err
            out[(typ, i)] = fn(kind, lq, lk, d, h, rq, rk, convention, l1_adds_per_element, width)
    return out


def mean_model_ops(fns: Mapping[str, str], layers: Mapping[str, int], lengths: Iterable[Tuple[int, int]], d: int,
                   h: int, rho: Optional[Mapping[Tuple[str, int, str], float]] = None, part: str = "scores",
                   convention: str = "paper", l1_adds_per_element: int = 1,
                   qk_width: Optional[int] = None) -> Dict[Tuple[str, int], OpCount]:
    """Mean over sentences of the per-sentence operations of every attention module.

    The counts hold ``l_q l_k`` terms (and ``l^2`` in self-attention), so the mean over sentences
    is *not* :func:`model_ops` at the mean lengths: ``E[l^2] = E[l]^2 + Var[l]`` (on Multi30k's
    validation set the score energy differs by 0.6-5.5 %: results/eatt/figure1_dimension.md).  Energy is linear in the counts, so
    ``energy_pj(total(mean_model_ops(...)), hw)`` is the mean per-sentence energy.

    Args:
        lengths: ``(l_src, l_tgt)`` of each sentence, in tokens (e.g. fairseq's ``src_sizes`` /
            ``tgt_sizes``, end-of-sentence included).
        fns, layers, d, h, rho, part, convention, l1_adds_per_element, qk_width: as in
            :func:`model_ops` (``rho`` is one value per layer/type/role, shared by all sentences).

    Returns:
        ``{(type, layer): OpCount}``, each the mean over the sentences (floats).

    Raises:
        ValueError: no sentence, or as :func:`model_ops`.
    """
    from collections import Counter

    counts = Counter((int(ls), int(lt)) for ls, lt in lengths)  # distinct length pairs: few
    n = sum(counts.values())
    if not n:
        raise ValueError("mean_model_ops needs at least one sentence")
    acc: Dict[Tuple[str, int], OpCount] = {}
    for (ls, lt), c in counts.items():
        for key, o in model_ops(fns, layers, ls, lt, d, h, rho, part, convention, l1_adds_per_element,
                                qk_width).items():
            a = acc.get(key, OpCount())
            acc[key] = OpCount(a.adds + c * o.adds, a.muls + c * o.muls)
    return {key: OpCount(o.adds / n, o.muls / n) for key, o in acc.items()}


def total(ops: Iterable[OpCount]) -> OpCount:
    """Sum of :class:`OpCount` objects."""
    acc = OpCount()
    for o in ops:
        acc = acc + o
    return acc


def fmt_count(x: float) -> str:
    """Human-readable operation count (``1.23M``)."""
    for unit, s in ((1e9, "G"), (1e6, "M"), (1e3, "K")):
        if abs(x) >= unit:
            return f"{x / unit:.2f}{s}"
    return f"{x:.0f}" if math.isfinite(x) else str(x)


def _attention_modules(model):
    """``(type, layer, FunctionalMultiheadAttention)`` of an encoder-decoder model."""
    for i, layer in enumerate(model.encoder.layers):
        yield "encoder", i, layer.self_attn
    for i, layer in enumerate(model.decoder.layers):
        yield "decoder", i, layer.self_attn
        if getattr(layer, "encoder_attn", None) is not None:
            yield "cross", i, layer.encoder_attn


def measure_rho(model, samples: Iterable[dict]) -> Dict[Tuple[str, int, str], float]:
    """Ratio of ones after binarisation per attention type, layer and role (paper Figure 2),
    over teacher-forced forward passes of ``samples`` (fairseq samples with ``net_input``).

    Feed samples *without padding* (batch size 1): padding tokens would be counted.

    Returns:
        ``{(type, layer, role): rho}`` for every binarising attention function
        (role ``"query"`` / ``"key"``; equal in self-attention, where both are the same input).
    """
    import torch

    mods = [(t, i, m.attn_fn) for t, i, m in _attention_modules(model)
            if getattr(getattr(m, "attn_fn", None), "is_binarized", False)]  # stock MHA has no attn_fn
    for _, _, fn in mods:
        fn.rho_meter = {}
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            for s in samples:
                model(**s["net_input"])
        out = {}
        for t, i, fn in mods:
            for role, (ones, n) in fn.rho_meter.items():
                out[(t, i, role)] = ones / n if n else float("nan")
        return out
    finally:
        for _, _, fn in mods:
            fn.rho_meter = None
        model.train(was_training)
