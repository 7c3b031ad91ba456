"""Variance ratio of the FFN output to its residual (ReLUFormer Section 3.2, Table 1).

Shape legend: T length, B batch, C model dim.

For every Transformer layer's FFN block ``x -> x + FFN(x)`` the ratio is
``Var(FFN(x)) / Var(x)``: the variance of the FFN output over the ``C`` features of a token
divided by that of the residual ``x`` it is added to, averaged over the non-padding tokens.
A small ratio means the residual dominates the layer output (the paper: ReLU 0.27, softmax
0.01, softmax + LayerNorm 0.34 on IWSLT14).  The paper does not define the variance more
precisely; this per-token definition is ours.
"""

from typing import Dict, Iterable, List

import torch
import torch.nn as nn

__all__ = ["ffn_layers", "forward_batches", "ffn_variance_ratios", "main"]


def ffn_layers(model: nn.Module):
    """``[(kind, index, layer)]``: every encoder then decoder layer of a fairseq Transformer
    (``kind`` "encoder" / "decoder"), each with its FFN ``fc1`` / ``activation_fn`` / ``fc2``."""
    enc = list(getattr(model.encoder, "layers", []))
    dec = list(getattr(model.decoder, "layers", []))
    return [("encoder", i, l) for i, l in enumerate(enc)] + [("decoder", i, l) for i, l in enumerate(dec)]


@torch.no_grad()
def forward_batches(model: nn.Module, batches: Iterable[dict], pad: int, current: dict, handles: list) -> None:
    """Teacher-forced forward of every batch in eval mode for FFN hooks: before each batch,
    ``current["mask_encoder"]`` / ``current["mask_decoder"]`` are set to the token masks ``(T, B)``
    (True = token) of the source and the decoder input; afterwards every hook in ``handles`` is
    removed and the model's training mode restored (also on an error)."""
    was_training = model.training
    model.eval()
    try:
        for sample in batches:
            net = sample["net_input"]
            current["mask_encoder"] = net["src_tokens"].ne(pad).t()
            current["mask_decoder"] = net["prev_output_tokens"].ne(pad).t()
            model(**net)
    finally:
        for h in handles:
            h.remove()
        model.train(was_training)


@torch.no_grad()
def ffn_variance_ratios(model: nn.Module, batches: Iterable[dict], pad: int) -> Dict[str, List[float]]:
    """Mean ``Var(FFN(x)) / Var(x)`` per layer over the tokens of ``batches``.

    Args:
        model: a fairseq encoder-decoder Transformer with post-norm layers (``fc1``/``fc2``).
        batches: fairseq samples (``net_input`` with ``src_tokens`` ``(B, S)`` and
            ``prev_output_tokens`` ``(B, T)``).
        pad: padding index (its positions are excluded).

    Returns:
        ``{"encoder": [ratio per layer], "decoder": [...], "mean": [overall mean]}``.

    Raises:
        ValueError: a pre-norm model (``normalize_before``), whose FFN input is not the residual.
        fairseq_plugins.checkpoint.UnsupportedCheckpointError: not an encoder-decoder
            Transformer (e.g. ``rnnsearch``: no FFN layers, which gave ``{"mean": [NaN]}``).
    """
    from .capture import check_transformer

    check_transformer(model, "ffn_variance_ratios")
    layers = ffn_layers(model)
    if any(getattr(l, "normalize_before", False) for _, _, l in layers):
        raise ValueError("ffn_variance_ratios supports post-norm layers only (normalize_before=False)")
    sums = {(kind, i): [0.0, 0] for kind, i, _ in layers}
    current = {}
    handles = []
    for kind, i, layer in layers:
        def pre(mod, inp, key=(kind, i)):
            current[key] = inp[0]  # (T, B, C): the residual in a post-norm layer

        def post(mod, inp, out, key=(kind, i)):
            x, mask = current[key], current["mask_" + key[0]]  # mask (T, B): True = token
            r = out.float().var(dim=-1, unbiased=False) / x.float().var(dim=-1, unbiased=False).clamp_min(1e-12)
            sums[key][0] += float(r[mask].sum())
            sums[key][1] += int(mask.sum())

        handles += [layer.fc1.register_forward_pre_hook(pre), layer.fc2.register_forward_hook(post)]
    forward_batches(model, batches, pad, current, handles)
    out = {"encoder": [], "decoder": []}
    for kind, i, _ in layers:
        s, n = sums[(kind, i)]
        out[kind].append(s / n if n else float("nan"))
    allv = out["encoder"] + out["decoder"]
    out["mean"] = [sum(allv) / len(allv)] if allv else [float("nan")]
    return out


def main(argv=None):
    """``fairseq-attention-ffn-variance --checkpoint CK --data-bin BIN --src de --tgt en [--subset
    valid] [--json OUT]``: prints ``{"encoder": [...], "decoder": [...], "mean": [m]}`` of
    :func:`ffn_variance_ratios` on a split and writes it to ``--json`` atomically."""
    from .loading import run_checkpoint_analysis

    run_checkpoint_analysis(argv, "fairseq-attention-ffn-variance",
                            "Variance ratio Var(FFN output) / Var(residual) of a trained checkpoint (ReLUFormer Table 1).",
                            lambda a, model, task, itr: ffn_variance_ratios(model, itr, task.target_dictionary.pad()))


if __name__ == "__main__":
    main()
