"""Word-level attention analysis (ReLA Section 5.2: "we obtain the word-level attention weights by
merging its subword-level counterparts following Zenkel et al. (2019)"): the ``@@`` word rule, a
hand example where subword and word sparsity / null rate differ by known amounts, causal decoder
self-attention, the renormalisation of distributions, exact invariance without ``@@`` pieces,
agreement with a from-scratch loop implementation on a real capture, and the refusals.  The CLI
end to end with ``--attention-level word`` is in tests/test_analysis.py (its trained fixture)."""

import json
import os
import subprocess
import sys

import pytest
import torch
from fairseq.data import Dictionary

from fairseq_plugins.analysis import metrics as M
from fairseq_plugins.analysis.capture import (AttentionCapture, CapturedAttention, bpe_word_ids,
                                              check_attention_level, check_bpe_symbols, word_level_records)
from fairseq_plugins.analysis.report import AttentionStats, analyze_dataset
from helpers import build, toy_batch, toy_dictionary, toy_task

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# ---------------------------------------------------------------------------------------------
# an independent reference: groups and means by explicit loops (no merge_subwords, no bpe_word_ids)
# ---------------------------------------------------------------------------------------------
def reference_groups(pieces):
    """Positions of each word: a piece ending in '@@' continues into the next one, '</s>' / '<s>'
    are words of their own, None (padding) belongs to none."""
    groups, cont = [], False
    for pos, p in enumerate(pieces):
        if p is None:
            cont = False
            continue
        special = p in ("</s>", "<s>")
        if cont and not special:
            groups[-1].append(pos)
        else:
            groups.append([pos])
        cont = not special and p.endswith("@@")
    return groups


def reference_word_level(w, valid, rows, cols, renormalise=False):
    """``w`` (H, T, S) one sentence, ``valid`` (T, S) bool; ``rows`` / ``cols`` word groups.
    Returns word weights (H, I, J) float64 (mean over row pieces of the mean over column pieces,
    invalid pairs counted as 0) and word validity (I, J) (any pair valid)."""
    H = w.size(0)
    W = torch.zeros(H, len(rows), len(cols), dtype=torch.float64)
    V = torch.zeros(len(rows), len(cols), dtype=torch.bool)
    for i, R in enumerate(rows):
        for j, C in enumerate(cols):
            for h in range(H):
                tot = 0.0
                for t in R:
                    for s in C:
                        if valid[t, s]:
                            tot += float(w[h, t, s])
                W[h, i, j] = tot / (len(R) * len(C))
            V[i, j] = any(bool(valid[t, s]) for t in R for s in C)
    if renormalise and any(len(C) > 1 for C in cols):
        W = W / W.sum(-1, keepdim=True)
    return W, V


def reference_rates(W, V):
    """Per head: (zeros, valid cells, null rows, valid rows) of one sentence's word attention."""
    zeros = [int(((W[h] == 0) & V).sum()) for h in range(W.size(0))]
    live_rows = V.any(-1)
    null = [int((live_rows & ((W[h] == 0) | ~V).all(-1)).sum()) for h in range(W.size(0))]
    return zeros, int(V.sum()), null, int(live_rows.sum())


# ---------------------------------------------------------------------------------------------
# the @@ word rule
# ---------------------------------------------------------------------------------------------
def test_bpe_word_ids_follow_the_continuation_marker():
    assert bpe_word_ids([None, "Fahr@@", "rad", "fährt", "</s>"], ["</s>"]) == ([-1, 0, 0, 1, 2], 3)
    # </s> is a word of its own, also after a dangling @@ piece; padding breaks a word; <unk> ends one
    assert bpe_word_ids(["</s>", "a@@", "</s>", "b"], ["</s>"]) == ([0, 1, 2, 3], 4)
    assert bpe_word_ids(["a@@", None, "b"]) == ([0, -1, 1], 2)
    assert bpe_word_ids(["a@@", "<unk>", "c"]) == ([0, 0, 1], 2)
    assert bpe_word_ids(["a@@", "b@@", "c", "d"]) == ([0, 0, 0, 1], 2)
    assert bpe_word_ids([]) == ([], 0)


# ---------------------------------------------------------------------------------------------
# hand example: two source words of two pieces each, one target word of two pieces
# ---------------------------------------------------------------------------------------------
def _dictionary(symbols):
    d = Dictionary()
    for s in symbols:
        d.add_symbol(s)
    return d


D = _dictionary(["Fahr@@", "rad", "Sch@@", "nee", "bi@@", "ke", "a", "b", "c"])
PAD = D.pad()


def _hand_sample():
    # source (left-padded): <pad> Fahr@@ rad Sch@@ nee </s> -> words [-, 0, 0, 1, 1, 2]
    # target input (right-padded): </s> bi@@ ke <pad>          -> words [0, 1, 1, -]
    src = torch.tensor([[PAD, D.index("Fahr@@"), D.index("rad"), D.index("Sch@@"), D.index("nee"), D.eos()]])
    prev = torch.tensor([[D.eos(), D.index("bi@@"), D.index("ke"), PAD]])
    return {"net_input": {"src_tokens": src, "prev_output_tokens": prev}}


def _cross_mask():
    mask = torch.zeros(1, 1, 4, 6, dtype=torch.bool)
    mask[..., 0] = True  # padded key
    mask[..., 3, :] = True  # padded query
    return mask


def test_hand_example_word_level_sparsity_and_null_rate_differ_as_computed():
    w = torch.full((1, 2, 4, 6), 9.0)  # garbage under the mask must not matter
    # head 0: </s> row attends Fahr@@ and </s>; "bi@@" is null, "ke" attends "rad"
    w[0, 0, :3, 1:] = torch.tensor([[0.4, 0.0, 0.0, 0.0, 0.6],
                                    [0.0, 0.0, 0.0, 0.0, 0.0],
                                    [0.0, 0.8, 0.0, 0.0, 0.0]])
    # head 1: both pieces of "bike" null
    w[0, 1, :3, 1:] = torch.tensor([[0.0, 0.0, 0.0, 0.0, 1.0],
                                    [0.0, 0.0, 0.0, 0.0, 0.0],
                                    [0.0, 0.0, 0.0, 0.0, 0.0]])
    rec = {("cross", 0): CapturedAttention(w, _cross_mask(), False)}
    word = word_level_records(rec, _hand_sample(), D, D, PAD)[("cross", 0)]
    # subword: 15 valid pairs; head 0 has 12 zeros and 1 null row of 3, head 1 14 zeros and 2 null rows
    assert M.sparsity_rate(w, _cross_mask()).tolist() == pytest.approx([12 / 15, 14 / 15])
    assert M.null_rate(w, _cross_mask()).tolist() == pytest.approx([1 / 3, 2 / 3])
    # word (rows and columns averaged): head 0 </s> -> [(0.4+0)/2, 0, 0.6]; bike -> mean of rows
    # (0 and [0, 0.8, 0, 0]) -> [(0+0.4)/2, 0, 0]: 3 zeros of 6, no null row (a null piece beside a live one)
    # head 1: </s> -> [0, 0, 1]; bike -> all 0: 5 zeros of 6, 1 null row of 2 (both pieces null)
    assert M.sparsity_rate(word.weights, word.mask).tolist() == pytest.approx([3 / 6, 5 / 6])
    assert M.null_rate(word.weights, word.mask).tolist() == pytest.approx([0.0, 1 / 2])
    # layout: word i at its first piece's position (rows 0, 1; columns 1, 3, 5); the rest masked, weight 0
    valid = ~word.mask[0, 0]
    assert valid.nonzero().tolist() == [[r, c] for r in (0, 1) for c in (1, 3, 5)]
    torch.testing.assert_close(word.weights[0, 0][valid].view(2, 3), torch.tensor([[0.2, 0.0, 0.6], [0.2, 0.0, 0.0]]))
    torch.testing.assert_close(word.weights[0, 1][valid].view(2, 3), torch.tensor([[0.0, 0.0, 1.0], [0.0, 0.0, 0.0]]))
    assert float(word.weights[~word.mask.expand_as(word.weights)].abs().sum()) > 0
    assert float(word.weights[word.mask.expand_as(word.weights)].abs().sum()) == 0.0


def test_distributions_are_renormalised_after_averaging_key_pieces():
    """A softmax-type row stays a distribution over words: averaged key pieces, then / row sum."""
    w = torch.zeros(1, 1, 4, 6)
    w[0, 0, :3, 1:] = torch.tensor([[0.4, 0.1, 0.0, 0.0, 0.5],
                                    [0.2, 0.2, 0.2, 0.2, 0.2],
                                    [0.0, 0.0, 0.5, 0.5, 0.0]])
    rec = {("cross", 0): CapturedAttention(w, _cross_mask(), True)}
    word = word_level_records(rec, _hand_sample(), D, D, PAD)[("cross", 0)]
    valid = ~word.mask[0, 0]
    got = word.weights[0, 0][valid].view(2, 3)
    # </s>: [0.25, 0, 0.5] / 0.75; bike: mean([0.2, 0.2, 0.2], [0, 0.5, 0]) = [0.1, 0.35, 0.1] / 0.55
    torch.testing.assert_close(got, torch.tensor([[1 / 3, 0.0, 2 / 3], [0.1 / 0.55, 0.35 / 0.55, 0.1 / 0.55]]))
    torch.testing.assert_close(got.sum(-1), torch.ones(2))
    # the same weights as a ReLU-type function keep their averaged magnitudes
    raw = word_level_records({("cross", 0): CapturedAttention(w, _cross_mask(), False)}, _hand_sample(), D, D, PAD)
    torch.testing.assert_close(raw[("cross", 0)].weights[0, 0][valid].view(2, 3),
                               torch.tensor([[0.25, 0.0, 0.5], [0.1, 0.35, 0.1]]))


def test_causal_decoder_self_attention_merges_both_axes_on_the_target_side():
    # decoder input </s> a bi@@ ke -> words [0, 1, 2, 2]; keys the same positions, causal mask
    prev = torch.tensor([[D.eos(), D.index("a"), D.index("bi@@"), D.index("ke")]])
    sample = {"net_input": {"src_tokens": torch.tensor([[D.index("b"), D.eos()]]), "prev_output_tokens": prev}}
    mask = torch.triu(torch.ones(4, 4, dtype=torch.bool), 1)[None, None]
    w = torch.tensor([[1.0, 3.0, 3.0, 3.0],  # 3.0 and 5.0: garbage under the (causal) mask, must not count
                      [0.0, 0.0, 3.0, 3.0],
                      [0.2, 0.0, 0.8, 5.0],
                      [0.0, 0.1, 0.3, 0.6]])[None, None]
    word = word_level_records({("decoder", 0): CapturedAttention(w, mask, False)}, sample, D, D, PAD)[("decoder", 0)]
    valid = ~word.mask[0, 0]
    assert valid.nonzero().tolist() == [[0, 0], [1, 0], [1, 1], [2, 0], [2, 1], [2, 2]]  # no word sees a later one
    W = word.weights[0, 0]
    # bike's own cell: mean over rows "bi@@" (sees only itself: (0.8 + masked 0) / 2) and "ke" ((0.3 + 0.6) / 2)
    assert float(W[2, 2]) == pytest.approx((0.4 + 0.45) / 2)
    assert float(W[2, 0]) == pytest.approx((0.2 + 0.0) / 2) and float(W[2, 1]) == pytest.approx(0.05)
    assert float(W[1, 0]) == 0.0 and float(W[1, 1]) == 0.0  # "a" is null at both levels
    assert M.null_rate(word.weights, word.mask).tolist() == [pytest.approx(1 / 3)]
    assert M.null_rate(w, mask).tolist() == [pytest.approx(1 / 4)]
    # 10 valid subword pairs, 4 zeros (2 in "a", 1 in "bi@@", 1 in "ke"); 6 valid word pairs:
    # (0,0) = 1, (1,0) = (1,1) = 0, bike's three all > 0
    assert M.sparsity_rate(w, mask).tolist() == [pytest.approx(4 / 10)]
    assert M.sparsity_rate(word.weights, word.mask).tolist() == [pytest.approx(2 / 6)]


# ---------------------------------------------------------------------------------------------
# on a real capture: loop reference, exact invariance without @@ pieces
# ---------------------------------------------------------------------------------------------
def _bpe_dictionary():
    d = Dictionary()
    for i in range(40):
        d.add_symbol(f"w{i}@@" if i % 2 else f"w{i}")  # half the pieces continue into the next
    d.finalize(padding_factor=1)
    return d


def _capture(fn, dictionary, seed=0):
    torch.manual_seed(seed)
    task = toy_task(dictionary)
    model, task = build("attention_transformer", task=task, encoder_attention_fn=fn, decoder_attention_fn=fn,
                        cross_attention_fn=fn)
    model.eval()
    src, lens, prev = toy_batch(task, bsz=4, src_len=9, tgt_len=8, seed=seed)
    prev[3, 6:] = task.target_dictionary.pad()  # a right-padded target too
    sample = {"id": torch.arange(4), "net_input": {"src_tokens": src, "src_lengths": lens, "prev_output_tokens": prev}}
    with AttentionCapture(model, task.target_dictionary.pad()) as cap:
        rec = cap.run(sample)
    return task, sample, rec


@pytest.mark.parametrize("fn", ["relu", "softmax"])
def test_word_level_records_equal_a_loop_reference_on_a_real_capture(fn):
    task, sample, rec = _capture(fn, _bpe_dictionary())
    d, pad = task.source_dictionary, task.source_dictionary.pad()
    word = word_level_records(rec, sample, d, d, pad)
    net = sample["net_input"]
    side = {"src": net["src_tokens"], "tgt": net["prev_output_tokens"]}
    axes = {"encoder": ("src", "src"), "decoder": ("tgt", "tgt"), "cross": ("tgt", "src")}
    merged_something = False
    for key, r in rec.items():
        rs, cs = axes[key[0]]
        for b in range(4):
            rp = [None if t == pad else d[t] for t in side[rs][b].tolist()]
            cp = [None if t == pad else d[t] for t in side[cs][b].tolist()]
            rows, cols = reference_groups(rp), reference_groups(cp)
            merged_something |= len(rows) < sum(p is not None for p in rp)
            W, V = reference_word_level(r.weights[b], ~r.mask[b, 0], rows, cols, renormalise=r.is_distribution)
            ri = torch.tensor([g[0] for g in rows])[:, None]
            ci = torch.tensor([g[0] for g in cols])[None, :]
            got_w, got_m = word[key].weights[b][:, ri, ci], word[key].mask[b, 0][ri, ci]
            assert torch.equal(~got_m, V), (key, b)
            torch.testing.assert_close(got_w.double() * V, W * V, rtol=1e-6, atol=1e-7)
            assert torch.equal(got_w == 0, W == 0)  # exact zeros stay exact
            others = torch.ones_like(word[key].mask[b, 0])
            others[ri, ci] = False
            assert bool(word[key].mask[b, 0][others].all())  # every non-first piece / padding is masked
    assert merged_something


@pytest.mark.parametrize("fn", ["relu", "softmax", "sparsemax"])
def test_without_bpe_pieces_word_level_equals_subword_level_exactly(fn):
    task, sample, rec = _capture(fn, toy_dictionary())  # w0..w39: no @@ piece
    d = task.source_dictionary
    word = word_level_records(rec, sample, d, d, d.pad())
    for key, r in rec.items():
        assert torch.equal(word[key].mask, r.mask.expand_as(word[key].mask)), key
        assert torch.equal(word[key].weights, r.weights.masked_fill(r.mask, 0.0)), key
    a, b = AttentionStats(taus=(1.0, 0.5)), AttentionStats(taus=(1.0, 0.5))
    a.update(rec)
    b.update(word)
    assert a.summary() == b.summary()  # every metric, exactly


def test_word_level_changes_the_metrics_when_there_are_pieces():
    """The converse of the invariance: with @@ pieces the word-level summary differs (the tests
    above would pass for a merge that did nothing)."""
    task, sample, rec = _capture("relu", _bpe_dictionary())
    d = task.source_dictionary
    a, b = AttentionStats(taus=(1.0,)), AttentionStats(taus=(1.0,))
    a.update(rec)
    b.update(word_level_records(rec, sample, d, d, d.pad()))
    sa, sb = a.summary(), b.summary()
    for kind in ("encoder", "decoder", "cross"):
        assert sa[kind]["sparsity"] != sb[kind]["sparsity"], kind


def test_analyze_dataset_at_word_level_equals_stats_of_merged_batches():
    from fairseq_plugins.analysis.capture import iter_batches, pairs_dataset

    torch.manual_seed(0)
    task = toy_task(_bpe_dictionary())
    model, task = build("attention_transformer", task=task, encoder_attention_fn="relu", decoder_attention_fn="relu",
                        cross_attention_fn="relu")
    model.eval()
    d = task.source_dictionary
    g = torch.Generator().manual_seed(1)
    def sentence(n):
        return torch.cat([torch.randint(d.nspecial, len(d), (n,), generator=g), torch.tensor([d.eos()])])

    src, tgt = [sentence(n) for n in (3, 6, 4)], [sentence(n) for n in (5, 2, 4)]
    ds = pairs_dataset(task, src, tgt)
    word, _ = analyze_dataset(model, task, ds, taus=(1.0,), level="word")
    sub, _ = analyze_dataset(model, task, ds, taus=(1.0,))
    ref = AttentionStats(taus=(1.0,))
    with AttentionCapture(model, d.pad()) as cap:
        for sample in iter_batches(task, ds):
            ref.update(word_level_records(cap.run(sample), sample, d, d, d.pad()))
    assert word == ref.summary() and word != sub


# ---------------------------------------------------------------------------------------------
# refusals
# ---------------------------------------------------------------------------------------------
def test_unknown_levels_and_sentencepiece_vocabularies_are_refused_before_any_work():
    with pytest.raises(ValueError, match="valid choices: subword, word"):
        check_attention_level("words")
    check_bpe_symbols(["the", "ca@@", "t"], "x")  # subword-nmt
    check_bpe_symbols(["the", "cat"], "x")  # no pieces at all: word level == subword level
    with pytest.raises(ValueError, match=r"dict\.de\.txt: .*SentencePiece.*valid levels here: subword"):
        check_bpe_symbols(["\u2581the", "\u2581cat", "s"], "dict.de.txt")

    class Boom:  # a model that must not be run
        def __getattr__(self, name):
            raise AssertionError("the model was used")

    task = toy_task()
    with pytest.raises(ValueError, match="valid choices: subword, word"):
        analyze_dataset(Boom(), task, None, level="Word")
    spm = Dictionary()
    for s in ("\u2581a", "\u2581b", "c"):
        spm.add_symbol(s)
    with pytest.raises(ValueError, match="source dictionary: .*SentencePiece"):
        analyze_dataset(Boom(), toy_task(spm), None, level="word")


def _cli(*args):
    env = {k: v for k, v in os.environ.items() if not k.startswith("TORCH_FORCE")}
    return subprocess.run([sys.executable, "-m", "fairseq_plugins.analysis.cli", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True)


def test_cli_refuses_the_word_level_where_it_cannot_apply(tmp_path):
    ck = tmp_path / "ck.pt"
    ck.write_bytes(b"not loaded")
    data = tmp_path / "bin"
    data.mkdir()
    out = tmp_path / "o"
    # an unknown level: argparse names the choices
    r = _cli("--checkpoint", str(ck), "--data", str(data), "--out", str(out), "--attention-level", "words")
    assert r.returncode == 2 and "--attention-level: invalid choice: 'words'" in r.stderr
    assert "choose from" in r.stderr and "subword" in r.stderr.split("choose from")[1]
    # --replot only re-draws figures: the level of its JSON cannot change
    js = tmp_path / "analysis.json"
    js.write_text(json.dumps({"models": {}}))
    r = _cli("--replot", str(js), "--attention-level", "word")
    assert r.returncode == 2 and "--attention-level: --replot only re-draws the figures" in r.stderr
    # the AER alone: word-level by its own merge
    r = _cli("--aer-checkpoint", str(ck), "--data", str(data), "--out", str(out), "--attention-level", "word")
    assert r.returncode == 1 and "--attention-level word applies to the --checkpoint analyses" in r.stderr
    # a SentencePiece vocabulary, refused before the checkpoint is read
    (data / "dict.de.txt").write_text("\u2581Ein 10\n\u2581Mann 5\nn 3\n", encoding="utf-8")
    r = _cli("--checkpoint", str(ck), "--data", str(data), "--out", str(out), "--attention-level", "word")
    assert r.returncode == 1 and "--attention-level word: " in r.stderr and "dict.de.txt" in r.stderr
    assert "SentencePiece" in r.stderr
    assert not out.exists()
