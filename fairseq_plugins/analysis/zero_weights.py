"""Fraction of attention weights that are exactly zero (ReLA sparsity rate; ReLUFormer Section 4.2).

Shape legend: B batch, H heads, T queries, S keys.

ReLUFormer (Shen et al. 2023), Section 4.2, on ReLU attention with the eq. 6 scale factor but
without the eq. 7 regulariser: "The distribution learned with ReLU has a very small entropy, and
94% weights are all zeros."  ReLA (Zhang et al. 2021) calls the same quantity, per layer, the
sparsity rate (Section 5.2, Figure 3; :func:`.metrics.sparsity_terms`).  Here it is counted over
every valid (query, key) position -- query and key padding, future positions of decoder
self-attention excluded -- of every attention module on a split, pooled (``mean``) and per
attention type and layer, so it can be a column of a table spec's ``analyses``.
"""

from typing import Dict, Iterable, List

import torch
import torch.nn as nn

from .capture import ATTENTION_KINDS, AttentionCapture
from .metrics import sparsity_terms

__all__ = ["zero_weight_rates", "main"]


@torch.no_grad()
def zero_weight_rates(model: nn.Module, batches: Iterable[dict], pad: int) -> Dict[str, List[float]]:
    """Fraction of exactly-zero attention weights among the valid positions.

    Args:
        model: an encoder-decoder Transformer of :class:`FunctionalMultiheadAttention` modules
            (:func:`.capture.load_model_for_analysis` rebuilds stock checkpoints).
        batches: fairseq samples (teacher-forced, :meth:`AttentionCapture.run`).
        pad: padding index.

    Returns:
        ``{"encoder": [rate per layer], "decoder": [...], "cross": [...], "per_kind":
        {"encoder": pooled rate, ...}, "mean": [pooled over every module]}`` -- each rate = zeros
        / valid positions over heads, queries and keys (a softmax model gives 0, a null row of
        ReLU attention counts all its keys).

    Raises:
        fairseq_plugins.checkpoint.UnsupportedCheckpointError: not an encoder-decoder Transformer.
        ValueError: an attention module that is not a ``FunctionalMultiheadAttention``.
    """
    sums: Dict[tuple, List[float]] = {}
    with AttentionCapture(model, pad) as cap:
        for sample in batches:
            for key, rec in cap.run(sample).items():
                zeros, valid = sparsity_terms(rec.weights, rec.mask)  # (H,), (H,)
                acc = sums.setdefault(key, [0.0, 0.0])
                acc[0] += float(zeros.sum())
                acc[1] += float(valid.sum())
    out: Dict[str, object] = {kind: [] for kind in ATTENTION_KINDS}
    per_kind = {kind: [0.0, 0.0] for kind in ATTENTION_KINDS}
    for (kind, layer), (z, n) in sorted(sums.items()):
        out[kind].append(z / n if n else float("nan"))
        per_kind[kind][0] += z
        per_kind[kind][1] += n
    out["per_kind"] = {k: (z / n if n else float("nan")) for k, (z, n) in per_kind.items()}
    z_all, n_all = sum(z for z, _ in sums.values()), sum(n for _, n in sums.values())
    out["mean"] = [z_all / n_all if n_all else float("nan")]
    return out


def main(argv=None):
    """``fairseq-attention-zero-rate --checkpoint CK --data-bin BIN --src de --tgt en [--subset valid]
    [--json OUT]``: :func:`zero_weight_rates` on a split, printed and written to ``--json``
    atomically (``mean``: pooled over every attention module)."""
    from .loading import run_checkpoint_analysis

    run_checkpoint_analysis(argv, "fairseq-attention-zero-rate",
                            "Fraction of exactly-zero attention weights of a trained checkpoint (ReLA sparsity rate; "
                            "ReLUFormer Section 4.2).",
                            lambda a, model, task, itr: zero_weight_rates(model, itr, task.target_dictionary.pad()))


if __name__ == "__main__":
    main()
