"""Dataset-level attention analyses: streamed metrics, AER, hallucination test, corpus ranking.

Shape legend: B batch, H heads, T query length, S key length, L layers.  Everything runs one
batch at a time through :class:`~fairseq_plugins.analysis.capture.AttentionCapture`; what is
kept across batches is per-head sums and counts (and, for heatmaps, the weights of the few
chosen sentences).

Level (``level``, one of :data:`~fairseq_plugins.analysis.capture.ATTENTION_LEVELS`): the metrics,
the hallucination test and the null-rate ranking run on the subword positions the model has
(``"subword"``, the default) or on words (``"word"``: every captured batch is merged by
:func:`~fairseq_plugins.analysis.capture.word_level_records` first, as ReLA Section 5.2 does
"following Zenkel et al. (2019)").  The AER merges subwords on its own
(:func:`alignment_aer`); heatmaps always show the subword weights.
"""

import random
from typing import Dict, List, Optional, Sequence, Tuple

import torch

from . import metrics as M
from .alignment import AERCounts, diagonal_links, layer_head_links, new_counts, read_talp, read_tokenized, \
    segment_words, summarize_counts, target_rows
from .capture import ATTENTION_KINDS, AttentionCapture, check_attention_level, check_bpe_symbols, dataset_pairs, \
    iter_batches, pairs_dataset, word_level_records

__all__ = ["AttentionStats", "analyze_dataset", "cross_null_by_sentence", "hallucination_test",
           "rank_pairs", "alignment_aer", "seed_mean_aer", "seed_mean_analysis", "seed_mean", "seed_sd",
           "DEFAULT_TOP_P", "DEFAULT_TAUS"]

#: top-p percentages reported (ReLUFormer Figs 2 and 4 use small p; sentences here are short)
DEFAULT_TOP_P = (1.0, 5.0, 10.0, 20.0, 50.0)
#: temperatures of ReLA Table 6 (used for functions whose weights are not distributions)
DEFAULT_TAUS = (1.0, 0.5, 0.25, 0.1)


def _defined(num: torch.Tensor, den: torch.Tensor):
    """``num / den`` as a float (or a list of floats for ``(H,)`` tensors), ``None`` where ``den`` is
    0: a ratio over nothing is undefined, not 0 (e.g. the entropy of a head without a non-null row)."""
    if num.dim() == 0:
        return float(num / den) if float(den) > 0 else None
    return [float(n / d) if float(d) > 0 else None for n, d in zip(num, den)]


class AttentionStats:
    """Running sums of every metric of :mod:`~fairseq_plugins.analysis.metrics`, per
    ``(kind, layer)`` and head.

    Args:
        taus: temperatures for the JS conversion of non-distributions (ReLA Table 6); ``1`` is
            always added (the head diversity of ReLA Fig. 5 is at ``tau = 1``).
        top_ps: top-p percentages.

    Raises:
        ValueError: a ``tau`` that is not a finite number > 0, or a top-p outside (0, 100].
    """

    def __init__(self, taus: Sequence[float] = DEFAULT_TAUS, top_ps: Sequence[float] = DEFAULT_TOP_P):
        import math

        bad = [t for t in taus if not (math.isfinite(t) and t > 0)]
        if bad:
            raise ValueError(f"tau must be a finite number > 0, got {bad[0]!r}")
        bad = [p for p in top_ps if not (math.isfinite(p) and 0 < p <= 100)]
        if bad:
            raise ValueError(f"top-p must be a percentage in (0, 100], got {bad[0]!r}")
        self.taus = tuple(dict.fromkeys((1.0, *(float(t) for t in taus))))  # tau = 1 first, no repeats
        self.top_ps = tuple(top_ps)
        self.sums: Dict[Tuple[str, int], Dict[str, List[torch.Tensor]]] = {}
        self.is_distribution: Dict[str, bool] = {}

    def _add(self, key, name, terms):
        slot = self.sums.setdefault(key, {})
        if name in slot:
            slot[name][0] += terms[0]
            slot[name][1] += terms[1]
        else:
            slot[name] = [terms[0].clone(), terms[1].clone()]

    def update(self, records) -> None:
        """Add one batch of :meth:`AttentionCapture.run` records."""
        for key, rec in records.items():
            w, mask = rec.weights, rec.mask
            self.is_distribution[key[0]] = rec.is_distribution
            self._add(key, "sparsity", M.sparsity_terms(w, mask))
            self._add(key, "null", M.null_terms(w, mask))
            self._add(key, "entropy", M.entropy_terms(w, mask))
            self._add(key, "top_p", M.top_p_terms(w, mask, self.top_ps))
            taus = (1.0,) if rec.is_distribution else self.taus
            for tau in taus:
                self._add(key, f"js@{tau:g}", M.js_divergence_terms(w, mask, not rec.is_distribution, tau))

    def summary(self) -> dict:
        """``{kind: {metric: per-layer list, metric_per_head: [[per head] per layer]}}``.

        Layer values: sparsity and null rate are means over heads (ReLA Figs 3 and 6); entropy
        and top-p pool the rows of all heads; ``js`` is at ``tau = 1`` (the weights themselves for
        distributions), ``js_by_tau`` for every temperature of non-distributions.  A value with
        nothing to average is ``None`` (undefined), not 0: the entropy of a head that is null on
        every query (it has no distribution), or any metric of a layer without valid positions.
        """
        out = {}
        for kind in ATTENTION_KINDS:
            layers = sorted(i for k, i in self.sums if k == kind)
            if not layers:
                continue
            d = {"attention_is_distribution": self.is_distribution[kind]}
            rows = [self.sums[(kind, i)] for i in layers]
            for name, label in (("sparsity", "sparsity"), ("null", "null_rate")):
                per_head = [_defined(*r[name]) for r in rows]
                d[label + "_per_head"] = per_head
                d[label] = [None if None in h else sum(h) / len(h) for h in per_head]
            d["entropy_per_head"] = [_defined(*r["entropy"]) for r in rows]
            d["entropy"] = [_defined(r["entropy"][0].sum(), r["entropy"][1].sum()) for r in rows]
            d["top_p"] = {f"{p:g}": [_defined(r["top_p"][0][j].sum(), r["top_p"][1].sum()) for r in rows]
                          for j, p in enumerate(self.top_ps)}
            taus = (1.0,) if d["attention_is_distribution"] else self.taus
            by_tau = {f"{t:g}": [_defined(*r[f"js@{t:g}"]) for r in rows] for t in taus}
            d["js"] = by_tau["1"]  # ReLA Fig. 5: tau = 1 (always computed, see __init__)
            if not d["attention_is_distribution"]:
                d["js_by_tau"] = by_tau
            out[kind] = d
        return out


def _strings(dictionary, tokens: torch.Tensor) -> List[str]:
    return [dictionary[t] for t in tokens.tolist()]


def _check_level(task, level: str) -> str:
    """``level`` checked before any work: one of ``ATTENTION_LEVELS``, and for ``"word"`` task
    dictionaries the ``@@`` rule can read (:func:`~fairseq_plugins.analysis.capture.check_bpe_symbols`).

    Raises:
        ValueError: an unknown level or a SentencePiece vocabulary (named)."""
    check_attention_level(level)
    if level == "word":
        check_bpe_symbols(task.source_dictionary.symbols, "source dictionary")
        check_bpe_symbols(task.target_dictionary.symbols, "target dictionary")
    return level


def _at_level(records, sample, task, level: str):
    """``records`` of ``sample`` at ``level`` (word: :func:`word_level_records`)."""
    if level == "word":
        return word_level_records(records, sample, task.source_dictionary, task.target_dictionary,
                                  task.target_dictionary.pad())
    return records


@torch.no_grad()
def analyze_dataset(model, task, dataset, max_tokens: int = 4096, heatmap_ids: Sequence[int] = (),
                    taus=DEFAULT_TAUS, top_ps=DEFAULT_TOP_P, max_sentences: Optional[int] = None,
                    level: str = "subword"):
    """Stream ``dataset`` through the model (teacher forcing) and accumulate all metrics.

    Args:
        level: ``"subword"`` (default) or ``"word"`` (ReLA Section 5.2; see the module doc).

    Returns:
        ``(summary, heatmaps)``: :meth:`AttentionStats.summary` of the metrics at ``level`` and,
        for each id in ``heatmap_ids``, ``{"id", "src", "prev" (token strings), "weights": {kind:
        [(H, T, S) per layer]}}`` (subword weights, padding removed).

    Raises:
        ValueError: ``level`` not one of ``subword``, ``word`` (named), or ``"word"`` with a
            SentencePiece vocabulary -- before any batch runs.
    """
    _check_level(task, level)
    pad = task.target_dictionary.pad()
    stats = AttentionStats(taus, top_ps)
    want = set(int(i) for i in heatmap_ids)
    heat = {}
    with AttentionCapture(model, pad) as cap:
        for sample in iter_batches(task, dataset, max_tokens, max_sentences):
            rec = cap.run(sample)
            stats.update(_at_level(rec, sample, task, level))
            ids = sample["id"].tolist()
            for b, idx in enumerate(ids):
                if idx not in want:
                    continue
                net = sample["net_input"]
                sv = net["src_tokens"][b].ne(pad)
                tv = net["prev_output_tokens"][b].ne(pad)
                entry = {"id": idx, "src": _strings(task.source_dictionary, net["src_tokens"][b][sv]),
                         "prev": _strings(task.target_dictionary, net["prev_output_tokens"][b][tv]),
                         "weights": {}}
                for (kind, layer), r in sorted(rec.items()):
                    q, k = (sv, sv) if kind == "encoder" else (tv, tv) if kind == "decoder" else (tv, sv)
                    entry["weights"].setdefault(kind, []).append(r.weights[b][:, q][:, :, k].clone())
                heat[idx] = entry
            del rec
    return stats.summary(), [heat[i] for i in heatmap_ids if i in heat]


@torch.no_grad()
def cross_null_by_sentence(model, task, dataset, max_tokens: int = 4096, level: str = "subword") -> torch.Tensor:
    """Per-pair null rate of the cross-attention averaged over layers ``(N,)`` (index order).

    For each layer, :func:`~fairseq_plugins.analysis.metrics.sentence_null_rate` (null rows over
    all heads and target positions, or target words at ``level="word"``); then the mean over
    layers (ReLA Section 5.2).

    Raises:
        ValueError: an unknown ``level`` (named), before any batch runs."""
    _check_level(task, level)
    pad = task.target_dictionary.pad()
    out = torch.full((len(dataset),), float("nan"), dtype=torch.float64)
    with AttentionCapture(model, pad, kinds=("cross",)) as cap:
        for sample in iter_batches(task, dataset, max_tokens):
            rec = _at_level(cap.run(sample), sample, task, level)
            rates = torch.stack([M.sentence_null_rate(r.weights, r.mask) for r in rec.values()])  # (L, B)
            out[sample["id"]] = rates.mean(dim=0)
    return out


@torch.no_grad()
def cross_null_by_layer(model, task, dataset, max_tokens: int = 4096, level: str = "subword") -> List[float]:
    """Null rate of the cross-attention per layer (mean over heads), over ``dataset``, at ``level``.

    Raises:
        ValueError: an unknown ``level`` (named), before any batch runs."""
    _check_level(task, level)
    pad = task.target_dictionary.pad()
    acc = {}
    with AttentionCapture(model, pad, kinds=("cross",)) as cap:
        for sample in iter_batches(task, dataset, max_tokens):
            for (_, layer), r in _at_level(cap.run(sample), sample, task, level).items():
                n, d = M.null_terms(r.weights, r.mask)
                if layer in acc:
                    acc[layer][0] += n
                    acc[layer][1] += d
                else:
                    acc[layer] = [n, d]
    return [float((acc[i][0] / acc[i][1].clamp_min(1)).mean()) for i in sorted(acc)]


def hallucination_test(model, task, dataset, seed: int = 1, max_tokens: int = 4096, level: str = "subword") -> dict:
    """Cross-attention null rate per layer on ``dataset`` and on the same sources with the
    references randomly shuffled (ReLA Figure 6, dashed curves: hallucinated pairs), at ``level``.

    Returns:
        ``{"reference": [per layer], "shuffled": [per layer], "seed": seed,
        "fixed_points": number of pairs the permutation left in place}``.

    Raises:
        ValueError: an unknown ``level`` (named), before any batch runs.
    """
    _check_level(task, level)
    src, tgt = dataset_pairs(dataset)
    perm = list(range(len(tgt)))
    random.Random(seed).shuffle(perm)
    shuffled = pairs_dataset(task, src, [tgt[j] for j in perm])
    return {
        "reference": cross_null_by_layer(model, task, dataset, max_tokens, level),
        "shuffled": cross_null_by_layer(model, task, shuffled, max_tokens, level),
        "seed": seed,
        "fixed_points": sum(i == j for i, j in enumerate(perm)),
    }


def rank_pairs(scores: torch.Tensor) -> List[int]:
    """Indices sorted by ascending score (lowest null rate first = most trusted), NaN last,
    ties by index."""
    s = scores.tolist()
    return sorted(range(len(s)), key=lambda i: (s[i] != s[i], s[i] if s[i] == s[i] else 0.0, i))


@torch.no_grad()
def alignment_aer(model, task, gold_dir: str, bpe_codes: Optional[str], src_lang: str = "de",
                  tgt_lang: str = "en", cased: bool = True, max_tokens: int = 4096,
                  limit: Optional[int] = None, source_merge: str = "sum", escape: bool = False,
                  aggressive_dash_splits: bool = False) -> dict:
    """AER of the cross-attention of a ``src_lang``->``tgt_lang`` model on the RWTH De-En gold set
    (ReLA §5.2, Table 5 / Figure 4; AER of Och & Ney 2000).

    The gold set aligns German and English words (``alignment.talp``: German index first); a
    De->En model reads the German side as its source, an En->De model -- what ReLA's analysis
    measures, its WMT14 En-De models -- the English side, and the gold links are turned around so
    that every link is ``(source word, target word)`` of the model.  Each target word is linked to
    the source word with the largest (subword-merged) cross-attention weight.

    Args:
        gold_dir: directory with ``test[.uc].{de,en}[.gz]`` and ``alignment.talp[.gz]``.
        bpe_codes: the BPE codes of the model's data-prep (None: no BPE).
        src_lang, tgt_lang: the model's direction, ``de``->``en`` or ``en``->``de``.
        cased: use the original-case files ``test.uc.*`` (the Multi30k data-prep keeps case).
        limit: only the first ``limit`` pairs (tests).
        source_merge: how a source word's subword columns merge, ``sum`` or ``mean`` (Zenkel et al.
            2019), :func:`~fairseq_plugins.analysis.alignment.merge_subwords`.
        escape, aggressive_dash_splits: the Moses options of the models' prep, applied to the gold
            words (:func:`~fairseq_plugins.analysis.alignment.segment_words`; default: the Multi30k
            prep's, neither).

    Returns:
        :func:`~fairseq_plugins.analysis.alignment.summarize_counts` for normal and shifted
        attention, plus ``n_pairs``, ``direction`` (``"de-en"`` / ``"en-de"``) and ``unk_rate``
        (fraction of pieces the dictionary maps to ``<unk>``, a measure of the domain/vocabulary
        mismatch).

    Raises:
        ValueError: the gold files disagree in length, the direction is neither de->en nor
            en->de, ``source_merge`` is unknown (the valid ones are named), or ``limit`` < 1.
    """
    import os

    from .alignment import check_source_merge

    check_source_merge(source_merge)  # before any work
    if limit is not None and limit < 1:  # a slice [:-N] would silently drop the last N pairs
        raise ValueError(f"limit must be a positive number of gold pairs, got {limit!r}")

    if (src_lang, tgt_lang) not in (("de", "en"), ("en", "de")):
        raise ValueError(f"the RWTH gold set aligns German and English: the model must translate de->en or en->de; "
                         f"got {src_lang}->{tgt_lang}")
    suffix = ".uc" if cased else ""
    src_words = read_tokenized(os.path.join(gold_dir, f"test{suffix}.{src_lang}"))
    tgt_words = read_tokenized(os.path.join(gold_dir, f"test{suffix}.{tgt_lang}"))
    gold = read_talp(os.path.join(gold_dir, "alignment.talp"))  # (German word, English word) links
    if src_lang == "en":  # the model's source is the English side: (English, German) links
        gold = [({(e, g) for g, e in sure}, {(e, g) for g, e in poss}) for sure, poss in gold]
    if not (len(src_words) == len(tgt_words) == len(gold)):
        raise ValueError(f"gold files disagree: {len(src_words)} {src_lang}, {len(tgt_words)} {tgt_lang}, "
                         f"{len(gold)} alignments")
    if limit is not None:
        src_words, tgt_words, gold = src_words[:limit], tgt_words[:limit], gold[:limit]
    bpe = None
    if bpe_codes:
        from subword_nmt.apply_bpe import BPE

        with open(bpe_codes, encoding="utf-8") as f:
            bpe = BPE(f)
    from sacremoses import MosesTokenizer

    toks = {src_lang: MosesTokenizer(lang=src_lang), tgt_lang: MosesTokenizer(lang=tgt_lang)}
    sd, td = task.source_dictionary, task.target_dictionary
    srcs, tgts, sids, tids = [], [], [], []
    n_unk = n_pieces = 0
    for sw, tw in zip(src_words, tgt_words):
        sp, si = segment_words(sw, src_lang, bpe, toks[src_lang], escape, aggressive_dash_splits)
        tp, ti = segment_words(tw, tgt_lang, bpe, toks[tgt_lang], escape, aggressive_dash_splits)
        s = sd.encode_line(" ".join(sp), add_if_not_exist=False, append_eos=True).long()
        t = td.encode_line(" ".join(tp), add_if_not_exist=False, append_eos=True).long()
        n_unk += int(s[:-1].eq(sd.unk()).sum() + t[:-1].eq(td.unk()).sum())
        n_pieces += len(sp) + len(tp)
        srcs.append(s)
        tgts.append(t)
        sids.append(si + [-1])  # eos belongs to no word
        tids.append(ti)
    dataset = pairs_dataset(task, srcs, tgts)
    pad = td.pad()
    counts = None
    with AttentionCapture(model, pad, kinds=("cross",)) as cap:
        for sample in iter_batches(task, dataset, max_tokens):
            rec = cap.run(sample)
            layers = sorted(rec)
            if counts is None:
                counts = new_counts(len(layers), rec[layers[0]].weights.size(1))
            net = sample["net_input"]
            for b, idx in enumerate(sample["id"].tolist()):
                sv = net["src_tokens"][b].ne(pad)
                n_t = len(tids[idx])
                sure, poss = gold[idx]
                for li, key in enumerate(layers):
                    w = rec[key].weights[b][:, :, sv]  # (H, T, S_b)
                    for mode in ("normal", "shifted"):
                        rows = w[:, target_rows(n_t, mode == "shifted")]  # (H, n_t, S_b)
                        heads, layer_links = layer_head_links(
                            rows, tids[idx], sids[idx], len(tgt_words[idx]), len(src_words[idx]), source_merge)
                        for h, links in enumerate(heads):
                            counts[mode]["heads"][li][h].add(links, sure, poss)
                        counts[mode]["layer"][li].add(layer_links, sure, poss)
    res = summarize_counts(counts)
    diag = AERCounts()
    for sw, tw, (sure, poss) in zip(src_words, tgt_words, gold):
        diag.add(diagonal_links(len(sw), len(tw)), sure, poss)
    res.update(n_pairs=len(gold), direction=f"{src_lang}-{tgt_lang}", unk_rate=n_unk / max(n_pieces, 1), cased=cased,
               diagonal_aer=100.0 * diag.aer, source_merge=source_merge, moses_escape=escape,
               moses_dash_splits=aggressive_dash_splits,
               bpe_codes=os.path.abspath(bpe_codes) if bpe_codes else None)
    return res


#: what every seed of one configuration shares in :func:`alignment_aer`'s result (the gold set, its
#: reading and the data-prep): seeds that differ here are not seeds of one model
_SEED_SHARED = ("n_pairs", "direction", "cased", "source_merge", "moses_escape", "moses_dash_splits", "bpe_codes",
                "diagonal_aer")


def seed_mean_aer(results: Sequence[dict]) -> dict:
    """The AER of one configuration trained with several seeds, as ReLA §5.2 reports Table 5 /
    Figure 4 ("We train each model three times with different random seeds on WMT14 En-De and
    report the average results"): every number of :func:`alignment_aer` averaged over the seeds.

    Per mode (normal / shifted): ``layer`` (the layer attention's AER per layer), ``best_head``
    (per layer, each seed's own best head), ``AoL`` and ``AoH`` are means over the seeds (so AoL /
    AoH are also the means of the seeds' AoL / AoH); ``AoL_sd`` / ``AoH_sd`` are their sample
    standard deviations across seeds.  ``per_head`` and ``best_head_index`` are left out (head h of
    one seed has nothing to do with head h of another); they stay in each seed's result.
    ``unk_rate`` is the mean; the shared keys (gold pairs, direction, case, subword merge, Moses
    options, BPE codes, diagonal AER) are kept; ``seeds`` holds the per-seed results as given.

    Raises:
        ValueError: fewer than two results, or results that differ in a shared key or in their
            number of layers or heads (named), before anything is averaged.
    """
    import statistics

    if len(results) < 2:
        raise ValueError(f"a seed mean needs at least two results, got {len(results)}")
    first = results[0]
    for k in _SEED_SHARED:
        vals = [r.get(k) for r in results]
        if any(v != vals[0] for v in vals):
            raise ValueError(f"the seeds differ in {k!r} ({vals}): they are not seeds of one configuration "
                             "scored the same way")
    for mode in ("normal", "shifted"):
        shapes = [[len(l) for l in r[mode]["per_head"]] for r in results]
        if any(sh != shapes[0] for sh in shapes):
            raise ValueError(f"the seeds differ in their layers / heads per layer ({shapes})")

    def mean(xs):
        return sum(xs) / len(xs)

    out = {k: first.get(k) for k in _SEED_SHARED}
    for mode in ("normal", "shifted"):
        ms = [r[mode] for r in results]
        out[mode] = {
            "layer": [mean(v) for v in zip(*(m["layer"] for m in ms))],
            "best_head": [mean(v) for v in zip(*(m["best_head"] for m in ms))],
            "AoL": mean([m["AoL"] for m in ms]),
            "AoH": mean([m["AoH"] for m in ms]),
            "AoL_sd": statistics.stdev(m["AoL"] for m in ms),
            "AoH_sd": statistics.stdev(m["AoH"] for m in ms),
        }
    out["unk_rate"] = mean([r["unk_rate"] for r in results])
    out["seeds"] = list(results)
    return out


def _seed_tree(trees: Sequence, leaf, where: str):
    """``leaf`` applied to the seeds' values at every leaf of equally shaped nested dicts / lists
    ``trees`` (one per seed); a leaf is a number or ``None``.

    Raises:
        ValueError: the seeds' trees differ in their keys or list lengths (``where`` names the field)."""
    first = trees[0]
    if isinstance(first, dict):
        if any(not isinstance(t, dict) or list(t) != list(first) for t in trees):
            raise ValueError(f"the seeds differ in the keys of {where} ({[sorted(t) for t in trees]})")
        return {k: _seed_tree([t[k] for t in trees], leaf, f"{where}.{k}") for k in first}
    if isinstance(first, list):
        if any(not isinstance(t, list) or len(t) != len(first) for t in trees):
            raise ValueError(f"the seeds differ in the length of {where} (layers / heads): "
                             f"{[len(t) if isinstance(t, list) else t for t in trees]}")
        return [_seed_tree([t[i] for t in trees], leaf, f"{where}[{i}]") for i in range(len(first))]
    return leaf(list(trees))


def seed_mean(xs: List[Optional[float]]) -> Optional[float]:
    """The mean of the seeds' values; ``None`` (undefined) when one seed's value is."""
    return None if any(x is None for x in xs) else sum(xs) / len(xs)


def seed_sd(xs: List[Optional[float]]) -> Optional[float]:
    """The sample standard deviation (n - 1) of the seeds' values; ``None`` when one is undefined."""
    import statistics

    return None if any(x is None for x in xs) else statistics.stdev(xs)


#: keys of an analysis section that every seed must share exactly (copied, not averaged): the
#: hallucination test's shuffle seed and its number of pairs left in place
_ANALYSIS_SHARED = ("seed", "fixed_points")
#: the suffix of per-head values (head h of one seed is not head h of another: not averaged)
PER_HEAD = "_per_head"


def _seed_mean_section(sections: Sequence[dict], where: str) -> dict:
    """One dict of per-seed numbers (``metrics[kind]``, ``hallucination``) as their seed mean:
    for each averaged key ``k``: ``k`` (mean), ``k_seed_sd`` (sample sd) and ``k_per_seed``
    (the seeds' values, in seed order); booleans and :data:`_ANALYSIS_SHARED` keys are copied
    (and must agree); ``*_per_head`` keys are left out.

    Raises:
        ValueError: the seeds differ in a copied key, in their keys or in the length of a list."""
    first = sections[0]
    if any(list(s) != list(first) for s in sections):
        raise ValueError(f"the seeds differ in the keys of {where} ({[sorted(s) for s in sections]})")
    out = {}
    for k, v in first.items():
        vals = [s[k] for s in sections]
        if k.endswith(PER_HEAD):
            continue
        if isinstance(v, (bool, str)) or k in _ANALYSIS_SHARED:
            if any(x != v for x in vals):
                raise ValueError(f"the seeds differ in {where}.{k} ({vals}): they are not seeds of one model "
                                 "analysed the same way")
            out[k] = v
            continue
        out[k] = _seed_tree(vals, seed_mean, f"{where}.{k}")
        out[k + "_seed_sd"] = _seed_tree(vals, seed_sd, f"{where}.{k}")
        out[k + "_per_seed"] = vals
    return out


def seed_mean_analysis(entries: Sequence[dict]) -> dict:
    """The ``--checkpoint`` analysis of one configuration trained with several seeds, as ReLA §5.2
    reports all its analyses ("We train each model three times with different random seeds on
    WMT14 En-De and report the average results"): every number averaged over the seeds.

    Args:
        entries: per seed, the report entry of a single-seed analysis (``fairseq-attention-analysis``'s
            ``models[label]``): ``info``, ``metrics`` (:meth:`AttentionStats.summary`: ``{kind:
            {metric: [per layer]}}``, ``top_p`` / ``js_by_tau`` ``{p or tau: [per layer]}``) and,
            when run, ``ffn_anisotropy`` (``{"encoder"|"decoder": [per layer]}``), ``hallucination``
            (:func:`hallucination_test`) and ``on_hypotheses`` (a ``metrics`` dict).

    Returns:
        ``{"info", "metrics", ["ffn_anisotropy", "ffn_anisotropy_seed_sd", "ffn_anisotropy_per_seed"],
        ["hallucination"], ["on_hypotheses"], "seeds"}``.  Every number keeps its key and shape and
        is the mean over the seeds (same units: rates in [0, 1], JS and entropy in nats); beside each
        averaged key ``k`` are ``k_seed_sd`` (the seeds' sample standard deviation, n - 1, same shape)
        and ``k_per_seed`` (the seeds' values, in the order given).  A value undefined (``None``)
        for one seed is ``None`` in the mean and sd.  ``attention_is_distribution``, the
        hallucination test's shuffle ``seed`` and ``fixed_points`` are shared and copied.  The
        per-head values (``*_per_head``) are left out: head h of one seed's model has nothing to do
        with head h of another's (heads are not aligned between independently trained models, and
        a mean over a permuted index would blur them); they stay in each seed's entry, and
        ``seeds`` holds the entries as given.  The per-layer values are head-order-free (means
        over heads, pooled rows, the JS divergence across heads), so they average across seeds.

    Raises:
        ValueError: fewer than two entries, or entries that differ in their attention kinds,
            layers, top-p percentages, temperatures, analyses run, ``attention_is_distribution`` or
            the hallucination test's shuffle (named), before anything is averaged.
    """
    if len(entries) < 2:
        raise ValueError(f"a seed mean needs at least two analyses, got {len(entries)}")
    sections = ("metrics", "ffn_anisotropy", "hallucination", "on_hypotheses")
    ran = [[k for k in sections if k in e] for e in entries]
    if any(r != ran[0] for r in ran):
        raise ValueError(f"the seeds were not analysed the same way ({ran})")
    out = {"info": entries[0].get("info")}
    for name in ran[0]:
        vals = [e[name] for e in entries]
        if name in ("metrics", "on_hypotheses"):  # {kind: {metric: ...}}
            if any(list(v) != list(vals[0]) for v in vals):
                raise ValueError(f"the seeds differ in their attention kinds ({[list(v) for v in vals]})")
            out[name] = {kind: _seed_mean_section([v[kind] for v in vals], f"{name}.{kind}") for kind in vals[0]}
        elif name == "hallucination":
            out[name] = _seed_mean_section(vals, name)
        else:  # ffn_anisotropy: {"encoder": [per layer], "decoder": [per layer]}
            out[name] = _seed_tree(vals, seed_mean, name)
            out[name + "_seed_sd"] = _seed_tree(vals, seed_sd, name)
            out[name + "_per_seed"] = vals
    out["seeds"] = list(entries)
    return out
