"""Truecasing, separate (per-language) BPE and character vocabularies in the data-prep pipeline
(mt_pipeline.prep.sentence), as E-ATT preprocesses its corpora (Wan et al. 2022, App. A: Moses
truecasers learned on the train set; joint BPE for En-Vi and En-De, separate BPE for Zh-En) and as
Flexible Attention's character models (§5.4), and the scoring side that undoes the truecasing
(scripts/extract_hypotheses.py --detruecase, picked by scripts/evaluate.sh).

Everything runs on real files of ../shared/data in local-directory mode: a local directory in the
corpus's layout whose optional training split is a real dev set (IWSLT15 En-Vi: tst2012's first
1,000 pairs as train; WMT14 En-De: newstest2012 as train), with the real dev/test files beside it.
Expected casings are read from the learned truecaser models, never hard-coded.
"""

import gzip
import json
import os
import shutil
import subprocess
import sys

import pytest
import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = os.path.normpath(os.path.join(ROOT, "..", "shared", "data"))
from mt_pipeline import experiment  # noqa: E402
from mt_pipeline import hypotheses as extract_hypotheses  # noqa: E402
from mt_pipeline.prep import spec as prep_spec, tools as prep_tools  # noqa: E402
from mt_pipeline.prep.textio import read_lines  # noqa: E402

pytestmark = pytest.mark.skipif(not os.path.isdir(DATA), reason=f"real data folder {DATA} not present")
ENV = dict(os.environ, PYTHON=sys.executable, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
BIN = os.path.dirname(sys.executable)


def prepare(corpus, *args):
    r = subprocess.run(["bash", os.path.join(ROOT, "data-prep", corpus, "prepare.sh"), "--workers", "1", *args],
                       env=ENV, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return r.stdout


def lines(path):
    return read_lines(str(path))


def model(path):
    """The truecaser model file as sacremoses reads it: {'best': {lower: form}, 'known': ...}."""
    from sacremoses import MosesTruecaser

    return MosesTruecaser(load_from=str(path)).model


def mtimes(out, names):
    return {n: (out / n).stat().st_mtime_ns for n in names}


@pytest.fixture(scope="module")
def iwslt(tmp_path_factory):
    """IWSLT15 En-Vi (E-ATT's default recipe: truecasing) run with --bpe separate on a local
    directory: train = the first 1,000 pairs of tst2012, valid = tst2012, test = tst2013."""
    base = tmp_path_factory.mktemp("iwslt15")
    loc = base / "local" / "stanford"
    loc.mkdir(parents=True)
    src = os.path.join(DATA, "iwslt15_en_vi", "stanford")
    for lang in ("en", "vi"):
        for f in (f"tst2012.{lang}.gz", f"tst2013.{lang}.gz"):
            shutil.copy(os.path.join(src, f), loc / f)
        head = gzip.decompress(open(os.path.join(src, f"tst2012.{lang}.gz"), "rb").read()).split(b"\n")[:1000]
        if lang == "vi":  # one pair empty on one side, as the Stanford train is reported to have
            head[9] = b""
        (loc / f"train.{lang}.gz").write_bytes(gzip.compress(b"\n".join(head) + b"\n"))
    out = base / "out"
    args = ("--local-dir", str(base / "local"), "--out", str(out), "--bpe", "separate", "--bpe-merges", "500")
    return out, args, prepare("iwslt15_en_vi", *args)


def test_a_training_pair_empty_on_one_side_is_dropped_not_refused(iwslt):
    """The recipe's clean step (length 1..10^6, any ratio) drops only the pair whose Vietnamese side
    is empty: raw/ keeps all 1,000 pairs, tok/train the 999 others, in order."""
    out, _, log = iwslt
    raw = {lang: lines(out / "raw" / f"train.{lang}") for lang in ("en", "vi")}
    tok = {lang: lines(out / "tok" / f"train.{lang}") for lang in ("en", "vi")}
    assert len(raw["en"]) == len(raw["vi"]) == 1000 and raw["vi"][9] == ""
    assert len(tok["en"]) == len(tok["vi"]) == 999 and "kept 999 of 1000 training pairs" in log
    assert tok["en"][9] == " ".join(raw["en"][10].split()) and tok["en"][8] == " ".join(raw["en"][8].split())


def test_truecaser_is_learned_on_train_and_applied_to_every_split(iwslt):
    out, _, log = iwslt
    assert "NOT complete" not in log  # the optional local train split was found
    train_words = {lang: {w.lower() for l in lines(out / "tok" / f"train.{lang}") for w in l.split()}
                   for lang in ("en", "vi")}
    for lang in ("en", "vi"):
        best = model(out / "tc" / f"truecase-model.{lang}")["best"]
        assert best and set(best) <= train_words[lang]  # learned from train only
        for split in ("train", "valid", "test"):
            tok, tc = lines(out / "tok" / f"{split}.{lang}"), lines(out / "tc" / f"{split}.{lang}")
            assert len(tok) == len(tc)
            assert all(a.lower().split() == b.lower().split() for a, b in zip(tok, tc))  # only the case changes
        # words that are not in the model (test-only words) keep their case
        unseen = [(w, i, j) for i, l in enumerate(lines(out / "tok" / f"test.{lang}")) for j, w in enumerate(l.split())
                  if w.lower() not in best and w.lower() != w.upper()]
        tc_test = [l.split() for l in lines(out / "tc" / f"test.{lang}")]
        assert unseen and all(tc_test[i][j] == w for w, i, j in unseen)

    # sentence-initial words, by what the model learned from the non-initial occurrences in train:
    # a common word (best form lower-case) is lower-cased, a name / "I" (best form capitalised) keeps it
    best = model(out / "tc" / "truecase-model.en")["best"]
    tok, tc = lines(out / "tok" / "test.en"), lines(out / "tc" / "test.en")
    common = [i for i, l in enumerate(tok) if l and l[0].isupper() and best.get(l.split()[0].lower()) == l.split()[0].lower()]
    proper = [i for i, l in enumerate(tok) if l and best.get(l.split()[0].lower(), "x")[0].isupper()]
    assert len(common) > 100 and len(proper) > 5
    assert all(tc[i].split()[0] == tok[i].split()[0].lower() for i in common)
    assert all(tc[i].split()[0] == best[tok[i].split()[0].lower()] and tc[i][0].isupper() for i in proper)


def test_separate_bpe_has_one_model_and_one_dictionary_per_language(iwslt):
    out, _, _ = iwslt
    from subword_nmt.apply_bpe import BPE

    assert not (out / "bpe" / "codes").exists()
    codes = {lang: (out / "bpe" / f"codes.{lang}").read_text(encoding="utf-8") for lang in ("en", "vi")}
    assert codes["en"] != codes["vi"]
    for lang, other in (("en", "vi"), ("vi", "en")):
        tc, bpe = lines(out / "tc" / f"test.{lang}"), lines(out / "bpe" / f"test.{lang}")
        assert [b.replace("@@ ", "") for b in bpe] == tc  # lossless on the truecased text
        own = BPE(open(out / "bpe" / f"codes.{lang}", encoding="utf-8"))
        foreign = BPE(open(out / "bpe" / f"codes.{other}", encoding="utf-8"))
        assert [own.process_line(l) for l in tc] == bpe  # segmented with its own language's codes
        assert [foreign.process_line(l) for l in tc] != bpe
    # fairseq-preprocess without --joined-dictionary: each dictionary holds its own side's symbols
    dicts = {lang: [l.split()[0] for l in lines(out / "bin" / f"dict.{lang}.txt")
                    if not l.startswith("madeupword")]  # fairseq's padding to a multiple of 8
             for lang in ("en", "vi")}
    for lang in ("en", "vi"):
        train_syms = {w for l in lines(out / "bpe" / f"train.{lang}") for w in l.split()}
        assert set(dicts[lang]) == train_syms
    assert set(dicts["vi"]) - set(dicts["en"]) and set(dicts["en"]) - set(dicts["vi"])
    assert "joined_dictionary=false" in (out / "bin" / ".done").read_text().splitlines()


def test_rerun_is_idempotent_and_dry_run_prints_the_new_steps(iwslt):
    out, args, _ = iwslt
    files = ["tc/truecase-model.en", "tc/test.vi", "bpe/codes.vi", "bpe/test.en", "bin/dict.en.txt", "bin/dict.vi.txt"]
    before = mtimes(out, files)
    log = prepare("iwslt15_en_vi", *args)
    for stage in ("raw", "tok", "tc", "bpe", "bin"):
        assert f"{stage}: up to date, skipping" in log
    dry = prepare("iwslt15_en_vi", *args, "--dry-run")
    for step in ("would learn a Moses truecaser on tok/train.en -> tc/truecase-model.en",
                 "would learn a Moses truecaser on tok/train.vi -> tc/truecase-model.vi",
                 "would truecase tok/test.vi -> tc/test.vi (tc/truecase-model.vi)",
                 "would learn 500 merges on tc/train.en only -> bpe/codes.en (separate BPE)",
                 "would learn 500 merges on tc/train.vi only -> bpe/codes.vi (separate BPE)",
                 "would apply bpe/codes.vi to tc/{train,valid,test}.vi"):
        assert step in dry, step
    binarize = [l for l in dry.splitlines() if "would binarize" in l]
    assert binarize and "--joined-dictionary" not in binarize[0]
    assert mtimes(out, files) == before  # neither the re-run nor the dry run rewrote anything


def test_switching_truecasing_off_and_back_to_joint_bpe(iwslt, tmp_path):
    """--no-truecase --bpe joint on a copy of the prep: tc/ goes (scripts/evaluate.sh would otherwise
    detruecase), BPE is learned on the cased tok/, one codes file, one joined dictionary."""
    out = tmp_path / "out"
    shutil.copytree(iwslt[0], out, symlinks=True)
    args = [a if a != str(iwslt[0]) else str(out) for a in iwslt[1]]
    args[args.index("separate")] = "joint"
    log = prepare("iwslt15_en_vi", *args, "--no-truecase")
    assert "raw: up to date" in log and "tok: up to date" in log
    assert not (out / "tc").exists()
    assert sorted(p.name for p in (out / "bpe").glob("codes*")) == ["codes"]
    assert [b.replace("@@ ", "") for b in lines(out / "bpe" / "test.en")] == lines(out / "tok" / "test.en")
    assert (out / "bin" / "dict.en.txt").read_bytes() == (out / "bin" / "dict.vi.txt").read_bytes()


def _dict_words(path):
    """The symbols of a fairseq dict.LANG.txt, fairseq's padding symbols (madeupwordNNNN) left out."""
    return [l.split()[0] for l in lines(path) if not l.startswith("madeupword")]


def test_word_vocabularies_replace_bpe_and_map_the_rest_to_unk(iwslt, tmp_path):
    """--word-vocab en=300 vi=200 on a copy of the prep (Flexible Attention §5.1's word vocabularies,
    "OOV words are replaced with a 'UNK' symbol"): no BPE, separate dictionaries holding each side's
    most frequent truecased training words (fairseq's 4 specials counted), every other test word
    binarized as <unk>; --dictionary joined gives one dictionary of one size."""
    from collections import Counter

    from fairseq.data import Dictionary, data_utils

    out = tmp_path / "out"
    shutil.copytree(iwslt[0], out, symlinks=True)
    args = ["--local-dir", iwslt[1][1], "--out", str(out)]
    log = prepare("iwslt15_en_vi", *args, "--word-vocab", "en=300", "vi=200")
    assert "word vocabularies (en 300, vi 200 words, others -> <unk>); separate dictionaries" in log
    assert "bpe: none (word vocabularies; bin/ reads tc/)" in log and "tc: up to date" in log
    binarize = [l for l in log.splitlines() if "binarize:" in l][0]
    assert "/tc/train" in binarize and "--nwordssrc 300 --nwordstgt 200" in binarize and "--joined" not in binarize
    for lang, n in (("en", 300), ("vi", 200)):
        words = _dict_words(out / "bin" / f"dict.{lang}.txt")
        assert len(words) == n - 4  # <s> <pad> </s> <unk> are not in the file
        counts = Counter(w for l in lines(out / "tc" / f"train.{lang}") for w in l.split())
        assert set(words) <= set(counts) and min(counts[w] for w in words) >= max(
            c for w, c in counts.items() if w not in set(words))  # the most frequent words
        d = Dictionary.load(str(out / "bin" / f"dict.{lang}.txt"))
        ds = data_utils.load_indexed_dataset(str(out / "bin" / f"test.en-vi.{lang}"), d)
        ref = lines(out / "tc" / f"test.{lang}")
        assert len(ds) == len(ref)
        oov = 0
        for i in range(0, len(ref), 97):
            got = [d[t] for t in ds[i][:-1].tolist()]  # without </s>
            want = [w if w in set(words) else "<unk>" for w in ref[i].split()]
            assert got == want
            oov += want.count("<unk>")
        assert oov > 0
    stamp = (out / "bin" / ".done").read_text().splitlines()
    assert "joined_dictionary=false" in stamp and "words=[300,200]" in stamp
    log = prepare("iwslt15_en_vi", *args, "--word-vocab", "250", "--dictionary", "joined")
    assert "bin: up to date" not in log and "--joined-dictionary --nwordssrc 250 --nwordstgt 250" in log
    assert (out / "bin" / "dict.en.txt").read_bytes() == (out / "bin" / "dict.vi.txt").read_bytes()
    assert len(_dict_words(out / "bin" / "dict.en.txt")) == 250 - 4


def test_joint_bpe_with_separate_dictionaries(iwslt, tmp_path):
    """--bpe joint --dictionary separate (the released ReLA code's vocabularies: bzhangGo/zero's
    vocab.zero.en / vocab.zero.de over one 32K BPE): one codes file, a dictionary per language
    holding exactly its own side's BPE symbols."""
    out = tmp_path / "out"
    shutil.copytree(iwslt[0], out, symlinks=True)
    args = [a if a != str(iwslt[0]) else str(out) for a in iwslt[1]]
    args[args.index("separate")] = "joint"
    log = prepare("iwslt15_en_vi", *args, "--dictionary", "separate")
    assert "joint BPE; separate dictionaries" in log
    assert sorted(p.name for p in (out / "bpe").glob("codes*")) == ["codes"]
    for lang in ("en", "vi"):
        assert set(_dict_words(out / "bin" / f"dict.{lang}.txt")) == {
            w for l in lines(out / "bpe" / f"train.{lang}") for w in l.split()}
    assert "joined_dictionary=false" in (out / "bin" / ".done").read_text().splitlines()


def test_detruecasing_restores_the_references_case(iwslt, tmp_path):
    """extract_hypotheses --detruecase on truecased "hypotheses" (the truecased test references):
    the truecased text is kept as is, and every one-sentence line whose truecasing only lower-cased
    the first letter of the first word gets the tokenized reference back exactly."""
    out = iwslt[0]
    tc, tok = lines(out / "tc" / "test.vi"), lines(out / "tok" / "test.vi")
    log = tmp_path / "gen.log"
    log.write_text("".join(f"H-{i}\t-0.5\t{h}\n" for i, h in enumerate(tc)), encoding="utf-8")
    o = {k: tmp_path / f"hyp.{k}" for k in ("tok", "detok", "tc")}
    assert extract_hypotheses.main([str(log), "--expected", str(len(tc)), "--lang", "vi", "--tok-out", str(o["tok"]),
                                    "--detok-out", str(o["detok"]), "--detruecase", "--truecased-out", str(o["tc"])]) == 0
    assert lines(o["tc"]) == tc
    hyp = lines(o["tok"])
    # (detruecase.perl also upper-cases after a sentence end inside the line: . : ? ! -- left out here)
    first_only = [i for i in range(len(tc)) if tc[i] != tok[i] and tc[i].split()[1:] == tok[i].split()[1:]
                  and tok[i][:1] == tc[i][:1].upper() and tok[i][1:] == tc[i][1:]
                  and not set(tok[i].split()[:-1]) & {".", ":", "?", "!"}]
    assert len(first_only) > 100
    assert all(hyp[i] == tok[i] for i in first_only)
    assert all(h[:1] == h[:1].upper() for h in hyp)  # every sentence starts upper-case (or with no letter)
    assert lines(o["detok"]) == extract_hypotheses.detokenize(hyp, "vi")


def _train_and_evaluate(out, tmp_path, extra=()):
    """Train a tiny Transformer a few updates on the prep ``out`` (en -> vi), run scripts/evaluate.sh
    on its test set, and return the result record ``test.json``."""
    ck = tmp_path / "ck"
    env = dict(ENV, PATH=BIN + os.pathsep + os.environ.get("PATH", ""))
    train = [os.path.join(BIN, "fairseq-train"), str(out / "bin"), "--arch", "transformer", "--encoder-layers", "1",
             "--decoder-layers", "1", "--encoder-embed-dim", "32", "--decoder-embed-dim", "32",
             "--encoder-ffn-embed-dim", "64", "--decoder-ffn-embed-dim", "64", "--encoder-attention-heads", "2",
             "--decoder-attention-heads", "2", "--source-lang", "en", "--target-lang", "vi", "--optimizer", "adam",
             "--lr", "0.005", "--max-tokens", "4000", "--max-update", "20", "--save-dir", str(ck), "--cpu",
             "--no-epoch-checkpoints", "--num-workers", "0", "--seed", "1", "--disable-validation", *extra]
    r = subprocess.run(train, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    r = subprocess.run(["bash", os.path.join(ROOT, "scripts", "evaluate.sh"), "--checkpoint", str(ck / "checkpoint_last.pt"),
                        "--data-bin", str(out / "bin"), "--prep-dir", str(out), "--src", "en", "--tgt", "vi",
                        "--subsets", "test", "--beam", "1", "--batch-size", "512",
                        "--extra", "--max-len-a 0 --max-len-b 6", "--out", str(tmp_path / "eval")],
                       env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    return json.load(open(tmp_path / "eval" / "test.json"))


def test_a_word_level_prep_trains_and_scores_with_unk(iwslt, tmp_path):
    """A word-vocabulary prep (Flexible's recipes) end to end: fairseq trains on its separate
    dictionaries (the target embedding tied to the softmax), generation emits <unk> for words outside
    the 150-word target vocabulary, and scripts/evaluate.sh scores the detruecased, detokenized
    hypotheses against the raw references, <unk> kept as a word (the paper: "OOV words are replaced
    with a 'UNK' symbol")."""
    out = tmp_path / "out"
    shutil.copytree(iwslt[0], out, symlinks=True)
    prepare("iwslt15_en_vi", "--local-dir", iwslt[1][1], "--out", str(out), "--word-vocab", "en=400", "vi=150")
    res = _train_and_evaluate(out, tmp_path, ("--share-decoder-input-output-embed",))
    assert res["n_hyp"] == 1268 and res["postprocess"] == "remove-bpe,detruecase,detokenize"
    tc, tok = lines(tmp_path / "eval" / "test.hyp.tc"), lines(tmp_path / "eval" / "test.hyp.tok")
    vocab = {l.split()[0] for l in lines(out / "bin" / "dict.vi.txt")} | {"<unk>"}
    assert all(w in vocab for h in tc for w in h.split())  # every output word is in the 150-word vocabulary
    assert sum(h.split().count("<unk>") for h in tok) > 0  # and <unk> survives the post-processing
    assert res["tok_ref"] == str(out / "tok" / "test.vi") and 0.0 <= res["bleu"] < 100.0


def test_evaluate_detruecases_a_truecased_prep(iwslt, tmp_path):
    """scripts/evaluate.sh on a model trained (a few updates) on the truecased prep: it finds
    tc/truecase-model.vi, keeps the truecased output (S.hyp.tc), scores the detruecased one and
    records the post-processing in S.json (what detruecasing does to real text: the test above)."""
    out = iwslt[0]
    res = _train_and_evaluate(out, tmp_path)
    assert res["postprocess"] == "remove-bpe,detruecase,detokenize" and res["n_hyp"] == 1268
    assert res["testset"] == "test"  # Multi30k's file names are for Multi30k preps only
    tc, hyp = lines(tmp_path / "eval" / "test.hyp.tc"), lines(tmp_path / "eval" / "test.hyp.tok")
    assert hyp == extract_hypotheses.detruecase(tc)
    # detruecasing did something on this output (sentence-initial words the truecaser lower-cased,
    # which the model also generates lower-case): some lines changed, and only in their case
    changed = [i for i in range(len(tc)) if hyp[i] != tc[i]]
    assert changed, "no hypothesis starts lower-case: detruecasing is not exercised"
    assert all(hyp[i].lower() == tc[i].lower() and hyp[i][:1] == tc[i][:1].upper() for i in changed)
    assert res["tok_hyp"] == str(tmp_path / "eval" / "test.hyp.tok") and res["tok_ref"] == str(out / "tok" / "test.vi")


def wmt14_local(tmp_path):
    """A WMT14 En-De local directory of real files: train = newstest2012, valid = newstest2013,
    test = newstest2014 (sgm)."""
    loc = tmp_path / "local"
    (loc / "plain").mkdir(parents=True)
    shutil.copytree(os.path.join(DATA, "wmt", "sgm"), loc / "sgm")
    for lang in ("en", "de"):
        shutil.copy(os.path.join(DATA, "wmt", "plain", f"newstest2013.de-en.{lang}.gz"), loc / "plain")
        shutil.copy(os.path.join(DATA, "wmt", "plain", f"newstest2012.de-en.{lang}.gz"),
                    loc / "plain" / f"train.de-en.{lang}.gz")
    return loc


def test_wmt14_eatt_variant_is_truecased_and_leaves_the_default_prep_cased(tmp_path):
    """wmt14_en_de is shared by ReLA, ReLUFormer and E-ATT: `--variant eatt` writes tc/, bpe/, bin/
    to <out>/eatt/ (raw/ and tok/ linked to the shared ones), the default recipe (cased) is
    untouched and reuses the same raw/ and tok/.  Train = newstest2012, valid = newstest2013,
    test = newstest2014 (sgm), all real."""
    loc = wmt14_local(tmp_path)
    out = tmp_path / "out"
    common = ("--local-dir", str(loc), "--out", str(out), "--bpe-merges", "1000")
    log = prepare("wmt14_en_de", *common, "--variant", "eatt")
    assert "variant eatt: E-ATT" in log and "truecase en, de; joint BPE" in log
    v = out / "eatt"
    assert os.readlink(v / "raw") == os.path.join("..", "raw") and os.readlink(v / "tok") == os.path.join("..", "tok")
    assert (v / "bin" / "dict.en.txt").read_bytes() == (v / "bin" / "dict.de.txt").read_bytes()  # joined
    assert not (out / "bpe").exists() and not (out / "bin").exists()
    log = prepare("wmt14_en_de", *common)
    assert "raw: up to date, skipping" in log and "tok: up to date, skipping" in log
    assert not (out / "tc").exists()
    cased = [b.replace("@@ ", "") for b in lines(out / "bpe" / "train.en")]
    truecased = [b.replace("@@ ", "") for b in lines(v / "bpe" / "train.en")]
    assert cased == lines(out / "tok" / "train.en") and truecased == lines(v / "tc" / "train.en")
    # German nouns: a sentence-initial noun keeps its capital (model), a function word loses it
    best = model(v / "tc" / "truecase-model.de")["best"]
    tok, tc = lines(out / "tok" / "test.de"), lines(v / "tc" / "test.de")
    first = [(t.split()[0], c.split()[0]) for t, c in zip(tok, tc) if t]
    assert any(c == best[t.lower()] and c[0].isupper() for t, c in first if t.lower() in best)
    assert any(c == t.lower() != t for t, c in first)
    # the E-ATT budget asks for this variant, and its prep dir is <out>/eatt
    budget = experiment.load_budget(os.path.join(ROOT, "configs", "eatt", "wmt14_en_de", "budget.yaml"))
    cmd = experiment.prep_cmd(budget)
    assert cmd[cmd.index("--variant") + 1] == "eatt"
    assert experiment.prep_dir(budget) == os.path.join(ROOT, "data-bin", "wmt14_en_de", "eatt")


def test_char_vocab_splits_into_characters_and_keeps_the_most_frequent(tmp_path):
    """A character vocabulary (recipe ``char_vocab``, here ``--char-vocab`` on WMT14 En-De's real
    newstests; ASPEC's ``char`` variant, Flexible §5.4): char/ holds every token split into its
    characters ("@@" removed gives tok/ back), each dictionary keeps exactly the N most frequent
    characters of its training side (counted here from tok/ itself), and the binarized test set
    holds <unk> exactly where a character is not kept -- nothing else."""
    from collections import Counter

    from fairseq.data import Dictionary, indexed_dataset

    loc = wmt14_local(tmp_path)
    out, n = tmp_path / "out", {"en": 40, "de": 50}
    log = prepare("wmt14_en_de", "--local-dir", str(loc), "--out", str(out), "--char-vocab", "en=40", "de=50")
    assert "characters (en 40, de 50 characters kept, others -> <unk>); separate dictionaries" in log
    assert not (out / "bpe").exists()
    for lang in ("en", "de"):
        tok = lines(out / "tok" / f"train.{lang}")
        assert [c.replace("@@ ", "") for c in lines(out / "char" / f"train.{lang}")] == tok
        freq = Counter(ch for t in tok for ch in t if not ch.isspace())
        top = {ch for ch, _ in sorted(freq.items(), key=lambda kv: (-kv[1], kv[0]))[:n[lang]]}
        d = Dictionary.load(str(out / "bin" / f"dict.{lang}.txt"))
        symbols = d.symbols[d.nspecial:]
        assert {s[:-2] if len(s) > 2 and s.endswith("@@") else s for s in symbols} == top
        assert len(symbols) == 2 * n[lang]  # each kept character inside and at the end of a word
        test = lines(out / "char" / f"test.{lang}")
        ds = indexed_dataset.MMapIndexedDataset(str(out / "bin" / f"test.en-de.{lang}"))
        unk = sum(int((ds[i] == d.unk()).sum()) for i in range(len(ds)))
        oov = sum(1 for t in test for s in t.split() if (s[:-2] if len(s) > 2 and s.endswith("@@") else s) not in top)
        assert unk == oov > 0 and len(ds) == len(test)
    with pytest.raises(AssertionError, match="has no BPE"):
        prepare("wmt14_en_de", "--local-dir", str(loc), "--out", str(tmp_path / "o2"), "--char-vocab", "40",
                "--bpe-merges", "100")


def test_eatt_corpus_recipes_follow_the_paper():
    """E-ATT App. A: every corpus truecased; 32K merges (the budgets' --bpe-merges); joint BPE for
    En-Vi and En-De, separate for Zh-En -- and the shared WMT14 default recipe stays cased."""
    for corpus, variant, joint in (("iwslt15_en_vi", None, True), ("wmt14_en_de", "eatt", True),
                                   ("wmt17_zh_en", None, False)):
        spec = prep_spec.load_spec(corpus)
        r = prep_spec.effective_recipe(spec, variant)
        assert prep_spec.truecase_langs(r, spec["langs"]) == spec["langs"]
        assert r.get("bpe_joint", True) is joint
        budget = yaml.safe_load(open(os.path.join(ROOT, "configs", "eatt", corpus, "budget.yaml")))
        assert budget["data"].get("variant") == variant
        merges = budget["data"].get("bpe-merges") or r["bpe_merges"]
        assert set(prep_spec.bpe_merges_for(dict(r, bpe_merges=merges), spec["langs"], joint).values()) == {32000}
    assert not prep_spec.truecase_langs(prep_spec.load_spec("wmt14_en_de")["recipe"], ["en", "de"])


def test_flexible_and_rela_vocabularies_follow_the_papers():
    """Flexible §5.1: word vocabularies (De-En 50K; En-Ja "80k and 40k", read as En 80K, Ja 40K), OOV
    -> UNK, no BPE -- so σ and the windows are in words -- and ASPEC's character variant for Tables
    2-3; ReLA (released code, bzhangGo/zero): separate source / target vocabularies over joint BPE,
    the target embedding tied to the softmax.  The budgets ask for exactly these preps."""
    for corpus, words in (("wmt15_de_en", {"de": 50000, "en": 50000}), ("aspec_en_ja", {"en": 80000, "ja": 40000})):
        spec = prep_spec.load_spec(corpus)
        r = prep_spec.effective_recipe(spec)
        assert prep_spec.word_vocab_for(r, spec["langs"]) == words and not prep_spec.joined_dictionary(r)
        for name in ("budget", "finetune"):
            budget = experiment.load_budget(os.path.join(ROOT, "configs", "flexible", corpus, f"{name}.yaml"))
            assert "--bpe-merges" not in experiment.prep_cmd(budget) and not budget["data"].get("variant")
    char = prep_spec.effective_recipe(prep_spec.load_spec("aspec_en_ja"), "char")
    assert prep_spec.word_vocab_for(char, ["en", "ja"]) is None  # §5.4: 100 English, 3,000 Japanese characters
    assert prep_spec.char_vocab_for(char, ["en", "ja"]) == {"en": 100, "ja": 3000}
    assert not prep_spec.joined_dictionary(char)
    for name in ("budget_char", "finetune_char"):
        budget = experiment.load_budget(os.path.join(ROOT, "configs", "flexible", "aspec_en_ja", f"{name}.yaml"))
        assert experiment.prep_dir(budget) == os.path.join(ROOT, "data-bin", "aspec_en_ja", "char")
    for corpus, variant in (("wmt14_en_de", "rela"), ("wmt14_en_fr", None), ("wmt16_ro_en", None),
                            ("wmt18_en_fi", None), ("wmt18_zh_en", None)):
        spec = prep_spec.load_spec(corpus)
        r = prep_spec.effective_recipe(spec, variant)
        assert r.get("bpe_joint", True) and not prep_spec.joined_dictionary(r), corpus
        budget = experiment.load_budget(os.path.join(ROOT, "configs", "rela", corpus, "budget.yaml"))
        assert budget["data"].get("variant") == variant
        assert budget["train"].get("share-decoder-input-output-embed") and not budget["train"].get("share-all-embeddings")
    # the shared WMT14 default (ReLUFormer) keeps its joined dictionary
    assert prep_spec.joined_dictionary(prep_spec.effective_recipe(prep_spec.load_spec("wmt14_en_de")))


def test_bad_options_name_the_valid_choices(tmp_path, monkeypatch):
    spec = prep_spec.load_spec("wmt14_en_de")
    with pytest.raises(SystemExit, match="valid: eatt"):
        prep_spec.effective_recipe(spec, "nope")
    with pytest.raises(SystemExit, match="a variant may only set"):
        prep_spec.effective_recipe(dict(spec, variants={"x": {"lowercase": True}}), "x")
    with pytest.raises(SystemExit, match="characters or words, not both"):
        prep_spec.char_vocab_for({"char_vocab": 100, "word_vocab": 500}, ["en", "de"])
    with pytest.raises(SystemExit, match="needs separate dictionaries"):
        prep_spec.char_vocab_for({"char_vocab": 100, "dictionary": "joined"}, ["en", "de"])
    with pytest.raises(SystemExit, match="exactly the languages"):
        prep_spec.char_vocab_for({"char_vocab": {"en": 100}}, ["en", "de"])
    # a CLI vocabulary replaces the recipe's other one
    aspec = prep_spec.load_spec("aspec_en_ja")
    assert prep_spec.effective_recipe(aspec, "char", word_vocab=500)["char_vocab"] is None
    assert prep_spec.effective_recipe(aspec, char_vocab=50)["word_vocab"] is None
    with pytest.raises(SystemExit, match="needs separate BPE"):
        prep_spec.bpe_merges_for({"bpe_merges": {"en": 1, "de": 2}}, ["en", "de"], joint=True)
    with pytest.raises(SystemExit, match="unknown dictionary 'shared'; valid: joined, separate"):
        prep_spec.effective_recipe(spec, dictionary="shared")
    with pytest.raises(SystemExit, match=r"word_vocab \{'en': 5\}: give sizes for exactly the languages"):
        prep_spec.word_vocab_for({"word_vocab": {"en": 5}}, ["en", "de"])
    with pytest.raises(SystemExit, match="word_vocab must be integers > 4"):
        prep_spec.word_vocab_for({"word_vocab": 4}, ["en", "de"])
    with pytest.raises(SystemExit, match="needs separate dictionaries"):
        prep_spec.word_vocab_for({"word_vocab": {"en": 50, "de": 60}, "dictionary": "joined"}, ["en", "de"])
    assert prep_spec.joined_dictionary({}) and not prep_spec.joined_dictionary({"bpe_joint": False})
    assert not prep_spec.joined_dictionary({"word_vocab": 50})
    assert prep_spec.joined_dictionary({"word_vocab": 50, "dictionary": "joined"})
    for bad, msg in ((["--word-vocab", "300", "--bpe-merges", "500"], "has no BPE: drop --bpe"),
                     (["--word-vocab", "en=3x"], "--word-vocab takes one N or LANG=N for each of en, de"),
                     (["--dictionary", "shared"], "argument --dictionary: invalid choice: 'shared'")):
        r = subprocess.run(["bash", os.path.join(ROOT, "data-prep", "wmt14_en_de", "prepare.sh"), "--dry-run", *bad,
                            "--out", str(tmp_path / "o")], env=ENV, capture_output=True, text=True, timeout=120)
        assert r.returncode != 0 and msg in r.stderr, r.stderr[-2000:]
    with pytest.raises(SystemExit, match="valid: true, false, or a list"):
        prep_spec.truecase_langs({"truecase": ["fr"]}, ["en", "de"])
    r = subprocess.run(["bash", os.path.join(ROOT, "data-prep", "wmt14_en_de", "prepare.sh"), "--dry-run", "--bpe",
                        "separate", "--bpe-codes", "x", "--out", str(tmp_path / "o")],
                       env=ENV, capture_output=True, text=True, timeout=120)
    assert r.returncode != 0 and "--bpe-codes en=FILE de=FILE" in r.stderr
    # a missing library names the package to install (a dry run warns, a real run stops)
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "sacremoses" else real(name, *a))
    with pytest.raises(SystemExit, match="Python module 'sacremoses' is missing; install it with: pip install sacremoses"):
        prep_tools.check_tool("truecase")
    warned = []
    prep_tools.check_tool("truecase", dry=True, log=warned.append)
    assert warned and "pip install sacremoses" in warned[0]
