"""Issue 29: the tools are safe with a researcher's files -- nothing deletes or overwrites what it
did not write, and every input is checked before work starts.  Tiny data, seconds each; fairseq
is faked where the probe is about the pipeline, not the model."""

import argparse
import gzip
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys

import pytest

from mt_pipeline import evaluate
from mt_pipeline.atomic import NotOwnedError, OwnedFiles
from mt_pipeline.provenance import file_sha256

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REFS = ["Ein Mann fährt Rad .", "Zwei Hunde spielen ."]


# ---------------------------------------------------------------------------------------------
# item 1: mt-evaluate --out DIR removes only what mt-evaluate wrote
# ---------------------------------------------------------------------------------------------
def _eval_inputs(tmp_path):
    """A checkpoint-shaped file, a data-bin and a prep dir that pass mt-evaluate's checks."""
    ck = tmp_path / "model.pt"
    ck.write_bytes(b"not really a model")
    data_bin, prep = tmp_path / "bin", tmp_path / "prep"
    for d in (data_bin, prep / "raw", prep / "tok"):
        d.mkdir(parents=True)
    for lang in ("en", "de"):
        (data_bin / f"dict.{lang}.txt").write_text("x 1\n")
    (data_bin / "test.en-de.en.idx").write_bytes(b"")
    (prep / "raw" / "test.de").write_text("\n".join(REFS) + "\n")
    (prep / "tok" / "test.de").write_text("\n".join(REFS) + "\n")
    return ck, data_bin, prep


def _args(ck, data_bin, prep, out):
    return evaluate.parser().parse_args(["--checkpoint", str(ck), "--data-bin", str(data_bin), "--prep-dir", str(prep),
                                         "--src", "en", "--tgt", "de", "--subsets", "test", "--out", str(out),
                                         "--user-dir", "none"])


@pytest.fixture
def fake_generate(monkeypatch):
    """fairseq-generate replaced by a log with the references as hypotheses."""
    calls = []

    def gen(a, subset, log_path):
        calls.append(subset)
        with open(log_path, "w", encoding="utf-8") as f:
            f.write("# command: python -m fairseq_cli.generate (faked)\n")
            f.writelines(f"H-{i}\t-0.1\t{r}\n" for i, r in enumerate(REFS))
    monkeypatch.setattr(evaluate, "_generate", gen)
    monkeypatch.setattr(evaluate, "check_checkpoint_data", lambda a: None)  # the checkpoint is a stand-in
    return calls


def test_evaluate_into_a_run_directory_keeps_every_file_it_did_not_write(tmp_path, fake_generate):
    """Probe: `mt-evaluate --out <run dir>` removed result.json, config.json, state.json and a
    user's notes.json (every *.json without this checkpoint's sha256)."""
    ck, data_bin, prep = _eval_inputs(tmp_path)
    run = tmp_path / "run"
    run.mkdir()
    user = {"result.json": '{"status": "done"}', "config.json": '{"sha256": "x"}', "state.json": "{}",
            "notes.json": '{"idea": "try lr 2e-3"}', "valid.generate.log": "my own notes\n"}
    for name, text in user.items():
        (run / name).write_text(text)
    [res] = evaluate.evaluate(_args(ck, data_bin, prep, run))
    assert res["bleu"] == pytest.approx(100.0) and fake_generate == ["test"]
    for name, text in user.items():
        assert (run / name).read_text() == text, name
    # a second checkpoint into the same dir: mt-evaluate's own subset is replaced, the rest stays
    ck2 = tmp_path / "other.pt"
    ck2.write_bytes(b"another model")
    evaluate.evaluate(_args(ck2, data_bin, prep, run))
    assert json.loads((run / "test.json").read_text())["checkpoint_sha256"] == evaluate.checkpoint_sha256(str(ck2))
    for name, text in user.items():
        assert (run / name).read_text() == text, name


def test_evaluate_refuses_to_overwrite_a_file_it_did_not_write(tmp_path, fake_generate):
    ck, data_bin, prep = _eval_inputs(tmp_path)
    out = tmp_path / "out"
    out.mkdir()
    (out / "test.json").write_text('{"mine": true}')  # a user's file with an output's name
    with pytest.raises(evaluate.EvaluateError, match=r"test\.json, not written by mt-evaluate; refusing"):
        evaluate.evaluate(_args(ck, data_bin, prep, out))
    assert (out / "test.json").read_text() == '{"mine": true}' and fake_generate == []
    assert sorted(os.listdir(out)) == ["test.json"]  # nothing written, not even the manifest
    for inside in (data_bin, prep, prep / "raw"):
        with pytest.raises(evaluate.EvaluateError, match="is inside --"):
            evaluate.evaluate(_args(ck, data_bin, prep, inside))
    assert fake_generate == []


def test_owned_files_claims_before_writing_and_removes_only_its_own(tmp_path):
    (tmp_path / "theirs.txt").write_text("keep")
    owned = OwnedFiles(str(tmp_path), "tool")
    with pytest.raises(NotOwnedError, match="theirs.txt exists and was not written by tool"):
        owned.claim(["mine.txt", "theirs.txt"])
    assert not (tmp_path / ".tool.owned").exists()
    owned.claim(["mine.txt"])
    (tmp_path / "mine.txt").write_text("x")
    again = OwnedFiles(str(tmp_path), "tool")  # the manifest persists
    assert again.owns("mine.txt") and not again.remove("theirs.txt") and again.remove("mine.txt")
    assert sorted(os.listdir(tmp_path)) == [".tool.owned", "theirs.txt"]


# ---------------------------------------------------------------------------------------------
# item 2: mt-prep never replaces a directory it did not write
# ---------------------------------------------------------------------------------------------
def _m30k_raw(path, n=6):
    os.makedirs(path, exist_ok=True)
    for split in ("train", "val", "test_2016_flickr", "test_2017_flickr"):
        for lang in ("en", "de"):
            with gzip.open(os.path.join(path, f"{split}.{lang}.gz"), "wb") as f:
                f.write("".join(f"a {lang} sentence number {i} .\n" for i in range(n)).encode())


def _digests(path):
    return {n: hashlib.sha256(open(os.path.join(path, n), "rb").read()).hexdigest() for n in sorted(os.listdir(path))}


@pytest.mark.parametrize("layout", ["out is the parent of the raw dir", "out is the raw dir", "out inside the raw dir"])
def test_prep_refuses_an_out_that_overlaps_its_input_directory(tmp_path, capsys, layout):
    """Probe: `mt-prep multi30k --raw-dir D/raw --out D` (the shared data folder's layout)
    replaced the user's upstream .gz files with decompressed, line-cut text."""
    from mt_pipeline.prep import cli

    d = tmp_path / "multi30k_en_de"
    raw = d / "raw"
    _m30k_raw(str(raw))
    before = _digests(str(raw))
    out = {"out is the parent of the raw dir": d, "out is the raw dir": raw,
           "out inside the raw dir": raw / "prep"}[layout]
    with pytest.raises(SystemExit) as err:
        cli.main(["multi30k", "--raw-dir", str(raw), "--out", str(out), "--no-checksum", "--workers", "1",
                  "--train-lines", "3"])
    assert err.value.code == 1
    msg = capsys.readouterr().err
    assert "overlaps the input directory --raw-dir" in msg and str(raw) in msg
    assert _digests(str(raw)) == before  # nothing replaced, nothing added
    assert sorted(os.listdir(d)) == ["raw"]


@pytest.mark.parametrize("corpus,mode", [("aspec_en_ja", "download"), ("wmt14_en_fr", "local")])
def test_prep_with_no_split_available_is_refused_before_any_work(tmp_path, capsys, corpus, mode):
    """A mode in which no split of the corpus can be had (a licensed corpus with --download; a
    download-only corpus with --local-dir) exits 1 with how to get the data -- it used to log "not
    available in this mode", prepare nothing and exit 0; nothing is written."""
    from mt_pipeline.prep import cli

    out = tmp_path / "out"
    args = ["--download"] if mode == "download" else ["--local-dir", str(tmp_path / "empty")]
    (tmp_path / "empty").mkdir()
    with pytest.raises(SystemExit) as err:
        cli.main([corpus, *args, "--out", str(out)])
    assert err.value.code == 1
    msg = capsys.readouterr().err
    assert f"no split (train, valid, test) is available in {mode} mode" in msg and "How to get it:" in msg
    assert ("jipsti.jst.go.jp" in msg) == (corpus == "aspec_en_ja")
    assert not out.exists()


def test_swap_stage_never_replaces_a_directory_without_its_stamp(tmp_path):
    from mt_pipeline.prep.run import PrepRun

    mine = tmp_path / "raw"
    mine.mkdir()
    (mine / "train.en.gz").write_bytes(b"user data")
    run = PrepRun("t", str(tmp_path))
    with pytest.raises(SystemExit):
        run.stage("raw", str(mine), "stage=raw", [], lambda d: open(os.path.join(d, "train.en"), "w").close(),
                  swap=True)
    assert sorted(os.listdir(mine)) == ["train.en.gz"] and sorted(os.listdir(tmp_path)) == ["raw"]


# ---------------------------------------------------------------------------------------------
# item 5: the run-directory lock is held by the trainer too
# ---------------------------------------------------------------------------------------------
RUNNER = """
import sys, time
from mt_pipeline import experiment
with experiment.run_dir_lock(sys.argv[1]):
    experiment.run([sys.executable, "-c", "import time; open(%r, 'w').close(); time.sleep(60)" % sys.argv[2]],
                   logfile=sys.argv[3])
"""


@pytest.mark.parametrize("sig", ["SIGTERM", "SIGKILL"])
def test_a_trainer_left_running_by_a_killed_runner_keeps_the_run_directory_locked(tmp_path, sig):
    """Probe: kill the runner (TERM or KILL), re-run, and two fairseq-train wrote one save dir
    (the lock was the runner's only).  The child (here a stand-in for fairseq-train) now holds
    it: the re-run is refused while the child lives and proceeds once it has ended."""
    import signal
    import time

    from mt_pipeline import experiment

    started = tmp_path / "child-started"
    runner = subprocess.Popen([sys.executable, "-c", RUNNER, str(tmp_path), str(started), str(tmp_path / "train.log")],
                              cwd=ROOT, start_new_session=True)
    deadline = time.time() + 30
    while not started.exists() and time.time() < deadline:
        time.sleep(0.02)
    assert started.exists()
    os.kill(runner.pid, getattr(signal, sig))  # the runner only; its child lives on
    runner.wait(timeout=30)
    try:
        with pytest.raises(SystemExit, match="is running in"):
            with experiment.run_dir_lock(str(tmp_path)):
                pass
    finally:
        os.killpg(runner.pid, signal.SIGKILL)  # the orphaned child (same session)
    deadline = time.time() + 30
    while time.time() < deadline:
        try:
            with experiment.run_dir_lock(str(tmp_path)):
                break
        except SystemExit:
            time.sleep(0.05)
    else:
        pytest.fail("the lock was not released after the child ended")


def test_a_lock_probe_is_not_taken_for_an_owner(tmp_path):
    """A review's probe: ``lock_held`` (mt-campaign's status) takes and drops the run directory's
    lock; a runner starting at that instant was refused as if a trainer held it.  A non-waiting
    lock now tries again for ``PROBE_GRACE_S``; an owner that keeps it is still refused."""
    import fcntl
    import threading
    import time

    from mt_pipeline import locks

    def hold(seconds, got, release=None):
        with open(locks.lock_path(str(tmp_path)), "a") as f:  # another open file: flock conflicts
            fcntl.flock(f, fcntl.LOCK_EX)
            got.set()
            if release is not None:
                release.wait(30)
            else:
                time.sleep(seconds)

    got = threading.Event()
    probe = threading.Thread(target=hold, args=(0.05, got))  # a probe-length hold (generously long)
    probe.start()
    got.wait(10)
    with locks.dir_lock(str(tmp_path), busy_message="busy"):
        pass  # taken once the probe let go
    probe.join()
    got, release = threading.Event(), threading.Event()
    owner = threading.Thread(target=hold, args=(None, got, release))
    owner.start()
    got.wait(10)
    try:
        with pytest.raises(SystemExit, match="^busy$"):
            with locks.dir_lock(str(tmp_path), busy_message="busy"):
                pass
        assert locks.lock_held(str(tmp_path))
    finally:
        release.set()
        owner.join()
    assert not locks.lock_held(str(tmp_path))


# ---------------------------------------------------------------------------------------------
# item 6 (and 11's budget probes): a budget is checked before anything runs
# ---------------------------------------------------------------------------------------------
SMALL = os.path.join(ROOT, "configs", "multi30k", "small_cpu.yaml")
BAD_BUDGETS = {
    "regime typo": (f"base: {SMALL}\nregime: smok\n", "regime 'smok' (did you mean 'smoke'?); valid: smoke"),
    "bad average": (f"base: {SMALL}\naverage: {{num-update-checkpoints: null, last: 3}}\n",
                    "unknown key average.last"),
    "average two choices": (f"base: {SMALL}\naverage: {{checkpoint: best}}\n", "give exactly one of"),
    "misspelt section": (f"base: {SMALL}\ngenerat: {{beam: 5}}\n", "unknown key 'generat' (did you mean 'generate'?)"),
    "beam zero": (f"base: {SMALL}\ngenerate: {{beam: 0}}\n", "generate.beam must be a positive integer"),
    "unknown corpus": (f"base: {SMALL}\ndata: {{corpus: multi31k}}\n", "data.corpus 'multi31k' (did you mean 'multi30k'?)"),
    "subsets a string": (f"base: {SMALL}\ndata: {{subsets: test}}\n", "data.subsets must be a non-empty list"),
    "yaml syntax error": ("train: {lr: 0.1\n", "is not valid YAML"),
    "a list": ("- train\n- generate\n", "is a YAML list, not a mapping"),
    "empty": ("", "is empty"),
    "no train": ("regime: smoke\ngenerate: {beam: 4, lenpen: 0.6, batch-size: 8}\n", "no `train:` section"),
    "tag of another regime": (f"base: {SMALL}\ntag: converged_6k\n", "tag 'converged_6k': a budget's tag is its regime, an "
                              "underscore and"),
    "tag with spaces": (f"base: {SMALL}\ntag: smoke 2\n", "(e.g. smoke_6k)"),
    # the averaging runs after training: a budget whose checkpoints it cannot find is refused first
    "too few update checkpoints": (f"base: {SMALL}\ntrain: {{max-update: 100}}\n",
                                   "max-update 100 with save-interval-updates 50 writes 2 update checkpoint(s), fewer "
                                   "than average.num-update-checkpoints 3: use max-update >= 150"),
    "update checkpoints kept": (f"base: {SMALL}\ntrain: {{keep-interval-updates: 2}}\n",
                                "keep-interval-updates 2 keeps fewer than average.num-update-checkpoints 3"),
    "no update checkpoints": (f"base: {SMALL}\ntrain: {{save-interval-updates: null}}\n",
                              "average.num-update-checkpoints 3 needs update checkpoints"),
    "no epoch checkpoints": (f"base: {SMALL}\naverage: {{num-update-checkpoints: null, num-epoch-checkpoints: 5}}\n",
                             "average.num-epoch-checkpoints 5 needs epoch checkpoints, but train.no-epoch-checkpoints"),
}


@pytest.mark.parametrize("case", sorted(BAD_BUDGETS))
def test_a_bad_budget_is_refused_before_the_run_directory_is_made(tmp_path, case):
    """Probe: `regime: smok` or a bad `average:` section trained fully, then failed, and the fixed
    budget was refused as a changed configuration (only --force-new got out)."""
    from mt_pipeline import experiment

    text, expected = BAD_BUDGETS[case]
    path = tmp_path / "budget.yaml"
    path.write_text(text)
    out = tmp_path / "run"
    with pytest.raises(SystemExit) as err:
        experiment.run_experiment(["--out", str(out), "--arch", "rela_transformer_small", "--budget", str(path)])
    assert expected in str(err.value) and str(path) in str(err.value)
    assert not out.exists()  # nothing trained, no config.json to refuse the fixed budget later


def test_every_budget_in_the_repository_passes_the_schema():
    import glob

    from mt_pipeline.budget import averaging_problem, load_budget, train_flags

    checked = 0
    for f in sorted(glob.glob(os.path.join(ROOT, "configs", "**", "*.yaml"), recursive=True)):
        import yaml

        d = yaml.safe_load(open(f))
        if "hydra" not in f and isinstance(d, dict) and ("train" in d or "base" in d):
            budget = load_budget(f)
            for cuda in (False, True):  # and its averaging finds its checkpoints, on CPU and on a GPU
                assert averaging_problem(budget, train_flags(budget, cuda)) is None, (f, cuda)
            checked += 1
    assert checked >= 30


# ---------------------------------------------------------------------------------------------
# items 7 and 9: a checkpoint is used only in its direction and with its dictionaries
# ---------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A 2-update model on the toy corpus (src -> tgt) and a copy of its data dir whose
    dictionaries hold the same symbols in another order (same size: the model loads)."""
    import train_helpers as th

    base = tmp_path_factory.mktemp("trained")
    data_bin = th.make_databin(str(base / "data"), n_train=24, n_valid=8)
    th.run([os.path.join(th.BIN, "fairseq-train"),
            *th.train_args(data_bin, str(base / "ck"), "--max-update", "2", arch="rela_transformer_small")])
    other = base / "other_bin"
    shutil.copytree(data_bin, other)
    for lang in ("src", "tgt"):
        lines = (other / f"dict.{lang}.txt").read_text().splitlines()
        (other / f"dict.{lang}.txt").write_text("\n".join(lines[::-1]) + "\n")  # same size, other order
    return str(base / "ck" / "checkpoint_last.pt"), data_bin, str(other)


def test_training_records_the_direction_and_dictionaries_in_the_checkpoint(trained):
    from fairseq.data import Dictionary

    from fairseq_plugins.checkpoint import load_checkpoint
    from fairseq_plugins.trained_data import dictionary_fingerprint, stored_languages, stored_record

    ck, data_bin, _ = trained
    state = load_checkpoint(ck)
    rec = stored_record(state)
    assert rec["source_lang"] == "src" and rec["target_lang"] == "tgt"
    assert rec["source_dict"] == dictionary_fingerprint(Dictionary.load(os.path.join(data_bin, "dict.src.txt")))
    assert stored_languages(state) == ("src", "tgt")


def test_a_checkpoint_is_refused_in_the_other_direction_or_with_other_dictionaries(trained):
    """Probes: an en->de checkpoint evaluated --src de --tgt en scored BLEU 0.02 with exit 0 (the
    analysis likewise); a data dir whose dictionary differs but pads to the same size was accepted
    (BLEU 3.38 instead of 4.18)."""
    from fairseq_plugins.checkpoint import load_model_ensemble_and_task
    from fairseq_plugins.trained_data import DataMismatchError

    ck, data_bin, other = trained
    models, _, task = load_model_ensemble_and_task([ck], {"data": data_bin})  # its own data: fine
    assert len(task.source_dictionary) == len(models[0].encoder.embed_tokens.weight)
    with pytest.raises(DataMismatchError, match=r"trained src->tgt; it cannot translate tgt->src"):
        load_model_ensemble_and_task([ck], {"data": data_bin, "source_lang": "tgt", "target_lang": "src"})
    with pytest.raises(DataMismatchError, match="source dictionary of the data dir .* is not the one"):
        load_model_ensemble_and_task([ck], {"data": other})


def test_fairseq_generate_refuses_a_data_dir_with_other_dictionaries(trained):
    import train_helpers as th

    ck, data_bin, other = trained
    out = th.run([sys.executable, "-m", "fairseq_cli.generate", other, "--user-dir", os.path.join(ROOT, "fairseq_plugins"),
                  "--path", ck, "--gen-subset", "valid", "--source-lang", "src", "--target-lang", "tgt", "--cpu",
                  "--beam", "1", "--max-len-b", "3"], check=False, timeout=300)
    assert out.returncode != 0 and "is not the one this model was trained with" in out.stderr + out.stdout


def test_mt_evaluate_checks_direction_dictionaries_and_extra_before_generating(trained, tmp_path, monkeypatch):
    ck, data_bin, other = trained
    prep = tmp_path / "prep"
    for d in ("raw", "tok"):
        (prep / d).mkdir(parents=True)
        for lang in ("src", "tgt"):
            (prep / d / f"valid.{lang}").write_text("x\n")
    monkeypatch.setattr(evaluate, "_generate", lambda *a: pytest.fail("generated despite bad input"))

    def run(src, tgt, data, extra=""):
        a = evaluate.parser().parse_args(["--checkpoint", ck, "--data-bin", data, "--prep-dir", str(prep), "--src", src,
                                          "--tgt", tgt, "--subsets", "valid", "--out", str(tmp_path / "out"),
                                          "--extra", extra])
        with pytest.raises(evaluate.EvaluateError) as err:
            evaluate.evaluate(a)
        return str(err.value)

    assert "was trained src->tgt; it cannot translate tgt->src (give --src src --tgt tgt" in run("tgt", "src", data_bin)
    assert "is not the source dictionary" in run("src", "tgt", other)
    assert "--extra may not set --gen-subset: mt-evaluate sets it itself; use --subsets" in \
        run("src", "tgt", data_bin, "--gen-subset test1")
    assert not (tmp_path / "out").exists()


# ---------------------------------------------------------------------------------------------
# item 10: out-of-range values are refused at start-up
# ---------------------------------------------------------------------------------------------
RANGE_CASES = {
    "--label-smoothing 1.5": ("criterion", "label_smoothing", 1.5, "--label-smoothing must be a finite number >= 0 and < 1"),
    "--label-smoothing -0.5": ("criterion", "label_smoothing", -0.5, "--label-smoothing must be"),
    "--lr -0.001": ("optimization", "lr", [-0.001], "--lr must be a finite number > 0"),
    "--dropout -0.1": ("model", "dropout", -0.1, "--dropout must be a finite number >= 0 and < 1"),
    "--weight-decay -1": ("optimizer", "weight_decay", -1.0, "--weight-decay must be a finite number >= 0"),
    "--clip-norm nan": ("optimization", "clip_norm", float("nan"), "--clip-norm must be a finite number >= 0"),
    "--max-update -5": ("optimization", "max_update", -5, "--max-update must be an integer >= 0"),
}


@pytest.mark.parametrize("case", sorted(RANGE_CASES))
def test_fairseq_training_options_outside_their_range_are_refused(case):
    from omegaconf import OmegaConf

    from fairseq_plugins.models.ranges import check_training_ranges

    good = {"optimization": {"lr": [0.001], "clip_norm": 0.0, "max_update": 10, "max_epoch": 0, "update_freq": [1]},
            "criterion": {"label_smoothing": 0.1}, "optimizer": {"weight_decay": 0.0},
            "lr_scheduler": {"warmup_updates": 4, "warmup_init_lr": -1}, "model": {"dropout": 0.3},
            "dataset": {"max_tokens": None, "batch_size": 8}, "checkpoint": {"save_interval_updates": 0}}
    check_training_ranges(OmegaConf.create(good))  # fairseq's defaults and sentinels pass
    section, key, value, expected = RANGE_CASES[case]
    bad = OmegaConf.create(good)
    bad[section][key] = value
    with pytest.raises(ValueError, match=re.escape(expected)):
        check_training_ranges(bad)


def test_the_stock_baseline_arch_checks_the_ranges_too():
    """The stock baseline (`stock_transformer_small`, fairseq's own model) has no plugin build
    hook: its arch function checks the flat Namespace instead."""
    import argparse

    from fairseq_plugins.models.transformer import stock_transformer_small

    stock_transformer_small(argparse.Namespace(label_smoothing=0.1, lr=[0.001], dropout=0.3))
    with pytest.raises(ValueError, match=re.escape("--label-smoothing")):
        stock_transformer_small(argparse.Namespace(label_smoothing=1.5, lr=[0.001]))
    with pytest.raises(ValueError, match=re.escape("--lr")):
        stock_transformer_small(argparse.Namespace(lr=[-0.001]))


def test_fairseq_train_refuses_label_smoothing_above_one_before_training(tmp_path):
    """Probe: `--label-smoothing 1.5` trained to exit 0."""
    import train_helpers as th

    data_bin = th.make_databin(str(tmp_path / "data"), n_train=24, n_valid=8)
    out = th.run([os.path.join(th.BIN, "fairseq-train"),
                  *th.train_args(data_bin, str(tmp_path / "ck"), "--max-update", "2", "--criterion",
                                 "label_smoothed_cross_entropy", "--label-smoothing", "1.5",
                                 arch="rela_transformer_small")], check=False, timeout=300)
    assert out.returncode != 0
    assert "--label-smoothing must be a finite number >= 0 and < 1, got 1.5" in out.stdout + out.stderr
    assert not os.path.exists(tmp_path / "ck" / "checkpoint_last.pt")


def test_pipeline_command_lines_refuse_out_of_range_numbers(tmp_path, capsys):
    from fairseq_plugins.analysis import cli as analysis_cli
    from mt_pipeline import experiment, reproduce

    with pytest.raises(SystemExit):
        experiment.run_experiment(["--out", str(tmp_path / "r"), "--arch", "rela_transformer_small",
                                   "--max-update", "-5"])
    assert "--max-update: must be an integer >= 1, got '-5'" in capsys.readouterr().err
    for limit in ("-5", "0"):
        with pytest.raises(SystemExit):
            analysis_cli.main(["--checkpoint", "x.pt", "--data", str(tmp_path), "--out", str(tmp_path / "a"),
                               "--limit", limit])
        assert f"--limit: must be a positive integer, got '{limit}'" in capsys.readouterr().err
    for flag, value in (("--seeds", "1,x"), ("--rows", "abc")):
        with pytest.raises(SystemExit):
            reproduce.main(["rela", "table1", flag, value, "--dry-run"])
        assert f"{flag} must be comma-separated non-negative integers (e.g. 1,2,3), got '{value}'" in \
            capsys.readouterr().err
    assert not (tmp_path / "r").exists() and not (tmp_path / "a").exists()


# ---------------------------------------------------------------------------------------------
# item 4: BPE codes are parsed in the parent, before any worker pool
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("content,expected", [
    (b"", "no merge operations"),
    (b"#version: 0.2\na b\nnot-a-pair\n", ":3: 'not-a-pair' is not two subword units"),
    (b"a b\n\xff\xfe c\n", "not UTF-8 text"),
])
def test_apply_bpe_refuses_bad_codes_instead_of_respawning_workers(tmp_path, content, expected):
    """Probe: an empty or malformed codes file made subword-nmt sys.exit inside the Pool
    initializer, and the Pool respawned workers (~140/s) forever."""
    codes, text = tmp_path / "codes", tmp_path / "train.en"
    codes.write_bytes(content)
    text.write_text("a b c\n")
    script = ("import sys; from mt_pipeline.prep import bpe; "
              f"bpe.apply_bpe([({str(text)!r}, {str(tmp_path / 'out.en')!r})], {str(codes)!r}, workers=2)")
    out = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 1 and expected in out.stderr and str(codes) in out.stderr
    assert not (tmp_path / "out.en").exists()


def test_mt_prep_checks_given_bpe_codes_before_any_work(tmp_path):
    empty = tmp_path / "codes"
    empty.write_bytes(b"")
    out = tmp_path / "out"
    res = subprocess.run([sys.executable, "-m", "mt_pipeline.prep", "iwslt14_de_en", "--out", str(out), "--bpe-codes",
                          str(empty), "--workers", "2"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert res.returncode == 1, res.stderr
    assert f"--bpe-codes: BPE codes {empty}: no merge operations" in res.stderr
    assert not out.exists()


# ---------------------------------------------------------------------------------------------
# item 8: a download cut short is never kept, nor its checksum pinned
# ---------------------------------------------------------------------------------------------
@pytest.fixture
def short_server():
    """An HTTP server whose responses announce 1000 bytes and close after 100."""
    import http.server
    import threading

    class Short(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.send_header("Content-Length", "1000")
            self.end_headers()
            self.wfile.write(b"x" * 100)
            self.wfile.flush()
            self.close_connection = True

        def log_message(self, *a):
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Short)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/train.tgz"
    server.shutdown()


def test_a_download_that_ends_before_its_content_length_is_not_kept(tmp_path, short_server):
    """Probe: a server that closed early despite Content-Length was not detected."""
    from mt_pipeline.prep import fetch

    dest = tmp_path / "download" / "train.tgz"
    with pytest.raises(fetch.FetchError, match="cut short: got 100 of the 1000 bytes"):
        fetch.download(short_server, str(dest), retries=1)
    assert os.listdir(dest.parent) == []


def test_an_unverified_checksum_is_never_pinned_from_a_cut_short_file(tmp_path, capsys):
    """Probe: for an `unverified` source the short file's sha256 was pinned in
    download/CHECKSUMS, so every later correct download was refused."""
    import io
    import tarfile

    from mt_pipeline.prep import fetch
    from mt_pipeline.prep.run import PrepRun

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as t:
        data = os.urandom(50000)
        info = tarfile.TarInfo("corpus/train.en")
        info.size = len(data)
        t.addfile(info, io.BytesIO(data))
    whole = buf.getvalue()
    up = tmp_path / "up" / "a.tgz"
    up.parent.mkdir()
    up.write_bytes(whole[: len(whole) // 2])  # a mirror holding a truncated copy (file:// has no short read)
    items = [{"url": up.as_uri(), "file": "a.tgz", "sha256": "unverified"}]
    ddir = tmp_path / "out" / "download"
    run = PrepRun("t", str(tmp_path / "out"))
    with pytest.raises(SystemExit):
        fetch.fetch_all(run, items, str(ddir))
    assert "is cut short or corrupt" in capsys.readouterr().err
    assert not (ddir / "CHECKSUMS").exists() and not (ddir / "a.tgz").exists()
    up.write_bytes(whole)  # the complete file is then accepted and pinned
    fetch.fetch_all(run, items, str(ddir))
    assert (ddir / "CHECKSUMS").read_text() == f"{file_sha256(str(up))} a.tgz\n"


# ---------------------------------------------------------------------------------------------
# item 11: messages, not tracebacks -- corpus specs, source formats, sentence text
# ---------------------------------------------------------------------------------------------
GOOD_SPEC = {"name": "toy", "title": "Toy", "langs": ["en", "de"], "downloads": [],
             "local": {"default_dir": "toy", "splits": {"test": [{"file": "test.tsv", "format": "tsv:{col}",
                                                                  "columns": {"en": 0, "de": 1}}]}},
             "recipe": {"bpe_merges": 10}}
BAD_SPECS = {
    "empty": ("", "a corpus spec is a YAML mapping"),
    "a list": ("- name\n- title\n", "got list"),
    "misspelt key": ({"local": {"default_dir": "toy", "splits": {"test": [{"file": "test.tsv", "fromat": "tsv:1"}]}}},
                     "unknown key local.splits.test[0].fromat (did you mean 'format'?)"),
    "string for a list": ({"split_names": "train"}, "split_names must be a list of names"),
    "langs a string": ({"langs": "en de"}, "langs must be a list of names"),
    "bad bars column": ({"local": {"default_dir": "toy", "splits": {"test": [{"file": "t", "format": "bars:x"}]}}},
                        "bars: takes a column number"),
    "unknown format": ({"local": {"default_dir": "toy", "splits": {"test": [{"file": "t", "format": "tvs:1"}]}}},
                       "unknown format 'tvs:1'"),
    "recipe typo": ({"recipe": {"bpe_merge": 10}}, "unknown key recipe.bpe_merge (did you mean 'bpe_merges'?)"),
}


@pytest.mark.parametrize("case", sorted(BAD_SPECS))
def test_a_bad_corpus_spec_is_refused_with_the_key_named(tmp_path, monkeypatch, case):
    """Probes: an empty / list corpus.yaml (traceback), strings where lists are expected (exit 0
    printing "not available: t, r, a, i, n"), a misspelt `fromat:` (the whole TSV line taken as
    both sides, silently)."""
    import yaml

    from mt_pipeline.prep import spec as specs

    change, expected = BAD_SPECS[case]
    (tmp_path / "toy").mkdir()
    text = change if isinstance(change, str) else yaml.safe_dump(dict(GOOD_SPEC, **change))
    (tmp_path / "toy" / "corpus.yaml").write_text(text)
    monkeypatch.setattr(specs, "DATA_PREP", str(tmp_path))
    with pytest.raises(SystemExit) as err:
        specs.load_spec("toy")
    assert expected in str(err.value) and "corpus.yaml" in str(err.value)
    (tmp_path / "toy" / "corpus.yaml").write_text(yaml.safe_dump(GOOD_SPEC))
    assert specs.load_spec("toy")["name"] == "toy"  # the good spec passes


def _toy_sources(tmp_path, spec, lines):
    from mt_pipeline.prep import raw

    (tmp_path / "in").mkdir(exist_ok=True)
    (tmp_path / "in" / "test.tsv").write_bytes(lines)
    return raw.Sources(dict(spec, splits={}), "local", str(tmp_path / "in"), str(tmp_path / "dl"))


@pytest.mark.parametrize("content,expected", [
    (b"a man\tein Mann\nno tab here\n", "test.tsv: line 2: 1 tab-separated columns, format 'tsv:1' needs field 1"),
    (b"a man\tein Mann\nbad \xff byte\tx\n", "test.tsv:2: invalid UTF-8 at byte"),
    (b"a\x00man\tein Mann\n", "test.en:1: control character '\\x00'"),
    (b"a man\tein Mann\n \t \n", "test.en:2: empty line"),
])
def test_bad_source_text_names_file_and_line_and_writes_no_split(tmp_path, capsys, content, expected):
    from mt_pipeline.prep import raw
    from mt_pipeline.prep.run import PrepRun

    spec = dict(GOOD_SPEC, local={"default_dir": "toy", "splits": {
        "valid": [{"file": "valid.tsv", "format": "tsv:{col}", "columns": {"en": 0, "de": 1}}],
        "test": [{"file": "test.tsv", "format": "tsv:{col}", "columns": {"en": 0, "de": 1}}]}})
    sources = _toy_sources(tmp_path, spec, content)
    (tmp_path / "in" / "valid.tsv").write_text("a dog\tein Hund\n")  # a good split, read first
    out = tmp_path / "raw"
    out.mkdir()
    with pytest.raises(SystemExit):
        raw.write_splits(PrepRun("t", str(tmp_path)), sources, ["valid", "test"], str(out))
    msg = capsys.readouterr().err
    assert expected in msg, msg
    assert os.listdir(out) == []  # not even the good split


def test_source_lines_takes_a_prefix_and_refuses_a_short_file(tmp_path, monkeypatch):
    """``lines: N`` (ASPEC's best-scored 1.5M pairs: train-1 + the first 500K of train-2) takes the
    first N extracted lines of a source, says so in the plan, refuses a source with fewer lines,
    and the spec check refuses anything but a positive integer."""
    import yaml

    from mt_pipeline.prep import spec as specs

    src = {"file": "test.tsv", "format": "tsv:{col}", "columns": {"en": 0, "de": 1}}
    spec = dict(GOOD_SPEC, local={"default_dir": "toy", "splits": {"test": [dict(src, lines=2)]}})
    sources = _toy_sources(tmp_path, spec, b"a\tA\nb\tB\nc\tC\n")
    (x,) = sources.of("test")
    assert sources.read(x, "en") == ["a", "b"] and sources.read(x, "de") == ["A", "B"]
    assert sources.read(dict(src), "de") == ["A", "B", "C"]
    assert sources.describe([x], "en") == "test.tsv [tsv:{col}] (first 2 lines)"
    with pytest.raises(SystemExit, match="has 3 lines, fewer than the 5 the spec takes"):
        sources.read(dict(src, lines=5), "en")
    monkeypatch.setattr(specs, "DATA_PREP", str(tmp_path))
    (tmp_path / "toy").mkdir()
    for bad in (0, -1, "500000", True, 2.5):
        (tmp_path / "toy" / "corpus.yaml").write_text(yaml.safe_dump(
            dict(GOOD_SPEC, local={"default_dir": "toy", "splits": {"test": [dict(src, lines=bad)]}})))
        with pytest.raises(SystemExit, match="`lines:` .* must be a positive integer"):
            specs.load_spec("toy")


def test_mt_score_names_a_latin1_hypothesis(tmp_path, capsys):
    """Probe: a Latin-1 hypothesis in mt-score was a UnicodeDecodeError traceback."""
    from mt_pipeline import scoring

    hyp, ref = tmp_path / "hyp", tmp_path / "ref"
    hyp.write_bytes("ein Mann\nfür Kinder\n".encode("latin-1"))
    ref.write_text("ein Mann\nfür Kinder\n")
    assert scoring.main(["--hyp", str(hyp), "--ref", str(ref)]) == 1
    assert f"{hyp}:2: not UTF-8 (byte 0xfc" in capsys.readouterr().err


def test_a_read_only_output_folder_is_named_before_any_work(tmp_path, capsys, monkeypatch, fake_generate):
    """Probe: a read-only output folder was a PermissionError traceback at the end.  (The tests
    run as root, which may write anywhere, so the folder's permission is simulated.)"""
    from mt_pipeline import scoring

    ro = tmp_path / "ro"
    ro.mkdir()
    real_access = os.access
    monkeypatch.setattr(os, "access", lambda p, mode: False if os.path.abspath(p) == str(ro) else real_access(p, mode))
    hyp = tmp_path / "hyp"
    hyp.write_text("a\n")
    assert scoring.main(["--hyp", str(hyp), "--ref", str(hyp), "--json", str(ro / "s.json")]) == 1
    assert f"--json {ro / 's.json'}: {ro} is not writable" in capsys.readouterr().err
    ck, data_bin, prep = _eval_inputs(tmp_path)
    with pytest.raises(evaluate.EvaluateError, match=f"--out {ro}: {ro} is not writable"):
        evaluate.evaluate(_args(ck, data_bin, prep, ro))
    assert fake_generate == [] and os.listdir(ro) == []


def test_unknown_attention_functions_are_refused_before_a_run_directory_exists(tmp_path, capsys):
    """Probe: `mt-experiment --fns relu2 ...` was recorded as a training failure (result.json
    status failed) after fairseq-train refused the name at start-up."""
    from mt_pipeline import experiment

    with pytest.raises(SystemExit):
        experiment.run_experiment(["--out", str(tmp_path / "run"), "--arch", "rela_transformer_small",
                                   "--fns", "rela_g", "relu2", "softmax"])
    err = capsys.readouterr().err
    assert "--fns: unknown attention function(s) relu2; valid:" in err and "rela_g" in err
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("text", [b"hello world\n", b"every line is text\n"])
def test_a_text_file_named_pt_is_named_not_a_checkpoint(tmp_path, text):
    """Probe: a text file named .pt gave `KeyError: 101` / `IndexError` (torch's legacy unpickler
    runs the text as pickle opcodes)."""
    from fairseq_plugins.checkpoint import CheckpointError, load_checkpoint

    path = tmp_path / "model.pt"
    path.write_bytes(text)
    with pytest.raises(CheckpointError, match=f"{path} is not a torch checkpoint"):
        load_checkpoint(str(path))
