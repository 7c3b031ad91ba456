"""Word alignment from cross-attention and its alignment error rate (AER).

Shape legend: T target subword positions (decoder steps), S source subword positions,
I target words, J source words.  Alignment links are ``(j, i)`` = (source word, target word),
0-based; the gold files are 1-based ``j-i`` (sure) / ``jpi`` (possible), source first.

Conventions (AER and the normal / shifted attention of ReLA Section 5.2, Figure 4, Table 5; the
subword merging and the hard alignment below are our choices, stated where they differ):

* AER (Och & Ney 2000): ``AER = 1 - (|A & S| + |A & P|) / (|A| + |S|)`` with hypothesis
  links ``A``, sure links ``S`` and possible links ``P``, ``S`` a subset of ``P``; counts are
  summed over the corpus before dividing.
* Subwords to words: attention mass *received* by a source word is the **sum** over its
  subwords (the row stays a distribution over source words), the attention of a target word is
  the **mean** over its subwords' rows -- the convention of Clark et al. 2019 ("What does BERT
  look at?", Section 2) for word-level attention maps.  Zenkel et al. 2019 average over
  subwords on both sides (``source_merge="mean"``, ``--aer-source-merge mean``); with the argmax
  alignment used here the source-side choice matters only when subword counts differ, but then it
  does: on the whole RWTH set one layer of a converged Multi30k En->De model moves by 4.5 AER
  points (results/analysis/aer_domain_check_mean.md).  Positions of no word (``eos``, padding) are
  dropped.
* Hard alignment: each target word is linked to the source word of highest word-level weight
  (as fairseq's ``utils.extract_hard_alignment``, ``eos`` excluded); a target word whose row is
  all zero (null attention) gets no link.
* Normal attention aligns target token ``y_t`` with the decoder step that *outputs* it (row
  ``t - 1`` of the weights, whose input is ``y_{t-1}``); shifted attention (``alpha[1:]``, Chen
  et al. 2020; Kobayashi et al. 2020) reads it from the step that *inputs* it (row ``t``).
"""

import gzip
import os
from typing import Dict, Iterable, List, Optional, Sequence, Set, Tuple

import torch

from ..options import check_choice

__all__ = [
    "read_talp", "aer", "AERCounts", "merge_subwords", "argmax_links", "target_rows",
    "segment_words", "read_tokenized", "layer_head_links", "new_counts", "summarize_counts",
    "diagonal_links", "SOURCE_MERGES", "check_source_merge",
]

Link = Tuple[int, int]


def _open(path):
    if not os.path.exists(path) and os.path.exists(path + ".gz"):
        path = path + ".gz"
    return gzip.open(path, "rt", encoding="utf-8") if path.endswith(".gz") else open(path, encoding="utf-8")


def _lines(f) -> List[str]:
    """Lines split on ``\n`` only (``str.splitlines`` also breaks at U+2028, U+0085, ..., which
    would shift every later pair; see mt_pipeline/prep/textio.py)."""
    text = f.read()
    lines = text.split("\n")
    return lines[:-1] if lines and lines[-1] == "" else lines


def read_tokenized(path: str) -> List[List[str]]:
    """Whitespace-tokenized lines of ``path`` (or ``path.gz``)."""
    with _open(path) as f:
        return [line.split() for line in _lines(f)]


def read_talp(path: str) -> List[Tuple[Set[Link], Set[Link]]]:
    """Gold links per sentence pair: ``[(sure, possible)]``, 0-based ``(src, tgt)``, with
    ``sure`` a subset of ``possible``.

    Format (RWTH / lilt alignment-scripts "talp"): 1-based ``j-i`` sure links and ``jpi``
    possible links, whitespace-separated, one line per pair.

    Raises:
        ValueError: a malformed link (the message names the line).
    """
    out = []
    with _open(path) as f:
        for n, line in enumerate(_lines(f), 1):
            sure, poss = set(), set()
            for tok in line.split():
                sep = "-" if "-" in tok else "p" if "p" in tok else None
                parts = tok.split(sep) if sep else []
                if len(parts) != 2 or not all(p.isdigit() and int(p) > 0 for p in parts):
                    raise ValueError(f"{path}:{n}: malformed link {tok!r} (expected J-I or JpI, 1-based)")
                link = (int(parts[0]) - 1, int(parts[1]) - 1)
                poss.add(link)
                if sep == "-":
                    sure.add(link)
            out.append((sure, poss))
    return out


class AERCounts:
    """Corpus counts ``|A|, |S|, |A & S|, |A & P|`` accumulated sentence by sentence."""

    def __init__(self):
        self.a = self.s = self.a_s = self.a_p = 0

    def add(self, hyp: Set[Link], sure: Set[Link], possible: Set[Link]) -> None:
        """Add one sentence's hypothesis links ``A`` against its gold ``S`` and ``P`` (``P`` is taken
        as ``possible | sure``, so ``S`` is a subset of it); links are 0-based ``(j, i)``."""
        possible = possible | sure
        self.a += len(hyp)
        self.s += len(sure)
        self.a_s += len(hyp & sure)
        self.a_p += len(hyp & possible)

    @property
    def aer(self) -> float:
        """``1 - (|A&S| + |A&P|) / (|A| + |S|)``; NaN when ``|A| + |S| = 0``."""
        d = self.a + self.s
        return 1.0 - (self.a_s + self.a_p) / d if d else float("nan")


def aer(hyps: Iterable[Set[Link]], gold: Iterable[Tuple[Set[Link], Set[Link]]]) -> float:
    """Corpus AER of hypothesis link sets against ``[(sure, possible)]`` (see :class:`AERCounts`)."""
    c = AERCounts()
    for h, (s, p) in zip(hyps, gold, strict=True):
        c.add(set(h), s, p)
    return c.aer


def diagonal_links(n_src: int, n_tgt: int) -> Set[Link]:
    """Model-free reference alignment: target word ``i`` -> source word ``round(i * J / I)``
    (clipped to ``J - 1``), i.e. the diagonal of the ``I x J`` grid.  Its AER tells how much of an
    attention-based AER is explained by word position alone (a common sanity baseline in the
    word-alignment literature, e.g. the "diagonal" prior of Dyer et al. 2013)."""
    if n_src <= 0:
        return set()
    return {(min(n_src - 1, round(i * n_src / n_tgt)), i) for i in range(n_tgt)}


def _assignment(word_ids: Sequence[int], n_words: int, mean: bool) -> torch.Tensor:
    """``(n_words, len(word_ids))`` matrix summing (or averaging) positions into words; ids < 0 dropped."""
    m = torch.zeros(n_words, len(word_ids), dtype=torch.float64)
    for pos, wid in enumerate(word_ids):
        if wid >= 0:
            if wid >= n_words:
                raise ValueError(f"word id {wid} >= number of words {n_words}")
            m[wid, pos] = 1.0
    if mean:
        m = m / m.sum(dim=1, keepdim=True).clamp_min(1.0)
    return m


#: how the columns of a source word's subwords are merged (:func:`merge_subwords`): ``sum`` (the
#: default: the row stays a distribution over words, Clark et al. 2019) or ``mean`` (Zenkel et al.
#: 2019: the average on both sides)
SOURCE_MERGES = ("sum", "mean")


def check_source_merge(source_merge: str) -> str:
    """``source_merge`` if it is one of :data:`SOURCE_MERGES`.

    Raises:
        ValueError: it is not (the message names the valid choices)."""
    return check_choice("--aer-source-merge", source_merge, SOURCE_MERGES)


def merge_subwords(attn: torch.Tensor, tgt_word_ids: Sequence[int], src_word_ids: Sequence[int],
                   n_tgt: Optional[int] = None, n_src: Optional[int] = None,
                   source_merge: str = "sum") -> torch.Tensor:
    """Subword attention ``(..., T, S)`` -> word attention ``(..., I, J)``.

    Row of target word ``i`` = mean of the rows of its subwords; column of source word ``j`` =
    sum (``source_merge="sum"``) or mean (``"mean"``, Zenkel et al. 2019) of the columns of its
    subwords.  ``tgt_word_ids[t]`` / ``src_word_ids[s]`` is the word of position ``t`` / ``s``, -1
    for positions of no word (``eos``, padding).

    Raises:
        ValueError: id lists do not match ``T`` / ``S``; ``source_merge`` not one of
            :data:`SOURCE_MERGES` (named).
    """
    check_source_merge(source_merge)
    T, S = attn.shape[-2:]
    if len(tgt_word_ids) != T or len(src_word_ids) != S:
        raise ValueError(f"word ids ({len(tgt_word_ids)}, {len(src_word_ids)}) do not match attention ({T}, {S})")
    n_tgt = n_tgt if n_tgt is not None else max(tgt_word_ids, default=-1) + 1
    n_src = n_src if n_src is not None else max(src_word_ids, default=-1) + 1
    at = _assignment(tgt_word_ids, n_tgt, mean=True)  # (I, T)
    as_ = _assignment(src_word_ids, n_src, mean=source_merge == "mean").t()  # (S, J)
    return (at @ attn.double() @ as_).to(attn.dtype)


def argmax_links(word_attn: torch.Tensor) -> Set[Link]:
    """Hard alignment ``{(j, i)}`` from word attention ``(I, J)``: target word ``i`` -> its argmax
    source word; rows with no positive weight get no link."""
    links = set()
    if word_attn.numel() == 0:
        return links
    best = word_attn.argmax(dim=-1)
    alive = (word_attn > 0).any(dim=-1)
    for i in range(word_attn.size(0)):
        if alive[i]:
            links.add((int(best[i]), i))
    return links


def target_rows(n_target_tokens: int, shifted: bool) -> slice:
    """Decoder rows aligned with the ``n`` target tokens ``y_1..y_n`` (``eos`` excluded), for
    teacher forcing on ``prev_output_tokens = (eos, y_1, ..., y_n)``: rows ``0..n-1`` (normal,
    the step that outputs ``y_t``) or ``1..n`` (shifted, ``alpha[1:]``: the step that inputs it)."""
    return slice(1, n_target_tokens + 1) if shifted else slice(0, n_target_tokens)


def segment_words(words: Sequence[str], lang: str, bpe=None, tokenizer=None, escape: bool = False,
                  aggressive_dash_splits: bool = False) -> Tuple[List[str], List[int]]:
    """Pieces of a gold-tokenized sentence as the model's data-prep would make them, and the
    gold word of each piece.

    Every gold word is passed through the data-prep's Moses tokenizer (sacremoses; by default as
    the Multi30k prep: ``escape=False``, no aggressive dash splitting, ``mt_pipeline.prep.tok``;
    the WMT / IWSLT recipes escape, the WMT ones split dashes) and then BPE (subword-nmt
    ``BPE.process_line``), so gold word boundaries are kept while the model sees the pieces it was
    trained on.

    Args:
        words: the gold sentence's tokens.
        lang: Moses language (``de``/``en``).
        bpe: a ``subword_nmt.apply_bpe.BPE`` or None (no BPE).
        tokenizer: a ``sacremoses.MosesTokenizer`` (built for ``lang`` if None).
        escape: tokenizer.perl's XML escaping (``"`` -> ``&quot;``, ...), as the models' prep.
        aggressive_dash_splits: tokenizer.perl's ``-a`` (``a-b`` -> ``a @-@ b``), as the models' prep.

    Returns:
        ``(pieces, word_ids)`` of equal length.
    """
    if tokenizer is None:
        from sacremoses import MosesTokenizer

        tokenizer = MosesTokenizer(lang=lang)
    pieces, ids = [], []
    for wi, word in enumerate(words):
        toks = tokenizer.tokenize(word, escape=escape, aggressive_dash_splits=aggressive_dash_splits,
                                  return_str=True).split()
        line = " ".join(toks) if toks else word
        sub = (bpe.process_line(line) if bpe is not None else line).split()
        pieces += sub
        ids += [wi] * len(sub)
    return pieces, ids


def layer_head_links(attn: torch.Tensor, tgt_word_ids: Sequence[int], src_word_ids: Sequence[int],
                     n_tgt: int, n_src: int, source_merge: str = "sum") -> Tuple[List[Set[Link]], Set[Link]]:
    """Links of every head and of the head average ("layer attention") from ``(H, T, S)``
    (subwords merged by :func:`merge_subwords` with ``source_merge``)."""
    word = merge_subwords(attn, tgt_word_ids, src_word_ids, n_tgt, n_src, source_merge)  # (H, I, J)
    heads = [argmax_links(word[h]) for h in range(word.size(0))]
    return heads, argmax_links(word.mean(dim=0))


def new_counts(n_layers: int, n_heads: int) -> Dict[str, Dict[str, List]]:
    """Empty ``{"normal"|"shifted": {"heads": [[AERCounts]*H]*L, "layer": [AERCounts]*L}}``."""
    return {mode: {"heads": [[AERCounts() for _ in range(n_heads)] for _ in range(n_layers)],
                   "layer": [AERCounts() for _ in range(n_layers)]} for mode in ("normal", "shifted")}


def summarize_counts(counts) -> dict:
    """AER tables from :func:`new_counts` counters: per layer the best head (and which), the
    layer attention, and the averages over layers AoH / AoL (ReLA Table 5), in percent.  A head
    whose AER is undefined (NaN: no link predicted and none gold) is never the best head unless
    every head of its layer is."""
    out = {}
    for mode, c in counts.items():
        per_head = [[h.aer * 100 for h in layer] for layer in c["heads"]]
        best = [min(range(len(l)), key=lambda h: (l[h] != l[h], l[h])) for l in per_head]  # NaN last
        layer = [x.aer * 100 for x in c["layer"]]
        out[mode] = {
            "per_head": per_head,
            "best_head": [l[b] for l, b in zip(per_head, best)],
            "best_head_index": best,
            "layer": layer,
            "AoH": sum(l[b] for l, b in zip(per_head, best)) / len(best),
            "AoL": sum(layer) / len(layer),
        }
    return out
