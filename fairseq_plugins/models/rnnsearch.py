"""RNNsearch (Bahdanau et al. 2015) with global, local-p or flexible attention.

The model of Shu & Nakayama (2017), "Reducing Redundant Computations with Flexible Attention",
Sections 2 and 5.1: a bidirectional LSTM encoder; a one-layer LSTM decoder whose input at step
``t`` is ``[i_t; c_t]`` (embedding of the previous output word; context vector); the additive
score ``v_a^T tanh(W_a [h_{t-1}; h̄_s])`` from the previous decoder state (eq. 3); a
fully connected layer before the output softmax (600 units: the paper; its ``tanh`` and its input
``[h_t; c_t; i_t]``, Bahdanau-style: our choice, the paper gives neither).  fairseq's own ``lstm`` model uses Luong's "general" score, hence this model.

Shape legend: B batch (hypotheses), S source length, T target length, V target vocabulary,
E embedding size, H decoder hidden size, C = 2 x encoder hidden size, P pre-output size.

* ``--rnn-attention {global,local_p,flexible}`` (see :mod:`fairseq_plugins.attention.additive`);
* ``--rnn-attention-fn {softmax,sparsemax,entmax15}``: the normaliser, a plain function of the
  plugin's attention registry (default softmax, the paper's);
* ``--flexible-sigma`` (eq. 6, default 1.5), ``--flexible-threshold`` ``tau`` (default inf; at
  decode time ``--model-overrides "{'flexible_threshold': 1.2}"``), ``--local-window-d`` (10);
* ``p_0 = 0`` (the first source position; see the attention module);
* the decoder state starts at ``h_0 = tanh(W_init mean_s h̄_s)``, ``c_0 = 0`` (Bahdanau et al.
  use the first backward state; the mean over the sentence is the common variant).

Fine-tuning (eq. 9): with ``--criterion label_smoothed_cross_entropy_with_reg --reg-weight β``
the flexible decoder records ``-(1/T_i) sum_t g_i(t)`` per sentence as an auxiliary loss
(``flexible_gate_loss``) normalised so that the criterion's ``β * mean * sample_size`` equals
``-β sum_i mean_t g_i(t)``, i.e. exactly the paper's ``β`` against the summed sentence NLL
(see :meth:`RNNsearchDecoder._record_gate`).  The mean gate ``flexible_gate`` is logged too.

Window statistics: in incremental decoding (fairseq-generate) the attention counts the positions
it scores; at interpreter exit a line ``[rnnsearch] <kind> attention (tau=...): average window
X positions per sentence over N sentences (...; average source length L); pooled Y positions per
hypothesis-step over M hypothesis-steps (average source length L')`` is written to stderr (X is the
paper's average, §5.2: per step over the hypotheses, per sentence over its steps, then over the
sentences -- for Global attention the mean source length; Y pools all hypothesis-steps,
:class:`~fairseq_plugins.attention.additive.WindowStats`) by an ``atexit`` hook the model
registers on its first counted step (fairseq has no end-of-generation callback a ``--user-dir``
can reach, and this needs no wrapper or patch).
"""

import atexit
import math
import sys
from dataclasses import dataclass, fields
from typing import Optional

import torch
import torch.nn as nn
import torch.nn.functional as F
from fairseq import utils
from fairseq.dataclass import ChoiceEnum, FairseqDataclass
from fairseq.dataclass.utils import gen_parser_from_dataclass
from fairseq.models import (
    FairseqEncoder,
    FairseqEncoderDecoderModel,
    FairseqIncrementalDecoder,
    register_model,
    register_model_architecture,
)
from fairseq.utils import safe_getattr
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from ..attention.additive import ATTENTION_KINDS, NORMALIZER_CHOICES, AdditiveAttention
from ..modules.auxiliary import clear_auxiliary
from ..options import check_fields, option
from ..trained_data import record_or_check
from ._config import check_model_keys, fill_defaults
from .precision import check_precision_flags, training_config
from .ranges import check_training_ranges

__all__ = ["RNNsearchModel", "RNNsearchConfig", "RNNsearchEncoder", "RNNsearchDecoder", "left_pad_attention"]


@dataclass
class RNNsearchConfig(FairseqDataclass):
    """Every option of ``rnnsearch`` (flags, ``model:`` keys of a hydra YAML), with the paper's
    sizes as defaults (Section 5.1); ``rnnsearch_small`` changes the sizes only.  Checked once at
    build (:func:`~fairseq_plugins.options.check_fields`)."""

    encoder_embed_dim: int = option(1000, "source embedding size", ge=1)
    encoder_hidden_size: int = option(1000, "hidden size of each direction of the bi-LSTM encoder", ge=1)
    decoder_embed_dim: int = option(1000, "target embedding size", ge=1)
    decoder_hidden_size: int = option(1000, "decoder LSTM size", ge=1)
    attention_dim: Optional[int] = option(None, "width of W_a (and W_g, W_p); default: --decoder-hidden-size", ge=1)
    decoder_out_embed_dim: int = option(600, "units of the layer before the output softmax (paper 600)", ge=1)
    dropout: float = option(0.2, "dropout probability (our choice; the paper gives none)", ge=0, lt=1)
    rnn_attention: ChoiceEnum(ATTENTION_KINDS) = option("global", f"attention: one of {', '.join(ATTENTION_KINDS)}")
    rnn_attention_fn: ChoiceEnum(NORMALIZER_CHOICES) = option(
        "softmax", "normaliser of the attention scores, a plain normaliser of the plugin's registry whose "
                   f"weights are a distribution: {', '.join(NORMALIZER_CHOICES)} (default softmax, the paper's)")
    flexible_sigma: float = option(1.5, "sigma of the flexible penalty g (s-p)^2/(2 sigma^2) (default 1.5)", gt=0)
    flexible_threshold: float = option(
        math.inf, "score only positions with penalty < TAU (default inf = all); decode-time: "
                  "--model-overrides \"{'flexible_threshold': 1.2}\"", gt=0, allow_inf=True)
    local_window_d: int = option(10, "half window D of local-p attention (default 10, sigma = D/2)", ge=1)


# the option keys (not FairseqDataclass._name)
_RNN_KEYS = frozenset(f.name for f in fields(RNNsearchConfig) if not f.name.startswith("_"))


def left_pad_attention(attn: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """Attention over right-padded source positions -> over fairseq's left-padded ``src_tokens``.

    The decoder attends over the encoder's right-padded states (position ``s`` = the ``s``-th
    word); fairseq indexes ``attn`` by the columns of the left-padded ``src_tokens`` (e.g.
    ``--print-alignment``, ``--replace-unk``), where word ``s`` of a sentence of length ``len``
    sits at column ``s + S - len``.

    Args:
        attn: ``(B, T, S)``, zeros at ``s >= len``; lengths: ``(B,)`` long, source lengths.

    Returns:
        ``(B, T, S)`` with column ``j`` = ``attn[..., j - (S - len)]`` (zeros in the left padding).
    """
    B, T, S = attn.shape
    shift = (S - lengths).unsqueeze(1)  # (B, 1) left-padding width
    idx = (torch.arange(S, device=attn.device).unsqueeze(0) - shift) % S  # (B, S); pad columns -> s >= len
    return attn.gather(2, idx.unsqueeze(1).expand(B, T, S))


def _report_windows(stats):
    """atexit hook: print the window statistics of one attention module (if it decoded)."""
    if stats.queries:
        print(stats.report(), file=sys.stderr, flush=True)


class RNNsearchEncoder(FairseqEncoder):
    """Embedding -> dropout -> bidirectional LSTM -> dropout.

    ``forward(src_tokens (B, S), src_lengths (B,))`` returns a dict of one-element lists:
    ``encoder_out`` ``(B, S, C)`` (batch first, right-padded, zeros at padding),
    ``encoder_padding_mask`` ``(B, S)`` bool, ``src_lengths`` ``(B,)`` long (non-pad counts),
    ``sentence_ids`` ``(B,)`` long (``0 .. B-1``: reordered with the rest, so that in beam search
    each hypothesis row names its sentence, for the per-sentence window average of §5.2).
    fairseq's left-padded source is converted to right padding first, so position ``s`` is
    the ``s``-th word of the sentence.
    """

    def __init__(self, dictionary, embed_dim, hidden_size, dropout, left_pad=True):
        super().__init__(dictionary)
        self.padding_idx = dictionary.pad()
        self.left_pad = left_pad
        self.embed_tokens = nn.Embedding(len(dictionary), embed_dim, padding_idx=self.padding_idx)
        nn.init.uniform_(self.embed_tokens.weight, -0.1, 0.1)
        nn.init.constant_(self.embed_tokens.weight[self.padding_idx], 0)
        self.lstm = nn.LSTM(embed_dim, hidden_size, batch_first=True, bidirectional=True)
        self.dropout = nn.Dropout(dropout)
        self.output_dim = 2 * hidden_size

    def forward(self, src_tokens, src_lengths=None, **kwargs):
        """Encode ``src_tokens`` ``(B, S)``: the dict of one-element lists described in the class
        docstring, ``encoder_out`` ``(B, S, C)`` right-padded.  ``src_lengths`` is not read: the
        lengths are recounted from the padding of ``src_tokens``."""
        if self.left_pad:
            src_tokens = utils.convert_padding_direction(src_tokens, self.padding_idx, left_to_right=True)
        pad = src_tokens.eq(self.padding_idx)  # (B, S)
        lengths = (~pad).long().sum(1)  # (B,)
        x = self.dropout(self.embed_tokens(src_tokens))  # (B, S, E)
        packed = pack_padded_sequence(x, lengths.cpu(), batch_first=True, enforce_sorted=False)
        out, _ = self.lstm(packed)
        out, _ = pad_packed_sequence(out, batch_first=True, total_length=src_tokens.size(1))  # (B, S, C)
        return {"encoder_out": [self.dropout(out)], "encoder_padding_mask": [pad], "src_lengths": [lengths],
                "sentence_ids": [torch.arange(lengths.numel(), device=lengths.device)]}

    def reorder_encoder_out(self, encoder_out, new_order):
        """A new dict with every tensor of ``encoder_out`` indexed by ``new_order`` ``(B',)`` along dim 0
        (beam search), ``sentence_ids`` included."""
        return {k: [t.index_select(0, new_order) for t in v] for k, v in encoder_out.items()}

    def max_positions(self):
        return int(1e5)


class RNNsearchDecoder(FairseqIncrementalDecoder):
    """One-layer LSTM decoder with additive attention from ``h_{t-1}`` (see the module docstring).

    ``forward(prev_output_tokens (B, T), encoder_out, incremental_state=None)`` returns logits
    ``(B, T, V)`` and ``{"attn": [(B, T, S)], "gate": (B, T) or None, "window": (B, T)}``;
    ``attn`` is indexed like fairseq's ``src_tokens`` (left-padded when ``left_pad``, see
    :func:`left_pad_attention`), so ``--print-alignment`` names the right source words.
    Incremental state per hypothesis: ``h``, ``c`` ``(B, H)``, focus ``p`` ``(B,)`` and the
    precomputed keys ``(B, S, A)``, all reordered by :meth:`reorder_incremental_state`.
    """

    def __init__(self, dictionary, embed_dim, hidden_size, encoder_dim, attn_dim, out_dim, dropout,
                 attention, sigma, threshold, local_d, sentence_avg=False, left_pad=True, normalizer="softmax"):
        super().__init__(dictionary)
        self.left_pad = bool(left_pad)  # of the source: the padding of the returned attn
        self.padding_idx = dictionary.pad()
        self.embed_tokens = nn.Embedding(len(dictionary), embed_dim, padding_idx=self.padding_idx)
        nn.init.uniform_(self.embed_tokens.weight, -0.1, 0.1)
        nn.init.constant_(self.embed_tokens.weight[self.padding_idx], 0)
        self.init_proj = nn.Linear(encoder_dim, hidden_size)
        self.attention = AdditiveAttention(hidden_size, encoder_dim, attn_dim, embed_dim, kind=attention,
                                           sigma=sigma, threshold=threshold, local_d=local_d,
                                           normalizer=normalizer)
        self.cell = nn.LSTMCell(embed_dim + encoder_dim, hidden_size)
        self.pre_output = nn.Linear(hidden_size + encoder_dim + embed_dim, out_dim)
        self.output_projection = nn.Linear(out_dim, len(dictionary))
        self.dropout = nn.Dropout(dropout)
        self.sentence_avg = bool(sentence_avg)
        self._report_registered = False

    def _initial_state(self, enc, pad, lengths):
        mean = enc.masked_fill(pad.unsqueeze(-1), 0.0).sum(1) / lengths.clamp_min(1).unsqueeze(-1).to(enc.dtype)
        h = torch.tanh(self.init_proj(mean))  # (B, H)
        return {"h": h, "c": torch.zeros_like(h), "p": enc.new_zeros(enc.size(0)),  # p_0 = 0
                "keys": self.attention.keys(enc)}

    def forward(self, prev_output_tokens, encoder_out=None, incremental_state=None, features_only=False, **kwargs):
        """Decode ``prev_output_tokens`` ``(B, T)`` (only the last token with ``incremental_state``).

        Returns ``(logits (B, T, V), extra)``, or ``(features (B, T, P), extra)`` with
        ``features_only`` (the pre-output layer after ``tanh`` and dropout); ``extra`` as in the
        class docstring.  Incremental calls count the window statistics (and register their
        ``atexit`` report); full-sequence calls record eq. 9's gate term (:meth:`_record_gate`)."""
        enc = encoder_out["encoder_out"][0]  # (B, S, C)
        pad = encoder_out["encoder_padding_mask"][0]  # (B, S)
        lengths = encoder_out["src_lengths"][0]  # (B,)
        incremental = incremental_state is not None
        if incremental:
            prev_output_tokens = prev_output_tokens[:, -1:]
            state = self.get_incremental_state(incremental_state, "state")
        else:
            state = None
        sentence_ids = (encoder_out.get("sentence_ids") or [None])[0] if incremental else None
        if state is None:
            state = self._initial_state(enc, pad, lengths)
            if sentence_ids is not None:  # the first step of a new batch of sentences
                self.attention.stats.begin_batch(sentence_ids, lengths)
        h, c, p, keys = state["h"], state["c"], state["p"], state["keys"]
        if incremental and not self._report_registered:
            atexit.register(_report_windows, self.attention.stats)
            self._report_registered = True

        # no padding (e.g. one sentence): no masking work -- decided on CPU only, where bool() of a
        # tensor is free; on a GPU it would sync the host every forward, so the mask is kept there
        mask = pad if (pad.device.type != "cpu" or bool(pad.any())) else None
        x = self.dropout(self.embed_tokens(prev_output_tokens))  # (B, T, E)
        feats, attns, gates, windows = [], [], [], []
        for t in range(x.size(1)):
            i_t = x[:, t]  # (B, E)
            step = self.attention(h, i_t, keys, enc, mask, lengths, p, count=incremental, sentence_ids=sentence_ids)
            p = step.focus
            h, c = self.cell(torch.cat([i_t, step.context], -1), (h, c))  # (B, H)
            feats.append(torch.cat([h, step.context, i_t], -1))  # (B, H + C + E)
            attns.append(step.weights)
            windows.append(step.window)
            if step.gate is not None:
                gates.append(step.gate)
        if incremental:
            self.set_incremental_state(incremental_state, "state", {"h": h, "c": c, "p": p, "keys": keys})
        out = torch.stack(feats, 1)  # (B, T, H + C + E)
        out = self.dropout(torch.tanh(self.pre_output(out)))  # (B, T, P)
        gate = torch.stack(gates, 1) if gates else None  # (B, T)
        if gate is not None and not incremental:
            self._record_gate(gate, prev_output_tokens.ne(self.padding_idx))
        attn = torch.stack(attns, 1)  # (B, T, S), right-padded positions
        if self.left_pad and mask is not None:
            attn = left_pad_attention(attn, lengths)  # (B, T, S), the positions of src_tokens
        extra = {"attn": [attn], "gate": gate, "window": torch.stack(windows, 1)}
        if features_only:
            return out, extra
        return self.output_projection(out), extra

    def _record_gate(self, gate, live):
        """Record eq. 9's term for the criterion ``label_smoothed_cross_entropy_with_reg``.

        The criterion adds ``β * (total / count) * sample_size`` where ``sample_size`` is the
        number of target tokens (or of sentences with ``--sentence-avg``).  Recording
        ``total = -sum_i (1/T_i) sum_t g_i(t)`` with ``count = sample_size`` makes that
        ``-β sum_i mean_t g_i(t)``: the paper's ``J = sum_i [-log p(y_i|x_i) - β mean_t g_i(t)]``
        (after the trainer's division by ``sample_size``, both terms are divided alike).

        Args:
            gate: ``(B, T)`` ``g(t)``; live: ``(B, T)`` bool, non-pad target steps.
        """
        aux = self.attention.aux
        if not aux.enabled:
            return
        live_f = live.to(gate.dtype)
        steps = live_f.sum(1)  # T_i, (B,)
        per_sent = (gate * live_f).sum(1) / steps.clamp_min(1.0)  # (B,)
        has = steps > 0
        count = has.sum() if self.sentence_avg else live_f.sum()
        aux.record("flexible_gate_loss", -per_sent[has].sum(), count.detach(), True)
        aux.record("flexible_gate", (gate * live_f).sum().detach(), live_f.sum().detach(), False)

    def reorder_incremental_state(self, incremental_state, new_order):
        """Index the stored ``h``, ``c``, ``p`` and ``keys`` by ``new_order`` ``(B',)`` along dim 0; no-op
        before the first step."""
        state = self.get_incremental_state(incremental_state, "state")
        if state is None:
            return
        self.set_incremental_state(incremental_state, "state",
                                   {k: v.index_select(0, new_order) for k, v in state.items()})

    def max_positions(self):
        return int(1e5)


@register_model("rnnsearch")
class RNNsearchModel(FairseqEncoderDecoderModel):
    """RNNsearch with selectable attention (Shu & Nakayama 2017, Sections 2-3 and 5.1).

    Raises (from :meth:`build_model`, also for checkpoint overrides):
        ValueError: an option outside its declared range or choices (:class:`RNNsearchConfig`,
            the message names the flag and lists the valid choices or range): e.g. unknown
            ``rnn_attention`` / ``rnn_attention_fn``, ``flexible_sigma`` not a finite number > 0,
            ``local_window_d < 1``, ``flexible_threshold`` not > 0 (``inf`` allowed, ``nan`` not),
            ``dropout`` not in [0, 1); in a hydra ``DictConfig``, a key that is no option.
    """

    @staticmethod
    def add_args(parser):
        """Flags generated from :class:`RNNsearchConfig` (no defaults: the arch presets fill them)."""
        gen_parser_from_dataclass(parser, RNNsearchConfig(), delete_default=True, with_prefix="")

    @classmethod
    def build_model(cls, args, task):
        check_model_keys(args, _RNN_KEYS, "rnnsearch")
        base_architecture(args)
        check_precision_flags()  # --fp16/--bf16 this machine cannot train with (fairseq-train only)
        check_training_ranges()  # --lr, --label-smoothing, --dropout ... in their ranges (fairseq-train only)
        record_or_check(args, task, training=training_config() is not None)  # direction, dictionaries
        check_fields(RNNsearchConfig(**{k: safe_getattr(args, k) for k in _RNN_KEYS}))
        left_pad = bool(getattr(args, "left_pad_source", True))
        encoder = RNNsearchEncoder(task.source_dictionary, args.encoder_embed_dim, args.encoder_hidden_size,
                                   args.dropout, left_pad=left_pad)
        decoder = RNNsearchDecoder(
            task.target_dictionary, args.decoder_embed_dim, args.decoder_hidden_size, encoder.output_dim,
            args.attention_dim, args.decoder_out_embed_dim, args.dropout, args.rnn_attention,
            args.flexible_sigma, args.flexible_threshold, args.local_window_d,
            sentence_avg=bool(getattr(args, "sentence_avg", False)), left_pad=left_pad,
            normalizer=args.rnn_attention_fn)
        return cls(encoder, decoder)

    def forward(self, src_tokens, src_lengths, prev_output_tokens, **kwargs):
        """fairseq's forward after dropping auxiliary records of earlier passes (as the Transformer)."""
        clear_auxiliary(self)
        return super().forward(src_tokens, src_lengths, prev_output_tokens, **kwargs)

    def max_positions(self):
        return (self.encoder.max_positions(), self.decoder.max_positions())


def _fill(args, **defaults) -> None:
    """:func:`~fairseq_plugins.models._config.fill_defaults` (explicit values, 0 included, are kept
    and reach the check in :meth:`RNNsearchModel.build_model`)."""
    fill_defaults(args, defaults)


@register_model_architecture("rnnsearch", "rnnsearch")
def base_architecture(args):
    """Paper sizes (Section 5.1): embeddings 1000, LSTMs 1000, pre-output 600 -- the defaults of
    :class:`RNNsearchConfig`; ``attention_dim`` defaults to ``decoder_hidden_size``."""
    default = RNNsearchConfig()
    _fill(args, **{k: getattr(default, k) for k in _RNN_KEYS if k != "attention_dim"})
    _fill(args, attention_dim=safe_getattr(args, "decoder_hidden_size"))


@register_model_architecture("rnnsearch", "rnnsearch_small")
def rnnsearch_small(args):
    """CPU preset for Multi30k (see README): embeddings / LSTMs / attention 256, pre-output 256."""
    _fill(args, encoder_embed_dim=256, encoder_hidden_size=256, decoder_embed_dim=256, decoder_hidden_size=256,
          attention_dim=256, decoder_out_embed_dim=256, dropout=0.3)
    base_architecture(args)
