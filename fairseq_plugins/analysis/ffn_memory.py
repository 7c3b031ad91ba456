"""The FFN as a key-value memory: how its slots are used (ReLUFormer Section 3.4, Figures 2 and 3).

Shape legend: T length, B batch, C model dim, F = d_ff FFN slots (memory size ``d_h``).

ReLUFormer (Shen et al. 2023) reads ``FFN(X) = act(X K^T) V`` as a memory of ``F`` key-value
slots (eq. 2; :mod:`fairseq_plugins.modules.ffn`) and explains Table 1 and Figure 1 by how the
activation spreads a token over the slots:

* **Top-p % score sum** (Figure 2): "For each distribution, we sort scores in descending order and
  calculate the summation of the top-p % elements. We normalize ReLU scores to make sure the
  summation of all scores is 1 as ReLU(x_i k_j^T) / sum_p ReLU(x_i k_p^T)" -- "Softmax provides a
  highly centralized distribution as top 0.2% elements occupy more than 85% scores".  The scores
  are the FFN's hidden activations ``act(X W_1)`` ``(T, B, F)``, the input of ``fc2``.
* **Anisotropy** ANI of the value slots (eq. 4, Figure 3): the mean pair-wise cosine similarity of
  the ``F`` rows of ``V`` (columns of ``fc2.weight``); lower = more diverse slots.

Both are per layer and averaged over the layers (as :mod:`.ffn_variance` averages the variance
ratio), so they can be columns of a table spec's ``analyses`` (``configs/reluformer/
figure1_ffn_size.yaml``) next to Table 1's variance ratio.
"""

import math
from typing import Dict, Iterable, List, Sequence

import torch
import torch.nn as nn

from .ffn_variance import ffn_layers, forward_batches
from .loading import run_checkpoint_analysis
from .metrics import ffn_anisotropy, top_p_terms

__all__ = ["DEFAULT_TOP_P", "ffn_top_p_score_sums", "ffn_anisotropies", "main_top_p", "main_anisotropy"]

#: top-p percentages reported by default: the paper's 0.2 % and a few wider ones.
DEFAULT_TOP_P = (0.2, 1.0, 5.0, 10.0)


def _key(p: float) -> str:
    """``"top_0.2"``, ``"top_1"``: the result key of percentage ``p``."""
    return f"top_{p:g}"


def _check_activation(layer: nn.Module, where: str) -> None:
    """Refuse an FFN whose scores are not non-negative (ReLU or softmax over the slots)."""
    from ..modules.ffn import FFN_ACTIVATIONS

    fn = getattr(layer, "activation_fn", None)
    if fn not in FFN_ACTIVATIONS.values():
        name = getattr(fn, "__name__", repr(fn))
        raise ValueError(f"the top-p score sum needs non-negative FFN scores; {where} uses the activation {name}, "
                         f"valid: {', '.join(sorted(FFN_ACTIVATIONS))} (--ffn-activation, or fairseq's "
                         "--activation-fn relu)")


@torch.no_grad()
def ffn_top_p_score_sums(model: nn.Module, batches: Iterable[dict], pad: int,
                         ps: Sequence[float] = DEFAULT_TOP_P) -> Dict[str, List]:
    """Mean top-p % score sum of every FFN's slot distribution (ReLUFormer Figure 2).

    For each non-padding token the FFN scores ``s = act(x W_1)`` ``(F,)`` are renormalised to
    ``s / sum(s)`` (a no-op for softmax), sorted in descending order, and the largest
    ``k = ceil(p/100 * F)`` (at least 1) are summed (:func:`.metrics.top_p_terms`); a token whose
    scores are all 0 (possible with ReLU) has no distribution and is left out (counted in
    ``dead``).  Higher = more centralized.

    Args:
        model: a fairseq encoder-decoder Transformer whose FFN activation is ReLU or softmax over
            the slots (``activation_fn``; see :data:`fairseq_plugins.modules.ffn.FFN_ACTIVATIONS`).
        batches: fairseq samples (``net_input`` with ``src_tokens`` ``(B, S)`` and
            ``prev_output_tokens`` ``(B, T)``).
        pad: padding index (its positions are excluded).
        ps: percentages in ``(0, 100]``.

    Returns:
        ``{"ps": [p...], "d_ff": {"encoder": [F per layer], "decoder": [...]},
        "encoder": [[sum per p] per layer], "decoder": [...], "dead": {"encoder": [fraction of
        tokens with all-zero scores per layer], "decoder": [...]}, "top_<p>": [mean over layers]
        for each p}``.

    Raises:
        ValueError: a ``p`` outside ``(0, 100]``, or an FFN activation that can be negative
            (e.g. GELU), whose scores are no distribution.
        fairseq_plugins.checkpoint.UnsupportedCheckpointError: not an encoder-decoder Transformer.
    """
    from .capture import check_transformer

    ps = [float(p) for p in ps]
    for p in ps:
        if not 0 < p <= 100:
            raise ValueError(f"top-p percentages must be in (0, 100], got {p}")
    check_transformer(model, "ffn_top_p_score_sums")
    layers = ffn_layers(model)
    for kind, i, layer in layers:
        _check_activation(layer, f"{kind} layer {i}")
    sums = {(kind, i): [torch.zeros(len(ps), dtype=torch.float64), 0.0, 0.0] for kind, i, _ in layers}
    current, handles = {}, []
    for kind, i, layer in layers:
        def pre(mod, inp, key=(kind, i)):
            s = inp[0]  # (T, B, F): act(x W_1) after the activation dropout (identity in eval mode)
            mask = current["mask_" + key[0]]  # (T, B): True = token
            w = s.float().permute(1, 0, 2).unsqueeze(1)  # (B, 1, T, F): one "head", T rows over F slots
            pad_rows = (~mask).t()[:, None, :, None]  # (B, 1, T, 1): padding rows have no valid slot
            num, live = top_p_terms(w, pad_rows, ps)  # (P, 1), (1,)
            acc = sums[key]
            acc[0] += num[:, 0]
            acc[1] += float(live[0])
            acc[2] += float(mask.sum())

        handles.append(layer.fc2.register_forward_pre_hook(pre))
    forward_batches(model, batches, pad, current, handles)
    out = {"ps": ps, "d_ff": {"encoder": [], "decoder": []}, "encoder": [], "decoder": [],
           "dead": {"encoder": [], "decoder": []}}
    for kind, i, layer in layers:
        num, live, tokens = sums[(kind, i)]
        out[kind].append([float(v) / live if live else float("nan") for v in num])
        out["dead"][kind].append(1.0 - live / tokens if tokens else float("nan"))
        out["d_ff"][kind].append(int(layer.fc2.weight.size(1)))
    per_layer = out["encoder"] + out["decoder"]
    for j, p in enumerate(ps):
        vals = [row[j] for row in per_layer if not math.isnan(row[j])]
        out[_key(p)] = [sum(vals) / len(vals) if vals else float("nan")]
    return out


def ffn_anisotropies(model: nn.Module) -> Dict[str, List[float]]:
    """ANI (ReLUFormer eq. 4, Figure 3) of every FFN's ``F`` value slots, per layer and mean.

    Returns:
        ``{"encoder": [ANI per layer], "decoder": [...], "mean": [mean over layers]}``
        (:func:`.metrics.ffn_anisotropy`: slot ``i`` = column ``i`` of ``fc2.weight`` ``(C, F)``).

    Raises:
        fairseq_plugins.checkpoint.UnsupportedCheckpointError: not an encoder-decoder Transformer.
    """
    from .capture import check_transformer

    check_transformer(model, "ffn_anisotropies")
    out = ffn_anisotropy(model)
    allv = out["encoder"] + out["decoder"]
    out["mean"] = [sum(allv) / len(allv)] if allv else [float("nan")]
    return out


def _percentages(text: str) -> List[float]:
    import argparse

    try:
        ps = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--top-p takes comma-separated percentages in (0, 100], got {text!r}")
    if not ps or not all(0 < p <= 100 for p in ps):
        raise argparse.ArgumentTypeError(f"--top-p takes comma-separated percentages in (0, 100], got {text!r}")
    return ps


def main_top_p(argv=None):
    """``fairseq-attention-ffn-top-p --checkpoint CK --data-bin BIN --src de --tgt en [--subset valid]
    [--top-p 0.2,1,5,10] [--json OUT]``: :func:`ffn_top_p_score_sums` on a split, printed and
    written to ``--json`` atomically (``top_0.2`` etc.: the mean over layers)."""
    run_checkpoint_analysis(
        argv, "fairseq-attention-ffn-top-p",
        "Top-p % score sum of the FFN slot distributions of a trained checkpoint (ReLUFormer Figure 2).",
        lambda a, model, task, itr: ffn_top_p_score_sums(model, itr, task.target_dictionary.pad(), a.top_p),
        lambda p: p.add_argument("--top-p", type=_percentages, default=list(DEFAULT_TOP_P),
                                 help="comma-separated percentages in (0, 100] (default: 0.2,1,5,10)"))


def main_anisotropy(argv=None):
    """``fairseq-attention-ffn-anisotropy --checkpoint CK --data-bin BIN --src de --tgt en [--json OUT]``:
    :func:`ffn_anisotropies` of the checkpoint's FFN value slots (weights only; the data arguments
    are the analyses' common contract and load the vocabulary)."""
    run_checkpoint_analysis(
        argv, "fairseq-attention-ffn-anisotropy",
        "Anisotropy (ANI) of the FFN value slots of a trained checkpoint (ReLUFormer eq. 4, Figure 3).",
        lambda a, model, task, itr: ffn_anisotropies(model))


if __name__ == "__main__":  # python -m fairseq_plugins.analysis.ffn_memory: the top-p measurement
    main_top_p()
