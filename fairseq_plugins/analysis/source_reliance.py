"""Source reliance: teacher-forced NLL with the true sources vs with shuffled sources.

A model that translates conditions its target distribution on the source; a model that only
learned a target-side language model (an undertrained or attention-broken NMT model) does not.
The difference

    delta_NLL = NLL(y | x_perm) - NLL(y | x)        (nats per target token)

where ``x_perm`` gives every sentence another sentence's source (a derangement inside each batch,
so lengths stay similar: fairseq batches sentences of similar length), separates the two: it is
about 0 for a language model and grows as the model uses the source.  It is the check behind the
Flexible-attention RNN budget (configs/multi30k/rnnsearch_small_cpu.yaml): a budget whose models
reach a reasonable validation loss but have delta_NLL near 0 trains a language model, not a
translation model.  It is not one of the papers' metrics; it diagnoses low BLEU.

The NLL is the plain cross-entropy of the reference tokens (no label smoothing), the quantity
fairseq's ``label_smoothed_cross_entropy`` logs as ``nll_loss`` -- but in nats, not bits.
"""

import math

import torch

__all__ = ["derangement", "source_reliance", "main"]


def derangement(n: int, generator: torch.Generator = None) -> torch.Tensor:
    """A random permutation of ``range(n)`` without fixed points (a random cyclic shift of a
    random order: ``perm[order[i]] = order[(i + 1) % n]``).

    Args:
        n: number of items, ``n >= 2``.
        generator: torch RNG (default: the global one).

    Returns:
        ``(n,)`` long tensor ``perm`` with ``perm[i] != i`` for every ``i``.

    Raises:
        ValueError: ``n < 2`` (one item cannot be given another's source).
    """
    if n < 2:
        raise ValueError(f"a derangement needs at least 2 items (got {n})")
    order = torch.randperm(n, generator=generator)
    perm = torch.empty(n, dtype=torch.long)
    perm[order] = order.roll(-1)
    return perm


def _nll_sum(model, net_input, target, pad):
    """Summed NLL (nats) of the non-pad ``target`` tokens ``(B, T)`` and their count."""
    out = model(**net_input)
    lprobs = model.get_normalized_probs(out, log_probs=True)  # (B, T, V)
    mask = target.ne(pad)
    tok = lprobs.gather(-1, target.unsqueeze(-1)).squeeze(-1)
    return -(tok * mask).sum().item(), int(mask.sum().item())


def source_reliance(model, batches, pad: int, seed: int = 0) -> dict:
    """Teacher-forced NLL of the references with true and with shuffled sources.

    Args:
        model: a fairseq encoder-decoder model (put in eval mode here; no gradients).
        batches: iterable of fairseq translation samples (``net_input`` with ``src_tokens``
            ``(B, S)``, ``src_lengths`` ``(B,)``, ``prev_output_tokens`` ``(B, T)``; ``target``
            ``(B, T)``).  Batches with a single sentence are skipped (nothing to swap with).
        pad: padding index of the target dictionary.
        seed: seed of the derangements (the result is deterministic given the batches).

    Returns:
        ``{"nll_true": [x], "nll_shuffled": [y], "delta_nll": [y - x], "ppl_true": [e^x],
        "ppl_shuffled": [e^y], "n_tokens": N, "n_sentences": S, "skipped_sentences": K,
        "seed": seed}`` -- NLLs in nats per target token over the same ``N`` tokens (lists of
        one value, the form ``scripts/run_table.py`` analyses read).

    Raises:
        ValueError: no batch with at least two sentences.
    """
    g = torch.Generator().manual_seed(seed)
    model.eval()
    true_sum = shuf_sum = 0.0
    n_tok = n_sent = skipped = 0
    with torch.no_grad():
        for sample in batches:
            ni = sample["net_input"]
            b = ni["src_tokens"].size(0)
            if b < 2:
                skipped += b
                continue
            s_true, n = _nll_sum(model, ni, sample["target"], pad)
            perm = derangement(b, g)
            shuffled = dict(ni, src_tokens=ni["src_tokens"][perm], src_lengths=ni["src_lengths"][perm])
            s_shuf, _ = _nll_sum(model, shuffled, sample["target"], pad)
            true_sum += s_true
            shuf_sum += s_shuf
            n_tok += n
            n_sent += b
    if n_tok == 0:
        raise ValueError("source_reliance needs at least one batch of two or more sentences")
    x, y = true_sum / n_tok, shuf_sum / n_tok
    return {"nll_true": [x], "nll_shuffled": [y], "delta_nll": [y - x], "ppl_true": [math.exp(x)],
            "ppl_shuffled": [math.exp(y)], "n_tokens": n_tok, "n_sentences": n_sent,
            "skipped_sentences": skipped, "seed": seed}


def main(argv=None):
    """``fairseq-attention-source-reliance --checkpoint CK --data-bin BIN --src en --tgt de
    [--subset valid] [--seed 0] [--json OUT] [--user-dir DIR]``: prints ``{"nll_true": [x], "nll_shuffled": [y],
    "delta_nll": [y - x], ...}`` of :func:`source_reliance` (nats/token; ``delta_nll`` near 0
    means the model ignores its source) and writes it to ``--json`` atomically."""
    from ..checkpoint import CheckpointError
    from ..user_dir import import_user_dir
    from .loading import analysis_parser, checkpoint_batches, emit_result

    p = analysis_parser("Source reliance of a trained checkpoint: NLL with true vs shuffled sources "
                        "(nats/token).", prog="fairseq-attention-source-reliance")
    p.add_argument("--seed", type=int, default=0, help="seed of the source shuffles")
    a = p.parse_args(argv)
    try:
        import_user_dir(a.user_dir)
        model, task, itr = checkpoint_batches(a.checkpoint, a.data_bin, a.src, a.tgt, a.subset, a.max_tokens,
                                              transformer_only=False)
    except (FileNotFoundError, CheckpointError) as e:  # names the file: empty, cut short, unsafe, wrong model
        p.error(str(e))
    res = source_reliance(model, itr, task.target_dictionary.pad(), seed=a.seed)
    emit_result(res, a.checkpoint, a.subset, a.json, prog="fairseq-attention-source-reliance", argv=argv)


if __name__ == "__main__":
    main()
