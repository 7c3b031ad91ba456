"""Capture of per-layer, per-head attention weights from a trained model, one batch at a time.

Shape legend: B batch, H heads, T query length, S key length; ``src_tokens`` ``(B, S)``,
``prev_output_tokens`` ``(B, T)``.  Attention types: ``encoder`` (encoder self-attention,
T = S = source length), ``decoder`` (decoder self-attention, causal, T = S = target length),
``cross`` (encoder-decoder attention, T = target, S = source length).

The seam is the ``capture`` slot of
:class:`~fairseq_plugins.attention.functions.AttentionFunction`: while
:class:`AttentionCapture` is active every attention function of the model hands its weights
``(B, H, T, S)`` and mask to it (the fused kernels are skipped for that forward only);
outside the ``with`` block the slots are ``None`` and nothing costs anything.  Word-level
records (:func:`word_level_records`, ReLA Section 5.2) are made from captured ones afterwards,
sentence by sentence in Python; the attention functions themselves are not touched.  Stock fairseq
``transformer`` checkpoints (plain ``MultiheadAttention``, whose fast path never returns
per-head weights) are rebuilt as our ``attention_transformer`` with softmax everywhere, which
is numerically the stock model (tests/test_models.py) and loads its state dict unchanged.

Checkpoints are read by :func:`fairseq_plugins.checkpoint.load_checkpoint` (allow-listed
unpickler).  Weights are streamed per batch (:func:`iter_batches`): memory is one batch's
weights, whatever the size of the dataset.
"""

import argparse
from dataclasses import dataclass
from typing import Dict, Iterator, List, Optional, Sequence, Tuple

import torch
import torch.nn as nn

from ..attention import FunctionalMultiheadAttention
from ..options import check_choice
from .alignment import merge_subwords

__all__ = [
    "ATTENTION_KINDS",
    "AttentionCapture",
    "CapturedAttention",
    "attention_modules",
    "check_transformer",
    "load_model_for_analysis",
    "iter_batches",
    "pairs_dataset",
    "hypothesis_batches",
    "ATTENTION_LEVELS",
    "BPE_MARKER",
    "check_attention_level",
    "check_bpe_symbols",
    "bpe_word_ids",
    "word_level_records",
]

#: the three attention types, in the order tables and figures show them
ATTENTION_KINDS = ("encoder", "decoder", "cross")


@dataclass
class CapturedAttention:
    """Weights of one attention module on one batch.

    Attributes:
        weights: ``(B, H, T, S)`` float32, as produced by the attention function (pre-dropout).
        mask: bool ``(B, 1, T, S)``, True where the (query, key) pair is not valid: blocked key
            (padding, future position) or padded query.
        is_distribution: the function's weights are distributions over keys (softmax,
            sparsemax, entmax) -- False for the ReLU family.
    """

    weights: torch.Tensor
    mask: torch.Tensor
    is_distribution: bool


def attention_modules(model: nn.Module) -> List[Tuple[str, int, nn.Module]]:
    """``[(kind, layer, module)]`` of a fairseq encoder-decoder Transformer, in
    :data:`ATTENTION_KINDS` order, layers from 0."""
    out = []
    for i, layer in enumerate(getattr(model.encoder, "layers", [])):
        out.append(("encoder", i, layer.self_attn))
    dec = list(getattr(model.decoder, "layers", []))
    for i, layer in enumerate(dec):
        out.append(("decoder", i, layer.self_attn))
    for i, layer in enumerate(dec):
        if getattr(layer, "encoder_attn", None) is not None:
            out.append(("cross", i, layer.encoder_attn))
    return out


class AttentionCapture:
    """Context manager that fills the ``capture`` slot of every attention function of ``model``.

    Usage::

        with AttentionCapture(model) as cap:
            for sample in batches:
                records = cap.run(sample)   # {(kind, layer): CapturedAttention}

    Args:
        model: a model whose attention modules are all :class:`FunctionalMultiheadAttention`
            (use :func:`load_model_for_analysis` for stock checkpoints).
        pad: padding index (padded queries are marked in the masks).
        kinds: attention types to capture (default all three).

    Raises:
        ValueError: a module is not a ``FunctionalMultiheadAttention``, or an unknown kind.
        fairseq_plugins.checkpoint.UnsupportedCheckpointError: ``model`` is not an
            encoder-decoder Transformer (:func:`check_transformer`).
    """

    def __init__(self, model: nn.Module, pad: int, kinds: Sequence[str] = ATTENTION_KINDS):
        bad = [k for k in kinds if k not in ATTENTION_KINDS]
        if bad:
            raise ValueError(f"unknown attention kind(s) {bad}; valid choices: {', '.join(ATTENTION_KINDS)}")
        check_transformer(model, "attention capture")
        self.model, self.pad, self.kinds = model, pad, tuple(kinds)
        self.modules = [(k, i, m) for k, i, m in attention_modules(model) if k in self.kinds]
        for k, i, m in self.modules:
            if not isinstance(m, FunctionalMultiheadAttention):
                raise ValueError(
                    f"{k} attention of layer {i} is a {type(m).__name__}, not FunctionalMultiheadAttention; "
                    "load the checkpoint with load_model_for_analysis (rebuilds stock transformers)")
        self._raw: Dict[Tuple[str, int], Tuple[torch.Tensor, Optional[torch.Tensor]]] = {}

    def _slot(self, key):
        def capture(weights, mask):
            self._raw[key] = (weights.detach().float(), None if mask is None else mask.detach())
        return capture

    def __enter__(self):
        for k, i, m in self.modules:
            m.attn_fn.capture = self._slot((k, i))
        return self

    def __exit__(self, *exc):
        for _, _, m in self.modules:
            m.attn_fn.capture = None
        self._raw.clear()
        return False

    @torch.no_grad()
    def run(self, sample: dict) -> Dict[Tuple[str, int], CapturedAttention]:
        """Teacher-forced forward of ``sample`` (``net_input`` with ``src_tokens``,
        ``src_lengths``, ``prev_output_tokens``) in eval mode.

        Returns:
            ``{(kind, layer): CapturedAttention}``; masks combine key masks with query padding
            (source padding for encoder queries, target padding for decoder/cross queries).
        """
        net = sample["net_input"]
        was_training = self.model.training
        self.model.eval()
        self._raw.clear()
        try:
            self.model(**net)
        finally:
            self.model.train(was_training)
        src_pad = net["src_tokens"].eq(self.pad)  # (B, S)
        tgt_pad = net["prev_output_tokens"].eq(self.pad)  # (B, T)
        out = {}
        for k, i, m in self.modules:
            if (k, i) not in self._raw:
                raise RuntimeError(f"{k} attention of layer {i} produced no weights")
            w, mask = self._raw.pop((k, i))
            B, H, T, S = w.shape
            qpad = (src_pad if k == "encoder" else tgt_pad).view(B, 1, T, 1)
            full = qpad.expand(B, 1, T, S)
            if mask is not None:
                full = full | mask.expand(B, 1, T, S)  # (B, 1, T, S)
            out[(k, i)] = CapturedAttention(w, full, bool(m.attn_fn.is_distribution))
        return out


def _rebuild_stock(model, cfg_model, task):
    """Stock ``TransformerModel`` -> ``attention_transformer`` with softmax everywhere (same
    parameter names; the state dict is loaded strictly)."""
    from omegaconf import OmegaConf

    from ..models.transformer import AttentionTransformerModel

    if isinstance(cfg_model, argparse.Namespace):
        args = argparse.Namespace(**vars(cfg_model))
    else:
        args = argparse.Namespace(**OmegaConf.to_container(cfg_model, resolve=True))
    for attr in ("encoder_attention_fn", "decoder_attention_fn", "cross_attention_fn"):
        setattr(args, attr, "softmax")
    args.arch = "attention_transformer"
    ours = AttentionTransformerModel.build_model(args, task)
    ours.load_state_dict(model.state_dict(), strict=True)
    return ours


def check_transformer(model: nn.Module, tool: str, checkpoint: Optional[str] = None) -> None:
    """Refuse a model that is not an encoder-decoder Transformer (attention analyses, FFN
    variance, E-ATT energy read its per-layer attention modules and FFNs).

    Args:
        model: the loaded model.
        tool: what needs the Transformer, for the message (e.g. ``"ffn_variance_ratio.py"``).
        checkpoint: the file it came from, for the message.

    Raises:
        fairseq_plugins.checkpoint.UnsupportedCheckpointError: ``model`` has no encoder and
            decoder ``layers`` with attention modules (e.g. an ``rnnsearch`` model); the message
            names the file and its model class.
    """
    from ..checkpoint import UnsupportedCheckpointError

    kinds = {k for k, _, _ in attention_modules(model)}
    if {"encoder", "decoder"} <= kinds:
        return
    where = f"{checkpoint} holds" if checkpoint else "the model is"
    raise UnsupportedCheckpointError(
        f"{tool} needs a Transformer checkpoint (encoder and decoder layers with attention modules); "
        f"{where} a {type(model).__name__} (encoder {type(getattr(model, 'encoder', None)).__name__}, "
        f"decoder {type(getattr(model, 'decoder', None)).__name__}), which has no such layers")


def load_model_for_analysis(checkpoint: str, data: str, source_lang: Optional[str] = None,
                            target_lang: Optional[str] = None, subsets: Sequence[str] = (),
                            transformer_only: bool = True, tool: str = "the attention analysis"):
    """Load ``checkpoint`` (via :func:`fairseq_plugins.checkpoint.load_checkpoint`) and its task.

    Args:
        checkpoint: fairseq checkpoint (last, averaged, ...).
        data: fairseq data dir (binarized splits + dictionaries) overriding the stored one.
        source_lang, target_lang: direction overrides (None: as trained).
        subsets: splits to load into the task.
        transformer_only: refuse a model that is not an encoder-decoder Transformer
            (:func:`check_transformer`); False for analyses of any model (source reliance).
        tool: what loads it, for the refusal message.

    Returns:
        ``(model, task, info)``: the model in eval mode, every attention module a
        :class:`FunctionalMultiheadAttention` (stock transformers are rebuilt, ``info["rebuilt"]``),
        ``info`` with ``arch`` and ``attention_fns`` ``{kind: name}``.

    Raises:
        fairseq_plugins.checkpoint.UnsafeCheckpointError: the pickle holds a non-allow-listed global.
        fairseq_plugins.checkpoint.CheckpointError: the file is empty, cut short or not a checkpoint.
        fairseq_plugins.checkpoint.UnsupportedCheckpointError: not a Transformer (``transformer_only``).
        FileNotFoundError: missing checkpoint.
    """
    import fairseq_plugins  # noqa: F401  (archs, safe globals)
    from ..checkpoint import load_model_ensemble_and_task

    overrides = {"data": data}
    if source_lang:
        overrides["source_lang"] = source_lang
    if target_lang:
        overrides["target_lang"] = target_lang
    models, cfg, task = load_model_ensemble_and_task([checkpoint], arg_overrides=overrides)
    model = models[0]
    if transformer_only:
        check_transformer(model, tool, checkpoint)
    rebuilt = False
    if not all(isinstance(m, FunctionalMultiheadAttention) for _, _, m in attention_modules(model)):
        model = _rebuild_stock(model, cfg.model, task)
        rebuilt = True
    model.eval()
    for s in subsets:
        task.load_dataset(s)
    fns = {}
    for k, _, m in attention_modules(model):
        fns.setdefault(k, m.attn_fn.name)
    arch = getattr(cfg.model, "arch", None) or getattr(cfg.model, "_name", None)
    return model, task, {"arch": arch, "attention_fns": fns, "rebuilt_as_softmax": rebuilt}


def iter_batches(task, dataset, max_tokens: int = 4096, max_sentences: Optional[int] = None) -> Iterator[dict]:
    """Deterministic batches (no shuffling, no dropped remainder) of a fairseq dataset."""
    itr = task.get_batch_iterator(
        dataset=dataset, max_tokens=max_tokens, max_sentences=max_sentences,
        required_batch_size_multiple=1, ignore_invalid_inputs=False,
    ).next_epoch_itr(shuffle=False)
    yield from itr


class _ListDataset(torch.utils.data.Dataset):
    def __init__(self, items):
        self.items = items
        self.sizes = torch.tensor([len(t) for t in items]).numpy()

    def __getitem__(self, i):
        return self.items[i]

    def __len__(self):
        return len(self.items)


def pairs_dataset(task, src: List[torch.Tensor], tgt: List[torch.Tensor]):
    """A fairseq ``LanguagePairDataset`` over token tensors (each ending in ``eos``), with the
    task's padding conventions -- for shuffled references, hypotheses and raw-text corpora.

    Raises:
        ValueError: ``src`` and ``tgt`` differ in length.
    """
    from fairseq.data import LanguagePairDataset

    if len(src) != len(tgt):
        raise ValueError(f"{len(src)} sources but {len(tgt)} targets")
    s, t = _ListDataset(src), _ListDataset(tgt)
    return LanguagePairDataset(
        s, s.sizes, task.source_dictionary, t, t.sizes, task.target_dictionary,
        left_pad_source=getattr(task.cfg, "left_pad_source", True),
        left_pad_target=getattr(task.cfg, "left_pad_target", False),
    )


def dataset_pairs(dataset) -> Tuple[List[torch.Tensor], List[torch.Tensor]]:
    """All ``(source, target)`` token tensors of a ``LanguagePairDataset``, in index order."""
    src = [dataset.src[i] for i in range(len(dataset))]
    tgt = [dataset.tgt[i] for i in range(len(dataset))]
    return src, tgt


@torch.no_grad()
def hypothesis_batches(task, model, dataset, beam: int = 4, max_tokens: int = 4096,
                       lenpen: float = 1.0) -> Tuple[List[torch.Tensor], List[torch.Tensor]]:
    """Translate ``dataset`` with beam search; returns ``(sources, best hypotheses)`` in index
    order (tokens ending in ``eos``), to teacher-force the model on its own translations."""
    gen = task.build_generator([model], argparse.Namespace(beam=beam, lenpen=lenpen, max_len_a=1.2,
                                                           max_len_b=10))
    hyps: Dict[int, torch.Tensor] = {}
    for sample in iter_batches(task, dataset, max_tokens=max_tokens):
        out = task.inference_step(gen, [model], sample)
        for j, idx in enumerate(sample["id"].tolist()):
            hyps[idx] = out[j][0]["tokens"].cpu()
    src = [dataset.src[i] for i in range(len(dataset))]
    return src, [hyps[i] for i in range(len(dataset))]


# ---------------------------------------------------------------------------------------------
# word level (ReLA Section 5.2: "we obtain the word-level attention weights by merging its
# subword-level counterparts following Zenkel et al. (2019)")
# ---------------------------------------------------------------------------------------------
#: the levels the attention metrics are computed at: ``subword`` (the positions the model has, the
#: default) or ``word`` (subword-nmt pieces merged into words, :func:`word_level_records`)
ATTENTION_LEVELS = ("subword", "word")
#: subword-nmt's continuation marker: a piece ending in it continues into the next piece
BPE_MARKER = "@@"
#: SentencePiece's word-start marker (U+2581): vocabularies with it and without ``@@`` pieces
#: cannot be merged by the ``@@`` rule
SPM_MARKER = "\u2581"


def check_attention_level(level: str) -> str:
    """``level`` if it is one of :data:`ATTENTION_LEVELS`.

    Raises:
        ValueError: it is not (the message names the valid choices)."""
    return check_choice("--attention-level", level, ATTENTION_LEVELS)


def check_bpe_symbols(symbols, where: str) -> None:
    """Refuse a vocabulary the ``@@`` word rule of :func:`bpe_word_ids` cannot read.

    A vocabulary with no piece ending in ``@@`` is accepted (then every token is a word of its
    own and the word level equals the subword level) unless it holds SentencePiece pieces
    (``\u2581word``), whose word boundaries the ``@@`` rule would silently miss.

    Args:
        symbols: the vocabulary's symbols (e.g. ``Dictionary.symbols``).
        where: what the symbols are, for the message (e.g. a dictionary file).

    Raises:
        ValueError: SentencePiece-style symbols and no ``@@`` piece (named)."""
    has_bpe = has_spm = False
    for s in symbols:
        has_bpe = has_bpe or s.endswith(BPE_MARKER)
        has_spm = has_spm or s.startswith(SPM_MARKER)
    if has_spm and not has_bpe:
        raise ValueError(f"{where}: the vocabulary has SentencePiece pieces ({SPM_MARKER!r} word starts) and no "
                         f"subword-nmt {BPE_MARKER!r} piece; the word level merges pieces by subword-nmt's "
                         f"{BPE_MARKER!r} continuation marker only (valid levels here: subword)")


def bpe_word_ids(pieces: Sequence[Optional[str]], own_words: Sequence[str] = ()) -> Tuple[List[int], int]:
    """Word index of each piece of a subword-nmt BPE sequence (0-based, left to right).

    A piece ending in ``@@`` continues into the next piece; every other piece ends its word.
    ``None`` marks a position of no word (padding): id -1, and it breaks a word.  A symbol of
    ``own_words`` (``</s>``, ``<s>``) is always a word of its own, also after a dangling ``@@``
    piece (which then ends its word).  ``<unk>`` carries no marker and so ends its word.

    Example: ``[None, "Fahr@@", "rad", "fährt", "</s>"]`` -> ``([-1, 0, 0, 1, 2], 3)``.

    Returns:
        ``(ids, n_words)``: one id per piece, and the number of words.
    """
    own = set(own_words)
    ids, word, cont = [], -1, False
    for p in pieces:
        if p is None:
            ids.append(-1)
            cont = False
            continue
        special = p in own
        if special or not cont:
            word += 1
        ids.append(word)
        cont = not special and p.endswith(BPE_MARKER)
    return ids, word + 1


def _positions(tokens: torch.Tensor, dictionary, pad: int) -> Tuple[torch.Tensor, List[int], List[int]]:
    """Non-pad positions of a 1-D token tensor, their word ids (:func:`bpe_word_ids`, ``</s>`` and
    ``<s>`` words of their own) and the position of each word's first piece."""
    pos = tokens.ne(pad).nonzero(as_tuple=True)[0]
    ids, n = bpe_word_ids([dictionary[t] for t in tokens[pos].tolist()], (dictionary.eos_word, dictionary.bos_word))
    first = [-1] * n
    for p, w in zip(pos.tolist(), ids):
        if first[w] < 0:
            first[w] = p
    return pos, ids, first


@torch.no_grad()
def word_level_records(records: Dict[Tuple[str, int], "CapturedAttention"], sample: dict, src_dict, tgt_dict,
                       pad: int) -> Dict[Tuple[str, int], "CapturedAttention"]:
    """Captured subword attention -> word-level attention (ReLA Section 5.2, "following Zenkel
    et al. (2019)", who average over the subwords of a word).

    Words are read from the tokens the model saw, by subword-nmt's ``@@`` marker
    (:func:`bpe_word_ids`): ``src_tokens`` for encoder positions, ``prev_output_tokens`` (the
    leading ``</s>``, then ``y_1 .. y_{n}``) for decoder positions -- a decoder row is labelled by
    the token it *reads* (for cross-attention this grouping is the "shifted" one of the AER,
    ``alpha[1:]``).  ``</s>`` / ``<s>`` are words of their own; padding belongs to no word.
    Self-attention merges both axes with the same words.

    Per sentence and layer, with the weights zeroed where the mask is True,
    :func:`~fairseq_plugins.analysis.alignment.merge_subwords` (``source_merge="mean"``) gives
    ``W[i, j]`` = the mean over the pieces ``t`` of query word ``i`` of the mean over the pieces
    ``s`` of key word ``j`` of ``w[t, s]`` (masked pairs count as 0).  Consequences:

    * a merged pair ``(i, j)`` is masked iff every ``(t, s)`` pair of it is (so in causal decoder
      self-attention word ``i`` sees no later word, and its own cell averages rows that see 1..n
      of its n pieces);
    * with non-negative weights, ``W[i, j] = 0`` iff every valid ``w[t, s]`` of it is 0, and a
      word's row is null iff every piece's row is null (up to float32 underflow of averages
      below ~1e-45; GeLU / Leaky-ReLU weights can be negative and could cancel);
    * for distributions (``is_distribution``: softmax, sparsemax, entmax) the averaged key
      pieces make a row sum below 1, so in a sentence with a multi-piece key word every merged
      row is renormalised to sum 1 (a scale per row: only the JS divergence sees it; sparsity,
      null rate, entropy and top-p renormalise or count zeros anyway); non-distributions (ReLA,
      ReLUFormer) keep their averaged magnitudes.

    Layout: the result keeps the shape ``(B, H, T, S)``; word ``i`` sits at the position of its
    first piece, the positions of its other pieces (and padding) are masked with weight 0, so a
    sentence without ``@@`` pieces gives the input weights and mask back (masked positions
    zeroed) and every metric of :mod:`~fairseq_plugins.analysis.metrics` exactly as before.

    Args:
        records: ``{(kind, layer): CapturedAttention}`` of :meth:`AttentionCapture.run` on ``sample``.
        sample: the batch (``net_input`` with ``src_tokens`` ``(B, S)``, ``prev_output_tokens`` ``(B, T)``).
        src_dict, tgt_dict: the task's dictionaries (token ids -> pieces).
        pad: padding index.

    Returns:
        ``{(kind, layer): CapturedAttention}`` at word level, same keys, shapes and
        ``is_distribution``.

    Raises:
        ValueError: an unknown kind, or a record whose shape does not match the sample (named).
    """
    net = sample["net_input"]
    src, prev = net["src_tokens"], net["prev_output_tokens"]
    B = src.size(0)
    sides = {"src": [_positions(src[b], src_dict, pad) for b in range(B)],
             "tgt": [_positions(prev[b], tgt_dict, pad) for b in range(B)]}
    axes = {"encoder": ("src", "src"), "decoder": ("tgt", "tgt"), "cross": ("tgt", "src")}
    out = {}
    by_kind: Dict[str, List[Tuple[str, int]]] = {}
    for key in records:
        if key[0] not in axes:
            raise ValueError(f"unknown attention kind {key[0]!r}; valid choices: {', '.join(ATTENTION_KINDS)}")
        by_kind.setdefault(key[0], []).append(key)
    for kind, keys in by_kind.items():
        rside, cside = axes[kind]
        recs = [records[k] for k in keys]
        H = recs[0].weights.size(1)
        want = (B, H, (src if rside == "src" else prev).size(1), (src if cside == "src" else prev).size(1))
        for k, r in zip(keys, recs):
            if tuple(r.weights.shape) != want:
                raise ValueError(f"{k[0]} attention of layer {k[1]}: weights {tuple(r.weights.shape)} do not match "
                                 f"the sample's (B, H, T, S) = {want}")
        new_w = [torch.zeros_like(r.weights) for r in recs]
        new_m = [torch.ones((B, 1) + want[2:], dtype=torch.bool, device=r.weights.device) for r in recs]
        for b in range(B):
            rpos, rids, rfirst = sides[rside][b]
            cpos, cids, cfirst = sides[cside][b]
            if not rfirst or not cfirst:
                continue
            w = torch.cat([r.weights[b][:, rpos][:, :, cpos] for r in recs])  # (L*H, T_b, S_b)
            m = torch.cat([r.mask.expand((B, 1) + want[2:])[b][:, rpos][:, :, cpos] for r in recs])  # (L, T_b, S_b)
            w = w.double().masked_fill(m.repeat_interleave(H, dim=0), 0.0)
            merged = merge_subwords(torch.cat([w, (~m).double()]), rids, cids, len(rfirst), len(cfirst),
                                    source_merge="mean")  # (L*H + L, I, J)
            mw, valid = merged[:len(recs) * H], merged[len(recs) * H:] > 0
            ri, ci = torch.tensor(rfirst)[:, None], torch.tensor(cfirst)[None, :]
            multi_key = len(cfirst) < len(cids)
            for n, r in enumerate(recs):
                x = mw[n * H:(n + 1) * H]  # (H, I, J)
                if r.is_distribution and multi_key:
                    x = x / x.sum(-1, keepdim=True).clamp_min(torch.finfo(x.dtype).tiny)
                new_w[n][b][:, ri, ci] = x.to(new_w[n].dtype)
                new_m[n][b][:, ri, ci] = ~valid[n]
        for k, r, w, m in zip(keys, recs, new_w, new_m):
            out[k] = CapturedAttention(w, m, r.is_distribution)
    return out
